"""The memory timeline of a trace as a plot file: allocated bytes by kind over the step, stacked."""

from __future__ import annotations

from pathlib import Path

from memest.devices import GiB
from memest.errors import InputError, MissingDependencyError
from memest.report.plot import plot_path
from memest.result import Kind
from memest.trace.result import TraceResult

COLORS = {
    Kind.WEIGHTS: "#4c72b0",
    Kind.GRADIENTS: "#dd8452",
    Kind.OPTIMIZER_STATES: "#55a868",
    Kind.ACTIVATIONS: "#c44e52",
    Kind.LOGITS: "#8172b3",
    Kind.KV_CACHE: "#937860",
    Kind.WORKSPACE: "#8c8c8c",
}


def plot_timeline(result: TraceResult, path: Path, *, estimate_allocated_bytes: int | None = None) -> Path:
    """Write the stacked timeline of ``result``'s largest rank to ``path`` (format from the suffix).

    Args:
        result: The trace.
        path: Where to write (``.png``, ``.svg``, ``.pdf``).
        estimate_allocated_bytes: The analytic peak allocated, drawn as a dashed line.

    Raises:
        MissingDependencyError: matplotlib is not installed.
        InputError: the suffix is not one of :data:`memest.report.plot.FORMATS`, or the file cannot be written.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependencyError("{plot} needs matplotlib; install with: pip install 'memest[plot]'",
                                     field="plot") from exc
    path = plot_path(path)
    rank = result.per_device
    points = rank.timeline
    kinds = [k for k in Kind if any(p.by_kind.get(k) for p in points)]
    x = [p.event for p in points]
    fig, ax = plt.subplots(figsize=(11, 5))
    ax.stackplot(x, [[p.by_kind.get(k, 0) / GiB for p in points] for k in kinds],
                 labels=[k.value for k in kinds], colors=[COLORS.get(k, "#cccccc") for k in kinds], alpha=0.85)
    previous = None
    for p in points:
        if p.phase != previous:
            ax.axvline(p.event, color="black", lw=0.5, alpha=0.4)
            ax.text(p.event, 0, f" {p.phase}", rotation=90, va="bottom", fontsize=8, alpha=0.7)
            previous = p.phase
    ax.plot([rank.peak_event], [rank.peak_allocated_bytes / GiB], "k^", label=f"traced peak {rank.peak_allocated_bytes / GiB:,.2f} GiB")
    if estimate_allocated_bytes:
        ax.axhline(estimate_allocated_bytes / GiB, color="black", ls="--", lw=1,
                   label=f"estimate {estimate_allocated_bytes / GiB:,.2f} GiB")
    ax.set_xlabel("allocation / free event")
    ax.set_ylabel("allocated (GiB = 2^30 bytes)")
    ax.set_title(f"{result.model} — {result.mode}, traced on meta ({result.world_size} device(s), rank 0)")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path)
    except OSError as exc:
        raise InputError(f"{{plot}} {str(path)!r} cannot be written: {exc}", field="plot") from exc
    finally:
        plt.close(fig)
    return path
