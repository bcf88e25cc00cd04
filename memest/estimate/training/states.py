"""One rank's model states: weights, fp32 master and optimizer states (ZeRO / FSDP sharding applied),
and the framework's buffers (:mod:`.protocol`), as frozen terms named by their lifetime.

The states do not depend on the batch, the sequence or recompute: they are remembered per the workload
fields they read (:class:`.protocol.StatesInput`, :mod:`memest.memo`).
"""

from __future__ import annotations

import math
import operator
from types import ModuleType
from typing import NamedTuple

from memest.estimate.runtime import cuda_block_bytes
from memest.estimate.sharding import Stage, shard_numel, stage_tensors
from memest.estimate.training import ddp, deepspeed, fsdp, megatron, pytorch, qlora_base
from memest.estimate.training.lora import adapter_bytes, lora_adapters
from memest.estimate.training.optimizers import optimizer_bytes, paged_bytes
from memest.estimate.training.protocol import FrameworkStates, StateContext, StatesInput
from memest.estimate.training.recipes import RECIPES, kbit_weight_bytes
from memest.estimate.training.trained import blocks, expert_data_ranks, expert_weighted, grad_groups, sharded_note
from memest.estimate.weights import tensor_bytes
from memest.memo import remembered
from memest.result import Kind, Term
from memest.spec import Component, ModelSpec
from memest.workload import Framework, Method, Offload, Optimizer, Parallelism

FRAMEWORKS: dict[Framework, ModuleType] = {
    Framework.PYTORCH: pytorch,
    Framework.DDP: ddp,
    Framework.DEEPSPEED: deepspeed,
    Framework.MEGATRON: megatron,
    Framework.FSDP: fsdp,
}
"""The module of each framework; each follows :class:`.protocol.FrameworkModel`."""

_BYTES = operator.attrgetter("bytes")


class ModelStates(NamedTuple):
    """One rank's model-state terms, by lifetime (the names :data:`.table.MOMENT_TABLE` uses).

    Attributes:
        base: Alive through the whole step: weights, fp32 master, optimizer states, the framework's
            persistent buffers, registered buffers.
        base_bytes: Their bytes.
        grads_all: Every gradient, after backward.
        grads_later: All but the stage's first layer's and the embeddings' (the first layer's backward).
        grads_head: The head's (the last layer's backward).
        reduction: Beside every gradient after backward (DeepSpeed ZeRO 1: the ``gradient_reduction`` moment).
        stream_pool: Reserved beside the peak, never allocated on the compute stream (FSDP's all-gather outputs).
        stream_pool_formula: How ``stream_pool`` is computed.
        lifetimes: The terms of each of :data:`.table.STATE_LIFETIMES`, in that order: the gathered weights
            (``gathered``; with FSDP's layer units: two while layers run, ``gathered.running``, one at the
            loss backward, ``gathered.loss``, and at the first layer's, ``gathered.first``), the
            framework's buffers (:class:`.protocol.FrameworkStates`), QLoRA's dequantized weight, every
            gradient (``grads.all``) and those alive at the step (``grads.step``).
        sizes: Their bytes, lifetime by lifetime.
        paged: Optimizer-state bytes in CUDA managed memory (bitsandbytes paged optimizers,
            :func:`.optimizers.paged_bytes`): in no moment, outside the allocator's figures.
        accumulated: The gradients alive through forward and backward instead of ``grads_all`` /
            ``grads_head`` / ``grads_later`` (:attr:`.protocol.FrameworkStates.accumulated`), or None.
    """

    base: tuple[Term, ...]
    base_bytes: int
    grads_all: Term
    grads_later: Term
    grads_head: Term
    reduction: tuple[Term, ...]
    stream_pool: int
    stream_pool_formula: str
    lifetimes: tuple[tuple[Term, ...], ...]
    sizes: tuple[int, ...]
    paged: int = 0
    accumulated: Term | None = None


@remembered(maxsize=1 << 14)
def model_states(spec: ModelSpec, t: StatesInput, fw: Framework, stage: Stage) -> ModelStates:
    """One rank's model states (remembered)."""
    model = FRAMEWORKS[fw]
    par = t.parallelism
    recipe = RECIPES[t.precision]
    k = spec.num_kv_heads
    n = par.shard_degree
    z = par.zero_stage
    tensors = stage_tensors(spec, stage)
    shard_w = model.weight_shards(z, n)
    offloaded = t.offload is not Offload.NONE
    # DeepSpeed's optimizers keep an fp32 master (one flat tensor per partition) of whatever trains,
    # and its FusedAdam two flat states: FP16_Optimizer at ZeRO 0 (bf16 or fp16), the ZeRO optimizers at 1-3
    flat = model.FLAT_STATES
    kept = 0  # bytes of the weights no sharding divides (a QLoRA base's quant states)

    if t.method is Method.FULL:
        trainable = [(tn, shard_numel(tn, par, k), c) for tn, c in tensors]
        if shard_w == 1:
            weights = blocks(trainable, recipe.weight)
        elif model.PER_PARAMETER_SHARDS:  # FSDP2 shards every parameter on its own
            weights = blocks(expert_weighted(trainable, par, n), recipe.weight, shard_w)
        else:  # DeepSpeed ZeRO-3: one flat partition
            flat_numel = sum(local * c for _, local, c in expert_weighted(trainable, par, n))
            weights = cuda_block_bytes(math.ceil(flat_numel * recipe.weight / shard_w))
        weights_formula = f"P_stage x {recipe.weight} B"
        gb = recipe.grad
        master_b, state_b = recipe.master, recipe.state
    else:
        assert t.lora is not None
        trainable = list(lora_adapters(spec, stage, t.lora, par.tp))
        # under ZeRO-3 the frozen experts, too, are sharded over their expert-data-parallel group only
        e = expert_data_ranks(par, n) if shard_w > 1 else 1
        scale = [(tn, c * e if tn.component is Component.EXPERTS else c) for tn, c in tensors]
        ab = adapter_bytes(t.lora_library, t.precision)
        untied = qlora_base.untied_head_numel(spec, t.lora_library, stage.last)
        if t.method is Method.LORA:
            base = sum(cuda_block_bytes(math.ceil(tensor_bytes(tn, par, k, dtype_bytes=recipe.weight))) * c
                       for tn, c in scale) + cuda_block_bytes(untied * recipe.weight)
            weights_formula = (f"frozen base x {recipe.weight} B" + (" (litgpt's own lm_head included)" if untied else "")
                               + f" + adapters x {ab} B")
        else:
            emb, other = kbit_weight_bytes(t)
            base, words = qlora_base.base_bytes(scale, par, k, t.lora_library, emb, other, untied)
            weights_formula = (f"{words} (--prepare-kbit-training {t.prepare_kbit_training.value}) "
                               f"+ adapters x {ab} B")
            if shard_w > 1:
                # the quant states stay whole on every rank (base counts them at the sharded multiplicities)
                base -= qlora_base.unsharded_state_bytes(scale, par, k, t.lora_library)
                kept = qlora_base.unsharded_state_bytes(tensors, par, k, t.lora_library)
                if kept:
                    weights_formula += " (the bitsandbytes quant states whole on every rank)"
        weights = math.ceil((base + sum(local * c for _, local, c in trainable) * ab) / shard_w) + kept
        gb = ab
        # the DeepSpeed optimizers' fp32 master copies the adapters too; torch AdamW keeps its states in
        # the adapters' dtype
        master_b, state_b = (4 if flat and recipe.master else 0), (4 if flat else ab)
    numel = sum(local * c for _, local, c in trainable)
    groups = grad_groups(spec, stage, trainable)
    head_numel = sum(local * c for _, local, c in groups.head)
    # what sharded states are computed from: experts' elements scaled by e (see expert_weighted)
    sharded = expert_weighted(trainable, par, n)
    sharded_numel = sum(local * c for _, local, c in sharded)

    shard_o = n if z >= 1 else 1
    if t.offload is Offload.PARAMS:
        weights = kept
    if shard_w > 1:
        weights_formula += f" / {n} (sharded)"
    o_numel, o_items = (sharded_numel, sharded) if shard_o > 1 else (numel, trainable)
    master = 0 if offloaded else cuda_block_bytes(math.ceil(o_numel * master_b / shard_o))
    if offloaded:
        moments = 0
    elif flat and t.optimizer in (Optimizer.ADAMW, Optimizer.ADAMW_FUSED):  # FusedAdam on the flat master
        moments = 2 * cuda_block_bytes(math.ceil(o_numel * state_b / shard_o))
    elif t.optimizer in (Optimizer.ADAMW, Optimizer.ADAMW_FUSED) and (shard_o == 1 or model.PER_PARAMETER_SHARDS):
        # torch AdamW: exp_avg and exp_avg_sq of every parameter (FSDP2: of every parameter's shard)
        moments = 2 * blocks(o_items, state_b, shard_o)
    else:
        moments = math.ceil(optimizer_bytes(o_items, t.optimizer, state_b) / shard_o)
    # bitsandbytes' paged states: in CUDA managed memory, outside the allocator (:mod:`.optimizers`)
    paged = 0 if offloaded else math.ceil(paged_bytes(o_items, t.optimizer) / shard_o)
    moments -= paged

    fs = model.states(StateContext(spec=spec, t=t, stage=stage, trainable=trainable, sharded_numel=sharded_numel,
                                   groups=groups, n=n, gb=gb, state_b=state_b, head_numel=head_numel))
    base_terms = (Term("weights", Kind.WEIGHTS, weights, weights_formula),
                  Term("optimizer_states.master", Kind.OPTIMIZER_STATES, master, "fp32 master weights" + sharded_note(shard_o)),
                  Term("optimizer_states.moments", Kind.OPTIMIZER_STATES, moments,
                       f"{t.optimizer.value} states" + sharded_note(shard_o)
                       + (" (the paged ones outside the allocator: only absmax and tensors < 1e5 elements)"
                          if paged else "")),
                  *fs.persistent)
    if spec.buffers:
        base_terms += (Term("weights.buffers", Kind.WEIGHTS, sum(cuda_block_bytes(b.nbytes) for b in spec.buffers),
                            " + ".join(f"{b.name} {'x'.join(map(str, b.shape))} x {b.itemsize} B" for b in spec.buffers)
                            + " (registered buffers)"),)
    return _by_lifetime(spec, t, stage, base_terms, fs, paged)


def _by_lifetime(spec: ModelSpec, t: StatesInput, stage: Stage, base: tuple[Term, ...],
                 fs: FrameworkStates, paged: int) -> ModelStates:
    grads = fs.gradients

    def gathered(units: int, why: str) -> tuple[Term, ...]:
        """FSDP2's gathered layer units alive at a moment (``units`` of them)."""
        if not fs.gathered_unit:
            return ()
        return (Term("workspace.gathered_layers", Kind.WORKSPACE, units * fs.gathered_unit,
                     f"{units} x {fs.gathered_formula} ({why})"),)

    c = RECIPES[t.precision].compute
    dequantized = (_dequantized(spec, stage, t.parallelism, c),) if t.method is Method.QLORA else ()
    head = _dequantized_head(spec, stage, t, c)
    grads_all = Term("gradients", Kind.GRADIENTS, grads.all, grads.formula)
    lifetimes = (  # in STATE_LIFETIMES order
        (*fs.gathered, *fs.gathered_head),                                           # gathered
        (*fs.gathered, *gathered(2, "the unit computed + the one prefetched")),      # gathered.running
        (*fs.gathered, *fs.gathered_head,
         *gathered(1, "the last layer's, prefetched for its backward")),            # gathered.loss
        (*fs.gathered, *fs.gathered_embedding,
         *gathered(1, "the unit computed; none left to prefetch")),                # gathered.first
        fs.backward_buffers,                                                         # buffers.backward
        fs.layer_buffers,                                                            # buffers.layer
        fs.reduce_input,                                                             # buffers.reduce_input
        fs.reduction,                                                                # reduction
        fs.step,                                                                     # step
        dequantized,                                                                 # dequantized
        head,                                                                        # dequantized.head
        (fs.reduction_grads or grads_all,),                                          # grads.all
        (grads_all if fs.step_grads is None else fs.step_grads,),                    # grads.step
    )
    return ModelStates(
        base=base,
        base_bytes=sum(map(_BYTES, base)),
        grads_all=grads_all,
        grads_later=Term("gradients", Kind.GRADIENTS, grads.before_first_layer,
                         grads.formula + " but the first layer's and embeddings'"),
        grads_head=Term("gradients", Kind.GRADIENTS, grads.head, "the head's gradients, the first computed"),
        reduction=fs.reduction,
        stream_pool=fs.stream_pool,
        stream_pool_formula=fs.stream_pool_formula,
        lifetimes=lifetimes,
        sizes=tuple(sum(map(_BYTES, terms)) for terms in lifetimes),
        paged=paged,
        accumulated=fs.accumulated,
    )


def _dequantized(spec: ModelSpec, stage: Stage, par: Parallelism, c: int) -> Term:
    """One NF4 weight dequantized to the compute dtype for each matmul (:mod:`.qlora_base`): the largest
    linear weight of the layers."""
    largest = max((shard_numel(tn, par, spec.num_kv_heads) for layer, _ in spec.layer_kinds(stage.start, stage.stop)
                   for tn in layer.tensors if tn.is_linear_weight), default=0)
    return Term("workspace.dequantized_weight", Kind.WORKSPACE, largest * c,
                f"largest linear weight x {c} B (dequantized for the matmul)")


def _dequantized_head(spec: ModelSpec, stage: Stage, t: StatesInput, c: int) -> tuple[Term, ...]:
    """litgpt's NF4 lm_head in its forward and its backward (:mod:`.qlora_base`): bitsandbytes 0.42
    ``MatMul4Bit.forward`` computes ``F.dequantize_4bit(B, quant_state).to(A.dtype)``, its backward
    ``F.dequantize_4bit(B, ctx.state).to(grad_output.dtype)``; Fabric quantized the weight from
    fp16 (``_Linear4bit._quantize_weight``: ``.to(dtype=torch.half)``), so the dequantized fp16 copy and
    its cast to the compute dtype are both alive inside ``.to``: 2 x vocab x h x 2 B."""
    if t.method is not Method.QLORA or not stage.last or not qlora_base.quantizes_lm_head(t.lora_library):
        return ()
    head = max((shard_numel(tn, t.parallelism, spec.num_kv_heads) for tn in spec.head
                if tn.component is Component.LM_HEAD and len(tn.shape) == 2),
               default=qlora_base.untied_head_numel(spec, t.lora_library, stage.last))
    return (Term("workspace.dequantized_weight", Kind.WORKSPACE, head * (2 + c),
                 f"the NF4 lm_head x (2 + {c}) B (its fp16 dequantized copy and the cast, in its matmul)"),)
