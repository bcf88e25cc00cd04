"""The workload flags shared by ``memest hf``, ``calibrate``, ``plan`` and ``sweep``.

Each flag is declared once (help text, default, choices) in :data:`WORKLOAD_OPTIONS`.
:func:`workload_options` adds them to a typer command's signature and hands the command a built
:class:`JobOptions` instead, so every command parses the same flags the same way.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any

import typer

from memest.devices import DEFAULT_DEVICE, Device, get_device
from memest.errors import InputError
from memest.spec import ModelSpec
from memest.workload import (
    AttnImplementation,
    Engine,
    Framework,
    FsdpStrategy,
    KbitPrep,
    LoraConfig,
    Loss,
    Method,
    Offload,
    Optimizer,
    Parallelism,
    Precision,
    Recompute,
    ServingConfig,
    TrainingConfig,
    Workload,
    divisors,
    tp_head_problem,
)

TRAIN = "Training (--train / --finetune)"
SERVE = "Serving (--serve)"
PAR = "Parallelism and devices"
MODEL = "Model"


def _opt(*decls: str, help: str, panel: str, **kw: Any) -> Any:
    return typer.Option(*decls, help=help, rich_help_panel=panel, **kw)


# name -> (annotation, default)
WORKLOAD_OPTIONS: dict[str, tuple[Any, Any]] = {
    "train": (Annotated[bool, _opt("--train", help="Estimate full training (all weights trained).", panel=MODEL)], False),
    "finetune": (Annotated[Method | None, _opt("--finetune", help="Fine-tune with adapters: lora or qlora.", panel=MODEL,
                                                case_sensitive=False)], None),
    "serve": (Annotated[bool, _opt("--serve", help="Estimate inference serving (the default).", panel=MODEL)], False),
    "trust_remote_code": (Annotated[bool, _opt("--trust-remote-code", help="Allow the model's own Python code from the Hub "
                                                "when its family has no analytic adapter.", panel=MODEL)], False),
    "revision": (Annotated[str | None, _opt("--revision", help="Hub revision (branch, tag or commit) of config.json.",
                                            panel=MODEL)], None),
    # training
    "micro_batch_size": (Annotated[int, _opt("--micro-batch-size", help="Sequences per device per forward.", panel=TRAIN)], 1),
    "seq_len": (Annotated[int | None, _opt("--seq-len", help="Tokens per training sequence (default: min(2048, "
                                          "max_position_embeddings)).", panel=TRAIN)], None),
    "grad_accum_steps": (Annotated[int, _opt("--grad-accum-steps", help="Micro-batches per optimizer step.", panel=TRAIN)], 1),
    "precision": (Annotated[Precision, _opt("--precision", help="Precision recipe: mixed (bf16 + fp32 master), fp16, amp "
                                            "(fp32 params + autocast), fsdp2, bf16 (pure), fp32.", panel=TRAIN,
                                            case_sensitive=False)], Precision.MIXED),
    "optimizer": (Annotated[Optimizer, _opt("--optimizer", help="Optimizer.", panel=TRAIN, case_sensitive=False)], Optimizer.ADAMW),
    "recompute": (Annotated[Recompute, _opt("--recompute", help="Activation checkpointing.", panel=TRAIN,
                                            case_sensitive=False)], Recompute.NONE),
    "zero_stage": (Annotated[int, _opt("--zero-stage", help="DeepSpeed ZeRO stage over the data-parallel devices "
                                       "(FSDP FULL_SHARD = 3, SHARD_GRAD_OP = 2).", panel=TRAIN, min=0, max=3)], 0),
    "offload": (Annotated[Offload, _opt("--offload", help="CPU offload of optimizer states (or also params, ZeRO-3).",
                                        panel=TRAIN, case_sensitive=False)], Offload.NONE),
    "lora_rank": (Annotated[int, _opt("--lora-rank", help="LoRA rank r.", panel=TRAIN)], 16),
    "lora_targets": (Annotated[str, _opt("--lora-targets", help="attention (every attention projection: q, k, v, o; "
                                         "PEFT's target_modules=None picks q_proj,v_proj for llama-style models), "
                                         "all-linear, or module names (q_proj,v_proj).", panel=TRAIN)], "attention"),
    "attn_implementation": (Annotated[AttnImplementation, _opt("--attn-implementation", help="sdpa, flash_attention_2 "
                                                               "or eager (eager stores the s x s scores).", panel=TRAIN,
                                                               case_sensitive=False)], AttnImplementation.SDPA),
    "loss": (Annotated[Loss, _opt("--loss", help="default (full logits, fp32 log-softmax), chunked (torchtune "
                                  "chunked CE) or fused (Liger / Cut Cross-Entropy).", panel=TRAIN, case_sensitive=False)],
             Loss.DEFAULT),
    "lora_dropout": (Annotated[float, _opt("--lora-dropout", help="PEFT lora_dropout (each adapted linear keeps a mask "
                                           "and a copy of its input).", panel=TRAIN)], 0.0),
    "target_len": (Annotated[int | None, _opt("--target-len", help="Decoder tokens per sequence of an encoder-decoder "
                                              "model (default: --seq-len).", panel=TRAIN)], None),
    "framework": (Annotated[Framework, _opt("--framework", help="Who runs the step: pytorch (one process: HF Trainer, "
                                            "torchtune, litgpt), ddp, deepspeed, megatron, fsdp; auto picks from "
                                            "--precision and parallelism.", panel=TRAIN, case_sensitive=False)],
                  Framework.AUTO),
    "fsdp": (Annotated[FsdpStrategy | None, _opt("--fsdp", help="PyTorch FSDP sharding strategy (sets --framework fsdp "
                                                 "and the ZeRO stage; hybrid_shard shards within a node).", panel=PAR,
                                                 case_sensitive=False)], None),
    "set_grads_to_none": (Annotated[bool, _opt("--set-grads-to-none/--keep-grads", help="zero_grad(set_to_none=True) "
                                               "frees gradients between steps (PyTorch >= 2.0); --keep-grads for "
                                               "torch 1.x.", panel=TRAIN)], True),
    "prepare_kbit_training": (Annotated[KbitPrep | None, _opt(
        "--prepare-kbit-training", help="QLoRA: how the script prepares the NF4 model. trl (default: trl SFTTrainer "
        "with bf16=True: norms fp32, embeddings and lm_head bf16, fp32 residual stream and layer checkpoints, "
        "autocast), peft (PEFT prepare_model_for_kbit_training alone: embeddings, norms, lm_head fp32, no autocast) "
        "or none (no preparation: 16-bit non-quantized weights and residual stream).", panel=TRAIN,
        case_sensitive=False)], None),
    # serving
    "batch_size": (Annotated[int, _opt("--batch-size", help="Concurrent sequences, each up to max_model_len.", panel=SERVE)], 1),
    "max_model_len": (Annotated[int | None, _opt("--max-model-len", help="Longest sequence (prompt + output) in tokens "
                                                 "(default: the model's max_position_embeddings).", panel=SERVE)], None),
    "dtype": (Annotated[str, _opt("--dtype", help="Weight dtype: auto (the checkpoint's), bf16, fp16, fp32.", panel=SERVE)], "auto"),
    "quantization": (Annotated[str, _opt("--quantization", help="Weight quantization applied to an unquantized model: "
                                         "none (keep the checkpoint's quantization_config), int8 (bitsandbytes LLM.int8), "
                                         "nf4 (bitsandbytes, double quant), fp4 (bitsandbytes load_in_4bit defaults), "
                                         "int4/awq, gptq, fp8 (vLLM online), mxfp4; llama.cpp / Ollama: the GGUF file "
                                         "type (q4_k_m, q8_0, q5_k_m, q6_k, q4_0, iq4_xs, f16, bf16, ...).", panel=SERVE)], "none"),
    "exact_weights": (Annotated[bool, _opt("--exact-weights", help="Read the checkpoint's safetensors headers on the Hub "
                                           "(parameters per stored dtype, no weights downloaded) and use their exact "
                                           "total.", panel=SERVE)], False),
    "kv_cache_dtype": (Annotated[str, _opt("--kv-cache-dtype", help="KV-cache dtype: auto (the weight dtype), fp8; "
                                           "llama.cpp -ctk/-ctv: f16, q8_0, q4_0, ...",
                                           panel=SERVE)], "auto"),
    "engine": (Annotated[Engine, _opt("--engine", help="Serving engine to model: vllm (paged KV, start-up budget), hf "
                                      "(transformers generate), llama.cpp or ollama (GGUF; --max-model-len is "
                                      "n_ctx / num_ctx, default 4096).", panel=SERVE, case_sensitive=False)], Engine.VLLM),
    "engine_version": (Annotated[str | None, _opt("--engine-version", help="Engine version whose memory arithmetic to "
                                                  "model: vllm 0.19 (V1), 0.6, 0.2; hf 5, 4.34 (default: the newest).",
                                                  panel=SERVE)], None),
    "prompt_len": (Annotated[int | None, _opt("--prompt-len", help="hf: prompt tokens per sequence (default: "
                                              "max_model_len - max_new_tokens).", panel=SERVE)], None),
    "max_new_tokens": (Annotated[int | None, _opt("--max-new-tokens", help="hf: tokens generated per sequence.",
                                                  panel=SERVE)], None),
    "gpu_memory_utilization": (Annotated[float, _opt("--gpu-memory-utilization", help="Share of device memory vLLM may use.",
                                                     panel=SERVE)], 0.9),
    "max_num_batched_tokens": (Annotated[int | None, _opt("--max-num-batched-tokens", help="Tokens per forward in vLLM's "
                                                          "profiling run (default: vLLM's for the device).", panel=SERVE)], None),
    "max_num_seqs": (Annotated[int | None, _opt("--max-num-seqs", help="Sequences per forward in vLLM's profiling run.",
                                                panel=SERVE)], None),
    "block_size": (Annotated[int, _opt("--block-size", help="Tokens per paged KV block.", panel=SERVE)], 16),
    "enforce_eager": (Annotated[bool, _opt("--enforce-eager", help="No CUDA graphs (vLLM).", panel=SERVE)], False),
    "n_gpu_layers": (Annotated[int | None, _opt("--n-gpu-layers", "--ngl", help="llama.cpp / Ollama -ngl: layers (of "
                                                "num_layers + 1, the output layer last) on the GPU; the rest stay in "
                                                "host RAM (default: all for llama.cpp, as many as fit for Ollama).",
                                                panel=SERVE)], None),
    "n_batch": (Annotated[int | None, _opt("--n-batch", help="llama.cpp -b: logical batch (default 2048; Ollama 512).",
                                           panel=SERVE)], None),
    "n_ubatch": (Annotated[int | None, _opt("--n-ubatch", help="llama.cpp -ub: physical batch, the tokens the compute "
                                            "buffer is sized for (default 512).", panel=SERVE)], None),
    "flash_attn": (Annotated[bool, _opt("--flash-attn", help="llama.cpp -fa (needed for a quantized V cache; pads "
                                        "n_ctx to 256).", panel=SERVE)], False),
    "tensor_split": (Annotated[str | None, _opt("--tensor-split", help="llama.cpp -ts: each GPU's share of the layers, "
                                                "e.g. 10,6 (default: by device memory).", panel=SERVE)], None),
    "gguf": (Annotated[str | None, _opt("--gguf", help="A .gguf file whose header gives the exact tensor types and "
                                        "sizes (metadata only; needs memest[gguf]).", panel=SERVE)], None),
    # parallelism and devices
    "gpu": (Annotated[str | None, _opt("--gpu", help=f"Accelerator (see 'memest gpus') (default: {DEFAULT_DEVICE}, and list "
                                       "every device that fits).", panel=PAR)], None),
    "gpus": (Annotated[int, _opt("--gpus", help="Devices in the job (tp x pp x cp x dp).", panel=PAR)], 1),
    "dp": (Annotated[int | None, _opt("--dp", help="Data-parallel degree: replicas of the model (training default: "
                                      "--gpus / (tp x pp x cp); serving default: 1).", panel=PAR)], None),
    "dp_shard": (Annotated[int | None, _opt("--dp-shard", help="Ranks ZeRO / FSDP states are sharded over (default: "
                                            "all dp x cp ranks).", panel=PAR)], None),
    "tp": (Annotated[int | None, _opt("--tp", help="Tensor-parallel degree (serving default: --gpus / (pp x dp)).",
                                      panel=PAR)], None),
    "pp": (Annotated[int, _opt("--pp", help="Pipeline-parallel degree.", panel=PAR)], 1),
    "cp": (Annotated[int, _opt("--cp", help="Context-parallel degree.", panel=PAR)], 1),
    "ep": (Annotated[int, _opt("--ep", help="Expert-parallel degree (MoE).", panel=PAR)], 1),
    "sequence_parallel": (Annotated[bool, _opt("--sequence-parallel", help="Megatron sequence parallelism with --tp.",
                                               panel=PAR)], False),
    "headroom": (Annotated[float, _opt("--headroom", help="Share of device memory to keep free (not applied to vLLM: "
                                       "--gpu-memory-utilization sets its share).", panel=PAR)], 0.10),
}


SERVING_ONLY: dict[str, tuple[str, str]] = {
    "batch_size": ("concurrent sequences", "for training use --micro-batch-size"),
    "max_model_len": ("longest prompt + output", "for training use --seq-len"),
    "dtype": ("weight dtype of the served model", "for training use --precision"),
    "quantization": ("weight quantization of the served model", "QLoRA's base is NF4 by definition (--finetune qlora: "
                     "bitsandbytes NF4, double quant): drop --quantization"),
    "exact_weights": ("the checkpoint's stored weight bytes for serving", "drop it"),
    "kv_cache_dtype": ("KV-cache element type", "training keeps no KV cache: drop it"),
    "engine": ("the serving engine modelled", "drop it"),
    "engine_version": ("the serving engine's version", "drop it"),
    "prompt_len": ("prompt tokens of generate", "for training use --seq-len"),
    "max_new_tokens": ("tokens generated", "for training use --seq-len"),
    "gpu_memory_utilization": ("vLLM's share of device memory", "for training use --headroom"),
    "max_num_batched_tokens": ("vLLM's tokens per forward", "drop it"),
    "max_num_seqs": ("vLLM's sequences per forward", "drop it"),
    "block_size": ("vLLM's paged-KV block", "drop it"),
    "enforce_eager": ("vLLM without CUDA graphs", "drop it"),
    "n_gpu_layers": ("llama.cpp's layers on the GPU", "drop it"),
    "n_batch": ("llama.cpp's logical batch", "drop it"),
    "n_ubatch": ("llama.cpp's physical batch", "drop it"),
    "flash_attn": ("llama.cpp's flash attention", "drop it"),
    "tensor_split": ("llama.cpp's layer split over GPUs", "drop it"),
    "gguf": ("the GGUF file served", "drop it"),
}
"""Workload flags that only serving reads: option name -> (what it sets, the fix when training);
the message reads "--batch-size is a serving flag (concurrent sequences); for training use
--micro-batch-size"."""

TRAINING_ONLY: dict[str, tuple[str, str]] = {
    "micro_batch_size": ("sequences per device per forward", "for serving use --batch-size (concurrent sequences)"),
    "seq_len": ("tokens per training sequence", "for serving use --max-model-len"),
    "grad_accum_steps": ("micro-batches per optimizer step", "drop it"),
    "precision": ("the training precision recipe", "for serving use --dtype"),
    "optimizer": ("the optimizer's states", "serving has no optimizer: drop it"),
    "recompute": ("activation checkpointing in backward", "drop it"),
    "zero_stage": ("DeepSpeed ZeRO sharding of training states",
                   "serving keeps whole weights on each replica: drop it"),
    "offload": ("CPU offload of training states", "drop it"),
    "lora_rank": ("LoRA adapters", "drop it"),
    "lora_targets": ("LoRA adapters", "drop it"),
    "lora_dropout": ("LoRA adapters", "drop it"),
    "attn_implementation": ("the attention kernel's saved activations", "drop it"),
    "loss": ("the training loss's logits", "drop it"),
    "target_len": ("decoder tokens per training sequence", "for serving use --max-model-len"),
    "framework": ("who runs the training step", "drop it"),
    "fsdp": ("PyTorch FSDP sharding of training states", "drop it"),
    "set_grads_to_none": ("gradients between steps", "drop --keep-grads"),
    "prepare_kbit_training": ("QLoRA's preparation of the NF4 model", "drop it"),
    "dp_shard": ("ranks that shard ZeRO / FSDP states", "drop it"),
    "cp": ("context parallelism of training", "for serving split the model with --tp / --pp"),
    "sequence_parallel": ("Megatron sequence parallelism of training activations", "drop it"),
}
"""Workload flags that only training and fine-tuning read (same message form as :data:`SERVING_ONLY`)."""

METHOD_ONLY: dict[str, tuple[Method, ...]] = {
    "lora_rank": (Method.LORA, Method.QLORA),
    "lora_targets": (Method.LORA, Method.QLORA),
    "lora_dropout": (Method.LORA, Method.QLORA),
    "prepare_kbit_training": (Method.QLORA,),
}
"""Training flags that only some methods read (--train trains every weight: no adapters)."""

_GGUF_ENGINES = (Engine.LLAMACPP, Engine.OLLAMA)

ENGINE_ONLY: dict[str, Engine | tuple[Engine, ...]] = {
    "gpu_memory_utilization": Engine.VLLM,
    "max_num_batched_tokens": Engine.VLLM,
    "max_num_seqs": Engine.VLLM,
    "block_size": Engine.VLLM,
    "enforce_eager": Engine.VLLM,
    "prompt_len": Engine.HF,
    "max_new_tokens": Engine.HF,
    "n_gpu_layers": _GGUF_ENGINES,
    "n_batch": _GGUF_ENGINES,
    "n_ubatch": _GGUF_ENGINES,
    "flash_attn": _GGUF_ENGINES,
    "tensor_split": _GGUF_ENGINES,
    "gguf": _GGUF_ENGINES,
}
"""Serving flags that only one engine reads (vLLM sizes a paged pool; transformers generate a
contiguous cache of prompt + new tokens)."""


def _option_decls(name: str) -> tuple[str, ...]:
    """The declarations of a workload option (``("--set-grads-to-none/--keep-grads",)``)."""
    from typing import get_args

    info = get_args(WORKLOAD_OPTIONS[name][0])[1]
    return tuple(d for d in (info.default, *(info.param_decls or ())) if isinstance(d, str) and d.startswith("--"))


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _given(values: dict[str, Any], name: str) -> bool:
    """True when a workload option differs from its default (was given on the command line)."""
    return values[name] != WORKLOAD_OPTIONS[name][1]


def _check_scope(values: dict[str, Any], mode: str) -> None:
    """Refuse flags the chosen mode, method or engine would ignore (:data:`SERVING_ONLY`,
    :data:`TRAINING_ONLY`, :data:`METHOD_ONLY`, :data:`ENGINE_ONLY`).

    Raises:
        InputError: such a flag differs from its default.
    """
    defaulted = not (values["train"] or values["finetune"] or values["serve"])
    training = mode != "serve"
    wrong = TRAINING_ONLY if not training else SERVING_ONLY
    for name in WORKLOAD_OPTIONS:
        if not _given(values, name):
            continue
        flag = _flag(name)
        if name in wrong:
            kind = "training" if wrong is TRAINING_ONLY else "serving"
            what, fix = wrong[name]
            if defaulted:  # serving because no mode was given
                fix = f"add --train or --finetune (serving is the default), or {fix}"
            raise InputError(f"{flag} is a {kind} flag ({what}); {fix}")
        if training and name in METHOD_ONLY:
            method = values["finetune"] or Method.FULL
            if method not in METHOD_ONLY[name]:
                needs = " or ".join(f"--finetune {m.value}" for m in METHOD_ONLY[name])
                asked = "--train" if method is Method.FULL else f"--finetune {method.value}"
                raise InputError(f"{flag} applies to {needs}, not {asked}; drop it")
        if not training and name in ENGINE_ONLY:
            engine = Engine(values["engine"])
            scope = ENGINE_ONLY[name]
            engines = scope if isinstance(scope, tuple) else (scope,)
            if engine not in engines:
                other = " / --engine ".join(e.value for e in engines)
                raise InputError(f"{flag} is a --engine {other} flag; --engine {engine.value} does not read it: "
                                 f"drop it or pass --engine {other}")


MAX_INT_FLAG = 2**31 - 1
"""The largest value an integer workload flag takes (sequences, tokens, devices, ranks): larger ones
describe no real job and would make the divisor searches of the planner slow."""


@dataclass(frozen=True, slots=True)
class JobOptions:
    """The parsed workload flags, before the model is known."""

    values: dict[str, Any]

    @property
    def trust_remote_code(self) -> bool:
        """--trust-remote-code."""
        return bool(self.values["trust_remote_code"])

    @property
    def revision(self) -> str | None:
        """--revision."""
        return self.values["revision"]

    @property
    def gpu(self) -> str | None:
        """The --gpu name as given, or None when it was not.

        Raises:
            InputError: an empty name (``--gpu ""``).
        """
        name = self.values["gpu"]
        if name is not None and not name.strip():
            raise InputError(f"--gpu {name!r} is empty; pass a device name such as H100 (see 'memest gpus'), or drop "
                             f"--gpu for the default {DEFAULT_DEVICE}")
        return name

    @property
    def device(self) -> Device:
        """The --gpu device, or the default.

        Raises:
            InputError: an empty name.
            UnknownDeviceError: unknown name.
        """
        return get_device(self.gpu or DEFAULT_DEVICE)

    @property
    def device_given(self) -> bool:
        """True when --gpu was passed."""
        return self.gpu is not None

    @property
    def headroom(self) -> float:
        """--headroom, checked.

        Raises:
            InputError: not in [0, 1).
        """
        h = self.values["headroom"]
        if not 0 <= h < 1:
            raise InputError(f"--headroom {h} must be in [0, 1), e.g. 0.1 for 10%")
        return float(h)

    def given_flags(self) -> dict[str, str]:
        """The workload flags that differ from their defaults, as ``memest hf`` would take them:
        flag -> value (an empty value for a switch such as ``--train`` or ``--keep-grads``), in
        :data:`WORKLOAD_OPTIONS` order."""
        out: dict[str, str] = {}
        for name in WORKLOAD_OPTIONS:
            value = self.values[name]
            if value is None or not _given(self.values, name):
                continue
            decls = _option_decls(name)
            if isinstance(value, bool):
                on, _, off = decls[0].partition("/")
                if value or off:
                    out[on if value else off] = ""
                continue
            out[decls[0]] = str(value.value if isinstance(value, Enum) else value)
        return out

    def _training(self, spec: ModelSpec) -> TrainingConfig:
        """The training workload (``--train`` / ``--finetune``)."""
        v = self.values
        par, framework = _training_parallelism(v, self.device)
        default_len = min(2048, spec.max_position_embeddings or 2048)
        return TrainingConfig(
            method=v["finetune"] or Method.FULL,
            micro_batch_size=v["micro_batch_size"],
            seq_len=v["seq_len"] if v["seq_len"] is not None else default_len,
            grad_accum_steps=v["grad_accum_steps"],
            precision=v["precision"],
            optimizer=v["optimizer"],
            recompute=v["recompute"],
            attn_implementation=v["attn_implementation"],
            loss=v["loss"],
            lora=LoraConfig(rank=v["lora_rank"], targets=v["lora_targets"], dropout=v["lora_dropout"]),
            offload=v["offload"],
            parallelism=par,
            framework=framework,
            set_grads_to_none=v["set_grads_to_none"],
            target_len=v["target_len"],
            prepare_kbit_training=v["prepare_kbit_training"] or KbitPrep.TRL,
        )

    def workload(self, spec: ModelSpec) -> Workload:
        """The workload for ``spec``.

        Raises:
            InputError: conflicting modes, a flag the mode (method, engine) does not read, or
                --gpus not divisible by the parallel degrees.
        """
        v = self.values
        modes = [m for m in ("train", "serve") if v[m]] + (["finetune"] if v["finetune"] else [])
        if len(modes) > 1:
            raise InputError(f"choose one of --train, --finetune, --serve (got {', '.join('--' + m for m in modes)})")
        mode = modes[0] if modes else "serve"
        _check_scope(v, mode)
        for name, value in v.items():
            if isinstance(value, int) and not isinstance(value, bool) and value > MAX_INT_FLAG:
                raise InputError(f"--{name.replace('_', '-')} {value} is beyond anything memest can size (at most "
                                 f"{MAX_INT_FLAG:,}); give a realistic value")
        gpus, pp, cp = v["gpus"], v["pp"], v["cp"]
        for flag, value in (("--gpus", gpus), ("--pp", pp), ("--cp", cp), ("--ep", v["ep"])):
            if value < 1:
                raise InputError(f"{flag} is {value}; it must be at least 1")
        for flag, value in (("--tp", v["tp"]), ("--dp", v["dp"])):
            if value is not None and value < 1:
                raise InputError(f"{flag} is {value}; it must be at least 1")
        if mode != "serve":
            return self._training(spec)
        par = _serving_parallelism(v, spec)
        max_len = v["max_model_len"]
        if max_len is None and v["prompt_len"] is not None and v["max_new_tokens"] is not None:
            max_len = v["prompt_len"] + v["max_new_tokens"]
        checkpoint: tuple[tuple[str, int], ...] = ()
        if v["exact_weights"]:
            from memest.sources.hub import safetensors_parameter_counts

            checkpoint = safetensors_parameter_counts(spec.name, revision=v["revision"])
        gguf_tensors: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
        if v["gguf"] is not None:
            from memest.sources.gguf import read_tensors

            gguf_tensors = read_tensors(v["gguf"])
        return ServingConfig(
            dtype=v["dtype"],
            quantization=v["quantization"],
            kv_cache_dtype=v["kv_cache_dtype"],
            max_model_len=max_len,
            batch_size=v["batch_size"],
            engine=v["engine"],
            gpu_memory_utilization=v["gpu_memory_utilization"],
            max_num_batched_tokens=v["max_num_batched_tokens"],
            max_num_seqs=v["max_num_seqs"],
            block_size=v["block_size"],
            enforce_eager=v["enforce_eager"],
            engine_version=v["engine_version"],
            prompt_len=v["prompt_len"],
            max_new_tokens=v["max_new_tokens"],
            n_gpu_layers=v["n_gpu_layers"],
            n_batch=v["n_batch"],
            n_ubatch=v["n_ubatch"],
            flash_attn=v["flash_attn"],
            tensor_split=_tensor_split(v["tensor_split"]),
            gguf_tensors=gguf_tensors,
            checkpoint_params=checkpoint,
            parallelism=par,
        )


def _tensor_split(text: str | None) -> tuple[float, ...]:
    """``--tensor-split 10,6`` as shares.

    Raises:
        InputError: a share that is not a number.
    """
    if text is None:
        return ()
    try:
        return tuple(float(x) for x in text.replace("/", ",").split(","))
    except ValueError:
        raise InputError(f"--tensor-split {text!r} is not a list of numbers; write one share per GPU, e.g. "
                         "--tensor-split 10,6") from None


def _serving_parallelism(v: dict[str, Any], spec: ModelSpec) -> Parallelism:
    """Serving degrees from --gpus, --tp, --pp and --dp: gpus = tp x pp x dp. Without --tp, tp is
    what --gpus leaves after pp x dp (vLLM ``tensor_parallel_size``; dp = 1 unless --dp is given).

    Raises:
        InputError: --gpus not divisible by pp x dp, or not tp x pp x dp; a default tp that cannot
            split the heads (the message names the default and suggests --tp / --dp).
    """
    gpus, pp, dp, tp = v["gpus"], v["pp"], v["dp"], v["tp"]
    if tp is None:
        group = pp * (dp or 1)
        if gpus % group:
            what = "pp x dp" if dp is not None else "--pp"
            raise InputError(f"--gpus {gpus} is not divisible by {what} = {group}; use a multiple of {group} "
                             "(--gpus = tp x pp x dp)")
        tp = gpus // group
        problem = tp_head_problem(spec, tp)
        if problem:
            ok = max(t for t in divisors(gpus // pp) if tp_head_problem(spec, t) is None)
            raise InputError(f"--gpus {gpus} serves with tensor parallelism {tp} by default (gpus / (pp x dp)), which "
                             f"{problem[0]}; pass --tp and --dp, e.g. --tp {ok} --dp {gpus // (pp * ok)}")
        dp = dp or 1
    elif dp is None:
        if gpus % (tp * pp):
            raise InputError(f"--gpus {gpus} is not divisible by tp x pp = {tp * pp}; use a multiple of {tp * pp}")
        dp = gpus // (tp * pp)
    elif gpus != tp * pp * dp:
        raise InputError(f"--gpus {gpus} is not tp x pp x dp = {tp * pp * dp}; pass --gpus {tp * pp * dp} or drop --dp")
    return Parallelism(tp=tp, pp=pp, dp=dp, ep=v["ep"])


def _training_parallelism(v: dict[str, Any], device: Device) -> tuple[Parallelism, Framework]:
    """Parallel degrees and framework from --gpus/--dp, --tp/--pp/--cp/--ep, --zero-stage/--fsdp.

    Raises:
        InputError: --gpus and --dp disagree, --gpus is not divisible, or --fsdp conflicts with
            --zero-stage / --framework.
    """
    tp, pp, cp = v["tp"] or 1, v["pp"], v["cp"]
    if v["sequence_parallel"] and tp == 1:
        raise InputError("--sequence-parallel needs --tp > 1: it splits the activations outside the tensor-parallel "
                         "regions over the tp ranks; add --tp N or drop it")
    group = tp * pp * cp
    gpus, dp = v["gpus"], v["dp"]
    if dp is not None:
        if gpus not in (1, dp * group):
            raise InputError(f"--gpus {gpus} is not dp x tp x pp x cp = {dp * group}; drop one of --gpus / --dp")
    else:
        if gpus % group:
            raise InputError(f"--gpus {gpus} is not divisible by tp x pp x cp = {group}; use a multiple of {group}")
        dp = gpus // group
    zero, framework, dp_shard = v["zero_stage"], v["framework"], v["dp_shard"]
    fsdp = v["fsdp"]
    if fsdp is not None:
        if framework not in (Framework.AUTO, Framework.FSDP):
            raise InputError(f"--fsdp {fsdp.value} runs under FSDP; drop --framework {framework.value}")
        stage = {FsdpStrategy.FULL_SHARD: 3, FsdpStrategy.HYBRID_SHARD: 3, FsdpStrategy.SHARD_GRAD_OP: 2,
                 FsdpStrategy.NO_SHARD: 0}[fsdp]
        if zero not in (0, stage):
            raise InputError(f"--fsdp {fsdp.value} is ZeRO stage {stage}; drop --zero-stage {zero}")
        zero, framework = stage, Framework.FSDP
        if fsdp is FsdpStrategy.HYBRID_SHARD and dp_shard is None:
            dp_shard = math.gcd(dp * cp, max(1, device.per_node // (tp * pp)))
    par = Parallelism(tp=tp, pp=pp, cp=cp, dp=dp, ep=v["ep"], zero_stage=zero,
                      sequence_parallel=v["sequence_parallel"], dp_shard=dp_shard)
    return par, framework


def workload_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Give a typer command every workload flag; it receives them as ``job: JobOptions``.

    The command's own parameters come first in ``--help``; it must declare ``job: JobOptions``.
    """
    sig = inspect.signature(func, eval_str=True)
    own = [p for p in sig.parameters.values() if p.name != "job"]
    shared = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=ann, default=default)
        for name, (ann, default) in WORKLOAD_OPTIONS.items()
    ]

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        job = JobOptions({name: kwargs.pop(name) for name in WORKLOAD_OPTIONS})
        return func(job=job, **kwargs)

    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD else p
              for p in own]
    wrapper.__signature__ = sig.replace(parameters=[*params, *shared])  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in (*params, *shared)}
    return wrapper


RANGE_HELP = "A sweep: A..B (powers of two), A..B:+STEP, A..B:xFACTOR or a list A,B,C; k = 1024 (1k..128k)."


def ranged_workload_options(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """As :func:`workload_options`, with the flags ``names`` taken as strings that may hold a range
    (``memest sweep --seq-len 1k..128k``). ``job.values`` holds each such string, or None when the
    flag was not given; the command parses them.

    Raises:
        ValueError: a name is not a workload option (a programming error).
    """
    from typing import get_args

    for name in names:
        if name not in WORKLOAD_OPTIONS:
            raise ValueError(f"ranged flag {name!r} is not a workload option")

    def ranged(param: inspect.Parameter) -> inspect.Parameter:
        info = get_args(WORKLOAD_OPTIONS[param.name][0])[1]
        option = _opt("--" + param.name.replace("_", "-"), help=f"{info.help} {RANGE_HELP}", panel=info.rich_help_panel)
        return param.replace(annotation=Annotated[str | None, option], default=None)

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        wrapper = workload_options(func)
        sig = inspect.signature(wrapper)
        params = [ranged(p) if p.name in names else p for p in sig.parameters.values()]
        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return decorate
