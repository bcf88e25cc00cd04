"""The analytic estimator: closed-form memory terms from a ModelSpec and a workload.

Symbols used in formulas and docstrings throughout this package:

    P  parameters (on the rank, after TP/PP/EP sharding unless said otherwise)
    b  micro_batch_size          s  seq_len              h  hidden_size
    L  num_layers                a  num_heads            k  num_kv_heads
    d  head_dim                  i  intermediate_size    V  vocab_size
    t  tp degree                 N  ZeRO sharding degree (dp x cp)
    c  bytes per element of the compute dtype            e  bytes per KV-cache element

This package imports only the standard library and memest; it never imports torch.
"""

from __future__ import annotations

import dataclasses

from memest.devices import Device, Fleet
from memest.errors import InputError
from memest.estimate import runtime
from memest.estimate.serving import estimate_serving
from memest.estimate.training import estimate_training
from memest.result import Estimate
from memest.spec import ModelSpec
from memest.workload import ServingConfig, TrainingConfig, Workload, validate

__all__ = ["estimate"]


def estimate(spec: ModelSpec, workload: Workload, device: Device | Fleet) -> Estimate:
    """Per-device memory of running ``workload`` on ``spec`` with ``device`` accelerators.

    Args:
        spec: The model.
        workload: A TrainingConfig or ServingConfig (its parallelism gives the device count).
        device: The accelerator (runtime constants and, for serving, the engine's budget), or the
            unlike devices of a :class:`~memest.devices.Fleet` (serving only, one per rank): llama.cpp /
            Ollama split the layers over them (one rank per device); vLLM, SGLang and TensorRT-LLM run at
            the smallest card (:func:`memest.estimate.serving.estimate_serving`).

    Raises:
        InputError: the workload does not fit the model (see :func:`memest.workload.validate`); a
            fleet the job cannot run on (:func:`memest.workload.resolve.check_fleet`).
    """
    validate(spec, workload)
    if isinstance(device, Fleet):
        from memest.workload.resolve import check_fleet

        mode = "serve" if isinstance(workload, ServingConfig) else "train"
        check_fleet(mode, workload.engine if isinstance(workload, ServingConfig) else None, device)
        if len(device) != workload.parallelism.world_size:
            raise InputError(f"{{gpu}} {device.name!r} lists {len(device)} devices for a job on "
                             f"{workload.parallelism.world_size}; give one device per rank", field="gpu")
        if not device.mixed:
            device = device.devices[0]
        else:
            est = estimate_serving(spec, workload, device)
            return _without_cuda_context(est, device.smallest) if not any(
                runtime.has_cuda_context(d) for d in device.devices) else est
    if isinstance(workload, TrainingConfig):
        return _calibrated(_without_cuda_context(estimate_training(spec, workload, device), device), device)
    if isinstance(workload, ServingConfig):
        return _calibrated(_without_cuda_context(estimate_serving(spec, workload, device), device), device)
    raise TypeError(f"workload must be a TrainingConfig or ServingConfig, not {type(workload).__name__}")


def _calibrated(est: Estimate, device: Device) -> Estimate:
    """``est`` saying, in its assumptions, that the device's runtime constants are the user's
    (:func:`memest.estimate.runtime.calibration_note`)."""
    note = runtime.calibration_note(device)
    return est if note is None else dataclasses.replace(est, assumptions=(*est.assumptions, note))


def _without_cuda_context(est: Estimate, device: Device) -> Estimate:
    """``est`` without its ``runtime.cuda_context`` terms on a device that has no CUDA context
    (:func:`memest.estimate.runtime.has_cuda_context`: they are 0 B there), saying so in its assumptions."""
    if runtime.has_cuda_context(device) or device.kind == "cpu":
        return est
    ranks = tuple(dataclasses.replace(r, terms=tuple(t for t in r.terms if t.name != "runtime.cuda_context"))
                  for r in est.ranks)
    return dataclasses.replace(est, ranks=ranks, assumptions=(*est.assumptions, runtime.no_context_note(device)))
