"""What the user wants to run: training or serving settings, precision recipes, parallelism.

Every setting uses the ecosystem's word for it (the HF Trainer, DeepSpeed, Megatron-LM, vLLM).
:func:`validate` checks a workload against a model and raises :class:`~memest.errors.InputError`
with a one-line message naming the value and the fix.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from memest.errors import InputError
from memest.spec import ModelSpec


class Method(str, Enum):
    """What is trained."""

    FULL = "full"
    """Every parameter (full fine-tune or pre-training)."""
    LORA = "lora"
    """Low-rank adapters on a frozen base at its storage dtype (PEFT LoRA)."""
    QLORA = "qlora"
    """LoRA on a base quantized to NF4 by bitsandbytes (Dettmers et al. 2023)."""


class Precision(str, Enum):
    """Training precision recipes; bytes per parameter of each in ``memest.estimate.training``."""

    MIXED = "mixed"
    """bf16 weights and gradients for compute, fp32 master weights in the optimizer (DeepSpeed
    bf16/ZeRO, Megatron-LM ``--bf16``)."""
    FP16 = "fp16"
    """As ``mixed`` with fp16 compute weights and dynamic loss scaling (DeepSpeed ``fp16``)."""
    AMP = "amp"
    """fp32 weights, gradients and optimizer; torch.autocast runs matmuls in bf16 (HF Trainer
    ``bf16=True``)."""
    FSDP2 = "fsdp2"
    """PyTorch FSDP2 ``MixedPrecisionPolicy(param_dtype=bf16)``: fp32 sharded parameters and
    optimizer, bf16 compute copies gathered per unit."""
    BF16 = "bf16"
    """Pure bf16: weights, gradients and optimizer states all bf16, no fp32 master."""
    FP32 = "fp32"
    """Everything fp32."""


class Optimizer(str, Enum):
    """Optimizers, named as the HF Trainer's ``optim`` values name them where one exists."""

    ADAMW = "adamw"
    """torch.optim.AdamW: two states (exp_avg, exp_avg_sq) per parameter."""
    ADAMW8BIT = "adamw8bit"
    """bitsandbytes AdamW8bit: two uint8 states plus an fp32 absmax per 2048-value block."""
    PAGED_ADAMW8BIT = "paged_adamw8bit"
    """As adamw8bit, states in CUDA unified memory that pages to host under pressure."""
    ADAFACTOR = "adafactor"
    """Adafactor: factored second moment (one row and one column vector per matrix), no momentum."""
    LION = "lion"
    """Lion: one momentum state per parameter."""
    SGD = "sgd"
    """SGD without momentum: no state."""
    SGD_MOMENTUM = "sgd_momentum"
    """SGD with momentum: one state per parameter."""


class Recompute(str, Enum):
    """Activation checkpointing (Korthikanti et al. 2022 terms)."""

    NONE = "none"
    SELECTIVE = "selective"
    """Recompute the attention core (scores, softmax, dropout) in backward; keep the rest."""
    FULL = "full"
    """Keep only each layer's input; rebuild one layer's activations at a time in backward."""


class Offload(str, Enum):
    """DeepSpeed ZeRO-Offload / FSDP CPU offload."""

    NONE = "none"
    OPTIMIZER = "optimizer"
    """Optimizer states (and fp32 master) in host RAM; the step runs on the CPU."""
    PARAMS = "params"
    """Optimizer states and parameters in host RAM (ZeRO-3 / FSDP only)."""


class Engine(str, Enum):
    """Serving engines whose memory behaviour memest models."""

    VLLM = "vllm"
    """vLLM: weights + profiled activation peak + non-torch memory; the rest of
    ``gpu_memory_utilization`` x capacity becomes paged KV-cache blocks."""
    HF = "hf"
    """transformers ``generate``: a contiguous cache for batch x (prompt + new tokens)."""


WEIGHT_DTYPES = ("auto", "fp32", "fp16", "bf16", "float32", "float16", "bfloat16")
QUANTIZATIONS = ("none", "int8", "int4", "nf4", "fp4", "fp8", "gptq", "awq", "mxfp4")
KV_CACHE_DTYPES = ("auto", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2")
BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
"""vLLM's ``--block-size`` choices (``CacheConfig.block_size``)."""
ENGINE_VERSIONS: dict[str, tuple[str, ...]] = {"vllm": ("0.19", "0.6", "0.2"), "hf": ("5", "4.34")}
"""Engine versions whose memory arithmetic memest models, newest (the default) first.
vLLM 0.19 is the V1 engine; 0.6 the V0 engine after PR #10511 (Dec 2024); 0.2 the V0 engine of
Dec 2023. transformers 5 computes logits for the last prompt token only; 4.34 for every prompt
token and registers GPT-BigCode's max_positions^2 causal-mask buffer."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Parallelism:
    """How the job is spread over devices. World size = tp x pp x cp x dp.

    Attributes:
        tp: Tensor-parallel degree (Megatron-LM column/row splits; vLLM ``tensor_parallel_size``).
        pp: Pipeline-parallel degree (layers split into pp stages; 1F1B schedule for training).
        dp: Data-parallel degree (replicas, or the sharding group of ZeRO / FSDP).
        cp: Context-parallel degree (the sequence split across devices; ring attention).
        ep: Expert-parallel degree (routed experts split across the dp x cp ranks of MoE layers).
        zero_stage: DeepSpeed ZeRO stage over the dp ranks: 0 replicas, 1 optimizer states
            sharded, 2 + gradients, 3 + parameters (FSDP FULL_SHARD = 3, SHARD_GRAD_OP = 2).
        sequence_parallel: Megatron sequence parallelism: with tp > 1, the activations outside the
            tensor-parallel regions are split over tp too.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    zero_stage: int = 0
    sequence_parallel: bool = False

    @property
    def world_size(self) -> int:
        """Devices in the job."""
        return self.tp * self.pp * self.cp * self.dp


@dataclass(frozen=True, slots=True, kw_only=True)
class LoraConfig:
    """LoRA adapter settings (PEFT names).

    Attributes:
        rank: r, the adapters' inner width.
        targets: ``attention`` (the attention projections), ``all-linear`` (every linear layer of
            the decoder, as PEFT's ``target_modules="all-linear"``), or a comma-separated list of
            module names (``q_proj,v_proj``).
    """

    rank: int = 16
    targets: str = "attention"


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingConfig:
    """A training (or fine-tuning) job, per device.

    Attributes:
        method: Full training, LoRA or QLoRA.
        micro_batch_size: Sequences per device per forward (b).
        seq_len: Tokens per sequence (s).
        grad_accum_steps: Micro-batches per optimizer step.
        precision: The precision recipe.
        optimizer: The optimizer.
        recompute: Activation checkpointing.
        attn_implementation: ``sdpa`` / ``flash_attention_2`` (no s x s scores kept) or ``eager``.
        loss: ``default`` (full logits, fp32 upcast) or ``chunked`` (fused/chunked cross-entropy
            that never holds the full logits).
        lora: Adapter settings (LoRA and QLoRA only).
        offload: CPU offload.
        parallelism: TP/PP/DP/CP/EP degrees and the ZeRO stage.
    """

    method: Method = Method.FULL
    micro_batch_size: int = 1
    seq_len: int = 2048
    grad_accum_steps: int = 1
    precision: Precision = Precision.MIXED
    optimizer: Optimizer = Optimizer.ADAMW
    recompute: Recompute = Recompute.NONE
    attn_implementation: str = "sdpa"
    loss: str = "default"
    lora: LoraConfig = field(default_factory=LoraConfig)
    offload: Offload = Offload.NONE
    parallelism: Parallelism = field(default_factory=Parallelism)

    @property
    def mode(self) -> str:
        """``train`` for full training, else the fine-tuning method."""
        return "train" if self.method is Method.FULL else self.method.value

    def replace(self, **changes: Any) -> TrainingConfig:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingConfig:
    """An inference server (or ``generate`` loop), per device.

    Attributes:
        dtype: Weight dtype (``auto`` = the checkpoint's, fp32 checkpoints served in fp16 as vLLM
            does).
        quantization: Weight quantization applied to an unquantized model (``none`` keeps the
            checkpoint's own quantization_config, if any).
        kv_cache_dtype: KV-cache element type (``auto`` = the weight dtype).
        max_model_len: Longest sequence (prompt + output) in tokens; None = the model's
            max_position_embeddings.
        batch_size: Concurrent sequences that must each reach max_model_len.
        engine: Whose memory behaviour to model.
        gpu_memory_utilization: The share of device memory vLLM may use.
        max_num_batched_tokens: Tokens per forward (vLLM's profiling run); None = vLLM's default.
        max_num_seqs: Sequences per forward (vLLM; sizes the sampler's logits in profiling);
            None = the engine's default.
        block_size: Tokens per paged KV block.
        enforce_eager: No CUDA graphs (vLLM ``--enforce-eager``).
        engine_version: Whose version of the engine's arithmetic to model (see
            :data:`ENGINE_VERSIONS`); None = the newest.
        prompt_len: hf: tokens in each prompt (prefill); None = max_model_len - max_new_tokens.
        max_new_tokens: hf: tokens generated per sequence; None = 0 when max_model_len is the
            total, else what max_model_len leaves after the prompt.
        checkpoint_params: Parameters per stored dtype of the checkpoint (safetensors header names:
            ``BF16``, ``F32``, ``I8``, ``U8``, ``F8_E4M3``, ...), from ``--exact-weights``; scales
            the analytic weight bytes to the checkpoint's exact total.
        parallelism: TP/PP degrees (and dp replicas).
    """

    dtype: str = "auto"
    quantization: str = "none"
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None
    batch_size: int = 1
    engine: Engine = Engine.VLLM
    gpu_memory_utilization: float = 0.9
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    block_size: int = 16
    enforce_eager: bool = False
    engine_version: str | None = None
    prompt_len: int | None = None
    max_new_tokens: int | None = None
    checkpoint_params: tuple[tuple[str, int], ...] = ()
    parallelism: Parallelism = field(default_factory=Parallelism)

    @property
    def mode(self) -> str:
        """Always ``serve``."""
        return "serve"

    def replace(self, **changes: Any) -> ServingConfig:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


Workload = TrainingConfig | ServingConfig


def validate(spec: ModelSpec, workload: Workload) -> None:
    """Check a workload against a model.

    Raises:
        InputError: a size is not positive, a parallel degree does not divide what it splits,
            a setting does not apply to the model or the method.
    """
    par = workload.parallelism
    for name in ("tp", "pp", "dp", "cp", "ep"):
        value = getattr(par, name)
        if value < 1:
            raise InputError(f"--{name} is {value}; it must be at least 1")
    if par.zero_stage not in (0, 1, 2, 3):
        raise InputError(f"--zero-stage is {par.zero_stage}; it must be 0, 1, 2 or 3")
    a, k = spec.num_heads, spec.num_kv_heads
    if a % par.tp:
        raise InputError(
            f"--tp {par.tp} does not divide num_heads ({a}) of {spec.name}; use a tp that divides {a}"
        )
    if par.tp > k and par.tp % k:
        raise InputError(
            f"--tp {par.tp} is above num_kv_heads ({k}) but not a multiple of it; KV heads cannot be replicated evenly"
        )
    if par.tp <= k and k % par.tp:
        raise InputError(f"--tp {par.tp} does not divide num_kv_heads ({k}) of {spec.name}")
    if par.pp > spec.num_layers:
        raise InputError(f"--pp {par.pp} is more than the {spec.num_layers} layers of {spec.name}; use --pp <= {spec.num_layers}")
    if par.ep > 1:
        if spec.num_experts == 0:
            raise InputError(f"--ep {par.ep} needs a mixture-of-experts model; {spec.name} has no experts")
        if spec.num_experts % par.ep:
            raise InputError(f"--ep {par.ep} does not divide the {spec.num_experts} experts of {spec.name}")
        if (par.dp * par.cp * par.tp) % par.ep:
            raise InputError(f"--ep {par.ep} must divide the dp x cp x tp ranks ({par.dp * par.cp * par.tp})")
    if isinstance(workload, TrainingConfig):
        _validate_training(workload)
    else:
        _validate_serving(workload)
        _validate_serving_model(spec, workload)


def _positive(flag: str, value: int) -> None:
    if value < 1:
        raise InputError(f"{flag} is {value}; it must be a positive integer")


def _validate_training(t: TrainingConfig) -> None:
    _positive("--micro-batch-size", t.micro_batch_size)
    _positive("--seq-len", t.seq_len)
    _positive("--grad-accum-steps", t.grad_accum_steps)
    if t.method is not Method.FULL:
        _positive("--lora-rank", t.lora.rank)
    par = t.parallelism
    if par.cp > 1 and t.seq_len % (2 * par.cp):
        raise InputError(f"--seq-len {t.seq_len} must be divisible by 2 x cp ({2 * par.cp}) for context parallelism")
    if t.offload is not Offload.NONE and par.zero_stage == 0:
        raise InputError(f"--offload {t.offload.value} needs ZeRO (--zero-stage 1-3 or FSDP); add --zero-stage 3")
    if t.offload is Offload.PARAMS and par.zero_stage != 3:
        raise InputError("--offload params needs --zero-stage 3 (parameters are only offloaded when sharded)")
    if t.method is Method.QLORA and t.precision is Precision.FP32:
        raise InputError("--finetune qlora computes in 16-bit; use --precision bf16 or fp16 instead of fp32")


def _validate_serving(s: ServingConfig) -> None:
    _positive("--batch-size", s.batch_size)
    _positive("--block-size", s.block_size)
    if s.engine is Engine.VLLM and s.block_size not in BLOCK_SIZES:
        raise InputError(f"--block-size {s.block_size} is not one vLLM accepts; use one of "
                         f"{', '.join(map(str, BLOCK_SIZES))}")
    if s.max_model_len is not None:
        _positive("--max-model-len", s.max_model_len)
    if s.max_num_batched_tokens is not None:
        _positive("--max-num-batched-tokens", s.max_num_batched_tokens)
    if s.max_num_seqs is not None:
        _positive("--max-num-seqs", s.max_num_seqs)
    if s.prompt_len is not None:
        _positive("--prompt-len", s.prompt_len)
    if s.max_new_tokens is not None and s.max_new_tokens < 0:
        raise InputError(f"--max-new-tokens is {s.max_new_tokens}; it must be 0 or more")
    if s.prompt_len is not None and s.max_new_tokens is not None and s.max_model_len is not None \
            and s.prompt_len + s.max_new_tokens > s.max_model_len:
        raise InputError(f"--prompt-len {s.prompt_len} + --max-new-tokens {s.max_new_tokens} exceeds --max-model-len "
                         f"{s.max_model_len}; raise --max-model-len or shorten them")
    versions = ENGINE_VERSIONS[s.engine.value]
    if s.engine_version is not None and s.engine_version not in versions:
        raise InputError(f"--engine-version {s.engine_version!r} is not a {s.engine.value} version memest models; "
                         f"use one of {', '.join(versions)}")
    if s.engine is Engine.HF and (s.parallelism.tp > 1 or s.parallelism.pp > 1):
        raise InputError("--engine hf models one device (generate has no tensor/pipeline parallelism); "
                         "use --engine vllm for --tp/--pp")
    if not 0 < s.gpu_memory_utilization <= 1:
        raise InputError(f"--gpu-memory-utilization is {s.gpu_memory_utilization}; it must be in (0, 1]")
    if s.dtype not in WEIGHT_DTYPES:
        raise InputError(f"--dtype {s.dtype!r} is not one of {', '.join(WEIGHT_DTYPES)}")
    if s.quantization not in QUANTIZATIONS:
        raise InputError(f"--quantization {s.quantization!r} is not one of {', '.join(QUANTIZATIONS)}")
    if s.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise InputError(f"--kv-cache-dtype {s.kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}")


def _validate_serving_model(spec: ModelSpec, s: ServingConfig) -> None:
    """Checks that need the model: the length.

    Raises:
        InputError: for vLLM, max_model_len beyond the model's max_position_embeddings (vLLM
            refuses it too, without ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``).
    """
    limit = spec.max_position_embeddings
    if s.engine is Engine.VLLM and s.max_model_len is not None and limit is not None and s.max_model_len > limit:
        raise InputError(f"--max-model-len {s.max_model_len} is more than {spec.name}'s max_position_embeddings "
                         f"({limit}); use --max-model-len <= {limit}")
