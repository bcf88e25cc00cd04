"""One table of memest's predictions against measurements: calibration records and published cases.

``python benchmarks/accuracy.py`` writes :func:`markdown` to ``benchmarks/accuracy.md``; ``--readme``
also rewrites the accuracy section of README.md (:func:`readme_section`, between ``<!-- accuracy:start -->``
and ``<!-- accuracy:end -->``).

Two sources, compared like with like, error = (predicted - measured) / measured:

- **calibration records** (``calibrate/results/*.jsonl``, written by ``memest calibrate``): the
  newest record of each case is re-estimated with the formulas of this checkout — its model, flags and device as
  recorded — and compared with what was measured: peak allocated (CPU: the profiler timeline;
  CUDA: ``max_memory_allocated``), and on CUDA peak reserved and device used (NVML). The largest
  rank's figure is used (what must fit). Out-of-memory records are listed with the verdict.
- **published cases** (``benchmarks/data/validation_cases.json``): the rows of the per-task modules,
  imported, not re-derived. A module takes part if it exposes either ``rows()`` (objects with
  ``case.id``, ``case.figure``/``case.metric``, ``case.measured_bytes`` and ``predicted_bytes``:
  :mod:`memest.validation.training`) or ``load_cases()`` plus ``comparisons(case)`` (objects with
  ``case``, ``figure``, ``predicted``, ``measured``, ``unit``, ``fitted``:
  :mod:`memest.validation.serving`). A case its module cannot estimate is listed as not modelled.

The README shows one row per case (its figure with the largest error) and the summary; benchmarks/accuracy.md
has every figure.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memest.calibration.compare import local_device
from memest.calibration.records import read_records, resolve_reference
from memest.calibration.request import calibration_workload, job_from_flags
from memest.errors import MemestError
from memest.estimate import estimate
from memest.report import size
from memest.sources import load_model

RESULTS = Path(__file__).resolve().parents[2] / "calibrate" / "results"
"""The calibration records of a source checkout (``memest calibrate`` writes them)."""
START, END = "<!-- accuracy:start -->", "<!-- accuracy:end -->"


@dataclass(frozen=True)
class AccuracyRow:
    """One predicted figure against its measurement.

    Attributes:
        source: ``calibrate/<device>`` or the report module (``serving``, ``training``).
        case: Record (``suite/case`` or id) or published case id.
        figure: What is compared.
        predicted: memest's value (bytes when ``unit`` is ``bytes``).
        measured: The measurement, same unit.
        unit: ``bytes``, ``GiB``, ``tokens``, ...
        note: ``fitted`` when a constant was fitted to this measurement; empty otherwise.
    """

    source: str
    case: str
    figure: str
    predicted: float
    measured: float
    unit: str = "bytes"
    note: str = ""

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted - self.measured) / self.measured


@dataclass(frozen=True)
class Skipped:
    """A case or record that gave no figure, and why."""

    source: str
    case: str
    why: str


# ---- calibration records ----


def latest_records(paths: Iterable[Path]) -> list[tuple[Path, dict[str, Any]]]:
    """The newest record of each suite case (older ones are history), and every untagged record."""
    latest: dict[tuple[str, str], tuple[Path, dict[str, Any]]] = {}
    for path, rec in read_records(paths):
        key = (path.stem, f"{rec['suite']}/{rec['case']}" if rec.get("case") else rec["id"])
        if key not in latest or rec["id"] > latest[key][1]["id"]:
            latest[key] = (path, rec)
    return list(latest.values())


def record_rows(paths: Iterable[Path]) -> Iterator[AccuracyRow | Skipped]:
    """The newest record of every case re-estimated with this checkout's formulas."""
    for path, rec in latest_records(paths):
        source = f"calibrate/{path.stem}"
        name = f"{rec['suite']}/{rec['case']}" if rec.get("case") else rec["id"]
        measured = rec["measured"]
        if rec.get("outcome") != "ok":
            status = rec["comparison"]["verdict"]["status"]
            yield Skipped(source, name, f"did not fit ({measured[0].get('error')}); verdict {status}")
            continue
        try:
            est = _re_estimate(rec)
        except MemestError as exc:
            yield Skipped(source, name, f"cannot re-estimate: {exc}")
            continue
        rank = est.ranks[0]
        worst = max(measured, key=lambda m: m.get("peak_allocated_bytes") or 0)
        yield AccuracyRow(source, name, "peak allocated", rank.allocated_bytes, worst["peak_allocated_bytes"])
        if rec["device"]["backend"] == "cuda":
            if worst.get("peak_reserved_bytes"):
                yield AccuracyRow(source, name, "peak reserved", rank.reserved_bytes, worst["peak_reserved_bytes"])
            if worst.get("device_used_bytes"):
                yield AccuracyRow(source, name, "device used", rank.device_used_bytes, worst["device_used_bytes"])


def _re_estimate(rec: dict[str, Any]) -> Any:
    inputs, dev = rec["inputs"], rec["device"]
    spec = load_model(resolve_reference(rec["model"]["reference"]))
    job = job_from_flags(inputs["flags"])
    steps = inputs["steps"] if inputs["mode"] == "serve" else None
    workload = calibration_workload(job, spec, inputs["nproc"], steps)
    device = local_device(dev["backend"], dev["name"], dev["memory_bytes"], rec["versions"].get("device_capability"))
    return estimate(spec, workload, device)


# ---- published cases, from the per-task modules ----


def report_modules() -> list[tuple[str, Any]]:
    """The per-task modules of published cases, by source name."""
    from memest.validation import serving, training

    return [("serving", serving), ("training", training)]


def published_rows(modules: list[tuple[str, Any]]) -> Iterator[AccuracyRow | Skipped]:
    """The rows each report module computes (see the module docstring for the two shapes)."""
    for source, module in modules:
        if hasattr(module, "rows"):
            for r in module.rows():
                case = getattr(r.case, "id", r.case)
                figure = getattr(r.case, "figure", None) or getattr(r.case, "metric", "")
                yield AccuracyRow(source, case, figure, r.predicted_bytes, r.case.measured_bytes)
        elif hasattr(module, "load_cases") and hasattr(module, "comparisons"):
            for case in module.load_cases():
                try:
                    found = module.comparisons(case)
                except MemestError as exc:
                    yield Skipped(source, case["id"], f"not modelled: {exc}")
                    continue
                if not found:
                    yield Skipped(source, case["id"], "not modelled by its report")
                for c in found:
                    yield AccuracyRow(source, c.case, c.figure, c.predicted, c.measured, c.unit,
                                      "fitted" if getattr(c, "fitted", False) else "")


# ---- the report ----


def summarize(rows: list[AccuracyRow]) -> list[tuple[str, int, float, AccuracyRow]]:
    """(source, figures, median |error|, worst row) per source, then ``all``; fitted figures left out."""
    scored = [r for r in rows if r.note != "fitted" and r.measured]
    groups: dict[str, list[AccuracyRow]] = {}
    for r in scored:
        groups.setdefault(r.source.split("/")[0] if r.source.startswith("calibrate") else r.source, []).append(r)
    if scored:
        groups["all"] = scored
    return [(name, len(g), statistics.median(abs(r.error) for r in g), max(g, key=lambda r: abs(r.error)))
            for name, g in groups.items()]


def _value(n: float, unit: str) -> str:
    if unit == "bytes":
        return size(int(n))
    if unit == "GiB":
        return f"{n:,.3f} GiB"
    return f"{n:,.2f} {unit}" if isinstance(n, float) and not n.is_integer() else f"{int(n):,} {unit}"


def _summary_table(rows: list[AccuracyRow]) -> list[str]:
    lines = ["| source | figures | median \\|error\\| | worst |", "|---|---:|---:|---|"]
    for name, n, median, worst in summarize(rows):
        lines.append(f"| {name} | {n} | {median:.1%} | {worst.error:+.1%} ({worst.case}, {worst.figure}) |")
    return lines


def _rows_table(rows: Iterable[AccuracyRow]) -> list[str]:
    lines = ["| source | case | figure | predicted | measured | error |", "|---|---|---|---:|---:|---:|"]
    for r in rows:
        note = " (fitted)" if r.note else ""
        lines.append(f"| {r.source} | {r.case} | {r.figure}{note} | {_value(r.predicted, r.unit)} | "
                     f"{_value(r.measured, r.unit)} | {r.error:+.1%} |")
    return lines


def per_case(rows: list[AccuracyRow]) -> list[AccuracyRow]:
    """One row per case: its non-fitted figure with the largest |error|."""
    best: dict[tuple[str, str], AccuracyRow] = {}
    for r in rows:
        if r.note == "fitted":
            continue
        key = (r.source, r.case)
        if key not in best or abs(r.error) > abs(best[key].error):
            best[key] = r
    return list(best.values())


def readme_section(rows: list[AccuracyRow]) -> str:
    """The README's accuracy section (summary, then one row per case)."""
    intro = ("Generated by `python benchmarks/accuracy.py --readme`; every figure, and what each compares, "
             "in [benchmarks/accuracy.md](benchmarks/accuracy.md). Error = (predicted − measured) / measured; "
             "each case shows its figure with the largest error.")
    lines = [START, "", intro, "", *_summary_table(rows), "", *_rows_table(per_case(rows)), "", END]
    return "\n".join(lines)


def markdown(rows: list[AccuracyRow], skipped: list[Skipped]) -> str:
    """benchmarks/accuracy.md."""
    lines = [
        "# Accuracy: memest against measurements",
        "",
        ("Generated by `python benchmarks/accuracy.py`. Calibration records (`calibrate/results/*.jsonl`, "
         "written by `memest calibrate`) are re-estimated with this checkout's formulas; published cases "
         "(`benchmarks/data/validation_cases.json`) come from the per-task reports (`benchmarks/*_cases.py`). "
         "Like with like: peak allocated against allocated, reserved against reserved, nvidia-smi against device "
         "used. Error = (predicted − measured) / measured; *fitted* figures depend on a constant fitted to that "
         "measurement and are left out of the summary. CPU records measure tensor bytes with the profiler's "
         "memory timeline (see memest/calibration/measure.py); bytes shown in MiB below 1 GiB."),
        "",
        "## Summary",
        "",
        *_summary_table(rows),
        "",
        "## Every figure",
        "",
        *_rows_table(rows),
    ]
    if skipped:
        lines += ["", "## Without a figure", "", "| source | case | why |", "|---|---|---|"]
        lines += [f"| {s.source} | {s.case} | {s.why} |" for s in skipped]
    return "\n".join(lines) + "\n"


def collect() -> tuple[list[AccuracyRow], list[Skipped]]:
    """Every row and every skipped case, records first."""
    rows: list[AccuracyRow] = []
    skipped: list[Skipped] = []
    for item in [*record_rows(sorted(RESULTS.glob("*.jsonl"))), *published_rows(report_modules())]:
        (rows if isinstance(item, AccuracyRow) else skipped).append(item)
    return rows, skipped
