"""``memest sweep``: one setting swept, as a rich table, JSON and Markdown."""

from __future__ import annotations

import math
from typing import Any

from memest import __version__
from memest.devices import GiB
from memest.planning.sweep import Sweep
from memest.report.estimate import describe_workload, workload_share
from memest.report.plan import largest_dict
from memest.report.tables import Narrowest, name_col, new_table, number_col
from memest.report.units import gib, percent, size_label


def _sweep_terms(result: Sweep) -> list[tuple[str, str]]:
    """(name, kind) of every term at any point, in first-appearance order."""
    seen: dict[str, str] = {}
    for point in result.points:
        if point.estimate is not None:
            for t in point.estimate.per_device.terms:
                seen.setdefault(t.name, t.kind.value)
    return list(seen.items())


def _sweep_grid(result: Sweep) -> tuple[list[str], list[list[str]]]:
    """Column labels (one per point) and rows (one per term, then the totals and the verdict)."""
    labels = [size_label(p.value) for p in result.points]
    rows: list[list[str]] = []
    for name, kind in _sweep_terms(result):
        row = [name, kind]
        for p in result.points:
            n = next((t.bytes for t in p.estimate.per_device.terms if t.name == name), 0) if p.estimate else None
            row.append("-" if n is None else f"{n / GiB:,.2f}")
        rows.append(row)
    for label, attr in (("peak allocated", "allocated_bytes"), ("peak reserved", "reserved_bytes"),
                        ("device used", "device_used_bytes")):
        rows.append([label, ""] + [f"{getattr(p.estimate.per_device, attr) / GiB:,.2f}" if p.estimate else "-"
                                   for p in result.points])
    words = {"fits": "yes", "queues": "queues", "does_not_fit": "NO"}  # queues: starts, the rest wait
    rows.append(["fits", ""] + [words[p.verdict.kind] if p.verdict else "error" for p in result.points])
    return labels, rows


def _largest_line(result: Sweep) -> str:
    q = result.largest
    usable = gib(result.usable_bytes)
    if not result.headroom_applied:
        share = workload_share(result.points[0].workload) if result.points else "vLLM's gpu_memory_utilization"
        usable_words = f"the engine's pool and {usable} per device; --headroom not applied: {share} sets its share"
    else:
        usable_words = f"{usable} usable per device, {percent(result.headroom)} headroom"
    if q.value is None:
        first = f"{result.flag} {result.points[0].value:,}" if result.points else f"{result.flag} {q.step:,}"
        return (f"Nothing fits: even the smallest value swept, {first}, does not fit, nor any smaller one "
                f"({usable_words}).")
    if q.limit != "memory":
        return f"Largest {result.flag} that fits: {q.value:,}, the most the estimator accepts: {q.limit}"
    if not result.headroom_applied and result.setting == "batch_size":  # the pool does not depend on the batch
        more = " (the search cap; larger may fit)" if q.capped else \
            f"; with {q.value + q.step:,} the engine starts and the sequences beyond {q.value:,} wait"
        return f"Largest {result.flag} held at once: {q.value:,}{more} ({usable_words})."
    more = " (the search cap; larger may fit)" if q.capped else f"; {q.value + q.step:,} does not"
    return f"Largest {result.flag} that fits: {q.value:,}{more} ({usable_words})."


def render_sweep(result: Sweep) -> Any:
    """A rich renderable of a sweep: GiB per term (rows) at each point (columns)."""
    from rich.console import Group
    from rich.text import Text

    labels, rows = _sweep_grid(result)
    title = (f"{result.spec.name} on {result.count} × {result.device.name} ({gib(result.device.memory_bytes)}) — "
             f"GiB per device by {result.flag}")
    # narrower: without the kind column, then the points split over several tables
    layouts = [_sweep_table(title, labels, rows, kinds=True)]
    for per in sorted({math.ceil(len(labels) / k) for k in range(1, len(labels) + 1)}, reverse=True):
        chunks = [range(i, min(i + per, len(labels))) for i in range(0, len(labels), per)]
        layouts.append(Group(*(_sweep_table(title if n == 0 else None, labels, rows, kinds=False, points=c)
                               for n, c in enumerate(chunks))))
    parts: list[Any] = [Text(describe_workload(result.points[0].workload), style="dim"), Narrowest(*layouts),
                        Text(_largest_line(result), style="bold")]
    for p in result.points:
        if p.error:
            parts.append(Text(f"{result.flag} {p.value:,}: {p.error}", style="yellow"))
    return Group(*parts)


def _sweep_table(title: str | None, labels: list[str], rows: list[list[str]], *, kinds: bool,
                 points: range | None = None) -> Any:
    """The sweep's terms (rows) at the ``points`` (columns, default all), with or without the kind column."""
    points = points if points is not None else range(len(labels))
    table = new_table(name_col("term"), *([name_col("kind", "dim")] if kinds else []),
                      *(number_col(labels[i]) for i in points), title=title)
    n_terms = len(rows) - 4
    for i, row in enumerate(rows):
        if i == n_terms:
            table.add_section()
        table.add_row(row[0], *([row[1]] if kinds else []), *(row[2 + j] for j in points))
    return table


def sweep_to_markdown(result: Sweep) -> str:
    """The sweep table as GitHub Markdown."""
    labels, rows = _sweep_grid(result)
    lines = [f"**{result.spec.name}** on {result.count} × {result.device.name} — GiB per device by {result.flag}", "",
             "| term | kind | " + " | ".join(labels) + " |", "|---|---|" + "---:|" * len(labels)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += ["", _largest_line(result)]
    return "\n".join(lines) + "\n"


def sweep_to_dict(result: Sweep) -> dict[str, Any]:
    """The JSON document of ``memest sweep --json``."""
    return {
        "memest_version": __version__,
        "model": result.spec.name,
        "device": {"name": result.device.name, "memory_bytes": result.device.memory_bytes, "count": result.count},
        "setting": result.setting,
        "headroom": result.headroom,
        "usable_bytes": result.usable_bytes,
        "largest": largest_dict(result.largest),
        "points": [
            {
                "value": p.value,
                "fits": p.verdict.fits if p.verdict else None,
                "verdict": p.verdict.kind if p.verdict else None,
                "error": p.error,
                "allocated_bytes": p.estimate.per_device.allocated_bytes if p.estimate else None,
                "reserved_bytes": p.estimate.per_device.reserved_bytes if p.estimate else None,
                "device_used_bytes": p.estimate.per_device.device_used_bytes if p.estimate else None,
                "terms": [{"name": t.name, "kind": t.kind.value, "bytes": t.bytes}
                          for t in (p.estimate.per_device.terms if p.estimate else ())],
            }
            for p in result.points
        ],
    }
