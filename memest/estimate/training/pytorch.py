"""``pytorch``: param.grad appears during backward (the last layer's first) and is freed by
``zero_grad(set_to_none=True)``; with grad_accum_steps > 1 or ``set_to_none=False`` it lives through
the forward too (:mod:`.step`). torch optimizers keep their states per parameter and their step's
temporaries (:func:`.optimizers.step_temporaries`)."""

from __future__ import annotations

from memest.estimate.training.optimizers import step_temporaries
from memest.estimate.training.protocol import FrameworkStates, StateContext, zero3_weight_shards
from memest.estimate.training.trained import param_gradients

FLAT_STATES = False
PER_PARAMETER_SHARDS = False
weight_shards = zero3_weight_shards


def states(ctx: StateContext) -> FrameworkStates:
    """param.grad and the optimizer step's temporaries."""
    return FrameworkStates(gradients=param_gradients(ctx.groups, ctx.gb, f"P_trainable x {ctx.gb} B (param.grad)"),
                           step=tuple(step_temporaries(ctx.spec, ctx.t, ctx.trainable, ctx.state_b, 1, fused=False)))
