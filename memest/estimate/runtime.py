"""Memory outside the model's tensors: CUDA context, library workspaces, NCCL, allocator slack, and the
caching allocator's block rounding of each tensor.

These are constants per device family, each traceable to a measurement. Two layers:

- the **defaults** below, each with the published measurement it comes from;
- **calibrated** values in ``memest/data/calibrated.json``, written by
  ``calibrate/update_constants.py`` from ``memest calibrate`` records (``calibrate/results/``);
  each entry names the records it was derived from (``calibrate/results/h100-80gb.jsonl#<id>``).
  A calibrated value replaces the default for its device family; :func:`constant_source` says
  which one an estimate used.

CPU devices (``kind="cpu"``, used by ``memest calibrate --device cpu``) have no context, no
cuBLAS workspace and no caching allocator: all zero. This module reads JSON with the standard
library only; it never imports torch.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from memest.devices import Device, GiB, MiB

CALIBRATED_PATH = Path(__file__).resolve().parent.parent / "data" / "calibrated.json"
"""Runtime constants measured by ``memest calibrate`` (see the module docstring)."""

MIN_BLOCK_SIZE = 512
"""``kMinBlockSize``: every allocation is rounded up to a multiple of this many bytes."""
SMALL_SIZE = 1 << 20
"""``kSmallSize``: requests up to 1 MiB come from the small pool; a large block is split only when more
than this would remain."""
MIN_LARGE_ALLOC = 10 << 20
"""``kMinLargeAlloc``: requests of this size or more get a segment of their own."""
ROUND_LARGE = 2 << 20
"""``kRoundLarge``: such segments are rounded up to 2 MiB."""


def cuda_block_bytes(nbytes: int) -> int:
    """Bytes PyTorch's CUDA caching allocator counts as allocated for one tensor of ``nbytes``.

    ``c10/cuda/CUDACachingAllocator.cpp``: sizes round up to 512 B (``round_size``); a request of
    10 MiB or more gets its own segment rounded up to 2 MiB (``get_allocation_size``), and the
    remainder is split off only when it exceeds 1 MiB (``shouldSplit``) — otherwise the whole
    segment is the block, and ``torch.cuda.memory_allocated`` counts it whole. So a 21.5 MiB shard
    takes 22 MiB and a 43 MiB (2048, 11008) bf16 activation 44 MiB, while a 20.6 MiB one keeps its
    size. Requests between 1 and 10 MiB share 20 MiB segments and are split (their reuse of cached
    blocks can leave up to 1 MiB unsplit too, which depends on the history and is not modelled).
    vLLM's 'Model loading took' is the sum over weights (Qwen2.5-7B's 129.5 MiB ``down_proj`` counts
    as 130 MiB). 0 bytes take no block.
    """
    if nbytes <= 0:
        return 0
    size = -(-nbytes // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
    if size < MIN_LARGE_ALLOC:
        return size
    segment = -(-size // ROUND_LARGE) * ROUND_LARGE
    return size if segment - size > SMALL_SIZE else segment


CUDA_CONTEXT_BYTES: dict[str, int] = {
    "volta": 1343 * MiB,
    "turing": round(0.51 * GiB),
    "ampere": round(0.51 * GiB),
    "ada": round(0.51 * GiB),
    "hopper": round(0.51 * GiB),
    "blackwell": round(0.51 * GiB),
    "cdna2": round(0.51 * GiB),
    "cdna3": round(0.51 * GiB),
    "gaudi": 0,
    "tpu": 0,
    "apple": 0,
}
"""Device memory used before the first tensor. volta: 1343 MiB on a V100 (CUDA 11, no lazy module
loading; validation case hf_bert_large_vanilla_bs4) — V100 stacks are often that old; a V100 on CUDA
12 uses less, so the figure errs high. Turing (T4) and newer GPUs: 0.51 GiB on an H100 with
CUDA 12 lazy loading (vLLM 0.19 'initial non-torch memory', case vllm019_llama31_8b_tp1); used for
the other CUDA/ROCm families until a calibration record replaces it. TPUs and Gaudi have no
per-process context in device memory that the frameworks report; nor has Apple's Metal (its working
set, :func:`memest.devices.metal_working_set_bytes`, is what remains for the process). An arch not
listed here (a custom size, cdna4, Intel Xe) gets the generic 0.51 GiB; AWS Neuron chips, like TPUs, Gaudi
and Apple GPUs, none (:func:`has_cuda_context`). A calibrated value (non-torch
memory of a one-process run: NVML process used - reserved after the steps) replaces these."""

NCCL_BYTES = 1 * GiB
"""NCCL communicator buffers per process when the job has more than one device: vLLM 0.19 reports
1.51 GiB of initial non-torch memory at TP=2 against 0.51 GiB at TP=1 (cases vllm019_llama31_8b_tp1
/ _tp2)."""


ALLOCATOR_SLACK = 0.12
"""Caching-allocator slack (peak reserved - peak allocated) as a share of peak allocated, in
training. Measured: 11% (Mistral-7B full fine-tune), 14% (LoRA), 30% (QLoRA) on an A100-80GB in
fms-acceleration's runs (cases fms_mistral7b_*_1gpu_bs4: nvidia-smi less a 0.5 GiB context, over
torch peak allocated). The QLoRA figure is the outlier (bitsandbytes' dequantized weights of many
sizes fragment the pool); the band of the ``allocator`` kind covers it. The default of
:func:`allocator_slack`; a calibrated value per device family (median over training records)
replaces it."""


def cublas_workspace_bytes(device: Device) -> int:
    """cuBLAS / cuBLASLt workspace the caching allocator holds for the compute stream.

    PyTorch ``aten/src/ATen/cuda/CublasHandlePool.cpp`` (getChosenWorkspaceSize): 32 MiB on
    Hopper and newer, 4096 KiB x 2 + 16 KiB x 8 before (also for an arch it does not know: a custom
    size); none on TPUs, AWS Neuron chips, Intel and Apple GPUs, which have no cuBLAS.
    """
    if device.kind in ("tpu", "cpu", "npu") or device.vendor in ("intel", "apple"):
        return 0
    if device.arch in ("hopper", "blackwell"):
        return 32 * MiB
    return 4096 * 1024 * 2 + 16 * 1024 * 8


@functools.lru_cache(maxsize=1)
def calibrated() -> dict[str, Any]:
    """The calibrated constants file (empty when it is absent)."""
    if not CALIBRATED_PATH.is_file():
        return {}
    return json.loads(CALIBRATED_PATH.read_text())


def _calibrated_entry(name: str, device: Device) -> dict[str, Any] | None:
    own = dict(device.runtime_constants)  # the user's records (use_calibration) win over the packaged file
    if name in own:
        return {"value": own[name], "records": [device.runtime_source]}
    entry = calibrated().get(name, {}).get(device.arch)
    return entry if isinstance(entry, dict) and "value" in entry else None


def has_cuda_context(device: Device) -> bool:
    """Whether a process on ``device`` holds a CUDA (or ROCm / Level Zero) context in device memory:
    not on a TPU, an AWS Neuron chip (Trainium, Inferentia), a Gaudi or an Apple GPU (Metal), whose
    runtimes keep none that the frameworks report (:data:`CUDA_CONTEXT_BYTES`)."""
    return not (device.kind in ("tpu", "npu") or device.arch == "gaudi" or device.vendor == "apple")


def no_context_note(device: Device) -> str:
    """What an estimate on a device without a CUDA context (:func:`has_cuda_context`) takes instead."""
    runtime = {"tpu": "the TPU runtime (PJRT)", "npu": "the Neuron runtime"}.get(device.kind) or \
        ("Metal" if device.vendor == "apple" else "the Gaudi runtime (SynapseAI)")
    return (f"no CUDA context on {device.name}: {runtime} keeps no per-process context in device memory that "
            "the frameworks report, so none is counted (0 B)")


def cuda_context_bytes(device: Device) -> int:
    """The CUDA (or ROCm) context of one process on ``device``: 0 for a CPU or a device without one
    (:func:`has_cuda_context`), else calibrated for its family, else the default."""
    if device.kind == "cpu" or not has_cuda_context(device):
        return 0
    entry = _calibrated_entry("cuda_context_bytes", device)
    if entry is not None:
        return int(entry["value"])
    return CUDA_CONTEXT_BYTES.get(device.arch, round(0.51 * GiB))


def allocator_slack(device: Device) -> float:
    """Caching-allocator slack as a share of peak allocated on ``device``: 0 for a CPU, else
    calibrated for its family, else :data:`ALLOCATOR_SLACK`."""
    if device.kind == "cpu":
        return 0.0
    entry = _calibrated_entry("allocator_slack", device)
    return float(entry["value"]) if entry is not None else ALLOCATOR_SLACK


def constant_source(name: str, device: Device) -> str:
    """Where the value of ``name`` (``cuda_context_bytes`` or ``allocator_slack``) for ``device``
    comes from: the calibration records, or ``default``."""
    entry = _calibrated_entry(name, device)
    if entry is None:
        return "default"
    return "calibrated: " + ", ".join(entry.get("records", [])[:3])


def calibration_note(device: Device) -> str | None:
    """The assumption an estimate states when ``device`` carries the user's calibrated constants
    (:attr:`memest.devices.Device.runtime_constants`); None when it carries none."""
    if not device.runtime_source:
        return None
    if not device.runtime_constants:
        return (f"use_calibration: your calibration records ({device.runtime_source}) hold no one-process CUDA run on "
                f"{device.arch} devices: memest's runtime constants apply")
    names = {"cuda_context_bytes": "the CUDA context", "allocator_slack": "the allocator slack"}
    used = " and ".join(names.get(n, n) for n, _ in device.runtime_constants)
    return (f"use_calibration: {used} of {device.arch} devices from your calibration records "
            f"({device.runtime_source}), in place of memest's")


def nccl_bytes(world_size: int, device: Device) -> int:
    """NCCL buffers per process for a job of ``world_size`` devices on ``device``: 0 for one device,
    and 0 on a CPU (its collectives run over gloo, in host memory the profiler counts as allocations)."""
    return NCCL_BYTES if world_size > 1 and device.kind != "cpu" else 0
