"""``memest calibrate --report``: the records' errors per device and stack, and the runtime constants they imply
(:mod:`memest.calibration.summary`), as rich tables. Bytes in GiB (2^30), shares as percentages."""

from __future__ import annotations

from typing import Any

from memest.report.units import percent, size

_SHOWN = {
    "cuda_context_bytes": "CUDA context + handles (non-torch, one process)",
    "allocator_slack": "allocator slack (reserved - allocated) / allocated",
    "context_before_tensors_bytes": "CUDA context before any tensor",
    "nccl_bytes": "NCCL (non-torch of several processes - of one)",
}


def _value(name: str, v: float) -> str:
    return size(v) if name.endswith("_bytes") else percent(v)


def render_summary(groups: Any, where: str) -> Any:
    """A rich renderable: one table per device and stack (figure, records, median and worst error), the
    constants below it."""
    from rich.console import Group
    from rich.text import Text

    from memest.report.tables import Narrowest, name_col, new_table, number_col

    parts: list[Any] = [Text(f"{sum(g.records for g in groups)} calibration records in {where}", style="bold")]
    for g in groups:
        origins = ", ".join(f"{n} {name}" for name, n in g.origins)
        title = f"{g.device} ({g.arch}) · {g.stack} · {g.records} record{'s' if g.records != 1 else ''} ({origins})"
        if g.out_of_memory:
            title += f" · {g.out_of_memory} out of memory (not compared)"
        table = new_table(name_col("figure"), number_col("n"), number_col("median error"), number_col("worst error"),
                          title=title)
        for f in g.figures:
            table.add_row(f.name, str(f.n), f"{f.median_error:+.1%}", f"{f.worst_error:+.1%}")
        parts.append(Narrowest(table))
        for c in g.constants:
            spread = f"{_value(c.name, c.low)} .. {_value(c.name, c.high)}" if c.n > 1 else "one record"
            parts.append(Text(f"  {_SHOWN.get(c.name, c.name)}: {_value(c.name, c.value)} (median of {c.n}; {spread})"))
    if any(g.constants for g in groups):
        parts.append(Text("--use-calibration applies these constants (per device family) to later estimates.",
                          style="dim"))
    return Group(*parts)
