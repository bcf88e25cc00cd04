"""OpenAI gpt-oss: gpt_oss.

Follows transformers ``models/gpt_oss/modeling_gpt_oss.py``: RMSNorm pre-norm layers; grouped-query
attention with biases on all four projections (``attention_bias``, default true) and one learned
attention-sink logit per head (``self_attn.sinks (a,)``); layers alternate sliding-window and full
attention (``layer_types``, default sliding on even layers, window 128); every MLP is an MoE block
with a biased router ``mlp.router (E, h)`` and E experts stored transposed with biases:
``gate_up_proj (E, h, 2i)``, ``gate_up_proj_bias (E, 2i)``, ``down_proj (E, i, h)``,
``down_proj_bias (E, h)``. The published checkpoints store the experts in MXFP4 (see
``quantization_config``); the tensors here are the unquantized shapes.
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import (
    ATTN,
    decoder_spec,
    expert_stack,
    gqa_projections,
    head_dim_of,
    intern,
    layer_windows,
    norm,
    router,
)
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec, Split, TensorSpec

# GptOssConfig defaults (models/gpt_oss/configuration_gpt_oss.py) of the fields read here
_DEFAULTS: dict[str, object] = {
    "num_local_experts": 128,
    "vocab_size": 201088,
    "intermediate_size": 2880,
    "head_dim": 64,
    "num_key_value_heads": 8,
    "sliding_window": 128,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "num_experts_per_tok": 4,
    "attention_bias": True,
}


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a gpt_oss config."""
    cfg = cfg.with_defaults(_DEFAULTS, aliases={"num_experts": "num_local_experts"})
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    k = cfg.int("num_key_value_heads", default=a)
    d = head_dim_of(cfg, h, a)
    i = cfg.int("intermediate_size")
    vocab = cfg.int("vocab_size")
    num_layers = cfg.int("num_hidden_layers")
    num_experts = cfg.int("num_local_experts")
    window = cfg.int("sliding_window", default=None)
    if cfg.has("layer_types"):
        windows = layer_windows(cfg, num_layers, window)
    else:  # GptOssConfig.__post_init__: sliding on even layers
        windows = [window if (n + 1) % 2 else None for n in range(num_layers)]
    bias = cfg.bool("attention_bias")

    tensors = (
        TensorSpec("self_attn.sinks", (a,), ATTN, Split.COL),
        *gqa_projections(h, a, k, d, qkv_bias=bias, o_bias=bias),
        *router("mlp.router", h, num_experts, bias=True),
        *expert_stack(h, i, num_experts, transposed=True, bias=True),
        *norm("input_layernorm", h),
        *norm("post_attention_layernorm", h),
    )
    mlp = MLPSpec(
        gated=True,
        intermediate_size=i,
        activation="swiglu_limit",  # GptOssExperts._apply_gate hard-codes it (hidden_act is unused)
        num_experts=num_experts,
        num_experts_per_tok=cfg.int("num_experts_per_tok"),
    )
    kinds: dict[object, LayerSpec] = {}

    def layer(w: int | None) -> LayerSpec:
        return intern(
            kinds,
            w,
            lambda: LayerSpec(
                # rotary by chunk + cat; the sinks join an eager softmax (no SDPA path: sdpa_supported)
                attention=AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d, sliding_window=w, rope="concat",
                                        sinks=True),
                mlp=mlp,
                norm="rms",
                tensors=tensors,
            ),
        )

    return decoder_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[layer(w) for w in windows],
        max_position_embeddings=cfg.int("max_position_embeddings"),
        sdpa_supported=False,  # GptOssAttention: attention sinks, eager only in transformers
    )
