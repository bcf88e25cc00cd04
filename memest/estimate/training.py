"""Training memory per rank: model states, activations and logits at the moment of the step's peak.

**Precision recipes**, bytes per parameter (before sharding; P = parameters a rank holds):

| recipe | weights | param.grad | fp32 master | optimizer state element | compute | source |
|---|---|---|---|---|---|---|
| mixed | 2 (bf16) | 2 | 4 | 4 | bf16 | ZeRO paper §3.1 (K = 12 with Adam), DeepSpeed ``bf16``, Megatron ``--bf16`` |
| fp16  | 2 (fp16) | 2 | 4 | 4 | fp16 | DeepSpeed ``fp16`` (loss scaling) |
| amp   | 4 (fp32) | 4 | 0 | 4 | bf16 autocast | HF Trainer ``bf16=True``: torch.autocast over fp32 params |
| fsdp2 | 4 (fp32, sharded) | 4 (sharded, ``reduce_dtype`` fp32) | 0 | 4 | bf16 gathered copies | FSDP2 ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, torchtitan |
| bf16  | 2 | 2 | 0 | 2 | bf16 | torch AdamW keeps states in the param dtype (torchtune, HF ``torch_dtype=bf16``) |
| fp32  | 4 | 4 | 0 | 4 | fp32 | |

**Frameworks** add their own gradient buffers (see :class:`memest.workload.Framework`):

- ``pytorch``: param.grad appears during backward (the last layer's first) and is freed by
  ``zero_grad(set_to_none=True)``; with grad_accum_steps > 1 or ``set_to_none=False`` it lives
  through the forward too.
- ``ddp``: plus bucket buffers covering every trained parameter at the gradient dtype
  (``torch/nn/parallel/distributed.py``, ``gradient_as_bucket_view=False``).
- ``deepspeed``, as DeepSpeed v0.19.5 (:data:`DEEPSPEED_VERSION`) runs with its config defaults
  (``deepspeed/runtime/engine.py``, ``fp16/fused_optimizer.py``, ``zero/stage_1_and_2.py``, ``zero/stage3.py``):
  ``get_data_types`` makes the gradient-accumulation dtype the model's (since v0.17.6, commit 889f0ead2,
  "Enable non-ZeRO mode"), so stage 0 with bf16 or fp16 runs FP16_Optimizer (``_do_optimizer_sanity_check``:
  ``DDP_BFLOAT16`` / ``FP16``; BF16_Optimizer only with ``data_types.grad_accum_dtype: fp32``, which memest
  does not model): an unsharded fp32 flat master and FusedAdam states; param.grad made in backward; at
  its step every gradient copied to fp32 (``p.grad.to(fp32)``, per parameter: none for fp32 gradients)
  and those copies flattened (``fp32_groups_flat.grad``) before param.grad is dropped; the engine then
  clears param.grad (``_take_model_step``: ``optimizer.zero_grad()``). The engine's end-of-backward
  all-reduce flattens a 5e8-element bucket at a time, below the step's copies (not counted).
  Stage 1 keeps full 16-bit grads through backward and one reduce bucket of ``reduce_bucket_size`` = 5e8
  elements (``ipg_buffer``, allocated at the first gradient hook whenever ``contiguous_gradients`` is on, the
  default; ``overlap_comm``, off by default below stage 3, would double it); after backward
  ``reduce_gradients`` moves each gradient into the bucket (freeing its own block), reduces it and copies the
  rank's partition into ``grads_in_partition`` (P/N x 2 B), allocated at the first bucket holding any of it:
  on rank 0, whose partition the first bucket fills, while nearly all gradients still exist (moment
  ``gradient_reduction``: every gradient + the bucket + the partition, which over-counts the first bucket's
  gradients already moved into it, at most 1 GB, and leaves out ``allreduce_bucket``'s flattened copy of a
  bucket spanning several partitions, at most the bucket); the epilogue then drops every param.grad (``_clear_param_grad_only``, v0.18.5 on;
  before it ``step`` did, ``free_grad_in_param_list``). Stage 2 reduces during backward into the bucket and
  ``grads_in_partition``; stage 3 holds the bucket permanently, a bf16 gradient partition
  (``grad_partitions_flat_buffer``) and sharded bf16 weights. At the step stages 1-3 hold the gradient
  partition, flatten it (P/N x 2 B) and cast that to fp32 (P/N x 4 B, ``single_grad_partition``); FusedAdam
  needs no temporary. DeepSpeed's optimizers keep an fp32 master of whatever trains, LoRA's fp32 adapters
  included.
- ``megatron``: an fp32 ``main_grad`` buffer of every parameter (``--accumulate-allreduce-grads-in-fp32``,
  forced with bf16), fp32 master + Adam sharded over dp with the distributed optimizer
  (``zero_stage`` 1): 6 + 12/N B/param (``megatron/core/optimizer/distrib_optimizer.py``).
- ``fsdp``: parameters, gradients and optimizer states sharded per parameter (FSDP2); gathered at
  the compute dtype, moment by moment (``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py``):
  the root unit (embeddings, final norm, lm_head: not resharded after forward) always; besides it
  two layer units while layers run (the one computed and the one prefetched), one at the loss
  backward (the last layer's, prefetched by the root's pre-backward hook) and one at the first
  layer's backward (nothing left to prefetch). During a unit's backward its unsharded gradients;
  from the second unit on, the previous unit's ``reduce_dtype`` reduce-scatter input
  (``_fsdp_collectives.py`` ``foreach_reduce``). The all-gather outputs are allocated on their own
  stream, whose cached blocks the compute stream cannot reuse: the root's and a layer's are reserved
  beside the peak allocated (term ``allocator.all_gather_stream``).

**Optimizers**: AdamW 2 states; Lion, SGD-momentum 1; SGD 0; Adafactor a row and a column vector
per matrix (factored second moment, ``beta1=None``); 8-bit AdamW 2 x (1 B + 4 B per 256-element
block) (``bitsandbytes/optim/optimizer.py``, ``blocksize = 256``; tensors under 4096 elements keep
32-bit states). Step temporaries: torch ``foreach`` AdamW one state-sized tensor
(``torch/optim/adamw.py``, ``_multi_tensor_adamw``: ``exp_avg_sq_sqrt = torch._foreach_sqrt``);
Adafactor and Lion two resp. one copy of the largest tensor; fused kernels none.

**The peak is a moment, not a sum of maxima.** Six or seven moments of a steady-state step are built, each
from the tensors alive at that time (:data:`MOMENTS`); the largest sets the peak and its terms are
reported (the moment's name is in ``Estimate.extra["peak_moment"]`` and the assumptions):

1. ``layer_forward``: inside a layer's forward: the stored activations of the layers before it and
   what the layer holds then (eager attention's masked scores and their fp32 copy at its softmax;
   under recompute the whole working set of one checkpointed layer, whose saved tensors are
   dropped); eager attention's materialized causal masks;
2. ``loss_forward``: inside the forward's cross-entropy: every layer's saved tensors, the logits,
   their fp32 upcast and the fp32 log-softmax (transformers ``ForCausalLMLoss``), and gradients
   that live through the forward (accumulation, ``set_to_none=False``);
3. ``loss_backward``: the start of backward through the cross-entropy: every layer's saved tensors,
   the fp32 log-probabilities and two fp32 gradients of the logits;
4. ``first_layer_backward``: the last layer's backward (rebuilt under full recompute, with its
   recomputation's temporaries), logits freed, the head's gradients allocated;
5. ``last_layer_backward``: the first layer's backward: one layer's activations left, the
   gradients of everything but that layer and the (untied) embeddings allocated;
6. ``gradient_reduction`` (DeepSpeed ZeRO 1 only): after backward, every gradient, the reduce bucket and
   the rank's gradient partition;
7. ``optimizer_step``: activations freed, gradients and the optimizer's temporaries alive.

A multimodal checkpoint's vision tower (component ``other`` before the first layer) has optimizer
states and flat-buffer space but no gradient in a text-only step. **Allocator blocks**: every
tensor is counted as the CUDA caching allocator's block for it (:func:`runtime.cuda_block_bytes`:
512-B multiples; tensors of 10 MiB or more in 2-MiB segments, unsplit when 1 MiB or less would be
left over): per parameter for weights, param.grad and torch optimizer states, once for each flat
buffer (DeepSpeed's and Megatron's masters, states and gradient buffers), per saved tensor for
activations. These model states and activations are remembered per what they depend on
(:func:`_remembered`): the planner estimates thousands of setups of one model.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memest.devices import Device
from memest.estimate import runtime
from memest.estimate.activations import (
    Execution,
    LoraActivations,
    backward_transient,
    embedding_bytes,
    layer_activations,
    norm_bytes,
    selective_op_bytes,
)
from memest.estimate.serving.hf.prefill import DEFAULT_CODE, FORWARD_CODE
from memest.estimate.runtime import cuda_block_bytes
from memest.estimate.sharding import Stage, layer_shard_numel, shard_numel, stage_tensors, stages
from memest.estimate.weights import SCHEMES, tensor_bytes, weight_bytes
from memest.result import Estimate, Kind, RankEstimate, Term
from memest.spec import Component, LayerSpec, ModelSpec, Split, TensorSpec
from memest.workload import (
    AttnImplementation,
    Framework,
    KbitPrep,
    LoraConfig,
    Loss,
    Method,
    Offload,
    Optimizer,
    Parallelism,
    Precision,
    Recompute,
    TrainingConfig,
    resolve_framework,
)

DEEPSPEED_VERSION = "0.19.5"
"""The DeepSpeed release the ``deepspeed`` framework follows (tag v0.19.5, commit cf44300453eb)."""

DEEPSPEED_REDUCE_BUCKET = 500_000_000
"""DeepSpeed ``reduce_bucket_size`` default, in elements (``deepspeed/runtime/zero/config.py``)."""

ADAPTER_BYTES = 4
"""PEFT keeps LoRA adapters in fp32 over a 16-bit base (``autocast_adapter_dtype=True``, PEFT >= 0.12):
4 B weights, 4 B gradients, fp32 Adam states."""

BNB_BLOCK = 256
"""bitsandbytes 8-bit optimizers: one fp32 absmax per 256 state values."""

BNB_MIN_8BIT_SIZE = 4096
"""bitsandbytes keeps 32-bit states for tensors smaller than this (``min_8bit_size``)."""

LOSS_CHUNKS = 8
"""torchtune ``CEWithChunkedOutputLoss.num_output_chunks``."""


@dataclass(frozen=True, slots=True)
class Recipe:
    """Bytes per element of a precision recipe (see the module table).

    Attributes:
        weight: Stored parameters.
        grad: param.grad (FSDP: the sharded gradient at ``reduce_dtype``).
        master: fp32 master copy kept by the optimizer wrapper (0: none).
        state: One optimizer-state element.
        compute: Activations and matmul outputs.
    """

    weight: int
    grad: int
    master: int
    state: int
    compute: int


RECIPES: dict[Precision, Recipe] = {
    Precision.MIXED: Recipe(weight=2, grad=2, master=4, state=4, compute=2),
    Precision.FP16: Recipe(weight=2, grad=2, master=4, state=4, compute=2),
    Precision.AMP: Recipe(weight=4, grad=4, master=0, state=4, compute=2),
    Precision.FSDP2: Recipe(weight=4, grad=4, master=0, state=4, compute=2),
    Precision.BF16: Recipe(weight=2, grad=2, master=0, state=2, compute=2),
    Precision.FP32: Recipe(weight=4, grad=4, master=0, state=4, compute=4),
}


_EMBEDDINGS = (Component.EMBEDDING, Component.LM_HEAD)


def kbit_weight_bytes(t: TrainingConfig) -> tuple[int, int]:
    """Bytes per element of a QLoRA base's non-quantized weights: (embeddings and lm_head, the rest:
    norms, biases, other modules), by how the script prepared the model (:class:`KbitPrep`).

    ``none`` keeps them at the compute dtype; PEFT ``prepare_model_for_kbit_training`` upcasts every
    fp16/bf16 parameter that is not ``Params4bit`` to fp32 (``peft/utils/other.py``, 0.13); trl's
    ``peft_module_casting_to_bf16`` (``trl/trainer/utils.py``, 0.13), called by ``SFTTrainer`` only when
    ``args.bf16``, then casts modules named ``lm_head`` / ``embed_tokens`` / ``wte`` / ``wpe`` back to
    bf16 and leaves the norms fp32 (with ``--precision fp16`` the embeddings stay fp32).
    """
    c = RECIPES[t.precision].compute
    if t.prepare_kbit_training is KbitPrep.NONE:
        return c, c
    if t.prepare_kbit_training is KbitPrep.TRL and t.precision is not Precision.FP16:
        return 2, 4
    return 4, 4


def estimate_training(spec: ModelSpec, t: TrainingConfig, device: Device) -> Estimate:
    """Per-rank training memory; one RankEstimate per distinct pipeline stage."""
    par = t.parallelism
    fw = resolve_framework(t)
    ranks: list[RankEstimate] = []
    peaks: list[str] = []
    per_stage = par.world_size // par.pp  # the tp x cp x dp ranks that hold one pipeline stage
    for stage in stages(spec.num_layers, par.pp):
        terms, moment = _stage_terms(spec, t, fw, device, stage)
        label = "all ranks" if par.pp == 1 else f"pp stage {stage.index}" + (
            " (first)" if stage.first else " (last)" if stage.last else "")
        if ranks and par.pp > 2 and not stage.first and not stage.last and ranks[-1].terms == terms:
            ranks[-1] = RankEstimate(ranks[-1].label + f"..{stage.index}", terms, ranks[-1].count + per_stage)
            continue
        ranks.append(RankEstimate(label, terms, per_stage))
        peaks.append(moment)
    worst = 0 if len(ranks) == 1 else max(range(len(ranks)), key=lambda n: ranks[n].device_used_bytes)
    extra = {"peak_moment": peaks[worst], "framework": fw.value}
    return Estimate(ranks=tuple(ranks), assumptions=_assumptions(spec, t, fw, peaks[worst]),
                    host_bytes=_host_bytes(spec, t, device), extra=extra)


# ---- what trains ----


@dataclass(frozen=True, slots=True)
class _GradGroups:
    """The trained tensors of a stage, as backward produces their gradients.

    Attributes:
        used: Those the step computes a gradient for: all but a multimodal checkpoint's vision
            tower and projector (component ``other`` before the first layer), which a text-only
            step never runs (their optimizer states and flat buffers still exist).
        head: Made first, by the lm_head's backward: the final norm, lm_head, and the embedding when
            tied to it.
        first: The stage's first layer (one of its kind), made last but the embedding's.
        embedding: The untied embeddings (first stage), made last.
    """

    used: list[tuple[TensorSpec, int, int]]
    head: list[tuple[TensorSpec, int, int]]
    first: list[tuple[TensorSpec, int, int]]
    embedding: list[tuple[TensorSpec, int, int]]


def _grad_groups(spec: ModelSpec, stage: Stage, trainable: list[tuple[TensorSpec, int, int]]) -> _GradGroups:
    unused = {id(tn) for tn in spec.embedding if tn.component is Component.OTHER} if stage.first else set()
    head = {id(tn) for tn in spec.head} if stage.last else set()
    embedding = {id(tn) for tn in spec.embedding if tn.component is not Component.OTHER} if stage.first else set()
    if spec.tie_word_embeddings and stage.last:
        head |= embedding
        embedding = set()
    first = {id(tn) for tn in spec.layers[stage.start].tensors}
    used = [item for item in trainable if id(item[0]) not in unused]
    return _GradGroups(
        used=used,
        head=[item for item in used if id(item[0]) in head],
        first=[(tn, local, 1) for tn, local, _ in used if id(tn) in first],
        embedding=[item for item in used if id(item[0]) in embedding],
    )


def _param_grads(st: _States, groups: _GradGroups, gb: int) -> None:
    """param.grad of every used tensor (one block each), of the head's, and of all but the first layer's
    and the embeddings' (what exists when the backward reaches the stage's first layer)."""
    st.lazy_grads = _blocks(groups.used, gb)
    st.head_grads = _blocks(groups.head, gb)
    st.grads_before_first_layer = st.lazy_grads - _blocks(groups.first, gb) - _blocks(groups.embedding, gb)


def _blocks(items: list[tuple[TensorSpec, int, int]], itemsize: int, shard: int = 1) -> int:
    """Bytes of one tensor per (tensor, local elements, count) item at ``itemsize`` B per element (each
    ``shard``-th of it), as the CUDA caching allocator counts them (:func:`runtime.cuda_block_bytes`)."""
    return sum(cuda_block_bytes(math.ceil(local * itemsize / shard)) * count for _, local, count in items)


def _expert_data_ranks(par: Parallelism, n: int) -> int:
    """e: how many of the ``n`` sharding ranks hold different experts (min(ep, n)); the experts'
    sharded states are split over the other n / e (see :func:`_expert_weighted`)."""
    return min(par.ep, n)


def _expert_weighted(items: list[tuple[TensorSpec, int, int]], par: Parallelism, n: int) -> list[tuple[TensorSpec, int, int]]:
    """``items`` with each routed expert's local elements scaled so that dividing by ``n`` shards them
    over their expert-data-parallel group, as ZeRO/FSDP do with expert parallelism.

    A rank holds E/ep experts (:func:`sharding.shard_numel`); only the ``n / e`` data-parallel ranks
    holding the same experts share their states, e = min(ep, n) (Megatron-LM's expert data-parallel
    group, ``megatron/core/parallel_state.py``; DeepSpeed-MoE's ``expert_data_parallel_group``,
    ``deepspeed/utils/groups.py``). So an expert shard is local / (n / e) = local x e / n.
    """
    e = _expert_data_ranks(par, n)
    if e <= 1:
        return items
    return [(tn, local * e if tn.component is Component.EXPERTS else local, c) for tn, local, c in items]


_HEADS: dict[int, tuple[ModelSpec, frozenset[int]]] = {}


def _head_tensors(spec: ModelSpec) -> frozenset[int]:
    """ids of the head's tensors (final norm, lm_head), remembered per spec."""
    hit = _HEADS.get(id(spec))
    if hit is None or hit[0] is not spec:
        if len(_HEADS) > 256:
            _HEADS.clear()
        hit = _HEADS[id(spec)] = (spec, frozenset(id(tn) for tn in spec.head))
    return hit[1]


def targets_of(targets: str) -> tuple[frozenset[str], bool]:
    """(module names, all-linear) of a ``--lora-targets`` value; ``attention`` names no module (it
    selects by component, see :func:`attention_targets`)."""
    if targets == "all-linear":
        return frozenset(), True
    if targets == "attention":
        return frozenset(), False
    return frozenset(x.strip() for x in targets.split(",") if x.strip()), False


def attention_targets(spec: ModelSpec) -> frozenset[str]:
    """The module names of every attention projection of ``spec`` (``--lora-targets attention``)."""
    return frozenset(tn.module.rsplit(".", 1)[-1] for layer, _ in spec.layer_kinds() for tn in layer.tensors
                     if tn.component is Component.ATTENTION and tn.is_linear_weight)


def lora_targets_tensor(tensor: TensorSpec, targets: str) -> bool:
    """True when ``--lora-targets`` puts an adapter on this layer tensor: a 2-D linear weight of the
    attention (``attention``), of any block (``all-linear``), or of a named module."""
    from memest import lora_targets

    return lora_targets.adapts(tensor, targets)


_targeted = lora_targets_tensor  # the name memest.calibration imports


def target_names(spec: ModelSpec, targets: str) -> frozenset[str]:
    """Module names (the last component) LoRA adapts for ``--lora-targets``: the named ones, the
    attention projections (``attention``) or every linear of the layers (``all-linear``)."""
    names, all_linear = targets_of(targets)
    if targets == "attention":
        return attention_targets(spec)
    if all_linear:
        return frozenset(tn.module.rsplit(".", 1)[-1] for layer, _ in spec.layer_kinds() for tn in layer.tensors
                         if tn.is_linear_weight and len(tn.shape) == 2)
    return names


_ADAPTERS: dict[tuple, tuple[ModelSpec, tuple[tuple[TensorSpec, int, int], ...]]] = {}


def lora_adapters(spec: ModelSpec, stage: Stage, lora: LoraConfig, tp: int) -> list[tuple[TensorSpec, int, int]]:
    """(targeted weight, adapter elements on one rank, count) of a pipeline stage (remembered).

    PEFT matches ``target_modules`` by module name anywhere in the model: besides the layers' linears
    it adapts same-named linears outside them (a multimodal checkpoint's vision tower ``q_proj``),
    whose adapters are trained (they get optimizer states and fp32 gradient buffers) though a
    text-only step never runs them. ``all-linear`` takes the layers' linears.
    """
    key = (id(spec), stage, lora.rank, lora.targets, tp)
    hit = _ADAPTERS.get(key)
    if hit is not None and hit[0] is spec:
        return list(hit[1])
    names = target_names(spec, lora.targets)
    out: list[tuple[TensorSpec, int, int]] = []
    for tn, count in stage_tensors(spec, stage):
        if len(tn.shape) != 2 or not tn.name.endswith("weight"):
            continue
        layer_linear = tn.is_linear_weight
        outside = tn.component is Component.OTHER and lora.targets != "all-linear"
        if (layer_linear or outside) and tn.module.rsplit(".", 1)[-1] in names:
            out.append((tn, lora_adapter_numel(tn, lora.rank, tp), count))
    if len(_ADAPTERS) > 4096:
        _ADAPTERS.clear()
    _ADAPTERS[key] = (spec, tuple(out))
    return out


def lora_adapter_numel(tensor: TensorSpec, rank: int, tp: int) -> int:
    """Elements of the LoRA A (r x in) and B (out x r) matrices for one targeted weight on one rank.

    Under TP, B follows a column-parallel base (out/t) and A a row-parallel one (in/t).
    """
    out_f, in_f = tensor.shape
    if tensor.split in (Split.COL, Split.KV, Split.VOCAB):
        return rank * in_f + math.ceil(rank * out_f / tp)
    if tensor.split is Split.ROW:
        return math.ceil(rank * in_f / tp) + rank * out_f
    return rank * (in_f + out_f)


def state_bytes_per_param(opt: Optimizer, state: int, numel: int = BNB_MIN_8BIT_SIZE) -> float:
    """Optimizer-state bytes per trainable element of a tensor of ``numel`` elements (not Adafactor)."""
    if opt in (Optimizer.ADAMW, Optimizer.ADAMW_FUSED):
        return 2 * state
    if opt in (Optimizer.ADAMW8BIT, Optimizer.PAGED_ADAMW8BIT):
        return 2 * (1 + 4 / BNB_BLOCK) if numel >= BNB_MIN_8BIT_SIZE else 2 * 4
    if opt in (Optimizer.LION, Optimizer.SGD_MOMENTUM):
        return state
    if opt is Optimizer.SGD:
        return 0
    raise ValueError(f"no per-element state size for {opt.value}")


def optimizer_bytes(trainable: list[tuple[TensorSpec, int, int]], opt: Optimizer, state: int) -> int:
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


@dataclass(slots=True)
class _States:
    """Model-state sizes of one rank, in bytes (``ZeRO`` sharding applied)."""

    weights: int = 0
    weights_formula: str = ""
    master: int = 0
    moments: int = 0
    states_shard: int = 1  # ranks the master and optimizer states are sharded over
    lazy_grads: int = 0
    lazy_formula: str = ""
    head_grads: int = 0
    grads_before_first_layer: int = 0
    persistent: list[Term] = field(default_factory=list)
    backward_buffers: list[Term] = field(default_factory=list)  # from backward's start (DeepSpeed's reduce bucket)
    layer_buffers: list[Term] = field(default_factory=list)  # while a layer runs its backward (FSDP's grads)
    reduce_input: list[Term] = field(default_factory=list)  # FSDP: the previous unit's reduce-scatter input
    gathered: list[Term] = field(default_factory=list)
    gathered_unit: int = 0  # FSDP: one layer unit gathered at the compute dtype (how many are alive: per moment)
    gathered_formula: str = ""
    stream_pool: int = 0  # reserved, never allocated on the compute stream (FSDP's all-gather outputs)
    stream_pool_formula: str = ""
    # the terms built once from the sizes above (_finish_states): the moments assemble them
    base: list[Term] = field(default_factory=list)
    dequantized: list[Term] = field(default_factory=list)
    grads_all: Term | None = None
    grads_later: Term | None = None
    grads_head: Term | None = None
    gathered_running: list[Term] = field(default_factory=list)
    gathered_loss: list[Term] = field(default_factory=list)
    gathered_first: list[Term] = field(default_factory=list)
    step: list[Term] = field(default_factory=list)
    step_grads: Term | None = None  # the gradients alive at the step when not every param.grad (DeepSpeed ZeRO 1)
    reduction: list[Term] = field(default_factory=list)  # DeepSpeed ZeRO 1: beside every gradient after backward
    trainable_numel: int = 0


def _model_states(spec: ModelSpec, t: TrainingConfig, fw: Framework, stage: Stage) -> _States:
    par = t.parallelism
    recipe = RECIPES[t.precision]
    k = spec.num_kv_heads
    n = par.shard_degree
    z = par.zero_stage
    tensors = stage_tensors(spec, stage)
    st = _States()
    shard_w = n if z >= 3 or (fw is Framework.FSDP and z == 2) else 1
    offloaded = t.offload is not Offload.NONE
    # DeepSpeed's optimizers keep an fp32 master (one flat tensor per partition) of whatever trains,
    # and its FusedAdam two flat states: FP16_Optimizer at ZeRO 0 (bf16 or fp16), the ZeRO optimizers at 1-3
    flat = fw in (Framework.DEEPSPEED, Framework.MEGATRON)

    if t.method is Method.FULL:
        trainable = [(tn, shard_numel(tn, par, k), c) for tn, c in tensors]
        if shard_w == 1:
            weights = _blocks(trainable, recipe.weight)
        elif fw is Framework.FSDP:  # FSDP2 shards every parameter on its own
            weights = _blocks(_expert_weighted(trainable, par, n), recipe.weight, shard_w)
        else:  # DeepSpeed ZeRO-3: one flat partition
            flat_numel = sum(local * c for _, local, c in _expert_weighted(trainable, par, n))
            weights = cuda_block_bytes(math.ceil(flat_numel * recipe.weight / shard_w))
        st.weights_formula = f"P_stage x {recipe.weight} B"
        gb = recipe.grad
        master_b, state_b = recipe.master, recipe.state
    else:
        trainable = lora_adapters(spec, stage, t.lora, par.tp)
        # under ZeRO-3 the frozen experts, too, are sharded over their expert-data-parallel group only
        e = _expert_data_ranks(par, n) if shard_w > 1 else 1
        scale = [(tn, c * e if tn.component is Component.EXPERTS else c) for tn, c in tensors]
        if t.method is Method.LORA:
            base = sum(cuda_block_bytes(math.ceil(tensor_bytes(tn, par, k, dtype_bytes=recipe.weight))) * c
                       for tn, c in scale)
            st.weights_formula = f"frozen base x {recipe.weight} B + fp32 adapters"
        else:
            emb, other = kbit_weight_bytes(t)
            nf4 = SCHEMES["nf4"]
            base = (weight_bytes([(tn, c) for tn, c in scale if tn.component not in _EMBEDDINGS], par, k,
                                 dtype_bytes=other, scheme=nf4)
                    + weight_bytes([(tn, c) for tn, c in scale if tn.component in _EMBEDDINGS], par, k,
                                   dtype_bytes=emb, scheme=nf4))
            st.weights_formula = (f"NF4 linear weights (64-blocks, double quant) + embeddings and lm_head x {emb} B "
                                  f"+ norms and other weights x {other} B (--prepare-kbit-training "
                                  f"{t.prepare_kbit_training.value}) + fp32 adapters")
        weights = math.ceil((base + sum(local * c for _, local, c in trainable) * ADAPTER_BYTES) / shard_w)
        gb = ADAPTER_BYTES
        # the DeepSpeed optimizers' fp32 master copies the (fp32) adapters too
        master_b, state_b = (4 if flat and recipe.master else 0), 4
    numel = sum(local * c for _, local, c in trainable)
    st.trainable_numel = numel
    groups = _grad_groups(spec, stage, trainable)
    head_numel = sum(local * c for _, local, c in groups.head)
    # what sharded states are computed from: experts' elements scaled by e (see _expert_weighted)
    sharded = _expert_weighted(trainable, par, n)
    sharded_numel = sum(local * c for _, local, c in sharded)

    shard_o = n if z >= 1 else 1
    st.weights = 0 if t.offload is Offload.PARAMS else weights
    if shard_w > 1:
        st.weights_formula += f" / {n} (sharded)"
    o_numel, o_items = (sharded_numel, sharded) if shard_o > 1 else (numel, trainable)
    st.states_shard = shard_o
    st.master = 0 if offloaded else cuda_block_bytes(math.ceil(o_numel * master_b / shard_o))
    if offloaded:
        st.moments = 0
    elif flat and t.optimizer in (Optimizer.ADAMW, Optimizer.ADAMW_FUSED):  # FusedAdam on the flat master
        st.moments = 2 * cuda_block_bytes(math.ceil(o_numel * state_b / shard_o))
    elif t.optimizer in (Optimizer.ADAMW, Optimizer.ADAMW_FUSED) and (shard_o == 1 or fw is Framework.FSDP):
        # torch AdamW: exp_avg and exp_avg_sq of every parameter (FSDP2: of every parameter's shard)
        st.moments = 2 * _blocks(o_items, state_b, shard_o)
    else:
        st.moments = math.ceil(optimizer_bytes(o_items, t.optimizer, state_b) / shard_o)
    c = recipe.compute

    if fw in (Framework.PYTORCH, Framework.DDP):
        _param_grads(st, groups, gb)
        st.lazy_formula = f"P_trainable x {gb} B (param.grad)"
        if fw is Framework.DDP:
            st.persistent.append(Term("gradients.ddp_buckets", Kind.GRADIENTS, cuda_block_bytes(numel * gb),
                                      f"P_trainable x {gb} B DDP gradient buckets"))
        st.step += _step_temporaries(spec, t, trainable, state_b, 1, fused=False)
    elif fw is Framework.MEGATRON:
        st.persistent.append(Term("gradients.main_grad", Kind.GRADIENTS, cuda_block_bytes(numel * 4),
                                  "P_trainable x 4 B fp32 main_grad buffer"))
    elif fw is Framework.DEEPSPEED:
        _deepspeed_states(st, t, trainable, sharded_numel, groups, n, z, gb)
        if z >= 3:
            largest = max(layer_shard_numel(layer, par) for layer, _ in spec.layer_kinds(stage.start, stage.stop))
            st.gathered.append(Term("workspace.gathered_params", Kind.WORKSPACE, 2 * largest * recipe.weight,
                                    f"2 x largest layer unsharded x {recipe.weight} B (current + prefetched)"))
    elif fw is Framework.FSDP:
        _fsdp_states(st, spec, t, stage, n, z, gb, c, head_numel, trainable, state_b)
    _finish_states(st, spec, t, stage)
    return st


_BYTES = operator.attrgetter("bytes")
MOMENTS = ("layer_forward", "loss_forward", "loss_backward", "first_layer_backward", "last_layer_backward",
           "gradient_reduction", "optimizer_step")
"""The moments of a step whose allocated bytes the estimate compares (module docstring; ``gradient_reduction``
for DeepSpeed ZeRO 1 only)."""
_NO_GRADS = Term("gradients", Kind.GRADIENTS, 0, "freed by zero_grad(set_to_none=True)")


def _finish_states(st: _States, spec: ModelSpec, t: TrainingConfig, stage: Stage) -> None:
    """The states' terms, built once (the states are remembered across setups)."""
    par = t.parallelism
    st.base = [Term("weights", Kind.WEIGHTS, st.weights, st.weights_formula),
               Term("optimizer_states.master", Kind.OPTIMIZER_STATES, st.master,
                    "fp32 master weights" + _div(st.states_shard)),
               Term("optimizer_states.moments", Kind.OPTIMIZER_STATES, st.moments,
                    f"{t.optimizer.value} states" + _div(st.states_shard)),
               *st.persistent]
    if spec.buffers:
        st.base.append(Term("weights.buffers", Kind.WEIGHTS, sum(cuda_block_bytes(b.nbytes) for b in spec.buffers),
                            " + ".join(f"{b.name} {'x'.join(map(str, b.shape))} x {b.itemsize} B" for b in spec.buffers)
                            + " (registered buffers)"))
    if t.method is Method.QLORA:
        st.dequantized = [_dequantized(spec, stage, par, RECIPES[t.precision].compute)]
    st.grads_all = Term("gradients", Kind.GRADIENTS, st.lazy_grads, st.lazy_formula)
    st.grads_later = Term("gradients", Kind.GRADIENTS, st.grads_before_first_layer,
                          st.lazy_formula + " but the first layer's and embeddings'")
    st.grads_head = Term("gradients", Kind.GRADIENTS, st.head_grads, "the head's gradients, the first computed")

    def gathered(units: int, why: str) -> list[Term]:
        """FSDP2's gathered layer units alive at a moment (``units`` of them)."""
        if not st.gathered_unit:
            return []
        return [Term("workspace.gathered_layers", Kind.WORKSPACE, units * st.gathered_unit,
                     f"{units} x {st.gathered_formula} ({why})")]

    st.gathered_running = [*st.gathered, *gathered(2, "the unit computed + the one prefetched")]
    st.gathered_loss = [*st.gathered, *gathered(1, "the last layer's, prefetched for its backward")]
    st.gathered_first = [*st.gathered, *gathered(1, "the unit computed; none left to prefetch")]


_CUBLAS: dict[tuple[str, str, str], Term] = {}


def _cublas(device: Device) -> Term:
    """The cuBLAS workspace term of ``device`` (remembered per device kind)."""
    key = (device.kind, device.vendor, device.arch)
    term = _CUBLAS.get(key)
    if term is None:
        term = _CUBLAS[key] = Term("workspace.cublas", Kind.WORKSPACE, runtime.cublas_workspace_bytes(device),
                                   "cuBLAS workspace")
    return term


def _deepspeed_states(st: _States, t: TrainingConfig, trainable: list[tuple[TensorSpec, int, int]], sharded_numel: int,
                      groups: _GradGroups, n: int, z: int, gb: int) -> None:
    """DeepSpeed gradient buffers and step transients (module docstring, ``deepspeed`` bullet);
    ``sharded_numel``: the trainable elements as ZeRO partitions them over ``n`` (experts weighted,
    :func:`_expert_weighted`)."""
    numel = sum(local * c for _, local, c in trainable)
    offloaded = t.offload is not Offload.NONE
    bucket = Term("workspace.reduce_bucket", Kind.WORKSPACE, cuda_block_bytes(DEEPSPEED_REDUCE_BUCKET * gb),
                  f"reduce_bucket_size 5e8 x {gb} B (ipg_buffer)")
    if z == 0:
        # FP16_Optimizer (bf16 too, DeepSpeed >= 0.17.6): param.grad until its step, which copies each to
        # fp32 (``p.grad.to(fp32)``: the same tensor when already fp32) and flattens the copies
        # (fused_optimizer.py ``step``) before dropping param.grad
        _param_grads(st, groups, gb)
        st.lazy_formula = f"P_trainable x {gb} B (param.grad)"
        if gb < 4:
            st.step.append(Term("workspace.fp32_grad_copies", Kind.WORKSPACE, _blocks(trainable, 4),
                                "P_trainable x 4 B (p.grad.to(fp32) per parameter, FP16_Optimizer.step)"))
        st.step.append(Term("workspace.fp32_gradients", Kind.WORKSPACE, cuda_block_bytes(numel * 4),
                            "P_trainable x 4 B (the copies flattened: fp32_groups_flat.grad)"))
        return
    if z == 1:
        st.backward_buffers.append(bucket)  # DeepSpeedZeroOptimizer allocates it at the first gradient hook
        _param_grads(st, groups, gb)
        st.lazy_formula = f"P_trainable x {gb} B (ZeRO-1 keeps full gradients through backward)"
        if offloaded:
            st.step_grads = Term("gradients", Kind.GRADIENTS, 0, "param.grad dropped after the reduction (offloaded)")
            st.reduction = [bucket]
        else:
            # reduce_gradients moves the gradients into the bucket and the rank's partition into
            # grads_in_partition; param.grad are dropped, the partition lives until the step
            partition = Term("gradients.partition", Kind.GRADIENTS, cuda_block_bytes(math.ceil(sharded_numel * gb / n)),
                             f"P_trainable x {gb} B / {n} (grads_in_partition)")
            st.step_grads = partition
            st.reduction = [bucket, partition]
    elif z == 2:
        st.backward_buffers.append(bucket)
        if not offloaded:
            # allocated whole at the first reduction, once the bucket has filled; until then the
            # bucket (counted) holds the first gradients
            st.lazy_grads = st.grads_before_first_layer = cuda_block_bytes(math.ceil(sharded_numel * gb / n))
            st.lazy_formula = f"P_trainable x {gb} B / {n} (grads_in_partition)"
    else:
        st.persistent.append(bucket)
        if not offloaded:
            st.persistent.append(Term("gradients.partition", Kind.GRADIENTS, cuda_block_bytes(math.ceil(sharded_numel * gb / n)),
                                      f"P_trainable x {gb} B / {n} (grad_partitions_flat_buffer)"))
    if not offloaded:
        st.step.append(Term("workspace.flat_gradients", Kind.WORKSPACE, cuda_block_bytes(math.ceil(sharded_numel * gb / n)),
                            f"P_trainable x {gb} B / {n} (flattened partition)"))
        st.step.append(Term("workspace.fp32_gradients", Kind.WORKSPACE, cuda_block_bytes(math.ceil(sharded_numel * 4 / n)),
                            f"P_trainable x 4 B / {n} (single_grad_partition)"))


def _fsdp_states(st: _States, spec: ModelSpec, t: TrainingConfig, stage: Stage, n: int, z: int, gb: int, c: int,
                 head_numel: int, trainable: list[tuple[TensorSpec, int, int]], state_b: int) -> None:
    """FSDP gathered units, sharded gradients and their reduce copies (module docstring, ``fsdp``)."""
    par = t.parallelism
    shard_g = n if z >= 2 else 1
    if shard_g > 1:  # experts' gradients shard over their expert-data-parallel group (_expert_weighted)
        trainable = _expert_weighted(trainable, par, n)
    groups = _grad_groups(spec, stage, trainable)
    st.lazy_grads = _blocks(groups.used, gb, shard_g)  # FSDP2 shards each parameter's gradient
    st.lazy_formula = f"P_trainable x {gb} B" + (f" / {n} (sharded)" if shard_g > 1 else "")
    st.head_grads = math.ceil(head_numel * gb / shard_g)
    later = sum(local * c for _, local, c in groups.used) - sum(local * c for _, local, c in (*groups.first, *groups.embedding))
    st.grads_before_first_layer = math.ceil(later * gb / shard_g)  # units reduce-scatter as their backward ends
    # the compute copies gathered: every weight (a LoRA base too) at its dtype, or FSDP2's param_dtype
    gather_b = c if t.precision is Precision.FSDP2 else RECIPES[t.precision].weight
    largest = max(layer_shard_numel(layer, par) for layer, _ in spec.layer_kinds(stage.start, stage.stop))
    root_ids = {id(tn) for tn in (*spec.embedding, *spec.head)}
    root = sum(shard_numel(tn, par, spec.num_kv_heads) * cnt for tn, cnt in stage_tensors(spec, stage)
               if id(tn) in root_ids)
    if z >= 2:
        # FSDP2 allocates each unit's all-gather output on its all-gather copy-in stream (implicit prefetch,
        # _fsdp_collectives.py foreach_all_gather) and keeps it until the next unit's copy-out; the CUDA
        # caching allocator reuses a stream's cached blocks only for that stream, so that pool stays
        # reserved beside the compute stream's: the root's output and a layer's, at the gather dtype
        st.stream_pool = cuda_block_bytes(root * gather_b) + cuda_block_bytes(largest * gather_b)
        st.stream_pool_formula = (f"(root unit + largest layer) unsharded x {gather_b} B: all-gather outputs cached "
                                  "in the all-gather stream's pool")
    if z >= 3:
        st.gathered.append(Term("workspace.gathered_root", Kind.WORKSPACE, root * gather_b,
                                f"embeddings + head unsharded x {gather_b} B (root unit, kept until backward)"))
        st.gathered_unit = largest * gather_b
        st.gathered_formula = f"largest layer unsharded x {gather_b} B"
    elif z == 2:
        total = sum(shard_numel(tn, par, spec.num_kv_heads) * cnt for tn, cnt in stage_tensors(spec, stage))
        st.gathered.append(Term("workspace.gathered_params", Kind.WORKSPACE, total * gather_b,
                                f"P_stage unsharded x {gather_b} B (SHARD_GRAD_OP keeps them from forward to backward)"))
    if z >= 2:
        unit = largest if t.method is Method.FULL else 0
        st.layer_buffers.append(Term("workspace.unsharded_grads", Kind.WORKSPACE, unit * gather_b,
                                     f"largest layer x {gather_b} B (the unit's unsharded gradients)"))
        # foreach_reduce copies a finished unit's gradients into a flat reduce_dtype buffer, alive through
        # the next unit's backward (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py)
        st.reduce_input.append(Term("workspace.reduce_scatter_input", Kind.WORKSPACE, unit * gb,
                                    f"largest layer x {gb} B (the previous unit's reduce-scatter input)"))
    st.step += _step_temporaries(spec, t, trainable, state_b, shard_g, fused=False)


def _step_temporaries(spec: ModelSpec, t: TrainingConfig, trainable: list[tuple[TensorSpec, int, int]],
                      state_b: int, shard: int, *, fused: bool) -> list[Term]:
    """Temporaries of torch optimizers during their step."""
    if fused or t.offload is not Offload.NONE or not trainable:
        return []
    largest = max(local for _, local, _ in trainable)
    if t.optimizer is Optimizer.ADAMW:
        return [Term("workspace.optimizer_step", Kind.WORKSPACE, _blocks(trainable, state_b, shard),
                     f"P_trainable x {state_b} B" + (f" / {shard}" if shard > 1 else "") + " (foreach sqrt of exp_avg_sq)")]
    if t.optimizer is Optimizer.ADAFACTOR:
        return [Term("workspace.optimizer_step", Kind.WORKSPACE, 2 * largest * 4,
                     "2 x largest tensor x 4 B (fp32 update and squared gradient)")]
    if t.optimizer is Optimizer.LION:
        return [Term("workspace.optimizer_step", Kind.WORKSPACE, largest * state_b, f"largest tensor x {state_b} B (update)")]
    return []


# ---- activations ----


def execution(spec: ModelSpec, t: TrainingConfig, fw: Framework) -> Execution:
    """How the forward runs under ``t`` (bytes of the compute and residual dtypes, kernels, adapters)."""
    recipe = RECIPES[t.precision]
    c = recipe.compute
    quantized = t.method is Method.QLORA
    if quantized:
        # fp32 norm weights make RMSNorm's ``weight * x.to(input_dtype)`` fp32, and Linear4bit returns its
        # input's dtype: the residual stream is fp32 once the norms are (KbitPrep); trl runs the HF Trainer's
        # torch.autocast(bf16), PEFT's preparation alone no autocast, an unprepared bf16 model needs none
        r = c if t.prepare_kbit_training is KbitPrep.NONE else 4
        autocast = t.prepare_kbit_training is KbitPrep.TRL
    elif t.precision is Precision.AMP:
        r, autocast = 4, True
    else:
        r, autocast = c, False
    lora = None
    if t.method is not Method.FULL:
        names, all_linear = targets_of(t.lora.targets)
        if t.lora.targets == "attention":
            names = attention_targets(spec)
        lora = LoraActivations(targets=names, all_linear=all_linear, rank=t.lora.rank, adapter_bytes=ADAPTER_BYTES,
                               dropout=t.lora.dropout)
    # a family without an SDPA path in transformers runs eager attention whatever is asked (ModelSpec.sdpa_supported)
    eager = t.attn_implementation == AttnImplementation.EAGER or not spec.sdpa_supported
    # the family's routing-weight dtype, as the serving prefill reads it (hf_prefill.FORWARD_CODE)
    routing = 4 if FORWARD_CODE.get(spec.model_type, DEFAULT_CODE).routing_fp32 else c
    return Execution(compute_bytes=c, stream_bytes=r, autocast=autocast, eager=eager, repeat_kv=eager,
                     routing_bytes=routing, quantized_outputs=quantized,
                     fused_norms=fw is Framework.MEGATRON, lora=lora, hidden_dropout=spec.hidden_dropout,
                     attention_dropout=spec.attention_dropout)


@dataclass(frozen=True, slots=True)
class _Activations:
    """Activation bytes of one rank at the moments of the step."""

    stored: Term            # every layer's saved tensors (or checkpoints) of all in-flight micro-batches
    head: Term | None       # embeddings, final norm and lm_head input
    logits: Term | None     # at the loss backward
    logits_forward: Term | None  # inside the forward's loss
    rebuilt: Term | None    # one layer rebuilt under recompute (during its backward)
    transient: Term         # one layer's backward gradients (the layer the first_layer_backward moment is in)
    first_layer: Term       # what the stage's first layer keeps (rebuilt under recompute), for last_layer_backward
    first_transient: Term   # that layer's backward gradients
    other_microbatches: Term | None  # pipeline: the in-flight micro-batches not being back-propagated
    autocast_weights: Term | None    # torch.autocast's 16-bit weight copies, kept for backward
    autocast_layer: Term | None      # the same for one layer (what is left at the last layer's backward)
    layer_forward: Term | None       # a layer's forward beyond the stored activations (recompute, eager softmax)
    embedding: Term | None           # the embeddings' part of ``head`` (what exists before the final norm)
    masks: Term | None               # eager attention's materialized causal masks (during the forward, and
                                     # through the backward under recompute: the checkpoints keep them)


def _seq_for(layer: LayerSpec, t: TrainingConfig) -> int:
    if layer.stack == "decoder" and t.target_len is not None:
        return t.target_len
    return t.seq_len


def _activations(spec: ModelSpec, t: TrainingConfig, fw: Framework, stage: Stage) -> _Activations:
    par = t.parallelism
    x = execution(spec, t, fw)
    tp, sp = par.tp, par.sequence_parallel
    b = t.micro_batch_size
    in_flight = min(par.pp - stage.index, t.grad_accum_steps) if par.pp > 1 else 1
    h = spec.hidden_size
    selective = t.recompute is Recompute.SELECTIVE

    stored = 0.0
    rebuilt = transient = 0.0  # the layer whose rebuilt tensors and backward together are the largest
    first = first_rebuilt = first_back = last_back = 0.0
    forward = 0.0
    kinds = spec.layer_kinds(stage.start, stage.stop)
    first_layer, last_layer = spec.layers[stage.start], spec.layers[stage.stop - 1]
    # under LoRA the first layer's input needs no gradient (layer_activations, input_grad)
    frozen_input = stage.first and x.lora is not None
    # trl's QLoRA casts the embeddings back to bf16 while the norms keep the stream fp32 (kbit_weight_bytes)
    input_bytes = kbit_weight_bytes(t)[0] if t.method is Method.QLORA else x.stream_bytes
    for layer, count in kinds:
        s = _seq_for(layer, t) // par.cp
        tokens = b * s
        eager_len = s * par.cp if x.eager else s
        full = layer_activations(layer, hidden=h, seq_len=eager_len, x=x, selective=selective)
        per_layer = full.block_bytes(tokens, tp, sp)
        back = backward_transient(layer, seq_len=s * par.cp, x=x, hidden=h).block_bytes(tokens, tp, sp)
        if t.recompute is Recompute.FULL:
            kept = cuda_block_bytes(math.ceil(x.stream_bytes * h / (tp if sp else 1) * tokens))
        elif t.recompute is Recompute.SELECTIVE_OP:
            kept = selective_op_bytes(layer, hidden=h, x=x).block_bytes(tokens, tp, sp)
        else:
            kept = per_layer
        stored += kept * count
        if layer is first_layer:
            first = kept
            if t.recompute is Recompute.FULL and stage.first and input_bytes != x.stream_bytes:
                # the first layer's input is the embeddings' output, at their dtype
                first = cuda_block_bytes(math.ceil(input_bytes * h / (tp if sp else 1) * tokens))
                stored += first - kept
            if frozen_input and t.recompute in (Recompute.NONE, Recompute.SELECTIVE):
                first = layer_activations(layer, hidden=h, seq_len=eager_len, x=x, selective=selective,
                                          input_grad=False).block_bytes(tokens, tp, sp)
                stored += first - kept
        extra = full.forward_extra * tokens / (tp if sp else 1)
        if t.recompute in (Recompute.FULL, Recompute.SELECTIVE_OP):
            # the recomputation's own temporaries, before the layer's backward proper
            back = max(back, full.recompute_extra * tokens / (tp if sp else 1))
            if per_layer + back > rebuilt + transient:
                rebuilt, transient = per_layer, back
            # a checkpointed layer's forward drops what it would save; its largest block is alive at once
            forward = max(forward, (full.forward_working + x.stream_bytes * h) * tokens / (tp if sp else 1))
        elif extra:  # eager attention's softmax in the stage's last layer, its later tensors not made yet
            forward = max(forward, extra - full.after_scores * tokens / (tp if sp else 1))
        if layer is first_layer:
            first_rebuilt, first_back = per_layer, back
        if layer is last_layer:
            last_back = back
    if t.recompute not in (Recompute.FULL, Recompute.SELECTIVE_OP):
        transient = last_back  # the backward starts with the stage's last layer
    micro = "" if in_flight == 1 else f" x {in_flight} in flight"
    if t.recompute is Recompute.FULL:
        first_note = (f"; the first layer's at {input_bytes} B, the embeddings' dtype"
                      if stage.first and input_bytes != x.stream_bytes else "")
        stored_term = Term("activations.checkpoints", Kind.ACTIVATIONS, math.ceil(stored * in_flight),
                           f"L_stage x b x s x h x {x.stream_bytes} B (layer inputs{first_note}){micro}")
    elif t.recompute is Recompute.SELECTIVE_OP:
        stored_term = Term("activations.checkpoints", Kind.ACTIVATIONS, math.ceil(stored * in_flight),
                           f"L_stage x b x s x (layer input + every other matmul output + attention output){micro}")
    else:
        stored_term = Term("activations.layers", Kind.ACTIVATIONS, math.ceil(stored * in_flight),
                           f"sum over layers of saved bytes/token x b x s{micro}")
    rebuilt_term = Term("activations.recomputed_layer", Kind.ACTIVATIONS, math.ceil(rebuilt),
                        "one layer's saved tensors, rebuilt in backward") if rebuilt else None
    back_formula = "one layer's backward gradients: output gradient + max(MLP, post-norm, eager scores) x b x s"
    transient_term = Term("activations.backward", Kind.ACTIVATIONS, math.ceil(transient), back_formula)
    first_back_term = Term("activations.backward", Kind.ACTIVATIONS, math.ceil(first_back), back_formula)
    if t.recompute in (Recompute.FULL, Recompute.SELECTIVE_OP):
        first_term = Term("activations.recomputed_layer", Kind.ACTIVATIONS, math.ceil(first_rebuilt),
                          "the stage's first layer's saved tensors, rebuilt in backward")
    else:
        first_term = Term("activations.layers", Kind.ACTIVATIONS, math.ceil(first), "the stage's first layer's saved tensors")
    others = Term("activations.other_microbatches", Kind.ACTIVATIONS, math.ceil(stored * (in_flight - 1)),
                  f"{in_flight - 1} other in-flight micro-batches") if in_flight > 1 else None

    head_bytes = emb_bytes = 0.0
    head_parts: list[str] = []
    tokens_first = b * t.seq_len // par.cp
    if stage.first:
        has_norm = any(tn.component is Component.NORM for tn in spec.embedding)
        emb = embedding_bytes(has_norm, h, x) / (tp if sp else 1) * tokens_first
        if emb:
            head_bytes += emb
            emb_bytes = emb
            head_parts.append("embedding norm/dropout")
    logits_term = logits_fwd = None
    if stage.last:
        lm = spec.task in ("causal_lm", "seq2seq", "masked_lm")
        out_len = t.target_len if spec.task == "seq2seq" and t.target_len is not None else t.seq_len
        tokens_out = b * out_len // par.cp
        if any(tn.component is Component.NORM for tn in spec.head):
            head_trains = x.lora is None and lm
            head_bytes += norm_bytes(spec.reference_layer.norm, h, x, readers=1 if head_trains else 0,
                                     weight_trains=x.lora is None) / (tp if sp else 1) * tokens_out
            head_parts.append("final norm and lm_head input")
        if lm:
            logits_term = _logits(spec, t, fw, x, tokens_out)
            logits_fwd = _logits_forward(spec, t, fw, x, tokens_out) or logits_term
    head_term = Term("activations.head", Kind.ACTIVATIONS, math.ceil(head_bytes * in_flight),
                     " + ".join(head_parts) + " x b x s") if head_bytes else None
    embedding_term = Term("activations.head", Kind.ACTIVATIONS, math.ceil(emb_bytes * in_flight),
                          "embedding norm/dropout x b x s") if emb_bytes else None
    cast_all = cast_layer = None
    if x.autocast:
        def cast_bytes(items: list[tuple[TensorSpec, int]]) -> int:
            return sum(shard_numel(tn, par, spec.num_kv_heads) * cnt for tn, cnt in items) * x.compute_bytes

        head = [(tn, 1) for tn in spec.head if tn.component is Component.LM_HEAD and len(tn.shape) == 2] if stage.last else []
        if t.method is Method.QLORA:
            # the NF4 weights are dequantized inside MatMul4Bit (workspace.dequantized_weight), a 16-bit lm_head
            # needs no cast: autocast casts the fp32 adapters (and an fp32 lm_head)
            if kbit_weight_bytes(t)[0] == x.compute_bytes:
                head = []
            adapters = lora_adapters(spec, stage, t.lora, par.tp)
            one = max((sum(local for tn, local, _ in adapters if id(tn) in {id(u) for u in layer.tensors})
                       for layer, _ in kinds), default=0) * x.compute_bytes
            lm_head = " and the fp32 lm_head's" if head else ""
            if t.recompute in (Recompute.FULL, Recompute.SELECTIVE_OP):
                total, what = one + cast_bytes(head), f"the rebuilt layer's adapters'{lm_head}"
            else:
                total = sum(local * cnt for _, local, cnt in adapters) * x.compute_bytes + cast_bytes(head)
                what = f"every adapter's{lm_head}"
        else:
            one = max(cast_bytes([(tn, 1) for tn in layer.tensors if tn.is_linear_weight]) for layer, _ in kinds)
            if t.recompute in (Recompute.FULL, Recompute.SELECTIVE_OP):
                total, what = one + cast_bytes(head), "the rebuilt layer's and lm_head's"
            else:
                layers = [(tn, cnt) for layer, cnt in kinds for tn in layer.tensors if tn.is_linear_weight]
                total, what = cast_bytes(layers + head), "every linear weight's"
        cast_all = Term("workspace.autocast_weights", Kind.WORKSPACE, total,
                        f"{what} {x.compute_bytes}-byte copies (torch.autocast casts, kept for backward)")
        cast_layer = Term("workspace.autocast_weights", Kind.WORKSPACE, one, "one layer's autocast weight casts")
    forward_term = Term("activations.layer_forward", Kind.ACTIVATIONS, math.ceil(forward),
                        "one layer's forward: its tensors (discarded under recompute) + eager attention's masked "
                        "scores and their fp32 copy at the softmax") if forward > 0 else None
    return _Activations(stored_term, head_term, logits_term, logits_fwd, rebuilt_term, transient_term, first_term,
                        first_back_term, others,
                        cast_all, cast_layer, forward_term, embedding_term, _eager_masks(kinds, x, t, par))


def _eager_masks(kinds: tuple[tuple[LayerSpec, int], ...], x: Execution, t: TrainingConfig,
                 par: Parallelism) -> Term | None:
    """transformers' eager attention reads a materialized (b, 1, s, s) additive mask in the compute
    dtype, one per kind of attention (full, sliding window): ``masking_utils.create_causal_mask`` /
    ``create_sliding_window_causal_mask`` in the model's forward."""
    windows = {layer.attention.sliding_window for layer, _ in kinds
               if layer.attention.kind == "gqa" and x.eager}
    if not windows:
        return None
    s = t.seq_len // par.cp
    nbytes = len(windows) * cuda_block_bytes(t.micro_batch_size * s * t.seq_len * x.compute_bytes)
    return Term("activations.attention_masks", Kind.ACTIVATIONS, nbytes,
                f"{len(windows)} x b x s x s x {x.compute_bytes} B (eager attention's causal masks)")


def _logits_bytes(t: TrainingConfig, x: Execution) -> int:
    """Bytes of a logit: the compute dtype, or an fp32 lm_head's fp32 without autocast (QLoRA prepared by
    PEFT alone: its fp32 final norm output times its fp32 weight)."""
    if t.method is Method.QLORA and not x.autocast:
        return kbit_weight_bytes(t)[0]
    return x.compute_bytes


def _logits(spec: ModelSpec, t: TrainingConfig, fw: Framework, x: Execution, tokens: int) -> Term:
    """The logits at the start of their backward, on one rank (vocabulary split over tp)."""
    v = math.ceil(spec.vocab_size / t.parallelism.tp)
    c = _logits_bytes(t, x)
    if t.loss == Loss.FUSED:
        per, formula = (2 * c + 8) * spec.hidden_size, f"b x s x h x (2 x {c} + 8) B (one chunk of b x s x h / V tokens' logits, fused CE)"
    elif t.loss == Loss.CHUNKED:
        per = 4 * v + (8 + c) * v / LOSS_CHUNKS
        formula = f"b x s x V/t x (4 B fp32 log-probs + (8 + {c}) B / {LOSS_CHUNKS} for one chunk's gradients)"
    elif fw is Framework.MEGATRON:
        per, formula = (4 + 2 * c) * v, f"b x s x V/t x (4 B fp32 softmax + 2 x {c} B logits and gradient)"
    elif _loss_at_logits_dtype(spec, x):
        per, formula = 3 * c * v, f"b x s x V/t x 3 x {c} B (log-probs, nll grad, log-softmax grad at the logits dtype)"
    else:
        per, formula = 12 * v, "b x s x V/t x 12 B (fp32 log-probs, nll grad, log-softmax grad)"
    return Term("logits", Kind.LOGITS, math.ceil(tokens * per), formula)


def _loss_at_logits_dtype(spec: ModelSpec, x: Execution) -> bool:
    """True when the loss runs on the logits as they are, without ``ForCausalLMLoss``'s fp32 upcast:
    a masked LM's ``CrossEntropyLoss()(prediction_scores.view(-1, V), labels.view(-1))``
    (``transformers/models/bert/modeling_bert.py`` ``BertForMaskedLM``) outside autocast, which
    would run cross_entropy in fp32 (benchmarks/trace_findings.md §13)."""
    return spec.task == "masked_lm" and not x.autocast


def _logits_forward(spec: ModelSpec, t: TrainingConfig, fw: Framework, x: Execution, tokens: int) -> Term | None:
    """The logits inside the forward's loss, on one rank, where they differ from the backward's.

    transformers ``ForCausalLMLoss`` (``loss/loss_utils.py``): the c-byte logits, ``logits.float()``
    (none when c = 4) and ``cross_entropy``'s fp32 log-softmax are alive at once. None for the other
    losses (their backward term is used).
    """
    if t.loss != Loss.DEFAULT or fw is Framework.MEGATRON:
        return None
    v = math.ceil(spec.vocab_size / t.parallelism.tp)
    c = _logits_bytes(t, x)
    if _loss_at_logits_dtype(spec, x):
        return Term("logits", Kind.LOGITS, tokens * 2 * c * v, f"b x s x V/t x 2 x {c} B (logits, log-softmax)")
    per = c + (4 if c < 4 else 0) + 4
    return Term("logits", Kind.LOGITS, tokens * per * v,
                f"b x s x V/t x {per} B (logits, their fp32 upcast, fp32 log-softmax)")


# ---- moments ----


def moments(spec: ModelSpec, t: TrainingConfig, device: Device, stage: Stage | None = None) -> dict[str, list[Term]]:
    """Every candidate moment of the step on one rank (the last pipeline stage by default): the
    allocated terms alive then, by moment name (see the module docstring).

    Raises:
        InputError: the workload does not fit the model.
    """
    from memest.workload import validate

    validate(spec, t)
    stage = stage or stages(spec.num_layers, t.parallelism.pp)[-1]
    return _moments(spec, t, resolve_framework(t), device, stage)


_STATES: dict[tuple, tuple[ModelSpec, _States]] = {}
_ACTIVATIONS: dict[tuple, tuple[ModelSpec, _Activations]] = {}
_REMEMBERED_LIMIT = 1 << 14


def _remembered(cache: dict, spec: ModelSpec, key: tuple, make: Callable[[], Any]) -> Any:
    """``make()``, remembered per (spec, key): the planner estimates thousands of setups of one model, most of
    which share their model states or their activations. The entry keeps its spec alive, so its id cannot
    be reused while the entry exists (and a hit checks the identity). The values are never mutated."""
    full = (id(spec), *key)
    hit = cache.get(full)
    if hit is not None and hit[0] is spec:
        return hit[1]
    value = make()
    if len(cache) >= _REMEMBERED_LIMIT:
        cache.clear()
    cache[full] = (spec, value)
    return value


def _moments(spec: ModelSpec, t: TrainingConfig, fw: Framework, device: Device, stage: Stage) -> dict[str, list[Term]]:
    return {name: _kept(terms) for name, terms in _build_moments(spec, t, fw, device, stage)[0].items()}


def _build_moments(spec: ModelSpec, t: TrainingConfig, fw: Framework, device: Device,
                   stage: Stage) -> tuple[dict[str, list[Term]], _States]:
    """Every moment's allocated terms, and the model states they were built from."""
    trains_adapters = t.method is not Method.FULL
    # the model states do not depend on the batch, the sequence or recompute; the activations not on the
    # optimizer, offload or the ZeRO sharding: each is remembered per what it depends on
    st = _remembered(_STATES, spec, (stage, fw, t.method, t.precision, t.optimizer, t.offload, t.parallelism,
                                     t.lora if trains_adapters else None, t.prepare_kbit_training),
                     lambda: _model_states(spec, t, fw, stage))
    par = t.parallelism
    acts = _remembered(_ACTIVATIONS, spec, (stage, fw, t.method, t.precision, t.micro_batch_size, t.seq_len,
                                            t.target_len, t.grad_accum_steps, t.recompute, t.attn_implementation,
                                            t.loss, t.lora if trains_adapters else None, t.prepare_kbit_training,
                                            par.tp, par.pp, par.cp, par.sequence_parallel),
                       lambda: _activations(spec, t, fw, stage))
    base = [*st.base, _cublas(device)]
    matmul = st.dequantized
    grads_in_forward = t.grad_accum_steps > 1 or (not t.set_grads_to_none and fw in (Framework.PYTORCH, Framework.DDP))
    all_grads = st.grads_all
    later_grads = all_grads if grads_in_forward else st.grads_later
    fwd_grads = all_grads if grads_in_forward else _NO_GRADS
    head_grads = all_grads if grads_in_forward else st.grads_head
    casts = [acts.autocast_weights] if acts.autocast_weights else []
    head = [acts.head] if acts.head else []
    rebuilt = [acts.rebuilt] if acts.rebuilt else []
    last = [acts.first_layer]
    masks = [acts.masks] if acts.masks else []
    rebuilt_masks = masks if acts.rebuilt else []
    out = {
        "layer_forward": [*base, fwd_grads, *st.gathered_running, acts.stored, *([acts.embedding] if acts.embedding else []),
                          *casts, *masks,
                          *([acts.layer_forward] if acts.layer_forward else [])],
        "loss_forward": [*base, fwd_grads, *st.gathered, acts.stored, *head, *casts, *([acts.logits_forward] if acts.logits_forward else [])],
        "loss_backward": [*base, fwd_grads, *st.gathered_loss,
                          *st.backward_buffers, acts.stored, *head, *casts,
                          *([acts.logits] if acts.logits else [])],
        "first_layer_backward": [*base, head_grads, *st.gathered_running, *st.backward_buffers, *st.layer_buffers,
                                 acts.stored, *rebuilt,
                                 *rebuilt_masks,
                                 acts.transient, *matmul, *casts],
        "last_layer_backward": [*base, later_grads, *st.gathered_first,
                                *st.backward_buffers, *st.layer_buffers, *st.reduce_input, *last,
                                *rebuilt_masks,
                                acts.first_transient, *matmul,
                                *(x for x in (acts.other_microbatches, acts.autocast_layer) if x)],
    }
    if st.reduction:
        out["gradient_reduction"] = [*base, all_grads, *st.reduction]
    out["optimizer_step"] = [*base, all_grads if st.step_grads is None else st.step_grads, *st.step]
    return out, st


def _kept(terms: list[Term]) -> list[Term]:
    """A moment's terms without the empty ones (the weights are always shown)."""
    return [m for m in terms if m.bytes or m.kind is Kind.WEIGHTS]


def _stage_terms(spec: ModelSpec, t: TrainingConfig, fw: Framework, device: Device, stage: Stage) -> tuple[tuple[Term, ...], str]:
    """The terms of the moment that sets the peak, with the allocator and runtime terms, and its name."""
    candidates, st = _build_moments(spec, t, fw, device, stage)
    # a moment holds allocated kinds only: its bytes are its peak allocated
    name = max(candidates, key=lambda m: sum(map(_BYTES, candidates[m])))
    chosen = _kept(candidates[name])
    allocated = sum(map(_BYTES, chosen))
    slack = runtime.allocator_slack(device)
    chosen.append(Term("allocator", Kind.ALLOCATOR, round(allocated * slack), f"{slack:.0%} of peak allocated"))
    if st.stream_pool:
        chosen.append(Term("allocator.all_gather_stream", Kind.ALLOCATOR, st.stream_pool, st.stream_pool_formula))
    chosen.append(Term("runtime.cuda_context", Kind.RUNTIME, runtime.cuda_context_bytes(device), f"{device.arch} context"))
    if t.parallelism.world_size > 1:
        chosen.append(Term("runtime.nccl", Kind.RUNTIME, runtime.nccl_bytes(t.parallelism.world_size), "NCCL communicators"))
    return tuple(chosen), name


def _div(shard: int) -> str:
    return f" / {shard} (sharded)" if shard > 1 else ""


def _dequantized(spec: ModelSpec, stage: Stage, par: Parallelism, c: int) -> Term:
    """bitsandbytes dequantizes one NF4 weight to the compute dtype for each matmul."""
    largest = max((shard_numel(tn, par, spec.num_kv_heads) for layer, _ in spec.layer_kinds(stage.start, stage.stop)
                   for tn in layer.tensors if tn.is_linear_weight), default=0)
    return Term("workspace.dequantized_weight", Kind.WORKSPACE, largest * c,
                f"largest linear weight x {c} B (bitsandbytes dequantize_4bit for the matmul)")


def _host_bytes(spec: ModelSpec, t: TrainingConfig, device: Device) -> int:
    """Host RAM per node for offloaded states: fp32 master, optimizer states and fp32 gradients
    (and with ``--offload params`` the 16-bit parameters, a LoRA / QLoRA model's frozen base
    included), for the ranks of one node."""
    if t.offload is Offload.NONE:
        return 0
    recipe = RECIPES[t.precision]
    p = spec.num_params if t.method is Method.FULL else 0
    if t.method is not Method.FULL:
        p = sum(local * c for stage in stages(spec.num_layers, 1) for _, local, c in lora_adapters(spec, stage, t.lora, 1))
    if t.optimizer is Optimizer.ADAFACTOR:
        states = 4.0
    else:
        states = state_bytes_per_param(t.optimizer, recipe.state)
    per_param = recipe.master + states + 4
    frozen = 0.0
    if t.offload is Offload.PARAMS:
        per_param += recipe.weight
        if t.method is Method.LORA:  # ZeRO-3 param offload moves the frozen base too
            frozen = spec.num_params * recipe.weight
        elif t.method is Method.QLORA:
            frozen = weight_bytes(list(spec.tensors()), Parallelism(), spec.num_kv_heads, dtype_bytes=recipe.compute,
                                  scheme=SCHEMES["nf4"])
    par = t.parallelism
    ranks_per_node = min(device.per_node, par.world_size)
    return math.ceil((p * per_param + frozen) / (par.tp * par.pp * par.shard_degree) * ranks_per_node)


_ASSUMPTIONS: dict[tuple, tuple[str, ...]] = {}

_KBIT_ASSUMPTIONS = {
    KbitPrep.TRL: ("--prepare-kbit-training trl (trl SFTTrainer, bf16=True): norms fp32, embeddings and lm_head bf16, "
                   "fp32 residual stream and layer checkpoints (bitsandbytes Linear4bit returns its input's dtype), "
                   "torch.autocast(bf16); pass --prepare-kbit-training peft or none for other scripts"),
    KbitPrep.PEFT: ("--prepare-kbit-training peft (prepare_model_for_kbit_training alone): embeddings, norms and "
                    "lm_head fp32, fp32 residual stream, checkpoints and logits, no autocast"),
    KbitPrep.NONE: "--prepare-kbit-training none: other weights and the residual stream at 16 bits",
}


def _assumptions(spec: ModelSpec, t: TrainingConfig, fw: Framework, moment: str) -> tuple[str, ...]:
    """What the estimate assumed (remembered per the settings the sentences depend on)."""
    too_long = bool(spec.max_position_embeddings and t.seq_len > spec.max_position_embeddings)
    key = (spec.model_type, spec.sdpa_supported, too_long and t.seq_len, spec.max_position_embeddings, moment, fw,
           t.framework is Framework.AUTO, t.precision, t.attn_implementation, t.method, t.prepare_kbit_training,
           t.optimizer, t.parallelism.ep > 1 and t.parallelism.zero_stage > 0)
    hit = _ASSUMPTIONS.get(key)
    if hit is not None:
        return hit
    out = [
        f"peak moment: {moment} (of {', '.join(MOMENTS)})",
        f"framework {fw.value}" + (" (auto)" if t.framework is Framework.AUTO else "")
        + f"; precision recipe {t.precision.value}: {RECIPES[t.precision]}",
        "steady state (step >= 2): optimizer states allocated",
        ("each tensor in its own CUDA caching-allocator block (512 B multiples; 2 MiB segments of tensors from "
         "10 MiB on, unsplit when 1 MiB or less is left)"),
    ]
    if not spec.sdpa_supported:
        out.append(f"eager attention: transformers has no SDPA path for {spec.model_type}; the s x s scores are stored")
    elif t.attn_implementation != AttnImplementation.EAGER:
        out.append("flash / SDPA attention: no s x s scores stored; K and V kept at num_kv_heads")
    if too_long:
        out.append(f"seq_len {t.seq_len} exceeds max_position_embeddings {spec.max_position_embeddings}")
    if t.method is not Method.FULL:
        out.append("LoRA adapters in fp32 (PEFT autocast_adapter_dtype), trained with the optimizer's full states; "
                   "the first layer's input needs no gradient (PEFT enables input gradients only under "
                   "gradient checkpointing turned on before get_peft_model)")
        if fw is Framework.DEEPSPEED:
            out.append("DeepSpeed keeps an fp32 master of the fp32 adapters (a real engine casts the module to "
                       "16 bits first: adapters, their gradients and input copies then halve)")
    if fw is Framework.DEEPSPEED:
        out.append(f"DeepSpeed {DEEPSPEED_VERSION} with its config defaults: gradients accumulated in the model dtype (so "
                   "bf16 at ZeRO 0 runs FP16_Optimizer: unsharded fp32 master and states, fp32 gradient copies at the "
                   "step; data_types.grad_accum_dtype fp32 would select BF16_Optimizer, not modelled), FusedAdam, "
                   "contiguous_gradients on, overlap_comm off below ZeRO 3, reduce_bucket_size 5e8")
    if t.method is Method.QLORA:
        out.append("QLoRA base: NF4 linear weights (double quantization); " + _KBIT_ASSUMPTIONS[t.prepare_kbit_training])
    if t.optimizer is Optimizer.PAGED_ADAMW8BIT:
        out.append("paged optimizer states counted on the device (they page to host only under memory pressure)")
    if t.parallelism.ep > 1 and t.parallelism.zero_stage > 0:
        out.append("expert parallelism: routed experts' sharded states (ZeRO/FSDP) are split over their "
                   "expert-data-parallel group, the dp x cp / ep ranks holding the same experts (Megatron-LM, "
                   "DeepSpeed-MoE)")
    if len(_ASSUMPTIONS) > 4096:
        _ASSUMPTIONS.clear()
    result = _ASSUMPTIONS[key] = tuple(out)
    return result
