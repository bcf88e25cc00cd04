"""Llama-style decoders: llama, mistral, ministral3, qwen2, qwen3, smollm3, granite, internlm3, minicpm.

Pre-norm RMSNorm layers, rotary attention with grouped-query K/V, SwiGLU MLP, untied lm_head by
default. Follows transformers ``models/llama/modeling_llama.py`` (``attention_bias`` on all four
projections, ``mlp_bias``), ``models/mistral`` and ``models/ministral3`` (no biases, one sliding window for every layer),
``models/qwen2`` (bias on Q/K/V only; sliding window only when ``use_sliding_window``, on layers
from ``max_window_layers`` on) and ``models/qwen3`` (``attention_bias`` on all four projections,
RMSNorm ``q_norm``/``k_norm`` over head_dim, ``head_dim`` defaulting to 128) and
``models/smollm3/modeling_smollm3.py`` (llama's tensors, tied by default; rotary embeddings skipped
on every ``no_rope_layer_interval``-th layer, which holds no parameter; a sliding window, with
``use_sliding_window``, only on the layers ``layer_types`` marks sliding, by default the NoPE ones:
``SmolLM3Config.__post_init__``); ``models/granite/modeling_granite.py`` is llama's tensors too (its
embedding, attention, residual and logit multipliers are scalars, not parameters). ``minicpm`` (OpenBMB
MiniCPM 1 / 2 / 4, a config-only family: transformers does not ship it) follows the
``modeling_minicpm.py`` of its Hub repositories (e.g. openbmb/MiniCPM-2B-sft-bf16): llama's tensors
and names (``scale_emb`` / ``scale_depth`` / ``dim_model_base`` are scalars), tied by default; its MoE
variant (``num_experts``) is refused. ``internlm3`` is built by transformers as ``LlamaForCausalLM``
with ``models/internlm3/configuration_internlm3.py`` (``qkv_bias`` / ``bias`` are aliases of
``attention_bias`` / ``mlp_bias``, which must agree).
"""

from __future__ import annotations

from memest.errors import ConfigError
from memest.sources.config import HFConfig
from memest.sources.families._build import (
    decoder_spec,
    gated_mlp,
    gqa_projections,
    head_dim_of,
    intern,
    layer_windows,
    norm,
)
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec

# transformers config-class defaults (configuration_<type>.py) of the fields read here
_DEFAULTS: dict[str, dict[str, object]] = {
    "llama": {
        "vocab_size": 32000,
        "intermediate_size": 11008,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
    },
    "mistral": {
        "vocab_size": 32000,
        "intermediate_size": 14336,
        "num_key_value_heads": 8,
        "hidden_act": "silu",
        "max_position_embeddings": 4096 * 32,
        "tie_word_embeddings": False,
        "sliding_window": 4096,
    },
    "ministral3": {
        "vocab_size": 131072,
        "intermediate_size": 14336,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 262144,
        "tie_word_embeddings": False,
        "sliding_window": None,
    },
    "qwen2": {
        "vocab_size": 151936,
        "intermediate_size": 22016,
        "num_key_value_heads": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
    },
    "qwen3": {
        "vocab_size": 151936,
        "intermediate_size": 22016,
        "num_key_value_heads": 32,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
    },
    "smollm3": {
        "vocab_size": 128256,
        "intermediate_size": 11008,
        "num_key_value_heads": 4,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "no_rope_layer_interval": 4,
    },
    "granite": {
        "vocab_size": 32000,
        "intermediate_size": 11008,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
    },
    "internlm3": {
        "vocab_size": 128512,
        "intermediate_size": 10240,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
    },
    # MiniCPMConfig (the Hub repos' configuration_minicpm.py, e.g. a copy at index id 16286247153)
    "minicpm": {
        "vocab_size": 32000,
        "intermediate_size": 11008,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
    },
}


# attribute_map of the config classes that have one: an alias in the JSON sets the stored field
_ALIASES: dict[str, dict[str, str]] = {"internlm3": {"qkv_bias": "attention_bias", "bias": "mlp_bias"}}


def smollm3_windows(cfg: HFConfig, num_layers: int) -> list[int | None]:
    """Per-layer sliding windows of smollm3 (``SmolLM3Config.__post_init__``, ``SmolLM3Attention``).

    None everywhere unless ``use_sliding_window`` and a window; then the layers ``layer_types``
    marks sliding, by default those ``no_rope_layers`` marks 0 (every ``no_rope_layer_interval``-th).
    """
    window = cfg.int("sliding_window", default=None) if cfg.bool("use_sliding_window") else None
    if window is None or cfg.has("layer_types"):
        return layer_windows(cfg, num_layers, window)
    rope = cfg.get("no_rope_layers", default=None)
    if rope is None:
        interval = cfg.int("no_rope_layer_interval")
        rope = [int((n + 1) % interval != 0) for n in range(num_layers)]
    return [None if has_rope else window for has_rope in rope]


def qwen_windows(cfg: HFConfig, num_layers: int) -> list[int | None]:
    """Per-layer sliding windows of qwen2 / qwen3 (``Qwen2Config.__post_init__``).

    Only with ``use_sliding_window``; then ``layer_types`` when given, else layers from
    ``max_window_layers`` on slide and the first ones attend fully.
    """
    window = cfg.int("sliding_window", default=None) if cfg.bool("use_sliding_window") else None
    if window is not None and not cfg.has("layer_types"):
        first = cfg.int("max_window_layers", minimum=0)
        return [window if n >= first else None for n in range(num_layers)]
    return layer_windows(cfg, num_layers, window)


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a llama-style config (see the module docstring for the families)."""
    model_type = cfg.model_type
    if model_type == "minicpm" and cfg.int("num_experts", default=0, minimum=0):
        raise ConfigError(f"{cfg.what}: a MiniCPM-MoE config (num_experts {cfg.get('num_experts')}) is "
                          "not counted by memest; pass a dense MiniCPM config")
    cfg = cfg.with_defaults(_DEFAULTS[model_type], aliases=_ALIASES.get(model_type))
    if model_type == "internlm3" and cfg.bool("attention_bias") != cfg.bool("mlp_bias"):
        raise ConfigError(f"{cfg.what}: InternLM3 with qkv_bias different from bias is not supported "
                          "(transformers builds it as Llama, one bias setting for all projections); make them equal")
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    k = cfg.int("num_key_value_heads", default=a)
    d = head_dim_of(cfg, h, a)
    i = cfg.int("intermediate_size")
    vocab = cfg.int("vocab_size")
    num_layers = cfg.int("num_hidden_layers")

    qk_norm = False
    if model_type == "qwen2":
        qkv_bias, o_bias, mlp_bias = True, False, False
        windows = qwen_windows(cfg, num_layers)
    elif model_type == "qwen3":
        qkv_bias = o_bias = cfg.bool("attention_bias")
        mlp_bias, qk_norm = False, True
        windows = qwen_windows(cfg, num_layers)
    elif model_type in ("mistral", "ministral3"):
        qkv_bias = o_bias = mlp_bias = False
        windows = [cfg.int("sliding_window", default=None)] * num_layers
    else:  # llama, granite, internlm3, minicpm: full attention everywhere; smollm3: its own windows
        qkv_bias = o_bias = cfg.bool("attention_bias")
        mlp_bias = cfg.bool("mlp_bias")
        windows = smollm3_windows(cfg, num_layers) if model_type == "smollm3" else [None] * num_layers

    tensors = (
        *norm("input_layernorm", h),
        *gqa_projections(h, a, k, d, qkv_bias=qkv_bias, o_bias=o_bias),
        *(norm("self_attn.q_norm", d) + norm("self_attn.k_norm", d) if qk_norm else []),
        *norm("post_attention_layernorm", h),
        *gated_mlp(h, i, bias=mlp_bias),
    )
    mlp = MLPSpec(gated=True, intermediate_size=i, activation=cfg.str("hidden_act"))
    kinds: dict[object, LayerSpec] = {}

    def layer(window: int | None) -> LayerSpec:
        return intern(
            kinds,
            window,
            lambda: LayerSpec(
                attention=AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d, sliding_window=window,
                                        qk_norm="head" if qk_norm else "none"),
                mlp=mlp,
                norm="rms",
                tensors=tensors,
            ),
        )

    return decoder_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[layer(w) for w in windows],
        max_position_embeddings=cfg.int("max_position_embeddings"),
    )
