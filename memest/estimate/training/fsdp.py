"""``fsdp``: parameters, gradients and optimizer states sharded per parameter (FSDP2); gathered at
the compute dtype, moment by moment (``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py``):
the root unit (embeddings, final norm, lm_head: not resharded after forward) always; besides it
two layer units while layers run (the one computed and the one prefetched), one at the loss
backward (the last layer's, prefetched by the root's pre-backward hook) and one at the first
layer's backward (nothing left to prefetch). During a unit's backward its unsharded gradients;
from the second unit on, the previous unit's ``reduce_dtype`` reduce-scatter input
(``_fsdp_collectives.py`` ``foreach_reduce``). The all-gather outputs are allocated on their own
stream, whose cached blocks the compute stream cannot reuse: the root's and a layer's are reserved
beside the peak allocated (term ``allocator.all_gather_stream``).

Float8 all-gather (``float8_all_gather``): the float8 linears' weights travel and stay gathered in float8
(:func:`float8_gathered_bytes`).

CPU offload (``fully_shard(offload_policy=CPUOffloadPolicy())``, pin_memory True; torch 2.13
``_fsdp_param.py``, ``_fsdp_collectives.py``): the sharded parameters live in pinned host memory
(``FSDPParam._init_sharded_param``: ``padded_sharded_param.cpu().pin_memory()``), so do the optimizer's states
and its step (the optimizer holds the host shards); each unit's shards are copied to the device for its
all-gather (``all_gather_inputs``: ``sharded_param_data.to(self.device, non_blocking=True)``, then cast to the
param dtype) on the all-gather copy-in stream, and each sharded gradient is copied to host right after its
reduce-scatter (``foreach_reduce``: ``new_sharded_grad.to(torch.device("cpu"))``; accumulation adds on the
host). On the device stay the gathered units, the unit's unsharded gradients and reduce-scatter input (as
without offload), and, in the copy-in stream's pool, one layer's host-to-device shard copies at the
parameters' and the gather dtype. FSDP1 ``CPUOffload(offload_params=True)`` (``_flat_param.py``: ``_local_shard``
pinned on the host, ``_cpu_grad`` a pinned host gradient shard; ``_runtime_utils.py`` ``_offload_grad`` after
the reduce-scatter) leaves the same on the device. Host RAM: :func:`memest.estimate.training.step` (shards of
the parameters, gradients and optimizer states).

torchtune's ``custom_sharded_layers`` (:func:`own_units`): the token embedding and the output projection as units
of their own, resharded after forward, so each is gathered only while it computes: the output from its forward
through the loss backward (``loss_forward``, ``loss_backward``), the embedding prefetched for its backward at the
first layer's (``last_layer_backward``; its own forward, with no activations stored yet, is no candidate moment, nor
is its backward, which holds one layer's reduce-scatter input and its own gradient beside it); the root keeps the
final norm at every moment. The all-gather stream then caches the largest of the root, embedding and output units
beside a layer.

torchtune's ``optimizer_in_bwd``: :mod:`.in_backward` (a unit's reduce-scatter output at a time).

FSDP1 (``fsdp_flat_params``: ``FullyShardedDataParallel(use_orig_params=True)``, as Lightning Fabric's
``FSDPStrategy`` builds it; read in torch 2.13's ``torch/distributed/fsdp``, the code litgpt's 2024 runs on torch
2.2 / 2.3 called): each unit is one ``FlatParameter`` whose original parameters are views
(``_flat_param.py`` ``_get_unflat_views_unaligned``: ``torch.split(flat_param, _numels)`` then ``.view``), so autograd
assembles the unit's gradient in one ``SplitWithSizesBackward`` once every view's gradient has arrived. The root
unit (embedding, final norm, lm_head; not freed after forward, ``_runtime_utils.py`` ``_post_forward_reshard``:
"Do not free the root's parameters in the post-forward for FULL_SHARD") gets its head's gradients at the loss
backward and its embedding's at the very end: the head's are held through the whole backward (term
``workspace.root_grad_views``), and at the embedding's backward the embedding's gradient and the assembled flat
gradient of the root sit beside them (``workspace.root_flat_grad``, counted at the first layer's backward, where the
previous unit's reduce-scatter input is under FSDP2). On the CPU (``benchmarks/fsdp1_litgpt_cpu.md``, torch 2.13,
gloo) a litgpt-shaped GPT's step peaks at exactly that sum; without the two terms it would be a third lower.

FSDP1 with a LoRA model whose decoder layers are the units (litgpt's ``auto_wrap_policy={Block}`` around
lit_gpt's LoRA layers): ``use_orig_params=True`` lets a FlatParameter mix frozen and trainable parameters
(``_flat_param.py`` ``_validate_tensors_to_flatten``: its ``requires_grad`` is the OR over its tensors), and the
``FullyShardedDataParallel`` docstring warns of "higher than expected gradient memory usage": every view of such a
flat parameter requires grad, so the layer's whole gradient (frozen base included) is made, reduce-scattered and
kept sharded like a full fine-tune's (``_mixed_layer_units``; ``benchmarks/fsdp1_litgpt_cpu.md``: the whole unit's
gradient under ``no_sync``); the optimizer still holds the adapters only. peft's
``fsdp_auto_wrap_policy`` (accelerate, the HF Trainer) makes the adapters units of their own instead.

Accumulation inside ``no_sync`` (``no_sync_accumulation``; Lightning Fabric 2.3 ``_FSDPBackwardSyncControl``
``no_backward_sync`` returns ``module.no_sync()``, litgpt's ``finetune/full.py`` wraps every micro-batch but the
step's last in it): ``fully_sharded_data_parallel.py`` ``no_sync`` ("FSDP will accumulate the full model gradients
(instead of gradient shards) until the eventual sync"); ``_post_backward_hook`` returns before the reduce-scatter
while ``_sync_gradients`` is off, and ``FlatParamHandle.prepare_gradient_for_backward`` keeps an unsharded
``flat_param.grad`` for the next backward to add into. So every unit's unsharded gradient at the gradient dtype lives
through the forward and backward of the micro-batches after the first (term ``gradients``, in place of the sharded
ones); the last micro-batch reduce-scatters each accumulated gradient in its post-backward hook (no further copy:
no ``reduce_scatter_input``); ``zero_grad`` after the step leaves the sharded gradients to be freed before the next
forward (``_reset_flat_param_grad_info_if_needed``).

Pipeline parallelism (pp > 1, ``SHARD_GRAD_OP`` or full shard): torchtitan 9dec370
``torchtitan/parallelisms/parallelize_llama.py`` ``apply_fsdp`` passes ``reshard_after_forward=False`` to every
layer and the root when ``pp_enabled`` ("do not reshard after forward to avoid per-microbatch all-gathers"), and
torch's ``torch/distributed/pipelining/stage.py`` ``backward_maybe_with_nosync`` (pytorch 0138610) calls
``set_reshard_after_backward(False)`` and ``set_requires_gradient_sync(False)`` before each micro-batch's backward;
after the last, ``_post_backward`` turns both back on and runs every unit's ``post_backward`` (reshard, then
reduce-scatter). So the stage's units are all gathered (at the gather
dtype; float8 linears in float8) from the first forward to that reduce. With gradient sync off,
``FSDPParamGroup.post_backward`` (``_fsdp_param_group.py``) adds each new unsharded gradient into the
accumulated one (``accumulate_unsharded_grad_if_needed``) after upcasting the first
(``_fsdp_param.py`` ``to_accumulated_grad_if_needed``: ``unsharded_grad.to(self.reduce_dtype)``): every trained
parameter's unsharded gradient at the gradient dtype lives through forward and backward, one tensor per parameter,
in place of the sharded gradients (``zero_grad`` set them to None; they appear at the reduce). After the last
micro-batch each unit is resharded and its accumulated gradients reduce-scattered in turn (``post_backward``:
``reshard()`` before ``foreach_reduce``): at the first, the others gathered, every accumulated gradient, its flat
reduce_dtype input and sharded output (the ``gradient_reduction`` moment). As with gradient accumulation, the
gradients are counted at every moment of the step's forward and backward (the steady state: on the first stage
with as many micro-batches as stages no forward follows the first backward, an over-count of one micro-batch's
stored activations there).
"""

from __future__ import annotations

import math

from memest.estimate.runtime import cuda_block_bytes
from memest.estimate.sharding import Stage, layer_shard_numel, shard_numel, stage_tensors
from memest.estimate.training import qlora_base
from memest.estimate.training.in_backward import stepped_in_backward
from memest.estimate.training.optimizers import step_temporaries
from memest.estimate.training.protocol import FrameworkStates, StateContext, StatesInput
from memest.estimate.training.recipes import RECIPES, kbit_weight_bytes
from memest.estimate.training.trained import Gradients, blocks, expert_weighted, grad_groups
from memest.result import Kind, Term
from memest.spec import Component, LayerSpec, ModelSpec
from memest.workload import Method, Offload, Parallelism, Precision

FLAT_STATES = False
PER_PARAMETER_SHARDS = True


def float8_gathered_bytes(layer: LayerSpec, par: Parallelism, gather_b: int) -> int:
    """Bytes of one layer all-gathered under FSDP2's float8 all-gather: torchao 0.18.0
    ``float8/fsdp_utils.py`` ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather`` casts each float8 linear's
    weight shard to float8 (1 B) before the all-gather (with ``precompute_float8_dynamic_scale_for_fsdp`` one fp32
    scale per weight, counted as nothing); the layer's other tensors (norms) gather at ``gather_b``."""
    k = layer.attention.num_kv_heads
    linear = sum(shard_numel(tn, par, k) for tn in layer.tensors if tn.is_linear_weight)
    return linear + (layer_shard_numel(layer, par) - linear) * gather_b


def _gathered_layer_bytes(spec: ModelSpec, t: StatesInput, layer: LayerSpec, gather_b: int) -> int:
    """Bytes of one layer all-gathered: at ``gather_b`` per element, its float8 linears' weights in float8
    (:func:`float8_gathered_bytes`), or a QLoRA base as stored: torchao NF4Tensor.fsdp_pre_all_gather sends its
    quantized_scalers, quantization_factor and quantized_data (nf4_tensor.py, commit d1094d8)."""
    par = t.parallelism
    if t.method is Method.QLORA:
        emb, other = kbit_weight_bytes(t)
        return qlora_base.base_bytes([(tn, 1) for tn in layer.tensors], par, spec.num_kv_heads, t.lora_library,
                                     emb, other)[0]
    if t.float8_all_gather:
        return float8_gathered_bytes(layer, par, gather_b)
    return layer_shard_numel(layer, par) * gather_b


def own_units(spec: ModelSpec, t: StatesInput, stage: Stage) -> tuple[int, int, int]:
    """Elements on this rank of the root unit, the token embedding's unit and the output projection's unit
    (0 when not a unit of its own): torchtune ``custom_sharded_layers`` (commit 30b8519e86d2,
    ``recipes/full_finetune_distributed.py`` ``_setup_model``: ``fsdp_shard_conditions += [lambda n, m: n in
    custom_sharded_layers]``; ``torchtune/training/_distributed.py`` ``shard_model``: ``fully_shard`` on each
    matching module bottom-up, then on the whole model) makes ``tok_embeddings`` and ``output`` units of their own
    (``reshard_after_forward=True``), and the root keeps what remains (the final norm). A tied embedding stays in
    the root: the output projection reads its weight outside its module."""
    own = set(t.custom_sharded_layers.split(",")) if t.custom_sharded_layers else set()
    emb_ids = {id(tn) for tn in spec.embedding if tn.component is Component.EMBEDDING} \
        if "tok_embeddings" in own and not spec.tie_word_embeddings else set()
    out_ids = {id(tn) for tn in spec.head if tn.component is Component.LM_HEAD} if "output" in own else set()
    root_ids = {id(tn) for tn in (*spec.embedding, *spec.head)} - emb_ids - out_ids
    sums = [0, 0, 0]
    for tn, cnt in stage_tensors(spec, stage):
        for i, ids in enumerate((root_ids, emb_ids, out_ids)):
            if id(tn) in ids:
                sums[i] += shard_numel(tn, t.parallelism, spec.num_kv_heads) * cnt
    return sums[0], sums[1], sums[2]


def _mixed_layer_units(spec: ModelSpec, stage: Stage, par: Parallelism, trainable):
    """The gradient items of FSDP1 LoRA with the decoder layers as units (litgpt's ``auto_wrap_policy={Block}``):
    the adapters and every layer tensor of the stage, since a FlatParameter holding any trainable view requires grad
    as a whole (module docstring)."""
    base = [(tn, shard_numel(tn, par, spec.num_kv_heads), cnt)
            for layer, cnt in spec.layer_kinds(stage.start, stage.stop) for tn in layer.tensors]
    return [*trainable, *base]


def _flat_root_gradient(spec: ModelSpec, groups, gb: int) -> tuple[tuple[Term, ...], Term | None]:
    """FSDP1's root unit gradient (module docstring): the head's gradients held through backward, and at the
    embedding's backward the embedding's gradient beside the root's whole flat gradient assembled from both. A tied
    embedding is one view of the root: its lm_head contribution is the one held, its lookup's the one made last.
    None where the stage has no trained embedding (its gradient is then complete at the head's backward)."""
    head = sum(local * c for _, local, c in groups.head)
    emb_ids = {id(tn) for tn in spec.embedding if tn.component is Component.EMBEDDING}
    lookup = sum(local * c for tn, local, c in (*groups.head, *groups.embedding) if id(tn) in emb_ids)
    if not head or not lookup:
        return (), None
    root = head + sum(local * c for _, local, c in groups.embedding)
    held = (Term("workspace.root_grad_views", Kind.WORKSPACE, cuda_block_bytes(head * gb),
                 f"head's trained params x {gb} B (the root FlatParameter's view gradients, held until the "
                 "embedding's arrives)"),)
    whole = Term("workspace.root_flat_grad", Kind.WORKSPACE, cuda_block_bytes(lookup * gb) + cuda_block_bytes(root * gb),
                 f"(embedding + root unit) trained params x {gb} B (the embedding lookup's gradient and the root "
                 "FlatParameter's gradient assembled from its views)")
    return held, whole


def weight_shards(zero_stage: int, n: int) -> int:
    """FULL_SHARD (3) and SHARD_GRAD_OP (2) both shard the weights between steps."""
    return n if zero_stage >= 2 else 1


def states(ctx: StateContext) -> FrameworkStates:
    """FSDP gathered units, sharded gradients and their reduce copies (module docstring)."""
    spec, t, stage, n, z, gb, state_b = ctx.spec, ctx.t, ctx.stage, ctx.n, ctx.zero_stage, ctx.gb, ctx.state_b
    par = t.parallelism
    c = RECIPES[t.precision].compute
    trainable = ctx.trainable
    shard_g = n if z >= 2 else 1
    if shard_g > 1:  # experts' gradients shard over their expert-data-parallel group (expert_weighted)
        trainable = expert_weighted(trainable, par, n)
    # FSDP1 LoRA: a layer's FlatParameter holds its frozen base beside the adapters and takes a whole gradient
    mixed = t.fsdp_flat_params and t.method is Method.LORA and z >= 2 and bool(trainable)
    grad_items = _mixed_layer_units(spec, stage, par, trainable) if mixed else trainable
    groups = grad_groups(spec, stage, grad_items)
    later = sum(local * c for _, local, c in groups.used) - sum(local * c for _, local, c in (*groups.first, *groups.embedding))
    offloaded = t.offload is not Offload.NONE
    if offloaded:  # CPUOffloadPolicy: each sharded gradient is copied to host after its reduce-scatter
        gradients = Gradients(formula="sharded gradients copied to host after each reduce-scatter (CPUOffloadPolicy)")
    else:
        gradients = Gradients(
            all=blocks(groups.used, gb, shard_g),  # FSDP2 shards each parameter's gradient
            head=math.ceil(ctx.head_numel * gb / shard_g),
            before_first_layer=math.ceil(later * gb / shard_g),  # units reduce-scatter as their backward ends
            formula=f"P_trainable x {gb} B" + (f" / {n} (sharded)" if shard_g > 1 else ""))
    # the compute copies gathered: every weight (a LoRA base too) at its dtype, or FSDP2's param_dtype
    gather_b = c if t.precision is Precision.FSDP2 else RECIPES[t.precision].weight
    kinds = spec.layer_kinds(stage.start, stage.stop)
    largest = max(layer_shard_numel(layer, par) for layer, _ in kinds)
    unit_what, stage_what = f"largest layer unsharded x {gather_b} B", f"P_stage unsharded x {gather_b} B"
    if t.float8_all_gather:
        unit_what = f"largest layer unsharded: its linears' weights in float8 (1 B), the rest x {gather_b} B"
        stage_what = f"P_stage unsharded: the layers' linear weights in float8 (1 B), the rest x {gather_b} B"
    if t.method is Method.QLORA:
        unit_what, stage_what = "largest layer unsharded in NF4", f"P_stage unsharded: the layers in NF4, the rest x {gather_b} B"
    unit_bytes = max(_gathered_layer_bytes(spec, t, layer, gather_b) for layer, _ in kinds)
    root, embedding, output = own_units(spec, t, stage)
    stream_pool, stream_pool_formula = 0, ""
    if z >= 2:
        # FSDP2 allocates each unit's all-gather output on its all-gather copy-in stream (implicit prefetch,
        # _fsdp_collectives.py foreach_all_gather) and keeps it until the next unit's copy-out; the CUDA
        # caching allocator reuses a stream's cached blocks only for that stream, so that pool stays
        # reserved beside the compute stream's: the root's output and a layer's, at the gather dtype
        stream_pool = cuda_block_bytes(max(root, embedding, output) * gather_b) + cuda_block_bytes(unit_bytes)
        stream_pool_formula = (f"(largest of the root, embedding and output units + largest layer) unsharded x "
                               f"{gather_b} B: all-gather outputs cached "
                               "in the all-gather stream's pool")
        if offloaded:  # the next layer's host shards copied in (param dtype) and cast to the gather dtype
            weight_b = RECIPES[t.precision].weight
            stream_pool += cuda_block_bytes(math.ceil(largest * weight_b / n)) + cuda_block_bytes(
                math.ceil(largest * gather_b / n))
            stream_pool_formula += f" + largest layer / {n} x ({weight_b} + {gather_b}) B (its host shards copied in)"
    gathered: tuple[Term, ...] = ()
    gathered_head: tuple[Term, ...] = ()
    gathered_embedding: tuple[Term, ...] = ()
    unit, unit_formula = 0, ""
    pipelined = par.pp > 1 and z >= 2  # the stage kept unsharded through its micro-batches (module docstring)
    stage_gathered = 0
    if z == 2 or pipelined:
        rest = sum(shard_numel(tn, par, spec.num_kv_heads) * cnt for tn, cnt in stage_tensors(spec, stage)) - sum(
            layer_shard_numel(layer, par) * cnt for layer, cnt in kinds)  # embeddings, head
        stage_gathered = rest * gather_b + sum(_gathered_layer_bytes(spec, t, layer, gather_b) * cnt
                                               for layer, cnt in kinds)
        why = ("pipeline parallel: reshard_after_forward False, no reshard after backward until the last micro-batch"
               if pipelined else "SHARD_GRAD_OP keeps them from forward to backward")
        gathered = (Term("workspace.gathered_params", Kind.WORKSPACE, stage_gathered, f"{stage_what} ({why})"),)
    elif z >= 3:
        own = embedding or output
        gathered = (Term("workspace.gathered_root", Kind.WORKSPACE, root * gather_b,
                         f"{'what custom_sharded_layers leaves of ' if own else ''}embeddings + head unsharded "
                         f"x {gather_b} B (root unit, kept until backward)"),)
        if output:
            gathered_head = (Term("workspace.gathered_output", Kind.WORKSPACE, output * gather_b,
                                  f"output projection unsharded x {gather_b} B (its own unit: its forward through "
                                  "the loss backward)"),)
        if embedding:
            gathered_embedding = (Term("workspace.gathered_embedding", Kind.WORKSPACE, embedding * gather_b,
                                       f"token embedding unsharded x {gather_b} B (its own unit, prefetched for "
                                       "its backward)"),)
        unit, unit_formula = unit_bytes, unit_what
    layer_buffers: tuple[Term, ...] = ()
    reduce_input: tuple[Term, ...] = ()
    backward_buffers: tuple[Term, ...] = ()
    grads_unit = largest if t.method is Method.FULL or mixed else 0
    no_sync = t.no_sync_accumulation and z >= 2 and not pipelined and not offloaded and bool(groups.used)
    if z >= 2:
        layer_buffers = (Term("workspace.unsharded_grads", Kind.WORKSPACE, grads_unit * gather_b,
                              f"largest layer x {gather_b} B (the unit's unsharded gradients)"),)
    if z >= 2 and not pipelined and not no_sync:
        # foreach_reduce copies a finished unit's gradients into a flat reduce_dtype buffer, alive through
        # the next unit's backward (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py)
        reduce_input = (Term("workspace.reduce_scatter_input", Kind.WORKSPACE, grads_unit * gb,
                             f"largest layer x {gb} B (the previous unit's reduce-scatter input)"),)
    if t.fsdp_flat_params and z >= 3 and root:
        backward_buffers, root_grad = _flat_root_gradient(spec, groups, gb)
        if root_grad is not None and root_grad.bytes > sum(x.bytes for x in reduce_input):
            reduce_input = (root_grad,)
    accumulated, reduction = None, ()
    if no_sync:
        # FSDP1 no_sync (module docstring): each unit's unsharded gradient kept in flat_param.grad and added
        # into by every micro-batch's backward, reduce-scattered (and freed) in the last one's
        unsharded = grad_groups(spec, stage, _mixed_layer_units(spec, stage, par, ctx.trainable) if mixed
                                else ctx.trainable).used
        what = "P_trainable + the LoRA layers' frozen base" if mixed else "P_trainable"
        accumulated = Term("gradients", Kind.GRADIENTS, blocks(unsharded, gb),
                           f"{what} unsharded x {gb} B (accumulated inside no_sync, reduce-scattered in the "
                           "last micro-batch's backward)")
    if pipelined and groups.used and not offloaded:
        # every trained parameter's unsharded gradient, upcast to reduce_dtype after the first micro-batch's
        # backward and accumulated into until the last one's reduce-scatter (module docstring); per parameter
        unsharded = grad_groups(spec, stage, ctx.trainable).used
        accumulated = Term("gradients", Kind.GRADIENTS, blocks(unsharded, gb),
                           f"P_trainable unsharded x {gb} B (accumulated over the micro-batches, reduce-scattered "
                           "after the last)")
        # after the last micro-batch's backward each unit in turn is resharded and reduce-scattered: at the
        # first (the largest layer) every other unit still gathered, every accumulated gradient, its flat
        # reduce_dtype input and its sharded output
        reduction = (
            Term("workspace.gathered_params", Kind.WORKSPACE, stage_gathered - unit_bytes,
                 "P_stage unsharded less the unit being reduced (resharded just before its reduce-scatter)"),
            Term("workspace.reduce_scatter_input", Kind.WORKSPACE, grads_unit * gb,
                 f"largest layer x {gb} B (its reduce-scatter input)"),
            Term("workspace.reduce_scatter_output", Kind.WORKSPACE, cuda_block_bytes(math.ceil(grads_unit * gb / n)),
                 f"largest layer / {n} x {gb} B (its sharded gradients)"))
    fs = FrameworkStates(gradients=gradients, backward_buffers=backward_buffers, layer_buffers=layer_buffers,
                         reduce_input=reduce_input,
                         gathered=gathered, gathered_head=gathered_head, gathered_embedding=gathered_embedding,
                         gathered_unit=unit, gathered_formula=unit_formula,
                         stream_pool=stream_pool, stream_pool_formula=stream_pool_formula,
                         step=tuple(step_temporaries(spec, t, trainable, state_b, shard_g, fused=False)),
                         accumulated=accumulated, reduction=reduction, reduction_grads=accumulated)
    if not t.optimizer_in_bwd or not groups.used:
        return fs
    # each unit's sharded gradients are views of one reduce-scatter output, stepped in the reduce's loop
    unit_numel = max(largest, root, embedding, output) if shard_g > 1 else max(local for _, local, _ in groups.used)
    in_flight = 0 if offloaded else cuda_block_bytes(math.ceil(unit_numel * gb / shard_g))
    tensor, local, _ = max(groups.used, key=lambda item: item[1])
    what = (f"largest unit (root or layer) / {n} x {gb} B (its reduce-scatter output)" if shard_g > 1 else
            f"largest trained parameter x {gb} B")
    return stepped_in_backward(fs, ctx, in_flight, what if not offloaded else "copied to host (CPUOffloadPolicy)",
                               (tensor, local, 1), shard_g)
