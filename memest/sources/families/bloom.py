"""BigScience BLOOM decoders: bloom.

Follows transformers ``models/bloom/modeling_bloom.py``: ALiBi attention (no position
embeddings); a LayerNorm right after the token embedding (``word_embeddings_layernorm``); two
LayerNorms per layer; fused ``self_attention.query_key_value (3h, h)`` and ``dense``, both biased;
a GELU MLP 4h wide with biases; lm_head tied to the embedding by default.
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import ATTN, linear, lm_head, model_spec, norm, plain_mlp, token_embedding
from memest.spec import AttentionSpec, Component, LayerSpec, MLPSpec, ModelSpec, Split

# BloomConfig defaults (models/bloom/configuration_bloom.py) and its attribute_map
_DEFAULTS: dict[str, object] = {
    "vocab_size": 250880,
    "tie_word_embeddings": True,
}
_ALIASES = {"num_hidden_layers": "n_layer", "num_attention_heads": "n_head"}


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a bloom config."""
    cfg = cfg.with_defaults(_DEFAULTS, aliases=_ALIASES)
    h = cfg.int("n_embed", "hidden_size")  # legacy n_embed wins (BloomConfig.__post_init__)
    a = cfg.int("n_head")
    d = cfg.divide("hidden_size", h, "n_head", a)
    vocab = cfg.int("vocab_size")
    tensors = (
        *norm("input_layernorm", h, bias=True),
        *linear("self_attention.query_key_value", h, 3 * h, ATTN, Split.COL, bias=True),
        *linear("self_attention.dense", h, h, ATTN, Split.ROW, bias=True),
        *norm("post_attention_layernorm", h, bias=True),
        *plain_mlp(h, 4 * h, names=("dense_h_to_4h", "dense_4h_to_h")),
    )
    layer = LayerSpec(
        attention=AttentionSpec(num_heads=a, num_kv_heads=a, head_dim=d, rope="none", alibi=True),
        mlp=MLPSpec(gated=False, intermediate_size=4 * h, activation="gelu"),
        norm="layer",
        tensors=tensors,
    )
    tied = cfg.bool("tie_word_embeddings")
    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[layer] * cfg.int("n_layer"),
        embedding=[
            token_embedding("transformer.word_embeddings.weight", vocab, h),
            *norm("transformer.word_embeddings_layernorm", h, bias=True, component=Component.NORM),
        ],
        head=[*norm("transformer.ln_f", h, bias=True), *([] if tied else lm_head(vocab, h))],
        tie_word_embeddings=tied,
        max_position_embeddings=cfg.int("seq_length", default=None),  # ALiBi: no fixed limit
        sdpa_supported=False,  # BloomAttention: ALiBi scores, eager only in transformers
    )
