"""One adapter per model family: HF config -> ModelSpec with every parameter tensor.

``ADAPTERS`` maps a config's ``model_type`` to the function that builds its ModelSpec. A family
without an adapter falls back to instantiating the transformers class on the meta device
(:mod:`memest.sources.meta`), which needs torch and transformers.

Omitted fields take the default of the family's transformers config class (``configuration_<type>.py``),
as transformers itself would, e.g. ``tie_word_embeddings`` (gemma, gpt2: true; llama: false) or a
multimodal ``text_config`` without ``vocab_size``. The geometry is the exception: a config without
its width, depth or number of attention heads (``hidden_size`` / ``num_hidden_layers`` /
``num_attention_heads`` or the family's names for them) is incomplete, and the adapters raise a
ConfigError naming the field rather than size the class's default model.
"""

from __future__ import annotations

from collections.abc import Callable

from memest.sources.config import HFConfig
from memest.sources.families import (
    baichuan,
    bert,
    bloom,
    chatglm,
    cohere,
    deepseek,
    deepseek_v4,
    falcon,
    falcon_h1,
    gemma,
    gemma3n,
    gemma4,
    glm,
    gpt2,
    gpt_oss,
    granitemoehybrid,
    internlm,
    jamba,
    kimi_vl,
    lfm2,
    lfm2_vl,
    llama,
    llama4,
    mamba,
    mimo,
    mistral3,
    moe,
    nemotron_h,
    nemotron_nas,
    neox,
    olmo,
    opt,
    phi,
    qwen3_next,
    qwen_vl,
    rwkv,
    stablelm,
    starcoder2,
    t5,
    voxtral,
)
from memest.spec import ModelSpec

Adapter = Callable[[HFConfig], ModelSpec]

ADAPTERS: dict[str, Adapter] = {
    "llama": llama.build,
    "mistral": llama.build,
    "ministral3": llama.build,
    "mistral3": mistral3.build,
    "qwen2": llama.build,
    "qwen3": llama.build,
    "smollm3": llama.build,
    "granite": llama.build,
    "minicpm": llama.build,
    "internlm3": llama.build,
    "mixtral": moe.build,
    "qwen2_moe": moe.build,
    "qwen3_moe": moe.build,
    "granitemoe": moe.build,
    "minimax_m2": moe.build,
    "gemma": gemma.build,
    "gemma2": gemma.build,
    "gemma3": gemma.build,
    "gemma3_text": gemma.build,
    "gemma4": gemma4.build,
    "gemma4_text": gemma4.build,
    "phi": phi.build,
    "phi3": phi.build,
    "phimoe": phi.build,
    "deepseek_v2": deepseek.build,
    "deepseek_v3": deepseek.build,
    "kimi_k2": deepseek.build,
    "deepseek_v32": deepseek.build,
    "glm_moe_dsa": deepseek.build,
    "deepseek_v4": deepseek_v4.build,
    "kimi_k25": kimi_vl.build,
    "gpt_oss": gpt_oss.build,
    "gpt2": gpt2.build,
    "gpt_bigcode": gpt2.build,
    "gpt_neox": neox.build,
    "falcon": falcon.build,
    "bloom": bloom.build,
    "opt": opt.build,
    "olmo2": olmo.build,
    "olmo3": olmo.build,
    "exaone4": olmo.build,
    "bert": bert.build,
    "t5": t5.build,
    "mt5": t5.build,
    "jamba": jamba.build,
    "starcoder2": starcoder2.build,
    "stablelm": stablelm.build,
    "cohere": cohere.build,
    "cohere2": cohere.build,
    "glm4": glm.build,
    "glm4_moe": glm.build,
    "glm4v_moe": glm.build,
    "qwen2_5_vl": qwen_vl.build,
    "qwen3_vl": qwen_vl.build,
    "qwen3_vl_moe": qwen_vl.build,
    "llama4": llama4.build,
    "llama4_text": llama4.build,
    "internlm2": internlm.build,
    "chatglm": chatglm.build,
    "baichuan": baichuan.build,
    "nemotron_h": nemotron_h.build,
    "lfm2": lfm2.build,
    "lfm2_vl": lfm2_vl.build,
    "mamba": mamba.build,
    "mamba2": mamba.build,
    "qwen3_next": qwen3_next.build,
    "granitemoehybrid": granitemoehybrid.build,
    "falcon_h1": falcon_h1.build,
    "mimo": mimo.build,
    "nemotron-nas": nemotron_nas.build,
    "voxtral": voxtral.build,
    "gemma3n": gemma3n.build,
    "gemma3n_text": gemma3n.build,
    "rwkv": rwkv.build,
    "rwkv5": rwkv.build,
    "rwkv6": rwkv.build,
    "rwkv7": rwkv.build,
}


def supported_model_types() -> list[str]:
    """The model_type values with an analytic adapter, sorted."""
    return sorted(ADAPTERS)
