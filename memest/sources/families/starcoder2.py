"""BigCode StarCoder 2 decoders: starcoder2.

Follows transformers ``models/starcoder2/modeling_starcoder2.py``: pre-norm LayerNorms (weight and
bias: ``input_layernorm``, ``post_attention_layernorm``, final ``model.norm``); rotary attention with
grouped-query K/V; a two-layer MLP ``mlp.c_fc`` / ``mlp.c_proj`` (GELU); every projection biased per
``use_bias``; one sliding window, ``sliding_window`` (default none), read by every layer at forward
time; the lm_head tied to the embedding by default.
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import (
    gqa_projections,
    head_dim_of,
    lm_head,
    model_spec,
    norm,
    plain_mlp,
    token_embedding,
)
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec

# Starcoder2Config defaults (models/starcoder2/configuration_starcoder2.py) of the fields read here
_DEFAULTS: dict[str, object] = {
    "vocab_size": 49152,
    "intermediate_size": 12288,
    "num_key_value_heads": 2,
    "hidden_act": "gelu_pytorch_tanh",
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "use_bias": True,
    "sliding_window": None,
}


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a starcoder2 config."""
    cfg = cfg.with_defaults(_DEFAULTS)
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    k = cfg.int("num_key_value_heads", default=a)
    d = head_dim_of(cfg, h, a)
    i = cfg.int("intermediate_size")
    vocab = cfg.int("vocab_size")
    bias = cfg.bool("use_bias")
    layer = LayerSpec(
        attention=AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d,
                                sliding_window=cfg.int("sliding_window", default=None)),
        mlp=MLPSpec(gated=False, intermediate_size=i, activation=cfg.str("hidden_act")),
        norm="layer",
        tensors=(
            *norm("input_layernorm", h, bias=True),
            *gqa_projections(h, a, k, d, qkv_bias=bias, o_bias=bias),
            *norm("post_attention_layernorm", h, bias=True),
            *plain_mlp(h, i, names=("c_fc", "c_proj"), bias=bias),
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
