"""Parameter counts: the analytic adapters against transformers on the meta device, and published totals.

Ground truth is the transformers (5.x) class named first in a config's ``architectures``, built on
the meta device (shapes, no storage; shared tensors counted once). Every catalog config must match
it exactly, tensor by tensor for every layer (names and shapes), so compensating errors cannot hide
behind an equal total. Hand-made variant configs reach the branches the catalog does not (biases,
legacy layouts, other task heads), and configs holding nothing but ``model_type`` check that each
adapter applies the config class's defaults.

Building even DeepSeek-V3 (671B) or Qwen3-235B on the meta device takes well under a second with
transformers >= 5 (experts are fused 3-D tensors, not 256 modules per layer), so every model is
built whole; results are cached per config for the session.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import sys

import pytest

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # before transformers is first imported (lazily)
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from memest.errors import ConfigError, UnsupportedArchitectureError
from memest.sources import catalog, load_model, meta, spec_from_config
from memest.sources.config import HFConfig
from memest.sources.families import ADAPTERS, supported_model_types
from memest.spec import Component, ModelSpec, StateSpec
from memest.workload.settings import cli_flag

# Remote-code class names transformers does not define, mapped to the native class of the same
# model_type (same parameters): the Hub's Phi-3.5-MoE config names its trust_remote_code class
# "PhiMoEForCausalLM"; transformers 5 ships the port as "PhimoeForCausalLM".
NATIVE_CLASS = {"PhiMoEForCausalLM": "PhimoeForCausalLM"}
# model_types transformers does not register whose config is another family's under a new name:
# transformers builds them as that family (moonshotai/Kimi-K2-Instruct names DeepseekV3ForCausalLM).
NATIVE_TYPE = {"kimi_k2": "deepseek_v3"}

CATALOG = sorted(catalog.entries())
# model_types transformers does not ship and no native family builds: their adapters follow the
# modeling code in the models' Hub repositories and are checked against published totals instead.
CONFIG_ONLY = {"internlm2", "chatglm", "minicpm", "baichuan", "mimo", "nemotron-nas", "rwkv5", "rwkv6", "rwkv7"}
# transformers builds these only with timm installed (Gemma 3n's MobileNet-v5 vision tower, TimmWrapperModel); the
# venv has no timm: their text models are checked on meta here, the whole in tests/test_current_families.py
NEEDS_TIMM = {"gemma3n"}


def _raw(model_id: str) -> dict:
    return json.loads(catalog.entries()[model_id].read_text())


def _native(raw: dict) -> dict:
    raw = copy.deepcopy(raw)
    archs = raw.get("architectures") or []
    if archs and archs[0] in NATIVE_CLASS:
        raw["architectures"] = [NATIVE_CLASS[archs[0]], *archs[1:]]
    return raw


@functools.cache
def _on_meta(raw_json: str) -> tuple[int, ModelSpec]:
    """(unique parameter count, spec derived from the module tree) of a config on the meta device."""
    raw = json.loads(raw_json)
    if raw.get("model_type") in NATIVE_TYPE:
        raw = {k: v for k, v in raw.items() if k != "auto_map"}
        raw["model_type"] = NATIVE_TYPE[raw["model_type"]]
    cfg = HFConfig(raw, name="test", source="test")
    return meta.count_params_on_meta(cfg), meta.spec_from_meta(cfg, trust_remote_code=False)


def _analytic(raw: dict, name: str = "test") -> ModelSpec:
    return spec_from_config(HFConfig(copy.deepcopy(raw), name=name, source="test"))


def _untied_t5_head(raw: dict) -> set[tuple[str, tuple[int, ...]]]:
    """The lm_head transformers >= 5 ties at construction but from_pretrained unties.

    ``T5Config`` forces ``tie_word_embeddings=True``, so ``T5ForConditionalGeneration(config)``
    shares lm_head with ``shared`` even for v1.1 / T0 configs that say false; ``from_pretrained``
    then finds both tensors in the checkpoint with different values and unties them (checked on a
    tiny saved model). The adapter counts the loaded model, so it has V x d_model more.
    """
    arch = (raw.get("architectures") or ["T5ForConditionalGeneration"])[0]
    if (
        raw.get("model_type") in ("t5", "mt5")
        and raw.get("tie_word_embeddings") is False
        and arch in ("T5ForConditionalGeneration", "MT5ForConditionalGeneration")
    ):
        vocab = raw.get("vocab_size", 250112 if raw["model_type"] == "mt5" else 32128)
        return {("lm_head.weight", (vocab, raw.get("d_model", 512)))}
    return set()


def _names(tensors) -> set[tuple[str, tuple[int, ...]]]:
    return {(t.name, t.shape) for t in tensors}


def _check_against_meta(raw: dict) -> ModelSpec:
    """Assert the analytic spec of ``raw`` equals transformers' model, total and tensor by tensor."""
    raw = _native(raw)
    spec = _analytic(raw)
    count, from_meta = _on_meta(json.dumps(raw, sort_keys=True))
    extra = _untied_t5_head(raw)
    assert spec.num_params == count + sum(s[0] * s[1] for _, s in extra)
    assert from_meta.num_params == count, "spec_from_meta must account for every parameter once"
    assert spec.num_layers == from_meta.num_layers
    for n, (ours, theirs) in enumerate(zip(spec.layers, from_meta.layers, strict=True)):
        assert _names(ours.tensors) == _names(theirs.tensors), f"layer {n}"
        assert ours.stack == theirs.stack, f"layer {n}"
    assert _names(spec.embedding) | _names(spec.head) == _names(from_meta.embedding) | _names(from_meta.head) | extra
    # the fallback's name-based component guesses agree with the adapters' on every modelled family
    expected = spec.params_by_component()
    for name, shape in extra:
        expected[Component.LM_HEAD] -= shape[0] * shape[1]
    assert from_meta.params_by_component() == {c: v for c, v in expected.items() if v}
    # one object per distinct kind of layer (estimators group layers by identity)
    assert len({id(layer) for layer in spec.layers}) == len(spec.layer_kinds())
    return spec


# ---- every catalog config ------------------------------------------------------------------------


ON_META = [m for m in CATALOG if _raw(m)["model_type"] not in CONFIG_ONLY | NEEDS_TIMM]


@pytest.mark.parametrize("model_id", ON_META, ids=ON_META)
def test_catalog_matches_transformers_on_meta(model_id: str) -> None:
    spec = _check_against_meta(_raw(model_id))
    assert spec.model_type in supported_model_types()


# model_types whose attention modules record their own sliding window (self.sliding_window) in
# transformers, so the meta model shows the per-layer pattern; elsewhere the window is read from
# the config at forward time and the meta model cannot confirm it.
WINDOW_ON_MODULE = {"gemma2", "gemma3", "gemma3_text", "gpt_oss", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
                    "olmo3", "smollm3", "cohere2", "qwen2_5_vl", "gemma4", "gemma4_text"}
WINDOWED = [m for m in CATALOG if _raw(m)["model_type"] in WINDOW_ON_MODULE]


@pytest.mark.parametrize("model_id", WINDOWED, ids=WINDOWED)
def test_catalog_sliding_windows_match_transformers(model_id: str) -> None:
    raw = _native(_raw(model_id))
    spec = _analytic(raw)
    _, from_meta = _on_meta(json.dumps(raw, sort_keys=True))
    assert [layer.attention.sliding_window for layer in spec.layers] == [
        layer.attention.sliding_window for layer in from_meta.layers
    ]


# ---- class defaults: configs that name nothing but the model type ---------------------------------

DEFAULT_CLASSES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "ministral3": "Ministral3ForCausalLM",
    "mistral3": "Mistral3ForConditionalGeneration",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "granite": "GraniteForCausalLM",
    "granitemoe": "GraniteMoeForCausalLM",
    "exaone4": "Exaone4ForCausalLM",
    "internlm3": "LlamaForCausalLM",
    "starcoder2": "Starcoder2ForCausalLM",
    "stablelm": "StableLmForCausalLM",
    "cohere": "CohereForCausalLM",
    "cohere2": "Cohere2ForCausalLM",
    "glm4": "Glm4ForCausalLM",
    "llama4": "Llama4ForConditionalGeneration",
    "llama4_text": "Llama4ForCausalLM",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
    "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration",
    "glm4_moe": "Glm4MoeForCausalLM",
    "glm4v_moe": "Glm4vMoeForConditionalGeneration",
    "minimax_m2": "MiniMaxM2ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForConditionalGeneration",
    "gemma3_text": "Gemma3ForCausalLM",
    "gemma4": "Gemma4ForConditionalGeneration",
    "gemma4_text": "Gemma4ForCausalLM",
    "phi": "PhiForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "phimoe": "PhimoeForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "kimi_k2": "DeepseekV3ForCausalLM",
    "kimi_k25": "Kimi_K25ForConditionalGeneration",
    "deepseek_v32": "DeepseekV32ForCausalLM",
    "deepseek_v4": "DeepseekV4ForCausalLM",
    "glm_moe_dsa": "GlmMoeDsaForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "gpt_bigcode": "GPTBigCodeForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "falcon": "FalconForCausalLM",
    "bloom": "BloomForCausalLM",
    "opt": "OPTForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "olmo3": "Olmo3ForCausalLM",
    "bert": "BertForMaskedLM",
    "t5": "T5ForConditionalGeneration",
    "mt5": "MT5ForConditionalGeneration",
    "jamba": "JambaForCausalLM",
    "nemotron_h": "NemotronHForCausalLM",
    "lfm2": "Lfm2ForCausalLM",
    "lfm2_vl": "Lfm2VlForConditionalGeneration",
    "voxtral": "VoxtralForConditionalGeneration",
    "mamba": "MambaForCausalLM",
    "mamba2": "Mamba2ForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM",
    "granitemoehybrid": "GraniteMoeHybridForCausalLM",
    "falcon_h1": "FalconH1ForCausalLM",
    "rwkv": "RwkvForCausalLM",
    "gemma3n_text": "Gemma3nForCausalLM",
}
# The geometry (width, depth, heads) is required by the adapters, so it is given here, at the values
# of each config class's defaults; every other field is left to the class.
_GEOMETRY = {
    "llama": (4096, 32, 32), "mistral": (4096, 32, 32), "qwen2": (4096, 32, 32), "qwen3": (4096, 32, 32),
    "mixtral": (4096, 32, 32), "qwen2_moe": (2048, 24, 16), "qwen3_moe": (2048, 24, 32), "gemma": (3072, 28, 16),
    "gemma2": (2304, 26, 8), "gemma3_text": (2304, 26, 8), "phi": (2048, 24, 32), "phi3": (3072, 32, 32),
    "phimoe": (4096, 32, 32), "deepseek_v2": (4096, 32, 32), "deepseek_v3": (7168, 61, 128),
    "kimi_k2": (7168, 61, 128), "gpt_oss": (2880, 36, 64), "deepseek_v32": (7168, 61, 128),
    "glm_moe_dsa": (6144, 78, 64), "deepseek_v4": (4096, 43, 64),
    "gpt_neox": (6144, 44, 64), "falcon": (4544, 32, 71), "olmo2": (4096, 32, 32), "bert": (768, 12, 12),
    "jamba": (4096, 32, 32), "opt": (768, 12, 12), "smollm3": (2048, 36, 16), "olmo3": (4096, 32, 32),
    "granite": (4096, 32, 32), "granitemoe": (4096, 32, 32), "exaone4": (4096, 32, 32), "internlm3": (4096, 48, 32),
    "starcoder2": (4096, 30, 32), "stablelm": (2560, 32, 32), "cohere": (8192, 40, 64), "cohere2": (8192, 40, 64),
    "ministral3": (4096, 34, 32), "llama4_text": (5120, 48, 40), "glm4": (4096, 40, 32), "glm4_moe": (4096, 46, 96), "minimax_m2": (3072, 62, 48),
}  # fmt: skip
DEFAULT_EXTRA: dict[str, dict] = {
    model_type: {"hidden_size": h, "num_hidden_layers": n, "num_attention_heads": a}
    for model_type, (h, n, a) in _GEOMETRY.items()
}
# Mistral3Config's text_config default is mistral; its vision_config is left to the class
DEFAULT_EXTRA["mistral3"] = {"text_config": {"model_type": "mistral", "hidden_size": 5120, "num_hidden_layers": 40,
                                              "num_attention_heads": 32, "head_dim": 128}}
# the Qwen VL config classes build their vision towers from the class defaults
DEFAULT_EXTRA["qwen2_5_vl"] = {"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64}  # flat
DEFAULT_EXTRA["qwen3_vl"] = {"text_config": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32}}
DEFAULT_EXTRA["qwen3_vl_moe"] = {"text_config": {"hidden_size": 2048, "num_hidden_layers": 24,
                                                 "num_attention_heads": 16}}
# Glm4vMoeTextConfig has no head_dim default and 4096 / 96 does not divide; GLM-4.5V sets 128
DEFAULT_EXTRA["glm4v_moe"] = {"text_config": {"hidden_size": 4096, "num_hidden_layers": 46, "num_attention_heads": 96,
                                               "head_dim": 128}}
DEFAULT_EXTRA["kimi_k25"] = {"text_config": {"model_type": "kimi_k2", "hidden_size": 7168, "num_hidden_layers": 61,
                                              "num_attention_heads": 128}}
DEFAULT_EXTRA["llama4"] = {"text_config": {"hidden_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 40}}
DEFAULT_EXTRA["gemma4_text"] = {"hidden_size": 2304, "num_hidden_layers": 30, "num_attention_heads": 8}
DEFAULT_EXTRA["gemma4"] = {"text_config": DEFAULT_EXTRA["gemma4_text"]}  # no vision or audio config: no towers
DEFAULT_EXTRA["gemma3"] = {"text_config": {"model_type": "gemma3_text", **DEFAULT_EXTRA["gemma3_text"]}}
DEFAULT_EXTRA["gpt2"] = DEFAULT_EXTRA["gpt_bigcode"] = {"n_embd": 768, "n_layer": 12, "n_head": 12}
DEFAULT_EXTRA["bloom"] = {"hidden_size": 64, "n_layer": 2, "n_head": 8}
DEFAULT_EXTRA["t5"] = {"d_model": 512, "num_layers": 6, "num_heads": 8}
DEFAULT_EXTRA["mt5"] = {"d_model": 512, "num_layers": 8, "num_heads": 6}  # MT5Config: mt5-small's shapes
# Glm4MoeConfig has no head_dim default and its 4096 / 96 heads do not divide; GLM-4.5 sets 128
DEFAULT_EXTRA["glm4_moe"]["head_dim"] = 128
# nemotron_h's depth is its block list: the class default one (NemotronHConfig.__post_init__)
DEFAULT_EXTRA["nemotron_h"] = {"hidden_size": 4096, "num_attention_heads": 32,
                               "layers_block_type": ["linear_attention", "moe", "full_attention", "mlp"]}
DEFAULT_EXTRA["lfm2"] = {"hidden_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 32}
# VoxtralConfig fills text_config from its init values (Voxtral-Mini-3B); the heads are llama's default, 32
DEFAULT_EXTRA["voxtral"] = {"text_config": {"num_attention_heads": 32}}
DEFAULT_EXTRA["lfm2_vl"] = {"text_config": DEFAULT_EXTRA["lfm2"]}  # Lfm2VlConfig: text_config defaults to lfm2
DEFAULT_EXTRA["mamba"] = {"hidden_size": 768, "num_hidden_layers": 32}  # state-space models: no attention heads
DEFAULT_EXTRA["mamba2"] = {"hidden_size": 4096, "num_hidden_layers": 64}
DEFAULT_EXTRA["gemma3n_text"] = {"hidden_size": 2048, "num_hidden_layers": 35, "num_attention_heads": 8}  # E4B
DEFAULT_EXTRA["rwkv"] = {"hidden_size": 4096, "num_hidden_layers": 32}  # RwkvConfig: no heads
DEFAULT_EXTRA["granitemoehybrid"] = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32}
DEFAULT_EXTRA["falcon_h1"] = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32}
DEFAULT_EXTRA["qwen3_next"] = {"hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 16}
# deepseek_v2's class default num_experts_per_tok is None, which its router cannot use
DEFAULT_EXTRA["deepseek_v2"]["num_experts_per_tok"] = 6


def test_every_adapter_has_a_defaults_case() -> None:
    assert set(DEFAULT_CLASSES) == set(ADAPTERS) - CONFIG_ONLY - NEEDS_TIMM


@pytest.mark.parametrize("model_type", sorted(DEFAULT_CLASSES), ids=sorted(DEFAULT_CLASSES))
def test_class_defaults_match_transformers(model_type: str) -> None:
    raw = {
        "model_type": model_type,
        "architectures": [DEFAULT_CLASSES[model_type]],
        **DEFAULT_EXTRA.get(model_type, {}),
    }
    _check_against_meta(raw)


# ---- variants: branches the catalog does not reach ------------------------------------------------

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 3, "vocab_size": 97}
VARIANTS: dict[str, dict] = {
    "llama-biases-gqa": {
        **TINY,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "num_key_value_heads": 2,
        "attention_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": True,
    },
    "llama-head_dim": {**TINY, "model_type": "llama", "architectures": ["LlamaForCausalLM"], "head_dim": 24},
    "mistral-kv-default": {
        **TINY,
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "num_attention_heads": 8,
    },
    "qwen2-sliding": {
        **TINY,
        "num_key_value_heads": 2,  # the class default (32 or 16) does not divide TINY's 4 heads
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "use_sliding_window": True,
        "sliding_window": 16,
        "max_window_layers": 1,
    },
    "qwen3-bias-sliding": {
        **TINY,
        "num_key_value_heads": 2,  # the class default (32 or 16) does not divide TINY's 4 heads
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": True,
        "use_sliding_window": True,
        "sliding_window": 8,
        "max_window_layers": 2,
        "head_dim": 16,
    },
    "mixtral-tied-window": {
        **TINY,
        "model_type": "mixtral",
        "architectures": ["MixtralForCausalLM"],
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "tie_word_embeddings": True,
        "sliding_window": 32,
    },
    "qwen2_moe-sparse-step": {
        **TINY,
        "num_key_value_heads": 2,  # the class default (32 or 16) does not divide TINY's 4 heads
        "model_type": "qwen2_moe",
        "architectures": ["Qwen2MoeForCausalLM"],
        "num_hidden_layers": 5,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
        "qkv_bias": False,
        "use_sliding_window": True,
        "sliding_window": 8,
        "max_window_layers": 3,
    },
    "qwen3_moe-dense-layers": {
        **TINY,
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "mlp_only_layers": [0, 2],
        "attention_bias": True,
        "head_dim": 16,
        "num_key_value_heads": 2,
    },
    "gemma-bias": {
        **TINY,
        "model_type": "gemma",
        "architectures": ["GemmaForCausalLM"],
        "head_dim": 32,
        "num_key_value_heads": 1,
        "attention_bias": True,
        "tie_word_embeddings": False,
    },
    "gemma2-layer_types": {
        **TINY,
        "model_type": "gemma2",
        "architectures": ["Gemma2ForCausalLM"],
        "head_dim": 16,
        "num_key_value_heads": 2,
        "sliding_window": 8,
        "layer_types": ["full_attention", "sliding_attention", "full_attention"],
    },
    "gemma3_text": {
        **TINY,
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "num_hidden_layers": 7,
        "head_dim": 16,
        "num_key_value_heads": 2,
        "sliding_window": 8,
        "sliding_window_pattern": 3,
    },
    "gemma3-vision-head-untied": {
        "model_type": "gemma3",
        "architectures": ["Gemma3ForConditionalGeneration"],
        "tie_word_embeddings": False,
        "text_config": {
            **TINY,
            "model_type": "gemma3_text",
            "head_dim": 16,
            "num_key_value_heads": 2,
            "sliding_window": 8,
        },
        "vision_config": {
            "model_type": "siglip_vision_model",
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "image_size": 28,
            "patch_size": 14,
            "vision_use_head": True,
        },
    },
    "phi-qk-layernorm-tied": {
        **TINY,
        "model_type": "phi",
        "architectures": ["PhiForCausalLM"],
        "qk_layernorm": True,
        "tie_word_embeddings": True,
    },
    # q/k_layernorm are sized hidden_size // num_attention_heads even when head_dim differs
    "phi-head_dim-qk-layernorm": {
        **TINY,
        "model_type": "phi",
        "architectures": ["PhiForCausalLM"],
        "qk_layernorm": True,
        "head_dim": 24,
        "num_key_value_heads": 2,
    },
    "phi3-gqa-window": {
        **TINY,
        "model_type": "phi3",
        "architectures": ["Phi3ForCausalLM"],
        "num_key_value_heads": 2,
        "sliding_window": 16,
        "pad_token_id": 0,
    },
    "phimoe-biases": {
        **TINY,
        "model_type": "phimoe",
        "architectures": ["PhimoeForCausalLM"],
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "attention_bias": True,
        "lm_head_bias": True,
    },
    "deepseek_v2-q-lora-biases": {
        **TINY,
        "model_type": "deepseek_v2",
        "architectures": ["DeepseekV2ForCausalLM"],
        "q_lora_rank": 24,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 12,
        "first_k_dense_replace": 1,
        "n_routed_experts": 4,
        "n_shared_experts": 2,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "mlp_bias": True,
        "attention_bias": True,
    },
    "deepseek_v3-no-q-lora": {
        **TINY,
        "model_type": "deepseek_v3",
        "architectures": ["DeepseekV3ForCausalLM"],
        "q_lora_rank": None,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 12,
        "first_k_dense_replace": 2,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "n_group": 2,
        "topk_group": 1,
    },
    # Kimi K2's layout (first_k_dense_replace 1, many experts, one shared expert), shrunk
    "kimi_k2-small": {
        **TINY,
        "model_type": "kimi_k2",
        "architectures": ["DeepseekV3ForCausalLM"],
        "auto_map": {"AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
        "q_lora_rank": 24,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
        "first_k_dense_replace": 1,
        "n_routed_experts": 12,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "num_nextn_predict_layers": 0,
    },
    # DeepSeek-V3.2's DSA layout, shrunk: an MLA layer with a lightning indexer; mlp_layer_types given
    "deepseek_v32-small-mlp_layer_types": {
        **TINY,
        "model_type": "deepseek_v32",
        "architectures": ["DeepseekV32ForCausalLM"],
        "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12,
        "index_n_heads": 2, "index_head_dim": 8, "mlp_layer_types": ["sparse", "dense", "sparse"],
        "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
    },
    # DeepSeek-V4, shrunk: every attention type (sliding, CSA, HCA) at other compress rates, hash and
    # top-k MoE layers, 2 residual streams, 2 output groups
    "deepseek_v4-small-layer_types": {
        **TINY,
        "num_hidden_layers": 4,
        "model_type": "deepseek_v4",
        "architectures": ["DeepseekV4ForCausalLM"],
        "head_dim": 32, "q_lora_rank": 24, "o_groups": 2, "o_lora_rank": 12, "hc_mult": 2, "sliding_window": 8,
        "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                        "compressed_sparse_attention"],
        "compress_rates": {"compressed_sparse_attention": 2, "heavily_compressed_attention": 8},
        "mlp_layer_types": ["hash_moe", "moe", "moe", "hash_moe"],
        "index_n_heads": 2, "index_head_dim": 8, "n_routed_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
    },
    # the per-layer compress_ratios (with a trailing MTP entry) and num_hash_layers of older V4 configs; tied head
    "deepseek_v4-small-compress_ratios": {
        **TINY,
        "model_type": "deepseek_v4",
        "architectures": ["DeepseekV4ForCausalLM"],
        "head_dim": 16, "q_lora_rank": 20, "o_groups": 4, "o_lora_rank": 8, "hc_mult": 3,
        "compress_ratios": [0, 4, 128, 0], "num_hash_layers": 1, "tie_word_embeddings": True,
        "index_n_heads": 4, "index_head_dim": 8, "n_routed_experts": 4, "num_experts_per_tok": 1,
        "moe_intermediate_size": 24,
    },
    # GLM-5.2's shared indexers (index_topk_freq 4, index_skip_topk_offset 3: layers 0-2 full, then one in four)
    "glm_moe_dsa-shared-indexers": {
        **TINY,
        "num_hidden_layers": 8,
        "model_type": "glm_moe_dsa",
        "architectures": ["GlmMoeDsaForCausalLM"],
        "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
        "index_n_heads": 2, "index_head_dim": 8, "index_topk_freq": 4, "index_skip_topk_offset": 3,
        "first_k_dense_replace": 1, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
    },
    "glm_moe_dsa-pattern": {
        **TINY,
        "num_hidden_layers": 4,
        "model_type": "glm_moe_dsa",
        "architectures": ["GlmMoeDsaForCausalLM"],
        "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
        "index_n_heads": 2, "index_head_dim": 8, "index_topk_pattern": "FSSF",
        "first_k_dense_replace": 1, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
    },
    # the Hub's vt_* vision keys are not Kimi_K25VisionConfig fields: the class-default tower is built
    "kimi_k25-small-untied": {
        "model_type": "kimi_k25",
        "architectures": ["Kimi_K25ForConditionalGeneration"],
        "tie_word_embeddings": False,
        "projection_hidden_size": 32,
        "text_config": {**TINY, "model_type": "kimi_k2", "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
                        "qk_rope_head_dim": 4, "v_head_dim": 8, "first_k_dense_replace": 1, "n_routed_experts": 6,
                        "n_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 16},
        "vision_config": {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
                          "pos_emb_height": 4, "pos_emb_width": 6, "patch_size": 7, "vt_hidden_size": 999},
    },
    "gpt_oss-no-bias-layer_types": {
        **TINY,
        "model_type": "gpt_oss",
        "architectures": ["GptOssForCausalLM"],
        "head_dim": 16,
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "attention_bias": False,
        "sliding_window": 8,
        "layer_types": ["full_attention", "full_attention", "sliding_attention"],
    },
    "gpt2-cross-n_inner": {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_embd": 64,
        "n_head": 4,
        "n_layer": 2,
        "n_inner": 100,
        "n_positions": 32,
        "vocab_size": 97,
        "add_cross_attention": True,
    },
    "gpt2-untied-hidden_size-alias": {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "vocab_size": 97,
        "tie_word_embeddings": False,
    },
    "gpt_bigcode-mha-cross": {
        "model_type": "gpt_bigcode",
        "architectures": ["GPTBigCodeForCausalLM"],
        "n_embd": 64,
        "n_head": 4,
        "n_layer": 2,
        "n_positions": 32,
        "vocab_size": 97,
        "multi_query": False,
        "add_cross_attention": True,
    },
    "gpt_neox-sequential-no-bias": {
        **TINY,
        "model_type": "gpt_neox",
        "architectures": ["GPTNeoXForCausalLM"],
        "use_parallel_residual": False,
        "attention_bias": False,
        "tie_word_embeddings": True,
    },
    "falcon-legacy-mha-sequential": {
        "model_type": "falcon",
        "architectures": ["FalconForCausalLM"],
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "vocab_size": 97,
        "multi_query": False,
        "parallel_attn": False,
        "bias": True,
        "alibi": True,
    },
    "falcon-new-arch-one-ln": {
        "model_type": "falcon",
        "architectures": ["FalconForCausalLM"],
        "hidden_size": 64,
        "num_attention_heads": 8,
        "num_kv_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": 97,
        "new_decoder_architecture": True,
        "num_ln_in_parallel_attn": 1,
        "ffn_hidden_size": 96,
        "tie_word_embeddings": False,
    },
    "bloom-untied": {
        "model_type": "bloom",
        "architectures": ["BloomForCausalLM"],
        "hidden_size": 64,
        "n_head": 4,
        "n_layer": 2,
        "vocab_size": 97,
        "tie_word_embeddings": False,
    },
    "opt-350m-layout": {
        "model_type": "opt",
        "architectures": ["OPTForCausalLM"],
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "ffn_dim": 128,
        "vocab_size": 97,
        "max_position_embeddings": 40,
        "word_embed_proj_dim": 32,
        "do_layer_norm_before": False,
    },
    "opt-no-affine-no-bias-untied": {
        "model_type": "opt",
        "architectures": ["OPTForCausalLM"],
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "ffn_dim": 128,
        "vocab_size": 97,
        "layer_norm_elementwise_affine": False,
        "enable_bias": False,
        "tie_word_embeddings": False,
    },
    "olmo2-gqa-bias": {
        **TINY,
        "model_type": "olmo2",
        "architectures": ["Olmo2ForCausalLM"],
        "num_key_value_heads": 2,
        "attention_bias": True,
    },
    "olmo3-layer_types-bias": {
        **TINY,
        "model_type": "olmo3",
        "architectures": ["Olmo3ForCausalLM"],
        "num_key_value_heads": 2,
        "attention_bias": True,
        "sliding_window": 16,
        "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
    },
    "olmo3-default-pattern-tied": {
        **TINY,
        "model_type": "olmo3",
        "architectures": ["Olmo3ForCausalLM"],
        "num_hidden_layers": 5,
        "tie_word_embeddings": True,
    },
    # sliding windows on the NoPE layers (every second one here), biases on
    "smollm3-sliding-nope-biases": {
        **TINY,
        "model_type": "smollm3",
        "architectures": ["SmolLM3ForCausalLM"],
        "pad_token_id": None,  # the class default 128004 is past TINY's vocabulary
        "num_hidden_layers": 4,
        "num_key_value_heads": 2,
        "no_rope_layer_interval": 2,
        "use_sliding_window": True,
        "sliding_window": 8,
        "attention_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": False,
    },
    "smollm3-no_rope_layers-head_dim": {
        **TINY,
        "model_type": "smollm3",
        "architectures": ["SmolLM3ForCausalLM"],
        "pad_token_id": None,
        "num_key_value_heads": 1,
        "head_dim": 24,
        "no_rope_layers": [0, 1, 0],
        "use_sliding_window": True,
        "sliding_window": 4,
    },
    "granite-biases-gqa-tied": {
        **TINY,
        "model_type": "granite",
        "architectures": ["GraniteForCausalLM"],
        "num_key_value_heads": 2,
        "attention_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": True,
        "attention_multiplier": 0.015625,
        "residual_multiplier": 0.22,
        "embedding_multiplier": 12.0,
        "logits_scaling": 8.0,
    },
    "granitemoe-bias": {
        **TINY,
        "model_type": "granitemoe",
        "architectures": ["GraniteMoeForCausalLM"],
        "num_key_value_heads": 1,
        "num_local_experts": 5,
        "num_experts_per_tok": 2,
        "attention_bias": True,
    },
    "exaone4-pattern": {
        **TINY,
        "model_type": "exaone4",
        "architectures": ["Exaone4ForCausalLM"],
        "num_hidden_layers": 6,
        "num_key_value_heads": 2,
        "sliding_window": 16,
        "sliding_window_pattern": 3,
    },
    "exaone4-layer_types-head_dim-tied": {
        **TINY,
        "model_type": "exaone4",
        "architectures": ["Exaone4ForCausalLM"],
        "num_key_value_heads": 1,
        "head_dim": 24,
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention", "full_attention"],
        "tie_word_embeddings": True,
    },
    "starcoder2-window-untied": {
        **TINY,
        "model_type": "starcoder2",
        "architectures": ["Starcoder2ForCausalLM"],
        "num_key_value_heads": 1,
        "sliding_window": 16,
        "tie_word_embeddings": False,
    },
    "starcoder2-no-bias-head_dim": {
        **TINY,
        "model_type": "starcoder2",
        "architectures": ["Starcoder2ForCausalLM"],
        "num_key_value_heads": 2,
        "head_dim": 24,
        "use_bias": False,
    },
    "stablelm-qk-layernorm-parallel-bias": {
        **TINY,
        "model_type": "stablelm",
        "architectures": ["StableLmForCausalLM"],
        "num_key_value_heads": 2,
        "qk_layernorm": True,
        "use_parallel_residual": True,
        "use_qkv_bias": True,
        "tie_word_embeddings": True,
    },
    "stablelm-sequential": {
        **TINY,
        "model_type": "stablelm",
        "architectures": ["StableLmForCausalLM"],
        "num_key_value_heads": 4,
        "partial_rotary_factor": 0.5,
    },
    "cohere-qk-norm-bias-gqa": {
        **TINY,
        "model_type": "cohere",
        "architectures": ["CohereForCausalLM"],
        "pad_token_id": 0,
        "num_key_value_heads": 2,
        "use_qk_norm": True,
        "attention_bias": True,
    },
    "cohere-untied": {
        **TINY,
        "model_type": "cohere",
        "architectures": ["CohereForCausalLM"],
        "tie_word_embeddings": False,
    },
    "cohere2-pattern": {
        **TINY,
        "model_type": "cohere2",
        "architectures": ["Cohere2ForCausalLM"],
        "num_hidden_layers": 5,
        "num_key_value_heads": 1,
        "sliding_window": 8,
        "sliding_window_pattern": 2,
    },
    "cohere2-layer_types-bias-untied": {
        **TINY,
        "model_type": "cohere2",
        "architectures": ["Cohere2ForCausalLM"],
        "head_dim": 8,
        "sliding_window": 8,
        "layer_types": ["full_attention", "sliding_attention", "full_attention"],
        "attention_bias": True,
        "tie_word_embeddings": False,
    },
    "ministral3-window-tied": {
        **TINY,
        "model_type": "ministral3",
        "architectures": ["Ministral3ForCausalLM"],
        "pad_token_id": None,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "sliding_window": 16,
        "tie_word_embeddings": True,
    },
    "mistral3-ministral3-untied-two-feature-layers": {
        "model_type": "mistral3",
        "architectures": ["Mistral3ForConditionalGeneration"],
        "tie_word_embeddings": False,
        "vision_feature_layer": [-1, -3],
        "multimodal_projector_bias": True,
        "spatial_merge_size": 2,
        "text_config": {**TINY, "model_type": "ministral3", "pad_token_id": None, "num_key_value_heads": 2,
                        "head_dim": 16},
        "vision_config": {"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                          "num_attention_heads": 4, "head_dim": 8, "image_size": 56, "patch_size": 14},
    },
    "mistral3-mistral-text-tied": {
        "model_type": "mistral3",
        "architectures": ["Mistral3ForConditionalGeneration"],
        "text_config": {**TINY, "model_type": "mistral", "num_key_value_heads": 2},
        "vision_config": {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
                          "num_attention_heads": 4, "head_dim": 8, "patch_size": 16, "num_channels": 1},
    },
    # Hub Qwen2.5-VL configs are flat: the text model's fields at the top level
    "qwen2_5_vl-flat-sliding": {
        **TINY,
        "model_type": "qwen2_5_vl",
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "num_key_value_heads": 2,
        "use_sliding_window": True,
        "sliding_window": 8,
        "max_window_layers": 1,
        "tie_word_embeddings": False,
        "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 40, "num_heads": 4,
                          "out_hidden_size": 64, "fullatt_block_indexes": [1], "patch_size": 7},
    },
    "qwen2_5_vl-text_config-tied": {
        "model_type": "qwen2_5_vl",
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "text_config": {**TINY, "num_key_value_heads": 4, "tie_word_embeddings": True},
        "vision_config": {"depth": 1, "hidden_size": 32, "intermediate_size": 40, "num_heads": 4,
                          "out_hidden_size": 64, "spatial_merge_size": 1, "temporal_patch_size": 1},
    },
    "qwen3_vl-bias-deepstack": {
        "model_type": "qwen3_vl",
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "text_config": {**TINY, "num_key_value_heads": 2, "head_dim": 16, "attention_bias": True},
        "vision_config": {"depth": 3, "hidden_size": 32, "intermediate_size": 40, "num_heads": 4,
                          "out_hidden_size": 64, "deepstack_visual_indexes": [0, 2], "num_position_embeddings": 64},
    },
    "qwen3_vl_moe-dense-layer-tied": {
        "model_type": "qwen3_vl_moe",
        "architectures": ["Qwen3VLMoeForConditionalGeneration"],
        "tie_word_embeddings": True,
        "text_config": {**TINY, "num_key_value_heads": 2, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                        "moe_intermediate_size": 32, "mlp_only_layers": [1]},
        "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 40, "num_heads": 4,
                          "out_hidden_size": 64, "deepstack_visual_indexes": [1], "num_position_embeddings": 16},
    },
    # Maverick's layout: dense and MoE layers interleaved, shrunk; a vision tower
    "llama4-interleaved-vision": {
        "model_type": "llama4",
        "architectures": ["Llama4ForConditionalGeneration"],
        "text_config": {**TINY, "num_hidden_layers": 4, "intermediate_size": 32, "intermediate_size_mlp": 96,
                        "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4,
                        "interleave_moe_layer_step": 2, "pad_token_id": None},
        "vision_config": {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
                          "image_size": 28, "patch_size": 14, "vision_output_dim": 40, "projector_input_dim": 40,
                          "projector_output_dim": 24},
    },
    "llama4_text-moe_layers-bias-tied": {
        **TINY,
        "model_type": "llama4_text",
        "architectures": ["Llama4ForCausalLM"],
        "pad_token_id": None,
        "num_key_value_heads": 1,
        "head_dim": 8,
        "num_local_experts": 3,
        "num_experts_per_tok": 2,
        "moe_layers": [0, 2],
        "attention_bias": True,
        "tie_word_embeddings": True,
    },
    "glm4-gqa-no-bias": {
        **TINY,
        "model_type": "glm4",
        "architectures": ["Glm4ForCausalLM"],
        "pad_token_id": None,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "attention_bias": False,
        "tie_word_embeddings": True,
    },
    "glm4-default-bias": {**TINY, "model_type": "glm4", "architectures": ["Glm4ForCausalLM"], "pad_token_id": None},
    "glm4_moe-qk-norm-bias": {
        **TINY,
        "model_type": "glm4_moe",
        "architectures": ["Glm4MoeForCausalLM"],
        "num_key_value_heads": 2,
        "head_dim": 24,
        "use_qk_norm": True,
        "attention_bias": True,
        "first_k_dense_replace": 2,
        "n_routed_experts": 6,
        "n_shared_experts": 2,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
    },
    "glm4_moe-one-dense": {
        **TINY,
        "model_type": "glm4_moe",
        "architectures": ["Glm4MoeForCausalLM"],
        "num_key_value_heads": 1,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "partial_rotary_factor": 0.5,
    },
    "glm4v_moe-small-tied": {
        "model_type": "glm4v_moe",
        "architectures": ["Glm4vMoeForConditionalGeneration"],
        "text_config": {**TINY, "num_key_value_heads": 2, "head_dim": 16, "n_routed_experts": 4, "num_experts_per_tok": 2,
                        "moe_intermediate_size": 32, "first_k_dense_replace": 2, "pad_token_id": None,
                        "tie_word_embeddings": True},
        "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 40, "num_heads": 4, "out_hidden_size": 48,
                          "image_size": 28, "patch_size": 14, "attention_bias": True, "spatial_merge_size": 1},
    },
    "minimax_m2-small": {
        **TINY,
        "model_type": "minimax_m2",
        "architectures": ["MiniMaxM2ForCausalLM"],
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rotary_dim": 8,
        "num_local_experts": 6,
        "num_experts_per_tok": 2,
    },
    # the Hub configs name InternLM3ForCausalLM (remote code); transformers builds LlamaForCausalLM
    "internlm3-bias-aliases": {
        **TINY,
        "model_type": "internlm3",
        "architectures": ["InternLM3ForCausalLM"],
        "pad_token_id": None,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "qkv_bias": True,
        "bias": True,
    },
    "jamba-small": {
        **TINY,
        "model_type": "jamba",
        "architectures": ["JambaForCausalLM"],
        "num_hidden_layers": 6,
        "num_key_value_heads": 2,
        "num_experts": 4,
        "attn_layer_period": 3,
        "attn_layer_offset": 1,
        "expert_layer_period": 3,
        "expert_layer_offset": 2,
        "mamba_dt_rank": 8,
        "mamba_proj_bias": True,
        "mamba_conv_bias": False,
        "mamba_d_state": 4,
        "mamba_d_conv": 3,
        "mamba_expand": 3,
    },
    "jamba-one-expert": {
        **TINY,
        "model_type": "jamba",
        "architectures": ["JambaForCausalLM"],
        "num_hidden_layers": 4,
        "num_key_value_heads": 2,
        "num_experts": 1,
        "attn_layer_period": 2,
        "attn_layer_offset": 0,
    },
    "t5-v1_1-gated-untied": {
        "model_type": "t5",
        "architectures": ["T5ForConditionalGeneration"],
        "d_model": 32,
        "d_kv": 8,
        "d_ff": 48,
        "num_layers": 3,
        "num_decoder_layers": 2,
        "num_heads": 4,
        "vocab_size": 97,
        "feed_forward_proj": "gated-gelu",
        "tie_word_embeddings": False,
    },
    "t5-model": {
        "model_type": "t5",
        "architectures": ["T5Model"],
        "d_model": 32,
        "d_kv": 8,
        "d_ff": 48,
        "num_layers": 2,
        "num_heads": 4,
        "vocab_size": 97,
    },
    "t5-encoder": {
        "model_type": "t5",
        "architectures": ["T5EncoderModel"],
        "d_model": 32,
        "d_kv": 8,
        "d_ff": 48,
        "num_layers": 2,
        "num_heads": 4,
        "vocab_size": 97,
        "feed_forward_proj": "gated-silu",
    },
    "mt5-untied": {  # mT5 / mT0 checkpoints: MT5Config's gated-gelu default, the lm_head stored apart
        "model_type": "mt5",
        "architectures": ["MT5ForConditionalGeneration"],
        "d_model": 32,
        "d_kv": 8,
        "d_ff": 48,
        "num_layers": 2,
        "num_heads": 4,
        "vocab_size": 97,
        "tie_word_embeddings": False,
    },
}
_BERT = {
    "model_type": "bert",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "vocab_size": 97,
    "max_position_embeddings": 40,
    "type_vocab_size": 3,
}
for _cls in (
    "BertModel",
    "BertForSequenceClassification",
    "BertForPreTraining",
    "BertForNextSentencePrediction",
    "BertForMultipleChoice",
    "BertForTokenClassification",
    "BertForQuestionAnswering",
):
    VARIANTS[f"bert-{_cls}"] = {**_BERT, "architectures": [_cls], "id2label": {"0": "a", "1": "b", "2": "c"}}
# Nemotron Nano 9B v2 (nvidia/NVIDIA-Nemotron-Nano-9B-v2 config.json: hidden 4480, heads 40 / kv 8 / head_dim 128,
# mamba 128 heads x 80, n_groups 8, ssm_state_size 128, conv_kernel 4, pattern below), shrunk: the first 16
# symbols of its hybrid_override_pattern, narrow widths
NEMOTRON_H_NANO_PATTERN = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"
VARIANTS["nemotron_h-nano-pattern"] = {
    "model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "hidden_size": 64, "vocab_size": 97,
    "hybrid_override_pattern": NEMOTRON_H_NANO_PATTERN[:16], "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "intermediate_size": 96, "mamba_num_heads": 8, "mamba_head_dim": 10, "n_groups": 2,
    "ssm_state_size": 8, "conv_kernel": 4, "max_position_embeddings": 128,
}
# Nemotron 3 style: MoE blocks with a latent projection, legacy field names, the block list spelled out
VARIANTS["nemotron_h-moe-latent-list"] = {
    "model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "hidden_size": 64, "vocab_size": 97,
    "layers_block_type": ["linear_attention", "moe", "full_attention", "moe", "linear_attention", "mlp"],
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
    "mamba_num_heads": 8, "mamba_head_dim": 10, "mamba_n_groups": 1, "ssm_state_size": 8, "mamba_d_conv": 4,
    "mamba_conv_bias": False, "use_bias": True, "mlp_bias": True, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 24, "moe_shared_expert_intermediate_size": 40, "moe_latent_size": 16,
}
# LFM2-350M geometry (hidden 1024, 16 layers, 16 heads / 8 kv, conv_L_cache 3, attention at full_attn_idxs
# [2, 5, 8, 10, 12, 14]), shrunk
VARIANTS["lfm2-350m-full_attn_idxs"] = {
    "model_type": "lfm2", "architectures": ["Lfm2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 16,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 97, "block_ff_dim": 192, "conv_L_cache": 3,
    "full_attn_idxs": [2, 5, 8, 10, 12, 14],
}
VARIANTS["lfm2-layer_types-untied-bias"] = {
    "model_type": "lfm2", "architectures": ["Lfm2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 97, "intermediate_size": 160,
    "block_auto_adjust_ff_dim": False, "conv_bias": True, "tie_word_embeddings": False,
    "layer_types": ["conv", "full_attention", "conv", "full_attention"],
}
# LFM2-VL-1.6B style (vision_use_head false, projector without its LayerNorm here), shrunk; untied
VARIANTS["lfm2_vl-no-head-untied"] = {
    "model_type": "lfm2_vl", "architectures": ["Lfm2VlForConditionalGeneration"], "tie_word_embeddings": False,
    "downsample_factor": 2, "projector_hidden_size": 48, "projector_bias": False, "projector_use_layernorm": False,
    "text_config": {"model_type": "lfm2", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "vocab_size": 97, "block_ff_dim": 192,
                    "layer_types": ["conv", "full_attention", "conv", "conv"]},
    "vision_config": {"model_type": "siglip2_vision_model", "hidden_size": 32, "intermediate_size": 48,
                      "num_hidden_layers": 2, "num_attention_heads": 4, "patch_size": 4, "num_patches": 64,
                      "vision_use_head": False},
}
VARIANTS["lfm2_vl-head-tie_embedding"] = {
    "model_type": "lfm2_vl", "architectures": ["Lfm2VlForConditionalGeneration"], "tie_embedding": True,
    "downsample_factor": 3,
    "text_config": {"model_type": "lfm2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
                    "vocab_size": 97, "block_ff_dim": 192, "full_attn_idxs": [1]},
    "vision_config": {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 4,
                      "patch_size": 2, "num_channels": 1},
}
# Voxtral, shrunk: the encoder's Whisper names (d_model, encoder_layers, encoder_ffn_dim) as the Hub config writes them
VARIANTS["voxtral-whisper-names"] = {
    "model_type": "voxtral", "architectures": ["VoxtralForConditionalGeneration"],
    "text_config": {**TINY, "model_type": "llama", "num_key_value_heads": 2, "head_dim": 16, "tie_word_embeddings": True},
    "audio_config": {"model_type": "voxtral_encoder", "d_model": 32, "encoder_layers": 2, "encoder_attention_heads": 4,
                     "encoder_ffn_dim": 128, "num_mel_bins": 8, "max_source_positions": 10},
}
# Gemma 4 "E" style, shrunk: per-layer embeddings, the last 2 layers reusing the cache (their MLP double wide),
# global layers with K = V (1 KV head of 32), a vision tower (standardize buffers) and an audio Conformer
VARIANTS["gemma4-e-towers-kv-sharing"] = {
    "model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"],
    "text_config": {"model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32, "intermediate_size": 96,
                    "vocab_size": 97, "vocab_size_per_layer_input": 50, "hidden_size_per_layer_input": 8,
                    "num_kv_shared_layers": 2, "use_double_wide_mlp": True, "attention_k_eq_v": True,
                    "num_global_key_value_heads": 1,
                    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]},
    "vision_config": {"model_type": "gemma4_vision", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "position_embedding_size": 20,
                      "patch_size": 4, "standardize": True},
    "audio_config": {"model_type": "gemma4_audio", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "subsampling_conv_channels": [8, 4], "conv_kernel_size": 5, "output_proj_dims": 40},
}
# Gemma 4 26B-A4B style MoE text model, shrunk: dense MLP beside 4 experts (top 2), biases, untied, no per-layer
# embeddings; the last layer forced to full attention (layer_types ends sliding)
VARIANTS["gemma4_text-moe-bias-untied"] = {
    "model_type": "gemma4_text", "architectures": ["Gemma4ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 16, "global_head_dim": 24, "intermediate_size": 96,
    "vocab_size": 97, "hidden_size_per_layer_input": 0, "attention_bias": True, "tie_word_embeddings": False,
    "enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 16,
    "attention_k_eq_v": True, "num_global_key_value_heads": 2,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
}
# Mamba-1, shrunk (MambaConfig's state 16, conv 4, expand 2)
VARIANTS["mamba-130m-shrunk"] = {
    "model_type": "mamba", "architectures": ["MambaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 3,
    "vocab_size": 97, "state_size": 16, "conv_kernel": 4, "expand": 2,
}
VARIANTS["mamba-bias-rank-untied"] = {
    "model_type": "mamba", "architectures": ["MambaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
    "vocab_size": 97, "state_size": 8, "use_bias": True, "use_conv_bias": False, "time_step_rank": 6,
    "tie_word_embeddings": False,
}
# Mamba-2, shrunk: heads x head_dim = expand x hidden, several groups, biases
VARIANTS["mamba2-codestral-shrunk"] = {
    "model_type": "mamba2", "architectures": ["Mamba2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 3,
    "vocab_size": 97, "num_heads": 8, "head_dim": 16, "n_groups": 2, "state_size": 8, "use_bias": True,
}
# Qwen3-Next layout (every 4th layer full attention, Gated DeltaNet elsewhere, MoE with a gated shared expert), shrunk
VARIANTS["qwen3_next-80b-shrunk"] = {
    "model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], "hidden_size": 64, "num_hidden_layers": 8,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 97, "intermediate_size": 96,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24, "shared_expert_intermediate_size": 40,
}
VARIANTS["qwen3_next-layer_types-dense-bias"] = {
    "model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 97, "intermediate_size": 96,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "layer_types": ["full_attention", "linear_attention", "linear_attention", "full_attention"],
    "attention_bias": True, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
    "shared_expert_intermediate_size": 40, "mlp_only_layers": [1], "decoder_sparse_step": 2,
}
# Granite-4.0-H layout (layer_types "mamba" / "attention", MoE beside a shared MLP, no rotary), shrunk
VARIANTS["granitemoehybrid-tiny-shrunk"] = {
    "model_type": "granitemoehybrid", "architectures": ["GraniteMoeHybridForCausalLM"], "hidden_size": 64,
    "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 97,
    "layer_types": ["mamba", "mamba", "attention", "mamba", "mamba", "attention"], "mamba_n_heads": 8,
    "mamba_d_head": 16, "mamba_n_groups": 1, "mamba_d_state": 8, "mamba_d_conv": 4, "num_local_experts": 4,
    "num_experts_per_tok": 2, "intermediate_size": 24, "shared_intermediate_size": 40,
    "position_embedding_type": "nope",
}
VARIANTS["granitemoehybrid-dense-bias"] = {
    "model_type": "granitemoehybrid", "architectures": ["GraniteMoeHybridForCausalLM"], "hidden_size": 64,
    "num_hidden_layers": 3, "num_attention_heads": 4, "vocab_size": 97, "head_dim": 32,
    "layer_types": ["linear_attention", "full_attention", "linear_attention"], "mamba_n_heads": 4,
    "mamba_n_groups": 2, "mamba_d_state": 8, "num_local_experts": 0, "shared_intermediate_size": 40,
    "attention_bias": True, "mamba_proj_bias": True, "mamba_conv_bias": False, "position_embedding_type": "rope",
}
# Falcon-H1: attention and Mamba-2 in every layer, mamba_d_ssm given, shrunk
VARIANTS["falcon_h1-shrunk"] = {
    "model_type": "falcon_h1", "architectures": ["FalconH1ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 97, "intermediate_size": 96,
    "mamba_d_ssm": 96, "mamba_n_heads": 6, "mamba_d_head": 16, "mamba_n_groups": 1, "mamba_d_state": 8,
}
VARIANTS["falcon_h1-rmsnorm-biases-tied"] = {
    "model_type": "falcon_h1", "architectures": ["FalconH1ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 97, "intermediate_size": 96,
    "mamba_d_ssm": None, "mamba_expand": 2, "mamba_n_heads": 8, "mamba_n_groups": 2, "mamba_d_state": 8,
    "mamba_rms_norm": True, "mamba_proj_bias": True, "projectors_bias": True, "mamba_conv_bias": False,
    "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True,
}
VARIANTS["gemma3n_text-widths-kv-sharing-bias-untied"] = {
    "model_type": "gemma3n_text", "architectures": ["Gemma3nForCausalLM"], "hidden_size": 64, "num_hidden_layers": 6,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 97,
    "vocab_size_per_layer_input": 50, "hidden_size_per_layer_input": 8, "intermediate_size": [96, 96, 128, 128, 64, 64],
    "num_kv_shared_layers": 2, "altup_num_inputs": 3, "laurel_rank": 4, "attention_bias": True,
    "tie_word_embeddings": False, "sliding_window": 16,
    "layer_types": ["sliding_attention", "full_attention"] * 3,
}
VARIANTS["rwkv-4-169m-pile"] = {  # RWKV/rwkv-4-169m-pile's geometry
    "model_type": "rwkv", "architectures": ["RwkvForCausalLM"], "hidden_size": 768, "num_hidden_layers": 12,
    "vocab_size": 50277, "context_length": 1024,
}
VARIANTS["rwkv-narrow-attention-tied"] = {
    "model_type": "rwkv", "architectures": ["RwkvForCausalLM"], "hidden_size": 64, "attention_hidden_size": 32,
    "intermediate_size": 80, "num_hidden_layers": 3, "vocab_size": 97, "tie_word_embeddings": True,
}
VARIANTS["bert-mlm-untied"] = {**_BERT, "architectures": ["BertForMaskedLM"], "tie_word_embeddings": False}
VARIANTS["bert-lm-head-decoder-cross"] = {
    **_BERT,
    "architectures": ["BertLMHeadModel"],
    "is_decoder": True,
    "add_cross_attention": True,
}
VARIANTS["bert-classification-default-labels"] = {**_BERT, "architectures": ["BertForSequenceClassification"]}


@pytest.mark.parametrize("variant", sorted(VARIANTS), ids=sorted(VARIANTS))
def test_variant_matches_transformers_on_meta(variant: str) -> None:
    _check_against_meta(VARIANTS[variant])


WINDOWED_VARIANTS = sorted(v for v, raw in VARIANTS.items() if raw["model_type"] in WINDOW_ON_MODULE)


@pytest.mark.parametrize("variant", WINDOWED_VARIANTS, ids=WINDOWED_VARIANTS)
def test_variant_sliding_windows_match_transformers(variant: str) -> None:
    raw = _native(VARIANTS[variant])
    _, from_meta = _on_meta(json.dumps(raw, sort_keys=True))
    assert [layer.attention.sliding_window for layer in _analytic(raw).layers] == [
        layer.attention.sliding_window for layer in from_meta.layers
    ]


# model_types whose config class derives ``layer_types`` (sliding / full) in __post_init__ while the
# attention module keeps the window whatever the layer's type: the class's list is the reference.
LAYER_TYPES_FROM_CLASS = {"exaone4", "olmo3"}
LAYER_TYPED_VARIANTS = sorted(v for v, raw in VARIANTS.items() if raw["model_type"] in LAYER_TYPES_FROM_CLASS)


@pytest.mark.parametrize("variant", LAYER_TYPED_VARIANTS, ids=LAYER_TYPED_VARIANTS)
def test_variant_windows_follow_the_config_class_layer_types(variant: str) -> None:
    from transformers import AutoConfig

    raw = VARIANTS[variant]
    config = AutoConfig.for_model(raw["model_type"], **{k: v for k, v in raw.items() if k != "model_type"})
    expected = [config.sliding_window if t == "sliding_attention" else None for t in config.layer_types]
    assert [layer.attention.sliding_window for layer in _analytic(raw).layers] == expected


def test_exaone4_pattern_string() -> None:
    """EXAONE 4 Hub configs write the pattern "LLLG": three sliding layers, then a full one, from layer 0."""
    raw = {**VARIANTS["exaone4-pattern"], "num_hidden_layers": 6, "sliding_window_pattern": "LLLG"}
    assert [layer.attention.sliding_window for layer in _analytic(raw).layers] == [16, 16, 16, None, 16, 16]
    with pytest.raises(ConfigError, match=r"sliding_window_pattern\[2\] = 'X'"):
        _analytic({**raw, "sliding_window_pattern": "LLXG"})


def test_variants_cover_every_adapter() -> None:
    assert {v["model_type"] for v in VARIANTS.values()} >= set(ADAPTERS) - CONFIG_ONLY - NEEDS_TIMM


# ---- config-only families: the Hub repos' own modeling code, checked against published totals -------


def _internlm2(h: int, layers: int, heads: int, kv: int, i: int, vocab: int, *, bias: bool) -> int:
    """InternLM2 (modeling_internlm2.py of the Hub repos): fused wqkv, wo, w1/w3/w2, two RMSNorms, untied output."""
    d = h // heads
    per_layer = h * (heads + 2 * kv) * d + heads * d * h + 3 * h * i + 2 * h
    per_layer += ((heads + 2 * kv) * d + h) if bias else 0  # wqkv and wo biases
    return 2 * vocab * h + layers * per_layer + h


@pytest.mark.parametrize(
    ("size", "geometry", "published"),
    [
        # published totals of internlm/internlm2_5-{1_8b,7b,20b}-chat (a model-size table, index id 12439498600;
        # 7,737,708,544 also printed by InternLM's own chat demo, index id 41727181442)
        ("1_8b", (2048, 24, 16, 8, 8192, 92544), 1_889_110_016),
        ("7b", (4096, 32, 32, 8, 14336, 92544), 7_737_708_544),
        ("20b", (6144, 48, 48, 8, 16384, 92544), 19_861_149_696),
    ],
)
def test_internlm2_5_published_totals(size: str, geometry: tuple[int, ...], published: int) -> None:
    h, layers, heads, kv, i, vocab = geometry
    assert _internlm2(*geometry, bias=False) == published  # the arithmetic reproduces the published figure
    raw = {"model_type": "internlm2", "architectures": ["InternLM2ForCausalLM"], "hidden_size": h,
           "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
           "intermediate_size": i, "vocab_size": vocab, "bias": False}
    spec = _analytic(raw)
    assert spec.num_params == published
    names = {t.name for t in spec.layers[0].tensors} | {t.name for t in (*spec.embedding, *spec.head)}
    assert {"attention.wqkv.weight", "feed_forward.w3.weight", "model.tok_embeddings.weight", "output.weight"} <= names


def _chatglm(h: int, layers: int, heads: int, groups: int, d: int, ffn: int, vocab: int) -> int:
    """ChatGLM2/3 and GLM-4 (modeling_chatglm.py): biased fused QKV, dense, SwiGLU h_to_4h / 4h_to_h, untied output."""
    qkv = (heads + 2 * groups) * d
    per_layer = h * qkv + qkv + heads * d * h + h * 2 * ffn + ffn * h + 2 * h
    return 2 * vocab * h + layers * per_layer + h


@pytest.mark.parametrize(
    ("name", "geometry", "published"),
    [
        # ChatGLM2-6B / ChatGLM3-6B: 6,243,584,000 trainable parameters (a per-tensor breakdown, index id
        # 17073814855: query_key_value 18,878,976, dense 16,777,216, h_to_4h 112,197,632, 4h_to_h 56,098,816 per
        # layer; the same total printed for THUDM/chatglm3-6b, index id 29151670186)
        ("chatglm3-6b", (4096, 28, 32, 2, 128, 13696, 65024), 6_243_584_000),
        # GLM-4-9B-Chat: 9,399,951,360 trainable (index ids 29151670186, 42305816254)
        ("glm-4-9b-chat", (4096, 40, 32, 2, 128, 13696, 151552), 9_399_951_360),
    ],
)
def test_chatglm_published_totals(name: str, geometry: tuple[int, ...], published: int) -> None:
    h, layers, heads, groups, d, ffn, vocab = geometry
    assert _chatglm(*geometry) == published
    raw = {"model_type": "chatglm", "architectures": ["ChatGLMModel"], "hidden_size": h, "num_layers": layers,
           "num_attention_heads": heads, "multi_query_attention": True, "multi_query_group_num": groups,
           "kv_channels": d, "ffn_hidden_size": ffn, "padded_vocab_size": vocab, "add_qkv_bias": True,
           "add_bias_linear": False}
    spec = _analytic(raw)
    assert spec.num_params == published
    assert (spec.num_kv_heads, spec.head_dim) == (groups, d)


def test_chatglm_refuses_what_it_does_not_count() -> None:
    with pytest.raises(ConfigError, match="'pre_seq_len'"):
        _analytic({"model_type": "chatglm", "hidden_size": 64, "num_attention_heads": 4, "pre_seq_len": 8})
    with pytest.raises(ConfigError, match="first ChatGLM-6B"):
        _analytic({"model_type": "chatglm", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 97,
                   "position_encoding_2d": True})


def test_minicpm_2b_published_total() -> None:
    """MiniCPM-2B (openbmb/MiniCPM-2B-sft-bf16): h 2304, 40 layers, 36 heads (MHA), i 5760, V 122753, tied.

    2,724,880,896 parameters, as a chat demo serving it prints (index id 41738685489; mteb lists the same
    for MiniCPM-based embedders, index id 15815799305).
    """
    h, layers, i, vocab = 2304, 40, 5760, 122753
    total = vocab * h + layers * (4 * h * h + 3 * h * i + 2 * h) + h
    assert total == 2_724_880_896
    raw = {"model_type": "minicpm", "architectures": ["MiniCPMForCausalLM"], "hidden_size": h,
           "num_hidden_layers": layers, "num_attention_heads": 36, "num_key_value_heads": 36,
           "intermediate_size": i, "vocab_size": vocab, "scale_emb": 12, "dim_model_base": 256, "scale_depth": 1.4}
    spec = _analytic(raw)
    assert spec.num_params == total and spec.tie_word_embeddings  # tied by MiniCPMConfig's default
    with pytest.raises(ConfigError, match="MiniCPM-MoE"):
        _analytic({**raw, "num_experts": 8})


def test_baichuan_7b_published_total() -> None:
    """Baichuan-7B: h 4096, 32 layers, 32 heads (MHA, fused W_pack), i 11008, V 64000, untied lm_head.

    n_parameters 7,000,559,616 in its model card's hyperparameter table (index id 10919183458; the same in a
    FLOPs table, index id 5812671115).
    """
    h, layers, i, vocab = 4096, 32, 11008, 64000
    total = 2 * vocab * h + layers * (3 * h * h + h * h + 3 * h * i + 2 * h) + h
    assert total == 7_000_559_616
    spec = _analytic({"model_type": "baichuan", "architectures": ["BaiChuanForCausalLM"], "hidden_size": h,
                      "num_hidden_layers": layers, "num_attention_heads": 32, "intermediate_size": i,
                      "vocab_size": vocab, "max_position_embeddings": 4096})
    assert spec.num_params == total
    assert {t.name for t in spec.layers[0].tensors} >= {"self_attn.W_pack.weight", "mlp.gate_proj.weight"}


def test_internlm2_class_defaults() -> None:
    """InternLM2Config defaults: vocab 103168, i 11008, MHA, bias true, untied; here h 4096, 32 layers, 32 heads."""
    spec = _analytic({"model_type": "internlm2", "hidden_size": 4096, "num_hidden_layers": 32,
                      "num_attention_heads": 32})
    assert spec.num_params == _internlm2(4096, 32, 32, 32, 11008, 103168, bias=True)
    assert spec.num_kv_heads == 32 and not spec.tie_word_embeddings


# ---- published totals, with the arithmetic ---------------------------------------------------------


def test_llama2_7b_by_component() -> None:
    """Llama-2-7B: h 4096, 32 layers, 32 heads (MHA), i 11008, V 32000, untied lm_head."""
    h, layers, i, vocab = 4096, 32, 11008, 32000
    embedding = vocab * h  # 131,072,000
    attention = layers * 4 * h * h  # q, k, v, o: 2,147,483,648
    mlp = layers * 3 * h * i  # gate, up, down: 4,328,521,728
    norms = layers * 2 * h + h  # two RMSNorms per layer + final: 266,240
    lm_head = vocab * h  # 131,072,000
    assert embedding + attention + mlp + norms + lm_head == 6_738_415_616
    spec = load_model("meta-llama/Llama-2-7b-hf")
    assert spec.params_by_component() == {
        Component.EMBEDDING: embedding,
        Component.ATTENTION: attention,
        Component.MLP: mlp,
        Component.NORM: norms,
        Component.LM_HEAD: lm_head,
    }
    assert spec.num_params == 6_738_415_616


def test_gpt2_small_total() -> None:
    """GPT-2 (124M): h 768, 12 layers, V 50257, 1024 positions, tied lm_head, biases everywhere."""
    h, layers, vocab, positions = 768, 12, 50257, 1024
    per_layer = (
        2 * 2 * h  # ln_1, ln_2 (weight + bias)
        + (h * 3 * h + 3 * h)  # c_attn
        + (h * h + h)  # attn.c_proj
        + (h * 4 * h + 4 * h)  # mlp.c_fc
        + (4 * h * h + h)  # mlp.c_proj
    )
    total = vocab * h + positions * h + layers * per_layer + 2 * h  # + ln_f; lm_head tied to wte
    assert per_layer == 7_087_872
    assert total == 124_439_808
    assert load_model("openai-community/gpt2").num_params == total


def test_mixtral_8x7b_total() -> None:
    """Mixtral-8x7B: h 4096, 32 layers, 32 heads / 8 KV heads of 128, 8 experts of i 14336."""
    h, layers, vocab, kv, i, experts = 4096, 32, 32000, 8 * 128, 14336, 8
    attention = 2 * h * h + 2 * h * kv  # q, o + k, v: 41,943,040
    moe = experts * 3 * h * i + experts * h  # experts + router: 1,409,318,912
    per_layer = attention + moe + 2 * h
    total = 2 * vocab * h + layers * per_layer + h
    assert total == 46_702_792_704
    assert load_model("mistralai/Mixtral-8x7B-v0.1").num_params == total


def test_octocoder_total() -> None:
    """OctoCoder = StarCoder: h 6144, 40 layers, 48 heads with one K/V head (MQA), i 24576, tied."""
    h, layers, vocab, positions, d, i = 6144, 40, 49152, 8192, 6144 // 48, 24576
    per_layer = (
        2 * 2 * h  # ln_1, ln_2
        + (h + 2 * d) * h
        + (h + 2 * d)  # c_attn: queries h wide, one key and one value head
        + h * h
        + h  # attn.c_proj
        + i * h
        + i  # mlp.c_fc
        + h * i
        + h  # mlp.c_proj
    )
    total = vocab * h + positions * h + layers * per_layer + 2 * h
    assert total == 15_517_456_384  # "15.5B"; x 2 bytes = 28.90 GiB of bf16 weights
    assert load_model("bigcode/octocoder").num_params == total


def test_t0_3b_total() -> None:
    """T0_3B = T5 v1.1 XL shapes: d_model 2048, d_ff 5120 gated, 32 heads x 64, 24 + 24 blocks, untied lm_head.

    keras-hub lists t5_1.1_xl at 2,849,757,184 parameters; transformers >= 5 builds the class with
    the lm_head tied, 2,783,959,040, but loads the checkpoint's own lm_head.
    """
    d, ff, inner, vocab, blocks, buckets, heads = 2048, 5120, 32 * 64, 32128, 24, 32, 32
    attention = 4 * d * inner
    encoder = blocks * (attention + 3 * d * ff + 2 * d) + buckets * heads + d
    decoder = blocks * (2 * attention + 3 * d * ff + 3 * d) + buckets * heads + d
    total = vocab * d + encoder + decoder + vocab * d
    assert total == 2_849_757_184
    assert load_model("bigscience/T0_3B").num_params == total


@pytest.mark.parametrize(
    ("model_id", "expected"),
    [
        ("meta-llama/Llama-2-70b-hf", 68_976_648_192),  # HF model card / safetensors index
        ("meta-llama/Llama-3.1-8B", 8_030_261_248),  # safetensors total of the Hub repo
        ("meta-llama/Llama-3.1-405B", 405_853_388_800),
        ("openai/gpt-oss-120b", 116_829_156_672),  # OpenAI model card table: 116.83B total
        ("openai/gpt-oss-20b", 20_914_757_184),  # OpenAI model card table: 20.91B total
        ("google-bert/bert-base-uncased", 109_514_298),  # BertForMaskedLM (no pooler); "110M"
        # paramCount 1,026,408,232,448 of "Kimi K2 Instruct" in a provider's model list (index id
        # 66729435508) and the "logical parameters" of K2-Instruct in a checkpoint-header audit (index id
        # 68577105039), less the 60 MoE layers x 384 e_score_correction_bias the checkpoint stores and
        # transformers holds as a buffer: 1,026,408,232,448 - 60 * 384
        ("moonshotai/Kimi-K2-Instruct", 1_026_408_232_448 - 60 * 384),
        # 228,689,764,864: llama.cpp's model_n_params of the MiniMax-M2.7 GGUF (index id 58464340977) and
        # a Hub total_params table (index id 71142266638), less 62 layers x 256 e_score_correction_bias
        ("MiniMaxAI/MiniMax-M2.7", 228_689_764_864 - 62 * 256),
        # the "logical parameters" of Kimi-K2.5 in a checkpoint-header audit (index id 68577105039: INT4 packing
        # unpacked, scales left out), less the 60 x 384 stored e_score_correction_bias
        ("moonshotai/Kimi-K2.5", 1_026_879_376_368 - 60 * 384),
        # Hub numParameters of Qwen/Qwen2.5-VL-7B-Instruct (index id 33908990598; mteb's n_parameters, id 59863403706)
        ("Qwen/Qwen2.5-VL-7B-Instruct", 8_292_166_656),
        # Hub safetensors total of Qwen/Qwen3-VL-8B-Instruct (index id 62872967919)
        ("Qwen/Qwen3-VL-8B-Instruct", 8_767_123_696),
        # paramCount of "Qwen 3 VL 30B A3B Instruct" / "Qwen 3 VL 235B A22B Instruct" (index id 66729435508)
        ("Qwen/Qwen3-VL-30B-A3B-Instruct", 31_070_754_032),
        ("Qwen/Qwen3-VL-235B-A22B-Instruct", 235_670_022_896),
        # Hub parameter counts of the Llama 4 Instruct repos (index ids 71142266638, 70911651117; 71136150794)
        ("meta-llama/Llama-4-Scout-17B-16E-Instruct", 108_641_793_536),
        ("meta-llama/Llama-4-Maverick-17B-128E-Instruct", 401_583_781_376),
        # the Hub count listed for mistralai/Ministral-3-3B-Instruct-2512 (index id 71142266638), vision tower included
        ("mistralai/Ministral-3-3B-Instruct-2512", 3_849_090_048),
        # StableLM 2 1.6B in a model-comparison table (index id 35661935992)
        ("stabilityai/stablelm-2-zephyr-1_6b", 1_644_515_328),
        # aya-expanse-8b's published total (index id 12439498600), Aya-23-8B's architecture
        ("CohereForAI/aya-23-8B", 8_028_033_024),
        # config-only families, their catalog configs (the arithmetic is in the tests below)
        ("THUDM/chatglm3-6b", 6_243_584_000),
        ("internlm/internlm2_5-7b-chat", 7_737_708_544),
        ("openbmb/MiniCPM-2B-sft-bf16", 2_724_880_896),
    ],
    ids=["llama2-70b", "llama3.1-8b", "llama3.1-405b", "gpt-oss-120b", "gpt-oss-20b", "bert-base-mlm", "kimi-k2",
         "minimax-m2.7", "kimi-k2.5", "qwen2.5-vl-7b", "qwen3-vl-8b", "qwen3-vl-30b-a3b", "qwen3-vl-235b-a22b",
         "llama4-scout", "llama4-maverick", "ministral3-3b", "stablelm2-1.6b", "aya-23-8b", "chatglm3-6b",
         "internlm2.5-7b", "minicpm-2b"],
)
def test_published_totals(model_id: str, expected: int) -> None:
    assert load_model(model_id).num_params == expected


# ---- active parameters of MoE models ----------------------------------------------------------------

ACTIVE_TOLERANCE = 0.02  # published figures are rounded to 2-3 significant digits


@pytest.mark.parametrize(
    ("model_id", "published", "without_embedding"),
    [
        ("mistralai/Mixtral-8x7B-v0.1", 12.9e9, False),  # Mistral AI: "12.9B active parameters per token"
        ("mistralai/Mixtral-8x22B-v0.1", 39e9, False),  # Mistral AI: "39B active parameters out of 141B"
        ("deepseek-ai/DeepSeek-V3", 37e9, False),  # DeepSeek-V3 report: "671B total, 37B activated for each token"
        ("Qwen/Qwen3-235B-A22B", 22e9, False),  # model card: "22B activated"
        ("Qwen/Qwen3-30B-A3B", 3.3e9, False),  # model card: "3.3B activated"
        ("microsoft/Phi-3.5-MoE-instruct", 6.6e9, False),  # model card: "6.6B active parameters"
        ("ai21labs/Jamba-v0.1", 12e9, False),  # AI21: "12B active parameters, 52B total"
        # OpenAI's model card counts active parameters without the (vocab 201088 x 2880) embedding
        ("openai/gpt-oss-120b", 5.13e9, True),
        ("openai/gpt-oss-20b", 3.61e9, True),
    ],
    ids=[
        "mixtral-8x7b",
        "mixtral-8x22b",
        "deepseek-v3",
        "qwen3-235b",
        "qwen3-30b",
        "phi3.5-moe",
        "jamba",
        "gpt-oss-120b",
        "gpt-oss-20b",
    ],
)
def test_active_params_match_published(model_id: str, published: float, without_embedding: bool) -> None:
    spec = load_model(model_id)
    active = spec.num_active_params
    if without_embedding:
        active -= sum(t.numel for t in spec.embedding if t.component is Component.EMBEDDING)
    assert abs(active - published) <= ACTIVE_TOLERANCE * published


def test_mixtral_active_exact() -> None:
    """Two of eight experts: total minus 6/8 of the 32 x 8 x 3 x 4096 x 14336 expert weights."""
    spec = load_model("mistralai/Mixtral-8x7B-v0.1")
    assert spec.num_active_params == 46_702_792_704 - 32 * 6 * 3 * 4096 * 14336 == 12_879_925_248


# ---- family facts the memory formulas read -----------------------------------------------------------


def test_deepseek_v3_mla_and_moe_layout() -> None:
    spec = load_model("deepseek-ai/DeepSeek-V3")
    att = spec.reference_layer.attention
    assert (att.kind, att.q_lora_rank, att.kv_lora_rank, att.qk_rope_head_dim, att.head_dim, att.v_head_dim) == (
        "mla",
        1536,
        512,
        64,
        192,
        128,
    )
    assert [layer.mlp.is_moe for layer in spec.layers] == [False] * 3 + [True] * 58
    moe = spec.layers[3]
    by_component = {t.name: t.component for t in moe.tensors}
    assert by_component["mlp.shared_experts.gate_proj.weight"] is Component.MLP
    assert by_component["mlp.experts.gate_up_proj"] is Component.EXPERTS
    assert by_component["mlp.gate.weight"] is Component.ROUTER
    assert (moe.mlp.num_experts, moe.mlp.num_experts_per_tok, moe.mlp.num_shared_experts) == (256, 8, 1)
    assert any("num_nextn_predict_layers" in note and "not counted" in note for note in spec.notes)
    assert all(t.is_linear_weight for t in moe.tensors if t.component is Component.EXPERTS)


def test_gemma3_multimodal_pattern_and_vision_tower() -> None:
    spec = load_model("google/gemma-3-27b-it")
    windows = [layer.attention.sliding_window for layer in spec.layers]
    assert windows == [None if (n + 1) % 6 == 0 else 1024 for n in range(62)]
    vision = sum(t.numel for t in spec.embedding if t.component is Component.OTHER)
    # SigLIP-so400m (27 layers, 1152 wide, 896px / 14px patches) + projector (1152 x 5376 + norm)
    assert vision == 416_866_032 + 1152 * 5376 + 1152
    assert len(spec.layer_kinds()) == 2


def test_llama4_layouts_and_chunked_attention_note() -> None:
    """Scout: 48 MoE layers of 16 experts + a shared one; Maverick: dense and MoE (128 experts) alternate.

    36 of 48 layers (those with rotary embeddings, no_rope_layers = 1: all but every fourth) attend in
    8192-token chunks; the notes say so (their KV: tests/test_current_families.py).
    """
    scout = load_model("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    maverick = load_model("meta-llama/Llama-4-Maverick-17B-128E-Instruct")
    assert [layer.mlp.num_experts for layer in scout.layers] == [16] * 48
    assert [layer.mlp.num_experts for layer in maverick.layers] == [0, 128] * 24
    assert all(layer.attention.sliding_window is None for layer in scout.layers)
    assert [layer.attention.chunk_size for layer in scout.layers] == [8192, 8192, 8192, None] * 12
    assert any(note.startswith("36 of 48 layers use chunked attention") for note in scout.notes)


def test_kimi_k25_quantization_from_its_text_config() -> None:
    """Kimi-K2.5 states its INT4 compressed-tensors scheme (group 32) in text_config only; attention and
    shared experts are in its ignore list."""
    q = load_model("moonshotai/Kimi-K2.5").quantization
    assert q is not None and (q.method, q.bits, q.group_size) == ("compressed-tensors", 4, 32)
    assert ".*self_attn.*" in q.skip_modules


def test_gpt_oss_alternates_sliding_and_full() -> None:
    spec = load_model("openai/gpt-oss-20b")
    assert [layer.attention.sliding_window for layer in spec.layers] == [128, None] * 12
    assert {t.name for t in spec.layers[0].tensors} >= {"self_attn.sinks", "mlp.experts.gate_up_proj_bias"}


def test_jamba_layer_kinds() -> None:
    spec = load_model("ai21labs/Jamba-v0.1")
    kinds = [layer.attention.kind for layer in spec.layers]
    assert [n for n, kind in enumerate(kinds) if kind == "gqa"] == [4, 12, 20, 28]
    mamba = spec.layers[0].attention
    # per sequence: conv state over d_in = 2 x 4096 channels, kernel 4; SSM state d_in x d_state 16
    assert mamba.state == StateSpec(conv_channels=8192, conv_kernel=4, ssm_elements=8192 * 16)
    assert [layer.mlp.is_moe for layer in spec.layers] == [n % 2 == 1 for n in range(32)]


def test_t5_stacks_and_relative_bias_layer() -> None:
    spec = load_model("google-t5/t5-small")
    assert [layer.stack for layer in spec.layers] == ["encoder"] * 6 + ["decoder"] * 6
    assert spec.layers[0] is not spec.layers[1] and spec.layers[1] is spec.layers[5]
    assert all(layer.attention.cross_attention for layer in spec.layers[6:])
    assert not any(layer.attention.causal for layer in spec.layers[:6])
    assert spec.task == "seq2seq"


def test_bert_mlm_head_and_encoder() -> None:
    spec = load_model("google-bert/bert-base-uncased")
    assert spec.task == "masked_lm"
    assert all(layer.stack == "encoder" and not layer.attention.causal for layer in spec.layers)
    names = {t.name for t in spec.head}
    assert "cls.predictions.transform.dense.weight" in names
    assert not any("pooler" in name for name in names)


def test_mistral_defaults_follow_mistral_config() -> None:
    """MistralConfig defaults num_key_value_heads to 8 and sliding_window to 4096 (not None)."""
    spec = _analytic(
        {
            "model_type": "mistral",
            "hidden_size": 64,
            "num_attention_heads": 8,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "vocab_size": 10,
        }
    )
    assert (spec.num_kv_heads, spec.reference_layer.attention.sliding_window) == (8, 4096)


# ---- errors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}, "num_hidden_layers"),
        ({"model_type": "gpt2", "n_layer": 2, "n_head": 4}, "n_embd"),
        ({"model_type": "t5", "d_model": 32, "num_layers": 2}, "num_heads"),
        ({"model_type": "gemma3", "text_config": {"num_hidden_layers": 2, "num_attention_heads": 4}}, "hidden_size"),
    ],
    ids=["llama-depth", "gpt2-width", "t5-heads", "gemma3-text-width"],
)
def test_missing_geometry_is_an_error(raw: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=f"lacks '{field}'"):
        _analytic(raw)


def test_bad_field_type_names_the_field() -> None:
    with pytest.raises(ConfigError, match="'hidden_size' is 'big'"):
        _analytic({"model_type": "llama", "hidden_size": "big"})


def test_bad_layer_types_length() -> None:
    with pytest.raises(ConfigError, match="'layer_types' must list 3 entries"):
        _analytic({**VARIANTS["gemma2-layer_types"], "layer_types": ["full_attention"]})


def test_unknown_bert_class() -> None:
    with pytest.raises(ConfigError, match="'BertForSomething' is not a BERT class"):
        _analytic({**_BERT, "architectures": ["BertForSomething"]})


def test_bad_t5_feed_forward_proj() -> None:
    with pytest.raises(ConfigError, match="'feed_forward_proj' is 'gated-gelu-x'"):
        _analytic({"model_type": "t5", "d_model": 32, "num_layers": 2, "num_heads": 4, "feed_forward_proj": "gated-gelu-x"})


# ---- the meta-device fallback ------------------------------------------------------------------------

FALLBACK = {
    # GPT-Neo: no adapter; alternating global / local (window 16) attention via attention_types
    "gpt_neo": {
        "model_type": "gpt_neo",
        "architectures": ["GPTNeoForCausalLM"],
        "hidden_size": 64,
        "num_heads": 4,
        "num_layers": 4,
        "vocab_size": 97,
        "max_position_embeddings": 64,
        "window_size": 16,
        "attention_types": [[["global", "local"], 2]],
    },
    # Persimmon: LayerNorms, fused QKV with per-head q/k LayerNorms, partial rotary
    "persimmon": {
        "model_type": "persimmon",
        "architectures": ["PersimmonForCausalLM"],
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 96,
        "vocab_size": 97,
    },
    # DistilBERT: a bidirectional encoder
    "distilbert": {
        "model_type": "distilbert",
        "architectures": ["DistilBertForMaskedLM"],
        "dim": 64,
        "n_heads": 4,
        "n_layers": 2,
        "hidden_dim": 96,
        "vocab_size": 97,
        "max_position_embeddings": 40,
    },
    # BART: encoder-decoder with two stacks
    "bart": {
        "model_type": "bart",
        "architectures": ["BartForConditionalGeneration"],
        "d_model": 32,
        "encoder_layers": 2,
        "decoder_layers": 3,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 48,
        "decoder_ffn_dim": 48,
        "vocab_size": 97,
        "max_position_embeddings": 40,
    },
}


@pytest.mark.parametrize("family", sorted(FALLBACK), ids=sorted(FALLBACK))
def test_meta_fallback_counts_like_transformers(family: str) -> None:
    raw = FALLBACK[family]
    assert raw["model_type"] not in ADAPTERS
    spec = _analytic(raw)
    assert spec.num_params == meta.count_params_on_meta(HFConfig(raw, name="t", source="t"))
    assert any("meta device" in note for note in spec.notes)
    assert len({id(layer) for layer in spec.layers}) == len(spec.layer_kinds())
    assert spec.params_by_component()  # every tensor got a component


def test_meta_fallback_reads_module_facts() -> None:
    gpt_neo = _analytic(FALLBACK["gpt_neo"])
    assert [layer.attention.sliding_window for layer in gpt_neo.layers] == [None, 16, None, 16]
    distil = _analytic(FALLBACK["distilbert"])
    assert {layer.stack for layer in distil.layers} == {"encoder"}
    bart = _analytic(FALLBACK["bart"])
    assert [layer.stack for layer in bart.layers] == ["encoder"] * 2 + ["decoder"] * 3
    assert all(layer.attention.cross_attention for layer in bart.layers[2:])


def test_remote_code_needs_the_flag() -> None:
    raw = {
        "model_type": "my_custom_lm",
        "architectures": ["MyCustomForCausalLM"],
        "auto_map": {"AutoModelForCausalLM": "modeling_custom.MyCustomForCausalLM"},
    }
    with pytest.raises(UnsupportedArchitectureError, match="pass trust_remote_code to run it") as exc:
        _analytic(raw)
    assert "pass --trust-remote-code to run it" in exc.value.render(cli_flag)  # as the CLI prints it


def test_unknown_model_type_without_remote_code() -> None:
    with pytest.raises(UnsupportedArchitectureError, match="unknown to transformers"):
        _analytic({"model_type": "not_a_model"})


def test_analytic_path_imports_no_torch() -> None:
    code = (
        "import sys; from memest.sources import load_model; "
        "[load_model(m) for m in ('gpt2', 'deepseek-ai/DeepSeek-V3', 'google/gemma-3-27b-it', 'google-t5/t5-small')]; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
