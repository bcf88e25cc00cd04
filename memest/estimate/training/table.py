"""The step's moments as a table: which lifetimes are alive at each.

**The peak is a moment, not a sum of maxima.** Six to eight moments of a steady-state step are built, each
from the tensors alive at that time (:data:`MOMENTS`, :data:`MOMENT_TABLE`); the largest sets the peak and its terms are
reported (the moment's name is in ``Estimate.extra["peak_moment"]`` and the assumptions):

1. ``layer_forward``: inside a layer's forward: the stored activations of the layers before it and
   what the layer holds then (eager attention's masked scores and their fp32 copy at its softmax;
   under recompute the whole working set of one checkpointed layer, whose saved tensors are
                      "autocast.all", "masks", "activations.layer_forward", "activations.previous_microbatch"),
    "head_forward": ("states", "grads.forward", "gathered", "activations.stored.loss", "activations.head",
                     "autocast.all", "activations.previous_microbatch", "logits.head_forward", "dequantized.head"),
    "loss_forward": ("states", "grads.forward", "gathered", "activations.stored.loss", "activations.head",
                     "autocast.all", "activations.previous_microbatch", "logits.forward"),
    "loss_backward": ("states", "grads.forward", "gathered.loss", "buffers.backward", "activations.stored.loss",
   their fp32 upcast and the fp32 log-softmax (transformers ``ForCausalLMLoss``), and gradients
   that live through the forward (accumulation, ``set_to_none=False``);
4. ``loss_backward``: the start of backward through the cross-entropy: every layer's saved tensors,
   the fp32 log-probabilities and two fp32 gradients of the logits (and an NF4 lm_head dequantized
   for its backward, litgpt's QLoRA);
5. ``first_layer_backward``: the last layer's backward (rebuilt under full recompute, with its
   recomputation's temporaries), logits freed, the head's gradients allocated;
6. ``last_layer_backward``: the first layer's backward: one layer's activations left, the
   gradients of everything but that layer and the (untied) embeddings allocated;
7. ``gradient_reduction`` (DeepSpeed ZeRO 1 only): after backward, every gradient, the reduce bucket and
   the rank's gradient partition;
8. ``optimizer_step``: activations freed, gradients and the optimizer's temporaries alive.
"""

from __future__ import annotations

MOMENTS = ("layer_forward", "head_forward", "loss_forward", "loss_backward", "first_layer_backward", "last_layer_backward",
           "gradient_reduction", "optimizer_step")
"""The moments of a step whose allocated bytes the estimate compares (module docstring; ``head_forward`` for
an NF4 lm_head only, ``gradient_reduction`` for DeepSpeed ZeRO 1 only)."""

MOMENT_TABLE: dict[str, tuple[str, ...]] = {
    "layer_forward": ("states", "grads.forward", "gathered.running", "activations.stored", "activations.embedding",
                      "autocast.all", "masks", "activations.layer_forward", "activations.previous_microbatch"),
    "head_forward": ("states", "grads.forward", "gathered", "activations.stored.loss", "activations.head",
                     "autocast.all", "activations.previous_microbatch", "logits.head_forward", "dequantized.head"),
    "loss_forward": ("states", "grads.forward", "gathered", "activations.stored.loss", "activations.head",
                     "autocast.all", "activations.previous_microbatch", "logits.forward"),
    "loss_backward": ("states", "grads.forward", "gathered.loss", "buffers.backward", "activations.stored.loss",
                      "activations.head", "autocast.all", "logits.backward", "dequantized.head"),
    "first_layer_backward": ("states", "grads.head", "gathered.running", "buffers.backward", "buffers.layer",
                             "activations.stored", "activations.rebuilt", "masks.rebuilt", "activations.backward",
                             "dequantized", "autocast.all"),
    "last_layer_backward": ("states", "grads.later", "gathered.first", "buffers.backward", "buffers.layer",
                            "buffers.reduce_input", "activations.first_layer", "masks.rebuilt",
                            "activations.first_layer_backward", "dequantized", "activations.other_microbatches",
                            "autocast.layer"),
    "gradient_reduction": ("states", "grads.all", "reduction"),
    "optimizer_step": ("states", "grads.step", "step"),
}
"""Moment -> the lifetimes alive then, in the order their terms are listed (:func:`.step.lifetimes` gives
each lifetime's terms). ``head_forward`` exists only when its ``dequantized.head`` lifetime holds a term,
``gradient_reduction`` only when its ``reduction`` lifetime does (:data:`OPTIONAL_MOMENTS`)."""

OPTIONAL_MOMENTS: dict[str, str] = {"head_forward": "dequantized.head", "gradient_reduction": "reduction"}
"""Moment -> the state lifetime without whose terms the moment does not exist."""

STATE_LIFETIMES = ("gathered", "gathered.running", "gathered.loss", "gathered.first", "buffers.backward",
                   "buffers.layer", "buffers.reduce_input", "reduction", "step", "dequantized", "dequantized.head",
                   "grads.all", "grads.step")
"""The lifetimes the model states hold by themselves (:attr:`.states.ModelStates.lifetimes`, in this order)."""

ACTIVATION_LIFETIMES = ("activations.stored", "activations.stored.loss", "activations.embedding", "activations.head", "activations.layer_forward",
                        "activations.rebuilt", "activations.backward", "activations.first_layer",
                        "activations.first_layer_backward", "activations.other_microbatches", "autocast.all",
                        "autocast.layer", "masks", "masks.rebuilt", "logits.forward", "logits.backward",
                        "activations.previous_microbatch", "logits.head_forward")
"""The activations' lifetimes (:attr:`.activation_terms.ActivationTerms.lifetimes`, in this order)."""

SETUP_LIFETIMES = ("states", "grads.forward", "grads.head", "grads.later")
"""The lifetimes that depend on the device (the cuBLAS workspace beside the states) or on whether gradients
live through the forward (:func:`.step.lifetimes`, in this order)."""

LIFETIMES = STATE_LIFETIMES + ACTIVATION_LIFETIMES + SETUP_LIFETIMES
"""Every lifetime, in the order :func:`.step.lifetimes` lists their terms."""

assert sorted(LIFETIMES) == sorted({name for names in MOMENT_TABLE.values() for name in names})
