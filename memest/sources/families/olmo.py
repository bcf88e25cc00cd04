"""AI2 OLMo 2 decoders: olmo2.

Follows transformers ``models/olmo2/modeling_olmo2.py``: no pre-norms; RMSNorms after attention
and after the MLP (``post_attention_layernorm``, ``post_feedforward_layernorm``); RMSNorm
``q_norm``/``k_norm`` over the full projection widths (a*d and k*d, not per head); Q/K/V/O biased
per ``attention_bias``; SwiGLU MLP; untied lm_head by default.
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import (
    gated_mlp,
    gqa_projections,
    head_dim_of,
    lm_head,
    model_spec,
    norm,
    token_embedding,
)
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec

# Olmo2Config defaults (models/olmo2/configuration_olmo2.py) of the fields read here
_DEFAULTS: dict[str, object] = {
    "vocab_size": 50304,
    "intermediate_size": 11008,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "attention_bias": False,
}


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of an olmo2 config."""
    cfg = cfg.with_defaults(_DEFAULTS)
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    k = cfg.int("num_key_value_heads", default=a)
    d = head_dim_of(cfg, h, a)
    i = cfg.int("intermediate_size")
    vocab = cfg.int("vocab_size")
    bias = cfg.bool("attention_bias")
    tensors = (
        *gqa_projections(h, a, k, d, qkv_bias=bias, o_bias=bias),
        *norm("self_attn.q_norm", a * d),
        *norm("self_attn.k_norm", k * d),
        *gated_mlp(h, i),
        *norm("post_attention_layernorm", h),
        *norm("post_feedforward_layernorm", h),
    )
    layer = LayerSpec(
        attention=AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d, qk_norm="full"),
        mlp=MLPSpec(gated=True, intermediate_size=i, activation=cfg.str("hidden_act")),
        norm="rms_fp32",
        norm_position="post",
        tensors=tensors,
    )
    tied = cfg.bool("tie_word_embeddings")
    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[layer] * cfg.int("num_hidden_layers"),
        embedding=[token_embedding("model.embed_tokens.weight", vocab, h)],
        head=[*norm("model.norm", h), *([] if tied else lm_head(vocab, h))],
        tie_word_embeddings=tied,
        max_position_embeddings=cfg.int("max_position_embeddings"),
    )
