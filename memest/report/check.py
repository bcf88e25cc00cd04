"""``memest check``'s output: each log's figures beside memest's, the error, and the term of the largest gap
(for a training log, the gap at the step's peak and the estimate's largest terms).

:func:`render_check` is the table, :func:`check_to_dict` the ``--json`` (integer bytes). Sizes print in
GiB from 1 GiB up, else MiB (llama.cpp's buffers), as :func:`memest.report.size` does.
"""

from __future__ import annotations

from typing import Any

from memest.check import Check, Row, logged_device
from memest.report import size
from memest.report.tables import Narrowest, name_col, new_table, number_col
from memest.result import Kind


def value(n: float, unit: str) -> str:
    """A figure in its unit, labelled."""
    if unit == "bytes":
        return size(n)
    if unit == "x":
        return f"{n:,.2f}x"
    if unit == "bytes/token":
        return f"{n:,.0f} B/token"
    return f"{n:,.0f} {unit}"


def _error(r: Row) -> str:
    return "-" if r.error is None else f"{r.error:+.2%}"


def _term(r: Row) -> str:
    return r.term.value if r.term is not None else "-"


def gap_line(c: Check) -> str:
    """Which term explains the largest gap, in words."""
    r = c.largest_gap
    if r is None:
        return "No size figure to compare."
    delta = r.predicted - r.measured
    if c.log.training and r.term is None:
        line = (f"Gap at the step's peak ({r.figure}): memest {'+' if delta >= 0 else '-'}{size(abs(delta))} against "
                f"the log ({_error(r)}).")
        if c.estimate is not None:
            shown = {Kind.RUNTIME} | ({Kind.ALLOCATOR} if r.figure != "peak_reserved" else set())
            terms = sorted((t for t in c.estimate.per_device.terms if t.kind not in shown), key=lambda t: -t.bytes)[:4]
            line += " memest's largest terms: " + ", ".join(f"{t.name} {size(t.bytes)}" for t in terms) + "."
        return line
    line = (f"Largest gap: {_term(r)} ({r.figure}): memest {'+' if delta >= 0 else '-'}{size(abs(delta))} "
            f"against the log ({_error(r)}).")
    pool = next((x for x in c.rows if x.figure == "kv_cache_memory"), None)
    if c.log.engine == "vllm" and pool is not None and pool is not r:
        line += (f" vLLM's KV pool is the budget less the other terms: memest's is {_error(pool)} off, "
                 f"{size(abs(pool.predicted - pool.measured))}.")
    return line


def _header(c: Check) -> str:
    version = f" {c.log.version}" if c.log.version else ""
    arithmetic = f", memest's {c.log.engine} {c.engine_version} arithmetic" if c.engine_version else ""
    device = f"the logged device ({size(c.device.memory_bytes)})" if logged_device(c.device) else c.device.name
    return f"{c.name}: {c.log.format}{version} log · {c.model} on {device}{arithmetic}"


def render_check(c: Check) -> Any:
    """One log's comparison as a table (a rich renderable) with the gap line and notes below."""
    from rich.console import Group
    from rich.text import Text

    title = _header(c)
    wide = new_table(name_col("figure"), name_col("term"), number_col("logged"), number_col("memest"),
                     number_col("error"), title=title)
    narrow = new_table(name_col("figure"), number_col("logged"), number_col("memest"), number_col("error"), title=title)
    for r in c.rows:
        wide.add_row(r.figure, _term(r), value(r.measured, r.unit), value(r.predicted, r.unit), _error(r))
        narrow.add_row(r.figure, value(r.measured, r.unit), value(r.predicted, r.unit), _error(r))
    lines = [gap_line(c)]
    if c.not_logged:
        lines.append(f"Not in the log (not compared): {', '.join(c.not_logged)}.")
    if c.not_compared:
        lines.append(f"Logged but not estimated by memest: {', '.join(c.not_compared)}.")
    lines += [f"Note: {n}." for n in c.notes]
    return Group(Narrowest(wide, narrow), *(Text(line) for line in lines), Text(""))


def check_to_dict(c: Check) -> dict[str, Any]:
    """One log's comparison as JSON-ready data (sizes in integer bytes)."""
    gap = c.largest_gap
    return {
        "log": c.name, "engine": c.log.engine, "format": c.log.format, "training": c.log.training, "engine_version_logged": c.log.version,
        "engine_version_modelled": c.engine_version, "model_logged": c.log.model, "model": c.model,
        "device": c.device.name, "device_memory_bytes": c.device.memory_bytes, "settings_logged": dict(c.log.settings),
        "figures": [{"figure": r.figure, "term": r.term.value if r.term else None, "unit": r.unit,
                     "logged": r.measured, "memest": r.predicted, "error": r.error, "line": r.line} for r in c.rows],
        "largest_gap": None if gap is None else {"figure": gap.figure, "term": gap.term.value if gap.term else None,
                                                 "delta": gap.predicted - gap.measured, "unit": gap.unit},
        "not_logged": list(c.not_logged), "not_compared": list(c.not_compared), "notes": list(c.notes),
    }
