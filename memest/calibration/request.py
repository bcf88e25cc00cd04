"""What one calibration runs, as plain data that crosses process boundaries (torchrun workers).

A :class:`Request` holds the model reference and the workload flags exactly as ``memest hf``
takes them (:func:`memest.workload.settings.settings`), plus how to run: backend, steps, processes,
weights. :func:`check_supported` says which workloads calibrate can really run and raises an
:class:`~memest.errors.InputError` naming the flag and the fix for the others.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from memest.errors import InputError
from memest.spec import ModelSpec
from memest.workload import (
    Engine,
    Framework,
    Method,
    Offload,
    Optimizer,
    Precision,
    Recompute,
    ServingConfig,
    TrainingConfig,
    Workload,
    validate,
)
from memest.workload.resolve import device, resolve
from memest.workload.settings import enum_of, settings

BACKENDS = ("auto", "cuda", "cpu")
DEFAULT_TRAIN_STEPS = 3
"""Measured training steps after the warm-up (>= 2: the first step creates optimizer states)."""
DEFAULT_DECODE_STEPS = 8
"""Decode steps after the prefill when serving."""
MAX_STEPS = 1000
"""Most measured steps a calibration runs: the peak is reached by the second training step (the
first creates the optimizer states) and grows by one token per decode step, so more only takes
longer (and 2^31 steps would never end)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """One calibration run.

    Attributes:
        model: The model reference (catalog name, Hub id, config path), as ``memest hf`` takes it.
        flags: Workload flag values by option name (``micro_batch_size``), enums as their values.
        backend: ``cuda``, ``cpu`` or ``auto`` (CUDA when available).
        steps: Measured training steps, or decode steps when serving; None = the default.
        nproc: Processes (one device each).
        weights: Load the real checkpoint weights (``from_pretrained``) instead of random ones.
        tag: ``suite/case`` when run from a suite (stored in the record).
    """

    model: str
    flags: dict[str, Any] = field(default_factory=dict)
    backend: str = "auto"
    steps: int | None = None
    nproc: int = 1
    weights: bool = False
    tag: str | None = None

    def job(self) -> dict[str, Any]:
        """The workload settings as the CLI would have parsed them (defaults for the missing ones)."""
        return job_from_flags(self.flags)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Request:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)


def _value(x: Any) -> Any:
    """An enum's value, anything else as is."""
    return x.value if isinstance(x, Enum) else x


def flags_of(values: Mapping[str, Any]) -> dict[str, Any]:
    """Settings' values as plain JSON data (enums as their values)."""
    return {k: (v.value if isinstance(v, Enum) else v) for k, v in values.items()}


def _stored_default(name: str, raw: Any, setting: Any, flags: dict[str, Any]) -> bool:
    """True for a value a record stored only because it was the setting's default then: the field's
    default, on a job whose mode or method does not read it (records written before the setting's
    default became the stack's)."""
    if _value(raw) != _value(setting.field_default):
        return False
    training = bool(flags.get("train") or flags.get("finetune"))
    if setting.scope == ("serving" if training else "training"):
        return True
    method = str(_value(flags.get("finetune")) or "full").lower()
    return training and bool(setting.methods) and method not in setting.methods


def job_from_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """Parsed workload options from plain flag values (``{"precision": "bf16"}``); defaults fill the rest.

    Raises:
        InputError: an unknown flag name, or a value that is not one of the flag's choices.
    """
    known = settings()
    unknown = sorted(set(flags) - set(known))
    if unknown:
        raise InputError(f"unknown workload flag(s) {', '.join(map(repr, unknown))}; "
                         f"use names of 'memest hf' options such as 'micro_batch_size'")
    values: dict[str, Any] = {}
    for name, setting in known.items():
        raw = flags.get(name, setting.default)
        if name == "prepare_kbit_training" and isinstance(raw, bool):
            # records written while the flag was a switch: on was PEFT's upcast alone, off (under QLoRA) none
            qlora = str(_value(flags.get("finetune")) or "").lower() == "qlora"
            raw = "peft" if raw else ("none" if qlora else None)
        enum = enum_of(setting.type)
        if enum is not None and raw is not None and not isinstance(raw, enum):
            try:
                raw = enum(str(raw).lower())
            except ValueError:
                choices = ", ".join(m.value for m in enum)
                raise InputError(f"{{{name}}} {raw!r} is not one of {choices}", field=name) from None
        if setting.default is None and raw is not None and _stored_default(name, raw, setting, flags):
            raw = None
        values[name] = raw
    return values


def calibration_workload(job: Mapping[str, Any], spec: ModelSpec, nproc: int, steps: int | None = None) -> Workload:
    """The workload calibrate runs and estimates: ``memest hf``'s, with ``--gpus`` = ``--nproc``.

    Serving is modelled as what runs: transformers ``generate`` (``--engine hf``, the installed
    transformers' major version), generating ``--max-new-tokens`` tokens, else ``steps``, else 8,
    after a prompt of the rest of ``--max-model-len`` (:func:`memest.estimate.serving.hf.generate.lengths`
    turns these into the prompt and generated lengths for both the estimate and the run).

    Raises:
        InputError: ``--gpus`` differs from ``--nproc``, or the flags are inconsistent.
    """
    if nproc < 1:
        raise InputError(f"{{nproc}} is {nproc}; it must be at least 1", field="nproc")
    gpus = job["gpus"]
    if gpus not in (1, nproc):
        raise InputError(f"{{gpus}} {gpus} differs from {{nproc}} {nproc}; calibrate runs one process per device, "
                         f"so pass {{nproc}} {gpus} (or drop {{gpus}})", field="gpus")
    if steps is not None and not 1 <= steps <= MAX_STEPS:
        raise InputError(f"{{steps}} is {steps}; it must be between 1 and {MAX_STEPS:,} (the peak is reached by the "
                         "second step)", field="steps")
    values = dict(job, gpus=nproc)
    if not (values["train"] or values["finetune"]):
        values["engine"] = Engine.HF  # what runs: vLLM-only flags are refused as for 'memest hf --engine hf'
    workload = resolve(values, spec, device(values))
    if isinstance(workload, TrainingConfig):
        runs = framework_that_runs(workload, nproc)
        asked = job.get("framework", Framework.AUTO)
        if asked not in (Framework.AUTO, runs):
            raise InputError(f"calibrate runs this job under {runs.value} (plain PyTorch in one process, DDP for "
                             f"{{zero_stage}} 0, FSDP2 for 2/3 or {{precision}} fsdp2); drop {{framework}} {asked.value}",
                             field="zero_stage")
        workload = workload.replace(framework=runs)
    if isinstance(workload, ServingConfig):
        changes: dict[str, Any] = {"engine": Engine.HF, "engine_version": workload.engine_version or _transformers_major()}
        if workload.prompt_len is None and workload.max_new_tokens is None:
            changes["max_new_tokens"] = steps if steps is not None else DEFAULT_DECODE_STEPS
        workload = workload.replace(**changes)
    return workload


def framework_that_runs(t: TrainingConfig, nproc: int) -> Framework:
    """What calibrate runs ``t`` under: FSDP2 for ``--precision fsdp2`` or ZeRO stage 2-3, DDP for
    more than one process, else plain PyTorch (the estimate is made for the same framework)."""
    if t.precision is Precision.FSDP2 or t.parallelism.zero_stage >= 2:
        return Framework.FSDP
    return Framework.DDP if nproc > 1 else Framework.PYTORCH


def _transformers_major() -> str:
    """``5`` for transformers 5.x (logits of the last prompt token only), else ``4.34``'s arithmetic."""
    try:
        version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return "5"
    return "5" if int(version.split(".")[0]) >= 5 else "4.34"


def check_supported(workload: Workload, *, backend: str, nproc: int, spec: ModelSpec | None = None) -> None:
    """Refuse workloads calibrate cannot run faithfully, naming the flag and the fix.

    Supported: data parallelism only (one process per device: DDP for ``--zero-stage 0``, FSDP2
    ``fully_shard`` for 2 and 3); every precision recipe
    (``--precision mixed``/``fp16`` only without parameter sharding); the optimizers of torch
    (AdamW, Adafactor, SGD), Lion, and bitsandbytes' 8-bit AdamW on CUDA; LoRA (peft) and QLoRA
    (peft + bitsandbytes, CUDA); recompute ``none``/``full``; serving unquantized weights with the
    HF cache.

    With ``spec``, the estimate's own checks (:func:`memest.workload.validate`) run too, so a
    workload memest cannot estimate is refused before anything runs.

    Raises:
        InputError: the workload needs something calibrate does not run, or memest cannot estimate.
    """
    if backend not in BACKENDS:
        raise InputError(f"{{device}} {backend!r} is not one of {', '.join(BACKENDS)}", field="device")
    if isinstance(workload, ServingConfig) and nproc > 1:
        raise InputError(f"calibrate serves on one device; {{nproc}} {nproc} with {{serve}} is not measured (use {{nproc}} 1)",
                         field="nproc")
    par = workload.parallelism
    for name in ("tp", "pp", "cp", "ep"):
        if getattr(par, name) > 1:
            raise InputError(f"calibrate runs data parallelism only; {{{name}}} {getattr(par, name)} is not measured "
                             f"(drop {{{name}}}, or check it with 'memest hf' and the published cases)", field=name)
    if isinstance(workload, ServingConfig):
        if workload.quantization != "none":
            raise InputError(f"calibrate serves unquantized weights; {{quantization}} {workload.quantization} is not "
                             "measured (drop it)", field="quantization")
        if workload.kv_cache_dtype != "auto":
            raise InputError(f"calibrate uses the HF cache at the weight dtype; {{kv_cache_dtype}} "
                             f"{workload.kv_cache_dtype} is not measured (drop it)", field="kv_cache_dtype")
    else:
        _check_training(workload, backend=backend, nproc=nproc)
    if spec is not None:
        validate(spec, workload)
        _check_length(spec, workload)


def _check_length(spec: ModelSpec, workload: Workload) -> None:
    """Refuse a sequence longer than the model's ``max_position_embeddings``: calibrate runs the
    model's code, which was not built for it (and whose attention would run for hours on a CPU);
    ``memest hf`` still estimates it.

    Raises:
        InputError: the sequence exceeds the model's positions.
    """
    limit = spec.max_position_embeddings
    if isinstance(workload, TrainingConfig):
        flag, length = "seq_len", workload.seq_len
    else:
        flag, length = "max_model_len", workload.max_model_len
    if limit and length is not None and length > limit:
        raise InputError(f"{{{flag}}} {length:,} is beyond the {limit:,} positions of {spec.name} "
                         f"(max_position_embeddings); calibrate runs the model, so pass {{{flag}}} {limit} or less "
                         "('memest hf' estimates longer sequences)", field=flag)


def _check_training(t: TrainingConfig, *, backend: str, nproc: int) -> None:
    z = t.parallelism.zero_stage
    shard = t.parallelism.dp_shard
    if shard not in (None, t.parallelism.dp * t.parallelism.cp):
        raise InputError(f"{{dp_shard}} {shard} (hybrid sharding) is not calibrated; calibrate shards over all "
                         f"{nproc} processes: drop {{dp_shard}} / {{fsdp}} hybrid_shard", field="dp_shard")
    if t.recompute is Recompute.SELECTIVE:
        raise InputError("{recompute} selective is Megatron's; transformers models checkpoint whole layers: "
                         "use {recompute} full or none", field="recompute")
    if _value(t.loss) != "default":
        raise InputError(f"{{loss}} {_value(t.loss)} is not run by calibrate (it uses the model's own loss); drop {{loss}}",
                         field="loss")
    if t.method is not Method.FULL and _value(t.lora_library) != "peft":
        raise InputError(f"{{lora_library}} {_value(t.lora_library)} is not run by calibrate (it builds PEFT adapters "
                         "and a bitsandbytes base): use {lora_library} peft", field="lora_library")
    if t.offload is not Offload.NONE:
        raise InputError(f"{{offload}} {t.offload.value} is not measured by calibrate; drop {{offload}}",
                         field="offload")
    for name in ("optimizer_in_bwd", "activation_offloading"):
        if getattr(t, name):
            raise InputError(f"{{{name}}} is not measured by calibrate; add {{no_{name}}}", field=name)
    if _value(t.attn_implementation) not in ("sdpa", "eager", "flash_attention_2"):
        raise InputError(f"{{attn_implementation}} {_value(t.attn_implementation)!r} is not one of sdpa, eager, "
                         "flash_attention_2", field="attn_implementation")
    if backend == "cpu":
        if _value(t.attn_implementation) == "flash_attention_2":
            raise InputError("{attn_implementation} flash_attention_2 needs CUDA; use sdpa with {device} cpu",
                             field="attn_implementation")
        if t.method is Method.QLORA or t.optimizer in (Optimizer.ADAMW8BIT, Optimizer.PAGED_ADAMW8BIT,
                                                   Optimizer.PAGED_ADAMW32BIT):
            raise InputError("bitsandbytes (QLoRA, 8-bit optimizers) needs CUDA; drop it or use {device} cuda",
                             field="device")
    if nproc > 1 and z >= 2 and t.precision in (Precision.MIXED, Precision.FP16):
        raise InputError(f"{{precision}} {t.precision.value} keeps a separate fp32 master copy (DeepSpeed style), "
                         f"which calibrate does not shard; with {{zero_stage}} {z} use {{precision}} fsdp2, bf16 or fp32",
                         field="precision")
    if nproc > 1 and t.precision is Precision.FSDP2 and z < 2:
        raise InputError(f"{{precision}} fsdp2 shards parameters over the {nproc} processes; add {{zero_stage}} 3 "
                         "(FULL_SHARD) or 2 (SHARD_GRAD_OP)", field="precision")
    if z == 1:
        raise InputError("{zero_stage} 1 (optimizer states sharded, gradients not) is DeepSpeed's; calibrate runs "
                         "DDP ({zero_stage} 0), FSDP2 SHARD_GRAD_OP (2) or FULL_SHARD (3)", field="zero_stage")
    if nproc > 1 and t.method is Method.QLORA:
        raise InputError("QLoRA is calibrated on one device; use {nproc} 1", field="nproc")
