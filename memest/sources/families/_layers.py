"""Per-layer kinds of hybrid models: reading ``layer_types`` lists and pattern strings, and the
per-sequence state of each state-layer kind.

A hybrid config names each layer's mixer either as a list (``layer_types``: LFM2, Qwen3-Next,
Granite-4.0-H, Gemma, ...) or as a string of one symbol per layer (Nemotron-H
``hybrid_override_pattern``). Each family knows its own words; :func:`listed_kinds` and
:func:`pattern_kinds` map them to memest's kinds and turn an entry the family does not know into a
one-line :class:`~memest.errors.ConfigError` naming the key, the position and the value, never a
silent default.

The state builders follow vLLM's ``MambaStateShapeCalculator``
(``vllm/model_executor/layers/mamba/mamba_utils.py``) and the transformers mixers' cache updates.
"""

from __future__ import annotations

from collections.abc import Mapping

from memest.errors import ConfigError
from memest.sources.config import HFConfig
from memest.spec import Component, Split, StateSpec, TensorSpec


def listed_kinds(cfg: HFConfig, key: str, num_layers: int | None, known: Mapping[str, str]) -> list[str]:
    """Each layer's kind from the list ``cfg[key]``, mapped through ``known`` (the family's words).

    Args:
        cfg: The config.
        key: The list's key (``layer_types``).
        num_layers: Entries the list must have (None: any length).
        known: The family's layer-type words -> memest's kinds.

    Raises:
        ConfigError: the key is not a list of the right length, or an entry is not in ``known``
            (``layer_types[3] = "foo"``).
    """
    types = cfg.get(key, default=None)
    if not isinstance(types, list) or (num_layers is not None and len(types) != num_layers):
        want = f"list {num_layers} entries (one per layer)" if num_layers is not None else "be a list of layer types"
        raise ConfigError(f"{cfg.what}: {key!r} must {want}, got {types!r}")
    out = []
    for i, value in enumerate(types):
        kind = known.get(value) if isinstance(value, str) else None
        if kind is None:
            raise ConfigError(f"{cfg.what}: {key}[{i}] = {value!r} is not a layer type of "
                              f"model_type {cfg.model_type!r}; use one of {', '.join(map(repr, known))}")
        out.append(kind)
    return out


def pattern_kinds(cfg: HFConfig, key: str, symbols: Mapping[str, str]) -> list[str]:
    """Each layer's kind from the pattern string ``cfg[key]`` (one symbol per layer).

    Raises:
        ConfigError: the key is not a non-empty string, or a symbol is not in ``symbols``.
    """
    pattern = cfg.get(key, default=None)
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError(f"{cfg.what}: {key!r} must be a string of one symbol per layer, got {pattern!r}")
    out = []
    for i, symbol in enumerate(pattern):
        kind = symbols.get(symbol)
        if kind is None:
            raise ConfigError(f"{cfg.what}: {key}[{i}] = {symbol!r} is not a layer symbol of "
                              f"model_type {cfg.model_type!r}; use one of {', '.join(map(repr, symbols))}")
        out.append(kind)
    return out


def mamba1_state(d_inner: int, d_state: int, d_conv: int) -> StateSpec:
    """Mamba(-1) (Jamba, ``mamba``): conv (d_in, K) and SSM (d_in, N) (``mamba1_state_shape``)."""
    return StateSpec(conv_channels=d_inner, conv_kernel=d_conv, ssm_elements=d_inner * d_state)


def mamba2_state(d_inner: int, n_groups: int, d_state: int, num_heads: int, head_dim: int, d_conv: int, *,
                 ssm_dtype: str | None = None) -> StateSpec:
    """Mamba-2 (Nemotron-H, Granite-4.0-H, Falcon-H1, ``mamba2``): conv over x, B and C
    (d_in + 2 G N channels) and SSM (heads, head_dim, N) (``mamba2_state_shape``)."""
    return StateSpec(conv_channels=d_inner, groups=n_groups, group_channels=2 * d_state, conv_kernel=d_conv,
                     ssm_elements=num_heads * head_dim * d_state, ssm_dtype=ssm_dtype)


def gated_deltanet_state(k_heads: int, v_heads: int, k_dim: int, v_dim: int, d_conv: int, *,
                         ssm_dtype: str | None = None) -> StateSpec:
    """Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5): conv over q, k and v
    (2 Hk dk + Hv dv channels) and the recurrent state (Hv, dv, dk) (``gated_delta_net_state_shape``),
    the latter in the config's ``mamba_ssm_dtype`` when it names one."""
    return StateSpec(conv_channels=2 * k_heads * k_dim + v_heads * v_dim, conv_kernel=d_conv,
                     ssm_elements=v_heads * v_dim * k_dim, ssm_dtype=ssm_dtype)


def short_conv_state(hidden_size: int, d_conv: int) -> StateSpec:
    """LFM2's short convolution: a conv state of hidden_size channels, no SSM
    (``short_conv_state_shape``; transformers ``Lfm2ShortConv``: ``conv_L_cache`` columns)."""
    return StateSpec(conv_channels=hidden_size, conv_kernel=d_conv)


def mamba2_mixer(hidden_size: int, d_inner: int, n_groups: int, d_state: int, num_heads: int, d_conv: int, *,
                 bias: bool, conv_bias: bool, prefix: str = "mixer.", gated_norm: bool = True,
                 out_bias: bool | None = None) -> list[TensorSpec]:
    """The parameters of a Mamba-2 mixer (transformers ``Mamba2Mixer``, ``NemotronHMamba2Mixer``,
    ``FalconH1Mixer``): ``in_proj (d_in + conv_dim + heads, h)``, depthwise ``conv1d (conv_dim, 1, K)``
    with conv_dim = d_in + 2 G N, ``dt_bias`` / ``A_log`` / ``D`` (heads), gated RMSNorm ``norm
    (d_in)`` (Falcon-H1: only with ``mamba_rms_norm``), ``out_proj (h, d_in)`` (its bias ``out_bias``,
    default ``bias``); tensor parallelism splits the mixer by heads (vLLM ``MambaMixer2``)."""
    out_bias = bias if out_bias is None else out_bias
    conv_dim = d_inner + 2 * n_groups * d_state
    other = Component.OTHER
    tensors = [
        TensorSpec(f"{prefix}in_proj.weight", (d_inner + conv_dim + num_heads, hidden_size), other, Split.COL),
        *([TensorSpec(f"{prefix}in_proj.bias", (d_inner + conv_dim + num_heads,), other, Split.COL)] if bias else []),
        TensorSpec(f"{prefix}conv1d.weight", (conv_dim, 1, d_conv), other, Split.COL),
        *([TensorSpec(f"{prefix}conv1d.bias", (conv_dim,), other, Split.COL)] if conv_bias else []),
        TensorSpec(f"{prefix}dt_bias", (num_heads,), other, Split.COL),
        TensorSpec(f"{prefix}A_log", (num_heads,), other, Split.COL),
        TensorSpec(f"{prefix}D", (num_heads,), other, Split.COL),
        *([TensorSpec(f"{prefix}norm.weight", (d_inner,), Component.NORM, Split.COL)] if gated_norm else []),
        TensorSpec(f"{prefix}out_proj.weight", (hidden_size, d_inner), other, Split.ROW),
        *([TensorSpec(f"{prefix}out_proj.bias", (hidden_size,), other, Split.NONE)] if out_bias else []),
    ]
    return tensors


def gated_deltanet_mixer(hidden_size: int, k_heads: int, v_heads: int, k_dim: int, v_dim: int, d_conv: int, *,
                         prefix: str = "linear_attn.") -> list[TensorSpec]:
    """The parameters of a Gated DeltaNet layer (transformers ``Qwen3NextGatedDeltaNet``):
    ``in_proj_qkvz (2 Hk dk + 2 Hv dv, h)``, ``in_proj_ba (2 Hv, h)``, depthwise ``conv1d (2 Hk dk +
    Hv dv, 1, K)`` without bias, ``dt_bias`` / ``A_log`` (Hv), gated RMSNorm ``norm (dv)``,
    ``out_proj (h, Hv dv)``; tensor parallelism splits it by heads (vLLM ``Qwen3NextGatedDeltaNet``)."""
    key, value = k_heads * k_dim, v_heads * v_dim
    attn = Component.ATTENTION
    return [
        TensorSpec(f"{prefix}conv1d.weight", (2 * key + value, 1, d_conv), attn, Split.COL),
        TensorSpec(f"{prefix}in_proj_qkvz.weight", (2 * key + 2 * value, hidden_size), attn, Split.COL),
        TensorSpec(f"{prefix}in_proj_ba.weight", (2 * v_heads, hidden_size), attn, Split.COL),
        TensorSpec(f"{prefix}dt_bias", (v_heads,), attn, Split.COL),
        TensorSpec(f"{prefix}A_log", (v_heads,), Component.OTHER, Split.COL),
        TensorSpec(f"{prefix}norm.weight", (v_dim,), Component.NORM),
        TensorSpec(f"{prefix}out_proj.weight", (hidden_size, value), attn, Split.ROW),
    ]
