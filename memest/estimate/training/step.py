"""A training step on one rank: its moments assembled from the model states' and the activations'
lifetimes (:data:`.table.MOMENT_TABLE`), the largest chosen, with the allocator and runtime terms.

Per call only the moments' term lists are assembled and summed, and one chosen: the model states and
the activations are remembered (:func:`.states.model_states`, :func:`.activation_terms.activation_terms`).
"""

from __future__ import annotations

import math
import operator
from itertools import chain

from memest.devices import Device
from memest.estimate import runtime
from memest.estimate.sharding import Stage, stages
from memest.estimate.training import deepspeed
from memest.estimate.training.activation_terms import ActivationTerms, activation_terms, activations_input
from memest.estimate.training.assumptions import assumptions
from memest.estimate.training.lora import ADAPTER_BYTES, lora_adapters
from memest.estimate.training.optimizers import PAGED_OPTIMIZERS, state_bytes_per_param
from memest.estimate.training.protocol import states_input
from memest.estimate.training.recipes import RECIPES
from memest.estimate.training.states import ModelStates, model_states
from memest.estimate.training.table import LIFETIMES, MOMENT_TABLE, OPTIONAL_MOMENTS
from memest.estimate.weights import SCHEMES, weight_bytes
from memest.result import PAGED_STATES, Estimate, Kind, RankEstimate, Term
from memest.spec import ModelSpec
from memest.workload import Framework, Method, Offload, Optimizer, Parallelism, TrainingConfig, resolve_framework

_BYTES = operator.attrgetter("bytes")
_NO_GRADS = Term("gradients", Kind.GRADIENTS, 0, "freed by zero_grad(set_to_none=True)")


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
    return Estimate(ranks=tuple(ranks), assumptions=assumptions(spec, t, fw, peaks[worst]),
                    host_bytes=(_host_bytes(spec, t, fw, device) + _offloaded_activation_bytes(spec, t, fw, device)
                                + paged_on_host(spec, t, device) * min(device.devices_per_machine, par.world_size)),
                    extra=extra)


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


def _moments(spec: ModelSpec, t: TrainingConfig, fw: Framework, device: Device, stage: Stage) -> dict[str, list[Term]]:
    return {name: _kept(terms) for name, terms in _build_moments(spec, t, fw, device, stage)[0].items()}


def lifetimes(st: ModelStates, acts: ActivationTerms, t: TrainingConfig, fw: Framework,
              device: Device) -> tuple[tuple[tuple[Term, ...], ...], tuple[int, ...]]:
    """The terms of every lifetime and their bytes, in :data:`.table.LIFETIMES` order, for one setup: the
    model states' and the activations' own (made with them), and those that depend on the device or on
    how gradients are freed (:data:`.table.SETUP_LIFETIMES`)."""
    # gradients that live through the forward: accumulated over micro-batches, or not freed by zero_grad
    grads_in_forward = t.grad_accum_steps > 1 or (not t.set_grads_to_none and fw in (Framework.PYTORCH, Framework.DDP))
    cublas = Term("workspace.cublas", Kind.WORKSPACE, runtime.cublas_workspace_bytes(device), "cuBLAS workspace")
    forward, head, later = ((st.grads_all,) * 3 if grads_in_forward else (_NO_GRADS, st.grads_head, st.grads_later))
    if st.accumulated is not None:  # FSDP2 under pipeline parallelism: unsharded, accumulated (fsdp.states)
        forward = head = later = st.accumulated
    alive = (*st.lifetimes, *acts.lifetimes, (*st.base, cublas), (forward,), (head,), (later,))
    sizes = (*st.sizes, *acts.sizes, st.base_bytes + cublas.bytes, forward.bytes, head.bytes, later.bytes)
    return alive, sizes


def _setup(spec: ModelSpec, t: TrainingConfig, fw: Framework, device: Device,
           stage: Stage) -> tuple[ModelStates, tuple[tuple[Term, ...], ...], tuple[int, ...]]:
    """The model states, every lifetime's terms and their bytes (both in :data:`.table.LIFETIMES` order)."""
    st = model_states(spec, states_input(t), fw, stage)
    alive, sizes = lifetimes(st, activation_terms(spec, activations_input(t), fw, stage), t, fw, device)
    return st, alive, sizes


def _build_moments(spec: ModelSpec, t: TrainingConfig, fw: Framework, device: Device,
                   stage: Stage) -> tuple[dict[str, list[Term]], ModelStates]:
    """Every moment's allocated terms, and the model states they were built from."""
    st, alive, _ = _setup(spec, t, fw, device, stage)
    out = {moment: list(chain.from_iterable(alive_at(alive))) for moment, alive_at in _ALIVE_AT if _exists(moment, alive)}
    return out, st


def _exists(moment: str, alive: tuple[tuple[Term, ...], ...]) -> bool:
    """False for an optional moment whose lifetime holds no term (:data:`.table.OPTIONAL_MOMENTS`)."""
    needs = OPTIONAL_MOMENTS.get(moment)
    return needs is None or bool(alive[LIFETIMES.index(needs)])


_ALIVE_AT = tuple((moment, operator.itemgetter(*(LIFETIMES.index(name) for name in names)))
                  for moment, names in MOMENT_TABLE.items())
"""(moment, the function picking its lifetimes out of :func:`lifetimes`' terms or their bytes), in the
table's order."""
assert all(len(names) > 1 for names in MOMENT_TABLE.values())  # itemgetter of one index returns no tuple


def _kept(terms: list[Term]) -> list[Term]:
    """A moment's terms without the empty ones (the weights are always shown)."""
    return [m for m in terms if m.bytes or m.kind is Kind.WEIGHTS]


def _stage_terms(spec: ModelSpec, t: TrainingConfig, fw: Framework, device: Device, stage: Stage) -> tuple[tuple[Term, ...], str]:
    """The terms of the moment that sets the peak, with the allocator and runtime terms, and its name."""
    st, alive, sizes = _setup(spec, t, fw, device, stage)
    # a moment holds allocated kinds only: its bytes are its peak allocated; the first of the largest
    best = -1
    for moment, alive_at in _ALIVE_AT:
        if not _exists(moment, alive):
            continue
        total = sum(alive_at(sizes))
        if total > best:
            best, name, picked = total, moment, alive_at
    chosen = _kept(list(chain.from_iterable(picked(alive))))
    allocated = sum(map(_BYTES, chosen))
    slack = runtime.allocator_slack(device)
    chosen.append(Term("allocator", Kind.ALLOCATOR, round(allocated * slack), f"{slack:.0%} of peak allocated"))
    if st.stream_pool:
        chosen.append(Term("allocator.all_gather_stream", Kind.ALLOCATOR, st.stream_pool, st.stream_pool_formula))
    chosen.append(Term("runtime.cuda_context", Kind.RUNTIME, runtime.cuda_context_bytes(device), f"{device.arch} context"))
    if nccl := runtime.nccl_bytes(t.parallelism.world_size, device):
        chosen.append(Term("runtime.nccl", Kind.RUNTIME, nccl, "NCCL communicators"))
    if st.paged:
        chosen.append(_paged_term(st.paged, sum(map(_BYTES, chosen)), device))
    return tuple(chosen), name


def _paged_term(paged: int, rest: int, device: Device) -> Term:
    """bitsandbytes' paged optimizer states (:mod:`.optimizers`): CUDA managed memory, in no torch.cuda
    figure; on the device (nvidia-smi) as far as the device has room beside the ``rest`` of the rank's
    memory, the remainder evicted to host RAM by the driver (:func:`paged_on_host`)."""
    resident = min(paged, max(0, device.memory_bytes - rest))
    evicted = paged - resident
    return Term(PAGED_STATES, Kind.RUNTIME, resident,
                "paged optimizer states (CUDA managed memory, outside the allocator)"
                + (f", {evicted} B of them evicted to host RAM (the device is full)" if evicted else ""))


def paged_on_host(spec: ModelSpec, t: TrainingConfig, device: Device) -> int:
    """Bytes of one rank's paged optimizer states the driver keeps in host RAM because the device is full
    (0 without a paged optimizer): the paged states less the resident ones of the rank holding the most."""
    if t.optimizer not in PAGED_OPTIMIZERS:
        return 0
    fw = resolve_framework(t)
    out = 0
    for stage in stages(spec.num_layers, t.parallelism.pp):
        st = model_states(spec, states_input(t), fw, stage)
        terms, _ = _stage_terms(spec, t, fw, device, stage)
        resident = sum(x.bytes for x in terms if x.name == PAGED_STATES)
        out = max(out, st.paged - resident)
    return out


def _offloaded_activation_bytes(spec: ModelSpec, t: TrainingConfig, fw: Framework, device: Device) -> int:
    """Host RAM per node for the activation checkpoints that activation offloading moves there
    (:attr:`.activation_terms.ActivationTerms.offloaded`), for the ranks of one node (the stage holding most)."""
    if not t.activation_offloading:
        return 0
    view = activations_input(t)
    per_rank = max(activation_terms(spec, view, fw, stage).offloaded for stage in stages(spec.num_layers, t.parallelism.pp))
    return per_rank * min(device.devices_per_machine, t.parallelism.world_size)


def _model_order(spec: ModelSpec, t: TrainingConfig) -> list[int]:
    """The trainable tensors' elements in the model's parameter order (embeddings, each layer's tensors layer by
    layer, the head): full training every parameter, LoRA / QLoRA the adapters."""
    if t.method is Method.FULL:
        out = [tn.numel for tn in spec.embedding]
        for layer, count in spec.layer_kinds(0, spec.num_layers):
            out += [tn.numel for tn in layer.tensors] * count
        return out + [tn.numel for tn in spec.head]
    return [local for stage in stages(spec.num_layers, 1) for _, local, c in lora_adapters(spec, stage, t.lora, 1)
            for _ in range(c)]


def _in_backward_host_grads(spec: ModelSpec, t: TrainingConfig, grad_b: int) -> int:
    """One rank's host bytes of offloaded gradients under FSDP2 CPU offload with torchtune's ``optimizer_in_bwd``:
    no gradient stays for a step after backward. torch 2.13 ``_fsdp_collectives.py`` ``foreach_reduce`` copies each
    parameter's reduce-scattered shard to the CPU (``.to(torch.device("cpu"))``, blocking when the parameter has a
    post-accumulate-grad hook), assigns it as ``sharded_param.grad`` and calls that hook at once; torchtune 0.6
    ``training/memory.py`` ``register_optim_in_bwd_hooks``'s hook steps the parameter's own optimizer and
    ``zero_grad()`` (set to None) frees the gradient. The loop's ``new_sharded_dtensor_grad`` still holds the
    previous parameter's gradient while the next one is copied, so two consecutive parameters' shards are live at
    most: the largest such pair, in the model's parameter order."""
    n = t.parallelism.tp * t.parallelism.shard_degree
    shards = [math.ceil(numel / n) * grad_b for numel in _model_order(spec, t)]
    return max((a + b for a, b in zip(shards, shards[1:])), default=sum(shards))


def _host_bytes(spec: ModelSpec, t: TrainingConfig, fw: Framework, device: Device) -> int:
    """Host RAM per node for offloaded states: fp32 master, optimizer states and gradients (fp32 under
    DeepSpeed, FSDP's at its reduce dtype)
    (and with ``--offload params`` the 16-bit parameters, a LoRA / QLoRA model's frozen base
    included), for the ranks of one node; under DeepSpeed its further host copies
    (:func:`.deepspeed.offload_host_bytes_per_param`, :func:`.deepspeed.offload_host_bytes_per_rank`); at ZeRO-3
    with ``offload_optimizer.device`` nvme the swapped states leave host RAM for the swapper's pinned buffers
    (:func:`.deepspeed.nvme_optimizer_swap`); under FSDP with torchtune's ``optimizer_in_bwd`` only the gradients in
    flight (:func:`_in_backward_host_grads`)."""
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
    # the gradient shards on the host: DeepSpeed's fp32 partition; FSDP's at the reduce dtype (fp32 adapters)
    grad_host = 4 if fw is not Framework.FSDP else (recipe.grad if t.method is Method.FULL else ADAPTER_BYTES)
    per_param = recipe.master + states + grad_host
    per_rank = 0
    if fw is Framework.FSDP and t.optimizer_in_bwd and t.method is Method.FULL:
        per_param -= grad_host
        per_rank = _in_backward_host_grads(spec, t, grad_host)
    if fw is Framework.DEEPSPEED:
        param_b = recipe.weight if t.method is Method.FULL else ADAPTER_BYTES
        grad_b = recipe.grad if t.method is Method.FULL else ADAPTER_BYTES
        z = t.parallelism.zero_stage
        per_param += deepspeed.offload_host_bytes_per_param(z, param_b, grad_b, t.grad_accum_steps)
        if t.method is Method.FULL:
            largest = max(tn.numel for tn, _ in spec.tensors())
        else:
            largest = max((local for stage in stages(spec.num_layers, 1)
                           for _, local, _ in lora_adapters(spec, stage, t.lora, 1)), default=0)
        per_rank = deepspeed.offload_host_bytes_per_rank(largest, z, param_b)
        buckets = t.deepspeed_buckets
        if z >= 3 and buckets.optimizer_nvme:  # ZeRO-Infinity: master, states and fp32 gradients on NVMe
            n = t.parallelism.shard_degree
            buffers, swapped = deepspeed.nvme_optimizer_swap([math.ceil(local / n) for local in _model_order(spec, t)],
                                                             buckets.sub_group_size, buckets.optimizer_buffer_count)
            per_rank += buffers - swapped * (recipe.master + states + grad_host)
    frozen = 0.0
    if t.offload is Offload.PARAMS:
        per_param += recipe.weight
        if t.method is Method.LORA:  # ZeRO-3 param offload moves the frozen base too
            frozen = spec.num_params * recipe.weight
        elif t.method is Method.QLORA:
            frozen = weight_bytes(list(spec.tensors()), Parallelism(), spec.num_kv_heads, dtype_bytes=recipe.compute,
                                  scheme=SCHEMES["nf4"])
    par = t.parallelism
    ranks_per_node = min(device.devices_per_machine, par.world_size)
    return math.ceil((p * per_param + frozen) / (par.tp * par.pp * par.shard_degree) * ranks_per_node) + per_rank * ranks_per_node
