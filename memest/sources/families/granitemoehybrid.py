"""IBM Granite 4.0 hybrids: granitemoehybrid (Mamba-2 + attention layers, MoE and a shared MLP).

Follows transformers ``models/granitemoehybrid/modeling_granitemoehybrid.py`` and
``GraniteMoeHybridConfig``. Layer n is a Mamba-2 layer or an attention layer by ``layer_types[n]``
(``mamba`` / ``linear_attention``, ``attention`` / ``full_attention``: transformers'
``_LEGACY_LAYER_TYPE_REMAP``), every layer Mamba-2 when the config lists none. Every layer has
``input_layernorm`` and ``post_attention_layernorm``, a ``shared_mlp`` (``input_linear (2 si, h)``,
``output_linear (h, si)``, si = ``shared_intermediate_size``) and, with ``num_local_experts > 0``, a
``block_sparse_moe`` (router ``(E, h)``, experts ``gate_up_proj (E, 2i, h)`` / ``down_proj (E, h, i)``).

- attention (``GraniteMoeHybridAttention``): Q/K/V/O projections (biases with ``attention_bias``),
  head_dim = the config's or h / a; rotary only with ``position_embedding_type`` ``rope``;
- Mamba-2 (``GraniteMoeHybridMambaLayer``): :func:`memest.sources.families._layers.mamba2_mixer`
  under ``mamba.`` with d_in = ``mamba_expand`` x h, ``mamba_n_heads`` heads of ``mamba_d_head``
  (``auto``: d_in / heads), ``mamba_n_groups``, ``mamba_d_state``, ``mamba_d_conv``; it caches a
  state per sequence (:func:`~memest.sources.families._layers.mamba2_state`).

The model: ``model.embed_tokens``, ``model.norm``, ``lm_head`` (untied by default).
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import (
    MLP,
    decoder_spec,
    expert_stack,
    gqa_projections,
    intern,
    linear,
    norm,
    router,
)
from memest.sources.families._layers import listed_kinds, mamba2_mixer, mamba2_state
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec, Split

# GraniteMoeHybridConfig defaults (models/granitemoehybrid/configuration_granitemoehybrid.py)
_DEFAULTS: dict[str, object] = {
    "vocab_size": 32000,
    "intermediate_size": 11008,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "shared_intermediate_size": 1024,
    "position_embedding_type": None,
    "mamba_n_heads": 128,
    "mamba_n_groups": 1,
    "mamba_d_state": 256,
    "mamba_d_head": "auto",
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
}
LAYER_TYPES = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention", "full_attention": "attention"}
"""``layer_types`` words, legacy and current (transformers ``_LEGACY_LAYER_TYPE_REMAP``)."""


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a granitemoehybrid config."""
    cfg = cfg.with_defaults(_DEFAULTS, aliases={"layers_block_type": "layer_types"})
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    k = cfg.int("num_key_value_heads", default=a)
    d = cfg.int("head_dim", default=h // a)
    vocab = cfg.int("vocab_size")
    num_layers = cfg.int("num_hidden_layers")
    activation = cfg.str("hidden_act")
    bias = cfg.bool("attention_bias")
    d_in = cfg.int("mamba_expand") * h
    heads, groups = cfg.int("mamba_n_heads"), cfg.int("mamba_n_groups")
    head_dim = d_in // heads if cfg.get("mamba_d_head") == "auto" else cfg.int("mamba_d_head")
    n, kernel = cfg.int("mamba_d_state"), cfg.int("mamba_d_conv")
    rope = "rotate" if cfg.get("position_embedding_type", default=None) == "rope" else "none"
    mixers = {
        "attention": (AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d, rope=rope),
                      tuple(gqa_projections(h, a, k, d, qkv_bias=bias, o_bias=bias))),
        "mamba": (AttentionSpec(kind="mamba", num_heads=0, num_kv_heads=0, head_dim=0,
                                state=mamba2_state(d_in, groups, n, heads, head_dim, kernel)),
                  tuple(mamba2_mixer(h, d_in, groups, n, heads, kernel, bias=cfg.bool("mamba_proj_bias"),
                                     conv_bias=cfg.bool("mamba_conv_bias"), prefix="mamba."))),
    }
    experts, si = cfg.int("num_local_experts", minimum=0), cfg.int("shared_intermediate_size")
    ff = [*linear("shared_mlp.input_linear", h, 2 * si, MLP, Split.COL),
          *linear("shared_mlp.output_linear", si, h, MLP, Split.ROW)]
    if experts:
        i = cfg.int("intermediate_size")
        mlp = MLPSpec(gated=True, intermediate_size=i, activation=activation, num_experts=experts,
                      num_experts_per_tok=cfg.int("num_experts_per_tok"), num_shared_experts=1,
                      shared_intermediate_size=si)
        ff = [*router("block_sparse_moe.router", h, experts),
              *expert_stack(h, i, experts, prefix="block_sparse_moe.experts"), *ff]
    else:
        mlp = MLPSpec(gated=True, intermediate_size=si, activation=activation)
    norms = (*norm("input_layernorm", h), *norm("post_attention_layernorm", h))
    built: dict[object, LayerSpec] = {}

    def layer(kind: str) -> LayerSpec:
        attention, tensors = mixers[kind]
        return intern(built, kind, lambda: LayerSpec(attention=attention, mlp=mlp, norm="rms",
                                                     tensors=(*tensors, *ff, *norms)))

    if cfg.get("layer_types", default=None) is None:
        kinds = ["mamba"] * num_layers
    else:
        kinds = listed_kinds(cfg, "layer_types", num_layers, LAYER_TYPES)
    return decoder_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[layer(kind) for kind in kinds],
        max_position_embeddings=cfg.int("max_position_embeddings"),
    )
