"""Cohere Command decoders: cohere (Command R / R+), cohere2 (Command R7B, Command A).

Follows transformers ``models/cohere/modeling_cohere.py``: one bias-free LayerNorm per layer
(``input_layernorm``, ``CohereLayerNorm``) read by attention and MLP in parallel, both added to the
residual; Q/K/V/O biased per ``attention_bias``; with ``use_qk_norm`` LayerNorm weights over each
head, ``self_attn.q_norm.weight (a, d)`` and ``k_norm.weight (k, d)``; SwiGLU MLP; final
``model.norm``; lm_head tied by default (``logit_scale`` is a scalar). ``models/cohere2``: the same
layers without q/k norms, with ``layer_types`` (by default three sliding layers then one full,
``Cohere2Config.__post_init__``), window ``sliding_window`` (default 4096).
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import (
    NORM,
    decoder_spec,
    gated_mlp,
    gqa_projections,
    head_dim_of,
    intern,
    layer_windows,
    norm,
)
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec, TensorSpec

_COMMON: dict[str, object] = {
    "vocab_size": 256000,
    "intermediate_size": 22528,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "attention_bias": False,
}
# CohereConfig / Cohere2Config defaults (models/cohere<n>/configuration_cohere<n>.py) of the fields read here
_DEFAULTS: dict[str, dict[str, object]] = {
    "cohere": {**_COMMON, "use_qk_norm": False},
    "cohere2": {**_COMMON, "sliding_window": 4096, "sliding_window_pattern": 4},
}


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a cohere / cohere2 config."""
    model_type = cfg.model_type
    cfg = cfg.with_defaults(_DEFAULTS[model_type])
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    k = cfg.int("num_key_value_heads", default=a)
    d = head_dim_of(cfg, h, a)
    i = cfg.int("intermediate_size")
    vocab = cfg.int("vocab_size")
    num_layers = cfg.int("num_hidden_layers")
    bias = cfg.bool("attention_bias")
    qk_norm = model_type == "cohere" and cfg.bool("use_qk_norm")
    if model_type == "cohere2":
        window = cfg.int("sliding_window", default=None)
        if cfg.has("layer_types"):
            windows = layer_windows(cfg, num_layers, window)
        else:
            period = cfg.int("sliding_window_pattern")
            windows = [window if (n + 1) % period else None for n in range(num_layers)]
    else:
        windows = [None] * num_layers
    tensors = (
        *norm("input_layernorm", h),
        *gqa_projections(h, a, k, d, qkv_bias=bias, o_bias=bias),
        *([TensorSpec("self_attn.q_norm.weight", (a, d), NORM), TensorSpec("self_attn.k_norm.weight", (k, d), NORM)]
          if qk_norm else []),
        *gated_mlp(h, i),
    )
    mlp = MLPSpec(gated=True, intermediate_size=i, activation=cfg.str("hidden_act"))
    kinds: dict[object, LayerSpec] = {}

    def layer(window: int | None) -> LayerSpec:
        return intern(
            kinds,
            window,
            lambda: LayerSpec(
                attention=AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d, sliding_window=window,
                                        qk_norm="head" if qk_norm else "none"),
                mlp=mlp,
                norm="layer",
                parallel_residual=True,
                tensors=tensors,
            ),
        )

    return decoder_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[layer(w) for w in windows],
        max_position_embeddings=cfg.int("max_position_embeddings"),
    )
