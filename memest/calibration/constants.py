"""Runtime constants from calibration records, each traceable to the runs it came from.

Two constants per device family (``arch``), the ones :mod:`memest.estimate.runtime` reads from
``memest/data/calibrated.json``:

- ``cuda_context_bytes``: the non-torch memory of a one-process CUDA run after its steps (NVML
  process used - reserved; the CUDA context plus lazily loaded kernels and library handles): what
  the estimate's ``runtime.cuda_context`` term must cover for *device used*. Median over records.
- ``allocator_slack``: (peak reserved - peak allocated) / peak allocated of one-process CUDA
  training runs. Median over records.

Only successful runs count (an out-of-memory run's reserved figure is the allocator giving up).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from memest.calibration.measure import Measurement
from memest.calibration.records import read_records, record_ref
from memest.devices import Device
from memest.errors import InputError

SCHEMA = 1
ABOUT = ("Runtime constants measured by `memest calibrate`, per device family (arch). Written by "
         "calibrate/update_constants.py from calibrate/results/*.jsonl; each entry names the records it comes from. "
         "An empty section means the defaults in memest/estimate/runtime.py (with their published sources) apply.")


IMPLIED = {
    "cuda_context_bytes": "NVML process used - reserved after the steps (one process)",
    "allocator_slack": "(peak reserved - peak allocated) / peak allocated, training",
    "context_before_tensors_bytes": "device memory the process used before its first tensor (calibrate)",
    "non_torch_multi_bytes": "NVML process used - reserved after the steps, rank 0 of several processes",
}
"""What :func:`implied` reads from a record, by name."""


def implied(rec: dict[str, Any]) -> dict[str, int | float]:
    """The runtime constants one record implies (rank 0's measurement; none for a CPU run or one that ran out
    of memory): :data:`IMPLIED`. ``cuda_context_bytes`` and ``allocator_slack`` come from one-process runs
    only (NCCL's buffers and a second rank's context are not the context); ``non_torch_multi_bytes`` is the
    same non-torch figure of a run of several processes (NCCL's communicators on top of the context)."""
    device = rec.get("device", {})
    if device.get("backend") != "cuda" or rec.get("outcome") != "ok" or not rec.get("measured"):
        return {}
    m = Measurement.from_dict(rec["measured"][0])
    one = rec["inputs"].get("nproc") == 1
    out: dict[str, int | float] = {}
    if m.non_torch_bytes is not None and m.non_torch_bytes > 0:
        out["cuda_context_bytes" if one else "non_torch_multi_bytes"] = m.non_torch_bytes
    if one and rec["inputs"]["mode"] != "serve" and m.peak_allocated_bytes and m.peak_reserved_bytes is not None:
        out["allocator_slack"] = (m.peak_reserved_bytes - m.peak_allocated_bytes) / m.peak_allocated_bytes
    if m.cuda_context_bytes:
        out["context_before_tensors_bytes"] = m.cuda_context_bytes
    return out


def derive(records: Iterable[tuple[Path, dict[str, Any]]], root: Path | None = None) -> dict[str, Any]:
    """The contents of ``calibrated.json`` from ``(file, record)`` pairs."""
    context: dict[str, list[tuple[int, str]]] = defaultdict(list)
    slack: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for path, rec in records:
        found = implied(rec)
        arch = rec.get("device", {}).get("arch") or "unknown"
        ref = record_ref(path, rec, root)
        if "cuda_context_bytes" in found:
            context[arch].append((int(found["cuda_context_bytes"]), ref))
        if "allocator_slack" in found:
            slack[arch].append((float(found["allocator_slack"]), ref))
    return {
        "schema": SCHEMA,
        "about": ABOUT,
        "cuda_context_bytes": {a: _entry(v, IMPLIED["cuda_context_bytes"], integer=True)
                               for a, v in sorted(context.items())},
        "allocator_slack": {a: _entry(v, IMPLIED["allocator_slack"]) for a, v in sorted(slack.items())},
    }


def _entry(values: list[tuple[Any, str]], measured: str, *, integer: bool = False) -> dict[str, Any]:
    numbers = [v for v, _ in values]
    median = statistics.median(numbers)
    return {
        "value": round(median) if integer else round(median, 4),
        "n": len(numbers),
        "min": min(numbers) if integer else round(min(numbers), 4),
        "max": max(numbers) if integer else round(max(numbers), 4),
        "measured": measured,
        "records": [ref for _, ref in values],
    }


RESULTS_DIR = Path("calibrate") / "results"
"""Where ``memest calibrate`` (and the integrations) write records by default, relative to the working folder:
what ``use_calibration`` reads."""


def with_user_constants(device: Device, folder: Path = RESULTS_DIR) -> Device:
    """``device`` carrying the runtime constants the records in ``folder`` imply for its family (:func:`derive`'s
    rule: medians over one-process CUDA runs that ran within memory), for ``use_calibration``; a family the records
    do not cover keeps memest's constants, and the estimate says so (:func:`memest.estimate.runtime.calibration_note`).

    Raises:
        InputError: ``folder`` holds no records.
    """
    import warnings

    files = sorted(folder.glob("*.jsonl")) if folder.is_dir() else []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a cut line is skipped here; 'memest calibrate --report' names it
        records = list(read_records(files))
    if not records:
        raise InputError(f"{{use_calibration}} reads your calibration records in {str(folder)!r}, and there are none: "
                         "run 'memest calibrate MODEL ...' on your device first (or train with "
                         "memest.integrations.hf.MemestCallback), or drop {use_calibration}", field="use_calibration")
    data = derive(records)
    found = tuple((name, data[name][device.arch]["value"]) for name in ("cuda_context_bytes", "allocator_slack")
                  if device.arch in data[name])
    n = max((data[name][device.arch]["n"] for name, _ in found), default=0)
    total = f"{len(records)} record{'s' if len(records) != 1 else ''}"
    source = f"{folder.as_posix()}, {n} of {total}" if found else f"{folder.as_posix()}, {total}"
    return dataclasses.replace(device, runtime_constants=found, runtime_source=source)
