"""``memest hf --trace`` / ``--plot``: run the trace, reporting progress to the caller's callback, and render it
beside the estimate. Nothing here prints: the CLI shows the progress and the warning below on stderr.

Bytes are printed by :func:`memest.report.size` (GiB from 1 GiB up, else MiB, as calibrate prints them),
so a tiny model's trace does not read 0.00 everywhere; a difference is a share of the trace only when the
traced figure is at least 1 MiB. The JSON form keeps ints.

A trace's time is set by the operators it runs, not by the tensors' sizes (meta tensors have no data),
so it barely grows with the context — except where transformers runs a Python loop over the tokens:
the reference selective scan of Mamba layers (Jamba; the fused CUDA kernels cannot run on meta). Before
such a trace :func:`slow_trace_warning` returns the one line the CLI prints on stderr when tokens x Mamba
layers x :data:`SCAN_SECONDS` passes :data:`SLOW_TRACE_SECONDS`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memest.devices import Device
from memest.report import size
from memest.result import NEGLIGIBLE_SHARE, Estimate
from memest.sources.config import HFConfig
from memest.spec import ModelSpec
from memest.trace.compare import Comparison, ComparisonRow, compare
from memest.trace.result import TraceResult
from memest.workload import ServingConfig, TrainingConfig, Workload

SCAN_SECONDS = 4e-4
"""Seconds per token per Mamba layer of a traced forward (transformers' reference selective scan, one Python
iteration per token). Measured: ai21labs/Jamba-v0.1 (28 Mamba layers) served with --engine hf traced in 5 s
at --max-model-len 256 and 13.6 s at 1024 (2-core machine): 8.6 s / (768 tokens x 28 layers) = 0.4 ms."""

SLOW_TRACE_SECONDS = 60
"""Expected trace time above which :func:`slow_trace_warning` warns."""

RELATIVE_FLOOR = 1 << 20
"""Smallest traced figure (bytes) a difference is shown as a share of: under 1 MiB the share is noise."""

DECODE_STEPS = 2
"""Decode steps the CLI's serving trace runs (the default of :func:`memest.trace.trace`)."""


def slow_trace_warning(spec: ModelSpec, workload: Workload) -> str | None:
    """A one-line warning when the trace of ``workload`` is expected to take over a minute, else None.

    Expected seconds = tokens of the longest sequence x Mamba layers x :data:`SCAN_SECONDS` x passes:
    one prefill when serving (the prompt: the context less the decode steps); forward + backward (about 3
    forwards) of each traced micro-batch (at most 2) when training. Rough by design: it says what drives the
    time and how to shorten it.
    """
    scans = sum(count for layer, count in spec.layer_kinds() if layer.attention.kind == "mamba")
    if not scans:
        return None
    if isinstance(workload, ServingConfig):
        context = workload.max_model_len or spec.max_position_embeddings or 2048
        tokens, passes, flag = context - DECODE_STEPS, 1, "--max-model-len"
    elif isinstance(workload, TrainingConfig):
        tokens, passes, flag = workload.seq_len, 3 * min(workload.grad_accum_steps, 2), "--seq-len"
    else:
        return None
    seconds = tokens * scans * SCAN_SECONDS * passes
    if seconds < SLOW_TRACE_SECONDS:
        return None
    took = f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"
    quick = 1 << max(0, int(SLOW_TRACE_SECONDS / (scans * SCAN_SECONDS * passes)).bit_length() - 1)
    return (f"Warning: this trace may take about {took}: transformers runs the {scans} Mamba layers of {spec.name} "
            f"as a Python loop over {tokens:,} tokens (the fused kernels cannot run on meta); pass {flag} {quick} "
            "for a trace of about a minute")


def _rel(row: ComparisonRow, peak: int = 0) -> str:
    """The difference as a share of the traced figure: ``—`` when that is under :data:`RELATIVE_FLOOR` or,
    for a kind, under :data:`memest.result.NEGLIGIBLE_SHARE` of the traced ``peak`` (the difference column says
    it), ``±0`` when the difference is."""
    if row.relative is None or abs(row.traced_bytes) < max(RELATIVE_FLOOR, NEGLIGIBLE_SHARE * peak):
        return "—"
    if abs(row.diff_bytes) < RELATIVE_FLOOR:
        return "±0"
    return f"{row.relative:+.1%}"


def render(result: TraceResult, comparison: Comparison) -> Any:
    """A rich renderable: the traced peak by kind beside the analytic terms, with each difference."""
    from rich.console import Group
    from rich.text import Text

    from memest.report.tables import Narrowest, name_col, new_table, number_col, prose_col

    per = result.per_device
    table = new_table(name_col("kind"), number_col("estimate"), number_col("trace"), number_col("trace − estimate"),
                      number_col("of trace"), title=f"trace vs estimate (peak in {comparison.peak_phase}; "
                      f"{result.world_size} device{'s' if result.world_size > 1 else ''}, rank {per.rank})")
    peak = comparison.allocated.traced_bytes
    for row in comparison.kinds:
        table.add_row(row.name, size(row.analytic_bytes), size(row.traced_bytes), size(row.diff_bytes), _rel(row, peak))
    table.add_section()
    for row in (comparison.allocated, comparison.reserved):
        table.add_row(f"[bold]{row.name}[/bold]", size(row.analytic_bytes), size(row.traced_bytes),
                      size(row.diff_bytes), _rel(row))
    parts: list[Any] = [Narrowest(table)]
    phases = " · ".join(f"{name} {size(n)}" for name, n in per.phase_peaks.items())
    parts.append(Text(f"traced peak by phase: {phases}", style="dim"))
    largest = new_table(name_col("kind"), prose_col("origin"), number_col("count"), number_col("size"),
                        title="largest tensors live at the traced peak", title_style="dim", box=None, show_edge=False)
    for g in per.groups[:8]:
        largest.add_row(g.kind.value, g.label, str(g.count), size(g.bytes))
    parts.append(Narrowest(largest))
    parts.append(Text(f"traced in {result.seconds:.1f} s ({result.num_ops:,} operators): " + "; ".join(result.settings),
                      style="dim"))
    return Group(*parts)


def to_markdown(result: TraceResult, comparison: Comparison) -> str:
    """The comparison as a Markdown table."""
    lines = [
        "",
        f"**trace vs estimate** (peak in {comparison.peak_phase}; {result.world_size} device(s), rank {result.per_device.rank})",
        "",
        "| kind | estimate | trace | trace − estimate | of trace |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in (*comparison.kinds, comparison.allocated, comparison.reserved):
        peak = comparison.allocated.traced_bytes if any(row is k for k in comparison.kinds) else 0
        lines.append(f"| {row.name} | {size(row.analytic_bytes)} | {size(row.traced_bytes)} | "
                     f"{size(row.diff_bytes)} | {_rel(row, peak)} |")
    lines += ["", "trace settings: " + "; ".join(result.settings)]
    return "\n".join(lines) + "\n"


def to_dict(result: TraceResult, comparison: Comparison) -> dict[str, Any]:
    """The ``trace`` section of ``memest hf --trace --json`` (integer bytes)."""
    per = result.per_device
    return {
        "target": result.target,
        "world_size": result.world_size,
        "seconds": round(result.seconds, 3),
        "num_ops": result.num_ops,
        "settings": list(result.settings),
        "peak_allocated_bytes": per.peak_allocated_bytes,
        "peak_reserved_bytes": per.peak_reserved_bytes,
        "peak_tensor_bytes": per.peak_tensor_bytes,
        "peak_phase": per.peak_phase,
        "phase_peaks": dict(per.phase_peaks),
        "by_kind": {k.value: v for k, v in per.by_kind.items()},
        "largest": [{"kind": g.kind.value, "origin": g.label, "count": g.count, "bytes": g.bytes} for g in per.groups],
        "comparison": [
            {"name": r.name, "estimate_bytes": r.analytic_bytes, "trace_bytes": r.traced_bytes, "diff_bytes": r.diff_bytes}
            for r in (*comparison.kinds, comparison.allocated, comparison.reserved)
        ],
    }


def _comparable_estimate(cfg: HFConfig, workload: Workload, device: Device, estimate: Estimate, *,
                         trust_remote_code: bool) -> tuple[Estimate, str]:
    """The analytic estimate to set beside the trace: ZeRO-2/3 is traced as FSDP2, so a DeepSpeed
    estimate is replaced by the FSDP estimate of the same job; a vLLM job is traced as transformers
    ``generate``, so its estimate is replaced by the ``--engine hf`` one (the note says which)."""
    from memest.workload import Engine, Framework, ServingConfig, TrainingConfig, resolve_framework

    if isinstance(workload, ServingConfig) and workload.engine is not Engine.HF:  # vLLM, SGLang, TensorRT-LLM
        from memest.errors import MemestError
        from memest.estimate import estimate as analytic
        from memest.sources import spec_from_config

        hf = workload.replace(engine=Engine.HF, engine_version=None, max_num_batched_tokens=None, max_num_seqs=None)
        try:
            generate = analytic(spec_from_config(cfg, trust_remote_code=trust_remote_code), hf, device)
        except MemestError:
            return estimate, ""
        return generate, ("vLLM traced as transformers generate: compared with the analytic estimate for --engine hf "
                          "(vLLM's own figure above is its start-up budget)")
    if not isinstance(workload, TrainingConfig) or workload.parallelism.zero_stage < 2:
        return estimate, ""
    if resolve_framework(workload) is not Framework.DEEPSPEED:
        return estimate, ""
    from memest.estimate import estimate as analytic
    from memest.sources import spec_from_config

    spec = spec_from_config(cfg, trust_remote_code=trust_remote_code)
    fsdp = analytic(spec, workload.replace(framework=Framework.FSDP), device)
    return fsdp, ("ZeRO-2/3 traced as FSDP2: compared with the analytic estimate for --framework fsdp "
                  "(the DeepSpeed estimate above differs by its flat buffers and buckets)")


def trace_for_cli(cfg: HFConfig, workload: Workload, device: Device, estimate: Estimate, *, trust_remote_code: bool,
                  plot: Path | None, progress: Callable[[str, int, int], None] | None = None,
                  ) -> tuple[TraceResult, Comparison]:
    """Trace, compare with ``estimate``, and write the timeline plot when asked; ``progress`` is called
    after each decoder-layer pass (:func:`memest.trace.trace`)."""
    from memest.trace import trace

    result = trace(cfg, workload, device, trust_remote_code=trust_remote_code, progress=progress)
    estimate, note = _comparable_estimate(cfg, workload, device, estimate, trust_remote_code=trust_remote_code)
    if note:
        result = dataclasses.replace(result, settings=(*result.settings, note))
    comparison = compare(result, estimate)
    if plot is not None:
        from memest.report.trace_plot import plot_timeline

        plot_timeline(result, plot, estimate_allocated_bytes=comparison.allocated.analytic_bytes)
    return result, comparison
