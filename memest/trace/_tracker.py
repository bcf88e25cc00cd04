"""The allocation tracker: every storage created and freed while the model code runs on the meta device.

:class:`StorageTracker` is a ``TorchDispatchMode``: it sees each aten operator below autograd, so
forward, backward (including activation-checkpoint recomputation) and the optimizer step all pass
through it. For each output it looks at the tensor's storage: a storage not seen before is an
allocation of ``storage.nbytes()`` bytes; a weak reference to the storage's Python object reports
the free when PyTorch releases the storage (storages keep their Python object alive as long as
they live, so the callback fires exactly when the memory would be returned). Views and in-place
results share a storage and cost nothing. This is the whole per-operator cost — a dictionary
lookup per output — which keeps a Llama-2-7B step at seq_len 4096 in about a second of tracking,
where ``torch.distributed._tools.MemTracker`` walks module states and takes ~10x longer.

Events are recorded as a list (allocation = record id, free = ``~id``); the caching-allocator
replay (:mod:`memest.trace.allocator`) turns each request into the block CUDA would hand out, so
the peak is the one ``torch.cuda.max_memory_allocated`` would report. Kinds are settled after the
step (:meth:`StorageTracker.retag`): a storage that ended as a parameter's ``.grad`` is a
gradient, one held in the optimizer's state is an optimizer state, and so on.

Kernel-internal workspaces that a CUDA kernel allocates through the caching allocator but never
returns are added by :data:`TRANSIENTS` (flash-attention backward's ``dq_accum`` and
``softmax_d``, and the expanded dK/dV of grouped-query attention).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from memest.result import Kind
from memest.trace.allocator import CachingAllocator

_LIVE = -1
_IGNORED = -2


class _Ref(weakref.ref):  # type: ignore[type-arg]
    __slots__ = ("key",)


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _flash_backward_workspace(args: tuple[Any, ...]) -> list[tuple[int, str]]:
    """Buffers FlashAttention-2's ``mha_bwd`` allocates besides dQ/dK/dV.

    PyTorch ``aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp`` (``mha_bwd``):
    ``softmax_d`` fp32 ``(b, a, s_q rounded to 128)``; ``dq_accum`` fp32 ``(b, s_q rounded to 128,
    a, d rounded to 32)``; with grouped-query attention ``dk_expanded`` / ``dv_expanded`` at the
    input dtype ``(b, s_k, a, d)`` before they are summed into dK and dV.
    """
    grad_out, query, key = args[0], args[1], args[2]
    b, a, s_q, d = query.shape
    s_k, k = key.shape[-2], key.shape[-3]
    s_q_r = _round_up(s_q, 128)
    d_r = _round_up(d, 32) if d <= 192 else 256
    out = [
        (4 * b * a * s_q_r, "flash backward softmax_d (fp32)"),
        (4 * b * s_q_r * a * d_r, "flash backward dq_accum (fp32)"),
    ]
    if k != a:
        item = grad_out.element_size()
        out.append((item * b * s_k * a * d, "flash backward dk_expanded (GQA)"))
        out.append((item * b * s_k * a * args[3].shape[-1], "flash backward dv_expanded (GQA)"))
    return out


TRANSIENTS: dict[Any, Callable[[tuple[Any, ...]], list[tuple[int, str]]]] = {
    torch.ops.aten._scaled_dot_product_flash_attention_backward.default: _flash_backward_workspace,
}
"""Operators whose CUDA kernels allocate workspaces they free before returning: op -> (bytes, label) list."""


class StorageTracker(TorchDispatchMode):
    """Counts storages as they are allocated and freed; replays them through the caching allocator.

    Args:
        cuda: True to replay allocations through :class:`~memest.trace.allocator.CachingAllocator`
            (512-byte blocks, the figure ``torch.cuda`` reports); False counts tensor bytes only.
        devices: Device types whose tensors are the simulated device's (``meta``; ``cpu`` too
            when the model runs as fake CPU tensors). Others — the CPU scalars an optimizer keeps
            its step count in — are not device memory.

    Attributes:
        kind: The kind new allocations get until :meth:`retag` settles them.
        phase: The phase new allocations are recorded in.
        num_ops: Operators dispatched.
    """

    def __init__(self, *, cuda: bool = True, devices: tuple[str, ...] = ("meta",)) -> None:
        super().__init__()
        self.devices = devices
        self.allocator: CachingAllocator | None = CachingAllocator() if cuda else None
        self.nbytes: list[int] = []
        self.block: list[int] = []
        self.kinds: list[Kind] = []
        self.labels: list[Any] = []
        self.phases: list[str] = []
        self.alloc_event: list[int] = []
        self.free_event: list[int] = []
        self.events: list[int] = []
        self._live: dict[int, int] = {}
        self._refs: dict[int, _Ref] = {}
        self.kind = Kind.WORKSPACE
        self.phase = "setup"
        self.allocated = 0
        self.peak = 0
        self.peak_event = -1
        self.tensor_bytes = 0
        self.peak_tensor_bytes = 0
        self.num_ops = 0
        self.closed = False
        self.phase_marks: list[tuple[int, str]] = [(0, "setup")]

    # ---- dispatch ----

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.num_ops += 1
        workspace = TRANSIENTS.get(func)
        temps = [self.allocate(n, Kind.WORKSPACE, label) for n, label in workspace(args)] if workspace else ()
        if isinstance(out, torch.Tensor):
            self._see(out, func)
        elif isinstance(out, tuple | list):
            for o in out:
                if isinstance(o, torch.Tensor):
                    self._see(o, func)
        for rid in temps:
            self.release(rid)
        return out

    def _see(self, t: torch.Tensor, func: Any) -> None:
        if type(t) is not torch.Tensor and hasattr(t, "__tensor_flatten__"):
            # a wrapper subclass (DTensor): its storage is a placeholder of the global shape; the
            # memory is in its inner tensors (the local shard)
            for name in t.__tensor_flatten__()[0]:
                inner = getattr(t, name)
                if isinstance(inner, torch.Tensor):
                    self._see(inner, func)
            return
        if t.device.type not in self.devices:
            return
        st = t.untyped_storage()
        key = st._cdata
        rid = self._live.get(key)
        if rid is not None:
            if rid == _IGNORED:
                return
            if st.nbytes() != self.nbytes[rid]:
                self._resized(key, st, (func, tuple(t.shape), t.dtype))
            return
        self._track(key, st, (func, tuple(t.shape), t.dtype), self.kind)

    def _track(self, key: int, st: Any, label: Any, kind: Kind) -> int:
        rid = self.allocate(st.nbytes(), kind, label)
        self._live[key] = rid
        if key not in self._refs:
            ref = _Ref(st, self._dead)
            ref.key = key
            self._refs[key] = ref
        return rid

    def _resized(self, key: int, st: Any, label: Any, kind: Kind | None = None) -> None:
        rid = self._live.pop(key)
        kind = kind or self.kinds[rid]
        self.release(rid)
        self._track(key, st, label, kind)

    def _dead(self, ref: _Ref) -> None:
        key = ref.key
        self._refs.pop(key, None)
        rid = self._live.pop(key, None)
        if rid is not None and rid != _IGNORED and not self.closed:
            self.release(rid)

    # ---- bookkeeping ----

    def allocate(self, nbytes: int, kind: Kind, label: Any) -> int:
        """Record an allocation of ``nbytes``; returns its record id."""
        rid = len(self.nbytes)
        block = self.allocator.malloc(rid, nbytes) if self.allocator is not None else nbytes
        self.nbytes.append(nbytes)
        self.block.append(block)
        self.kinds.append(kind)
        self.labels.append(label)
        self.phases.append(self.phase)
        self.alloc_event.append(len(self.events))
        self.free_event.append(_LIVE)
        self.events.append(rid)
        self.allocated += block
        if self.allocated > self.peak:
            self.peak = self.allocated
            self.peak_event = len(self.events) - 1
        self.tensor_bytes += nbytes
        self.peak_tensor_bytes = max(self.peak_tensor_bytes, self.tensor_bytes)
        return rid

    def release(self, rid: int) -> None:
        """Record the free of record ``rid``."""
        if self.free_event[rid] != _LIVE:
            return
        if self.allocator is not None:
            self.allocator.free(rid)
        self.allocated -= self.block[rid]
        self.tensor_bytes -= self.nbytes[rid]
        self.free_event[rid] = len(self.events)
        self.events.append(~rid)

    def enter_phase(self, phase: str, kind: Kind) -> int:
        """Start a phase; new allocations get ``kind`` until told otherwise. Returns the next event index."""
        self.phase = phase
        self.kind = kind
        self.phase_marks.append((len(self.events), phase))
        return len(self.events)

    @contextlib.contextmanager
    def recomputing(self) -> Iterator[None]:
        """Within the block (activation-checkpoint recomputation), new allocations are activations."""
        kind = self.kind
        self.kind = Kind.ACTIVATIONS
        try:
            yield
        finally:
            self.kind = kind

    def reset_peak(self) -> None:
        """Start the peak over from now (``torch.cuda.reset_peak_memory_stats``)."""
        self.peak = self.allocated
        self.peak_event = len(self.events) - 1
        self.peak_tensor_bytes = self.tensor_bytes
        if self.allocator is not None:
            self.allocator.peak_allocated_bytes = self.allocator.allocated_bytes
            self.allocator.peak_reserved_bytes = self.allocator.reserved_bytes

    def record_of(self, t: torch.Tensor) -> int | None:
        """The live record of ``t``'s storage, if tracked."""
        rid = self._live.get(t.untyped_storage()._cdata)
        return None if rid == _IGNORED else rid

    def adopt(self, tensors: Iterable[torch.Tensor], kind: Kind, label: str) -> None:
        """Track storages that exist already (parameters, buffers) as allocated now."""
        for t in tensors:
            st = t.untyped_storage()
            key = st._cdata
            if key not in self._live:
                self._track(key, st, label, kind)

    def ignore(self, tensors: Iterable[torch.Tensor]) -> None:
        """Stop counting these storages: they are not the device's (an optimizer's CPU step counters
        when the whole model runs as fake CPU tensors)."""
        for t in tensors:
            st = t.untyped_storage()
            key = st._cdata
            rid = self._live.get(key)
            if rid is not None and rid != _IGNORED:
                self.release(rid)
            self._live[key] = _IGNORED
            if key not in self._refs:
                ref = _Ref(st, self._dead)
                ref.key = key
                self._refs[key] = ref

    def resync(self, t: torch.Tensor) -> None:
        """Re-read ``t``'s storage size after a ``storage.resize_`` done outside the dispatcher (FSDP2)."""
        st = t.untyped_storage()
        key = st._cdata
        rid = self._live.get(key)
        if rid == _IGNORED:
            return
        if rid is None:
            self._track(key, st, "FSDP unsharded parameter", Kind.WORKSPACE)
        elif st.nbytes() != self.nbytes[rid]:
            self._resized(key, st, "FSDP unsharded parameter", Kind.WORKSPACE)

    def retag(self, tensors: Iterable[torch.Tensor], kind: Kind, label: str | None = None) -> None:
        """Settle the kind (and label) of the live storages of ``tensors``."""
        for t in tensors:
            rid = self._live.get(t.untyped_storage()._cdata)
            if rid is not None and rid != _IGNORED:
                self.kinds[rid] = kind
                if label is not None:
                    self.labels[rid] = label

    def retag_freed_since(self, first_event: int, kind_from: Kind, kind_to: Kind) -> None:
        """Records allocated at or after ``first_event`` with ``kind_from`` and already freed become ``kind_to``.

        Used at the end of a forward: what the forward allocated and freed again was a temporary,
        not an activation kept for backward.
        """
        first = self._first_record_at(first_event)
        for rid in range(first, len(self.nbytes)):
            if self.kinds[rid] is kind_from and self.free_event[rid] != _LIVE:
                self.kinds[rid] = kind_to

    def _first_record_at(self, event: int) -> int:
        lo, hi = 0, len(self.alloc_event)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.alloc_event[mid] < event:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def close(self) -> None:
        """Stop recording frees (storages dying after the trace are not part of it)."""
        self.closed = True


def describe(label: Any) -> str:
    """A record's label as text: ``aten.mm (4096, 11008) bfloat16`` or the role it was given."""
    if isinstance(label, str):
        return label
    func, shape, dtype = label
    name = str(func).removesuffix(".default")
    return f"{name} {tuple(shape)} {str(dtype).removeprefix('torch.')}"
