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

What the rule names for PEFT and what may be named: :func:`peft_target_modules` (the
``target_modules`` list that makes PEFT adapt exactly those modules), :func:`peft_matches` (PEFT's
match of such a list against a module name, which the estimator counts adapters by),
:func:`layer_modules` (layer-relative module paths), :func:`nameable_modules` (the names a value may
list). Standard library and memest.spec only: the estimator, the trace, calibration and the
workload's checks all read it.
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


def peft_matches(module: str, target_modules: tuple[str, ...] | list[str]) -> bool:
    """True when PEFT adapts a module of this name for a list of ``target_modules``: the name is one
    of them or ends with ``"." + target`` (``peft/tuners/tuners_utils.py`` ``check_target_module_exists``)."""
    return any(module == target or module.endswith("." + target) for target in target_modules)


def _suffix(module: str, others: list[str]) -> str:
    """The shortest dotted suffix of ``module`` (``c_proj``, then ``attn.c_proj``) that none of
    ``others`` matches as PEFT does; the whole path when every shorter one is shared."""
    parts = module.split(".")
    for start in range(len(parts) - 1, 0, -1):
        suffix = ".".join(parts[start:])
        if not any(peft_matches(other, (suffix,)) for other in others):
            return suffix
    return module


def peft_target_modules(spec: ModelSpec, targets: str) -> list[str]:
    """PEFT ``target_modules`` for ``targets``, in model order.

    ``attention``, ``all-linear``: for each module :func:`adapts` takes on the layers, its last name
    (``q_proj``), or a longer suffix of its layer path where a module it does not take shares the last
    name (GPT-2's ``attn.c_proj`` beside ``mlp.c_proj``; BERT's ``attention.output.dense`` beside
    ``output.dense``), so that PEFT, matching by suffix (:func:`peft_matches`), adapts exactly those.
    Names: as given (PEFT adapts every module of that last name).
    """
    if targets not in (ATTENTION, ALL_LINEAR):
        return [x for x in named_modules(targets) if x]
    chosen = layer_modules(spec, targets)
    others = list(dict.fromkeys(t.module for layer, _ in spec.layer_kinds() for t in layer.tensors
                                if (t.is_linear_weight or len(t.shape) == 2) and t.module not in chosen))
    return list(dict.fromkeys(_suffix(m, others) for m in chosen))


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
