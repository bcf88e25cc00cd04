"""``ddp``: as :mod:`.pytorch`, plus bucket buffers covering every trained parameter at the gradient
dtype (``torch/nn/parallel/distributed.py``, ``gradient_as_bucket_view=False``)."""

from __future__ import annotations

from memest.estimate.runtime import cuda_block_bytes
from memest.estimate.training import pytorch
from memest.estimate.training.protocol import FrameworkStates, StateContext, zero3_weight_shards
from memest.result import Kind, Term

FLAT_STATES = False
PER_PARAMETER_SHARDS = False
weight_shards = zero3_weight_shards


def states(ctx: StateContext) -> FrameworkStates:
    """PyTorch's param.grad and step temporaries, and the gradient buckets."""
    numel = sum(local * c for _, local, c in ctx.trainable)
    buckets = Term("gradients.ddp_buckets", Kind.GRADIENTS, cuda_block_bytes(numel * ctx.gb),
                   f"P_trainable x {ctx.gb} B DDP gradient buckets")
    return pytorch.states(ctx)._replace(persistent=(buckets,))
