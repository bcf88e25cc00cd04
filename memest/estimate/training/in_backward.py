"""torchtune's optimizer step in backward (``optimizer_in_bwd=True``), as torchtune 0.6 runs it
(``recipes/full_finetune_single_device.py`` / ``full_finetune_distributed.py`` ``_setup_optimizer``: one
optimizer per parameter; ``torchtune/training/memory.py`` ``register_optim_in_bwd_hooks``: a
``register_post_accumulate_grad_hook`` on every trained parameter calls that optimizer's ``step()`` and
``zero_grad()``, which sets the gradient to None).

So no gradient outlives its own hook: at any moment of backward the gradients alive are the ones being
made and stepped, and none is left at the end of backward, where the usual optimizer step would run.
memest counts, at every backward moment, the largest such in-flight gradient (an upper bound: one is
alive at a time in the hook):

- one process (``pytorch``): the largest trained parameter's ``param.grad``;
- FSDP2: a unit's reduce-scatter output. ``foreach_reduce`` (torch 2.13
  ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``) views every sharded gradient of the unit
  out of one flat ``reduce_output`` and runs each parameter's post-accumulate-grad hooks in that loop, so
  the whole unit's shard (unit / N elements at the reduce dtype) is alive until the loop ends; the largest
  unit (the root's embeddings and head, or a layer).

The step's own temporaries move into backward too: a foreach AdamW on one parameter makes one
state-sized tensor of it (:func:`.optimizers.step_temporaries`); fused kernels none.
"""

from __future__ import annotations

import dataclasses

from memest.estimate.training.optimizers import step_temporaries
from memest.estimate.training.protocol import FrameworkStates, StateContext
from memest.estimate.training.trained import Gradients, Item
from memest.result import Kind, Term


def stepped_in_backward(fs: FrameworkStates, ctx: StateContext, in_flight: int, formula: str,
                        largest: Item, shard: int) -> FrameworkStates:
    """``fs`` with its gradients stepped and freed in backward: ``in_flight`` bytes of them at each
    backward moment (``formula`` says which), none at the step; the step's temporaries of one parameter
    (``largest``, split over ``shard`` ranks) during each layer's backward."""
    grads = Gradients(all=in_flight, head=in_flight, before_first_layer=in_flight,
                      formula=formula + " (optimizer_in_bwd: each stepped and freed by its post-accumulate-grad hook)")
    one = tuple(step_temporaries(ctx.spec, ctx.t, [largest], ctx.state_b, shard, fused=False))
    one = tuple(dataclasses.replace(term, formula=term.formula + ", one parameter's step in its backward hook")
                for term in one)
    return fs._replace(gradients=grads, step=(), layer_buffers=fs.layer_buffers + one,
                       step_grads=Term("gradients", Kind.GRADIENTS, 0, "stepped and freed in backward (optimizer_in_bwd)"))
