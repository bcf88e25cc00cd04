"""AI21 Jamba hybrids: jamba (Mamba + attention layers, MoE MLPs).

Follows transformers ``models/jamba/modeling_jamba.py`` and ``JambaConfig``: layer n is an
attention layer iff ``n % attn_layer_period == attn_layer_offset``, else a Mamba layer; its MLP
is an MoE block iff ``n % expert_layer_period == expert_layer_offset`` (and num_experts > 1),
else a dense SwiGLU. Every layer has RMSNorms ``input_layernorm`` and ``pre_ff_layernorm``.

The Mamba mixer (``JambaMambaMixer``), with d_in = mamba_expand * h, N = mamba_d_state,
K = mamba_d_conv, R = mamba_dt_rank (``"auto"`` = ceil(h / 16)): ``in_proj (2 d_in, h)``,
depthwise ``conv1d (d_in, 1, K)`` (+ bias), ``x_proj (R + 2N, d_in)``, ``dt_proj (d_in, R)`` + bias,
``A_log (d_in, N)``, ``D (d_in,)``, ``out_proj (h, d_in)``, RMSNorms over R, N, N; ``mamba_proj_bias``
adds biases to in_proj and out_proj. Its recurrent state per sequence is the conv state
(d_in x K as transformers' cache keeps it, d_in x (K - 1) in vLLM) plus the SSM state (d_in x N)
elements (:func:`memest.sources.families._layers.mamba1_state`).
"""

from __future__ import annotations

import math

from memest.sources.config import HFConfig
from memest.sources.families._build import (
    NORM,
    OTHER,
    expert_stack,
    gated_mlp,
    gqa_projections,
    intern,
    linear,
    lm_head,
    model_spec,
    norm,
    router,
    token_embedding,
)
from memest.sources.families._layers import mamba1_state
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec, Split, TensorSpec

# JambaConfig defaults (models/jamba/configuration_jamba.py) of the fields read here
_DEFAULTS: dict[str, object] = {
    "vocab_size": 65536,
    "tie_word_embeddings": False,
    "intermediate_size": 14336,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "max_position_embeddings": 262144,
    "num_experts_per_tok": 2,
    "num_experts": 16,
    "expert_layer_period": 2,
    "expert_layer_offset": 1,
    "attn_layer_period": 8,
    "attn_layer_offset": 4,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_dt_rank": "auto",
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
}


def mamba_tensors(
    h: int, d_in: int, n: int, kernel: int, rank: int, *, conv_bias: bool, proj_bias: bool
) -> list[TensorSpec]:
    """The parameters of one ``JambaMambaMixer`` (see the module docstring for shapes)."""
    p = "mamba."
    tensors = [
        TensorSpec(f"{p}A_log", (d_in, n), OTHER, Split.COL),
        TensorSpec(f"{p}D", (d_in,), OTHER, Split.COL),
        TensorSpec(f"{p}conv1d.weight", (d_in, 1, kernel), OTHER, Split.COL),
        *([TensorSpec(f"{p}conv1d.bias", (d_in,), OTHER, Split.COL)] if conv_bias else []),
        *linear(f"{p}in_proj", h, 2 * d_in, OTHER, Split.COL, bias=proj_bias),
        *linear(f"{p}x_proj", d_in, rank + 2 * n, OTHER, Split.ROW),
        *linear(f"{p}dt_proj", rank, d_in, OTHER, Split.COL, bias=True),
        *linear(f"{p}out_proj", d_in, h, OTHER, Split.ROW, bias=proj_bias),
        *norm(f"{p}dt_layernorm", rank, component=NORM),
        *norm(f"{p}b_layernorm", n, component=NORM),
        *norm(f"{p}c_layernorm", n, component=NORM),
    ]
    return tensors


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a jamba config."""
    cfg = cfg.with_defaults(_DEFAULTS, aliases={"num_local_experts": "num_experts"})
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    k = cfg.int("num_key_value_heads", default=a)
    d = h // a  # JambaAttention: hidden_size // num_attention_heads
    i = cfg.int("intermediate_size")
    vocab = cfg.int("vocab_size")
    num_layers = cfg.int("num_hidden_layers")
    num_experts = cfg.int("num_experts")
    attn_period, attn_offset = cfg.int("attn_layer_period"), cfg.int("attn_layer_offset", minimum=0)
    expert_period, expert_offset = cfg.int("expert_layer_period"), cfg.int("expert_layer_offset", minimum=0)
    d_in = cfg.int("mamba_expand") * h
    n = cfg.int("mamba_d_state")
    kernel = cfg.int("mamba_d_conv")
    rank_value = cfg.get("mamba_dt_rank")
    rank = math.ceil(h / 16) if rank_value == "auto" else cfg.int("mamba_dt_rank")
    activation = cfg.str("hidden_act")

    attention = AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d)
    mamba = AttentionSpec(kind="mamba", num_heads=0, num_kv_heads=0, head_dim=0, state=mamba1_state(d_in, n, kernel))
    mixers = {
        "attention": tuple(gqa_projections(h, a, k, d)),
        "mamba": tuple(
            mamba_tensors(
                h, d_in, n, kernel, rank, conv_bias=cfg.bool("mamba_conv_bias"), proj_bias=cfg.bool("mamba_proj_bias")
            )
        ),
    }
    ffs = {
        False: (
            MLPSpec(gated=True, intermediate_size=i, activation=activation),
            tuple(gated_mlp(h, i, prefix="feed_forward")),
        ),
    }
    if num_experts > 1:  # with one expert transformers builds every feed-forward as the dense JambaMLP
        ffs[True] = (
            MLPSpec(
                gated=True,
                intermediate_size=i,
                activation=activation,
                num_experts=num_experts,
                num_experts_per_tok=cfg.int("num_experts_per_tok"),
            ),
            (
                *router("feed_forward.router", h, num_experts),
                *expert_stack(h, i, num_experts, prefix="feed_forward.experts"),
            ),
        )
    norms = (*norm("input_layernorm", h), *norm("pre_ff_layernorm", h))
    kinds: dict[object, LayerSpec] = {}

    def layer(mixer: str, moe: bool) -> LayerSpec:
        mlp, ff_tensors = ffs[moe]
        return intern(
            kinds,
            (mixer, moe),
            lambda: LayerSpec(
                attention=attention if mixer == "attention" else mamba,
                mlp=mlp,
                norm="rms",
                tensors=(*mixers[mixer], *ff_tensors, *norms),
            ),
        )

    layers = [
        layer(
            "attention" if n_ % attn_period == attn_offset else "mamba",
            num_experts > 1 and n_ % expert_period == expert_offset,
        )
        for n_ in range(num_layers)
    ]
    tied = cfg.bool("tie_word_embeddings")
    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=layers,
        embedding=[token_embedding("model.embed_tokens.weight", vocab, h)],
        head=[*norm("model.final_layernorm", h), *([] if tied else lm_head(vocab, h))],
        tie_word_embeddings=tied,
        max_position_embeddings=cfg.int("max_position_embeddings"),
    )
