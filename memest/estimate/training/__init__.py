"""Training memory per rank: model states, activations and logits at the moment of the step's peak.

One module per job:

- :mod:`.recipes`: the precision recipes (bytes per element of each kind of state);
- :mod:`.trained`: what trains on a rank and the groups backward makes its gradients in;
- :mod:`.lora`: which weights LoRA adapts; :mod:`.optimizers`: optimizer states and step temporaries;
- :mod:`.protocol`: the one protocol of the frameworks, each a module: :mod:`.pytorch`, :mod:`.ddp`,
  :mod:`.deepspeed`, :mod:`.megatron`, :mod:`.fsdp` (see :class:`memest.workload.Framework`); each
  returns the frozen, named terms of the buffers it adds, by lifetime;
- :mod:`.states`: the model states (weights, fp32 master, optimizer states, the framework's buffers);
- :mod:`.activation_terms`: the activations, the logits and the autocast copies;
- :mod:`.table`: the step's moments as a table (moment -> the lifetimes alive then);
- :mod:`.step`: the moments assembled, the peak chosen (:func:`estimate_training`, :func:`moments`);
- :mod:`.assumptions`: the sentences an estimate's assumptions list.

**Allocator blocks**: every tensor is counted as the CUDA caching allocator's block for it
(:func:`memest.estimate.runtime.cuda_block_bytes`: 512-B multiples; tensors of 10 MiB or more in
2-MiB segments, unsplit when 1 MiB or less would be left over): per parameter for weights, param.grad
and torch optimizer states, once for each flat buffer (DeepSpeed's and Megatron's masters, states and
gradient buffers), per saved tensor for activations. The model states and the activations are
remembered per the workload fields each reads (:class:`.protocol.StatesInput`,
:class:`.activation_terms.ActivationsInput`; :mod:`memest.memo`): the planner estimates thousands of
setups of one model.
"""

from __future__ import annotations

from memest.estimate.training.activation_terms import LOSS_CHUNKS, _logits, _logits_forward, execution
from memest.estimate.training.deepspeed import DEEPSPEED_REDUCE_BUCKET, DEEPSPEED_VERSION
from memest.estimate.training.lora import (
    ADAPTER_BYTES,
    _targeted,
    lora_adapter_numel,
    lora_adapters,
    lora_targets_tensor,
)
from memest.estimate.training.optimizers import BNB_BLOCK, BNB_MIN_8BIT_SIZE, optimizer_bytes, state_bytes_per_param
from memest.estimate.training.recipes import RECIPES, Recipe, kbit_weight_bytes
from memest.estimate.training.step import estimate_training, moments
from memest.estimate.training.table import MOMENT_TABLE, MOMENTS

__all__ = [
    "ADAPTER_BYTES", "BNB_BLOCK", "BNB_MIN_8BIT_SIZE", "DEEPSPEED_REDUCE_BUCKET", "DEEPSPEED_VERSION", "LOSS_CHUNKS",
    "MOMENTS", "MOMENT_TABLE", "RECIPES", "Recipe", "_logits", "_logits_forward", "_targeted",
    "estimate_training", "execution", "kbit_weight_bytes", "lora_adapter_numel", "lora_adapters",
    "lora_targets_tensor", "moments", "optimizer_bytes", "state_bytes_per_param",
]
