"""Pictures of a sweep: peak memory per term kind, stacked, against the swept setting.

matplotlib is an optional extra (``pip install 'memest[plot]'``), imported only when a plot is
asked for, with the non-interactive Agg backend. Bytes are drawn in GiB (2^30, as labelled) using
:data:`memest.report.GiB`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memest.devices import GiB
from memest.errors import InputError, MissingDependencyError
from memest.planning.sweep import Sweep
from memest.report.estimate import describe_workload
from memest.report.units import percent, size_label
from memest.result import Kind

FORMATS = (".png", ".svg", ".pdf")
"""File types ``--plot`` writes (``memest sweep`` and ``memest hf --trace``); matplotlib picks the
format from the suffix."""


def plot_path(path: str | Path) -> Path:
    """``--plot FILE`` checked before any work is done.

    Raises:
        MissingDependencyError: matplotlib is not installed.
        InputError: the suffix is not one of :data:`FORMATS`, the folder does not exist or cannot be
            written, or the path is a folder.
    """
    import importlib.util

    out = Path(path).expanduser()
    if importlib.util.find_spec("matplotlib") is None:  # found without importing it (the fast path stays fast)
        raise MissingDependencyError("{plot} needs matplotlib; install it with: pip install 'memest[plot]'",
                                     field="plot")
    if out.suffix.lower() not in FORMATS:
        raise InputError(f"{{plot}} {str(path)!r}: the file must end in {', '.join(FORMATS[:-1])} or {FORMATS[-1]}",
                         field="plot")
    folder = out.parent
    if not folder.is_dir():
        raise InputError(f"{{plot}} {str(path)!r}: the folder {str(folder)!r} does not exist; create it or write elsewhere",
                         field="plot")
    existed = out.exists()
    try:  # probe: append mode leaves an existing file as it is; a new one is removed again
        with open(out, "ab"):
            pass
    except OSError as exc:
        raise InputError(f"{{plot}} {str(path)!r} cannot be written ({exc.strerror}); choose a file in a folder "
                         "you can write", field="plot") from None
    if not existed:
        out.unlink(missing_ok=True)
    return out

CLIP = 2.5
"""The y axis stops at this multiple of the device's capacity; taller stacks are clipped (and
labelled) so that the region where the job stops fitting stays readable."""

KIND_COLORS: dict[Kind, str] = {
    Kind.WEIGHTS: "#4c72b0",
    Kind.GRADIENTS: "#dd8452",
    Kind.OPTIMIZER_STATES: "#c44e52",
    Kind.ACTIVATIONS: "#55a868",
    Kind.LOGITS: "#8172b3",
    Kind.KV_CACHE: "#937860",
    Kind.WORKSPACE: "#da8bc3",
    Kind.ALLOCATOR: "#b0b0b0",
    Kind.RUNTIME: "#8c8c8c",
}
"""One colour per term kind, the same in every plot."""


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise MissingDependencyError("{plot} needs matplotlib; install it with: pip install 'memest[plot]'",
                                     field="plot") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_sweep(result: Sweep, path: str | Path) -> Path:
    """Draw ``result`` to ``path`` (.png, .svg or .pdf): a stacked area of the per-device terms by
    kind, the device's capacity, the usable line (capacity less headroom) and the largest value that
    fits.

    Raises:
        InputError: the file name does not end in one of :data:`FORMATS`, or no point could be
            estimated.
        MissingDependencyError: matplotlib is not installed.
    """
    out = plot_path(path)
    points = [p for p in result.points if p.estimate is not None]
    if not points:
        raise InputError("nothing to plot: the estimator rejected every point of the sweep")
    plt = _pyplot()
    xs = [p.value for p in points]
    kinds = [k for k in Kind if any(p.estimate.per_device.by_kind().get(k) for p in points)]  # type: ignore[union-attr]
    stacks = [[p.estimate.per_device.by_kind().get(k, 0) / GiB for p in points] for k in kinds]  # type: ignore[union-attr]

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    ax.stackplot(xs, stacks, labels=[k.value.replace("_", " ") for k in kinds],
                 colors=[KIND_COLORS[k] for k in kinds], alpha=0.85, linewidth=0.4, edgecolor="white")
    capacity = result.device.memory_bytes / GiB
    usable = result.usable_bytes / GiB
    ax.axhline(capacity, color="black", linewidth=1.6, label=f"{result.device.name} capacity ({capacity:,.1f} GiB)")
    kept = f"{percent(result.headroom)} headroom kept" if result.headroom_applied else "vLLM: headroom not applied"
    ax.axhline(usable, color="black", linewidth=1.2, linestyle="--", label=f"usable ({kept}, {usable:,.1f} GiB)")
    best = result.largest
    if best.value is not None and xs[0] <= best.value < xs[-1]:
        ax.axvline(best.value, color="#c44e52", linewidth=1.2, linestyle=":")
        ax.annotate(f"largest that fits: {best.value:,}", xy=(best.value, usable), xytext=(-6, 8),
                    textcoords="offset points", ha="right", color="#c44e52", fontsize=9,
                    bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})
        ax.axvspan(best.value, xs[-1], color="#c44e52", alpha=0.08, linewidth=0, label="does not fit")
    if len(xs) > 2 and all(b >= 2 * a for a, b in zip(xs, xs[1:-1])):
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([size_label(x) for x in xs], rotation=45 if len(xs) > 8 else 0)
    ax.minorticks_off()
    ax.set_xlim(xs[0], xs[-1])
    top = max(capacity, max(sum(col) for col in zip(*stacks)))
    if top > CLIP * capacity:  # keep the crossing readable: clip far-off points and say so
        ax.set_ylim(0, CLIP * capacity)
        ax.annotate(f"clipped: {top:,.0f} GiB at {size_label(xs[-1])}", xy=(1, 1), xycoords="axes fraction",
                    xytext=(-6, -14), textcoords="offset points", ha="right", fontsize=8, color="#555555")
    else:
        ax.set_ylim(0, top * 1.08)
    ax.set_xlabel(result.flag.lstrip("-").replace("-", "_"))
    ax.set_ylabel("memory per device (GiB = 2^30 bytes)")
    workload = describe_workload(points[0].workload).replace(f"{result.setting} {points[0].value}", "")
    ax.set_title(f"{result.spec.name} on {result.count} x {result.device.name}\n{_trim(workload)}", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], loc="upper left", fontsize=8, framealpha=0.9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def _trim(text: str, width: int = 110) -> str:
    text = " · ".join(part.strip() for part in text.split("·") if part.strip())
    return text if len(text) <= width else text[: width - 1] + "…"
