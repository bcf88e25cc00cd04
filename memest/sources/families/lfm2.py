"""Liquid LFM2: lfm2 (short-convolution + attention hybrids).

Follows transformers ``models/lfm2/modeling_lfm2.py`` and ``Lfm2Config``. Layer n is an attention
layer or a short-convolution layer by ``layer_types[n]`` (``full_attention`` / ``conv``), or, when
the config has no ``layer_types``, by ``full_attn_idxs`` (attention there, conv elsewhere; every
layer attends when neither is given). Every layer has ``operator_norm`` and ``ffn_norm`` (RMSNorm)
and a SwiGLU ``feed_forward`` (``w1``, ``w3`` (i, h), ``w2`` (h, i)) whose width is
``intermediate_size`` (``block_ff_dim``), and with ``block_auto_adjust_ff_dim``
``int(2 i / 3)``, times ``block_ffn_dim_multiplier``, rounded up to ``block_multiple_of``.

- attention (``Lfm2Attention``): ``q_proj (a d, h)``, ``k_proj`` / ``v_proj (k d, h)``,
  ``out_proj (h, a d)``, per-head RMSNorms ``q_layernorm`` / ``k_layernorm (d)``, d = h / a;
- short convolution (``Lfm2ShortConv``): ``in_proj (3h, h)``, depthwise ``conv.conv (h, 1, L)``
  with L = ``conv_L_cache``, ``out_proj (h, h)`` (biases with ``conv_bias``). It caches no K/V,
  only a conv state per sequence (:func:`memest.sources.families._layers.short_conv_state`).

The model: ``model.embed_tokens (V, h)``, ``model.embedding_norm`` (applied after the last layer),
``lm_head`` tied by default (``tie_embedding``).
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import (
    OTHER,
    gated_mlp,
    gqa_projections,
    intern,
    linear,
    lm_head,
    model_spec,
    norm,
    token_embedding,
)
from memest.sources.families._layers import listed_kinds, short_conv_state
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec, Split, TensorSpec

# Lfm2Config defaults (models/lfm2/configuration_lfm2.py) of the fields read here
_DEFAULTS: dict[str, object] = {
    "vocab_size": 65536,
    "intermediate_size": 12288,
    "num_key_value_heads": 8,
    "max_position_embeddings": 128_000,
    "tie_word_embeddings": True,
    "conv_bias": False,
    "conv_L_cache": 3,
    "block_multiple_of": 256,
    "block_ffn_dim_multiplier": 1.0,
    "block_auto_adjust_ff_dim": True,
}
_ALIASES = {"tie_embedding": "tie_word_embeddings", "block_ff_dim": "intermediate_size"}
LAYER_TYPES = {"full_attention": "attention", "conv": "conv"}
"""``layer_types`` words (``Lfm2DecoderLayer``: every layer not ``conv`` attends)."""


def layer_kinds(cfg: HFConfig, num_layers: int) -> list[str]:
    """Each layer's mixer, ``attention`` or ``conv`` (``Lfm2Config.__post_init__``).

    Raises:
        ConfigError: a ``layer_types`` entry other than ``full_attention`` / ``conv``.
    """
    if cfg.get("layer_types", default=None) is not None:
        return listed_kinds(cfg, "layer_types", num_layers, LAYER_TYPES)
    idxs = cfg.get("full_attn_idxs", default=None)
    full = set(range(num_layers)) if idxs is None else {int(i) for i in idxs}
    return ["attention" if n in full else "conv" for n in range(num_layers)]


def ff_width(cfg: HFConfig) -> int:
    """The SwiGLU width ``Lfm2MLP`` computes from the config."""
    i = cfg.int("intermediate_size")
    if cfg.bool("block_auto_adjust_ff_dim"):
        i = int(2 * i / 3)
        multiplier = cfg.get("block_ffn_dim_multiplier", default=None)
        if multiplier is not None:
            i = int(float(multiplier) * i)
            m = cfg.int("block_multiple_of")
            i = m * ((i + m - 1) // m)
    return i


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of an lfm2 config."""
    cfg = cfg.with_defaults(_DEFAULTS, aliases=_ALIASES)
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    k = cfg.int("num_key_value_heads", default=a)
    d = cfg.divide("hidden_size", h, "num_attention_heads", a)
    vocab = cfg.int("vocab_size")
    num_layers = cfg.int("num_hidden_layers")
    kernel = cfg.int("conv_L_cache")
    bias = cfg.bool("conv_bias")
    i = ff_width(cfg)
    mixers: dict[str, tuple[AttentionSpec, tuple[TensorSpec, ...]]] = {
        "attention": (
            AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d, qk_norm="head"),
            (*gqa_projections(h, a, k, d, names=("q_proj", "k_proj", "v_proj", "out_proj")),
             *norm("self_attn.q_layernorm", d), *norm("self_attn.k_layernorm", d)),
        ),
        "conv": (
            AttentionSpec(kind="conv", num_heads=0, num_kv_heads=0, head_dim=0, state=short_conv_state(h, kernel)),
            (TensorSpec("conv.conv.weight", (h, 1, kernel), OTHER, Split.COL),
             *([TensorSpec("conv.conv.bias", (h,), OTHER, Split.COL)] if bias else []),
             *linear("conv.in_proj", h, 3 * h, OTHER, Split.COL, bias=bias),
             *linear("conv.out_proj", h, h, OTHER, Split.ROW, bias=bias)),
        ),
    }
    mlp = MLPSpec(gated=True, intermediate_size=i, activation="silu")
    ff = (*gated_mlp(h, i, prefix="feed_forward", names=("w1", "w3", "w2")),
          *norm("operator_norm", h), *norm("ffn_norm", h))
    built: dict[object, LayerSpec] = {}

    def layer(kind: str) -> LayerSpec:
        attention, tensors = mixers[kind]
        return intern(built, kind, lambda: LayerSpec(attention=attention, mlp=mlp, norm="rms", tensors=(*tensors, *ff)))

    tied = cfg.bool("tie_word_embeddings")
    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[layer(kind) for kind in layer_kinds(cfg, num_layers)],
        embedding=[token_embedding("model.embed_tokens.weight", vocab, h)],
        head=[*norm("model.embedding_norm", h), *([] if tied else lm_head(vocab, h))],
        tie_word_embeddings=tied,
        max_position_embeddings=cfg.int("max_position_embeddings"),
    )
