"""Post-norm decoders: AI2 OLMo 2 and OLMo 3 (olmo2, olmo3) and LG EXAONE 4 (exaone4).

Follows transformers ``models/olmo2/modeling_olmo2.py``: no pre-norms; RMSNorms after attention
and after the MLP (``post_attention_layernorm``, ``post_feedforward_layernorm``); RMSNorm
``q_norm``/``k_norm`` over the full projection widths (a*d and k*d, not per head); Q/K/V/O biased
per ``attention_bias``; SwiGLU MLP; untied lm_head by default. ``models/olmo3/modeling_olmo3.py``
has the same tensors and adds sliding-window layers: ``layer_types``, by default three sliding
layers then one full (``Olmo3Config.__post_init__``), window ``sliding_window`` (default 4096).
``models/exaone4/modeling_exaone4.py``: the same two post-norms (Llama's RMSNorm, not OLMo's
fp32 product), no biases, ``q_norm``/``k_norm`` per head over head_dim; ``layer_types``, by
default ``sliding_window_pattern`` - 1 sliding layers then one full (none without a window:
``Exaone4Config.__post_init__``). The Hub configs write the pattern as a string, ``"LLLG"`` (L local,
G global, repeating from layer 0, as ``Exaone4Config``'s docstring defines it; its ``__post_init__``
only handles the integer form, and the Hub configs also list ``layer_types``).
"""

from __future__ import annotations

from memest.errors import ConfigError
from memest.sources.config import HFConfig
from memest.sources.families._build import (
    decoder_spec,
    gated_mlp,
    gqa_projections,
    head_dim_of,
    intern,
    layer_windows,
    norm,
)
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec

# Olmo2Config / Olmo3Config defaults (models/olmo<n>/configuration_olmo<n>.py) of the fields read here
_OLMO2_DEFAULTS: dict[str, object] = {
    "vocab_size": 50304,
    "intermediate_size": 11008,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "attention_bias": False,
}
_DEFAULTS: dict[str, dict[str, object]] = {
    "olmo2": _OLMO2_DEFAULTS,
    "olmo3": {**_OLMO2_DEFAULTS, "sliding_window": 4096},
    "exaone4": {
        "vocab_size": 102400,
        "intermediate_size": 16384,
        "num_key_value_heads": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "attention_bias": False,  # no such field: Exaone4Attention has no biases
        "sliding_window": 4096,
        "sliding_window_pattern": 4,
    },
}


def _windows(cfg: HFConfig, model_type: str, num_layers: int) -> list[int | None]:
    """Each layer's window: ``layer_types`` when given, else the family's pattern (see the module doc)."""
    if model_type == "olmo2":
        return [None] * num_layers
    window = cfg.int("sliding_window", default=None)
    if cfg.has("layer_types") or window is None:
        return layer_windows(cfg, num_layers, window)
    pattern = 4 if model_type == "olmo3" else cfg.get("sliding_window_pattern")
    if isinstance(pattern, str):
        return _pattern_windows(cfg, pattern, window, num_layers)
    period = 4 if model_type == "olmo3" else cfg.int("sliding_window_pattern")
    return [window if (n + 1) % period else None for n in range(num_layers)]


def _pattern_windows(cfg: HFConfig, pattern: str, window: int, num_layers: int) -> list[int | None]:
    """Windows of a ``sliding_window_pattern`` string such as ``"LLLG"`` (L sliding, G full, repeating).

    Raises:
        ConfigError: the pattern is empty or has a symbol other than L and G.
    """
    for n, symbol in enumerate(pattern):
        if symbol not in "LG":
            raise ConfigError(f"{cfg.what}: sliding_window_pattern[{n}] = {symbol!r} in {pattern!r}; "
                              "each symbol is L (sliding window) or G (full attention)")
    if not pattern:
        raise ConfigError(f"{cfg.what}: sliding_window_pattern is empty; write e.g. \"LLLG\"")
    return [window if pattern[n % len(pattern)] == "L" else None for n in range(num_layers)]


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of an olmo2 / olmo3 / exaone4 config."""
    model_type = cfg.model_type
    cfg = cfg.with_defaults(_DEFAULTS[model_type])
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    k = cfg.int("num_key_value_heads", default=a)
    d = head_dim_of(cfg, h, a)
    i = cfg.int("intermediate_size")
    vocab = cfg.int("vocab_size")
    exaone = model_type == "exaone4"
    bias = False if exaone else cfg.bool("attention_bias")
    tensors = (
        *gqa_projections(h, a, k, d, qkv_bias=bias, o_bias=bias),
        *norm("self_attn.q_norm", d if exaone else a * d),
        *norm("self_attn.k_norm", d if exaone else k * d),
        *gated_mlp(h, i),
        *norm("post_attention_layernorm", h),
        *norm("post_feedforward_layernorm", h),
    )
    mlp = MLPSpec(gated=True, intermediate_size=i, activation=cfg.str("hidden_act"))
    num_layers = cfg.int("num_hidden_layers")
    windows = _windows(cfg, model_type, num_layers)
    kinds: dict[object, LayerSpec] = {}

    def layer(window: int | None) -> LayerSpec:
        return intern(
            kinds,
            window,
            lambda: LayerSpec(
                attention=AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d, qk_norm="head" if exaone else "full",
                                        sliding_window=window),
                mlp=mlp,
                norm="rms" if exaone else "rms_fp32",
                norm_position="post",
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
