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

from memest import lora_targets
from memest.errors import InputError
from memest.spec import ModelSpec, Split


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
    """torch.optim.AdamW with its default ``foreach`` kernels (HF ``adamw_torch`` before torch
    2.8, torchtune, torchtitan): two states (exp_avg, exp_avg_sq) per parameter, and one
    state-sized temporary (``_foreach_sqrt`` of exp_avg_sq) during the step. DeepSpeed and
    Megatron-LM run their fused Adam instead (no temporary)."""
    ADAMW_FUSED = "adamw_fused"
    """torch.optim.AdamW(fused=True) (HF ``adamw_torch_fused``, the Trainer default from torch
    2.8): the same states, no step temporary."""
    ADAMW8BIT = "adamw8bit"
    """bitsandbytes AdamW8bit: two uint8 states plus an fp32 absmax per 256-value block
    (tensors under 4096 elements keep fp32 states)."""
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
    """Recompute the attention core (scores, softmax, dropout) in backward; keep the rest
    (Megatron-LM ``--recompute-granularity selective``)."""
    SELECTIVE_OP = "selective_op"
    """torchtitan ``selective_ac_option = "op"``: keep each layer's input and the outputs of every
    other matmul and of the attention kernel; recompute the rest one layer at a time."""
    FULL = "full"
    """Keep only each layer's input; rebuild one layer's activations at a time in backward
    (HF ``gradient_checkpointing``, Megatron ``--recompute-granularity full``)."""


class Framework(str, Enum):
    """Who runs the training step: it decides where gradients live and which buffers exist.

    ``auto`` picks one from the precision recipe and the parallelism (see
    :func:`resolve_framework`).
    """

    AUTO = "auto"
    PYTORCH = "pytorch"
    """Plain PyTorch autograd in one process (HF Trainer on one device, torchtune and litgpt
    single-device recipes): gradients appear during backward and are freed by
    ``zero_grad(set_to_none=True)``; optimizer states appear at the first step."""
    DDP = "ddp"
    """torch DistributedDataParallel: as ``pytorch`` plus gradient buckets covering every
    parameter (``gradient_as_bucket_view=False``, the default)."""
    DEEPSPEED = "deepspeed"
    """DeepSpeed ZeRO 0-3 with its FusedAdam: contiguous gradient buffers, reduce buckets, fp32
    master and gradient partitions."""
    MEGATRON = "megatron"
    """Megatron-LM: an fp32 ``main_grad`` buffer for every parameter, the distributed optimizer
    sharding fp32 master weights and Adam states over dp when ``zero_stage`` >= 1, fused norms."""
    FSDP = "fsdp"
    """PyTorch FSDP (``fully_shard``, torchtitan): sharded parameters gathered one unit at a time,
    sharded gradients reduced in ``reduce_dtype``."""


class FsdpStrategy(str, Enum):
    """PyTorch FSDP sharding strategies (``torch.distributed.fsdp.ShardingStrategy``), as ZeRO
    stages over a sharding group."""

    FULL_SHARD = "full_shard"
    """Parameters, gradients and optimizer states sharded (ZeRO-3)."""
    SHARD_GRAD_OP = "shard_grad_op"
    """Gradients and optimizer states sharded; parameters stay gathered from forward to backward
    (ZeRO-2)."""
    HYBRID_SHARD = "hybrid_shard"
    """FULL_SHARD inside each node, replicated across nodes."""
    NO_SHARD = "no_shard"
    """Replicas, like DDP (ZeRO-0)."""


class AttnImplementation(str, Enum):
    """Attention kernels, named as transformers' ``attn_implementation`` names them."""

    SDPA = "sdpa"
    """torch scaled_dot_product_attention (flash / memory-efficient kernels): keeps Q, K, V, the
    output and an fp32 logsumexp; K and V are not repeated to num_heads (transformers >= 4.5x
    passes ``enable_gqa``)."""
    FLASH_ATTENTION_2 = "flash_attention_2"
    """The flash-attn package: as ``sdpa``."""
    EAGER = "eager"
    """Matmul + softmax: K and V repeated to num_heads, the s x s scores' fp32 softmax and its
    16-bit copy stored."""


class Loss(str, Enum):
    """How the cross-entropy over the vocabulary is computed."""

    DEFAULT = "default"
    """Full logits, upcast to fp32 (transformers ``ForCausalLMLoss``, torchtune, torchtitan)."""
    CHUNKED = "chunked"
    """torchtune ``CEWithChunkedOutputLoss``: 8 chunks, each upcast separately; the fp32
    log-probabilities of all chunks are still kept for backward."""
    FUSED = "fused"
    """A fused linear cross-entropy (Liger, Cut Cross-Entropy, unsloth) that never materializes
    the logits of more than one chunk of tokens."""


class Offload(str, Enum):
    """DeepSpeed ZeRO-Offload / FSDP CPU offload."""

    NONE = "none"
    OPTIMIZER = "optimizer"
    """Optimizer states (and fp32 master) in host RAM; the step runs on the CPU."""
    PARAMS = "params"
    """Optimizer states and parameters in host RAM (ZeRO-3 / FSDP only)."""


class KbitPrep(str, Enum):
    """How a QLoRA script prepares the NF4 model before training: which dtype its non-quantized weights
    (embeddings, norms, lm_head) end in, and so the residual stream's dtype.

    bitsandbytes ``Linear4bit.forward`` casts its input to ``bnb_4bit_compute_dtype`` and its output back
    to the input's dtype (``bitsandbytes/nn/modules.py``, 0.43), and transformers' ``LlamaRMSNorm`` /
    ``MistralRMSNorm`` return ``weight * x.to(input_dtype)``, which type promotion makes fp32 when the
    weight is fp32: fp32 norm weights make the whole residual stream fp32.
    """

    NONE = "none"
    """No preparation: every non-quantized weight stays 16-bit, the residual stream is in the compute
    dtype (a script that calls ``get_peft_model`` on the NF4 model directly)."""
    PEFT = "peft"
    """PEFT ``prepare_model_for_kbit_training`` alone (``peft/utils/other.py``): every fp16/bf16 parameter
    that is not ``Params4bit`` is upcast to fp32 (embeddings, norms, lm_head), so the residual stream
    and the logits are fp32; no autocast (a plain training loop)."""
    TRL = "trl"
    """trl ``SFTTrainer`` with ``bf16=True`` (``trl/trainer/sft_trainer.py``, 0.13: a 4-bit model goes
    through ``prepare_model_for_kbit_training``, ``get_peft_model``, then ``peft_module_casting_to_bf16``
    in ``trl/trainer/utils.py``): norms (modules named ``*norm*``) stay fp32, ``embed_tokens`` and
    ``lm_head`` go back to bf16; the residual stream is fp32 and the HF Trainer runs the forward under
    ``torch.autocast(bf16)``. The default: the most common QLoRA path, and the costlier one to
    under-predict (its layer checkpoints are twice ``none``'s). Scripts modelled on the QLoRA paper's
    ``qlora.py`` make the same casts and also cast the adapters to bf16 (not modelled: adapters stay fp32)."""


class Engine(str, Enum):
    """Serving engines whose memory behaviour memest models."""

    VLLM = "vllm"
    """vLLM: weights + profiled activation peak + non-torch memory; the rest of
    ``gpu_memory_utilization`` x capacity becomes paged KV-cache blocks."""
    HF = "hf"
    """transformers ``generate``: a contiguous cache for batch x (prompt + new tokens)."""
    LLAMACPP = "llama.cpp"
    """llama.cpp with a GGUF file: model buffers per device after the ``-ngl`` layer split, the rest
    in host RAM, an n_ctx KV cache at its cache type, compute buffers."""
    OLLAMA = "ollama"
    """Ollama: llama.cpp's memory with Ollama's defaults (num_ctx 4096, Q4_K_M library tags) and its
    own layer-placement estimate."""


WEIGHT_DTYPES = ("auto", "fp32", "fp16", "bf16", "float32", "float16", "bfloat16")
QUANTIZATIONS = ("none", "int8", "int4", "nf4", "fp4", "fp8", "gptq", "awq", "mxfp4")
KV_CACHE_DTYPES = ("auto", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2")
BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
VLLM_NO_FLOAT16 = frozenset({"gemma2", "gemma3", "gemma3_text", "glm4", "plamo2"})
"""model_types vLLM will not serve in float16 (``vllm/config/model.py`` ``_FLOAT16_NOT_SUPPORTED_MODELS``)."""
"""vLLM's ``--block-size`` choices (``CacheConfig.block_size``)."""
ENGINE_VERSIONS: dict[str, tuple[str, ...]] = {"vllm": ("0.19", "0.6", "0.2"), "hf": ("5", "4.34"),
                                                "llama.cpp": ("b4715",), "ollama": ("0.11",)}
"""Engine versions whose memory arithmetic memest models, newest (the default) first.
vLLM 0.19 is the V1 engine; 0.6 the V0 engine after PR #10511 (Dec 2024); 0.2 the V0 engine of
Dec 2023. transformers 5 computes logits for the last prompt token only; 4.34 for every prompt
token (and runs eager attention by default)."""


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
        dp_shard: Ranks the ZeRO / FSDP states are sharded over (torchtitan ``dp_shard``; FSDP
            HYBRID_SHARD shards inside a node and replicates across nodes). None: all dp x cp ranks.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    zero_stage: int = 0
    sequence_parallel: bool = False
    dp_shard: int | None = None

    @property
    def world_size(self) -> int:
        """Devices in the job."""
        return self.tp * self.pp * self.cp * self.dp

    @property
    def shard_degree(self) -> int:
        """N: ranks that share one copy of the sharded states (dp_shard, else dp x cp)."""
        return self.dp_shard if self.dp_shard is not None else self.dp * self.cp


@dataclass(frozen=True, slots=True, kw_only=True)
class LoraConfig:
    """LoRA adapter settings (PEFT names).

    Attributes:
        rank: r, the adapters' inner width.
        targets: ``attention`` (every attention projection: q, k, v, o; PEFT's ``target_modules=None``
            default for llama-style models adapts only q_proj and v_proj), ``all-linear`` (every linear layer of
            the decoder, as PEFT's ``target_modules="all-linear"``), or a comma-separated list of
            module names (``q_proj,v_proj``).
        dropout: PEFT ``lora_dropout``: above 0 each adapted linear keeps a dropout mask and its
            own copy of the input.
    """

    rank: int = 16
    targets: str = "attention"
    dropout: float = 0.0


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
        loss: ``default`` (full logits, fp32 upcast), ``chunked`` or ``fused`` (see :class:`Loss`).
        lora: Adapter settings (LoRA and QLoRA only).
        offload: CPU offload.
        parallelism: TP/PP/DP/CP/EP degrees and the ZeRO stage.
        framework: Who runs the step (gradient buffers, reduce buckets); ``auto`` picks one.
        set_grads_to_none: ``optimizer.zero_grad(set_to_none=True)`` (the PyTorch >= 2.0 default):
            gradients are freed between steps. False keeps them allocated (PyTorch 1.x default,
            HF Trainer before torch 2.0). Only the ``pytorch`` and ``ddp`` frameworks free them.
        target_len: Decoder tokens per sequence of an encoder-decoder model (T5); None = seq_len.
        prepare_kbit_training: QLoRA only: how the script prepared the NF4 model (:class:`KbitPrep`):
            ``trl`` (SFTTrainer, the default), ``peft`` (``prepare_model_for_kbit_training`` alone) or
            ``none``.
    """

    method: Method = Method.FULL
    micro_batch_size: int = 1
    seq_len: int = 2048
    grad_accum_steps: int = 1
    precision: Precision = Precision.MIXED
    optimizer: Optimizer = Optimizer.ADAMW
    recompute: Recompute = Recompute.NONE
    attn_implementation: AttnImplementation = AttnImplementation.SDPA
    loss: Loss = Loss.DEFAULT
    lora: LoraConfig = field(default_factory=LoraConfig)
    offload: Offload = Offload.NONE
    parallelism: Parallelism = field(default_factory=Parallelism)
    framework: Framework = Framework.AUTO
    set_grads_to_none: bool = True
    target_len: int | None = None
    prepare_kbit_training: KbitPrep = KbitPrep.TRL

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
        dtype: Weight dtype (``auto`` = the checkpoint's; fp32 checkpoints in bf16 under vLLM,
            in fp32 under transformers; :func:`memest.estimate.serving.common.weight_dtype`).
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
        n_gpu_layers: llama.cpp / Ollama ``-ngl``: layers (of num_layers + 1, the output layer last)
            on the GPUs; None = all (llama.cpp) / as many as fit (Ollama).
        n_batch: llama.cpp ``-b`` (logical batch); None = the engine's default.
        n_ubatch: llama.cpp ``-ub`` (physical batch: tokens of the worst-case graph); None = default.
        flash_attn: llama.cpp ``-fa`` (needed for a quantized V cache).
        tensor_split: llama.cpp ``-ts``: each GPU's share of the offloaded layers; () = by memory.
        gguf_tensors: The tensors of a ``.gguf`` file's header (name, ggml type, shape rows first),
            from ``--gguf``; replaces the analytic file-type layout.
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
    n_gpu_layers: int | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    flash_attn: bool = False
    tensor_split: tuple[float, ...] = ()
    gguf_tensors: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
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
    problem = tp_head_problem(spec, par.tp)
    if problem:
        raise InputError(f"--tp {par.tp} {problem[0]}; {problem[1]}")
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
        _validate_training_model(spec, workload)
    else:
        _validate_serving(workload)
        _validate_serving_model(spec, workload)


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` (at least 1), ascending, found in O(sqrt n) steps: n may be a user's
    value (a micro-batch of 10^9 has 100 divisors, found in 31,623 steps)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def tp_head_problem(spec: ModelSpec, tp: int) -> tuple[str, str] | None:
    """Why tensor parallelism ``tp`` cannot split the attention of ``spec``, and the fix; or None.

    tp must divide num_heads of every layer with heads, and either divide num_kv_heads or be a
    multiple of it (vLLM ``QKVParallelLinear`` replicates KV heads beyond num_kv_heads). Layers
    without heads (Mamba mixers, RWKV) set no head rule, but key/value projections in them cannot be
    divided by KV heads. The reason reads after "--tp N" (``"does not divide num_heads (32) of
    MODEL"``), the fix after it (``"use a tp that divides 32"``).
    """
    if tp == 1:
        return None
    kinds = spec.layer_kinds()
    # KV projections are divided by min(tp, num_kv_heads) (memest.estimate.sharding): of the layer
    # that holds them, and of the model for whole-stage sums
    headless_kv = any(t.split is Split.KV for layer, _ in kinds if not layer.attention.has_heads for t in layer.tensors)
    if headless_kv or (spec.num_kv_heads == 0 and any(t.split is Split.KV for t, _ in spec.tensors())):
        return (f"cannot split the key/value projections of {spec.name}, whose layers have no KV heads "
                "(num_kv_heads 0) to divide them by", "use --tp 1")
    for a, k in dict.fromkeys((layer.attention.num_heads, layer.attention.num_kv_heads)
                              for layer, _ in kinds if layer.attention.has_heads):
        if a % tp:
            return f"does not divide num_heads ({a}) of {spec.name}", f"use a tp that divides {a}"
        if tp > k and tp % k:
            return (f"is above num_kv_heads ({k}) of {spec.name} but not a multiple of it",
                    "KV heads cannot be replicated evenly: use a divisor or a multiple of it")
        if tp <= k and k % tp:
            return f"does not divide num_kv_heads ({k}) of {spec.name}", f"use a tp that divides {k}"
    return None


def workload_notes(spec: ModelSpec, workload: Workload) -> tuple[str, ...]:
    """What the user should know about a valid workload that its estimate does not show.

    A sequence beyond ``max_position_embeddings`` of a model with rotary or ALiBi positions runs (the
    memory is what is estimated) but the model was not trained at that length: it needs RoPE scaling
    (``rope_scaling``) or relies on extrapolation. Models with a learned position table cannot run it
    at all (:func:`validate` refuses).
    """
    limit = spec.max_position_embeddings
    if not limit or spec.learned_positions is not None:
        return ()
    if isinstance(workload, TrainingConfig):
        flag, length = "--seq-len", workload.seq_len
    elif workload.engine is Engine.HF and workload.max_model_len is not None:
        flag, length = "--max-model-len", workload.max_model_len
    else:
        return ()
    if length <= limit:
        return ()
    alibi = any(layer.attention.alibi for layer, _ in spec.layer_kinds())
    how = "relies on ALiBi extrapolation" if alibi else "needs RoPE scaling (rope_scaling) or extrapolation"
    return (f"{flag} {length:,} is beyond {spec.name}'s max_position_embeddings ({limit:,}): the model was not "
            f"trained on sequences this long and {how}; memory is estimated for the length asked",)


def _positive(flag: str, value: int) -> None:
    if value < 1:
        raise InputError(f"{flag} is {value}; it must be a positive integer")


def resolve_framework(t: TrainingConfig) -> Framework:
    """The framework ``auto`` stands for, from the precision recipe and the parallelism.

    - ``fsdp2`` precision: FSDP (torchtitan, FSDP2 mixed precision);
    - tp or pp > 1: FSDP with ZeRO stage 2-3 (torchtitan's FSDP + TP/PP; DeepSpeed's pipeline
      engine supports only stage 1), else Megatron-LM;
    - ``mixed`` / ``fp16``: DeepSpeed (its bf16 / fp16 modes keep fp32 master weights);
    - any other precision with ZeRO stage >= 1: FSDP (HF Trainer / accelerate ``--fsdp``);
    - more than one data-parallel rank: DDP;
    - else plain PyTorch in one process (HF Trainer, torchtune, litgpt).
    """
    if t.framework is not Framework.AUTO:
        return t.framework
    par = t.parallelism
    if t.precision is Precision.FSDP2:
        return Framework.FSDP
    if par.tp > 1 or par.pp > 1:
        return Framework.FSDP if par.zero_stage >= 2 else Framework.MEGATRON
    if t.precision in (Precision.MIXED, Precision.FP16):
        return Framework.DEEPSPEED
    if par.zero_stage >= 1:
        return Framework.FSDP
    if par.dp * par.cp > 1:
        return Framework.DDP
    return Framework.PYTORCH


_ATTN_VALUES = frozenset(e.value for e in AttnImplementation)
_LOSS_VALUES = frozenset(e.value for e in Loss)


def _validate_training(t: TrainingConfig) -> None:
    _positive("--micro-batch-size", t.micro_batch_size)
    _positive("--seq-len", t.seq_len)
    _positive("--grad-accum-steps", t.grad_accum_steps)
    if t.target_len is not None:
        _positive("--target-len", t.target_len)
    for flag, value, enum, values in (("--attn-implementation", t.attn_implementation, AttnImplementation, _ATTN_VALUES),
                                      ("--loss", t.loss, Loss, _LOSS_VALUES)):
        if value not in values:
            raise InputError(f"{flag} {value!r} is not one of {', '.join(e.value for e in enum)}")
    if t.method is not Method.FULL:
        _positive("--lora-rank", t.lora.rank)
        if not 0 <= t.lora.dropout < 1:
            raise InputError(f"--lora-dropout {t.lora.dropout} must be in [0, 1)")
    par = t.parallelism
    if par.cp > 1 and t.seq_len % (2 * par.cp):
        raise InputError(f"--seq-len {t.seq_len} must be divisible by 2 x cp ({2 * par.cp}) for context parallelism")
    if par.dp_shard is not None:
        group = par.dp * par.cp
        if par.dp_shard < 1 or group % par.dp_shard:
            raise InputError(f"--dp-shard {par.dp_shard} must divide the dp x cp ranks ({group}); use a divisor of {group}")
    if t.offload is not Offload.NONE and par.zero_stage == 0:
        raise InputError(f"--offload {t.offload.value} needs ZeRO (--zero-stage 1-3 or FSDP); add --zero-stage 3")
    if t.offload is Offload.PARAMS and par.zero_stage != 3:
        raise InputError("--offload params needs --zero-stage 3 (parameters are only offloaded when sharded)")
    if t.method is Method.QLORA and t.precision is Precision.FP32:
        raise InputError("--finetune qlora computes in 16-bit; use --precision bf16 or fp16 instead of fp32")
    _validate_framework(t, resolve_framework(t))


def _validate_training_model(spec: ModelSpec, t: TrainingConfig) -> None:
    """Checks that need the model: decoder length, sequence length, LoRA targets.

    Raises:
        InputError: ``--target-len`` on a model without a decoder stack of its own (not seq2seq);
            a length beyond a learned absolute position table (:attr:`ModelSpec.learned_positions`);
            ``--lora-targets`` naming no module or a module the model does not have; ``--lora-rank``
            above the hidden size.
    """
    if t.target_len is not None and spec.task != "seq2seq":
        raise InputError(f"--target-len applies to encoder-decoder models (T5); {spec.name} is {spec.task}: "
                         "drop --target-len and set the whole sequence with --seq-len")
    table = spec.learned_positions
    if table is not None:
        for flag, value in (("--seq-len", t.seq_len), ("--target-len", t.target_len)):
            if value is not None and value > table:
                raise InputError(f"{flag} {value} is more than the {table} positions of {spec.name}'s learned position "
                                 f"embeddings (no row for position {table}); use {flag} <= {table}")
    if t.method is not Method.FULL:
        _validate_lora_targets(spec, t.lora.targets)
        if t.lora.rank > spec.hidden_size:
            raise InputError(f"--lora-rank {t.lora.rank} is more than {spec.name}'s hidden size ({spec.hidden_size}): "
                             "the adapters would be larger than a full-rank update; use --lora-rank <= "
                             f"{spec.hidden_size} (typically 8-256)")


def lora_module_names(spec: ModelSpec) -> tuple[str, ...]:
    """Module names (the last part, ``q_proj``) that ``--lora-targets`` may name, in model order
    (:func:`memest.lora_targets.nameable_modules`)."""
    return lora_targets.nameable_modules(spec)


def _validate_lora_targets(spec: ModelSpec, targets: str) -> None:
    """``--lora-targets``: ``attention`` (needs attention projections), ``all-linear``, or module
    names of :func:`lora_module_names`.

    Raises:
        InputError: an empty list or item, an unknown name (PEFT raises "Target modules ... not
            found" when none matches), or ``attention`` on a model without attention projections.
    """
    known = lora_module_names(spec)
    choices = ", ".join(known) or "none"
    if targets == lora_targets.ALL_LINEAR:
        return
    if targets == lora_targets.ATTENTION:
        if not lora_targets.layer_modules(spec, targets):
            raise InputError(f"--lora-targets attention: {spec.name} has no attention projections; name its modules "
                             f"instead (it has {choices}) or use all-linear")
        return
    items = lora_targets.named_modules(targets)
    if not any(items) or not all(items):
        raise InputError(f"--lora-targets {targets!r} has an empty module name; write attention, all-linear, or names "
                         f"separated by commas from those of {spec.name}: {choices}")
    unknown = [x for x in items if x not in known]
    if unknown:
        raise InputError(f"--lora-targets names {', '.join(map(repr, unknown))}, not a module of {spec.name} (PEFT "
                         f"would raise 'Target modules not found'); use attention, all-linear or some of: {choices}")


def _validate_framework(t: TrainingConfig, fw: Framework) -> None:
    par = t.parallelism
    name = fw.value
    if fw is Framework.PYTORCH and par.world_size > 1:
        raise InputError(f"--framework pytorch runs one process, but the job has {par.world_size} devices; "
                         "use --framework ddp, fsdp, deepspeed or megatron")
    if fw in (Framework.PYTORCH, Framework.DDP) and par.zero_stage:
        raise InputError(f"--framework {name} does not shard states; drop --zero-stage {par.zero_stage} "
                         "or use --framework deepspeed / fsdp")
    if fw in (Framework.PYTORCH, Framework.DDP) and (par.tp > 1 or par.pp > 1):
        raise InputError(f"--framework {name} has no tensor or pipeline parallelism; use --framework megatron")
    if fw is Framework.MEGATRON and par.zero_stage > 1:
        raise InputError(f"--framework megatron shards only optimizer states (distributed optimizer = "
                         f"--zero-stage 1), not --zero-stage {par.zero_stage}")
    if fw is Framework.FSDP and par.zero_stage == 1:
        raise InputError("FSDP has no ZeRO-1; use --zero-stage 2 (SHARD_GRAD_OP) or 3 (FULL_SHARD)")
    if t.precision is Precision.FSDP2 and fw is not Framework.FSDP:
        raise InputError(f"--precision fsdp2 is FSDP's mixed precision; it cannot run under --framework {name}")
    if t.offload is not Offload.NONE and fw not in (Framework.DEEPSPEED, Framework.FSDP):
        raise InputError(f"--offload {t.offload.value} is a DeepSpeed / FSDP feature; use --framework deepspeed or fsdp")
    if t.offload is Offload.OPTIMIZER and fw is Framework.FSDP:
        raise InputError("FSDP offloads parameters, gradients and optimizer states together (CPUOffloadPolicy); "
                         "use --offload params, or --framework deepspeed for optimizer-only offload")


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
        if s.engine is Engine.VLLM and s.max_num_seqs is not None and s.max_num_batched_tokens < s.max_num_seqs:
            raise InputError(f"--max-num-batched-tokens {s.max_num_batched_tokens} is less than --max-num-seqs "
                             f"{s.max_num_seqs}; vLLM refuses it (SchedulerConfig: max_num_batched_tokens must be >= "
                             "max_num_seqs): raise it or lower --max-num-seqs")
    if s.max_num_seqs is not None:
        _positive("--max-num-seqs", s.max_num_seqs)
        if s.engine is Engine.VLLM and s.batch_size > s.max_num_seqs:
            raise InputError(f"--batch-size {s.batch_size} is more than --max-num-seqs {s.max_num_seqs}: vLLM runs at "
                             "most max_num_seqs requests at once (the rest queue); raise --max-num-seqs or lower "
                             "--batch-size")
    if s.prompt_len is not None:
        _positive("--prompt-len", s.prompt_len)
    if s.max_new_tokens is not None:
        _positive("--max-new-tokens", s.max_new_tokens)
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
    if s.engine in (Engine.LLAMACPP, Engine.OLLAMA):
        return  # GGUF file and cache types: memest.estimate.serving.llamacpp.engine.settings checks them
    if s.quantization not in QUANTIZATIONS:
        raise InputError(f"--quantization {s.quantization!r} is not one of {', '.join(QUANTIZATIONS)}")
    if s.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise InputError(f"--kv-cache-dtype {s.kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}")


def _validate_serving_model(spec: ModelSpec, s: ServingConfig) -> None:
    """Checks that need the model: the length, and for vLLM the dtype.

    Raises:
        InputError: for vLLM, ``--dtype fp16`` for a model type vLLM refuses it for (:data:`VLLM_NO_FLOAT16`);
        InputError: for vLLM, max_model_len beyond the model's max_position_embeddings (vLLM
            refuses it too, without ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``); for any engine, a length
            beyond a learned absolute position table (:attr:`ModelSpec.learned_positions`).
    """
    if s.engine is Engine.VLLM and s.dtype in ("fp16", "float16") and spec.model_type in VLLM_NO_FLOAT16:
        raise InputError(f"vLLM refuses --dtype {s.dtype} for model_type {spec.model_type!r} of {spec.name} (numerical "
                         "instability; vllm/config/model.py _FLOAT16_NOT_SUPPORTED_MODELS); use --dtype bf16 or fp32")
    limit = spec.max_position_embeddings
    if s.engine is Engine.VLLM and s.max_model_len is not None and limit is not None and s.max_model_len > limit:
        raise InputError(f"--max-model-len {s.max_model_len} is more than {spec.name}'s max_position_embeddings "
                         f"({limit}); use --max-model-len <= {limit}")
    table = spec.learned_positions
    total = s.max_model_len
    if total is None and s.prompt_len is not None:
        total = s.prompt_len + (s.max_new_tokens or 0)
    if table is not None and total is not None and total > table:
        raise InputError(f"a sequence of {total} tokens is more than the {table} positions of {spec.name}'s learned "
                         f"position embeddings (no row for position {table}); keep --max-model-len (or --prompt-len + "
                         f"--max-new-tokens) <= {table}")
