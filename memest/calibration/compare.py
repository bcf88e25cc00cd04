"""Predicted versus measured, like with like, per rank; and whether the fit verdict was right.

Pure Python (no torch): it works on :class:`~memest.result.RankEstimate` and
:class:`~memest.calibration.measure.Measurement`, so records can be re-compared anywhere.

What is compared with what:

| row | predicted (estimate terms) | measured, CUDA | measured, CPU (profiler timeline at its peak) |
|---|---|---|---|
| weights | ``weights`` kind | parameter storages after the steps | PARAMETER - fp32 masters |
| gradients | ``gradients`` | – | GRADIENT |
| optimizer_states | ``optimizer_states`` | optimizer state tensors (and fp32 masters) after the steps | OPTIMIZER_STATE + fp32 masters |
| activations + logits | ``activations``, ``logits`` (+ ``kv_cache`` serving) | – | ACTIVATION + AUTOGRAD_DETAIL + INPUT |
| workspace | ``workspace`` | – | TEMPORARY + UNKNOWN |
| rest at peak | allocated - weights - optimizer_states | peak allocated - the two above | – |
| **peak allocated** | every allocated kind | ``allocated_bytes.all.peak`` | the timeline's peak |
| **peak reserved** | + ``allocator`` | ``reserved_bytes.all.peak`` | – (no caching allocator) |
| non-torch | ``runtime`` kind | NVML process used - reserved after the steps | – |
| CUDA context | ``runtime.cuda_context`` | device memory before the first tensor | – |
| **device used** | peak reserved + runtime | peak reserved + non-torch | – |

On the CPU the per-term rows compare like moments: the profiler's breakdown is the one at the measured peak, and
the estimate's terms are those of its own peak moment (``Estimate.extra["peak_moment"]``, the training moments of
:func:`memest.estimate.training.moments`). When the two peaks fall at different moments of the step (the estimate
peaks at the optimizer step, the run in its forward, say), the rows take the estimate's terms at the moment whose
breakdown is nearest the measured one (the least sum of the rows' differences: :func:`matched_moment`), and say
which (:attr:`Row.moment`); the totals compare the two peaks. A row whose measured figure is under
:data:`~memest.result.NEGLIGIBLE_SHARE` of the measured peak gets no relative error (a percentage of nothing says nothing of the
estimate): its difference is shown.

On CPU the terms that exist only on CUDA (cuBLAS workspace, allocator slack, context) are zero
because the estimate is made for a CPU device (``arch="cpu"``), so peak allocated compares the
same tensors. Under FSDP2 (ZeRO 2/3) the profiler's categories miss the parameters (DTensors): CPU
rows are then those of the CUDA column (parameter and optimizer-state storages after the steps,
the rest at the peak). Serving on CPU: tensors of an inference forward are never ACTIVATION (nothing is
saved for a backward), so the KV cache and the forward's tensors fall in TEMPORARY / UNKNOWN; only
weights and the total are compared there.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memest.calibration.measure import Measurement
from memest.devices import DEVICES, Device, GiB, get_device
from memest.errors import UnknownDeviceError
from memest.result import NEGLIGIBLE_SHARE, Estimate, Kind, RankEstimate, Term

ARCH_BY_CAPABILITY = {"7.0": "volta", "7.2": "volta", "7.5": "turing", "8.0": "ampere", "8.6": "ampere",
                      "8.7": "ampere", "8.9": "ada", "9.0": "hopper", "10.0": "blackwell", "10.3": "blackwell",
                      "12.0": "blackwell"}
"""CUDA compute capability -> memest architecture family (NVIDIA's CUDA GPUs table)."""


# ---- the device the estimate is made for ----


def local_device(backend: str, device_name: str, total_bytes: int | None, capability: str | None = None) -> Device:
    """The memest Device of the hardware that ran: the catalog entry when the name matches one,
    with the memory CUDA reported; a CPU device for ``backend="cpu"``."""
    total = int(total_bytes or 0)
    if backend == "cpu":
        return Device(name="cpu", memory_bytes=total, vendor="cpu", kind="cpu", arch="cpu", bf16=True, per_node=1,
                      hourly_usd=0.0, measured=True, source="physical RAM (os.sysconf)")
    found = _catalog_match(device_name, total)
    source = f"torch.cuda.mem_get_info total on the calibrated device ({device_name})"
    if found is not None:
        return dataclasses.replace(found, memory_bytes=total or found.memory_bytes, measured=bool(total), source=source)
    arch = ARCH_BY_CAPABILITY.get(capability or "", "unknown")
    return Device(name=device_name, memory_bytes=total, vendor="nvidia", arch=arch, hourly_usd=0.0, measured=True,
                  source=source)


def _catalog_match(device_name: str, total: int) -> Device | None:
    name = re.sub(r"^(NVIDIA|Tesla|GeForce|AMD|Instinct)\s+", "", device_name.strip(), flags=re.IGNORECASE)
    name = re.sub(r"^(GeForce|Instinct)\s+", "", name, flags=re.IGNORECASE)
    tries = [name]
    head = re.split(r"[-\s]", name)[0]
    if total:
        tries.append(f"{head}-{round(total / GiB / 8) * 8}GB")
    tries.append(head)
    for candidate in tries:
        try:
            return get_device(candidate)
        except UnknownDeviceError:
            continue
    same_family = [d for d in DEVICES if d.name.split("-")[0].lower() == head.lower()]
    if same_family and total:
        return min(same_family, key=lambda d: abs(d.memory_bytes - total))
    return None


def device_slug(device: Device) -> str:
    """File-name form of a device name (``H100-80GB`` -> ``h100-80gb``), for ``results/<slug>.jsonl``."""
    return re.sub(r"[^a-z0-9]+", "-", device.name.lower()).strip("-") or "device"


# ---- rows ----


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the side-by-side table.

    Attributes:
        name: What is compared (``weights``, ``peak allocated``).
        predicted: Predicted bytes (None when the estimate has no such figure).
        measured: Measured bytes (None when the backend cannot see it).
        terms: The estimate terms summed into ``predicted``.
        total: True for the three headline figures.
    """

    name: str
    predicted: int | None
    measured: int | None
    terms: tuple[str, ...] = ()
    total: bool = False
    moment: str | None = None
    """The estimate's moment ``predicted`` is taken at when it is not the estimate's peak (:func:`matched_moment`)."""
    floor: int = 0
    """Measured figures under this many bytes get no relative error (:data:`memest.result.NEGLIGIBLE_SHARE` of the
    peak)."""

    @property
    def delta(self) -> int | None:
        """predicted - measured, bytes."""
        if self.predicted is None or self.measured is None:
            return None
        return self.predicted - self.measured

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured; None when either is missing, or measured is 0 or under
        :attr:`floor`."""
        if self.delta is None or not self.measured or self.measured < self.floor:
            return None
        return self.delta / self.measured


def _kind_sum(rank: RankEstimate | Sequence[Term], kinds: tuple[Kind, ...]) -> tuple[int, tuple[str, ...]]:
    terms = [t for t in (rank.terms if isinstance(rank, RankEstimate) else rank) if t.kind in kinds]
    return sum(t.bytes for t in terms), tuple(t.name for t in terms)


def _cpu_measured(m: Measurement, masters: int) -> dict[str, int]:
    """The measured bytes of each CPU row at the measured peak (the fp32 masters moved to optimizer_states)."""
    shift = {"weights": -masters, "optimizer_states": masters}
    return {name: sum(m.by_category.get(c, 0) for c in categories) + shift.get(name, 0)
            for name, _, categories in _CPU_GROUPS}


def matched_moment(moments: Mapping[str, Sequence[Term]], measured: Mapping[str, int]) -> str:
    """The moment of ``moments`` (name -> its allocated terms) whose per-row sums are nearest ``measured`` (row
    name -> bytes at the measured peak): the least sum of absolute differences over the CPU rows (the first of
    equals, in the moments' order)."""
    def distance(name: str) -> int:
        return sum(abs(_kind_sum(moments[name], kinds)[0] - measured[row]) for row, kinds, _ in _CPU_GROUPS)

    return min(moments, key=distance)


_CPU_GROUPS: tuple[tuple[str, tuple[Kind, ...], tuple[str, ...]], ...] = (
    ("weights", (Kind.WEIGHTS,), ("PARAMETER",)),
    ("gradients", (Kind.GRADIENTS,), ("GRADIENT",)),
    ("optimizer_states", (Kind.OPTIMIZER_STATES,), ("OPTIMIZER_STATE",)),
    ("activations + logits", (Kind.ACTIVATIONS, Kind.LOGITS), ("ACTIVATION", "AUTOGRAD_DETAIL", "INPUT")),
    ("workspace", (Kind.WORKSPACE,), ("TEMPORARY", "UNKNOWN")),
)


def rows(rank: RankEstimate, m: Measurement, static: dict[str, int] | None = None, *, serving: bool = False,
         moments: Mapping[str, Sequence[Term]] | None = None, peak_moment: str | None = None) -> list[Row]:
    """The side-by-side rows of one rank (see the module table).

    Args:
        moments: Training: the estimate's moments (name -> allocated terms), for the CPU per-term rows when the
            measured peak falls at another moment than ``peak_moment``, the estimate's (module docstring).
    """
    static = static or {}
    out: list[Row] = []
    if m.backend == "cpu":
        if serving:
            pred, names = _kind_sum(rank, (Kind.WEIGHTS,))
            out.append(Row("weights", pred, m.by_category.get("PARAMETER") if m.by_category else None, names))
            rest, rest_names = _kind_sum(rank, tuple(k for k in Kind if k not in (Kind.WEIGHTS, Kind.ALLOCATOR, Kind.RUNTIME)))
            measured_rest = (m.peak_allocated_bytes - m.by_category.get("PARAMETER", 0)
                             if m.peak_allocated_bytes is not None else None)
            out.append(Row("kv cache + activations + logits + workspace", rest, measured_rest, rest_names))
        elif m.by_category and m.by_category.get("PARAMETER", 0) < static.get("weights", 0):
            # FSDP2 (ZeRO 2/3): the parameters are DTensors, which the profiler's categories do not see
            # (PARAMETER misses them, their optimizer states fall in UNKNOWN); compare what the job
            # holds, as on CUDA
            out.extend(_held_rows(rank, m, static))
        else:
            # the profiler files fp32 master copies as PARAMETER (the optimizer's params); memest
            # counts them as optimizer states: move them across
            measured = _cpu_measured(m, static.get("master_weights", 0)) if m.by_category else None
            terms: RankEstimate | Sequence[Term] = rank
            moment = None
            if measured is not None and moments and peak_moment in moments:
                near = matched_moment(moments, measured)
                if near != peak_moment:
                    terms, moment = moments[near], near
            floor = round(NEGLIGIBLE_SHARE * (m.peak_allocated_bytes or 0))
            for name, kinds, _ in _CPU_GROUPS:
                pred, names = _kind_sum(terms, kinds)
                got = measured[name] if measured is not None else None
                if pred or got:
                    out.append(Row(name, pred, got, names, moment=moment, floor=floor))
        out.append(Row("peak allocated", rank.allocated_bytes, m.peak_allocated_bytes, total=True))
        return out

    out.extend(_held_rows(rank, m, static))
    out.append(Row("peak allocated", rank.allocated_bytes, m.peak_allocated_bytes, total=True))
    out.append(Row("peak reserved", rank.reserved_bytes, m.peak_reserved_bytes, total=True))
    runtime, r_names = _kind_sum(rank, (Kind.RUNTIME,))
    out.append(Row("non-torch memory", runtime, m.non_torch_bytes, r_names))
    context = next((t.bytes for t in rank.terms if t.name == "runtime.cuda_context"), None)
    out.append(Row("CUDA context (before any tensor)", context, m.cuda_context_bytes, ("runtime.cuda_context",)))
    out.append(Row("device used", rank.device_used_bytes, m.device_used_bytes, total=True))
    return out


def _held_rows(rank: RankEstimate, m: Measurement, static: dict[str, int]) -> list[Row]:
    """weights and optimizer states as the job holds them after the steps (``static``), and the rest at the peak."""
    out: list[Row] = []
    weights, w_names = _kind_sum(rank, (Kind.WEIGHTS,))
    opt, o_names = _kind_sum(rank, (Kind.OPTIMIZER_STATES,))
    m_weights = static.get("weights")
    m_opt = static.get("optimizer_states")
    out.append(Row("weights", weights, m_weights, w_names))
    if opt or m_opt:
        out.append(Row("optimizer_states", opt, m_opt, o_names))
    rest_names = tuple(t.name for t in rank.terms if t.kind not in (Kind.WEIGHTS, Kind.OPTIMIZER_STATES, Kind.ALLOCATOR,
                                                                    Kind.RUNTIME))
    m_rest = None
    if m.peak_allocated_bytes is not None and m_weights is not None:
        m_rest = m.peak_allocated_bytes - m_weights - (m_opt or 0)
    out.append(Row("rest at peak (gradients, activations, logits, kv cache, workspace)",
                   rank.allocated_bytes - weights - opt, m_rest, rest_names))
    return out


# ---- the verdict ----


@dataclass(frozen=True, slots=True)
class VerdictCheck:
    """Was the fit verdict right?

    Attributes:
        predicted_fits: The estimate's verdict on this device with the headroom.
        measured_fits: Every rank ran its steps without running out of memory.
        headroom: Share of memory the verdict kept free.
    """

    predicted_fits: bool
    measured_fits: bool
    headroom: float

    @property
    def status(self) -> str:
        """``right``; ``conservative`` (predicted no fit, it ran); ``missed`` (predicted a fit, it ran out of memory)."""
        if self.predicted_fits == self.measured_fits:
            return "right"
        return "conservative" if self.measured_fits else "missed"


def rank_estimate(est: Estimate, rank: int) -> RankEstimate:
    """The estimate of global ``rank`` (calibrate runs data parallelism only: every rank alike)."""
    if len(est.ranks) == 1:
        return est.ranks[0]
    raise ValueError(f"estimate has {len(est.ranks)} kinds of rank; calibrate measures data-parallel jobs only")


@dataclass(frozen=True, slots=True)
class RankComparison:
    """One rank: its measurement and the rows against its estimate."""

    rank: int
    measurement: Measurement
    rows: tuple[Row, ...]

    def row(self, name: str) -> Row:
        """The row called ``name``.

        Raises:
            KeyError: no such row.
        """
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(name)


def compare(est: Estimate, payloads: list[dict[str, Any]], *, serving: bool,
            moments: Mapping[str, Sequence[Term]] | None = None) -> list[RankComparison]:
    """Rows for every rank's payload (``{"measurement", "static"}`` as the workers send them); ``moments``: the
    training estimate's moments (:func:`rows`)."""
    out = []
    peak = est.extra.get("peak_moment")
    for payload in payloads:
        m = Measurement.from_dict(payload["measurement"])
        out.append(RankComparison(m.rank, m, tuple(rows(rank_estimate(est, m.rank), m, payload.get("static"),
                                                         serving=serving, moments=moments, peak_moment=peak))))
    return sorted(out, key=lambda c: c.rank)


# ---- everything about one run ----


@dataclass(frozen=True, slots=True)
class Calibration:
    """A calibration run judged: the estimate for the device that ran, each rank's rows, the verdict.

    Attributes:
        device: The device the estimate was made for (the one that ran).
        estimate: The estimate of the workload on it.
        ranks: Each rank's comparison.
        verdict: Whether the fit verdict was right.
    """

    device: Device
    estimate: Estimate
    ranks: tuple[RankComparison, ...]
    verdict: VerdictCheck

    @property
    def fits(self) -> bool:
        """Every rank finished its steps."""
        return self.verdict.measured_fits


def evaluate(spec: Any, workload: Any, payloads: list[dict[str, Any]], *, headroom: float) -> Calibration:
    """Estimate ``workload`` for the device in ``payloads`` and compare every rank.

    Raises:
        ValueError: ``payloads`` is empty.
    """
    from memest.estimate import estimate
    from memest.planning.search import verdict
    from memest.workload import ServingConfig

    if not payloads:
        raise ValueError("no measurement to compare")
    first = Measurement.from_dict(payloads[0]["measurement"])
    device = local_device(first.backend, first.device_name, first.device_total_bytes,
                          payloads[0].get("environment", {}).get("device_capability"))
    est = estimate(spec, workload, device)
    serving = isinstance(workload, ServingConfig)
    alive = None
    if not serving and first.backend == "cpu" and len(est.ranks) == 1:
        from memest.estimate.training import moments

        alive = moments(spec, workload, device)
    ranks = tuple(compare(est, payloads, serving=serving, moments=alive))
    predicted = verdict(est, device, workload.parallelism.world_size, headroom)
    check = VerdictCheck(predicted.fits, all(r.measurement.fits for r in ranks), headroom)
    return Calibration(device, est, ranks, check)
