"""DeepSpeed's JSON config (``deepspeed/runtime/config.py``, ``runtime/zero/config.py``).

Keys read: ``zero_optimization.stage``, ``zero_optimization.offload_optimizer.device`` /
``offload_param.device`` (``cpu`` / ``nvme`` = host), ``bf16.enabled`` / ``fp16.enabled``,
``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``. ``"auto"`` (filled by the HF Trainer from
its TrainingArguments) keeps memest's setting as given, else its default, and says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memest.workload.config import Offload, Precision, Stack
from memest.workload.files._common import Found, auto, typed

NAME = "a DeepSpeed JSON (zero_optimization, bf16, fp16, train_micro_batch_size_per_gpu)"
KEYS = frozenset({"zero_optimization", "bf16", "fp16", "train_micro_batch_size_per_gpu",
                  "train_batch_size", "gradient_accumulation_steps", "optimizer"})


def detect(doc: Any, text: str) -> bool:
    """Whether ``doc`` (the parsed file; ``text`` its text) is a DeepSpeed config: a mapping with one of its top-level :data:`KEYS`."""
    return isinstance(doc, dict) and bool(KEYS & set(doc))


def read(path: Path, doc: dict[str, Any]) -> Found:
    """The settings a DeepSpeed config implies, and the notes on what it left open."""
    return Found(*_deepspeed(path, doc))


def _deepspeed(path: Path, doc: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    values: dict[str, Any] = {"stack": Stack.DEEPSPEED}
    notes: list[str] = []
    zero = doc.get("zero_optimization", {})
    typed(path, "zero_optimization", zero, dict, "an object")
    stage = zero.get("stage", 0)
    if stage == "auto":
        auto(path, "zero_optimization.stage", "zero_stage", notes)
    else:
        values["zero_stage"] = typed(path, "zero_optimization.stage", stage, int, "0, 1, 2 or 3")
    offload = Offload.NONE
    for key, kind in (("offload_optimizer", Offload.OPTIMIZER), ("offload_param", Offload.PARAMS)):
        section = zero.get(key) or {}
        typed(path, f"zero_optimization.{key}", section, dict, "an object")
        if str(section.get("device", "none")).lower() in ("cpu", "nvme"):
            offload = kind if kind is Offload.PARAMS or offload is Offload.NONE else offload
    values["offload"] = offload
    for key, precision in (("bf16", Precision.MIXED), ("fp16", Precision.FP16)):
        enabled = (doc.get(key) or {}).get("enabled", False)
        if enabled == "auto":
            auto(path, f"{key}.enabled", "precision", notes)
        elif typed(path, f"{key}.enabled", enabled, bool, "true, false or \"auto\""):
            values["precision"] = precision
    for key, setting in (("train_micro_batch_size_per_gpu", "micro_batch_size"),
                         ("gradient_accumulation_steps", "grad_accum_steps")):
        if key not in doc:
            continue
        if doc[key] == "auto":
            auto(path, key, setting, notes)
        else:
            values[setting] = typed(path, key, doc[key], int, "a positive integer or \"auto\"")
    return values, notes
