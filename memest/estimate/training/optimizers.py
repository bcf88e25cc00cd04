"""Optimizer states and step temporaries.

AdamW 2 states; Lion, SGD-momentum 1; SGD 0; Adafactor a row and a column vector per matrix
(factored second moment, ``beta1=None``); 8-bit AdamW 2 x (1 B + 4 B per 256-element block)
(``bitsandbytes/optim/optimizer.py``, ``blocksize = 256``; tensors under 4096 elements keep 32-bit
states). Step temporaries: torch ``foreach`` AdamW one state-sized tensor (``torch/optim/adamw.py``,
``_multi_tensor_adamw``: ``exp_avg_sq_sqrt = torch._foreach_sqrt``); Adafactor and Lion two resp.
one copy of the largest tensor; fused kernels none.

Paged optimizers (bitsandbytes ``is_paged``, 0.42-0.50 ``bitsandbytes/optim/optimizer.py``
``Optimizer8bit.get_state_buffer``): the state of a tensor of at least 1e5 elements comes from
``F.get_paged`` (``bitsandbytes/functional.py``), a ``torch.frombuffer`` view of memory from
``cudaMallocManaged(&ptr, bytes, cudaMemAttachHost)`` (``csrc/pythonInterface.cpp`` ``cget_managed_ptr``);
smaller tensors' states, and every ``absmax`` / ``qmap``, are ``torch.zeros`` on the device. Managed
memory is outside PyTorch's caching allocator: ``torch.cuda.max_memory_allocated`` / ``_reserved`` never
count it. ``step()`` prefetches each parameter's paged states to the device (``prefetch_state``:
``cudaMemPrefetchAsync``) before its update, so they are resident, in nvidia-smi's figure, while the device
has room; when it fills, the driver evicts managed pages to host RAM instead of failing
(:func:`paged_bytes`, :mod:`.step`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from memest.estimate.training.trained import Item, blocks
from memest.result import Kind, Term
from memest.spec import ModelSpec, TensorSpec
from memest.workload import Offload, Optimizer, TrainingConfig

BNB_BLOCK = 256
"""bitsandbytes 8-bit optimizers: one fp32 absmax per 256 state values."""


BNB_MIN_8BIT_SIZE = 4096
"""bitsandbytes keeps 32-bit states for tensors smaller than this (``min_8bit_size``)."""

BNB_PAGED_MIN_NUMEL = 100_000
"""bitsandbytes paged optimizers page the states of tensors of at least this many elements
(``get_state_buffer``: ``if not self.is_paged or p.numel() < 1e5: return torch.zeros_like(...)``)."""

PAGED_OPTIMIZERS = frozenset({Optimizer.PAGED_ADAMW8BIT, Optimizer.PAGED_ADAMW32BIT})
"""Optimizers whose large states live in CUDA managed memory (bitsandbytes ``is_paged=True``)."""


def state_bytes_per_param(opt: Optimizer, state: int, numel: int = BNB_MIN_8BIT_SIZE) -> float:
    """Optimizer-state bytes per trainable element of a tensor of ``numel`` elements (not Adafactor)."""
    if opt in (Optimizer.ADAMW, Optimizer.ADAMW_FUSED):
        return 2 * state
    if opt in (Optimizer.ADAMW8BIT, Optimizer.PAGED_ADAMW8BIT):
        return 2 * (1 + 4 / BNB_BLOCK) if numel >= BNB_MIN_8BIT_SIZE else 2 * 4
    if opt is Optimizer.PAGED_ADAMW32BIT:  # Optimizer2State with optim_bits=32: fp32 state1, state2
        return 2 * 4
    if opt in (Optimizer.LION, Optimizer.SGD_MOMENTUM):
        return state
    if opt is Optimizer.SGD:
        return 0
    raise ValueError(f"no per-element state size for {opt.value}")


def optimizer_bytes(trainable: Sequence[tuple[TensorSpec, int, int]], opt: Optimizer, state: int) -> int:
    """Optimizer-state bytes for (tensor, local numel, count) triples."""
    if opt is Optimizer.ADAFACTOR:
        total = 0
        for tensor, local, count in trainable:
            if len(tensor.shape) >= 2:
                ratio = local / tensor.numel
                # HF Adafactor: exp_avg_sq_row over shape[:-1], exp_avg_sq_col over shape[:-2] + shape[-1:]
                rows, cols = math.prod(tensor.shape[:-1]), math.prod(tensor.shape[:-2]) * tensor.shape[-1]
                total += count * 4 * math.ceil((rows + cols) * ratio)
            else:
                total += count * 4 * local
        return total
    return math.ceil(sum(local * count * state_bytes_per_param(opt, state, local) for _, local, count in trainable))


def paged_bytes(trainable: Sequence[tuple[TensorSpec, int, int]], opt: Optimizer) -> int:
    """Bytes of the optimizer states a paged optimizer keeps in CUDA managed memory, for (tensor, local
    numel, count) triples: the states of tensors of at least :data:`BNB_PAGED_MIN_NUMEL` elements (always
    8-bit for ``paged_adamw8bit``: 1e5 > ``min_8bit_size``; two uint8 states, 2 B per element, their fp32
    ``absmax`` blocks staying in the allocator as ``torch.zeros``; ``paged_adamw32bit``: two fp32 states, 8 B);
    0 for any other optimizer."""
    if opt not in PAGED_OPTIMIZERS:
        return 0
    per = 2 if opt is Optimizer.PAGED_ADAMW8BIT else 8
    return sum(local * count * per for _, local, count in trainable if local >= BNB_PAGED_MIN_NUMEL)


def step_temporaries(spec: ModelSpec, t: TrainingConfig, trainable: Sequence[Item],
                      state_b: int, shard: int, *, fused: bool) -> list[Term]:
    """Temporaries of torch optimizers during their step."""
    if fused or t.offload is not Offload.NONE or not trainable:
        return []
    largest = max(local for _, local, _ in trainable)
    if t.optimizer is Optimizer.ADAMW:
        return [Term("workspace.optimizer_step", Kind.WORKSPACE, blocks(trainable, state_b, shard),
                     f"P_trainable x {state_b} B" + (f" / {shard}" if shard > 1 else "") + " (foreach sqrt of exp_avg_sq)")]
    if t.optimizer is Optimizer.ADAFACTOR:
        return [Term("workspace.optimizer_step", Kind.WORKSPACE, 2 * largest * 4,
                     "2 x largest tensor x 4 B (fp32 update and squared gradient)")]
    if t.optimizer is Optimizer.LION:
        return [Term("workspace.optimizer_step", Kind.WORKSPACE, largest * state_b, f"largest tensor x {state_b} B (update)")]
    return []
