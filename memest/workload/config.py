"""What the user wants to run: training or serving settings, precision recipes, parallelism.

Every setting uses the ecosystem's word for it (the HF Trainer, DeepSpeed, Megatron-LM, vLLM). The
fields a user sets declare themselves as settings (:func:`memest.workload.declare.setting`: keyword,
help, scope, group, the default a user gets); :class:`JobSettings` holds the few that are not part of
a workload (the mode, the model source, the device).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from memest.devices import DEFAULT_DEVICE, Device
from memest.workload.declare import nested, setting


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
    """As adamw8bit, the states of tensors of >= 1e5 elements in CUDA managed memory, outside PyTorch's allocator:
    on the device while it has room, evicted to host RAM when it fills (HF ``paged_adamw_8bit``, torchtune and
    axolotl ``PagedAdamW8bit``)."""
    PAGED_ADAMW32BIT = "paged_adamw32bit"
    """bitsandbytes ``PagedAdamW`` / ``PagedAdamW32bit`` (HF ``paged_adamw_32bit``; litgpt's optimizer under
    ``--quantize``): two fp32 states whatever the parameters' dtype (``optim_bits=32``), those of tensors of
    >= 1e5 elements in CUDA managed memory as paged_adamw8bit's."""
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


class Stack(str, Enum):
    """The training stacks whose defaults memest knows (:mod:`memest.workload.stacks` says what each
    does by default, read from its source)."""

    HF_TRAINER = "hf-trainer"
    TRL = "trl"
    ACCELERATE = "accelerate"
    TORCHTUNE = "torchtune"
    TORCHTITAN = "torchtitan"
    AXOLOTL = "axolotl"
    LLAMAFACTORY = "llamafactory"
    UNSLOTH = "unsloth"
    LITGPT = "litgpt"
    DEEPSPEED = "deepspeed"
    MEGATRON = "megatron"
    NEMO = "nemo"
    FSDP = "fsdp"
    PYTORCH = "pytorch"


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
    SHIFT_COPY = "shift_copy"
    """As ``default``, with transformers before 4.49's ``ForCausalLMLoss`` (read at 4.48.1,
    ``loss/loss_utils.py``): ``shift_logits = logits[..., :-1, :].contiguous()`` copies the fp32 logits before
    the cross-entropy, beside the logits and their upcast (4.49.0 pads the labels and keeps no copy)."""
    CHUNKED = "chunked"
    """torchtune ``CEWithChunkedOutputLoss``: 8 chunks, each upcast separately; the fp32
    log-probabilities of all chunks are still kept for backward."""
    LITGPT_CHUNKED = "litgpt_chunked"
    """litgpt's LoRA / QLoRA ``fit()`` (``litgpt/finetune/lora.py`` at 00af8b0, lit-gpt 8641822 the same):
    ``model(input_ids, lm_head_chunk_size=128)`` returns the lm_head's 128-token chunks, Fabric's
    ``convert_output`` casts each to fp32 (``torch.get_default_dtype()``, lightning 2.4.0
    ``plugins/precision/half.py``, ``bitsandbytes.py``, ``amp.py``: outside the forward's dtype context) and
    ``chunked_cross_entropy`` (``litgpt/utils.py``) runs ``cross_entropy`` chunk by chunk on them."""
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


class LoraLibrary(str, Enum):
    """Who builds the LoRA adapters and, under QLoRA, the 4-bit base: their dtypes and the base's format.

    Each from its source: PEFT 0.13 ``tuners/lora/layer.py`` (``_move_adapter_to_device_of_base_layer``,
    then ``autocast_adapter_dtype=True`` casts 16-bit adapters to fp32) with transformers'
    ``BitsAndBytesConfig(bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)``, which quantizes
    the decoder's linears and keeps the output embeddings 16-bit (``integrations/bitsandbytes.py``
    ``get_keys_to_not_convert``); litgpt 0.4 ``litgpt/finetune/lora.py`` (``quantize: bnb.nf4``:
    Lightning Fabric ``BitsandbytesPrecision("nf4", bf16)`` replaces every ``torch.nn.Linear``, the
    ``lm_head`` included, by ``_NF4Linear`` = ``bnb.nn.Linear4bit(quant_type="nf4",
    compress_statistics=False)``: no double quantization; the model is built under the run's dtype, so
    ``lora_A`` / ``lora_B`` are bf16 under ``bf16-true``); torchtune 0.6 ``models/llama3_1/_component_builders.py``
    (``quantize_base=True``: every decoder linear a torchao ``NF4Tensor`` via ``FrozenNF4Linear`` /
    ``LoRALinear``, the output projection left 16-bit, "quantize_base is not applied to final
    output_proj"; adapters at the recipe's ``dtype``); NeMo 2 ``nemo/collections/llm/peft/lora.py`` (``LoRA``:
    each Megatron-core linear wrapped in ``LoRALinear`` with a ``ParallelLinearAdapter``, no 4-bit base).
    """

    PEFT = "peft"
    """PEFT adapters (fp32) over a transformers bitsandbytes NF4 base with double quantization."""
    LITGPT = "litgpt"
    """litgpt: adapters at the run's dtype; ``bnb.nf4`` on every linear, lm_head included, no double quant."""
    TORCHTUNE = "torchtune"
    """torchtune: adapters at the run's dtype; torchao ``NF4Tensor`` on every decoder linear."""
    UNSLOTH = "unsloth"
    """unsloth ``FastLanguageModel.get_peft_model``: PEFT's fp32 adapters over the transformers NF4 base (double
    quant, ``unsloth/models/llama.py`` ``bnb_4bit_use_double_quant=True``), each decoder layer run by unsloth's
    own autograd functions when ``lora_dropout`` is 0 (``patch_peft_model``: ``LoRA_QKV``, ``LoRA_W``,
    ``LoRA_MLP``, ``Fast_RMS_Layernorm``; :func:`memest.estimate.activations._unsloth_layer`)."""
    MEGATRON = "megatron"
    """NeMo 2 ``llm.peft.LoRA`` on Megatron-core layers (NeMo 8cfedd72, the commit
    :mod:`memest.workload.files.nemo` reads): ``LoRALinear`` adds a ``ParallelLinearAdapter`` (``linear_in`` r-wide,
    ``linear_out``; ``nemo/collections/llm/peft/utils.py``) beside each target linear, cast to the model's bf16
    (``self.bfloat16()`` under a bf16 config); the layer keeps Megatron's tensors, the adapters add their r-wide
    intermediates (:func:`memest.estimate.activations._megatron_adapters`). No 4-bit base."""


class Float8(str, Enum):
    """torchao float8 training (``torchao.float8.convert_to_float8_training``, torchtitan's ``float8`` converter):
    each decoder linear becomes a ``Float8Linear`` whose matmuls cast their inputs to float8 with dynamic scales
    (torchao 0.18.0 ``float8/config.py`` ``Float8LinearRecipeName``). What it saves for backward:
    :mod:`memest.estimate.activations`."""

    NONE = "none"
    """bf16 linears."""
    TENSORWISE = "tensorwise"
    """One fp32 scale per tensor (torchao's default recipe; the one FSDP2's float8 all-gather supports)."""
    ROWWISE = "rowwise"
    """One fp32 scale per row (axiswise; the backward recasts the high-precision input along the other axis)."""


class Engine(str, Enum):
    """Serving engines whose memory behaviour memest models."""

    VLLM = "vllm"
    """vLLM: weights + profiled activation peak + non-torch memory; the rest of
    ``gpu_memory_utilization`` x capacity becomes paged KV-cache blocks."""
    HF = "hf"
    """transformers ``generate``: a contiguous cache for batch x (prompt + new tokens)."""
    SGLANG = "sglang"
    """SGLang: weights, then what is left of ``mem_fraction_static`` x the free memory becomes a
    token-granular KV pool (``max_total_num_tokens``)."""
    TRTLLM = "trtllm"
    """TensorRT-LLM: ``kv_cache_free_gpu_mem_fraction`` of the memory free after weights and
    activations becomes KV blocks of ``tokens_per_block`` tokens."""
    LLAMACPP = "llama.cpp"
    """llama.cpp with a GGUF file: model buffers per device after the ``-ngl`` layer split, the rest
    in host RAM, an n_ctx KV cache at its cache type, compute buffers."""
    OLLAMA = "ollama"
    """Ollama: llama.cpp's memory with Ollama's defaults (num_ctx 4096, Q4_K_M library tags) and its
    own layer-placement estimate."""


GGUF_ENGINES = ("llama.cpp", "ollama")
"""The engines that serve GGUF files (their settings: ``n_gpu_layers``, ``n_batch``, ...)."""
WEIGHT_DTYPES = ("auto", "fp32", "fp16", "bf16", "float32", "float16", "bfloat16")
QUANTIZATIONS = ("none", "int8", "int4", "nf4", "fp4", "fp8", "gptq", "awq", "mxfp4")
KV_CACHE_DTYPES = ("auto", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2")
BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
VLLM_NO_FLOAT16 = frozenset({"gemma2", "gemma3", "gemma3_text", "glm4", "plamo2"})
"""model_types vLLM will not serve in float16 (``vllm/config/model.py`` ``_FLOAT16_NOT_SUPPORTED_MODELS``)."""
_RWKV_GGUF = frozenset({Engine.HF, Engine.LLAMACPP, Engine.OLLAMA})
ENGINES_SERVING: dict[str, frozenset[Engine]] = {
    "rwkv": frozenset({Engine.HF}),
    "rwkv5": frozenset({Engine.HF}),
    "rwkv6": _RWKV_GGUF,
    "rwkv7": _RWKV_GGUF,
    "t5": frozenset({Engine.HF, Engine.TRTLLM, Engine.LLAMACPP, Engine.OLLAMA}),
}
"""The engines memest lets serve a model_type, for the model_types some engine's source lacks (any other
model_type: every engine); an engine is left out only where its source shows it lacks the architecture. Sources,
at the versions memest models:

- vLLM: ``vllm/model_executor/models/registry.py`` (vllm-project/vllm commit 0002bff0, the 0.19 line):
  ``_TEXT_GENERATION_MODELS`` names no ``Rwkv*`` architecture (RWKV-4 ``RwkvForCausalLM``, ``Rwkv5/6/7ForCausalLM``).
- SGLang: ``python/sglang/srt/models/`` (sgl-project/sglang, 0.5 line) has no RWKV model file.
- TensorRT-LLM: its support matrix (``docs/source/reference/support-matrix.md``, NVIDIA/TensorRT-LLM commit
  03dad628) lists Mamba and RecurrentGemma among its recurrent models and no RWKV; it lists T5 / Flan-T5 / mT5 /
  ByT5 under ``examples/models/core/enc_dec``.
- llama.cpp: ``convert_hf_to_gguf.py`` (ggml-org/llama.cpp, after b4715) registers ``Rwkv6ForCausalLM``,
  ``RWKV6Qwen2ForCausalLM``, ``Rwkv7ForCausalLM`` / ``RWKV7ForCausalLM`` and ``RwkvHybridForCausalLM``
  (``MODEL_ARCH.RWKV6`` / ``RWKV7`` / ``ARWKV7``), not RWKV-4 (``RwkvForCausalLM``) nor RWKV-5; Ollama runs
  llama.cpp's loader for them.
- T5 (``t5``): vLLM's registry names one encoder-decoder model, ``WhisperForConditionalGeneration``, and lists
  the others under ``_PREVIOUSLY_SUPPORTED_MODELS`` ("encoder-decoder models except whisper have been removed
  for V0 deprecation"; T5 was never among them); SGLang has no T5 model file; llama.cpp's ``convert_hf_to_gguf.py``
  registers ``T5ForConditionalGeneration`` / ``MT5ForConditionalGeneration`` / ``UMT5ForConditionalGeneration`` /
  ``T5WithLMHeadModel``; TensorRT-LLM builds T5 with its encoder-decoder path (its support matrix, above).
- transformers (``--engine hf``): ``RwkvForCausalLM`` in the library, rwkv5 / rwkv6 / rwkv7 by their checkpoints'
  remote code (``auto_map``).
"""
"""vLLM's ``--block-size`` choices (``CacheConfig.block_size``)."""
ENGINE_VERSIONS: dict[str, tuple[str, ...]] = {"vllm": ("0.19", "0.6", "0.6.4", "0.2"), "hf": ("5", "4.34"),
                                               "sglang": ("0.5", "0.4"), "trtllm": ("1.1", "0.19"),
                                               "llama.cpp": ("b4715",), "ollama": ("0.11",)}
"""Engine versions whose memory arithmetic memest models, newest (the default) first.
vLLM 0.19 is the V1 engine; 0.6 the V0 engine after PR #10511 (Dec 2024); 0.6.4 the V0 engine before
it (non-torch memory measured device-wide after the profile run); 0.2 the V0 engine of
Dec 2023. transformers 5 computes logits for the last prompt token only; 4.34 for every prompt
token (and runs eager attention by default). SGLang 0.5 picks mem_fraction_static from the GPU's
memory; 0.4 (0.4.0-0.4.8) from tp alone (:mod:`memest.estimate.serving.sglang.budget`). TensorRT-LLM
1.1 is the PyTorch backend, 0.19 a TensorRT engine on the C++ runtime; both size the KV cache the
same way (:mod:`memest.estimate.serving.trtllm.budget`)."""
ENGINE_VENDORS: dict[str, frozenset[str]] = {
    "vllm": frozenset({"nvidia", "amd", "intel", "google", "aws"}),
    "sglang": frozenset({"nvidia", "amd"}),
    "trtllm": frozenset({"nvidia"}),
    "llama.cpp": frozenset({"nvidia", "amd", "apple", "intel"}),
    "ollama": frozenset({"nvidia", "amd", "apple", "intel"}),
    "deepspeed": frozenset({"nvidia", "amd", "intel"}),
    "megatron": frozenset({"nvidia", "amd"}),
    "fsdp": frozenset({"nvidia", "amd", "intel", "google"}),
    "ddp": frozenset({"nvidia", "amd", "intel", "google"}),
    "pytorch": frozenset({"nvidia", "amd", "intel", "google", "apple"}),
}
"""Accelerator vendors each serving engine and training framework runs on
(:attr:`memest.devices.Device.vendor`); software not listed (the hf engine: transformers on any torch
device) runs on every device, and a custom size runs anywhere. Serving: vLLM has CUDA, ROCm, Intel
XPU / Gaudi, TPU and Neuron back ends, no Apple Metal; SGLang CUDA and ROCm; TensorRT-LLM NVIDIA
only; llama.cpp (and Ollama, built on it) CUDA, HIP, Metal, Vulkan and SYCL back ends, none for TPU
or Neuron (github.com/ggml-org/llama.cpp docs/build.md; docs.ollama.com/gpu). Training: DeepSpeed's
accelerators are CUDA, ROCm, Intel XPU and Gaudi (deepspeed.ai/tutorials/accelerator-setup-guide);
Megatron-LM CUDA and ROCm (rocm.docs.amd.com "Train a model with Megatron-LM"); FSDP and DDP also
run on TPU through torch_xla (docs.pytorch.org/xla: DDP, FSDP); one plain PyTorch process also on
Apple's MPS (docs.pytorch.org/docs/stable/notes/mps.html)."""


def runs_on(engine: str, vendor: str) -> bool:
    """Whether the serving engine or training framework ``engine`` (its value) runs on a device of ``vendor``."""
    vendors = ENGINE_VENDORS.get(engine)
    return vendors is None or vendor in vendors or vendor == "custom"


FLOAT8_TRAINING_ARCHS: frozenset[str] = frozenset({"ada", "hopper", "blackwell", "cdna3", "cdna4"})
"""Device architectures (:attr:`memest.devices.Device.arch`) torchao float8 training runs on: CUDA compute
capability 8.9 and later (Ada, Hopper, Blackwell) or AMD MI300 and later. torchao 0.18.0 runs the float8
matmuls with ``torch._scaled_mm`` (``float8/float8_ops.py``), which needs sm_89+ or MI300+, and its checks read
``is_sm_at_least_89() or is_MI300()`` (``torchao/utils.py``); torchtitan's ``Float8LinearConverter``
(``components/quantization/float8.py``) raises "float8 is only supported on SM89 or later" without
``has_cuda_capability(8, 9)`` (the emulated float8 it allows for tests is not modelled)."""

UNSLOTH_VENDORS: frozenset[str] = frozenset({"nvidia", "amd", "intel"})
UNSLOTH_NOT_ARCHS: frozenset[str] = frozenset({"gaudi"})
"""unsloth's devices: ``unsloth/device_type.py`` ``get_device_type`` returns ``cuda`` (NVIDIA), ``hip`` (AMD ROCm)
or ``xpu`` (Intel GPUs) and else raises ``NotImplementedError("Unsloth currently only works on NVIDIA, AMD and
Intel GPUs.")``: no Apple MPS, TPU, Neuron, nor Intel Gaudi (HPU, not XPU)."""

BITSANDBYTES_NOT_VENDORS: frozenset[str] = frozenset({"apple", "google", "aws"})
"""Vendors bitsandbytes' NF4 (the 4-bit base of every QLoRA but torchtune's, which is torchao's NF4) does not run
on: bitsandbytes 0.42 (the version memest models, :mod:`memest.estimate.training.qlora_base`) is CUDA only; its
multi-backend docs (huggingface.co/docs/bitsandbytes ``non_cuda_backends``, stable v0.48.1) list ROCm, Intel
CPU and XPU, and say "Apple Silicon support is planned"; no TPU or Neuron backend."""


BF16_LEAST_CAPABILITY = 80
"""The CUDA compute capability bf16 training needs (Ampere 8.0; :attr:`memest.devices.Device.compute_capability`):
transformers ``training_args.py`` raises "Your setup doesn't support bf16/gpu" for ``bf16=True`` when
``is_torch_bf16_gpu_available()`` is False, and the other stacks' bf16 runs on the same bf16 tensor cores
(vLLM's rule for serving, :data:`CAPABILITY_NEEDS`, is the same 8.0)."""

_BF16_RECIPES = frozenset({Precision.MIXED, Precision.AMP, Precision.FSDP2, Precision.BF16})


def computes_bf16(t: TrainingConfig) -> bool:
    """Whether the job's recipe computes in bf16: ``mixed``, ``bf16`` and ``amp`` / ``fsdp2`` at ``half_dtype``
    bf16 (``fp16`` and ``fp32`` do not)."""
    return t.precision in _BF16_RECIPES and (t.half_dtype == "bf16" or t.precision in (Precision.MIXED, Precision.BF16))


def lacks_bf16(arch: str, vendor: str) -> bool:
    """Whether an NVIDIA device of ``arch`` is below :data:`BF16_LEAST_CAPABILITY` (Volta, Turing)."""
    from memest.devices import COMPUTE_CAPABILITY

    cc = COMPUTE_CAPABILITY.get(arch)
    return vendor == "nvidia" and cc is not None and cc < BF16_LEAST_CAPABILITY


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

    tp: int = setting(1, group="parallelism", unset=None, planned="all", describe="changed",
                      help="Tensor-parallel degree (serving default: {gpus} / (pp x dp)).")
    pp: int = setting(1, group="parallelism", planned="all", describe="changed", help="Pipeline-parallel degree.")
    dp: int = setting(1, group="parallelism", unset=None, planned="training", describe="changed",
                      help="Data-parallel degree: replicas of the model (training default: {gpus} / (tp x pp x cp); "
                           "serving default: 1).")
    cp: int = setting(1, group="parallelism", scope="training", describe="changed", help="Context-parallel degree.",
                      what="context parallelism of training", fix="for serving split the model with {tp} / {pp}")
    ep: int = setting(1, group="parallelism", planned="all", describe="changed", help="Expert-parallel degree (MoE).")
    zero_stage: int = setting(0, group="training", scope="training", bounds=(0, 3), planned="all",
                              describe="changed",
                              help="DeepSpeed ZeRO stage over the data-parallel devices (FSDP FULL_SHARD = 3, "
                                   "SHARD_GRAD_OP = 2).",
                              what="DeepSpeed ZeRO sharding of training states",
                              fix="serving keeps whole weights on each replica: drop it")
    sequence_parallel: bool = setting(False, group="parallelism", scope="training", planned="all",
                                      help="Megatron sequence parallelism with {tp}.",
                                      what="Megatron sequence parallelism of training activations")
    dp_shard: int | None = setting(None, group="parallelism", scope="training",
                                   help="Ranks ZeRO / FSDP states are sharded over (default: all dp x cp ranks).",
                                   what="ranks that shard ZeRO / FSDP states")

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

    rank: int = setting(16, group="training", scope="training", methods=("lora", "qlora"), help="LoRA rank r.",
                        what="LoRA adapters", describe="always")
    targets: str = setting("attention", group="training", scope="training", methods=("lora", "qlora"),
                           what="LoRA adapters", describe="always", unset=None, items=str,
                           help="(default: the {stack}'s) attention (every attention projection: q, k, v, o; PEFT's target_modules=None picks "
                                "q_proj,v_proj for llama-style models), all-linear, or module names (q_proj,v_proj).")
    dropout: float = setting(0.0, group="training", scope="training", methods=("lora", "qlora"), what="LoRA adapters",
                             help="PEFT lora_dropout (each adapted linear keeps a mask and a copy of its input).")


@dataclass(frozen=True, slots=True, kw_only=True)
class DeepSpeedBuckets:
    """DeepSpeed's bucket sizes, in elements, as a DeepSpeed JSON sets them (no flag: they come from the file),
    at DeepSpeed's defaults when it does not (``deepspeed/runtime/zero/config.py`` v0.19.5).

    Attributes:
        reduce_bucket_size: ``zero_optimization.reduce_bucket_size`` (default 5e8): the gradient reduce bucket.
        prefetch_bucket_size: ``zero_optimization.stage3_prefetch_bucket_size`` (default 5e7): what ZeRO-3
            gathers ahead.
        param_persistence_threshold: ``zero_optimization.stage3_param_persistence_threshold`` (default 1e5):
            ZeRO-3 keeps parameters of at most this many elements whole on every rank.
        overlap_comm: ``zero_optimization.overlap_comm``; None: not set, DeepSpeed's default, true at ZeRO-3 and
            false below (``overlap_comm_valid``: ``self.overlap_comm = self.stage == ZeroStageEnum.weights``).
        contiguous_gradients: ``zero_optimization.contiguous_gradients`` (default true).
        optimizer_nvme: ``zero_optimization.offload_optimizer.device`` is ``nvme`` (ZeRO-Infinity: at ZeRO-3 the
            optimizer swaps its states to NVMe; below it they stay in host RAM, as with ``cpu``).
        sub_group_size: ``zero_optimization.sub_group_size`` (default 1e9): ZeRO-3's optimizer sub-groups, the
            unit it swaps.
        optimizer_buffer_count: ``zero_optimization.offload_optimizer.buffer_count`` (default 4): the pinned
            swap buffers of the NVMe optimizer swapper.
    """

    reduce_bucket_size: int = 500_000_000
    prefetch_bucket_size: int = 50_000_000
    param_persistence_threshold: int = 100_000
    overlap_comm: bool | None = None
    contiguous_gradients: bool = True
    optimizer_nvme: bool = False
    sub_group_size: int = 1_000_000_000
    optimizer_buffer_count: int = 4


DEEPSPEED_BUCKET_KEYS = {"reduce_bucket_size": "zero_optimization.reduce_bucket_size",
                         "prefetch_bucket_size": "zero_optimization.stage3_prefetch_bucket_size",
                         "param_persistence_threshold": "zero_optimization.stage3_param_persistence_threshold",
                         "overlap_comm": "zero_optimization.overlap_comm",
                         "contiguous_gradients": "zero_optimization.contiguous_gradients",
                         "optimizer_nvme": "zero_optimization.offload_optimizer.device",
                         "sub_group_size": "zero_optimization.sub_group_size",
                         "optimizer_buffer_count": "zero_optimization.offload_optimizer.buffer_count"}
""":class:`DeepSpeedBuckets` field -> the DeepSpeed JSON key that sets it."""
DEEPSPEED_SWITCHES = frozenset({"overlap_comm", "contiguous_gradients"})
"""The :data:`DEEPSPEED_BUCKET_KEYS` that are true or false, not a number of elements."""


CUSTOM_SHARDED_LAYERS = ("tok_embeddings", "output")
"""The torchtune module names ``custom_sharded_layers`` takes (``models/llama3/_component_builders.py``: the
decoder's ``tok_embeddings`` and ``output``; its layers are FSDP units already)."""


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
        optimizer_in_bwd: torchtune's optimizer in backward: a parameter's step runs (and its gradient is
            freed) in the hook that fires once backward has accumulated its gradient.
        activation_offloading: The activation checkpoints live in host RAM and come back for their
            layer's backward (torchtune ``OffloadActivations``, unsloth's offloaded checkpointing).
        parallelism: TP/PP/DP/CP/EP degrees and the ZeRO stage.
        stack: The training stack whose defaults filled the settings not given (None: a workload
            built directly, at the fields' own defaults).
        stack_assumed: Why the stack was assumed when none was named ("" when it was named).
        stack_filled: The settings the stack's defaults filled, not given by the user
            (:data:`memest.workload.stacks.FILLED`; :func:`memest.workload.stacks.restack` takes them again
            from another stack's defaults).
        config_notes: What the config files left open (DeepSpeed ``"auto"``), for the assumptions.
        config_read: What was read from which config file, line and key (``zero_stage 3 from ds.json:12
            zero_optimization.stage``), for ``explain``.
        deepspeed_buckets: DeepSpeed's bucket sizes as the job's DeepSpeed JSON sets them (``"auto"`` filled as
            the HF integration fills it: :func:`memest.workload.resolve.deepspeed_buckets`).
        framework: Who runs the step (gradient buffers, reduce buckets); ``auto`` picks one.
        set_grads_to_none: ``optimizer.zero_grad(set_to_none=True)`` (the PyTorch >= 2.0 default):
            gradients are freed between steps. False keeps them allocated (PyTorch 1.x default,
            HF Trainer before torch 2.0). Only the ``pytorch`` and ``ddp`` frameworks free them.
        target_len: Decoder tokens per sequence of an encoder-decoder model (T5); None = seq_len.
        prepare_kbit_training: QLoRA only: how the script prepared the NF4 model (:class:`KbitPrep`):
            ``trl`` (SFTTrainer, the default), ``peft`` (``prepare_model_for_kbit_training`` alone) or
            ``none``.
        lora_library: LoRA and QLoRA: who builds the adapters and the 4-bit base (:class:`LoraLibrary`).
        torch_compile: The layers (and the loss) run under torch.compile (torchtune ``compile: True``:
            ``training.compile_model`` and ``compile_loss``; torchtitan ``[compile] enable`` / ``training.compile``):
            inductor's partitioner decides what the layers save (:mod:`memest.estimate.activations`), and the
            compiled chunked cross-entropy keeps each chunk's 16-bit logits.
        float8: torchao float8 training of the decoder's linears (:class:`Float8`).
        float8_all_gather: FSDP2 all-gathers the float8 linears' weights in float8
            (torchao ``Float8LinearConfig.enable_fsdp_float8_all_gather``; tensorwise only).
        custom_sharded_layers: torchtune ``custom_sharded_layers``: the modules FSDP2 wraps as units of their own
            besides each decoder layer, comma-separated torchtune module names: ``tok_embeddings`` (the token
            embedding), ``output`` (the untied output projection); "" leaves both in the root unit.
        fsdp_flat_params: FSDP runs as FSDP1 ``FullyShardedDataParallel`` with the decoder layers as units (one
            ``FlatParameter`` per unit, Lightning Fabric ``FSDPStrategy``), not FSDP2's per-parameter shards: the
            root unit's gradient is assembled whole at the end of backward, and a LoRA layer's FlatParameter,
            frozen base and adapters together, takes the whole layer's gradient
            (:mod:`memest.estimate.training.fsdp`; peft's wrap policy, which makes the adapters units of their
            own, is not this).
        no_sync_accumulation: The micro-batches before the last accumulate their gradients inside the
            framework's ``no_sync`` (Lightning Fabric ``no_backward_sync``): under FSDP every unit's gradient
            stays unsharded until the last micro-batch's reduce-scatter.
        half_dtype: The 16-bit dtype an ``amp`` or ``fsdp2`` recipe computes in: ``bf16``, or ``fp16`` (the HF
            Trainer's ``fp16=True`` without DeepSpeed, Lightning ``"16-mixed"``, accelerate ``mixed_precision:
            fp16``: autocast / compute copies in fp16 with a GradScaler, whose one fp32 scale is not counted).
            The same 2 bytes either way; it names the recipe and decides whether a device without bf16 runs it
            (:func:`computes_bf16`).
    """

    method: Method = Method.FULL
    micro_batch_size: int = setting(1, group="training", scope="training", planned="all", describe="always",
                                    help="Sequences per device per forward.", what="sequences per device per forward",
                                    fix="for serving use {batch_size} (concurrent sequences)")
    seq_len: int = setting(2048, group="training", scope="training", unset=None, describe="always",
                           help="Tokens per training sequence (default: min(2048, max_position_embeddings)).",
                           what="tokens per training sequence", fix="for serving use {max_model_len}")
    grad_accum_steps: int = setting(1, group="training", scope="training", planned="all",
                                    help="Micro-batches per optimizer step.",
                                    what="micro-batches per optimizer step")
    precision: Precision = setting(Precision.MIXED, group="training", scope="training", describe="always", unset=None,
                                   help="Precision recipe: mixed (bf16 + fp32 master), fp16, amp (fp32 params + "
                                        "autocast), fsdp2, bf16 (pure), fp32 (default: the {stack}'s bf16 recipe).",
                                   what="the training precision recipe", fix="for serving use {dtype}")
    optimizer: Optimizer = setting(Optimizer.ADAMW, group="training", scope="training", planned="all", unset=None,
                                   describe="always", help="Optimizer (default: the {stack}'s).",
                                   what="the optimizer's states", fix="serving has no optimizer: drop it")
    recompute: Recompute = setting(Recompute.NONE, group="training", scope="training", planned="all", describe="always",
                                   unset=None, help="Activation checkpointing (default: the {stack}'s).", what="activation checkpointing in backward")
    attn_implementation: AttnImplementation = setting(
        AttnImplementation.SDPA, group="training", scope="training", unset=None,
        help="sdpa, flash_attention_2 or eager (eager stores the s x s scores) (default: the {stack}'s).",
        what="the attention kernel's saved activations")
    loss: Loss = setting(Loss.DEFAULT, group="training", scope="training", planned="all", what="the training loss's logits",
                         unset=None, help="default (full logits, fp32 log-softmax), shift_copy (as default, plus the fp32 "
                                          "shifted copy of transformers < 4.49), chunked (torchtune chunked CE) or "
                                          "fused (Liger / Cut Cross-Entropy) (default: the {stack}'s).")
    lora: LoraConfig = nested("lora_", LoraConfig)
    offload: Offload = setting(Offload.NONE, group="training", scope="training", planned="all", describe="changed",
                               help="CPU offload of optimizer states (or also params, ZeRO-3).",
                               what="CPU offload of training states")
    optimizer_in_bwd: bool = setting(False, group="training", scope="training", methods=("full",), unset=None,
                                     off="no_optimizer_in_bwd", describe="changed",
                                     what="the optimizer step run inside backward",
                                     help="torchtune optimizer_in_bwd: each parameter steps and frees its gradient "
                                          "as soon as backward has made it (full training, {grad_accum_steps} 1) "
                                          "(default: the {stack}'s).")
    activation_offloading: bool = setting(False, group="training", scope="training", unset=None,
                                          off="no_activation_offloading", describe="changed",
                                          what="activation checkpoints kept in host RAM",
                                          help="Checkpoints in host RAM, copied back for each layer's backward "
                                               "(torchtune enable_activation_offloading, trl activation_offloading, "
                                               "unsloth's gradient checkpointing; needs {recompute} full) (default: "
                                               "the {stack}'s).")
    parallelism: Parallelism = field(default_factory=Parallelism)
    stack: Stack | None = setting(None, group="training", scope="training", what="the training stack's defaults",
                                  planned="training",
                                  help="The training stack whose defaults apply: hf-trainer, trl, accelerate, "
                                       "torchtune, torchtitan, axolotl, llamafactory, unsloth, litgpt, deepspeed, "
                                       "megatron, nemo, fsdp, pytorch (default: hf-trainer on one device or without "
                                       "sharding; deepspeed with {zero_stage}; accelerate with {fsdp}; megatron with "
                                       "{tp} / {pp}). Flags given override its defaults.")
    stack_assumed: str = ""
    stack_filled: tuple[str, ...] = ()
    half_dtype: str = "bf16"
    config_notes: tuple[str, ...] = ()
    config_read: tuple[str, ...] = ()
    deepspeed_buckets: DeepSpeedBuckets = field(default_factory=DeepSpeedBuckets)
    framework: Framework = setting(Framework.AUTO, group="training", scope="training",
                                   what="who runs the training step",
                                   help="Who runs the step: pytorch (one process: HF Trainer, torchtune, litgpt), ddp, "
                                        "deepspeed, megatron, fsdp; auto picks from {precision} and parallelism.")
    set_grads_to_none: bool = setting(True, group="training", scope="training", off="keep_grads",
                                      what="gradients between steps",
                                      help="zero_grad(set_to_none=True) frees gradients between steps (PyTorch >= "
                                           "2.0); {keep_grads} for torch 1.x.")
    target_len: int | None = setting(None, group="training", scope="training",
                                     what="decoder tokens per training sequence",
                                     fix="for serving use {max_model_len}",
                                     help="Decoder tokens per sequence of an encoder-decoder model "
                                          "(default: {seq_len}).")
    prepare_kbit_training: KbitPrep = setting(
        KbitPrep.TRL, group="training", scope="training", methods=("qlora",), unset=None, what="QLoRA's preparation "
                                                                                               "of the NF4 model",
        help="QLoRA: how the script prepares the NF4 model. trl (default: trl SFTTrainer with bf16=True: norms fp32, "
             "embeddings and lm_head bf16, fp32 residual stream and layer checkpoints, autocast), peft (PEFT "
             "prepare_model_for_kbit_training alone: embeddings, norms, lm_head fp32, no autocast) or none (no "
             "preparation: 16-bit non-quantized weights and residual stream).")

    torch_compile: bool = setting(
        False, group="training", scope="training", describe="changed", what="torch.compile's saved tensors",
        help="torch.compile the layers and the loss (torchtune compile=True, torchtitan compile.enable): "
             "inductor recomputes the norms' fp32 copies and the activation's output in backward, and the compiled "
             "chunked cross-entropy keeps 16-bit logits.")
    float8: Float8 = setting(
        Float8.NONE, group="training", scope="training", methods=("full",), describe="changed",
        what="float8 linears' saved tensors",
        help="torchao float8 training of the linears (torchtitan model.converters float8): none, tensorwise or "
             "rowwise; with {torch_compile} the norms' outputs and the down projection's input are recomputed "
             "for the backward's float8 casts.")
    float8_all_gather: bool = setting(
        False, group="training", scope="training", methods=("full",), describe="changed",
        what="float8 FSDP all-gathers",
        help="FSDP2 all-gathers the float8 linears' weights in float8 (torchao enable_fsdp_float8_all_gather; "
             "needs {float8} tensorwise and {zero_stage} 3).")
    custom_sharded_layers: str = setting(
        "", group="training", scope="training", describe="changed", items=str, what="FSDP2 units",
        help="torchtune custom_sharded_layers: tok_embeddings, output (comma-separated) as FSDP2 units of their "
             "own, each gathered only while it computes (FSDP only; default: both in the root unit, gathered all "
             "step).")
    fsdp_flat_params: bool = setting(
        False, group="training", scope="training", describe="changed", what="FSDP1's flat-parameter gradients",
        help="FSDP is FSDP1 FullyShardedDataParallel with the decoder layers as units (Lightning Fabric "
             "FSDPStrategy): one flat parameter per unit, the root unit's gradient made whole at the end of backward, "
             "a LoRA layer's gradient covering its frozen base (FSDP only; default: FSDP2).")
    no_sync_accumulation: bool = setting(
        False, group="training", scope="training", describe="changed", what="gradients kept unsharded while accumulating",
        help="Gradient accumulation inside no_sync (Lightning Fabric no_backward_sync): under FSDP every unit's "
             "gradient stays unsharded until the last micro-batch's reduce-scatter (needs {grad_accum_steps} > 1).")
    lora_library: LoraLibrary = setting(
        LoraLibrary.PEFT, group="training", scope="training", methods=("lora", "qlora"), unset=None,
        describe="always", what="the LoRA adapters' dtype and QLoRA's 4-bit base",
        help="Who builds the adapters and the QLoRA base (default: the {stack}'s): peft (fp32 adapters; NF4 with "
             "double quant, lm_head 16-bit), litgpt (adapters at the run's dtype; quantize bnb.nf4 on every "
             "linear, lm_head too, no double quant), torchtune (adapters at the run's dtype; torchao NF4) or unsloth "
             "(as peft, the layers run by unsloth's fused LoRA kernels when the LoRA dropout is 0), megatron (NeMo's "
             "adapters on Megatron-core layers, at the run's dtype; no 4-bit base).")

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
        batch_size: Concurrent sequences that must each reach max_model_len, over all the job's
            data-parallel replicas (:attr:`replica_batch_size` each).
        engine: Whose memory behaviour to model.
        gpu_memory_utilization: The share of device memory vLLM may use.
        max_num_batched_tokens: Tokens per forward (vLLM's profiling run); None = vLLM's default.
        max_num_seqs: Sequences per forward (vLLM; sizes the sampler's logits in profiling);
            None = the engine's default.
        block_size: Tokens per paged KV block.
        enforce_eager: No CUDA graphs (vLLM ``--enforce-eager``).
        mem_fraction_static: SGLang ``--mem-fraction-static`` (weights + KV pool as a share of the
            free memory); None = SGLang's default for the version, device and tp.
        max_running_requests: SGLang ``--max-running-requests``; None = SGLang's default.
        chunked_prefill_size: SGLang ``--chunked-prefill-size`` (sizes 0.5's default
            mem_fraction_static); None = SGLang's default for the device.
        page_size: SGLang ``--page-size`` (tokens per KV page; ``ServerArgs.page_size`` defaults to 1).
        kv_cache_free_gpu_mem_fraction: TensorRT-LLM ``KvCacheConfig.free_gpu_memory_fraction``.
        max_batch_size: TensorRT-LLM ``max_batch_size``; None = its default (2048).
        max_num_tokens: TensorRT-LLM ``max_num_tokens`` (tokens per forward); None = 8192.
        tokens_per_block: TensorRT-LLM ``KvCacheConfig.tokens_per_block`` (32 in the 0.19 and 1.x logs
            of ../shared/validation/engines.json; a power of two, docs/source/advanced/kv-cache-reuse.md).
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
            from ``gguf``; replaces the analytic file-type layout.
        checkpoint_params: Parameters per stored dtype of the checkpoint (safetensors header names:
            ``BF16``, ``F32``, ``I8``, ``U8``, ``F8_E4M3``, ...), from ``exact_weights``; scales
            the analytic weight bytes to the checkpoint's exact total.
        parallelism: TP/PP degrees (and dp replicas).
    """

    dtype: str = setting("auto", group="serving", scope="serving", describe="always",
                         help="Weight dtype: auto (the checkpoint's), bf16, fp16, fp32.",
                         what="weight dtype of the served model", fix="for training use {precision}")
    quantization: str = setting("none", group="serving", scope="serving", planned="all", describe="changed",
                                help="Weight quantization applied to an unquantized model: none (keep the checkpoint's "
                                     "quantization_config), int8 (bitsandbytes LLM.int8), nf4 (bitsandbytes, double "
                                     "quant), fp4 (bitsandbytes load_in_4bit defaults), int4/awq, gptq, fp8 (vLLM "
                                     "online), mxfp4; llama.cpp / Ollama: the GGUF file type (q4_k_m, q8_0, q5_k_m, "
                                     "q6_k, q4_0, iq4_xs, f16, bf16, ...).",
                                what="weight quantization of the served model",
                                fix="QLoRA's base is NF4 by definition ({finetune} qlora: bitsandbytes NF4, double "
                                    "quant): drop {quantization}")
    kv_cache_dtype: str = setting("auto", group="serving", scope="serving", planned="all", describe="changed",
                                  help="KV-cache dtype: auto (the weight dtype), fp8; llama.cpp -ctk/-ctv: f16, q8_0, "
                                       "q4_0, ...", what="KV-cache element type",
                                  fix="training keeps no KV cache: drop it")
    max_model_len: int | None = setting(None, group="serving", scope="serving", describe="always",
                                        help="Longest sequence (prompt + output) in tokens (default: the model's "
                                             "max_position_embeddings; llama.cpp / Ollama: n_ctx / num_ctx per "
                                             "sequence, default 4096).",
                                        what="longest prompt + output", fix="for training use {seq_len}")
    batch_size: int = setting(1, group="serving", scope="serving", describe="always",
                              help="Concurrent sequences, each up to max_model_len.",
                              what="concurrent sequences", fix="for training use {micro_batch_size}")
    engine: Engine = setting(Engine.VLLM, group="serving", scope="serving", describe="always",
                             what="the serving engine modelled",
                             help="Serving engine to model: vllm (paged KV, start-up budget), sglang "
                                  "(mem_fraction_static, token pool; {max_model_len} is its --context-length), trtllm "
                                  "(TensorRT-LLM: free_gpu_memory_fraction, KV blocks; {max_model_len} is its "
                                  "max_seq_len), hf (transformers generate), llama.cpp or ollama (GGUF files).")
    engine_version: str | None = setting(None, group="serving", scope="serving", what="the serving engine's version",
                                         help="Engine version whose memory arithmetic to model: vllm 0.19 (V1), 0.6, "
                                              "0.2; sglang 0.5, 0.4; trtllm 1.1 (PyTorch backend), 0.19 (TensorRT "
                                              "engine); hf 5, 4.34; llama.cpp b4715; ollama 0.11 (default: the newest).")
    prompt_len: int | None = setting(None, group="serving", scope="serving", engine="hf",
                                     what="prompt tokens of generate",
                                     fix="for training use {seq_len}",
                                     help="hf: prompt tokens per sequence (default: max_model_len - max_new_tokens).")
    max_new_tokens: int | None = setting(None, group="serving", scope="serving", engine="hf", what="tokens generated",
                                         fix="for training use {seq_len}",
                                         help="hf: tokens generated per sequence.")
    gpu_memory_utilization: float = setting(0.9, group="serving", scope="serving", engine="vllm",
                                            help="Share of device memory vLLM may use.",
                                            what="vLLM's share of device memory", fix="for training use {headroom}")
    max_num_batched_tokens: int | None = setting(None, group="serving", scope="serving", engine="vllm",
                                                 what="vLLM's tokens per forward",
                                                 help="Tokens per forward in vLLM's profiling run (default: "
                                                      "vLLM's for the device).")
    max_num_seqs: int | None = setting(None, group="serving", scope="serving", engine="vllm",
                                       what="vLLM's sequences per forward",
                                       help="Sequences per forward in vLLM's profiling run.")
    block_size: int = setting(16, group="serving", scope="serving", engine="vllm", help="Tokens per paged KV block.",
                              what="vLLM's paged-KV block")
    enforce_eager: bool = setting(False, group="serving", scope="serving", engine="vllm", help="No CUDA graphs (vLLM).",
                                  what="vLLM without CUDA graphs")
    # SGLang (--engine sglang)
    mem_fraction_static: float | None = setting(
        None, group="serving", scope="serving", engine="sglang", what="SGLang's static share of memory",
        fix="for training use {headroom}",
        help="SGLang: weights + KV pool as a share of the free memory (default: SGLang's for the version, device "
             "and tp).")
    max_running_requests: int | None = setting(
        None, group="serving", scope="serving", engine="sglang", what="SGLang's requests at once",
        help="SGLang: requests run at once (default: SGLang's, from the pool).")
    chunked_prefill_size: int | None = setting(
        None, group="serving", scope="serving", engine="sglang", what="SGLang's prefill chunk",
        help="SGLang: prefill tokens per chunk (sizes 0.5's default mem_fraction_static).")
    page_size: int = setting(1, group="serving", scope="serving", engine="sglang", what="SGLang's KV page",
                             help="SGLang: tokens per KV page.")
    # TensorRT-LLM (--engine trtllm)
    kv_cache_free_gpu_mem_fraction: float = setting(
        0.9, group="serving", scope="serving", engine="trtllm", what="TensorRT-LLM's KV share of free memory",
        fix="for training use {headroom}",
        help="TensorRT-LLM: share of the memory free after weights and activations given to the KV cache.")
    max_batch_size: int | None = setting(
        None, group="serving", scope="serving", engine="trtllm", what="TensorRT-LLM's requests at once",
        fix="for training use {micro_batch_size}", help="TensorRT-LLM: requests at once (default 2048).")
    max_num_tokens: int | None = setting(
        None, group="serving", scope="serving", engine="trtllm", what="TensorRT-LLM's tokens per forward",
        help="TensorRT-LLM: tokens per forward (default 8192).")
    tokens_per_block: int = setting(32, group="serving", scope="serving", engine="trtllm",
                                    what="TensorRT-LLM's KV block", help="TensorRT-LLM: tokens per KV block.")
    n_gpu_layers: int | None = setting(None, group="serving", scope="serving", engine=GGUF_ENGINES, describe="changed",
                                       what="llama.cpp's layers on the GPU",
                                       help="llama.cpp / Ollama -ngl: layers (of num_layers + 1, the output layer "
                                            "last) on the GPU; the rest stay in host RAM (default: all for llama.cpp, "
                                            "as many as fit for Ollama).")
    n_batch: int | None = setting(None, group="serving", scope="serving", engine=GGUF_ENGINES,
                                  what="llama.cpp's logical batch",
                                  help="llama.cpp -b: logical batch (default 2048; Ollama 512).")
    n_ubatch: int | None = setting(None, group="serving", scope="serving", engine=GGUF_ENGINES, describe="changed",
                                   what="llama.cpp's physical batch",
                                   help="llama.cpp -ub: physical batch, the tokens the compute buffer is sized for "
                                        "(default 512).")
    flash_attn: bool = setting(False, group="serving", scope="serving", engine=GGUF_ENGINES, describe="changed",
                               what="llama.cpp's flash attention",
                               help="llama.cpp -fa (needed for a quantized V cache; pads n_ctx to 256).")
    tensor_split: tuple[float, ...] = setting((), group="serving", scope="serving", engine=GGUF_ENGINES, unset=None,
                                              type=str, items=float, what="llama.cpp's layer split over GPUs",
                                              help="llama.cpp -ts: each GPU's share of the layers, e.g. 10,6 "
                                                   "(default: by device memory).")
    gguf_tensors: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
    checkpoint_params: tuple[tuple[str, int], ...] = ()
    config_notes: tuple[str, ...] = ()
    """What the config files left open or memest does not model, for the assumptions."""
    config_read: tuple[str, ...] = ()
    """What was read from which config file, line and key, for ``explain``."""
    parallelism: Parallelism = field(default_factory=Parallelism)

    @property
    def mode(self) -> str:
        """Always ``serve``."""
        return "serve"

    @property
    def replica_batch_size(self) -> int:
        """The sequences one data-parallel replica serves at once: ``ceil(batch_size / dp)``.

        ``batch_size`` counts the job's concurrent sequences; ``parallelism.dp`` replicas each run their
        own engine with its own KV pool (vLLM ``--data-parallel-size``: "each DP rank is deployed as a
        separate 'core engine' process", ``docs/serving/data_parallel_deployment.md``; its scheduler
        settings, ``--max-num-seqs`` among them, are each engine's), and the front end spreads the requests
        over them, so the busiest replica holds the ceiling of the share.
        """
        return -(-self.batch_size // self.parallelism.dp)

    def layout_words(self, parallelism: Parallelism | None = None) -> str | None:
        """How the engine spreads the job over its devices, in its own words, where that is not tensor /
        pipeline parallelism (None: the tp / pp degrees say it). llama.cpp splits whole layers over its
        GPUs (``--split-mode layer``, its default; ``common/arg.cpp``), each GPU's share by ``--tensor-split``,
        else by free memory (``llama_model_load``: ``ggml_backend_dev_memory``); Ollama places the layers
        itself. memest counts those GPUs as ``parallelism.tp`` (any count, no head split).

        Args:
            parallelism: Another layout of the same job (a planned setup's), else the job's.
        """
        if self.engine.value not in GGUF_ENGINES:
            return None
        gpus = (parallelism or self.parallelism).world_size
        if gpus == 1:
            return None
        split = f"tensor-split {','.join(f'{x:g}' for x in self.tensor_split)}" if self.tensor_split else None
        if self.engine is Engine.OLLAMA:
            return f"layers split over {gpus} GPUs" + (f", {split}" if split else " (Ollama's placement)")
        return f"split-mode layer over {gpus} GPUs, " + (split or "tensor-split by free memory")

    def replace(self, **changes: Any) -> ServingConfig:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


Workload = TrainingConfig | ServingConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSettings:
    """The settings that are not part of a workload: the mode, where the model comes from, the device.

    A declaration only (:func:`memest.workload.settings.settings` reads its fields); callers pass these
    settings by keyword, and :func:`memest.workload.resolve.resolve` turns them into a workload.

    Attributes:
        config: Config files whose settings fill those not given (:mod:`memest.workload.files`).
        train: Full training (every weight trained).
        finetune: Fine-tuning with adapters (LoRA or QLoRA).
        serve: Serving (the default when no mode is given).
        trust_remote_code: Allow the model's own Python code (only from the folder or repo named).
        revision: Hub revision of config.json.
        exact_weights: Serving: read the checkpoint's safetensors headers for the exact weight total.
        gpu: The accelerator; None = the default device (and list every device that fits).
        gpus: Devices in the job.
        fsdp: PyTorch FSDP sharding strategy: sets the framework and the ZeRO stage.
        allow_stack_change: Recommendations may leave the job's stack (and then name the new one).
        headroom: Share of device memory to keep free.
        use_calibration: Apply the runtime constants the user's calibration records imply.
    """

    config: tuple[str, ...] = setting((), group="model", unset=None, type=list[str] | None,
                                      help="A config file whose settings to use: DeepSpeed JSON, accelerate "
                                           "config, TrainingArguments / trl, axolotl, LLaMA-Factory or torchtune "
                                           "recipe, torchtitan TOML, vLLM serve YAML or 'vllm serve' line, "
                                           "Megatron-LM launch script (repeatable; flags given override them; a "
                                           "recipe names the model).")
    train: bool = setting(False, group="model", help="Estimate full training (all weights trained).")
    finetune: Method | None = setting(None, group="model", help="Fine-tune with adapters: lora or qlora.",
                                      choices=("lora", "qlora"), fix="to train every parameter use {train}")
    serve: bool = setting(False, group="model", help="Estimate inference serving (the default).")
    trust_remote_code: bool = setting(False, group="model", help="Allow the model's own Python code from the Hub when "
                                                                 "its family has no analytic adapter.")
    revision: str | None = setting(None, group="model", help="Hub revision (branch, tag or commit) of config.json.")
    gguf: str | None = setting(None, group="serving", scope="serving", engine=GGUF_ENGINES, what="the GGUF file served",
                               help="A .gguf file whose header gives the exact tensor types and sizes (metadata "
                                    "only; needs memest[gguf]).")
    exact_weights: bool = setting(False, group="serving", scope="serving",
                                  what="the checkpoint's stored weight bytes for serving",
                                  help="Read the checkpoint's safetensors headers on the Hub (parameters per stored "
                                       "dtype, no weights downloaded) and use their exact total.")
    gpu: str | None = setting(None, group="parallelism", help=f"Accelerator (see 'memest gpus'), or a size as written: "
                                                             f"32GB = 32 x 10^9 B, 32GiB = 32 x 2^30 B (a catalog "
                                                             f"device's nominal 'GB' is read as GiB, as its driver "
                                                             f"reports it) (default: {DEFAULT_DEVICE}, and list every "
                                                             f"device that fits).")
    gpus: int = setting(1, group="parallelism", help="Devices in the job (tp x pp x cp x dp).")
    fsdp: FsdpStrategy | None = setting(None, group="parallelism", scope="training",
                                        what="PyTorch FSDP sharding of training states",
                                        help="PyTorch FSDP sharding strategy (sets {framework} fsdp and the ZeRO "
                                             "stage; hybrid_shard shards within a node).")
    allow_stack_change: bool = setting(False, group="training", scope="training",
                                       what="fixes outside the training stack",
                                       help="Also offer fixes the job's {stack} cannot run (tensor / pipeline "
                                            "parallelism outside Megatron-LM, NeMo, torchtitan); they name the "
                                            "stack that runs them.")
    headroom: float = setting(0.10, group="parallelism", help="Share of device memory to keep free (not applied to "
                                                              "vLLM: {gpu_memory_utilization} sets its share).")
    use_calibration: bool = setting(False, group="parallelism",
                                    help="Apply the runtime constants (CUDA context, allocator slack) that your "
                                         "calibration records in ./calibrate/results imply for the device's family "
                                         "(see 'memest calibrate --report'), in place of memest's.")


def resolve_framework(t: TrainingConfig) -> Framework:
    """The framework ``auto`` stands for without a stack, from the precision recipe and the
    parallelism (a job's stack decides first: :func:`memest.workload.stacks.resolve_framework`).

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


def software(w: Workload) -> str:
    """What runs the job, as :data:`ENGINE_VENDORS` names it: the serving engine, or the training
    framework (``auto`` resolved: :func:`resolve_framework`)."""
    return w.engine.value if isinstance(w, ServingConfig) else resolve_framework(w).value


CAPABILITY_NEEDS: dict[tuple[str, str, str], tuple[int, str, str]] = {
    ("vllm", "dtype", "bfloat16"): (80, "Ampere (compute capability 8.0) or newer",
                                    "vLLM vllm/platforms/cuda.py check_if_supports_dtype (0.19 line; earlier "
                                    "vllm/worker/worker.py _check_if_gpu_supports_dtype): 'Bfloat16 is only supported "
                                    "on GPUs with compute capability of at least 8.0'"),
    ("vllm", "quantization", "fp8"): (80, "Ampere (compute capability 8.0, Marlin weight-only fp8) or newer",
                                      "vllm/model_executor/layers/quantization/fp8.py Fp8Config.get_min_capability "
                                      "returns 80 (vllm-project/vllm commit 0071b24b)"),
    ("vllm", "quantization", "awq"): (75, "Turing (compute capability 7.5) or newer",
                                      "vllm/model_executor/layers/quantization/awq.py AWQConfig.get_min_capability "
                                      "returns 75, 'The AWQ kernel only supports Turing or newer GPUs' "
                                      "(vllm-project/vllm commit 000796ac)"),
    ("trtllm", "quantization", "fp8"): (89, "Ada (SM89), Hopper or Blackwell",
                                        "TensorRT-LLM docs/source/reference/support-matrix.md (NVIDIA/TensorRT-LLM "
                                        "commit 03dad628): Ampere SM80/86 runs FP32, FP16, BF16, INT8, INT4; FP8 from "
                                        "Ada SM89"),
}
"""Serving settings an engine runs only from a CUDA compute capability on, by (engine value, ServingConfig
field, value): (the least capability as :attr:`memest.devices.Device.compute_capability` writes it, the devices
that run it, the engine source that refuses it)."""


def capability_refusal(w: Workload, device: Device) -> tuple[str, str] | None:
    """``(field, why)`` for the first setting of :data:`CAPABILITY_NEEDS` that ``w`` asks and ``device``'s
    compute capability is below, or None (a training job, a device off NVIDIA, or nothing below)."""
    cc = device.compute_capability
    if cc is None or not isinstance(w, ServingConfig):
        return None
    from memest.dtypes import canonical

    asked = {"dtype": canonical(w.dtype) if w.dtype != "auto" else "auto", "quantization": w.quantization}
    for (engine, name, value), (least, runs, source) in CAPABILITY_NEEDS.items():
        if engine == w.engine.value and asked.get(name) == value and cc < least:
            return name, (f"{engine} does not run {name} {value} on {device.name} ({device.arch}, compute "
                          f"capability {cc / 10:.1f}): it needs {runs} ({source})")
    return None
