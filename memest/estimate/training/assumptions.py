"""The sentences an estimate's assumptions list, remembered per what they read."""

from __future__ import annotations

from typing import NamedTuple

from memest.estimate.training.deepspeed import DEEPSPEED_VERSION
from memest.estimate.training.recipes import RECIPES
from memest.estimate.training.table import MOMENTS
from memest.memo import remembered
from memest.spec import ModelSpec
from memest.workload import (
    AttnImplementation,
    Float8,
    Framework,
    KbitPrep,
    LoraLibrary,
    Method,
    Offload,
    Optimizer,
    Precision,
    TrainingConfig,
    offloaded_checkpoints_at_loss,
    offloaded_checkpoints_on_device,
)

_KBIT_ASSUMPTIONS = {
    KbitPrep.TRL: ("--prepare-kbit-training trl (trl SFTTrainer, bf16=True): norms fp32, embeddings and lm_head bf16, "
                   "fp32 residual stream and layer checkpoints (bitsandbytes Linear4bit returns its input's dtype), "
                   "torch.autocast(bf16); pass --prepare-kbit-training peft or none for other scripts"),
    KbitPrep.PEFT: ("--prepare-kbit-training peft (prepare_model_for_kbit_training alone): embeddings, norms and "
                    "lm_head fp32, fp32 residual stream, checkpoints and logits, no autocast"),
    KbitPrep.NONE: "--prepare-kbit-training none: other weights and the residual stream at 16 bits",
}



class AssumptionsInput(NamedTuple):
    """What the assumption sentences read."""

    model_type: str
    sdpa_supported: bool
    too_long: int | None  # seq_len when it exceeds max_position_embeddings
    max_position_embeddings: int | None
    moment: str
    fw: Framework
    auto: bool  # the framework was picked (--framework auto)
    precision: Precision
    attn_implementation: AttnImplementation
    method: Method
    prepare_kbit_training: KbitPrep
    lora_library: LoraLibrary
    optimizer: Optimizer
    expert_sharded: bool  # expert parallelism with sharded states
    fsdp_offload: bool  # FSDP with CPUOffloadPolicy
    in_backward: bool  # torchtune's optimizer_in_bwd (full training)
    checkpoints_on_device: int  # activation offloading: checkpoints left on the device (0: off)
    torch_compile: bool = False
    float8: str = "none"  # Float8 value, "none" under LoRA / QLoRA
    float8_all_gather: bool = False
    fsdp_pipelined: bool = False  # FSDP (ZeRO 2 / 3) under pipeline parallelism
    checkpoints_at_loss: int = 0  # activation offloading: those still on the device through the loss
    fsdp_flat_params: bool = False  # FSDP1 FlatParameter units (ZeRO 3)
    fsdp_no_sync: bool = False  # FSDP (ZeRO 2 / 3) accumulating inside no_sync


_QLORA_BASES = {
    LoraLibrary.PEFT: "bitsandbytes NF4 linear weights (double quantization), lm_head 16-bit",
    LoraLibrary.LITGPT: ("litgpt bnb.nf4 on every linear and the lm_head (no double quantization); bitsandbytes 0.42 "
                         "keeps each 4-bit linear's input for backward"),
    LoraLibrary.TORCHTUNE: "torchao NF4Tensor linear weights (block 64, scaler block 256), output projection 16-bit",
    LoraLibrary.UNSLOTH: "bitsandbytes NF4 linear weights (double quantization), lm_head 16-bit",
}


def assumptions(spec: ModelSpec, t: TrainingConfig, fw: Framework, moment: str) -> tuple[str, ...]:
    """What the estimate assumed."""
    par = t.parallelism
    too_long = bool(spec.max_position_embeddings and t.seq_len > spec.max_position_embeddings)
    return _assumption_lines(AssumptionsInput(
        spec.model_type, spec.sdpa_supported, t.seq_len if too_long else None, spec.max_position_embeddings, moment, fw,
        t.framework is Framework.AUTO, t.precision, t.attn_implementation, t.method, t.prepare_kbit_training,
        t.lora_library, t.optimizer, par.ep > 1 and par.zero_stage > 0,
        fw is Framework.FSDP and t.offload is not Offload.NONE, t.optimizer_in_bwd and t.method is Method.FULL,
        offloaded_checkpoints_on_device(t), t.torch_compile,
        Float8(t.float8).value if t.method is Method.FULL else "none", t.float8_all_gather,
        fw is Framework.FSDP and par.pp > 1 and par.zero_stage >= 2, offloaded_checkpoints_at_loss(t),
        fw is Framework.FSDP and t.fsdp_flat_params and par.zero_stage >= 3,
        fw is Framework.FSDP and t.no_sync_accumulation and t.grad_accum_steps > 1 and par.zero_stage >= 2
        and par.pp == 1))


@remembered(maxsize=4096)
def _assumption_lines(a: AssumptionsInput) -> tuple[str, ...]:
    """The sentences of :func:`assumptions` (remembered)."""
    fw, moment = a.fw, a.moment
    out = [
        f"peak moment: {moment} (of {', '.join(MOMENTS)})",
        f"framework {fw.value}" + (" (auto)" if a.auto else "")
        + f"; precision recipe {a.precision.value}: {RECIPES[a.precision]}",
        "steady state (step >= 2): optimizer states allocated",
        ("each tensor in its own CUDA caching-allocator block (512 B multiples; 2 MiB segments of tensors from "
         "10 MiB on, unsplit when 1 MiB or less is left)"),
    ]
    if not a.sdpa_supported:
        out.append(f"eager attention: transformers has no SDPA path for {a.model_type}; the s x s scores are stored")
    elif a.attn_implementation != AttnImplementation.EAGER:
        out.append("flash / SDPA attention: no s x s scores stored; K and V kept at num_kv_heads")
    if a.too_long:
        out.append(f"seq_len {a.too_long} exceeds max_position_embeddings {a.max_position_embeddings}")
    if a.method is not Method.FULL:
        adapters = ("in fp32 (PEFT autocast_adapter_dtype)" if a.lora_library in (LoraLibrary.PEFT, LoraLibrary.UNSLOTH)
                    else f"at the run's parameter dtype ({a.lora_library.value})")
        if a.lora_library is LoraLibrary.UNSLOTH:
            out.append("unsloth's LoRA kernels (LoRA_QKV, LoRA_W, LoRA_MLP, Fast_RMS_Layernorm, in-place RoPE) in "
                       "every layer whose linears all carry an adapter, with LoRA dropout 0: each keeps only its "
                       "input, Q, K, V, the attention output and the gate and up outputs for backward")
        out.append(f"LoRA adapters {adapters}, trained with the optimizer's full states; "
                   "the first layer's input needs no gradient (PEFT enables input gradients only under "
                   "gradient checkpointing turned on before get_peft_model)")
        if fw is Framework.DEEPSPEED:
            out.append("DeepSpeed keeps an fp32 master of the fp32 adapters (a real engine casts the module to "
                       "16 bits first: adapters, their gradients and input copies then halve)")
    if fw is Framework.DEEPSPEED:
        out.append(f"DeepSpeed {DEEPSPEED_VERSION} with its config defaults: gradients accumulated in the model dtype (so "
                   "bf16 at ZeRO 0 runs FP16_Optimizer: unsharded fp32 master and states, fp32 gradient copies at the "
                   "step; data_types.grad_accum_dtype fp32 would select BF16_Optimizer, not modelled), FusedAdam, "
                   "contiguous_gradients on, overlap_comm off below ZeRO 3 (on: two reduce buffers), reduce_bucket_size 5e8 "
                   "unless its JSON sets them "
                   "(the HF integration fills \"auto\" from hidden_size: the notes)")
    if a.method is Method.QLORA:
        out.append(f"QLoRA base: {_QLORA_BASES[a.lora_library]}; " + _KBIT_ASSUMPTIONS[a.prepare_kbit_training])
    if a.optimizer in (Optimizer.PAGED_ADAMW8BIT, Optimizer.PAGED_ADAMW32BIT):
        out.append("bitsandbytes paged optimizer: the states of tensors >= 1e5 elements in CUDA managed memory, "
                   "outside PyTorch's allocator (in no torch.cuda figure); on the device while it has room, the rest "
                   "evicted to host RAM (a slower step, not an out-of-memory)")
    if a.expert_sharded:
        out.append("expert parallelism: routed experts' sharded states (ZeRO/FSDP) are split over their "
                   "expert-data-parallel group, the dp x cp / ep ranks holding the same experts (Megatron-LM, "
                   "DeepSpeed-MoE)")
    if a.fsdp_offload:
        out.append("FSDP CPUOffloadPolicy (torch 2.13, pin_memory): parameter, gradient and optimizer-state shards in "
                   "pinned host RAM, the optimizer step on the host; each sharded gradient copied to host after its "
                   "reduce-scatter")
    if a.fsdp_pipelined:
        out.append("FSDP2 under pipeline parallelism (torchtitan: reshard_after_forward False; torch pipelining: no "
                   "reshard after backward and no gradient sync until the last micro-batch): the stage's layers stay "
                   "gathered and every parameter's unsharded gradient accumulates at the reduce dtype until the last "
                   "micro-batch's reduce-scatter")
    if a.fsdp_flat_params:
        out.append("FSDP1 FullyShardedDataParallel (use_orig_params): one FlatParameter per unit; the root unit's "
                   "parameters gathered from forward to the end of backward, its head's gradients held until the "
                   "embedding's arrives and the root's flat gradient assembled from both")
    if a.fsdp_no_sync:
        out.append("gradient accumulation inside no_sync (Lightning Fabric no_backward_sync): every unit's unsharded "
                   "gradient kept from the first micro-batch's backward to the last one's reduce-scatter")
    if a.in_backward:
        out.append("optimizer_in_bwd (torchtune 0.6): one optimizer per parameter stepped in its post-accumulate-grad "
                   "hook; the largest in-flight gradient counted, none at the step")
    if a.checkpoints_on_device:
        at_loss = (f", {a.checkpoints_at_loss} through the loss (the stash's ids the final norm's saved tensors leave)"
                   if a.checkpoints_at_loss != a.checkpoints_on_device else "")
        out.append(f"activation offloading: layer checkpoints in host RAM, {a.checkpoints_on_device} kept on the "
                   f"device (torchtune OffloadActivations' forward stash of 5; unsloth brings back 1){at_loss}")
    if a.torch_compile:
        out.append("torch.compile (torch 2.13 inductor, default min-cut partitioner): each layer saves its norms' 16-bit "
                   "inputs and rstd, not their fp32 copies, and the gated MLP's gate, up and down input, not the "
                   "activation's output" + ("; with float8 the norms' outputs and the down input are recomputed too"
                                            if a.float8 != "none" else "")
                   + "; eager attention's scores, the backward's buffers and a plain loss as eager")
    if a.float8 != "none":
        out.append(f"torchao 0.18 float8 {a.float8} linears (dynamic scaling: no amax history)"
                   + ("; FSDP2 all-gathers their weights in float8" if a.float8_all_gather else "")
                   + ("" if a.torch_compile else "; eager Float8Linear saves its bf16 input, as a bf16 linear"))
    return tuple(out)
