"""``pytorch``: param.grad appears during backward (the last layer's first) and is freed by
``zero_grad(set_to_none=True)``; with grad_accum_steps > 1 or ``set_to_none=False`` it lives through
the forward too (:mod:`.step`). torch optimizers keep their states per parameter and their step's
temporaries (:func:`.optimizers.step_temporaries`); with torchtune's ``optimizer_in_bwd`` each gradient is
stepped and freed in backward (:mod:`.in_backward`)."""

from __future__ import annotations

from memest.estimate.training.in_backward import stepped_in_backward
from memest.estimate.training.optimizers import step_temporaries
from memest.estimate.training.protocol import FrameworkStates, StateContext, zero3_weight_shards
from memest.estimate.training.trained import blocks, param_gradients

FLAT_STATES = False
PER_PARAMETER_SHARDS = False
weight_shards = zero3_weight_shards


def states(ctx: StateContext) -> FrameworkStates:
    """param.grad and the optimizer step's temporaries."""
    fs = FrameworkStates(gradients=param_gradients(ctx.groups, ctx.gb, f"P_trainable x {ctx.gb} B (param.grad)"),
                         step=tuple(step_temporaries(ctx.spec, ctx.t, ctx.trainable, ctx.state_b, 1, fused=False)))
    if not ctx.t.optimizer_in_bwd or not ctx.groups.used:
        return fs
    tensor, local, _ = max(ctx.groups.used, key=lambda item: item[1])
    one = (tensor, local, 1)
    return stepped_in_backward(fs, ctx, blocks([one], ctx.gb), f"largest trained parameter x {ctx.gb} B (its param.grad)",
                               one, 1)
