"""EleutherAI GPT-NeoX decoders: gpt_neox (GPT-NeoX-20B, Pythia).

Follows transformers ``models/gpt_neox/modeling_gpt_neox.py``: two LayerNorms per layer (with a
parallel residual by default, ``use_parallel_residual``: attention and MLP read the same input),
a fused ``attention.query_key_value (3h, h)`` and output ``attention.dense``, biased per
``attention_bias``; a GELU MLP ``dense_h_to_4h``/``dense_4h_to_h`` with biases; untied lm_head.
Rotary embeddings cover ``rotary_pct`` of each head and have no parameters.
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import ATTN, linear, lm_head, model_spec, norm, plain_mlp, token_embedding
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec, Split

# GPTNeoXConfig defaults (models/gpt_neox/configuration_gpt_neox.py) of the fields read here
_DEFAULTS: dict[str, object] = {
    "vocab_size": 50432,
    "intermediate_size": 24576,
    "hidden_act": "gelu",
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "use_parallel_residual": True,
    "attention_bias": True,
}


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a gpt_neox config."""
    cfg = cfg.with_defaults(_DEFAULTS)
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    d = cfg.divide("hidden_size", h, "num_attention_heads", a)
    i = cfg.int("intermediate_size")
    vocab = cfg.int("vocab_size")
    bias = cfg.bool("attention_bias")
    tensors = (
        *norm("input_layernorm", h, bias=True),
        *norm("post_attention_layernorm", h, bias=True),
        *linear("attention.query_key_value", h, 3 * h, ATTN, Split.COL, bias=bias),
        *linear("attention.dense", h, h, ATTN, Split.ROW, bias=bias),
        *plain_mlp(h, i, names=("dense_h_to_4h", "dense_4h_to_h")),
    )
    layer = LayerSpec(
        attention=AttentionSpec(num_heads=a, num_kv_heads=a, head_dim=d, rope="concat"),
        mlp=MLPSpec(gated=False, intermediate_size=i, activation=cfg.str("hidden_act")),
        norm="layer",
        parallel_residual=cfg.bool("use_parallel_residual"),
        parallel_norms=2,
        tensors=tensors,
    )
    tied = cfg.bool("tie_word_embeddings")
    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[layer] * cfg.int("num_hidden_layers"),
        embedding=[token_embedding("gpt_neox.embed_in.weight", vocab, h)],
        head=[*norm("gpt_neox.final_layer_norm", h, bias=True), *([] if tied else lm_head(vocab, h))],
        tie_word_embeddings=tied,
        max_position_embeddings=cfg.int("max_position_embeddings"),
    )
