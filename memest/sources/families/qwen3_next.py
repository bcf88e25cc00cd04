"""Qwen3-Next: qwen3_next (Gated DeltaNet linear attention + gated full attention, MoE MLPs).

Follows transformers ``models/qwen3_next/modeling_qwen3_next.py`` and ``Qwen3NextConfig``. Layer n
is ``linear_attention`` or ``full_attention`` by ``layer_types[n]``, else every
``full_attention_interval``-th layer (default 4) attends fully. Its MLP is a sparse MoE block when
``num_experts > 0``, n is not in ``mlp_only_layers`` and ``(n + 1) % decoder_sparse_step == 0``, else
a dense SwiGLU of ``intermediate_size``. Every layer has ``input_layernorm`` and
``post_attention_layernorm`` (``(1 + w)`` RMSNorms, computed in fp32).

- full attention (``Qwen3NextAttention``): ``q_proj (2 a d, h)`` (queries and their output gate),
  ``k_proj`` / ``v_proj (k d, h)``, ``o_proj (h, a d)`` (biases with ``attention_bias``), per-head
  ``q_norm`` / ``k_norm (d)``; partial rotary (``partial_rotary_factor`` 0.25);
- Gated DeltaNet (``Qwen3NextGatedDeltaNet``):
  :func:`memest.sources.families._layers.gated_deltanet_mixer`; it caches a state per sequence
  (:func:`~memest.sources.families._layers.gated_deltanet_state`), nothing per token;
- MoE (``Qwen3NextSparseMoeBlock``): router ``gate (E, h)``, experts ``gate_up_proj (E, 2 i_moe, h)``
  / ``down_proj (E, h, i_moe)``, a ``shared_expert`` SwiGLU of ``shared_expert_intermediate_size``
  and its sigmoid ``shared_expert_gate (1, h)``.

The model: ``model.embed_tokens``, ``model.norm``, ``lm_head`` (untied by default). The
multi-token-prediction layer of the checkpoint is not instantiated by transformers, not counted.
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import (
    decoder_spec,
    expert_stack,
    gated_mlp,
    gqa_projections,
    intern,
    linear,
    norm,
    router,
)
from memest.sources.families._layers import gated_deltanet_mixer, gated_deltanet_state, listed_kinds
from memest.spec import AttentionSpec, Component, LayerSpec, MLPSpec, ModelSpec, Split

# Qwen3NextConfig defaults (models/qwen3_next/configuration_qwen3_next.py) of the fields read here
_DEFAULTS: dict[str, object] = {
    "vocab_size": 151936,
    "intermediate_size": 5632,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "head_dim": 256,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "decoder_sparse_step": 1,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "num_experts_per_tok": 10,
    "num_experts": 512,
    "full_attention_interval": 4,
}
LAYER_TYPES = {"linear_attention": "linear", "full_attention": "full"}
"""``layer_types`` words (``Qwen3NextDecoderLayer``)."""


def layer_kinds(cfg: HFConfig, num_layers: int) -> list[str]:
    """Each layer's mixer, ``linear`` or ``full`` (``Qwen3NextConfig.__post_init__``)."""
    if cfg.get("layer_types", default=None) is not None:
        return listed_kinds(cfg, "layer_types", num_layers, LAYER_TYPES)
    interval = cfg.int("full_attention_interval")
    return ["linear" if (n + 1) % interval else "full" for n in range(num_layers)]


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a qwen3_next config."""
    cfg = cfg.with_defaults(_DEFAULTS)
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    k = cfg.int("num_key_value_heads", default=a)
    d = cfg.int("head_dim")
    vocab = cfg.int("vocab_size")
    num_layers = cfg.int("num_hidden_layers")
    activation = cfg.str("hidden_act")
    bias = cfg.bool("attention_bias")
    k_heads, v_heads = cfg.int("linear_num_key_heads"), cfg.int("linear_num_value_heads")
    k_dim, v_dim = cfg.int("linear_key_head_dim"), cfg.int("linear_value_head_dim")
    kernel = cfg.int("linear_conv_kernel_dim")
    ssm_dtype = cfg.get("mamba_ssm_dtype", default=None)
    mixers = {
        "full": (
            AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d, rope="concat", qk_norm="head"),
            (*linear("self_attn.q_proj", h, 2 * a * d, Component.ATTENTION, Split.COL, bias=bias),
             *gqa_projections(h, a, k, d, qkv_bias=bias, o_bias=bias)[2 if bias else 1:],
             *norm("self_attn.q_norm", d), *norm("self_attn.k_norm", d)),
        ),
        "linear": (
            AttentionSpec(kind="linear", num_heads=0, num_kv_heads=0, head_dim=0,
                          state=gated_deltanet_state(k_heads, v_heads, k_dim, v_dim, kernel,
                                                     ssm_dtype=ssm_dtype if isinstance(ssm_dtype, str) else None)),
            tuple(gated_deltanet_mixer(h, k_heads, v_heads, k_dim, v_dim, kernel)),
        ),
    }
    num_experts = cfg.int("num_experts", minimum=0)
    step = cfg.int("decoder_sparse_step")
    mlp_only = set(cfg.get("mlp_only_layers", default=None) or [])
    i, i_moe, shared = cfg.int("intermediate_size"), cfg.int("moe_intermediate_size"), cfg.int(
        "shared_expert_intermediate_size")
    ffs = {
        False: (MLPSpec(gated=True, intermediate_size=i, activation=activation), tuple(gated_mlp(h, i))),
        True: (
            MLPSpec(gated=True, intermediate_size=i_moe, activation=activation, num_experts=max(num_experts, 1),
                    num_experts_per_tok=min(cfg.int("num_experts_per_tok"), max(num_experts, 1)),
                    num_shared_experts=1, shared_intermediate_size=shared),
            (*router("mlp.gate", h, num_experts), *expert_stack(h, i_moe, num_experts),
             *gated_mlp(h, shared, prefix="mlp.shared_expert"),
             *linear("mlp.shared_expert_gate", h, 1, Component.ROUTER, Split.NONE)),
        ),
    }
    norms = (*norm("input_layernorm", h), *norm("post_attention_layernorm", h))
    built: dict[object, LayerSpec] = {}

    def layer(mixer: str, moe: bool) -> LayerSpec:
        attention, mixer_tensors = mixers[mixer]
        mlp, ff_tensors = ffs[moe]
        return intern(built, (mixer, moe), lambda: LayerSpec(attention=attention, mlp=mlp, norm="rms_fp32",
                                                             tensors=(*mixer_tensors, *ff_tensors, *norms)))

    kinds = layer_kinds(cfg, num_layers)
    layers = [layer(kind, num_experts > 0 and n not in mlp_only and (n + 1) % step == 0)
              for n, kind in enumerate(kinds)]
    return decoder_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=layers,
        max_position_embeddings=cfg.int("max_position_embeddings"),
    )
