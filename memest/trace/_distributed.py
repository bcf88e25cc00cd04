"""Many devices from one CPU: FSDP2 sharding at world size N over torch.distributed's fake process group.

``FakeStore`` + ``init_process_group("fake", world_size=N)`` gives rank 0 of an N-rank job whose
collectives return at once without moving data; ``init_device_mesh("cpu", (N,))`` and
``fully_shard`` (each decoder layer, then the root, as torchtitan and the FSDP2 docs do) shard
every parameter along dim 0 (``torch.chunk``: ceil(rows / N) rows on rank 0, fewer or none on the last
ranks; every rank's parameter storage is padded to rank 0's size, its optimizer states are not, so
rank 0 is the largest). FSDP2 refuses meta parameters in
training, so the sharded model is materialised as fake CPU tensors (``FakeTensorMode`` +
``to_empty(device="cpu")``: shapes, dtypes and storages without memory). Everything rank 0
allocates — the all-gather buffers, the unsharded parameters of the unit being computed, the
reduce-scatter inputs, the sharded gradients and optimizer states — goes through the tracker.

FSDP2 frees and re-allocates unsharded parameters with ``storage.resize_`` outside the
dispatcher (``_fsdp_param.alloc_storage`` / ``free_storage``); those two functions are wrapped so
the tracker sees each resize.

``zero_stage`` 3 is ``reshard_after_forward=True`` (FULL_SHARD / ZeRO-3); 2 is
``reshard_after_forward=False`` (SHARD_GRAD_OP / ZeRO-2: parameters stay gathered from forward
to backward).

Limitation: on a CPU mesh FSDP2 uses one stream, so the next unit's all-gather is issued when the
CPU reaches it, not overlapped with the current unit as CUDA's all-gather stream does; explicit
forward/backward prefetch of one unit (``set_modules_to_forward_prefetch`` /
``set_modules_to_backward_prefetch``) is set to reproduce that overlap.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from memest.trace._model import decoder_layers
from memest.trace._tracker import StorageTracker


@contextlib.contextmanager
def fake_world(world_size: int, rank: int = 0) -> Iterator[Any]:
    """``rank`` of a fake process group of ``world_size`` ranks; yields its 1-D CPU device mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized; the trace needs its own fake one")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield init_device_mesh("cpu", (world_size,))
    finally:
        dist.destroy_process_group()


def shard(model: Any, mesh: Any, *, param_dtype: torch.dtype | None, reshard_after_forward: bool) -> None:
    """``fully_shard`` each decoder layer and the root, with explicit one-unit prefetch."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else MixedPrecisionPolicy()
    layers = decoder_layers(model)
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    for i, layer in enumerate(layers):
        if i + 1 < len(layers):
            layer.set_modules_to_forward_prefetch([layers[i + 1]])
        if i > 0:
            layer.set_modules_to_backward_prefetch([layers[i - 1]])


@contextlib.contextmanager
def fake_tensors(model: Any) -> Iterator[Any]:
    """Materialise ``model`` as fake CPU tensors and keep FakeTensorMode active."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        model.to_empty(device="cpu")
        yield mode


@contextlib.contextmanager
def storage_resizes_seen(tracker: StorageTracker) -> Iterator[None]:
    """Report FSDP2's ``storage.resize_`` calls (alloc_storage / free_storage) to the tracker."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    original_alloc, original_free = _fsdp_param.alloc_storage, _fsdp_param.free_storage

    def alloc_storage(tensor: torch.Tensor) -> None:
        original_alloc(tensor)
        tracker.resync(tensor)

    def free_storage(tensor: torch.Tensor) -> None:
        original_free(tensor)
        tracker.resync(tensor)

    _fsdp_param.alloc_storage = alloc_storage
    _fsdp_param.free_storage = free_storage
    _fsdp_param_group.alloc_storage = alloc_storage
    try:
        yield
    finally:
        _fsdp_param.alloc_storage = original_alloc
        _fsdp_param.free_storage = original_free
        _fsdp_param_group.alloc_storage = original_alloc
