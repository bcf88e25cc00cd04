"""``deepspeed``, as DeepSpeed v0.19.5 (:data:`DEEPSPEED_VERSION`) runs with its config defaults
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
default), two with ``overlap_comm`` (:func:`_reduce_buffers`; off by default below stage 3); after backward
``reduce_gradients`` moves each gradient into the bucket (freeing its own block), reduces it and copies the
rank's partition into ``grads_in_partition`` (P/N x 2 B), allocated at the first bucket holding any of it:
on rank 0, whose partition the first bucket fills, while nearly all gradients still exist (moment
``gradient_reduction``: every gradient + the bucket + the partition, which over-counts the first bucket's
gradients already moved into it, at most 1 GB, and leaves out ``allreduce_bucket``'s flattened copy of a
bucket spanning several partitions, at most the bucket); the epilogue then drops every param.grad (``_clear_param_grad_only``, v0.18.5 on;
before it ``step`` did, ``free_grad_in_param_list``). Stage 2 reduces during backward into the bucket and
``grads_in_partition``, and under gradient accumulation keeps the partition of the window's micro-batches so
far beside each later micro-batch's own, from its first reduction on (:func:`_micro_batch_partition`);
stage 3 holds the bucket permanently, a bf16 gradient partition
(``grad_partitions_flat_buffer``) and sharded bf16 weights. At the step stages 1-3 hold the gradient
partition, flatten it (P/N x 2 B) and cast that to fp32 (P/N x 4 B, ``single_grad_partition``); FusedAdam
needs no temporary. DeepSpeed's optimizers keep an fp32 master of whatever trains, LoRA's fp32 adapters
included.

Stage 3 besides (``zero/parameter_offload.py``, ``zero/stage3.py``, ``comm/coalesced_collectives.py``):
a parameter of at most ``stage3_param_persistence_threshold`` = 1e5 elements is never partitioned
(``mark_persistent_parameters`` sets ``ds_persist``; ``partition_parameters.py`` keeps its partition on the
device too): every rank holds it whole beside its share of the flat partition (term ``weights.persistent``).
Each bucket of gradients is reduce-scattered by ``__avg_scatter_grads`` -> ``reduce_scatter_coalesced``,
which ``torch.cat``s the bucket's gradients, interleaved and padded per rank, into a new flat tensor of the
bucket's size: up to ``reduce_bucket_size`` elements at the gradient dtype, made when a bucket fills in the
layers' backward (term ``workspace.reduce_scatter_input``, at the first layer's backward; the copy is skipped only for a bucket of one tensor divisible by the
ranks, which memest does not single out).

Optimizer offload (``offload_optimizer`` device cpu) moves the fp32 master, the optimizer states and the fp32
gradient partition to host RAM (:func:`offload_host_bytes_per_param` for the host copies beyond those);
ZeRO-1/2 (``stage_1_and_2.py``, ``cpu_offload``) keeps on the GPU, besides the full 16-bit weights and the
reduce bucket, ``temp_grad_buffer_for_gpu_offload``: the largest parameter's elements at the parameters' dtype,
allocated at initialisation (term ``workspace.offload_grad_buffer``). Parameter offload (``offload_param``
device cpu, ZeRO-3) keeps the parameters' partitions in host RAM: each all-gather first copies its set's host
partitions to the device beside the gathered buffer (term ``workspace.offload_partition_copies`` at the moment
the two peak together, :func:`gathered_peak`). Device ``nvme``: below ZeRO-3 it is ``cpu`` (``stage_1_and_2.py``
has no swapper); at ZeRO-3 the optimizer swaps its states to NVMe and host RAM holds its pinned buffers
(:func:`nvme_optimizer_swap`); ``offload_param`` nvme is not modelled (counted as host RAM, said in a note).
"""

from __future__ import annotations

import math

from memest.estimate.runtime import cuda_block_bytes
from memest.estimate.sharding import shard_numel, stage_tensors
from memest.estimate.training import qlora_base
from memest.estimate.training.lora import ADAPTER_BYTES
from memest.estimate.training.protocol import FrameworkStates, StateContext, zero3_weight_shards
from memest.estimate.training.recipes import RECIPES, kbit_weight_bytes
from memest.estimate.training.trained import Gradients, blocks, param_gradients
from memest.result import Kind, Term
from memest.workload import Method, Offload

DEEPSPEED_VERSION = "0.19.5"
"""The DeepSpeed release the ``deepspeed`` framework follows (tag v0.19.5, commit cf44300453eb)."""


DEEPSPEED_REDUCE_BUCKET = 500_000_000
"""DeepSpeed ``reduce_bucket_size`` default, in elements (``deepspeed/runtime/zero/config.py``)."""

MAX_REUSE_DISTANCE = 1_000_000_000
"""DeepSpeed ``stage3_max_reuse_distance`` default, in elements (``deepspeed/runtime/zero/config.py`` v0.19.5,
``max_reuse_distance: int = Field(pp_int(1e9))``): a released module's parameters stay gathered when they are
used again before this many parameter elements have been fetched
(``partitioned_param_coordinator.py`` ``__params_to_release``)."""

PREFETCH_BUCKET = 50_000_000
"""DeepSpeed ``stage3_prefetch_bucket_size`` default, in elements (``config.py`` v0.19.5,
``prefetch_bucket_size: int = Field(pp_int(5e7))``): at each fetch the coordinator all-gathers the next
parameters of the trace until this many elements are in flight (``_fetch_sub_module_impl``)."""

MAX_LIVE_PARAMETERS = 1_000_000_000
"""DeepSpeed ``stage3_max_live_parameters`` default, in elements (``config.py`` v0.19.5,
``max_live_parameters: int = Field(pp_int(1e9))``): prefetching stops once this many are gathered
(``max_params_to_prefetch = min(max_n_available - n_available, prefetch_bucket_sz)``)."""

PARAM_PERSISTENCE_THRESHOLD = 100_000
"""DeepSpeed ``stage3_param_persistence_threshold`` default, in elements (``deepspeed/runtime/zero/config.py``
v0.19.5 line 221, ``param_persistence_threshold: int = Field(pp_int(1e5))``): ZeRO-3 never partitions a
parameter of at most this many elements (``parameter_offload.py`` ``mark_persistent_parameters``:
``param.ds_numel <= param_threshold``; ``stage3_model_persistence_threshold``, the cap on their total,
defaults to ``sys.maxsize``)."""


FLAT_STATES = True
PER_PARAMETER_SHARDS = False
weight_shards = zero3_weight_shards


def states(ctx: StateContext) -> FrameworkStates:
    """DeepSpeed's gradient buffers and step transients (module docstring); ``ctx.sharded_numel``: the
    trainable elements as ZeRO partitions them over ``n`` (experts weighted)."""
    t, n, z, gb = ctx.t, ctx.n, ctx.zero_stage, ctx.gb
    sharded_numel = ctx.sharded_numel
    numel = sum(local * c for _, local, c in ctx.trainable)
    offloaded = t.offload is not Offload.NONE
    buckets = t.deepspeed_buckets
    reduce_bucket = buckets.reduce_bucket_size
    count, why = _reduce_buffers(buckets.overlap_comm, buckets.contiguous_gradients) if z in (1, 2) else (1, "")
    bucket = Term("workspace.reduce_bucket", Kind.WORKSPACE, count * cuda_block_bytes(reduce_bucket * gb),
                  (f"{count} x " if count > 1 else "")
                  + f"reduce_bucket_size {_elements(reduce_bucket, DEEPSPEED_REDUCE_BUCKET)} x {gb} B (ipg_buffer{why})")
    if z == 0:
        # FP16_Optimizer (bf16 too, DeepSpeed >= 0.17.6): param.grad until its step, which copies each to
        # fp32 (``p.grad.to(fp32)``: the same tensor when already fp32) and flattens the copies
        # (fused_optimizer.py ``step``) before dropping param.grad
        step: tuple[Term, ...] = ()
        if gb < 4:
            step += (Term("workspace.fp32_grad_copies", Kind.WORKSPACE, blocks(ctx.trainable, 4),
                          "P_trainable x 4 B (p.grad.to(fp32) per parameter, FP16_Optimizer.step)"),)
        step += (Term("workspace.fp32_gradients", Kind.WORKSPACE, cuda_block_bytes(numel * 4),
                      "P_trainable x 4 B (the copies flattened: fp32_groups_flat.grad)"),)
        return FrameworkStates(gradients=param_gradients(ctx.groups, gb, f"P_trainable x {gb} B (param.grad)"),
                               step=step)
    gradients = Gradients()
    persistent: tuple[Term, ...] = ()
    backward: tuple[Term, ...] = ()
    step_grads = None
    reduction: tuple[Term, ...] = ()
    reduce_input: tuple[Term, ...] = ()
    if z == 1:
        backward = (bucket,)  # DeepSpeedZeroOptimizer allocates it at the first gradient hook
        gradients = param_gradients(ctx.groups, gb, f"P_trainable x {gb} B (ZeRO-1 keeps full gradients through backward)")
        if offloaded:
            persistent = (_offload_grad_buffer(ctx),)
            step_grads = Term("gradients", Kind.GRADIENTS, 0, "param.grad dropped after the reduction (offloaded)")
            reduction = (bucket,)
        else:
            # reduce_gradients moves the gradients into the bucket and the rank's partition into
            # grads_in_partition; param.grad are dropped, the partition lives until the step
            partition = Term("gradients.partition", Kind.GRADIENTS, cuda_block_bytes(math.ceil(sharded_numel * gb / n)),
                             f"P_trainable x {gb} B / {n} (grads_in_partition)")
            step_grads = partition
            reduction = (bucket, partition)
    elif z == 2:
        backward = (bucket,)
        if offloaded:
            persistent = (_offload_grad_buffer(ctx),)
        else:
            # allocated whole at the first reduction, once the bucket has filled; until then the
            # bucket (counted) holds the first gradients
            partition_bytes = cuda_block_bytes(math.ceil(sharded_numel * gb / n))
            gradients = Gradients(all=partition_bytes, before_first_layer=partition_bytes,
                                  formula=f"P_trainable x {gb} B / {n} (grads_in_partition)")
            if t.grad_accum_steps > 1:
                reduce_input = (_micro_batch_partition(partition_bytes, gb, n),)
    else:
        persistent = (bucket, *_persistent_params(ctx))
        # reduce_scatter_coalesced's torch.cat copy of a bucket (at most the bucket, at most what trains),
        # made when a bucket fills during the layers' backward: counted at the first layer's
        reduce_input = (Term("workspace.reduce_scatter_input", Kind.WORKSPACE,
                         cuda_block_bytes(min(reduce_bucket, numel) * gb),
                         f"min(reduce_bucket_size {_elements(reduce_bucket, DEEPSPEED_REDUCE_BUCKET)}, P_trainable) "
                         f"x {gb} B (reduce_scatter_coalesced's "
                         "interleaved copy of a bucket)"),)
        if not offloaded:
            persistent += (Term("gradients.partition", Kind.GRADIENTS, cuda_block_bytes(math.ceil(sharded_numel * gb / n)),
                                f"P_trainable x {gb} B / {n} (grad_partitions_flat_buffer)"),)
    step = ()
    if not offloaded:
        step = (Term("workspace.flat_gradients", Kind.WORKSPACE, cuda_block_bytes(math.ceil(sharded_numel * gb / n)),
                     f"P_trainable x {gb} B / {n} (flattened partition)"),
                Term("workspace.fp32_gradients", Kind.WORKSPACE, cuda_block_bytes(math.ceil(sharded_numel * 4 / n)),
                     f"P_trainable x 4 B / {n} (single_grad_partition)"))
    gathered: tuple[Term, ...] = ()
    if z >= 3:
        spec, stage, par = ctx.spec, ctx.stage, t.parallelism
        weight = RECIPES[t.precision].weight
        if t.method is Method.QLORA:
            # bnb_4bit_quant_storage packs the 4-bit data into 16-bit Params4bit that ZeRO-3 partitions and
            # gathers as stored (PEFT docs accelerate/deepspeed.md, "QLoRA and DeepSpeed with ZeRO3")
            emb, other = kbit_weight_bytes(t)
            unit = max(qlora_base.base_bytes([(tn, 1) for tn in layer.tensors], par, spec.num_kv_heads,
                                             t.lora_library, emb, other)[0]
                       for layer, _ in spec.layer_kinds(stage.start, stage.stop))
            gathered = (Term("workspace.gathered_params", Kind.WORKSPACE, 2 * unit,
                             "2 x largest layer unsharded in NF4 (current + prefetched)"),)
        else:
            prefetch = buckets.prefetch_bucket_size
            numel, forward, backward_order = _module_trace(ctx)
            copies_over = n if t.offload is Offload.PARAMS else 0
            live, copies = gathered_peak(numel, forward, backward=backward_order, prefetch=prefetch,
                                         copies_over=copies_over)
            gathered = (Term("workspace.gathered_params", Kind.WORKSPACE, live * weight,
                             f"peak gathered parameters x {weight} B (ZeRO-3 coordinator: kept while re-used within "
                             f"stage3_max_reuse_distance 1e9 elements, stage3_prefetch_bucket_size "
                             f"{_elements(prefetch, PREFETCH_BUCKET)} prefetched)"),)
            if copies:
                gathered += (Term("workspace.offload_partition_copies", Kind.WORKSPACE, copies * weight,
                                  f"the gathered set's partitions copied from host x {weight} B / {n} "
                                  "(offload_param: all_gather_coalesced's ds_tensor.to(device), beside the "
                                  "all-gather buffer)"),)
    return FrameworkStates(gradients=gradients, persistent=persistent, backward_buffers=backward, gathered=gathered,
                           reduce_input=reduce_input, step=step, step_grads=step_grads, reduction=reduction)


def _reduce_buffers(overlap_comm: bool | None, contiguous_gradients: bool) -> tuple[int, str]:
    """ZeRO-1/2's reduce buffers of ``reduce_bucket_size`` elements, and why there are that many, for the file's
    ``overlap_comm`` (None: DeepSpeed's default below stage 3, false, ``zero/config.py`` ``overlap_comm_valid``).
    ``stage_1_and_2.py`` v0.19.5 ``setup_buckets`` (at the first gradient hook): with ``contiguous_gradients`` each
    bucket gets ``buf_0`` = ``torch.empty(reduce_bucket_size, dtype=self.dtype)`` and, "Use double buffers to avoid
    data access conflict when overlap_comm is enabled", ``buf_1`` when ``overlap_comm``; the hooks swap
    ``bucket.index`` between them after each reduction (``contiguous_gradients and overlap_comm``), so both are
    alive through backward (``_release_ipg_buffers`` clears them after it). The same two buffers at v0.14.2
    (``backward``: ``ipg_buffer`` gets ``buf_0``, and ``buf_1`` if ``overlap_comm``). Without
    ``contiguous_gradients`` memest keeps its one bucket (not modelled apart)."""
    if overlap_comm and contiguous_gradients:
        return 2, ", and buf_1: overlap_comm double-buffers it"
    return 1, ""


def _elements(n: int, default: int) -> str:
    """A bucket size in a formula: DeepSpeed's own spelling of its default (``5e8``), else the elements."""
    return f"{default:.0e}".replace("e+0", "e") if n == default else f"{n:,}"


def _micro_batch_partition(partition_bytes: int, gb: int, n: int) -> Term:
    """ZeRO-2 under gradient accumulation: the micro-batch's own ``grads_in_partition`` beside the accumulated
    one, from the backward's first reduction to its epilogue (``stage_1_and_2.py`` v0.19.5
    ``independent_gradient_partition_epilogue``: ``all_grad_tensors[i]``, the partition's gradients, is kept
    until the accumulation boundary and later micro-batches ``add_`` into it; ``_release_ipg_buffers`` drops
    ``grads_in_partition``, so ``copy_grads_in_partition`` makes a new one, ``torch.empty(total_size)``, at the
    next backward's first reduction; v0.14.2 the same through ``averaged_gradients``, views of the partition
    from ``get_flat_partition(..., return_tensor_list=True)``). The accumulated partition itself is the
    gradients term, alive through the forward (``grad_accum_steps > 1``). Measured on the CPU, DeepSpeed 0.14.2
    and 0.19.5: ``benchmarks/deepspeed_cpu.md``."""
    return Term("gradients.micro_batch", Kind.GRADIENTS, partition_bytes,
                f"P_trainable x {gb} B / {n} (this micro-batch's grads_in_partition beside the accumulated "
                "partition, grad_accum_steps > 1)")


def _persistent_params(ctx: StateContext) -> tuple[Term, ...]:
    """ZeRO-3's persistent parameters (:data:`PARAM_PERSISTENCE_THRESHOLD`), each whole on every rank in its
    own tensor: under full training every small parameter at the weight dtype; under LoRA the frozen base's
    small ones at it and the small fp32 adapters. QLoRA's 4-bit base is left out (not modelled)."""
    t = ctx.t
    if t.method is Method.QLORA:
        return ()
    weight = RECIPES[t.precision].weight
    small = t.deepspeed_buckets.param_persistence_threshold
    total = 0
    if t.method is Method.FULL:
        total = sum(cuda_block_bytes(local * weight) * c for _, local, c in ctx.trainable if local <= small)
    else:
        par, k = t.parallelism, ctx.spec.num_kv_heads
        total = sum(cuda_block_bytes(numel * weight) * c for tn, c in stage_tensors(ctx.spec, ctx.stage)
                    if (numel := shard_numel(tn, par, k)) <= small)
        total += sum(cuda_block_bytes(local * ADAPTER_BYTES) * c for _, local, c in ctx.trainable if local <= small)
    if not total:
        return ()
    return (Term("weights.persistent", Kind.WEIGHTS, total,
                 f"parameters of <= {_elements(small, PARAM_PERSISTENCE_THRESHOLD)} elements whole x {weight} B" + ("" if t.method is Method.FULL else
                                                                       " (LoRA's: x 4 B)")
                 + " (stage3_param_persistence_threshold: never partitioned)"),)


def _param_bytes(ctx: StateContext) -> int:
    """Bytes per element of the parameters DeepSpeed's optimizer holds (its ``self.dtype``): the weight dtype,
    LoRA's fp32 adapters."""
    return RECIPES[ctx.t.precision].weight if ctx.t.method is Method.FULL else ADAPTER_BYTES


def _offload_grad_buffer(ctx: StateContext) -> Term:
    """ZeRO-1/2 under optimizer offload: ``temp_grad_buffer_for_gpu_offload`` (``stage_1_and_2.py`` v0.19.5
    ``__init__``, under ``if self.cpu_offload``: ``torch.zeros(largest_param_numel, device=current_device,
    dtype=self.dtype)``), kept for the run."""
    b = _param_bytes(ctx)
    largest = max((local for _, local, _ in ctx.trainable), default=0)
    return Term("workspace.offload_grad_buffer", Kind.WORKSPACE, cuda_block_bytes(largest * b),
                f"largest trainable parameter x {b} B (temp_grad_buffer_for_gpu_offload)")


def offload_host_bytes_per_param(zero_stage: int, param_b: int, grad_b: int, grad_accum_steps: int) -> int:
    """Host bytes per trainable element (1/N of them per rank) that DeepSpeed v0.19.5's optimizer offload holds
    beyond the fp32 master, the optimizer states and the fp32 gradient partition
    (``single_partition_of_fp32_groups[i].grad`` at ZeRO-1/2, ``fp32_partitioned_groups_flat[i].grad`` =
    ``subgroup_gradient_buffer`` at ZeRO-3, both on the offload device):

    - ZeRO-1/2 (``stage_1_and_2.py``): ``param_buffer_of_bit16_for_cpu_offload_groups``, the partition at the
      parameters' dtype (``param_b``, pinned), and under gradient accumulation ``accumulated_grads_in_cpu``
      (``buffer_to_accumulate_to_in_cpu``: each partition parameter at its dtype; used only when
      ``micro_step_id > 0 or not is_gradient_accumulation_boundary()``, ``copy_grads_in_partition``);
    - ZeRO-3 (``stage3.py`` ``_setup_for_real_optimizer``): ``grad_partitions_flat_buffer``, the gradient
      partition at the gradient-accumulation dtype (``grad_b``), allocated on ``self.device``, the offload
      device, and pinned.
    """
    if zero_stage >= 3:
        return grad_b
    return param_b * (2 if grad_accum_steps > 1 else 1)


NVME_ALIGNMENT = 1024 // 4
"""The optimizer swapper's I/O alignment in fp32 elements (``swap_tensor/optimizer_utils.py`` v0.19.5
``numel_alignment = AIO_ALIGNED_BYTES (1024) x aio intra_op_parallelism (1) // element_size``)."""
MIN_AIO_BYTES = 1024 ** 2
"""A sub-group smaller than this (bytes of fp32) is not swapped (``swap_tensor/utils.py`` v0.19.5,
``is_swappable_tensor``: ``min_aio_bytes = max(MIN_AIO_BYTES, aio block_size 1 MiB)``)."""


def nvme_optimizer_swap(partitions: list[int], sub_group_size: int, buffer_count: int) -> tuple[int, int]:
    """ZeRO-3 with ``offload_optimizer.device`` nvme (ZeRO-Infinity), DeepSpeed v0.19.5: the pinned host bytes of
    the optimizer swapper's buffers, and the rank's elements whose fp32 master, optimizer states and fp32
    gradients live on NVMe rather than in host RAM. ``partitions``: the rank's partition of each trainable
    parameter (``partition_numel``), in the model's order.

    ``stage3.py`` ``_create_fp16_sub_groups`` cuts the parameters into sub-groups, closing one once it reaches
    ``sub_group_size`` elements (one group when the partition is smaller); ``_configure_tensor_swapping`` builds
    the swapper with ``largest_numel = max(fp16_partitioned_groups_flat_numel)``, and ``OptimizerSwapper``
    allocates ``buffer_count`` pinned buffers of that many elements, I/O-aligned (:data:`NVME_ALIGNMENT`), at the
    master dtype, fp32 (``SwapBufferManager``: ``new_cpu_locked_tensor(num_elems)`` x count). A swappable
    sub-group (at least :data:`MIN_AIO_BYTES` of fp32) keeps an empty fp32 master in memory
    (``_setup_for_real_optimizer``: ``torch.empty(0)``), its states and gradients swapped out to files under
    ``nvme_path``; a smaller one stays in host RAM. The gradient partition (``grad_partitions_flat_buffer``, on
    the offload device) stays in host RAM either way (:func:`offload_host_bytes_per_param`)."""
    groups, current = [], 0
    for i, n in enumerate(partitions):
        current += n
        if current >= sub_group_size or i == len(partitions) - 1:
            groups.append(current)
            current = 0
    largest = max(groups, default=0)
    aligned = -(-largest // NVME_ALIGNMENT) * NVME_ALIGNMENT
    swapped = sum(g for g in groups if g * 4 >= MIN_AIO_BYTES)
    return buffer_count * aligned * 4, swapped


def offload_host_bytes_per_rank(largest_param_numel: int, zero_stage: int, param_b: int) -> int:
    """ZeRO-1/2's ``temp_grad_buffer_for_cpu_offload``: the largest parameter at the parameters' dtype, in host RAM
    on every rank (``stage_1_and_2.py`` v0.19.5 ``__init__``, pinned); none at ZeRO-3."""
    return 0 if zero_stage >= 3 else largest_param_numel * param_b


def _module_trace(ctx: StateContext) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The partitioned parameters of a stage (their local element counts), the order a step's forward uses
    them and the order its backward does (parameter ids): every tensor its own module (the embeddings, each
    layer's tensors as listed, the head; a tied lm_head re-uses the embedding matrix; an encoder-decoder's
    decoder embeds its inputs with the same matrix, T5's ``shared``). Persistent parameters
    (:data:`PARAM_PERSISTENCE_THRESHOLD`) are never gathered and left out.

    The backward is the forward reversed, less the embedding modules when the base is frozen (LoRA, QLoRA):
    ZeRO-3 fetches a module's parameters for its backward from a hook on its outputs that require a gradient
    (``parameter_offload.py``: v0.8.0 bf6b9802c ``_pre_backward_module_hook`` applies ``PreBackwardFunction``,
    whose backward never runs for an output no gradient flows to; v0.16.4 ``if outputs.requires_grad:
    outputs.register_hook``): a frozen embedding's output of token ids requires none (a tied lm_head's use
    stays: its input does)."""
    spec, stage, par = ctx.spec, ctx.stage, ctx.t.parallelism
    k = spec.num_kv_heads
    numel: list[int] = []
    forward: list[int] = []
    embedding_uses: set[int] = set()  # positions in forward of the embedding modules
    small = ctx.t.deepspeed_buckets.param_persistence_threshold

    def use(n: int) -> None:
        if n > small:
            forward.append(len(numel))
            numel.append(n)

    if stage.first:
        for tn in spec.embedding:
            use(shard_numel(tn, par, k))
    embedding = forward[:]
    embedding_uses.update(range(len(forward)))
    previous = None
    for layer, count in spec.layer_kinds(stage.start, stage.stop):
        if previous == "encoder" and layer.stack == "decoder" and embedding:
            embedding_uses.update(range(len(forward), len(forward) + len(embedding)))
            forward += embedding  # modeling_t5.py: the decoder's embed_tokens is the shared embedding
        previous = layer.stack
        for _ in range(count):
            for tn in layer.tensors:
                use(shard_numel(tn, par, layer.attention.num_kv_heads))
    if stage.last:
        for tn in spec.head:
            use(shard_numel(tn, par, k))
        if spec.tie_word_embeddings and embedding:  # the lm_head is the embedding matrix, the largest of them
            forward.append(max(embedding, key=numel.__getitem__))
    frozen = ctx.t.method is not Method.FULL
    backward = [p for pos, p in reversed(list(enumerate(forward))) if not (frozen and pos in embedding_uses)]
    return tuple(numel), tuple(forward), tuple(backward)


def gathered_peak(numel: tuple[int, ...], forward: tuple[int, ...], max_reuse: int = MAX_REUSE_DISTANCE,
                  prefetch: int = PREFETCH_BUCKET, max_live: int = MAX_LIVE_PARAMETERS,
                  backward: tuple[int, ...] | None = None, copies_over: int = 0) -> tuple[int, int]:
    """The parameter elements gathered, and those being copied to the device, at the moment their sum peaks
    over a step, as ZeRO-3's coordinator keeps them with a complete trace (``partitioned_param_coordinator.py``
    v0.19.5, the same rules at v0.8.0 bf6b9802c). ``numel``: each parameter's elements; ``forward``: the
    parameter ids in forward order; ``backward``: in backward order (default: the forward reversed); the
    trace is the forward then the backward.
    At each step the module's parameter is gathered if it is not, then the next parameters of the trace are
    prefetched until ``prefetch`` elements are in flight (at most ``max_live`` gathered in all; gathered ones
    are passed over, marked as fetched for that later use); after the module runs, its parameter is released
    unless it was fetched for a later use or is used again before ``max_reuse`` elements of the trace have
    been traversed (``__params_to_release``).

    ``copies_over`` > 0: the parameters are offloaded (``offload_param``) and partitioned over that many ranks.
    Each all-gather (the module's own parameter, or one prefetch round's set: one ``all_gather_coalesced``)
    first allocates the gathered buffer, then copies the set's host partitions to the device
    (``partition_parameters.py`` ``all_gather_coalesced``: ``param.ds_tensor.to(current_device)``, one
    parameter, or the list of them ``torch.cat`` into the flat buffer; without offload ``ds_tensor`` is on the
    device and ``.to`` copies nothing): the set's elements / ``copies_over`` beside the gathered ones, until
    the collective is issued (v0.8.0 bf6b9802c, the same at v0.16.4)."""
    trace = (*forward, *(reversed(forward) if backward is None else backward))
    available = [False] * len(numel)
    fetched_for = [-1] * len(numel)  # __most_recent_step_id_param_fetched_for: the latest trace step fetched for
    live = 0
    peak = (0, 0)
    queue = 0  # the prefetch queue: the first trace position not yet popped

    def gathered(elements: int) -> None:
        nonlocal peak
        copies = math.ceil(elements / copies_over) if copies_over else 0
        if live + copies > sum(peak):
            peak = (live, copies)

    for step, param in enumerate(trace):
        if not available[param]:
            available[param], live = True, live + numel[param]
            gathered(numel[param])
        queue = max(queue, step + 1)
        budget, in_flight = min(max_live - live, prefetch), 0
        while queue < len(trace) and in_flight < budget:
            ahead = trace[queue]
            fetched_for[ahead] = max(fetched_for[ahead], queue)
            if not available[ahead]:
                available[ahead], live = True, live + numel[ahead]
                in_flight += numel[ahead]
            queue += 1
        if in_flight:
            gathered(in_flight)
        if live > sum(peak):
            peak = (live, 0)
        if fetched_for[param] > step + 1:
            continue  # prefetched for a later use: kept
        traversed, reused = 0, False
        for later in trace[step + 1:]:
            if traversed >= max_reuse:
                break
            if later == param:
                reused = True
                break
            traversed += numel[later]
        if not reused:
            available[param], live = False, live - numel[param]
    return peak
