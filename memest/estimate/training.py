"""Training memory per rank: model states, activations and logits at the step's peak moment.

Bytes per parameter of each precision recipe (before sharding; P = parameters a rank holds):

| recipe | weights | gradients | master | optimizer state element | source |
|---|---|---|---|---|---|
| mixed | 2 (bf16) | 2 (bf16) | 4 (fp32) | 4 (fp32) | ZeRO paper §3.1 (K = 12 with Adam: 16 B/param) |
| fp16  | 2 (fp16) | 2 | 4 | 4 | as mixed, DeepSpeed ``fp16`` |
| amp   | 4 (fp32) | 4 | 0 | 4 | torch.autocast over fp32 params (HF Trainer ``bf16=True``) |
| fsdp2 | 4 (fp32, sharded) | 4 | 0 | 4 | FSDP2 ``MixedPrecisionPolicy(param_dtype=bf16)`` |
| bf16  | 2 | 2 | 0 | 2 (bf16) | torch AdamW keeps states in the param dtype |
| fp32  | 4 | 4 | 0 | 4 | |

Optimizer states per trainable parameter: AdamW 2 elements; Lion and SGD-momentum 1; SGD 0;
Adafactor rows + columns of each matrix (factored second moment, no first moment); 8-bit AdamW
2 bytes + an fp32 absmax per 2048-value block of each state (bitsandbytes blockwise 8-bit).

Sharding over the N = dp x cp ranks of a ZeRO group: stage 1 divides optimizer states and master
weights by N, stage 2 also gradients, stage 3 also weights, plus a gather buffer of one layer
unsharded (twice, with prefetch). The peak is the larger of two moments: the end of the forward
pass (activations and logits all alive) and the optimizer step (activations freed, a state-sized
temporary of the foreach AdamW kernels alive).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memest.devices import Device
from memest.estimate import runtime
from memest.estimate.activations import layer_activations
from memest.estimate.sharding import Stage, layer_shard_numel, shard_numel, stage_tensors, stages
from memest.estimate.weights import SCHEMES, weight_bytes
from memest.result import Estimate, Kind, RankEstimate, Term
from memest.spec import Component, ModelSpec, Split, TensorSpec
from memest.workload import Method, Offload, Optimizer, Precision, Recompute, TrainingConfig

ALLOCATOR_SLACK = runtime.DEFAULT_ALLOCATOR_SLACK
"""The default caching-allocator slack; per device family it may be calibrated
(:func:`memest.estimate.runtime.allocator_slack`)."""

ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "c_attn", "c_proj", "query_key_value",
                     "dense", "query", "key", "value", "q", "k", "v", "o", "out_proj", "Wqkv", "W_pack")


@dataclass(frozen=True, slots=True)
class Recipe:
    """Bytes per element of a precision recipe (see the module table)."""

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


def estimate_training(spec: ModelSpec, t: TrainingConfig, device: Device) -> Estimate:
    """Per-rank training memory; one RankEstimate per distinct pipeline stage."""
    par = t.parallelism
    ranks: list[RankEstimate] = []
    for stage in stages(spec.num_layers, par.pp):
        terms = _stage_terms(spec, t, device, stage)
        label = "all ranks" if par.pp == 1 else f"pp stage {stage.index}" + (
            " (first)" if stage.first else " (last)" if stage.last else "")
        if ranks and par.pp > 2 and not stage.first and not stage.last and ranks[-1].terms == terms:
            ranks[-1] = RankEstimate(ranks[-1].label + f"..{stage.index}", terms, ranks[-1].count + 1)
            continue
        ranks.append(RankEstimate(label, terms, 1))
    return Estimate(ranks=tuple(ranks), assumptions=_assumptions(spec, t), host_bytes=_host_bytes(spec, t))


# ---- model states ----


def _targeted(tensor: TensorSpec, targets: str) -> bool:
    if not (tensor.is_linear_weight and len(tensor.shape) == 2):
        return False
    name = tensor.module.rsplit(".", 1)[-1]
    if targets == "all-linear":
        return True
    if targets == "attention":
        return tensor.component is Component.ATTENTION
    return name in {x.strip() for x in targets.split(",")}


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


def _state_bytes_per_param(opt: Optimizer, state: int) -> float:
    if opt is Optimizer.ADAMW:
        return 2 * state
    if opt in (Optimizer.ADAMW8BIT, Optimizer.PAGED_ADAMW8BIT):
        return 2 * (1 + 4 / 2048)
    if opt in (Optimizer.LION, Optimizer.SGD_MOMENTUM):
        return state
    if opt is Optimizer.SGD:
        return 0
    raise ValueError(opt)


def _optimizer_bytes(trainable: list[tuple[TensorSpec, int, int]], opt: Optimizer, state: int) -> int:
    """Optimizer-state bytes for (tensor, local numel, count) triples."""
    if opt is Optimizer.ADAFACTOR:
        total = 0
        for tensor, local, count in trainable:
            if len(tensor.shape) >= 2:
                ratio = local / tensor.numel
                rows, cols = math.prod(tensor.shape[:-1]), tensor.shape[-1]
                total += count * 4 * math.ceil((rows + cols) * ratio)
            else:
                total += count * 4 * local
        return total
    per = _state_bytes_per_param(opt, state)
    return math.ceil(sum(local * count for _, local, count in trainable) * per)


def _stage_terms(spec: ModelSpec, t: TrainingConfig, device: Device, stage: Stage) -> tuple[Term, ...]:
    par = t.parallelism
    recipe = RECIPES[t.precision]
    k = spec.num_kv_heads
    n = par.dp * par.cp  # ZeRO sharding group
    z = par.zero_stage
    tensors = stage_tensors(spec, stage)

    # trainable tensors and the frozen base
    if t.method is Method.FULL:
        trainable = [(tn, shard_numel(tn, par, k), c) for tn, c in tensors]
        weights = sum(local * c for _, local, c in trainable) * recipe.weight
        weight_formula = f"P_stage x {recipe.weight} B"
    else:
        r = t.lora.rank
        adapters = [(tn, lora_adapter_numel(tn, r, par.tp), c) for tn, c in tensors if _targeted(tn, t.lora.targets)]
        trainable = adapters
        base_dtype = recipe.weight if t.method is Method.LORA else 4
        scheme = SCHEMES["nf4"] if t.method is Method.QLORA else None
        weights = weight_bytes(tensors, par, k, dtype_bytes=base_dtype, scheme=scheme)
        weights += sum(local * c for _, local, c in adapters) * recipe.weight
        weight_formula = (
            "frozen base at the compute dtype + adapters" if t.method is Method.LORA
            else "NF4 linear weights (double quant) + other weights upcast to fp32 + adapters"
        )
    trainable_numel = sum(local * c for _, local, c in trainable)

    shard_w = n if z >= 3 else 1
    shard_g = n if z >= 2 else 1
    shard_o = n if z >= 1 else 1
    weights_b = math.ceil(weights / shard_w)
    grads_b = math.ceil(trainable_numel * recipe.grad / shard_g)
    master_b = math.ceil(trainable_numel * recipe.master / shard_o)
    states_b = math.ceil(_optimizer_bytes(trainable, t.optimizer, recipe.state) / shard_o)
    if t.offload is not Offload.NONE:
        master_b = states_b = 0
        if t.offload is Offload.PARAMS:
            weights_b = 0

    c = recipe.compute
    terms: list[Term] = [Term("weights", Kind.WEIGHTS, weights_b, weight_formula + (f" / {n} (ZeRO-3)" if shard_w > 1 else ""))]
    if z >= 3 or t.precision is Precision.FSDP2:
        largest = max(layer_shard_numel(layer, par) for layer, _ in spec.layer_kinds(stage.start, stage.stop))
        terms.append(Term("workspace.gathered_params", Kind.WORKSPACE, 2 * largest * c,
                          "2 x largest layer unsharded x c (current + prefetched unit)"))
    grads = Term("gradients", Kind.GRADIENTS, grads_b, f"P_trainable x {recipe.grad} B" + (f" / {n}" if shard_g > 1 else ""))
    opt_terms = [
        Term("optimizer_states.master", Kind.OPTIMIZER_STATES, master_b, f"P_trainable x {recipe.master} B" + (f" / {n}" if shard_o > 1 else "")),
        Term("optimizer_states.moments", Kind.OPTIMIZER_STATES, states_b, f"{t.optimizer.value} states" + (f" / {n}" if shard_o > 1 else "")),
    ]
    cublas = Term("workspace.cublas", Kind.WORKSPACE, runtime.cublas_workspace_bytes(device), "cuBLAS workspace")

    acts = _activation_terms(spec, t, stage, c)
    forward_end = [*terms, grads, *opt_terms, *acts, cublas]
    step_temp = Term("workspace.optimizer_step", Kind.WORKSPACE,
                     0 if t.offload is not Offload.NONE else math.ceil(trainable_numel * recipe.state / shard_o),
                     "one state-sized temporary of the foreach optimizer kernels")
    optimizer_step = [*terms, grads, *opt_terms, step_temp, cublas]
    moment = forward_end if _allocated(forward_end) >= _allocated(optimizer_step) else optimizer_step
    allocated = _allocated(moment)
    moment = [m for m in moment if m.bytes or m.kind in (Kind.WEIGHTS,)]
    slack = runtime.allocator_slack(device)
    moment.append(Term("allocator", Kind.ALLOCATOR, round(allocated * slack), f"{slack:.0%} of peak allocated"))
    moment.append(Term("runtime.cuda_context", Kind.RUNTIME, runtime.cuda_context_bytes(device), f"{device.arch} context"))
    if par.world_size > 1:
        moment.append(Term("runtime.nccl", Kind.RUNTIME, runtime.nccl_bytes(par.world_size), "NCCL communicators"))
    return tuple(moment)


def _allocated(terms: list[Term]) -> int:
    return sum(x.bytes for x in terms if x.kind not in (Kind.ALLOCATOR, Kind.RUNTIME))


# ---- activations and logits ----


def _activation_terms(spec: ModelSpec, t: TrainingConfig, stage: Stage, c: int) -> list[Term]:
    par = t.parallelism
    tokens = t.micro_batch_size * t.seq_len // par.cp
    in_flight = min(par.pp - stage.index, t.grad_accum_steps) if par.pp > 1 else 1
    eager = t.attn_implementation == "eager" and t.recompute is not Recompute.SELECTIVE
    per_layer: list[tuple[float, int]] = []
    for layer, count in spec.layer_kinds(stage.start, stage.stop):
        acts = layer_activations(layer, hidden=spec.hidden_size, c=c, seq_len=t.seq_len // par.cp, eager=eager)
        per_layer.append((acts.per_rank(par.tp, par.sequence_parallel), count))
    h_local = spec.hidden_size * c / (par.tp if par.sequence_parallel else 1)
    out: list[Term] = []
    if t.recompute is Recompute.FULL:
        kept = sum(count for _, count in per_layer) * h_local * tokens * in_flight
        rebuilt = max(b for b, _ in per_layer) * tokens
        out.append(Term("activations.checkpoints", Kind.ACTIVATIONS, math.ceil(kept),
                        f"L_stage x h x c x b x s{' / t' if par.sequence_parallel else ''} x {in_flight} in flight"))
        out.append(Term("activations.recomputed_layer", Kind.ACTIVATIONS, math.ceil(rebuilt), "one layer rebuilt in backward"))
    else:
        total = sum(b * count for b, count in per_layer) * tokens * in_flight
        out.append(Term("activations.layers", Kind.ACTIVATIONS, math.ceil(total),
                        f"sum over layers of per-token bytes x b x s x {in_flight} in flight"))
    if stage.last and spec.task in ("causal_lm", "seq2seq"):
        v_local = math.ceil(spec.vocab_size / par.tp)
        head_in = 2 * tokens * spec.hidden_size * c / (par.tp if par.sequence_parallel else 1)
        if t.loss == "chunked":
            logits = tokens * v_local * (4 + 4) / 8
            formula = "b x s x V/t x 8 B / 8 chunks"
        else:
            logits = tokens * v_local * (c + 4 + 4)
            formula = f"b x s x V/t x ({c} logits + 4 fp32 upcast + 4 log-softmax)"
        out.append(Term("activations.final_norm", Kind.ACTIVATIONS, math.ceil(head_in), "2 x b x s x h x c"))
        out.append(Term("logits", Kind.LOGITS, math.ceil(logits), formula))
    return out


def _host_bytes(spec: ModelSpec, t: TrainingConfig) -> int:
    """Host RAM per node for offloaded states (8 ranks per node assumed)."""
    if t.offload is Offload.NONE:
        return 0
    recipe = RECIPES[t.precision]
    per_param = recipe.master + _state_bytes_per_param(t.optimizer, recipe.state) if t.optimizer is not Optimizer.ADAFACTOR else recipe.master + 4
    if t.offload is Offload.PARAMS:
        per_param += recipe.weight
    ranks_per_node = min(8, t.parallelism.world_size)
    return math.ceil(spec.num_params * per_param / t.parallelism.world_size * ranks_per_node)


def _assumptions(spec: ModelSpec, t: TrainingConfig) -> tuple[str, ...]:
    out = [
        f"precision recipe {t.precision.value}: {RECIPES[t.precision]}",
        "gradients are allocated before backward (DeepSpeed / Megatron / DDP buffers); plain single-GPU "
        "PyTorch grows them during backward, so its peak can be lower",
    ]
    if t.attn_implementation != "eager":
        out.append("flash / SDPA attention: no s x s scores stored")
    if spec.max_position_embeddings and t.seq_len > spec.max_position_embeddings:
        out.append(f"seq_len {t.seq_len} exceeds max_position_embeddings {spec.max_position_embeddings}")
    if t.method is Method.QLORA:
        out.append("QLoRA base prepared with peft.prepare_model_for_kbit_training: non-quantized weights upcast to fp32")
    return tuple(out)
