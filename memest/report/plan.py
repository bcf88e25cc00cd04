"""``memest plan``: the setups that fit, as a rich table, JSON and Markdown."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from memest import __version__
from memest.devices import Device, GiB
from memest.planning.maxfit import Largest
from memest.planning.search import Fit, Plan, hf_command, most_devices, setup_flags
from memest.report.estimate import describe_model, describe_workload, finite, workload_share
from memest.report.tables import Narrowest, name_col, new_table, number_col, prose_col
from memest.report.units import CONFIRM, gib, percent, plural
from memest.result import plain
from memest.workload import (
    Engine,
    Method,
    Parallelism,
    ServingConfig,
    TrainingConfig,
    Workload,
    capability_refusal,
    resolve_framework,
    runs_on,
    software,
    training_refusal,
    workload_notes,
)


def describe_layout(w: Workload) -> str:
    """Parallel degrees of a setup (``tp 2 · pp 1 · dp 4``; ep and cp only when above 1), or the engine's
    words for its split (:meth:`~memest.workload.ServingConfig.layout_words`)."""
    layout = w.layout_words() if isinstance(w, ServingConfig) else None
    if layout:
        return layout
    par = w.parallelism
    parts = [f"tp {par.tp}", f"pp {par.pp}"]
    if isinstance(w, TrainingConfig):
        parts.append(f"dp {par.dp}")
    parts += [f"{n} {getattr(par, n)}" for n in ("cp", "ep") if getattr(par, n) > 1]
    return " · ".join(parts)


def describe_settings(w: Workload, host_bytes: int = 0) -> str:
    """The settings a planner varies, where they are not plain (``zero 3 · recompute full · ...``)."""
    parts: list[str] = []
    if isinstance(w, TrainingConfig):
        if w.parallelism.zero_stage:  # with the backend that shards it (the HF Trainer's ZeRO: DeepSpeed)
            parts.append(f"zero {w.parallelism.zero_stage} ({resolve_framework(w).value})")
        if w.parallelism.sequence_parallel:
            parts.append("sequence parallel")
        if w.recompute.value != "none":
            parts.append(f"recompute {w.recompute.value}")
        parts.append(f"mbs {w.micro_batch_size} x accum {w.grad_accum_steps}")
        if w.optimizer.value != "adamw":
            parts.append(w.optimizer.value)
        if w.offload.value != "none":
            parts.append(f"offload {w.offload.value}" + (f" (host {gib(host_bytes)}/node)" if host_bytes else ""))
        if w.method.value != "full":
            parts.append(w.method.value)
    else:
        if w.quantization != "none":
            parts.append(f"{w.quantization} weights")
        if w.kv_cache_dtype != "auto":
            parts.append(f"kv {w.kv_cache_dtype}")
    return " · ".join(parts) or "-"


_LIMIT_WORDS = {"micro_batch_size": "mbs", "seq_len": "seq", "batch_size": "seqs", "max_model_len": "len"}


def describe_limits(limits: tuple[Largest, ...]) -> str:
    """The max queries of a fit (``mbs ≤ 3 · seq ≤ 6,415``)."""
    parts = []
    for q in limits:
        word = _LIMIT_WORDS.get(q.setting, q.setting)
        if q.value is None:
            parts.append(f"{word} none")
        elif q.limit != "memory":
            parts.append(f"{word} ≤ {q.value:,} (model limit)")
        else:
            parts.append(f"{word} {'≥' if q.capped else '≤'} {q.value:,}")
    return " · ".join(parts) or "-"


def largest_dict(q: Largest) -> dict[str, Any]:
    return {"setting": q.setting, "value": q.value, "step": q.step, "capped": q.capped, "limit": q.limit,
            "evaluated": q.evaluated}


def _fit_dict(p: Plan, rank: int, f: Fit) -> dict[str, Any]:
    s, v = f.setup, f.verdict
    per = f.estimate.per_device
    return {
        "rank": rank,
        "device": s.device.name,
        "count": s.count,
        "usd_per_hour": finite(s.cost.usd_per_hour),
        "cost": {"usd_per_hour": finite(s.cost.usd_per_hour), "communication": s.cost.communication,
                 "disruption": s.cost.disruption, "changes": s.cost.changes},
        "lossless": s.lossless,
        "notes": list(s.notes),
        "flags": setup_flags(s.workload, s.count, p.workload, s.device),
        "parallelism": plain(s.workload.parallelism),
        "workload": plain(s.workload),
        "memory_bytes": s.device.memory_bytes,
        "allocated_bytes": per.allocated_bytes,
        "reserved_bytes": per.reserved_bytes,
        "device_used_bytes": per.device_used_bytes,
        "needed_bytes": v.needed_bytes,
        "high_bytes": v.high_bytes,
        "usable_bytes": v.usable_bytes,
        "free_bytes": v.free_bytes,
        "margin_bytes": v.margin_bytes,
        "host_bytes_per_node": f.estimate.host_bytes,
        "largest": {q.setting: largest_dict(q) for q in f.limits},
    }


def plan_to_dict(p: Plan, *, model: str | None = None, given: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The JSON document of ``memest plan --json`` (ints for bytes; every fit, not only the top).

    With ``given`` (the user's workload flags, :func:`memest.workload.settings.given_flags`), each
    fit has ``command``: the ``memest hf`` line that estimates it.
    """
    fits = [_fit_dict(p, i + 1, f) for i, f in enumerate(p.fits)]
    if given is not None:
        for doc, f in zip(fits, p.fits):
            doc["command"] = _fit_command(p, f, model, given)
    return {
        "memest_version": __version__,
        "model": {"name": p.spec.name, "model_type": p.spec.model_type, "num_params": p.spec.num_params,
                  "max_position_embeddings": p.spec.max_position_embeddings},
        "mode": p.workload.mode,
        "workload": plain(p.workload),
        "headroom": p.headroom,
        "ranking": ["usd_per_hour", "communication", "disruption", "changes"],
        "allow_method_change": p.space.allow_method_change,
        "allow_quantization": p.space.allow_quantization,
        "global_batch_size": p.space.global_batch_size,
        "host_memory_bytes": p.space.host_memory_bytes,
        "prices_usd_per_hour": {c.device.name: finite(p.space.prices.price(c.device)) for c in p.space.devices},
        "evaluated": p.evaluated,
        "setups": p.setups,
        "headroom_applied": _plan_headroom_applied(p),
        "notes": list(plan_notes(p)),
        "fits": fits,
        "no_fit": [{"device": c.device.name, "max_count": c.max_count} for c in p.no_fit],
        "widenings": list(p.widenings),
        "does_not_run_on": [c.device.name for c in p.not_run],
        "confirm": CONFIRM,
    }


def _plan_rows(p: Plan, top: int) -> list[list[str]]:
    out = []
    for i, f in enumerate(p.fits[:top]):
        s, v = f.setup, f.verdict
        out.append([
            str(i + 1),
            f"{s.count} × {s.device.name}",
            f"{s.cost.usd_per_hour:,.2f}" if math.isfinite(s.cost.usd_per_hour) else "no price",
            describe_layout(s.workload),
            describe_settings(s.workload, f.estimate.host_bytes),
            f"{v.needed_bytes / GiB:,.2f}",
            f"{v.free_bytes / GiB:,.2f} ({v.free_bytes / s.device.memory_bytes:.0%})",
            describe_limits(f.limits),
        ])
    return out


_PLAN_COLUMNS = ("#", "devices", "$/h", "parallelism", "settings", "peak GiB/device", "free GiB", "largest that fits")


def _plan_table(p: Plan, top: int) -> Any:
    """The fits, one row each; on a narrow console devices, price, parallelism and settings share a
    column, and peak and free memory another."""
    kinds = (number_col, name_col, number_col, prose_col, prose_col, number_col, number_col, prose_col)
    wide = new_table(*(column(header) for column, header in zip(kinds, _PLAN_COLUMNS, strict=True)))
    narrow = new_table(number_col("#"), prose_col("setup"), number_col("GiB/device"), prose_col("largest that fits"))
    for n, devices, cost, layout, settings, peak, free, largest in _plan_rows(p, top):
        wide.add_row(n, devices, cost, layout, settings, peak, free, largest)
        narrow.add_row(n, f"{devices} · ${cost}/h\n{layout}\n{settings}", f"{peak} peak\n{free} free", largest)
    return Narrowest(wide, narrow)


def _plan_headroom_applied(p: Plan) -> bool:
    """Whether the plan's fit rule keeps --headroom free: as its verdicts say (vLLM's does not), else
    as the workload's engine implies."""
    if p.fits:
        return any(f.verdict.headroom_applied for f in p.fits)
    upfront = (Engine.VLLM, Engine.SGLANG, Engine.TRTLLM)
    return not (isinstance(p.workload, ServingConfig) and p.workload.engine in upfront)


def _fit_command(p: Plan, f: Fit, model: str | None, given: Mapping[str, str]) -> str:
    return hf_command(model or p.spec.name, given, setup_flags(f.setup.workload, f.setup.count, p.workload,
                                                               f.setup.device))


def plan_notes(p: Plan) -> tuple[str, ...]:
    """What the user should know about the model and the job asked, as ``memest hf`` says it: the model's notes
    and the workload's (:func:`memest.workload.workload_notes`: the config files' reading notes, a sequence beyond
    the trained length)."""
    return (*p.spec.notes, *workload_notes(p.spec, p.workload))


def _plan_header(p: Plan) -> list[str]:
    par = p.workload.parallelism
    # the degrees are searched: describe the job with only what the plan keeps (cp, the ZeRO start)
    job = p.workload.replace(parallelism=Parallelism(cp=par.cp, zero_stage=par.zero_stage))
    rule = (f"{percent(p.headroom)} headroom kept" if _plan_headroom_applied(p) else
            f"{workload_share(p.workload)} sets its share (--headroom not applied)")
    return [
        f"{p.spec.name} — {describe_model(p.spec)}",
        f"{describe_workload(job)} · {rule}",
        f"{plural(len(p.space.devices), 'device type')} searched · {plural(p.evaluated, 'setup')} estimated, "
        f"{p.setups:,} decided · ranked by $/h, then communication, then disruption",
    ]


_WIDER = {"allow_method_change": "--allow-method-change", "allow_optimizer_change": "--allow-optimizer-change",
          "allow_batch_reshape": "--allow-batch-reshape", "allow_offload": "--allow-offload",
          "allow_quantization": "--allow-quantization", "allow_stack_change": "--allow-stack-change",
          "host_memory_bytes": "more --host-memory"}
"""The plan's search switches (:class:`memest.planning.search.Space`) as ``memest plan`` flags."""


def nothing_fits(p: Plan) -> str:
    """What to do when nothing fits: more devices, and the search switches the plan's mode reads that were
    off (training: another method, the 8-bit optimizer, micro-batch reshaping, offload; serving:
    quantization), first the one found to fit (:attr:`Plan.widenings`: another stack)."""
    space = p.space
    if isinstance(p.workload, TrainingConfig):
        off = [n for n in ("allow_method_change", "allow_optimizer_change", "allow_batch_reshape", "allow_offload")
               if not getattr(space, n) and not (n == "allow_method_change" and p.workload.method is Method.QLORA)]
    else:
        off = [n for n in ("allow_quantization",) if not space.allow_quantization]
    found = [_WIDER[n] for n in p.widenings]
    tried = [_WIDER[n] for n in off if n not in p.widenings]
    head = "Nothing fits within the search"
    if found:
        head += f"; {' and '.join(found)} finds a fit"
    # more devices only where a job may use more than the search tried (one Mac is the most a job uses)
    more = any(most_devices(c.device, c.max_count + 1) > c.max_count for c in p.no_fit)
    switches = ", ".join(tried)
    if more:
        rest = "allow more devices (--max-gpus, --gpus-available)" + (f", or try {switches}" if tried else "")
    elif tried:
        rest = f"try {switches}" + (" (a job uses one Mac at most)" if _capped(p) else "")
    else:
        rest = "a job uses one Mac at most; try another device type" if _capped(p) else "try other device types"
    return f"{head}; {rest}."


def _capped(p: Plan) -> bool:
    """Whether a device type that fits nothing is held to fewer devices than asked by its own limit
    (:attr:`~memest.devices.Device.max_devices`: one Apple Mac)."""
    return any(c.device.max_devices is not None and c.max_count >= c.device.max_devices for c in p.no_fit)


def _most(c: Any) -> int:
    """The most devices of a choice the search tried (its limit, or the device's own)."""
    return most_devices(c.device, c.max_count)


def _framework_not_run(w: Workload) -> str:
    return f"{software(w)} does not run on"


def _not_run(p: Plan) -> dict[str, list[str]]:
    """The device types not searched, grouped by why: the job's engine or framework does not run there, or
    something else the training job asks for does not (:func:`memest.workload.training_refusal`)."""
    out: dict[str, list[str]] = {}
    w = p.workload
    for c in p.not_run:
        refused = (training_refusal(w, c.device.arch, c.device.vendor)
                   if isinstance(w, TrainingConfig) and runs_on(software(w), c.device.vendor) else None)
        out.setdefault(refused[1] if refused else _framework_not_run(w), []).append(_not_run_name(w, c.device))
    return out


def render_plan(p: Plan, *, top: int = 10, model: str | None = None, given: Mapping[str, str] | None = None) -> Any:
    """A rich renderable of a plan: the fitting setups, cheapest first, and the ``memest hf``
    command of the cheapest (with the user's own flags ``given``, and ``model`` as they named it)."""
    from rich.console import Group
    from rich.text import Text

    head = _plan_header(p)
    parts: list[Any] = [
        Text.assemble(("Model   ", "bold"), head[0]),
        Text.assemble(("Job     ", "bold"), head[1]),
        Text(head[2], style="dim"),
    ]
    parts += [Text(f"Note: {note}", style="yellow") for note in plan_notes(p)]
    if not p.fits and p.not_run and not p.no_fit:
        runner = "engine" if isinstance(p.workload, ServingConfig) else "framework"
        whys = list(_not_run(p))
        what = (f"{software(p.workload)} runs on none of the devices given; pass another --{runner}"
                if whys == [_framework_not_run(p.workload)] else "the job runs on none of the devices given; change it")
        parts.append(Text(f"Nothing to search: {what} or other --gpus-available.", style="bold red"))
    elif not p.fits:
        parts.append(Text(nothing_fits(p), style="bold red"))
    else:
        parts.append(_plan_table(p, top))
        command = _fit_command(p, p.fits[0], model, given or {})
        parts.append(Text.assemble(("Cheapest: ", "bold green"), (command, "cyan")))
        if len(p.fits) > top:
            parts.append(Text(f"{plural(len(p.fits) - top, 'more setup')} found to fit (the search keeps the "
                              f"{plural(p.top, 'cheapest setup')} of each device type: a larger --top finds more; "
                              "--json lists those kept).", style="dim"))
        ctx = p.spec.max_position_embeddings
        if ctx and any(q.value and q.value > ctx for f in p.fits[:top] for q in f.limits if q.setting == "seq_len"):
            parts.append(Text(f"'largest that fits' counts memory only: training sequences beyond the model's "
                              f"max_position_embeddings ({ctx:,}) need RoPE scaling.", style="dim"))
    if p.no_fit:
        names = ", ".join(f"{c.device.name} (up to {_most(c)})" for c in p.no_fit)
        parts.append(Text(f"Nothing fits on: {names}", style="dim"))
    for why, names in _not_run(p).items():
        parts.append(Text(f"{why}: {', '.join(names)} (not searched)", style="dim"))
    parts.append(Text(CONFIRM, style="dim"))
    return Group(*parts)


def plan_to_markdown(p: Plan, *, top: int = 10, model: str | None = None,
                     given: Mapping[str, str] | None = None) -> str:
    """The plan table as GitHub Markdown, then the ``memest hf`` command of the cheapest fit."""
    lines = [f"**{line}**  " if i == 0 else f"{line}  " for i, line in enumerate(_plan_header(p))]
    notes = plan_notes(p)
    if notes:
        lines += ["", *(f"> Note: {note}  " for note in notes)]
    lines += ["", "| " + " | ".join(_PLAN_COLUMNS) + " | flags |", "|" + "---|" * (len(_PLAN_COLUMNS) + 1)]
    for row, f in zip(_plan_rows(p, top), p.fits):
        flags = setup_flags(f.setup.workload, f.setup.count, p.workload, f.setup.device)
        lines.append("| " + " | ".join(row) + f" | `{flags}` |")
    if not p.fits:
        lines.append("| | nothing fits | | | | | | | |")
    else:
        lines += ["", f"Cheapest: `{_fit_command(p, p.fits[0], model, given or {})}`"]
    return "\n".join(lines) + "\n"


def _not_run_name(w: Workload, device: Device) -> str:
    """A device the job's engine does not start on, with the setting its compute capability is below
    (``T4 (quantization fp8)``), if that is why."""
    found = capability_refusal(w, device)
    return f"{device.name} ({found[0]} {getattr(w, found[0])})" if found else device.name
