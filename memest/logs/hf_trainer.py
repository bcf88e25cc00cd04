"""The HF Trainer's memory metrics: its log's ``***** train metrics *****`` block, ``train_results.json`` /
``all_results.json``, or ``trainer_state.json``'s ``log_history``.

With ``skip_memory_metrics=False`` the Trainer's ``TrainerMemoryTracker`` (transformers
``trainer_utils.py``, 4.5-4.57) reports, per stage, ``alloc_delta`` = ``torch.cuda.memory_allocated()`` at
the stage's end minus at its start and ``peaked_delta`` = ``max_memory_allocated()`` minus the end's
(the peak is reset at the stage's start), and since 4.12 ``before_init_mem_gpu``, what was allocated
before ``Trainer.__init__``. ``__init__`` moves the model to the device, so:

- weights as loaded (``init_allocated``) = ``before_init_mem_gpu`` + ``init_mem_gpu_alloc_delta``;
- the training step's peak allocated (``peak_allocated``) = that + ``train_mem_gpu_alloc_delta`` +
  ``train_mem_gpu_peaked_delta`` (the train stage starts where ``__init__`` ended);
- what training left allocated (``train_states``) = ``train_mem_gpu_alloc_delta``: the optimizer states,
  and the gradients where ``zero_grad`` keeps them (torch < 2.0's ``set_to_none=False``).

The log's block prints ``metrics_format``'s ``f"{v >> 20}MB"`` (MiB, floored); the JSON files, and the
metrics dict ``Trainer.log`` prints on the console (``{'train_runtime': ..., 'train_mem_gpu_alloc_delta':
693125632, ...}``), hold bytes.
A command line in the log (``run_clm.py --model_name_or_path gpt2 --per_device_train_batch_size 1 --fp16
...``) gives the model and settings; the metrics alone give neither (the check then names what to pass).
"""

from __future__ import annotations

import json
import re
from typing import Any

from memest.devices import MiB
from memest.logs._text import first, keep
from memest.logs.record import EngineLog, Logged

FIGURE_LINES = ("init_mem_gpu_alloc_delta", "train_mem_gpu_alloc_delta", "train_mem_gpu_peaked_delta")
"""The metrics named when a log has none of them (``skip_memory_metrics=False`` makes the Trainer report them)."""

MARKERS = (r"\b(?:train|init)_mem_gpu_(?:alloc|peaked)_delta\b", r"\bbefore_init_mem_gpu\b")

KEYS = ("before_init_mem_gpu", "init_mem_gpu_alloc_delta", "train_mem_gpu_alloc_delta", "train_mem_gpu_peaked_delta")

SEQ_FLAGS = ("max_seq_length", "max_length", "block_size", "max_source_length", "model_max_length")
"""Script flags that set the training sequence length (transformers ``examples/pytorch``, trl)."""


def detect(text: str) -> bool:
    """True when ``text`` holds the HF Trainer's memory metrics."""
    return any(re.search(m, text) for m in MARKERS)


def _metrics(text: str) -> tuple[dict[str, int], dict[str, str], dict[str, Any]]:
    """The memory metrics in bytes, the line each was read from, and a JSON file's other fields."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            doc = json.loads(stripped)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            found: dict[str, Any] = {k: doc[k] for k in KEYS if isinstance(doc.get(k), int)}
            for entry in doc.get("log_history", []) if isinstance(doc.get("log_history"), list) else []:
                if isinstance(entry, dict):
                    found.update({k: entry[k] for k in KEYS if isinstance(entry.get(k), int)})
            return found, {k: f'"{k}": {v}' for k, v in found.items()}, doc
    out: dict[str, int] = {}
    lines: dict[str, str] = {}
    for key in KEYS:
        m = first(rf"^[ \t]*{key}\s*=\s*(-?\d+)\s*MB\s*$", text, re.MULTILINE)
        if m is not None:
            out[key] = int(m.group(1)) * MiB
            lines[key] = m.group(0).strip()
        else:  # the metrics dict ``Trainer.log`` prints on the console: bytes
            d = first(rf"['\"]{key}['\"]:\s*(-?\d+)\b", text)
            if d is not None:
                out[key] = int(d.group(1))
                lines[key] = d.group(0)
    return out, lines, {}


def _flag(text: str, name: str) -> str | None:
    """A script flag's value in the log's command line (``--name value`` / ``--name=value``; ``$VAR`` read from
    a ``VAR=value`` assignment before it)."""
    m = first(rf"--{name}[= ]+(\S+)", text)
    if m is None:
        return None
    value = m.group(1)
    var = re.fullmatch(r"\$\{?(\w+)\}?", value)
    if var is not None:
        assigned = first(rf"\b{var.group(1)}=(\S+?);?(?:\s|$)", text)
        return assigned.group(1) if assigned else None
    return value


def _switch(text: str, name: str) -> bool | None:
    """A boolean script flag: True when given bare or true/1, False when false/0, None when absent."""
    m = first(rf"--{name}(?:[= ]+(true|false|1|0|True|False))?(?=\s|$)", text)
    if m is None:
        return None
    return m.group(1) is None or m.group(1).lower() in ("true", "1")


def _settings(text: str, doc: dict[str, Any]) -> tuple[dict[str, Any], str | None, list[str]]:
    out: dict[str, Any] = {}
    notes: list[str] = []
    model = _flag(text, "model_name_or_path")
    batch = _flag(text, "per_device_train_batch_size")
    if batch is not None and batch.isdigit():
        out["micro_batch_size"] = int(batch)
    elif isinstance(doc.get("train_batch_size"), int):  # trainer_state.json: the per-device batch (4.3x on)
        out["micro_batch_size"] = doc["train_batch_size"]
    accum = _flag(text, "gradient_accumulation_steps")
    if accum is not None and accum.isdigit():
        out["grad_accum_steps"] = int(accum)
    for name in SEQ_FLAGS:
        value = _flag(text, name)
        if value is not None and value.isdigit():
            out["seq_len"] = int(value)
            break
    target = _flag(text, "max_target_length")
    if target is not None and target.isdigit():
        out["target_len"] = int(target)
    if model is not None:  # a command line: its precision switches say what ran (neither: fp32)
        # --fp16 is the Trainer's fp16=True (fp32 params, autocast fp16: memest's precision fp16 without DeepSpeed)
        out["precision"] = "fp16" if _switch(text, "fp16") else "amp" if _switch(text, "bf16") else "fp32"
        if _switch(text, "adafactor"):
            out["optimizer"] = "adafactor"
        if _switch(text, "gradient_checkpointing"):
            out["recompute"] = "full"
    optim = _flag(text, "optim")
    if optim is not None:
        from memest.workload.files.trainer import OPTIM

        if optim in OPTIM:
            out["optimizer"] = OPTIM[optim].value
    if _flag(text, "deepspeed") is not None:
        notes.append("the run used DeepSpeed (--deepspeed): pass its JSON as a config file for its stage and offload")
    return out, model, notes


def parse(text: str) -> EngineLog:
    """The job and the figures of an HF Trainer's memory metrics."""
    metrics, lines, doc = _metrics(text)
    settings, model, notes = _settings(text, doc)
    figures: dict[str, Logged | None] = {}
    before = metrics.get("before_init_mem_gpu", 0)
    if "init_mem_gpu_alloc_delta" in metrics:
        figures["init_allocated"] = Logged(before + metrics["init_mem_gpu_alloc_delta"], "bytes",
                                           _joined(lines, ("before_init_mem_gpu", "init_mem_gpu_alloc_delta")))
        if "train_mem_gpu_alloc_delta" in metrics and "train_mem_gpu_peaked_delta" in metrics:
            figures["peak_allocated"] = Logged(before + sum(metrics[k] for k in KEYS[1:]), "bytes", _joined(lines, KEYS))
    if "train_mem_gpu_alloc_delta" in metrics:
        figures["train_states"] = Logged(metrics["train_mem_gpu_alloc_delta"], "bytes",
                                         lines["train_mem_gpu_alloc_delta"])
        notes.append("train_mem_gpu_alloc_delta counts the gradients too where the run kept them between steps "
                     "(torch < 2.0: zero_grad(set_to_none=False)); give set_grads_to_none=false for such a run")
    return EngineLog(engine="hf-trainer", format="HF Trainer", model=model, settings=settings, figures=keep(figures),
                     training=True, notes=tuple(notes))


def _joined(lines: dict[str, str], keys: tuple[str, ...]) -> str:
    return " / ".join(lines[k] for k in keys if k in lines)
