"""Baichuan decoders of the Hub repos' remote code: baichuan (Baichuan-7B / 13B, Baichuan2-7B / 13B), a
config-only family: transformers does not ship it.

Follows the ``modeling_baichuan.py`` of the model repositories (baichuan-inc/Baichuan2-7B-Chat; read in
an annotated copy, index id 11964670224): llama's layout with Q, K and V fused and no biases:
``model.embed_tokens (V, h)``; per layer ``input_layernorm`` / ``post_attention_layernorm`` (RMSNorm),
``self_attn.W_pack (3h, h)`` (multi-head: K and V have all the heads), ``self_attn.o_proj (h, h)``,
SwiGLU ``mlp.gate_proj`` / ``up_proj`` / ``down_proj``; final ``model.norm``; ``lm_head (V, h)`` (a
``NormHead`` in Baichuan2, a Linear in Baichuan 1: the same weight), untied by default. The 7B models
rotate Q and K; the 13B ones add ALiBi biases instead (vLLM ``models/baichuan.py`` tells them apart by
hidden_size 4096), neither with parameters. The 13B configs name their context ``model_max_length``.
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import (
    ATTN,
    decoder_spec,
    gated_mlp,
    linear,
    norm,
)
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec, Split

# BaichuanConfig defaults (the 7B Hub repos' configuration_baichuan.py) of the fields read here
_DEFAULTS: dict[str, object] = {
    "vocab_size": 64000,
    "intermediate_size": 11008,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a baichuan config."""
    cfg = cfg.with_defaults(_DEFAULTS)
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    d = cfg.divide("hidden_size", h, "num_attention_heads", a)
    i = cfg.int("intermediate_size")
    vocab = cfg.int("vocab_size")
    layer = LayerSpec(
        attention=AttentionSpec(num_heads=a, num_kv_heads=a, head_dim=d, rope="rotate" if h == 4096 else "none"),
        mlp=MLPSpec(gated=True, intermediate_size=i, activation=cfg.str("hidden_act")),
        tensors=(
            *norm("input_layernorm", h),
            *linear("self_attn.W_pack", h, 3 * h, ATTN, Split.COL),
            *linear("self_attn.o_proj", h, h, ATTN, Split.ROW),
            *norm("post_attention_layernorm", h),
            *gated_mlp(h, i),
        ),
    )
    return decoder_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[layer] * cfg.int("num_hidden_layers"),
        max_position_embeddings=cfg.int("max_position_embeddings", "model_max_length", default=None),
    )
