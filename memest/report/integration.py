"""The lines :mod:`memest.integrations` logs inside a running job: the estimate, the fit warning, and the
measured steps against the estimate (the rows of :mod:`memest.calibration.compare`, as ``memest calibrate``
prints them). Plain text, one figure per line, GiB = 2^30 bytes as everywhere in :mod:`memest.report`."""

from __future__ import annotations

from typing import Any

from memest.devices import MiB
from memest.report.estimate import describe_workload
from memest.report.units import percent, size


def estimate_line(name: str, workload: Any, est: Any, device: Any) -> str:
    """``memest: <model> (<job>): predicted per device on <device>: peak allocated ..., reserved ..., device
    used ...``."""
    rank = est.per_device
    return (f"memest: {name} ({describe_workload(workload)}): predicted per device on {device.name} "
            f"({size(device.memory_bytes)}): peak allocated {size(rank.allocated_bytes)}, peak reserved "
            f"{size(rank.reserved_bytes)}, device used {size(rank.device_used_bytes)}")


def fit_warning(verdict: Any) -> str:
    """The warning before the first step: the estimate does not fit the device."""
    return (f"memest: this job will not fit: it needs about {size(verdict.needed_bytes)} per device, "
            f"{size(verdict.needed_bytes - verdict.usable_bytes)} more than the {size(verdict.usable_bytes)} usable on "
            f"{verdict.device.name} ({percent(verdict.headroom)} headroom kept); see `memest hf` / `memest plan` "
            "for a setup that fits")


def comparison_lines(calibration: Any) -> list[str]:
    """One line per compared figure of each rank (predicted, measured, the error), and the verdict."""
    out: list[str] = []
    for rank in calibration.ranks:
        m = rank.measurement
        where = f"{m.device_name}, {m.steps} measured step{'s' if m.steps != 1 else ''}"
        out.append(f"memest: rank {rank.rank} on {where}: predicted vs measured")
        moment = next((row.moment for row in rank.rows if row.moment), None)
        if moment is not None:
            peak = calibration.estimate.extra.get("peak_moment", "another moment")
            out.append(f"memest:   (per term at the estimate's {moment} moment, the one whose breakdown the measured "
                       f"peak's matches; the estimate peaks at {peak}, so the totals compare the two peaks)")
        for row in rank.rows:
            predicted = size(row.predicted) if row.predicted is not None else "-"
            measured = size(row.measured) if row.measured is not None else "-"
            if row.error is not None:
                error = f" ({row.error:+.1%})"
            elif row.delta is not None and row.measured:  # a near-zero base: the difference says it
                shown = size(abs(row.delta)) if abs(row.delta) >= MiB else f"{abs(row.delta):,} B"
                error = f" (difference {'+' if row.delta >= 0 else '-'}{shown})"
            else:
                error = ""
            out.append(f"memest:   {row.name}: predicted {predicted}, measured {measured}{error}")
    v = calibration.verdict
    out.append(f"memest: verdict: predicted {'fits' if v.predicted_fits else 'does not fit'}, ran "
               f"{'within memory' if v.measured_fits else 'out of memory'} -> {v.status}")
    if calibration.ranks and calibration.ranks[0].measurement.backend == "cpu":
        out.append("memest: CPU: measured = the profiler memory timeline's peak of tensor bytes (no CUDA context, "
                   "cuBLAS workspace or caching allocator on either side)")
    return out
