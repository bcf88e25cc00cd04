"""Stability AI StableLM decoders: stablelm.

Follows transformers ``models/stablelm/modeling_stablelm.py``: LayerNorms with bias
(``input_layernorm``, ``post_attention_layernorm`` unless ``use_parallel_residual``, final
``model.norm``); Q/K/V biased per ``use_qkv_bias``, ``o_proj`` never; head_dim = h / a; partial
rotary (``partial_rotary_factor``, 0.25 by default); with ``qk_layernorm`` one bias-free LayerNorm per
head over head_dim (``self_attn.q_layernorm.norms.<n>``, ``k_layernorm.norms.<n>``); SwiGLU MLP;
untied lm_head by default. With ``use_parallel_residual`` attention and MLP both read the one
``input_layernorm`` output.
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import (
    gated_mlp,
    gqa_projections,
    lm_head,
    model_spec,
    norm,
    token_embedding,
)
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec

# StableLmConfig defaults (models/stablelm/configuration_stablelm.py) of the fields read here
_DEFAULTS: dict[str, object] = {
    "vocab_size": 50304,
    "intermediate_size": 6912,
    "num_key_value_heads": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "use_qkv_bias": False,
    "qk_layernorm": False,
    "use_parallel_residual": False,
}


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a stablelm config."""
    cfg = cfg.with_defaults(_DEFAULTS)
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    k = cfg.int("num_key_value_heads", default=a)
    d = cfg.divide("hidden_size", h, "num_attention_heads", a)  # StableLmAttention ignores head_dim
    i = cfg.int("intermediate_size")
    vocab = cfg.int("vocab_size")
    qk_norm = cfg.bool("qk_layernorm")
    parallel = cfg.bool("use_parallel_residual")
    per_head_norms = [
        *(t for n in range(a) for t in norm(f"self_attn.q_layernorm.norms.{n}", d)),
        *(t for n in range(k) for t in norm(f"self_attn.k_layernorm.norms.{n}", d)),
    ]
    layer = LayerSpec(
        attention=AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d, rope="concat",
                                qk_norm="head" if qk_norm else "none"),
        mlp=MLPSpec(gated=True, intermediate_size=i, activation=cfg.str("hidden_act")),
        norm="layer",
        parallel_residual=parallel,
        tensors=(
            *norm("input_layernorm", h, bias=True),
            *gqa_projections(h, a, k, d, qkv_bias=cfg.bool("use_qkv_bias")),
            *(per_head_norms if qk_norm else []),
            *([] if parallel else norm("post_attention_layernorm", h, bias=True)),
            *gated_mlp(h, i),
        ),
    )
    tied = cfg.bool("tie_word_embeddings")
    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[layer] * cfg.int("num_hidden_layers"),
        embedding=[token_embedding("model.embed_tokens.weight", vocab, h)],
        head=[*norm("model.norm", h, bias=True), *([] if tied else lm_head(vocab, h))],
        tie_word_embeddings=tied,
        max_position_embeddings=cfg.int("max_position_embeddings"),
    )
