"""Settings from the config files users already have: a DeepSpeed JSON and an accelerate config YAML.

:func:`read` detects each file's format from its content (a JSON object with DeepSpeed's keys; a YAML
mapping with accelerate's ``distributed_type``), and returns the settings it implies by keyword, with
notes for what it left to someone else (DeepSpeed ``"auto"``: the HF Trainer fills it from its
TrainingArguments; memest keeps its own default and says so). Settings given explicitly win over a
file's (:func:`memest.workload.resolve.complete`).

DeepSpeed keys read (``deepspeed/runtime/config.py``, ``zero/config.py``): ``zero_optimization.stage``,
``zero_optimization.offload_optimizer.device`` / ``offload_param.device`` (``cpu`` / ``nvme`` = host),
``bf16.enabled`` / ``fp16.enabled``, ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``.
accelerate keys read (``accelerate/commands/config/config_args.py``): ``distributed_type`` (``NO``,
``MULTI_GPU``, ``FSDP``, ``DEEPSPEED``), ``mixed_precision`` (``no``, ``fp16``, ``bf16``),
``num_processes`` x ``num_machines``, ``fsdp_config.fsdp_sharding_strategy`` (a name or the
``ShardingStrategy`` number), ``fsdp_offload_params``, ``fsdp_activation_checkpointing``, and
``deepspeed_config`` (``zero_stage``, ``offload_optimizer_device``, ``offload_param_device``,
``gradient_accumulation_steps``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from memest.errors import InputError
from memest.workload.config import FsdpStrategy, Offload, Precision, Stack

FORMATS = "a DeepSpeed JSON (zero_optimization, bf16, fp16, train_micro_batch_size_per_gpu) or an accelerate " \
          "config YAML (distributed_type)"
_DEEPSPEED_KEYS = frozenset({"zero_optimization", "bf16", "fp16", "train_micro_batch_size_per_gpu",
                             "train_batch_size", "gradient_accumulation_steps", "optimizer"})
_SHARDING = {"1": FsdpStrategy.FULL_SHARD, "2": FsdpStrategy.SHARD_GRAD_OP, "3": FsdpStrategy.NO_SHARD,
             "4": FsdpStrategy.HYBRID_SHARD}
"""accelerate's numbered ``fsdp_sharding_strategy`` values (``torch.distributed.fsdp.ShardingStrategy`` + 1)."""


def read(paths: Iterable[str | Path]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The settings the files imply (a later file's value wins) and the notes on what they left open.

    Raises:
        InputError: a file that cannot be read, is malformed (the message names the file and line),
            is of no known format, or holds a value of the wrong type.
    """
    values: dict[str, Any] = {}
    notes: list[str] = []
    for path in paths:
        found, said = read_one(Path(path))
        values |= found
        notes += said
    return values, tuple(notes)


def read_one(path: Path) -> tuple[dict[str, Any], list[str]]:
    """One file's settings and notes (see :func:`read`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{{config}} {path}: cannot be read ({exc.__class__.__name__}); pass a DeepSpeed JSON or an "
                         "accelerate config YAML", field="config") from None
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{{config}} {path}: line {exc.lineno}: malformed JSON ({exc.msg})",
                             field="config") from None
    else:
        doc = _yaml(path, text)
    if isinstance(doc, dict) and "distributed_type" in doc:
        return _accelerate(path, doc)
    if isinstance(doc, dict) and _DEEPSPEED_KEYS & set(doc):
        return _deepspeed(path, doc, "")
    raise InputError(f"{{config}} {path}: not a format memest reads; pass {FORMATS}", field="config")


def _yaml(path: Path, text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or "cannot be parsed"
        raise InputError(f"{{config}} {path}: {where}malformed YAML ({problem})", field="config") from None


def _typed(path: Path, key: str, value: Any, kind: type, what: str) -> Any:
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        raise InputError(f"{{config}} {path}: {key} is {value!r}; expected {what}", field="config")
    return value


def _auto(path: Path, key: str, setting: str, notes: list[str]) -> None:
    notes.append(f"{path.name}: {key} is \"auto\" (the HF Trainer fills it from its TrainingArguments); "
                 f"memest uses {setting} as given, else its default")


def _deepspeed(path: Path, doc: dict[str, Any], prefix: str) -> tuple[dict[str, Any], list[str]]:
    values: dict[str, Any] = {"stack": Stack.DEEPSPEED}
    notes: list[str] = []
    zero = doc.get("zero_optimization", {})
    _typed(path, "zero_optimization", zero, dict, "an object")
    stage = zero.get("stage", 0)
    if stage == "auto":
        _auto(path, "zero_optimization.stage", "zero_stage", notes)
    else:
        values["zero_stage"] = _typed(path, "zero_optimization.stage", stage, int, "0, 1, 2 or 3")
    offload = Offload.NONE
    for key, kind in (("offload_optimizer", Offload.OPTIMIZER), ("offload_param", Offload.PARAMS)):
        section = zero.get(key) or {}
        _typed(path, f"zero_optimization.{key}", section, dict, "an object")
        if str(section.get("device", "none")).lower() in ("cpu", "nvme"):
            offload = kind if kind is Offload.PARAMS or offload is Offload.NONE else offload
    values["offload"] = offload
    for key, precision in (("bf16", Precision.MIXED), ("fp16", Precision.FP16)):
        enabled = (doc.get(key) or {}).get("enabled", False)
        if enabled == "auto":
            _auto(path, f"{key}.enabled", "precision", notes)
        elif _typed(path, f"{key}.enabled", enabled, bool, "true, false or \"auto\""):
            values["precision"] = precision
    for key, setting in (("train_micro_batch_size_per_gpu", "micro_batch_size"),
                         ("gradient_accumulation_steps", "grad_accum_steps")):
        if key not in doc:
            continue
        if doc[key] == "auto":
            _auto(path, key, setting, notes)
        else:
            values[setting] = _typed(path, key, doc[key], int, "a positive integer or \"auto\"")
    return values, notes


def _accelerate(path: Path, doc: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    kind = str(doc["distributed_type"]).upper()
    values: dict[str, Any] = {}
    notes: list[str] = []
    processes = _typed(path, "num_processes", doc.get("num_processes", 1), int, "an integer")
    machines = _typed(path, "num_machines", doc.get("num_machines", 1), int, "an integer")
    values["gpus"] = max(1, processes) * max(1, machines)
    mixed = str(doc.get("mixed_precision", "no")).lower()
    if kind == "FSDP":
        values["stack"] = Stack.ACCELERATE
        fsdp = doc.get("fsdp_config") or {}
        _typed(path, "fsdp_config", fsdp, dict, "a mapping")
        strategy = str(fsdp.get("fsdp_sharding_strategy", "FULL_SHARD"))
        try:
            values["fsdp"] = _SHARDING.get(strategy) or FsdpStrategy(strategy.lower())
        except ValueError:
            raise InputError(f"{{config}} {path}: fsdp_config.fsdp_sharding_strategy is {strategy!r}; expected "
                             "FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD or NO_SHARD", field="config") from None
        if _typed(path, "fsdp_offload_params", fsdp.get("fsdp_offload_params", False), bool, "true or false"):
            values["offload"] = Offload.PARAMS
        if _typed(path, "fsdp_activation_checkpointing", fsdp.get("fsdp_activation_checkpointing", False), bool,
                  "true or false"):
            values["recompute"] = "full"
        values["precision"] = {"bf16": Precision.FSDP2, "fp16": Precision.FP16, "no": Precision.FP32}.get(mixed)
    elif kind == "DEEPSPEED":
        ds = doc.get("deepspeed_config") or {}
        _typed(path, "deepspeed_config", ds, dict, "a mapping")
        values["stack"] = Stack.DEEPSPEED
        values["zero_stage"] = _typed(path, "deepspeed_config.zero_stage", ds.get("zero_stage", 0), int, "0-3")
        params = str(ds.get("offload_param_device", "none")).lower() in ("cpu", "nvme")
        optim = str(ds.get("offload_optimizer_device", "none")).lower() in ("cpu", "nvme")
        values["offload"] = Offload.PARAMS if params else Offload.OPTIMIZER if optim else Offload.NONE
        if "gradient_accumulation_steps" in ds:
            values["grad_accum_steps"] = _typed(path, "deepspeed_config.gradient_accumulation_steps",
                                                ds["gradient_accumulation_steps"], int, "an integer")
        values["precision"] = {"bf16": Precision.MIXED, "fp16": Precision.FP16, "no": Precision.FP32}.get(mixed)
    elif kind in ("MULTI_GPU", "NO"):  # DDP over the processes (the stack: the job's, else the HF Trainer)
        values["precision"] = {"bf16": Precision.AMP, "fp16": Precision.AMP, "no": Precision.FP32}.get(mixed)
    else:
        raise InputError(f"{{config}} {path}: distributed_type {kind} is not modelled; memest reads NO, MULTI_GPU, "
                         "FSDP and DEEPSPEED", field="config")
    return {k: v for k, v in values.items() if v is not None}, notes
