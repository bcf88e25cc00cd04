"""A trace beside the analytic estimate: the same kinds, the same figures, and the difference of each.

Compares like with like: the analytic terms of each :class:`~memest.result.Kind` that counts
toward peak allocated against the bytes of that kind live at the trace's peak; the analytic peak
allocated against the trace's (caching-allocator) peak allocated; the analytic peak reserved
against the replayed allocator's peak reserved. The two peaks may fall at different moments of
the step (the analytic estimate picks its moment; the trace finds it) — that is part of what the
comparison shows. Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass

from memest.result import ALLOCATED_KINDS, Estimate, Kind
from memest.trace.result import TraceResult


@dataclass(frozen=True, slots=True)
class ComparisonRow:
    """One figure, analytic and traced.

    Attributes:
        name: The kind (``activations``) or the figure (``peak allocated``).
        analytic_bytes: The analytic estimate's bytes.
        traced_bytes: The trace's bytes.
    """

    name: str
    analytic_bytes: int
    traced_bytes: int

    @property
    def diff_bytes(self) -> int:
        """traced - analytic."""
        return self.traced_bytes - self.analytic_bytes

    @property
    def relative(self) -> float | None:
        """(traced - analytic) / traced, or None when the trace has no bytes of it."""
        return self.diff_bytes / self.traced_bytes if self.traced_bytes else None


@dataclass(frozen=True, slots=True)
class Comparison:
    """The analytic estimate of the largest rank against the trace's largest rank.

    Attributes:
        kinds: One row per kind either side has, in :class:`Kind` order.
        allocated: Peak allocated.
        reserved: Peak reserved (analytic: allocated + the allocator slack term).
        peak_phase: Where in the step the trace's peak fell.
    """

    kinds: tuple[ComparisonRow, ...]
    allocated: ComparisonRow
    reserved: ComparisonRow
    peak_phase: str


def compare(result: TraceResult, estimate: Estimate) -> Comparison:
    """Line up ``result`` against ``estimate`` kind by kind (see the module docstring)."""
    analytic = estimate.per_device
    traced = result.per_device
    a_kinds = analytic.by_kind()
    rows = []
    for kind in Kind:
        if kind not in ALLOCATED_KINDS:
            continue
        a, t = a_kinds.get(kind, 0), traced.by_kind.get(kind, 0)
        if a or t:
            rows.append(ComparisonRow(kind.value, a, t))
    return Comparison(
        kinds=tuple(rows),
        allocated=ComparisonRow("peak allocated", analytic.allocated_bytes, traced.peak_allocated_bytes),
        reserved=ComparisonRow("peak reserved", analytic.reserved_bytes, traced.peak_reserved_bytes),
        peak_phase=traced.peak_phase,
    )
