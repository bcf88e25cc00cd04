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

from memest.devices import Device
from memest.estimate import runtime
from memest.estimate.serving import estimate_serving
from memest.estimate.training import estimate_training
from memest.result import Estimate
from memest.spec import ModelSpec
from memest.workload import ServingConfig, TrainingConfig, Workload, validate

__all__ = ["estimate"]


def estimate(spec: ModelSpec, workload: Workload, device: Device) -> Estimate:
    """Per-device memory of running ``workload`` on ``spec`` with ``device`` accelerators.

    Args:
        spec: The model.
        workload: A TrainingConfig or ServingConfig (its parallelism gives the device count).
        device: The accelerator (runtime constants and, for serving, the engine's budget).

    Raises:
        InputError: the workload does not fit the model (see :func:`memest.workload.validate`).
    """
    validate(spec, workload)
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
