"""``megatron``: an fp32 ``main_grad`` buffer of every parameter (``--accumulate-allreduce-grads-in-fp32``,
forced with bf16), fp32 master + Adam sharded over dp with the distributed optimizer (``zero_stage``
1): 6 + 12/N B/param (``megatron/core/optimizer/distrib_optimizer.py``)."""

from __future__ import annotations

from memest.estimate.runtime import cuda_block_bytes
from memest.estimate.training.protocol import FrameworkStates, StateContext, zero3_weight_shards
from memest.result import Kind, Term

FLAT_STATES = True
PER_PARAMETER_SHARDS = False
weight_shards = zero3_weight_shards


def states(ctx: StateContext) -> FrameworkStates:
    """The main_grad buffer; no param.grad, no step temporaries (fused kernels)."""
    numel = sum(local * c for _, local, c in ctx.trainable)
    return FrameworkStates(persistent=(Term("gradients.main_grad", Kind.GRADIENTS, cuda_block_bytes(numel * 4),
                                            "P_trainable x 4 B fp32 main_grad buffer"),))
