"""Llama-style decoders: llama, mistral, qwen2.

Pre-norm RMSNorm layers, rotary attention with grouped-query K/V, SwiGLU MLP, untied lm_head by
default. Follows transformers ``models/llama/modeling_llama.py`` (``attention_bias`` on all four
projections, ``mlp_bias``), ``models/mistral`` (no biases, optional sliding window) and
``models/qwen2`` (bias on Q/K/V only; sliding window only when ``use_sliding_window``).
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import (
    gated_mlp,
    gqa_projections,
    head_dim_of,
    layer_windows,
    lm_head,
    model_spec,
    norm,
    token_embedding,
)
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec

# transformers config-class defaults for fields a config may omit
_DEFAULTS = {
    "llama": {"max_position_embeddings": 2048},
    "mistral": {"max_position_embeddings": 4096 * 32},
    "qwen2": {"max_position_embeddings": 32768},
}


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a llama / mistral / qwen2 config."""
    model_type = cfg.model_type
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    k = cfg.int("num_key_value_heads", default=a)
    d = head_dim_of(cfg, h, a)
    i = cfg.int("intermediate_size")
    vocab = cfg.int("vocab_size")
    num_layers = cfg.int("num_hidden_layers")

    if model_type == "qwen2":
        qkv_bias, o_bias, mlp_bias = True, False, False
        window = cfg.int("sliding_window", default=4096) if cfg.bool("use_sliding_window", default=False) else None
        if window is not None and not cfg.has("layer_types"):
            first = cfg.int("max_window_layers", default=28, minimum=0)
            windows: list[int | None] = [window if n >= first else None for n in range(num_layers)]
        else:
            windows = layer_windows(cfg, num_layers, window)
    else:
        bias = cfg.bool("attention_bias", default=False)
        qkv_bias, o_bias = bias, bias
        mlp_bias = cfg.bool("mlp_bias", default=False)
        window = cfg.int("sliding_window", default=None) if model_type == "mistral" else None
        windows = layer_windows(cfg, num_layers, window)

    tensors = (
        *norm("input_layernorm", h),
        *gqa_projections(h, a, k, d, qkv_bias=qkv_bias, o_bias=o_bias),
        *norm("post_attention_layernorm", h),
        *gated_mlp(h, i, bias=mlp_bias),
    )
    mlp = MLPSpec(gated=True, intermediate_size=i, activation=cfg.str("hidden_act", default="silu"))
    kinds: dict[int | None, LayerSpec] = {}
    for w in set(windows):
        attention = AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d, sliding_window=w)
        kinds[w] = LayerSpec(attention=attention, mlp=mlp, norm="rms", tensors=tensors)

    tied = cfg.bool("tie_word_embeddings", default=False)
    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[kinds[w] for w in windows],
        embedding=[token_embedding("model.embed_tokens.weight", vocab, h)],
        head=[*norm("model.norm", h), *([] if tied else lm_head(vocab, h))],
        tie_word_embeddings=tied,
        max_position_embeddings=cfg.int("max_position_embeddings", default=_DEFAULTS[model_type]["max_position_embeddings"]),
    )
