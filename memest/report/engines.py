"""``memest plan --serve --engine any``: the serving engines compared per device type, as a rich table, JSON
and Markdown (:mod:`memest.planning.engines`)."""

from __future__ import annotations

import math
from typing import Any

from memest import __version__
from memest.planning.engines import DeviceComparison, EngineComparison, EngineRow, EngineSetup
from memest.report.estimate import describe_workload
from memest.report.plan import describe_layout
from memest.report.tables import Narrowest, name_col, new_table, number_col, prose_col
from memest.report.units import CONFIRM, gib


def _row_dict(r: EngineRow) -> dict[str, Any]:
    return {"engine": r.engine.value, "kv_cache_tokens": r.kv_cache_tokens,
            "concurrent_sequences": r.concurrent_sequences, "fits": r.verdict == "fits", "verdict": r.verdict,
            "needed_bytes": r.needed_bytes, "skipped": r.skipped}


def _device_dict(d: DeviceComparison) -> dict[str, Any]:
    return {"device": d.device.name, "memory_bytes": d.device.memory_bytes, "count": d.count,
            "tp": d.parallelism.tp, "pp": d.parallelism.pp, "best": d.best.value if d.best else None,
            "engines": [_row_dict(r) for r in d.rows]}


def _usd(usd: float) -> float | None:
    return usd if math.isfinite(usd) else None


def _setup_dict(x: EngineSetup) -> dict[str, Any]:
    return {"device": x.device.name, "count": x.count, "tp": x.parallelism.tp, "pp": x.parallelism.pp,
            "engine": x.engine.value, "usd_per_hour": _usd(x.usd_per_hour),
            "concurrent_sequences": x.row.concurrent_sequences, "kv_cache_tokens": x.row.kv_cache_tokens,
            "needed_bytes": x.row.needed_bytes}


def engines_to_dict(c: EngineComparison, *, model: str) -> dict[str, Any]:
    """The JSON of ``memest plan --engine any --json`` (and :func:`memest.plan_memory` with ``engine="any"``):
    ``engine_comparison`` holds one entry per device type, each with its engines' rows and the best;
    ``setups`` the ``top`` best setups over every type and engine, ranked as ``ranking`` says (prices in
    ``prices_usd_per_hour``, null where a device has none)."""
    return {
        "memest_version": __version__,
        "model": model,
        "mode": "serve",
        "max_model_len": c.max_model_len,
        "batch_size": c.workload.batch_size,
        "headroom": c.headroom,
        "engine_comparison": [_device_dict(d) for d in c.devices],
        "ranking": ["usd_per_hour", "count", "-concurrent_sequences"],
        "prices_usd_per_hour": {d.device.name: _usd(c.prices.price(d.device)) for d in c.devices},
        "setups": [_setup_dict(x) for x in c.ranked],
        "confirm": CONFIRM,
    }


def _setup_line(c: EngineComparison, i: int, x: EngineSetup) -> str:
    usd = f"${x.usd_per_hour:,.2f}/h" if math.isfinite(x.usd_per_hour) else "no price"
    n = x.row.concurrent_sequences
    layout = describe_layout(c.workload.replace(engine=x.engine, parallelism=x.parallelism))
    return (f"{i}. {x.count} x {x.device.name} · {x.engine.value} ({layout}) · {usd} · holds {n:,} "
            f"sequence{'s' if n != 1 else ''} of {c.max_model_len:,} tokens")


def _setup_lines(c: EngineComparison) -> list[str]:
    """The ranked setups, with their heading (none when no engine fits anywhere)."""
    ranked = c.ranked
    if not ranked:
        return []
    head = ("Best setup" if c.top == 1 else f"Best {len(ranked)} setups") + \
        " over every engine (ranked by $/h, then devices, then sequences held):"
    return [head, *(_setup_line(c, i, x) for i, x in enumerate(ranked, 1))]


def _fits_words(r: EngineRow) -> str:
    if r.skipped is not None:
        return "skipped"
    return {"fits": "yes", "queues": "queues", "does_not_fit": "no"}.get(r.verdict or "", "-")


def _best_line(d: DeviceComparison, max_model_len: int) -> str:
    setup = f"{d.count} x {d.device.name}"
    if d.best is None:
        return f"{setup}: no engine fits"
    row = next(r for r in d.rows if r.engine is d.best)
    n = row.concurrent_sequences
    return f"{setup}: {d.best.value} holds the most, {n:,} sequence{'s' if n != 1 else ''} of {max_model_len:,} tokens at once"


def render_engines(c: EngineComparison, *, model: str) -> Any:
    """A rich renderable: one row per device type and engine, and the best engine of each type."""
    from rich.console import Group
    from rich.text import Text

    table = new_table(name_col("device"), number_col("devices"), name_col("engine"), number_col("KV tokens"),
                      number_col("sequences"), name_col("fits"), number_col("holds GiB"), prose_col("note", "dim"),
                      title=f"engines compared: {c.max_model_len:,} tokens per sequence, {c.workload.batch_size:,} asked")
    for d in c.devices:
        for i, r in enumerate(d.rows):
            table.add_row(d.device.name if i == 0 else "", str(d.count) if i == 0 else "",
                          r.engine.value + (" *" if r.engine is d.best else ""),
                          f"{r.kv_cache_tokens:,}" if r.skipped is None else "-",
                          f"{r.concurrent_sequences:,}" if r.skipped is None else "-", _fits_words(r),
                          gib(r.needed_bytes) if r.skipped is None else "-", r.skipped or "")
        table.add_section()
    parts: list[Any] = [Text.assemble(("Model   ", "bold"), model),
                        Text.assemble(("Job     ", "bold"), describe_workload(c.workload).replace(
                            f"engine {c.workload.engine.value}", "engine any")),
                        Narrowest(table)]
    parts += [Text(_best_line(d, c.max_model_len), style="bold" if d.best else "red") for d in c.devices]
    parts += [Text(line, style="bold" if i == 0 else "") for i, line in enumerate(_setup_lines(c))]
    parts.append(Text("* holds the most sequences of max_model_len on that device type; sequences: how many the "
                      "engine holds at once (0 when it does not start). " + CONFIRM, style="dim"))
    return Group(*parts)


def engines_to_markdown(c: EngineComparison, *, model: str) -> str:
    """The comparison as a GitHub Markdown table."""
    lines = [f"**{model}** — engines compared at {c.max_model_len:,} tokens per sequence", "",
             "| device | devices | engine | KV tokens | sequences | fits | note |", "|---|---:|---|---:|---:|---|---|"]
    for d in c.devices:
        for r in d.rows:
            lines.append(f"| {d.device.name} | {d.count} | {r.engine.value}{' **best**' if r.engine is d.best else ''} | "
                         + (f"{r.kv_cache_tokens:,} | {r.concurrent_sequences:,}" if r.skipped is None else "- | -")
                         + f" | {_fits_words(r)} | {r.skipped or ''} |")
    lines.append("")
    lines += [f"{_best_line(d, c.max_model_len)}  " for d in c.devices]
    setups = _setup_lines(c)
    if setups:
        lines += ["", f"**{setups[0]}**", "", *(f"{line}  " for line in setups[1:])]
    return "\n".join(lines) + "\n"
