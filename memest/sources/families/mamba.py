"""Pure state-space models: mamba (Mamba-1) and mamba2 (Mamba-2, Codestral Mamba).

Follows transformers ``models/mamba/modeling_mamba.py`` / ``MambaConfig`` and
``models/mamba2/modeling_mamba2.py`` / ``Mamba2Config``. Every layer is ``norm`` (RMSNorm) then a
``mixer``; there is no attention and no MLP. With d_in = expand x h, N = state_size, K =
conv_kernel, R = time_step_rank (``"auto"`` = ceil(h / 16)):

- Mamba-1 (``MambaMixer``): ``in_proj (2 d_in, h)`` and ``out_proj (h, d_in)`` (biases with
  ``use_bias``), depthwise ``conv1d (d_in, 1, K)`` (bias with ``use_conv_bias``), ``x_proj (R + 2N,
  d_in)``, ``dt_proj (d_in, R)`` + bias, ``A_log (d_in, N)``, ``D (d_in)``;
- Mamba-2 (``Mamba2Mixer``): :func:`memest.sources.families._layers.mamba2_mixer` with ``num_heads``
  heads of ``head_dim`` and ``n_groups`` groups.

Each layer keeps a state per sequence (:func:`~memest.sources.families._layers.mamba1_state`,
:func:`~memest.sources.families._layers.mamba2_state`) and nothing per token. The model:
``backbone.embeddings (V, h)``, ``backbone.norm_f``, ``lm_head`` tied by default for Mamba-1, untied
for Mamba-2.
"""

from __future__ import annotations

import math

from memest.sources.config import HFConfig
from memest.sources.families._build import OTHER, linear, lm_head, model_spec, norm, token_embedding
from memest.sources.families._layers import mamba1_state, mamba2_mixer, mamba2_state
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec, Split, TensorSpec

# MambaConfig / Mamba2Config defaults of the fields read here
_DEFAULTS: dict[str, dict[str, object]] = {
    "mamba": {"vocab_size": 50280, "state_size": 16, "expand": 2, "conv_kernel": 4, "use_bias": False,
              "use_conv_bias": True, "time_step_rank": "auto", "tie_word_embeddings": True},
    "mamba2": {"vocab_size": 32768, "num_heads": 128, "head_dim": 64, "state_size": 128, "expand": 2,
               "conv_kernel": 4, "n_groups": 8, "use_bias": False, "use_conv_bias": True,
               "tie_word_embeddings": False},
}


def _mamba1_mixer(cfg: HFConfig, h: int, d_in: int, n: int, kernel: int) -> list[TensorSpec]:
    rank_value = cfg.get("time_step_rank")
    rank = math.ceil(h / 16) if rank_value == "auto" else cfg.int("time_step_rank")
    p = "mixer."
    return [
        TensorSpec(f"{p}conv1d.weight", (d_in, 1, kernel), OTHER, Split.COL),
        *([TensorSpec(f"{p}conv1d.bias", (d_in,), OTHER, Split.COL)] if cfg.bool("use_conv_bias") else []),
        *linear(f"{p}in_proj", h, 2 * d_in, OTHER, Split.COL, bias=cfg.bool("use_bias")),
        *linear(f"{p}x_proj", d_in, rank + 2 * n, OTHER, Split.ROW),
        *linear(f"{p}dt_proj", rank, d_in, OTHER, Split.COL, bias=True),
        TensorSpec(f"{p}A_log", (d_in, n), OTHER, Split.COL),
        TensorSpec(f"{p}D", (d_in,), OTHER, Split.COL),
        *linear(f"{p}out_proj", d_in, h, OTHER, Split.ROW, bias=cfg.bool("use_bias")),
    ]


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a mamba or mamba2 config."""
    cfg = cfg.with_defaults(_DEFAULTS[cfg.model_type])
    h = cfg.int("hidden_size")
    vocab = cfg.int("vocab_size")
    num_layers = cfg.int("num_hidden_layers")
    n, kernel = cfg.int("state_size"), cfg.int("conv_kernel")
    d_in = int(cfg.float("expand") * h)
    if cfg.model_type == "mamba":
        state = mamba1_state(d_in, n, kernel)
        mixer = _mamba1_mixer(cfg, h, d_in, n, kernel)
    else:
        heads, groups = cfg.int("num_heads"), cfg.int("n_groups")
        state = mamba2_state(d_in, groups, n, heads, cfg.int("head_dim"), kernel)
        mixer = mamba2_mixer(h, d_in, groups, n, heads, kernel, bias=cfg.bool("use_bias"),
                             conv_bias=cfg.bool("use_conv_bias"))
    layer = LayerSpec(
        attention=AttentionSpec(kind="mamba", num_heads=0, num_kv_heads=0, head_dim=0, state=state),
        mlp=MLPSpec(gated=False, intermediate_size=0),
        norm="rms",
        tensors=(*norm("norm", h), *mixer),
    )
    tied = cfg.bool("tie_word_embeddings")
    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[layer] * num_layers,
        embedding=[token_embedding("backbone.embeddings.weight", vocab, h)],
        head=[*norm("backbone.norm_f", h), *([] if tied else lm_head(vocab, h))],
        tie_word_embeddings=tied,
        max_position_embeddings=None,
    )
