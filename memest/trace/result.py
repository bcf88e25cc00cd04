"""What a trace found: the peak of each rank, what was live at that moment, and the timeline.

Plain data (ints for bytes, the :class:`~memest.result.Kind` names for categories); no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memest.result import Kind


@dataclass(frozen=True, slots=True)
class TensorGroup:
    """Live tensors at the peak that share a kind and an origin.

    Attributes:
        kind: Their category.
        label: Where they come from: the operator that allocated them (``aten.mm``), with the
            shape and dtype (``(4096, 11008) bfloat16``), or a role (``parameter``, ``gradient``).
        count: How many storages.
        bytes: Their bytes, as the caching allocator's blocks (512-byte multiples) on a CUDA target.
    """

    kind: Kind
    label: str
    count: int
    bytes: int


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    """Allocated bytes by kind after one allocation or free.

    Attributes:
        event: Index of the allocation/free event in the step (0-based).
        phase: ``setup``, ``forward``, ``backward``, ``optimizer``, ``prefill`` or ``decode``.
        by_kind: Allocated bytes per kind at that moment (kinds with zero bytes omitted).
    """

    event: int
    phase: str
    by_kind: dict[Kind, int]

    @property
    def allocated_bytes(self) -> int:
        """The sum over kinds."""
        return sum(self.by_kind.values())


@dataclass(frozen=True, slots=True, kw_only=True)
class RankTrace:
    """The trace of one rank.

    Attributes:
        rank: The rank simulated (0 holds the largest shards under FSDP2's chunking).
        peak_allocated_bytes: Peak of the simulated caching allocator's allocated bytes
            (``torch.cuda.max_memory_allocated``); on a CPU target, the peak of tensor bytes.
        peak_reserved_bytes: Peak of its reserved segments (``max_memory_reserved``); equal to
            peak_allocated_bytes on a CPU target.
        peak_tensor_bytes: Peak of the tensors' own bytes (no rounding), at its own moment.
        by_kind: Allocated bytes per kind at the peak (they add up to peak_allocated_bytes).
        peak_phase: The phase the peak falls in.
        peak_event: Index of the event at which the peak was reached.
        num_events: Allocation and free events in the step.
        phase_peaks: The highest allocated bytes within each phase of the traced step (the
            warm-up ``setup`` phase excluded), in the order the phases ran.
        groups: The largest groups of tensors live at the peak, largest first.
        timeline: Allocated bytes by kind over the step, sampled.
    """

    rank: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_tensor_bytes: int
    by_kind: dict[Kind, int]
    peak_phase: str
    peak_event: int
    num_events: int
    phase_peaks: dict[str, int] = field(default_factory=dict)
    groups: tuple[TensorGroup, ...] = ()
    timeline: tuple[TimelinePoint, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceResult:
    """A traced step of a training or serving job.

    Attributes:
        model: The model's name.
        mode: ``train``, ``lora`` or ``serve``.
        target: ``cuda`` (flash/efficient attention kernels, 512-byte caching allocator) or ``cpu``.
        world_size: Devices simulated (the FSDP2 sharding group; 1 without sharding).
        ranks: The ranks traced (rank 0 first).
        seconds: Wall time of the trace, model build included.
        num_ops: Operators dispatched.
        settings: What was simulated, in words (recipe, attention kernel, cache, ...).
    """

    model: str
    mode: str
    target: str
    world_size: int
    ranks: tuple[RankTrace, ...]
    seconds: float
    num_ops: int
    settings: tuple[str, ...] = field(default=())

    @property
    def per_device(self) -> RankTrace:
        """The rank with the highest peak allocated."""
        return max(self.ranks, key=lambda r: r.peak_allocated_bytes)
