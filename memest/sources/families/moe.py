"""Llama-style mixture-of-experts decoders: mixtral, qwen2_moe, qwen3_moe, granitemoe, minimax_m2.

Attention as in the dense family; the MLP of an MoE layer is a router ``mlp.gate (E, h)`` and E
routed SwiGLU experts stored fused (``mlp.experts.gate_up_proj (E, 2i, h)``,
``mlp.experts.down_proj (E, h, i)``). Follows transformers:

- ``models/mixtral/modeling_mixtral.py``: every layer MoE; one sliding window (default none).
- ``models/qwen2_moe/modeling_qwen2_moe.py``: Q/K/V bias (``qkv_bias``); a shared expert
  (``mlp.shared_expert``, ``shared_expert_intermediate_size`` wide) with a sigmoid gate
  ``mlp.shared_expert_gate (1, h)``; layer n is MoE unless in ``mlp_only_layers`` and iff
  ``(n + 1) % decoder_sparse_step == 0``, else a dense MLP ``intermediate_size`` wide.
- ``models/qwen3_moe/modeling_qwen3_moe.py``: as qwen2_moe without the shared expert, with
  ``attention_bias`` on all four projections and RMSNorm ``q_norm``/``k_norm`` over head_dim.
- ``models/granitemoe/modeling_granitemoe.py``: mixtral's layers under other names (router
  ``block_sparse_moe.router.weight (E, h)``, experts ``block_sparse_moe.experts.*``), with
  ``attention_bias`` on all four projections and no sliding window; its multipliers are scalars.
- ``models/minimax_m2/modeling_minimax_m2.py``: mixtral's layers without biases or sliding window,
  a config-given ``head_dim`` (default 128), partial rotary (``rotary_dim``) and RMSNorm
  ``q_norm``/``k_norm`` over the full projection widths (a*d and k*d, as OLMo-2); the router's
  ``e_score_correction_bias`` is a buffer (not counted).
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import (
    decoder_spec,
    expert_stack,
    gated_mlp,
    gqa_projections,
    head_dim_of,
    intern,
    layer_windows,
    linear,
    norm,
    router,
)
from memest.spec import AttentionSpec, Component, LayerSpec, MLPSpec, ModelSpec, Split

# transformers config-class defaults (configuration_<type>.py) of the fields read here
_DEFAULTS: dict[str, dict[str, object]] = {
    "mixtral": {
        "vocab_size": 32000,
        "intermediate_size": 14336,
        "num_key_value_heads": 8,
        "hidden_act": "silu",
        "max_position_embeddings": 4096 * 32,
        "tie_word_embeddings": False,
        "sliding_window": None,
        "num_experts_per_tok": 2,
        "num_local_experts": 8,
    },
    "qwen2_moe": {
        "vocab_size": 151936,
        "intermediate_size": 5632,
        "num_key_value_heads": 16,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
        "decoder_sparse_step": 1,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "num_experts_per_tok": 4,
        "num_experts": 60,
        "mlp_only_layers": None,
        "qkv_bias": True,
    },
    "qwen3_moe": {
        "vocab_size": 151936,
        "intermediate_size": 6144,
        "num_key_value_heads": 4,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "decoder_sparse_step": 1,
        "moe_intermediate_size": 768,
        "num_experts_per_tok": 8,
        "num_experts": 128,
        "mlp_only_layers": None,
    },
    "granitemoe": {
        "vocab_size": 32000,
        "intermediate_size": 11008,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    },
    "minimax_m2": {
        "vocab_size": 200064,
        "intermediate_size": 1536,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 196608,
        "tie_word_embeddings": False,
        "num_experts_per_tok": 8,
        "num_local_experts": 256,
    },
}
# where each family keeps its MoE block: (router module, experts prefix)
_MOE_NAMES: dict[str, tuple[str, str]] = {"granitemoe": ("block_sparse_moe.router", "block_sparse_moe.experts")}

# their attribute_map: an alias in the JSON sets the stored field
_ALIASES: dict[str, dict[str, str]] = {
    "mixtral": {"num_experts": "num_local_experts"},
    "qwen2_moe": {},
    "qwen3_moe": {"num_local_experts": "num_experts"},
    "granitemoe": {},
    "minimax_m2": {"num_experts": "num_local_experts"},
}


def _qwen2_moe_windows(cfg: HFConfig, num_layers: int) -> list[int | None]:
    """``Qwen2MoeConfig.__post_init__``: even layers below max_window_layers slide when enabled."""
    if cfg.has("layer_types"):
        window = cfg.int("sliding_window", default=None) if cfg.bool("use_sliding_window") else None
        return layer_windows(cfg, num_layers, window)
    if not cfg.bool("use_sliding_window"):
        return [None] * num_layers
    window = cfg.int("sliding_window")
    first_dense = cfg.int("max_window_layers", minimum=0)
    return [window if (n + 1) % 2 and n < first_dense else None for n in range(num_layers)]


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a mixtral / qwen2_moe / qwen3_moe / granitemoe / minimax_m2 config."""
    model_type = cfg.model_type
    cfg = cfg.with_defaults(_DEFAULTS[model_type], aliases=_ALIASES[model_type])
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    k = cfg.int("num_key_value_heads", default=a)
    d = head_dim_of(cfg, h, a)
    vocab = cfg.int("vocab_size")
    num_layers = cfg.int("num_hidden_layers")
    activation = cfg.str("hidden_act")
    top_k = cfg.int("num_experts_per_tok")

    full_qk_norm = model_type == "minimax_m2"
    if model_type in ("mixtral", "granitemoe", "minimax_m2"):
        num_experts = cfg.int("num_local_experts")
        expert_i = cfg.int("intermediate_size")
        moe_layers = [True] * num_layers
        qk_norm = False
        if model_type == "mixtral":
            windows = [cfg.int("sliding_window", default=None)] * num_layers
            qkv_bias = o_bias = False
        else:
            windows = [None] * num_layers
            qkv_bias = o_bias = model_type == "granitemoe" and cfg.bool("attention_bias")
    else:
        num_experts = cfg.int("num_experts", minimum=0)
        expert_i = cfg.int("moe_intermediate_size")
        step = cfg.int("decoder_sparse_step")
        dense_only = set(cfg.get("mlp_only_layers", default=None) or [])
        moe_layers = [n not in dense_only and num_experts > 0 and (n + 1) % step == 0 for n in range(num_layers)]
        if model_type == "qwen2_moe":
            qkv_bias, o_bias, qk_norm = cfg.bool("qkv_bias"), False, False
            windows = _qwen2_moe_windows(cfg, num_layers)
        else:
            qkv_bias = o_bias = cfg.bool("attention_bias")
            qk_norm = True
            window = cfg.int("sliding_window", default=None) if cfg.bool("use_sliding_window") else None
            windows = [window] * num_layers

    attention_tensors = (
        *gqa_projections(h, a, k, d, qkv_bias=qkv_bias, o_bias=o_bias),
        *(norm("self_attn.q_norm", d) + norm("self_attn.k_norm", d) if qk_norm else []),
        *(norm("self_attn.q_norm", a * d) + norm("self_attn.k_norm", k * d) if full_qk_norm else []),
    )
    norms = (*norm("input_layernorm", h), *norm("post_attention_layernorm", h))
    shared_i = cfg.int("shared_expert_intermediate_size", minimum=0) if model_type == "qwen2_moe" else 0
    router_name, experts_prefix = _MOE_NAMES.get(model_type, ("mlp.gate", "mlp.experts"))
    moe_tensors = (
        *router(router_name, h, num_experts),
        *expert_stack(h, expert_i, num_experts, prefix=experts_prefix),
        *(
            gated_mlp(h, shared_i, prefix="mlp.shared_expert")
            + linear("mlp.shared_expert_gate", h, 1, Component.ROUTER, Split.NONE)
            if model_type == "qwen2_moe"
            else []
        ),
    )
    moe_mlp = MLPSpec(
        gated=True,
        intermediate_size=expert_i,
        activation=activation,
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        num_shared_experts=1 if shared_i else 0,
        shared_intermediate_size=shared_i,
    )
    dense_i = cfg.int("intermediate_size")
    dense_mlp = MLPSpec(gated=True, intermediate_size=dense_i, activation=activation)
    kinds: dict[object, LayerSpec] = {}

    def layer(moe: bool, window: int | None) -> LayerSpec:
        return intern(
            kinds,
            (moe, window),
            lambda: LayerSpec(
                attention=AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d, sliding_window=window,
                                        rope="concat" if full_qk_norm else "rotate",
                                        qk_norm="head" if qk_norm else "full" if full_qk_norm else "none"),
                mlp=moe_mlp if moe else dense_mlp,
                norm="rms",
                tensors=(*attention_tensors, *(moe_tensors if moe else gated_mlp(h, dense_i)), *norms),
            ),
        )

    return decoder_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[layer(moe, w) for moe, w in zip(moe_layers, windows, strict=True)],
        max_position_embeddings=cfg.int("max_position_embeddings"),
    )
