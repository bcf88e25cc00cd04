"""The workload flags shared by ``memest hf``, ``calibrate``, ``plan`` and ``sweep``.

Each flag is declared once (help text, default, choices) in :data:`WORKLOAD_OPTIONS`.
:func:`workload_options` adds them to a typer command's signature and hands the command a built
:class:`JobOptions` instead, so every command parses the same flags the same way.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from memest.devices import DEFAULT_DEVICE, Device, get_device
from memest.errors import InputError
from memest.spec import ModelSpec
from memest.workload import (
    Engine,
    LoraConfig,
    Method,
    Offload,
    Optimizer,
    Parallelism,
    Precision,
    Recompute,
    ServingConfig,
    TrainingConfig,
    Workload,
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
    "seq_len": (Annotated[int | None, _opt("--seq-len", help="Tokens per training sequence [default: min(2048, "
                                          "max_position_embeddings)].", panel=TRAIN)], None),
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
    "lora_targets": (Annotated[str, _opt("--lora-targets", help="attention, all-linear, or module names (q_proj,v_proj).",
                                         panel=TRAIN)], "attention"),
    "attn_implementation": (Annotated[str, _opt("--attn-implementation", help="sdpa, flash_attention_2 or eager "
                                                "(eager stores the s x s scores).", panel=TRAIN)], "sdpa"),
    "loss": (Annotated[str, _opt("--loss", help="default (full fp32 logits) or chunked (fused/chunked cross-entropy).",
                                 panel=TRAIN)], "default"),
    # serving
    "batch_size": (Annotated[int, _opt("--batch-size", help="Concurrent sequences, each up to max_model_len.", panel=SERVE)], 1),
    "max_model_len": (Annotated[int | None, _opt("--max-model-len", help="Longest sequence (prompt + output) in tokens "
                                                 "[default: the model's max_position_embeddings].", panel=SERVE)], None),
    "dtype": (Annotated[str, _opt("--dtype", help="Weight dtype: auto (the checkpoint's), bf16, fp16, fp32.", panel=SERVE)], "auto"),
    "quantization": (Annotated[str, _opt("--quantization", help="Weight quantization applied to an unquantized model: "
                                         "none (keep the checkpoint's quantization_config), int8 (bitsandbytes LLM.int8), "
                                         "nf4 (bitsandbytes, double quant), fp4 (bitsandbytes load_in_4bit defaults), "
                                         "int4/awq, gptq, fp8 (vLLM online), mxfp4.", panel=SERVE)], "none"),
    "exact_weights": (Annotated[bool, _opt("--exact-weights", help="Read the checkpoint's safetensors headers on the Hub "
                                           "(parameters per stored dtype, no weights downloaded) and use their exact "
                                           "total.", panel=SERVE)], False),
    "kv_cache_dtype": (Annotated[str, _opt("--kv-cache-dtype", help="KV-cache dtype: auto (the weight dtype), fp8.",
                                           panel=SERVE)], "auto"),
    "engine": (Annotated[Engine, _opt("--engine", help="Serving engine to model: vllm (paged KV, start-up budget) or hf "
                                      "(transformers generate).", panel=SERVE, case_sensitive=False)], Engine.VLLM),
    "engine_version": (Annotated[str | None, _opt("--engine-version", help="Engine version whose memory arithmetic to "
                                                  "model: vllm 0.19 (V1), 0.6, 0.2; hf 5, 4.34 [default: the newest].",
                                                  panel=SERVE)], None),
    "prompt_len": (Annotated[int | None, _opt("--prompt-len", help="hf: prompt tokens per sequence [default: "
                                              "max_model_len - max_new_tokens].", panel=SERVE)], None),
    "max_new_tokens": (Annotated[int | None, _opt("--max-new-tokens", help="hf: tokens generated per sequence.",
                                                  panel=SERVE)], None),
    "gpu_memory_utilization": (Annotated[float, _opt("--gpu-memory-utilization", help="Share of device memory vLLM may use.",
                                                     panel=SERVE)], 0.9),
    "max_num_batched_tokens": (Annotated[int | None, _opt("--max-num-batched-tokens", help="Tokens per forward in vLLM's "
                                                          "profiling run [default: vLLM's for the device].", panel=SERVE)], None),
    "max_num_seqs": (Annotated[int | None, _opt("--max-num-seqs", help="Sequences per forward in vLLM's profiling run.",
                                                panel=SERVE)], None),
    "block_size": (Annotated[int, _opt("--block-size", help="Tokens per paged KV block.", panel=SERVE)], 16),
    "enforce_eager": (Annotated[bool, _opt("--enforce-eager", help="No CUDA graphs (vLLM).", panel=SERVE)], False),
    # parallelism and devices
    "gpu": (Annotated[str | None, _opt("--gpu", help=f"Accelerator (see 'memest gpus') [default: {DEFAULT_DEVICE}, and list "
                                       "every device that fits].", panel=PAR)], None),
    "gpus": (Annotated[int, _opt("--gpus", help="Devices in the job (tp x pp x cp x dp).", panel=PAR)], 1),
    "tp": (Annotated[int | None, _opt("--tp", help="Tensor-parallel degree [serving default: --gpus / --pp].", panel=PAR)], None),
    "pp": (Annotated[int, _opt("--pp", help="Pipeline-parallel degree.", panel=PAR)], 1),
    "cp": (Annotated[int, _opt("--cp", help="Context-parallel degree.", panel=PAR)], 1),
    "ep": (Annotated[int, _opt("--ep", help="Expert-parallel degree (MoE).", panel=PAR)], 1),
    "sequence_parallel": (Annotated[bool, _opt("--sequence-parallel", help="Megatron sequence parallelism with --tp.",
                                               panel=PAR)], False),
    "headroom": (Annotated[float, _opt("--headroom", help="Share of device memory to keep free.", panel=PAR)], 0.10),
}


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
    def device(self) -> Device:
        """The --gpu device, or the default.

        Raises:
            UnknownDeviceError: unknown name.
        """
        return get_device(self.values["gpu"] or DEFAULT_DEVICE)

    @property
    def device_given(self) -> bool:
        """True when --gpu was passed."""
        return self.values["gpu"] is not None

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

    def workload(self, spec: ModelSpec) -> Workload:
        """The workload for ``spec``.

        Raises:
            InputError: conflicting modes, or --gpus not divisible by the parallel degrees.
        """
        v = self.values
        modes = [m for m in ("train", "serve") if v[m]] + (["finetune"] if v["finetune"] else [])
        if len(modes) > 1:
            raise InputError(f"choose one of --train, --finetune, --serve (got {', '.join('--' + m for m in modes)})")
        gpus, pp, cp = v["gpus"], v["pp"], v["cp"]
        for flag, value in (("--gpus", gpus), ("--pp", pp), ("--cp", cp), ("--ep", v["ep"])):
            if value < 1:
                raise InputError(f"{flag} is {value}; it must be at least 1")
        if v["tp"] is not None and v["tp"] < 1:
            raise InputError(f"--tp is {v['tp']}; it must be at least 1")
        if modes and modes[0] in ("train", "finetune"):
            tp = v["tp"] or 1
            group = tp * pp * cp
            if gpus % group:
                raise InputError(f"--gpus {gpus} is not divisible by tp x pp x cp = {group}; use a multiple of {group}")
            par = Parallelism(tp=tp, pp=pp, cp=cp, dp=gpus // group, ep=v["ep"], zero_stage=v["zero_stage"],
                              sequence_parallel=v["sequence_parallel"])
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
                lora=LoraConfig(rank=v["lora_rank"], targets=v["lora_targets"]),
                offload=v["offload"],
                parallelism=par,
            )
        if gpus % (pp * cp):
            raise InputError(f"--gpus {gpus} is not divisible by --pp {pp}; use a multiple of {pp}")
        tp = v["tp"] if v["tp"] is not None else gpus // pp
        if gpus % (tp * pp):
            raise InputError(f"--gpus {gpus} is not divisible by tp x pp = {tp * pp}; use a multiple of {tp * pp}")
        par = Parallelism(tp=tp, pp=pp, dp=gpus // (tp * pp), ep=v["ep"])
        max_len = v["max_model_len"]
        if max_len is None and v["prompt_len"] is not None and v["max_new_tokens"] is not None:
            max_len = v["prompt_len"] + v["max_new_tokens"]
        checkpoint: tuple[tuple[str, int], ...] = ()
        if v["exact_weights"]:
            from memest.sources.hub import safetensors_parameter_counts

            checkpoint = safetensors_parameter_counts(spec.name, revision=v["revision"])
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
            checkpoint_params=checkpoint,
            parallelism=par,
        )


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
