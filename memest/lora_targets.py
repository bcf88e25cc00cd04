"""Which linear modules a ``--lora-targets`` value puts LoRA adapters on: the rule, written once.

A value is ``attention``, ``all-linear`` or comma-separated module names. On a layer of a
:class:`~memest.spec.ModelSpec` the rule (:func:`adapts`) takes a 2-D linear weight
(:attr:`~memest.spec.TensorSpec.is_linear_weight`: attention, MLP or expert projections):

- ``attention``: the attention projections (component ``attention``: q, k, v, o, MLA's down/up
  projections, fused QKV);
- ``all-linear``: every one. PEFT's own ``target_modules="all-linear"``
  (``peft/tuners/tuners_utils.py`` ``_maybe_include_all_linear_layers``) takes every
  ``nn.Linear`` / ``Conv1D`` of the model except the output layer (``get_output_embeddings()``),
  so for a text decoder it is the same set; it also takes linears memest does not count here
  (state-space mixers, routers, vision towers);
- names: the weights whose module's last name (``q_proj``) is one of them.

What the rule names for PEFT and what may be named: :func:`peft_target_modules` (module names as
PEFT matches them, by the last name), :func:`layer_modules` (layer-relative module paths, for a
narrower match), :func:`nameable_modules` (the names a value may list). Standard library and
memest.spec only: the estimator, the trace, calibration and the workload's checks all read it.
"""

from __future__ import annotations

from memest.spec import Component, ModelSpec, TensorSpec

ATTENTION = "attention"
ALL_LINEAR = "all-linear"


def named_modules(targets: str) -> tuple[str, ...]:
    """The module names of a comma-separated value, stripped; an empty item stays (``""``) so
    that a check can refuse it."""
    return tuple(x.strip() for x in targets.split(","))


def short_name(t: TensorSpec) -> str:
    """The last name of a tensor's module (``self_attn.q_proj.weight`` -> ``q_proj``), as PEFT's
    ``target_modules`` entries match it."""
    return t.module.rsplit(".", 1)[-1]


def adapts(t: TensorSpec, targets: str) -> bool:
    """True when ``targets`` puts an adapter on this layer tensor (see the module docstring)."""
    if not (t.is_linear_weight and len(t.shape) == 2):
        return False
    if targets == ALL_LINEAR:
        return True
    if targets == ATTENTION:
        return t.component is Component.ATTENTION
    return short_name(t) in {x for x in named_modules(targets) if x}


def layer_modules(spec: ModelSpec, targets: str) -> list[str]:
    """Layer-relative paths (``self_attn.q_proj``) of the modules :func:`adapts` takes, in model order."""
    out: dict[str, None] = {}
    for layer, _ in spec.layer_kinds():
        for t in layer.tensors:
            if adapts(t, targets):
                out[t.module] = None
    return list(out)


def peft_target_modules(spec: ModelSpec, targets: str) -> list[str]:
    """PEFT ``target_modules`` for ``targets``: the last names of the modules :func:`adapts` takes on
    the layers (``attention``, ``all-linear``), in model order; or the names given."""
    if targets in (ATTENTION, ALL_LINEAR):
        out: dict[str, None] = {}
        for layer, _ in spec.layer_kinds():
            for t in layer.tensors:
                if adapts(t, targets):
                    out[short_name(t)] = None
        return list(out)
    return [x for x in named_modules(targets) if x]


def nameable_modules(spec: ModelSpec) -> tuple[str, ...]:
    """Module names (the last part, ``q_proj``) that a value may list, in model order: PEFT matches
    ``target_modules`` against module names anywhere in the model, and memest counts adapters on
    2-D linear weights of the layers and on 2-D weights outside the attention/MLP blocks
    (:attr:`~memest.spec.Component.OTHER`: state-space mixers, vision towers)."""
    names: dict[str, None] = {}
    for t, _ in spec.tensors():
        if len(t.shape) == 2 and t.name.endswith("weight") and (t.is_linear_weight or t.component is Component.OTHER):
            names[short_name(t)] = None
    return tuple(names)
