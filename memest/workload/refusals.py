"""Why a job will not start on a device: the one rule the CLI refuses with and the planner skips by.

Its own module because the rule reads both the settings (:mod:`memest.workload.config`: the devices each
engine, recipe and kernel runs on) and the stacks' defaults (:mod:`memest.workload.stacks`: which stack has an
fp16 recipe of a bf16 one's bytes).
"""

from __future__ import annotations

from memest.devices import Device
from memest.workload import stacks
from memest.workload.config import (
    BF16_LEAST_CAPABILITY,
    BITSANDBYTES_NOT_VENDORS,
    FLOAT8_TRAINING_ARCHS,
    UNSLOTH_NOT_ARCHS,
    UNSLOTH_VENDORS,
    Float8,
    LoraLibrary,
    Method,
    Stack,
    TrainingConfig,
    Workload,
    capability_refusal,
    computes_bf16,
    lacks_bf16,
    runs_on,
    software,
)


def training_refusal(t: TrainingConfig, arch: str, vendor: str) -> tuple[str, str] | None:
    """Why a training job cannot run on a device of ``arch`` / ``vendor`` beyond its framework
    (:func:`memest.workload.config.runs_on`): (the setting at fault, the reason in words), or None when it runs. A custom size runs
    anywhere.

    - a bf16 recipe (:func:`computes_bf16`) of a stack's job needs :data:`BF16_LEAST_CAPABILITY` on NVIDIA, unless
      the stack filled it and has an fp16 recipe of the same bytes, which :func:`memest.workload.resolve.resolve` runs there instead
      (:func:`memest.workload.stacks.fp16_fallback`);
    - float8 training (:attr:`TrainingConfig.float8`, full training) needs :data:`FLOAT8_TRAINING_ARCHS`;
    - the unsloth stack needs :data:`UNSLOTH_VENDORS` (not :data:`UNSLOTH_NOT_ARCHS`);
    - QLoRA with a bitsandbytes NF4 base (every :class:`LoraLibrary` but torchtune's) not on
      :data:`BITSANDBYTES_NOT_VENDORS`.
    """
    if vendor == "custom":
        return None
    if t.stack is not None and lacks_bf16(arch, vendor) and computes_bf16(t):  # a stack's job: a workload built
        # without one (the library's TrainingConfig(), precision mixed by default) names bytes, the same in fp16
        if not ("precision" in t.stack_filled and stacks.fp16_fallback(t) is not None):  # else resolve switches
            return ("precision", f"bf16 needs CUDA compute capability {BF16_LEAST_CAPABILITY / 10:.1f}+ (Ampere or "
                                 "newer; transformers raises \"Your setup doesn't support bf16/gpu\"); "
                                 + stacks.fp16_words(t))
    if t.method is Method.FULL and Float8(t.float8) is not Float8.NONE and arch not in FLOAT8_TRAINING_ARCHS:
        return ("float8", "torchao float8 training needs CUDA compute capability 8.9+ (ada, hopper, blackwell) or "
                          "AMD MI300+ (cdna3, cdna4): torch._scaled_mm")
    if t.stack is Stack.UNSLOTH and (vendor not in UNSLOTH_VENDORS or arch in UNSLOTH_NOT_ARCHS):
        return ("stack", "unsloth runs on NVIDIA (CUDA), AMD (ROCm) and Intel XPU GPUs only (unsloth/device_type.py)")
    if t.method is Method.QLORA and t.lora_library is not LoraLibrary.TORCHTUNE and vendor in BITSANDBYTES_NOT_VENDORS:
        return ("finetune", "QLoRA's bitsandbytes NF4 base has no backend there (bitsandbytes 0.42 is CUDA only; "
                            "its multi-backend release runs ROCm and Intel, Apple Silicon is planned)")
    return None


def refusal(w: Workload, device: Device) -> str | None:
    """Why ``w``'s engine or training framework will not start on ``device``, or None when it does: the
    vendor (:func:`memest.workload.config.runs_on`), then for training what else it asks for that the device does not run
    (:func:`training_refusal`), for serving a setting the device's compute capability is below
    (:func:`memest.workload.config.capability_refusal`). The one rule the CLI refuses with and the planner skips by. The text
    names fields, not flags."""
    engine = software(w)
    if not runs_on(engine, device.vendor):
        return f"{engine} does not run on {device.name} ({device.vendor})"
    if isinstance(w, TrainingConfig):
        refused = training_refusal(w, device.arch, device.vendor)
        return refused[1] if refused else None
    found = capability_refusal(w, device)
    return found[1] if found else None
