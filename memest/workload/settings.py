"""The settings a user gives, each declared once as field metadata (:func:`setting`).

A workload dataclass field that the user sets carries a :class:`Setting`: its keyword name (the CLI
flag with underscores: ``lora_rank``), help text, scope (which jobs read it), group, and the default a
user gets when they do not give it (``None`` where the library resolves it from the model, the device
or other settings: :mod:`memest.workload.resolve`). :func:`settings` collects them in one ordered
table, from which the CLI generates its options and the "flag this job would not read" refusals, the
planner prints ``memest hf`` commands, and the report describes a job.

The library never names a CLI flag: messages name settings as ``{name}`` placeholders
(:class:`memest.errors.InputError` with ``field=``); the CLI renders them as flags, the Python API
as keywords.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from enum import Enum
from typing import Any

from memest.workload import stacks
from memest.workload.config import JobSettings, Parallelism, ServingConfig, TrainingConfig
from memest.workload.declare import GROUPS, MISSING, Setting, nested, setting

__all__ = ["GROUPS", "MISSING", "Setting", "nested", "setting", "settings"]


def _collect(cls: type, prefix: str, path: str, out: list[Setting]) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("setting")
        nested = f.metadata.get("settings_of")
        if nested is not None:
            _collect(hints[f.name], nested, f"{path}{f.name}.", out)
            continue
        if meta is None:
            continue
        meta = dict(meta)
        name = meta.pop("name", prefix + f.name)
        field_default = f.default if f.default is not MISSING else MISSING
        default = meta.pop("unset", field_default)
        kind = meta.pop("type", None) or hints[f.name]
        out.append(Setting(name=name, default=default, type=kind, attr=path + f.name,
                           field_default=None if field_default is MISSING else field_default, **meta))


@functools.cache
def settings() -> dict[str, Setting]:
    """Every user-facing setting by keyword, grouped as :data:`GROUPS`, each group in declaration order.

    Collected from :class:`~memest.workload.config.JobSettings` (the mode, the model source, the
    device), :class:`~memest.workload.config.TrainingConfig` (with its LoRA settings),
    :class:`~memest.workload.config.ServingConfig` and :class:`~memest.workload.config.Parallelism`.
    """
    found: list[Setting] = []
    for cls, path in ((JobSettings, None), (TrainingConfig, ""), (ServingConfig, ""), (Parallelism, "parallelism.")):
        start = len(found)
        _collect(cls, "", path or "", found)
        if path is None:  # not on the workload
            found[start:] = [dataclasses.replace(s, attr=None) for s in found[start:]]
    names = [s.name for s in found]
    if len(set(names)) != len(names):
        raise RuntimeError(f"a setting is declared twice: {sorted(n for n in names if names.count(n) > 1)}")
    ordered = sorted(found, key=lambda s: GROUPS.index(s.group))  # stable: declaration order within a group
    return {s.name: s for s in ordered}


def enum_of(kind: Any) -> type[Enum] | None:
    """The Enum class of a setting's type (``Method | None`` -> Method), or None."""
    for candidate in (kind, *typing.get_args(kind)):
        if isinstance(candidate, type) and issubclass(candidate, Enum):
            return candidate
    return None


def defaults() -> dict[str, Any]:
    """Every setting at the value a user gets by not giving it."""
    return {name: s.default for name, s in settings().items()}


def value_of(workload: Any, s: Setting) -> Any:
    """The value of a workload setting on a built workload (``lora.rank``), or None when the
    workload has no such field (a training setting on a serving workload)."""
    obj = workload
    for part in (s.attr or "").split("."):
        if not part or not hasattr(obj, part):
            return None
        obj = getattr(obj, part)
    return obj


def cli_flag(name: str) -> str:
    """How a setting is written on memest's command line (``micro_batch_size`` -> ``--micro-batch-size``):
    the one spelling rule, for the ``memest hf`` commands the planner prints and for the CLI."""
    return "--" + name.replace("_", "-")


def given_flags(values: dict[str, Any], always: frozenset[str] = frozenset()) -> dict[str, str]:
    """The settings in ``values`` that differ from their defaults (and those in ``always``, whatever their
    value) as ``memest hf`` flags: flag -> value (an empty value for a switch such as ``--train`` or
    ``--keep-grads``), in setting order."""
    out: dict[str, str] = {}
    for name, s in settings().items():
        value = values.get(name, s.default)
        if value is None or (value == s.default and name not in always):
            continue
        if isinstance(value, bool):
            if value or s.off:
                out[cli_flag(name if value else (s.off or name))] = ""
            continue
        if isinstance(value, list | tuple):  # a repeatable setting: each value after its flag
            out[cli_flag(name)] = f" {cli_flag(name)} ".join(map(str, value))
            continue
        out[cli_flag(name)] = str(value.value if isinstance(value, Enum) else value)
    return out


def reads(workload: Any, s: Setting) -> bool:
    """True when a built workload reads the setting (its mode, method and engine; see :class:`Setting`)."""
    training = hasattr(workload, "method")
    if s.attr is None or s.scope == ("serving" if training else "training"):
        return False
    if training and s.methods and workload.method.value not in s.methods:
        return False
    if training or s.engine is None:
        return True
    return workload.engine.value in (s.engine if isinstance(s.engine, tuple) else (s.engine,))


def describe(workload: Any) -> str:
    """One line of a workload's main settings: the mode, the stack and its recipe in words (with why it
    was assumed), then each setting whose ``describe`` says to
    show it (``seq_len 8192``; a setting at None is shown as ``= default``); the parallel degrees in the
    engine's words where the workload has them (``layout_words``: llama.cpp's layer split)."""
    parts = [workload.mode]
    stack = getattr(workload, "stack", None)
    if stack is not None:
        words = stacks.recipe_words(stack, workload.precision, workload.optimizer, stacks.resolve_framework(workload),
                                    workload.parallelism.zero_stage, workload.half_dtype)
        parts.append(words + (f" (assumed: {workload.stack_assumed})" if workload.stack_assumed else ""))
    layout = workload.layout_words() if hasattr(workload, "layout_words") else None
    for name, s in settings().items():
        if s.describe is None or not reads(workload, s) or (layout and s.group == "parallelism"):
            continue
        value = value_of(workload, s)
        if s.describe == "changed" and value == s.field_default:
            continue
        shown = "= default" if value is None else str(value.value if isinstance(value, Enum) else value)
        parts.append(f"{name} {shown}")
    return " · ".join(parts + ([layout] if layout else []))
