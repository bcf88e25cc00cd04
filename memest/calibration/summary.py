"""All calibration records summarized: how far the estimates were off, per device and stack, and the runtime
constants the records imply (``memest calibrate --report``).

A record (:mod:`memest.calibration.records`: from ``memest calibrate``, :class:`memest.integrations.hf.MemestCallback`
or :func:`memest.track`) holds the comparison rows of each rank (predicted, measured, error = (predicted -
measured) / measured). Records are grouped by the device that ran (its name as the runtime gave it) and the
job's stack (``hf-trainer``, ``pytorch``, ...; serving records by their engine); per group and figure the
median error and the worst (largest in size, its sign kept) over every rank of every record that ran within
memory (an out-of-memory run's figures are those at the failure: counted, not compared).

The constants per group are the medians of what each record implies (:func:`memest.calibration.constants.implied`,
the rule ``calibrate/update_constants.py`` applies per device family): the CUDA context and library handles
(non-torch memory of one-process runs), the caching allocator's slack, the context before any tensor, and NCCL's
share, the non-torch memory of runs of several processes less that of one process. Pure Python, no torch.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memest.calibration.constants import IMPLIED, implied


@dataclass(frozen=True, slots=True)
class FigureStats:
    """One compared figure over a group's records.

    Attributes:
        name: The row (``peak allocated``, ``weights``, ...).
        n: Errors counted (ranks x records).
        median_error: Their median, (predicted - measured) / measured.
        worst_error: The one of largest size, sign kept.
    """

    name: str
    n: int
    median_error: float
    worst_error: float


@dataclass(frozen=True, slots=True)
class Constant:
    """A runtime constant a group's records imply.

    Attributes:
        name: ``cuda_context_bytes``, ``allocator_slack``, ``context_before_tensors_bytes``, ``nccl_bytes``.
        value: The median (bytes as an int; the slack as a share).
        n: Records it comes from.
        low: The smallest of them.
        high: The largest.
        measured: What was measured, in words.
    """

    name: str
    value: int | float
    n: int
    low: int | float
    high: int | float
    measured: str


@dataclass(frozen=True, slots=True)
class Group:
    """The records of one device and stack.

    Attributes:
        device: The device as the runtime named it (``NVIDIA H100 80GB HBM3``, ``cpu``).
        arch: Its memest family (``hopper``, ``cpu``).
        stack: The job's stack, or ``serve (<engine>)``.
        records: Records in the group.
        out_of_memory: Of them, runs that ran out of memory.
        origins: What made them (``calibrate``, ``hf-callback``, ``track``), with counts.
        figures: Per compared figure, in the order first seen.
        constants: The implied runtime constants.
    """

    device: str
    arch: str
    stack: str
    records: int
    out_of_memory: int
    origins: tuple[tuple[str, int], ...]
    figures: tuple[FigureStats, ...]
    constants: tuple[Constant, ...]


def stack_of(rec: dict[str, Any]) -> str:
    """A record's stack (``serve (<engine>)`` for serving; ``unknown`` when the record has none)."""
    workload = rec.get("inputs", {}).get("workload") or {}
    if rec.get("inputs", {}).get("mode") == "serve":
        return f"serve ({workload.get('engine') or 'unknown'})"
    return str(workload.get("stack") or "unknown")


def summarize(records: Iterable[tuple[Path, dict[str, Any]]]) -> tuple[Group, ...]:
    """The groups of ``(file, record)`` pairs, ordered by device then stack."""
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for _, rec in records:
        device = rec.get("device") or {}
        by_key[(str(device.get("name") or device.get("catalog_name") or "unknown"), stack_of(rec))].append(rec)
    return tuple(_group(device, stack, recs) for (device, stack), recs in sorted(by_key.items()))


def _group(device: str, stack: str, recs: list[dict[str, Any]]) -> Group:
    errors: dict[str, list[float]] = {}
    found: dict[str, list[int | float]] = defaultdict(list)
    origins: dict[str, int] = defaultdict(int)
    oom = 0
    for rec in recs:
        origins[str(rec.get("origin") or "calibrate")] += 1
        if rec.get("outcome") != "ok":
            oom += 1
            continue
        for rank in (rec.get("comparison") or {}).get("ranks", []):
            for row in rank.get("rows", []):
                if row.get("error") is not None:
                    errors.setdefault(row["name"], []).append(float(row["error"]))
        for name, value in implied(rec).items():
            found[name].append(value)
    figures = tuple(FigureStats(name, len(v), statistics.median(v), max(v, key=abs)) for name, v in errors.items())
    constants = [_constant(name, found[name], IMPLIED[name]) for name in
                 ("cuda_context_bytes", "allocator_slack", "context_before_tensors_bytes") if found.get(name)]
    if found.get("non_torch_multi_bytes") and found.get("cuda_context_bytes"):
        nccl = [v - statistics.median(found["cuda_context_bytes"]) for v in found["non_torch_multi_bytes"]]
        constants.append(_constant("nccl_bytes", nccl, "non-torch memory of several processes - of one process "
                                                       "(NCCL communicators)"))
    arch = str((recs[0].get("device") or {}).get("arch") or "unknown")
    return Group(device, arch, stack, len(recs), oom, tuple(sorted(origins.items())), figures, tuple(constants))


def _constant(name: str, values: list[Any], measured: str) -> Constant:
    median = statistics.median(values)
    integer = name.endswith("_bytes")
    return Constant(name, round(median) if integer else round(median, 4), len(values),
                    min(values) if integer else round(min(values), 4), max(values) if integer else round(max(values), 4),
                    measured)


def summary_dict(groups: tuple[Group, ...]) -> dict[str, Any]:
    """Plain JSON data of the groups (``memest calibrate --report --json``)."""
    return {"groups": [{
        "device": g.device, "arch": g.arch, "stack": g.stack, "records": g.records, "out_of_memory": g.out_of_memory,
        "origins": dict(g.origins),
        "figures": [{"name": f.name, "n": f.n, "median_error": f.median_error, "worst_error": f.worst_error}
                    for f in g.figures],
        "constants": [{"name": c.name, "value": c.value, "n": c.n, "min": c.low, "max": c.high,
                       "measured": c.measured} for c in g.constants],
    } for g in groups]}
