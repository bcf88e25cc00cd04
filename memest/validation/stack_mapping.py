"""Each published training case mapped through its stack, not through hand-picked settings.

A training case of ``benchmarks/data/validation_cases.json`` names its stack (``stack``: a
:class:`memest.workload.Stack` value), the settings its source states, by memest's setting keywords
(``stack_settings``: nothing the source leaves open), and, where the source publishes its config file, that
file at the commit of the measurement (``config_files``: repo, path, commit, the stored copy under
``benchmarks/data/configs/`` and which reader reads it). :func:`mapping` turns a case into the settings a user
of that stack would give memest: the stack, the stated settings and the config files memest has a reader for
(``reader: memest``: DeepSpeed JSON, accelerate YAML, TrainingArguments / trl YAML, axolotl, LLaMA-Factory),
which :func:`memest.workload.resolve.resolve` completes with the stack's defaults
(:data:`memest.workload.STACKS`) exactly as it does for ``memest hf --stack S --config FILE``. A file whose
reader is being written (torchtune recipe YAML, torchtitan TOML: ``reader: pending``) is stored, not read:
its memory-relevant keys are transcribed into ``stack_settings`` and the case says
:data:`PENDING`. A file of a format memest has no reader for (litgpt's config hub YAML, fms-acceleration's
scenario list, a shell launch line: ``reader: none``) is stored and transcribed the same way. When a reader
lands, its cases' entries become ``reader: memest`` and ``stack_settings`` keeps only what the source states
beside the file (the README's batch, a table's GPU count).

:func:`differences` names every setting where the hand mapping of :mod:`memest.validation.training` and the
stack mapping disagree, and where the stack mapping's value came from (stated, a config file, or the stack's
default): the report lists them beside both errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from memest.devices import Device
from memest.spec import ModelSpec
from memest.validation.cases import CASES_JSON
from memest.workload import TrainingConfig, files, resolve_framework
from memest.workload.resolve import resolve
from memest.workload.settings import settings

CONFIG_DIR = CASES_JSON.parent
"""Where a case's ``config_files[].file`` is relative to (``benchmarks/data``)."""

PENDING = "file mapping pending the torchtune/torchtitan reader"
"""What a case whose config file has no reader yet (``reader: pending``) says."""

READERS = ("memest", "pending", "none")
"""The values of ``config_files[].reader``: read through memest's config readers; a reader being written;
no reader for that format."""

FULL_KINDS = ("train_full", "train_multi_gpu")
"""Case kinds that are full training (``train``); the others name their fine-tuning method."""

_NOT_COMPARED = frozenset({"stack", "framework", "allow_stack_change", "config", "train", "finetune", "serve",
                           "trust_remote_code", "revision", "gpu", "gpus", "headroom", "fsdp"})
"""Settings :func:`differences` does not compare as they are: the stack is the mapping itself, the framework is
compared as resolved, the mode as the method, the device and counts through the parallel degrees."""


@dataclass(frozen=True)
class StackMapping:
    """How one case maps through its stack.

    Attributes:
        stack: The stack (a :class:`memest.workload.Stack` value).
        values: The settings given to :func:`memest.workload.resolve.resolve`, by keyword: the mode, the stack,
            the stated settings and ``config`` (the stored files memest reads).
        files: The stored config files read (``reader: memest``).
        via: How the case was mapped, in words (``stack + deepspeed_config.yaml``, or :data:`PENDING`).
        stated: The settings the source states (``stack_settings``).
        from_files: The settings the read files give.
    """

    stack: str
    values: Mapping[str, Any]
    files: tuple[Path, ...]
    via: str
    stated: frozenset[str]
    from_files: frozenset[str]


def mapping(case: Mapping[str, Any]) -> StackMapping:
    """The stack mapping of one published training case (a dict of the cases file).

    Raises:
        KeyError: the case names no ``stack`` or ``stack_settings``.
        ValueError: a ``config_files`` entry with an unknown ``reader``, or a stored file that is missing.
    """
    stated = dict(case["stack_settings"])
    values: dict[str, Any] = {} if "finetune" in stated else {"train": True} if case["kind"] in FULL_KINDS else \
        {"finetune": case["kind"]}
    values |= {"stack": case["stack"]} | stated
    entries = case.get("config_files", [])
    for entry in entries:
        if entry["reader"] not in READERS:
            raise ValueError(f"{case['id']}: config file {entry['path']} has reader {entry['reader']!r}; "
                             f"one of {READERS}")
        if not (CONFIG_DIR / entry["file"]).is_file():
            raise ValueError(f"{case['id']}: config file {entry['file']} is not stored under {CONFIG_DIR}")
    read = tuple(CONFIG_DIR / e["file"] for e in entries if e["reader"] == "memest")
    from_files: frozenset[str] = frozenset()
    if read:
        values["config"] = [str(p) for p in read]
        from_files = frozenset(files.read(read).values)
    via = "stack"
    if read:
        via += " + " + ", ".join(p.name for p in read)
    if any(e["reader"] == "pending" for e in entries):
        via += "; " + PENDING
    unread = [Path(e["path"]).name for e in entries if e["reader"] == "none"]
    if unread:
        via += f"; no reader for {', '.join(unread)} (its settings transcribed)"
    return StackMapping(case["stack"], values, read, via, frozenset(stated), from_files - frozenset(stated))


def workload(m: StackMapping, spec: ModelSpec, device: Device) -> TrainingConfig:
    """The workload ``m`` resolves to for ``spec`` on ``device``: the stack's defaults fill what it does not say.

    Raises:
        InputError: the settings do not describe a job memest runs (the message names the setting).
    """
    w = resolve(dict(m.values), spec, device)
    assert isinstance(w, TrainingConfig)
    return w


def _value(w: TrainingConfig, attr: str) -> Any:
    obj: Any = w
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _shown(value: Any) -> str:
    return str(value.value if isinstance(value, Enum) else value)


def differences(hand: TrainingConfig, stack: TrainingConfig, m: StackMapping) -> tuple[str, ...]:
    """Every setting the two mappings of a case give different values, as ``name: hand X, <origin> Y``, where
    origin says where the stack mapping's value came from: ``stated`` (the source), ``file`` (a config file read)
    or ``stack default``. The method's settings only (LoRA settings under LoRA / QLoRA, ...); the framework as
    each resolves it."""
    out = []
    method = hand.method.value
    if hand.method is not stack.method:
        out.append(f"method: hand {method}, stated {stack.method.value}")
    for name, s in settings().items():
        if s.attr is None or s.scope == "serving" or name in _NOT_COMPARED or (s.methods and method not in s.methods):
            continue
        h, v = _value(hand, s.attr), _value(stack, s.attr)
        if h != v:
            out.append(f"{name}: hand {_shown(h)}, {_origin(name, m)} {_shown(v)}")
    fh, fs = resolve_framework(hand), resolve_framework(stack)
    if fh is not fs:
        out.append(f"framework: hand {fh.value}, stack {fs.value}")
    return tuple(out)


def _origin(name: str, m: StackMapping) -> str:
    if name in m.stated:
        return "stated"
    if name in m.from_files:
        return "file"
    return "stack default"
