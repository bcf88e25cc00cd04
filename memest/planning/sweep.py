"""Sweeps: the estimate at each value of one setting, to see where a job stops fitting.

``memest sweep MODEL --seq-len 1k..128k`` estimates the job at every value of the range and
reports each term per point; with ``--plot`` it draws them (:mod:`memest.report.plot`). The exact point
where the job stops fitting comes from the max query of :mod:`memest.planning.maxfit`, not from the grid.

Range syntax (:func:`parse_values`), sizes with k = 2^10 and M = 2^20 (``128k`` = 131072, as
context lengths are written):

- ``A..B``: A, 2A, 4A, ... up to B (powers of two when A is one);
- ``A..B:xF``: multiply by F each step; ``A..B:+S``: add S each step;
- ``A,B,C``: exactly these values;
- a single value: no sweep.

Both ends of a range are always included.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memest.devices import Device
from memest.errors import InputError
from memest.estimate import estimate
from memest.planning.fit import Verdict, usable_bytes, verdict
from memest.planning.maxfit import FLAGS, QUERIES, Largest, largest
from memest.result import Estimate
from memest.spec import ModelSpec
from memest.workload import TrainingConfig, Workload

SWEEPABLE = ("seq_len", "micro_batch_size", "batch_size", "max_model_len")
"""Settings a sweep can vary: the max-query settings of both modes."""

MAX_POINTS = 256
"""Most points one sweep may have."""

_SUFFIX = {"": 1, "k": 1 << 10, "m": 1 << 20}
_SIZE = re.compile(r"^\s*(\d+)\s*([kKmM]?)\s*$")


def parse_size(text: str, flag: str) -> int:
    """A positive integer with an optional k (x 1024) or M (x 1024^2) suffix: ``4k`` -> 4096.
    ``flag`` is the setting's keyword (``seq_len``), named in the error as a placeholder.

    Raises:
        InputError: not a positive integer with an optional k/M suffix.
    """
    m = _SIZE.match(text)
    if not m or int(m.group(1)) == 0:
        raise InputError(f"{{{flag}}} {text!r} is not a positive size; write e.g. 4096, 4k or 1M (k = 1024)",
                         field=flag)
    return int(m.group(1)) * _SUFFIX[m.group(2).lower()]


def parse_values(text: str, flag: str) -> tuple[int, ...]:
    """The values a sweep flag names (see the module docstring for the syntax), ascending.

    Raises:
        InputError: malformed sizes, an empty or descending range, a step that does not grow, or
            more than :data:`MAX_POINTS` values.
    """
    text = text.strip()
    if "," in text:
        values = sorted({parse_size(part, flag) for part in text.split(",") if part.strip()})
    elif ".." in text:
        bounds, _, step = text.partition(":")
        low_text, _, high_text = bounds.partition("..")
        low, high = parse_size(low_text, flag), parse_size(high_text, flag)
        if high < low:
            raise InputError(f"{{{flag}}} {text!r}: the range ends below its start; write LOW..HIGH, e.g. 1k..128k",
                             field=flag)
        values = _steps(low, high, step.strip(), flag, text)
    else:
        values = [parse_size(text, flag)]
    if not values:
        raise InputError(f"{{{flag}}} {text!r} names no value; write e.g. 1k..128k or 1k,4k,16k", field=flag)
    if len(values) > MAX_POINTS:
        raise InputError(f"{{{flag}}} {text!r} names more than {MAX_POINTS} points; use a larger step", field=flag)
    return tuple(values)


def _steps(low: int, high: int, step: str, flag: str, text: str) -> list[int]:
    add, factor = 0, 2
    if step.startswith("+"):
        add = parse_size(step[1:], flag)
    elif step[:1] in ("x", "*") and step[1:].isdigit() and int(step[1:]) >= 2:
        factor = int(step[1:])
    elif step:
        raise InputError(f"{{{flag}}} {text!r}: the step must be ':+N' (add N) or ':xF' with an integer F >= 2",
                         field=flag)
    values, v = [], low
    while v < high and len(values) <= MAX_POINTS:
        values.append(v)
        v = v + add if add else v * factor
    values.append(high)
    return values


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """The estimate at one value of the swept setting.

    Attributes:
        value: The setting's value.
        workload: The workload estimated.
        estimate: Its estimate (None when the estimator rejected the value).
        verdict: Its fit verdict (None likewise).
        error: Why the estimator rejected the value (an InputError's message), else None.
    """

    value: int
    workload: Workload
    estimate: Estimate | None
    verdict: Verdict | None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Sweep:
    """A sweep of one setting.

    Attributes:
        spec: The model.
        setting: The workload field swept (``seq_len``, ...).
        device: The accelerator.
        count: Devices in the job.
        headroom: Share of memory kept free.
        points: One per value, ascending.
        largest: The exact largest value that fits (bisection over the estimator).
    """

    spec: ModelSpec
    setting: str
    device: Device
    count: int
    headroom: float
    points: tuple[SweepPoint, ...]
    largest: Largest

    @property
    def flag(self) -> str:
        """The swept setting's CLI flag."""
        return FLAGS[self.setting]

    @property
    def headroom_applied(self) -> bool:
        """False for vLLM, whose gpu_memory_utilization sets its share (:mod:`memest.planning.fit`)."""
        return all(p.verdict.headroom_applied for p in self.points if p.verdict is not None)

    @property
    def usable_bytes(self) -> int:
        """Memory the job may use per device: capacity x (1 - headroom), or the capacity for vLLM."""
        return usable_bytes(self.device, self.headroom if self.headroom_applied else 0.0)


def sweep(spec: ModelSpec, workload: Workload, device: Device, setting: str, values: tuple[int, ...], *,
          headroom: float) -> Sweep:
    """Estimate ``workload`` with ``setting`` at each of ``values``.

    Raises:
        InputError: ``setting`` does not apply to the workload's mode (sweep ``--seq-len`` or
            ``--micro-batch-size`` for training, ``--batch-size`` or ``--max-model-len`` for serving).
    """
    mode = "train" if isinstance(workload, TrainingConfig) else "serve"
    if setting not in QUERIES[mode]:
        allowed = " or ".join(FLAGS[s] for s in QUERIES[mode])
        raise InputError(f"{FLAGS.get(setting, setting)} cannot be swept for a {workload.mode} job; sweep {allowed}")
    count = workload.parallelism.world_size
    points = []
    for value in values:
        w = workload.replace(**{setting: value})
        try:
            est = estimate(spec, w, device)
        except InputError as exc:
            points.append(SweepPoint(value, w, None, None, str(exc)))
            continue
        points.append(SweepPoint(value, w, est, verdict(est, device, count, headroom)))
    best = largest(spec, workload, device, setting, headroom=headroom)
    return Sweep(spec, setting, device, count, headroom, tuple(points), best)
