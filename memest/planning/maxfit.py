"""Max queries: the largest micro-batch, seq_len, concurrency or context that fits a given setup.

Found by search over the estimator, not by inverting a formula, so it stays right whatever the
terms become: an exponential search doubles the value until it stops fitting, then a bisection
narrows the gap to one step. The answer is exact at the boundary — the answer fits and
answer + step does not — provided memory does not decrease as the value grows (every term of the
estimator grows or stays flat with micro-batch, tokens and sequences; ``tests/test_plan_maxfit.py``
checks it on the catalog).

A value the estimator rejects (vLLM refuses a max_model_len beyond max_position_embeddings) is a
boundary too: the answer then says why (:attr:`Largest.limit`) instead of "memory".

The serving estimator may also offer closed-form vLLM inverses (KV blocks -> concurrency); this
module is the generic one and works for any setting and engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memest.devices import Device, Fleet
from memest.errors import InputError
from memest.estimate import estimate
from memest.planning.fit import Verdict, verdict
from memest.spec import ModelSpec
from memest.workload import Engine, ServingConfig, TrainingConfig, Workload

QUERIES: dict[str, tuple[str, ...]] = {
    "train": ("micro_batch_size", "seq_len"),
    "serve": ("batch_size", "max_model_len"),
}
"""The settings queried per mode: training asks for the largest micro-batch and sequence; serving
for the largest number of concurrent sequences (``--batch-size``) and context (``--max-model-len``)."""

CAPS: dict[str, int] = {
    "micro_batch_size": 1 << 16,
    "seq_len": 1 << 24,
    "batch_size": 1 << 20,
    "max_model_len": 1 << 24,
}
"""Where the search stops: an answer equal to the cap is reported as ``capped`` (larger may fit)."""

FLAGS: dict[str, str] = {
    "micro_batch_size": "--micro-batch-size",
    "seq_len": "--seq-len",
    "batch_size": "--batch-size",
    "max_model_len": "--max-model-len",
}


@dataclass(frozen=True, slots=True)
class Largest:
    """The answer to one max query.

    Attributes:
        setting: The workload field searched (``seq_len``, ...).
        value: The largest value that fits; None when not even the smallest (:func:`query_start`) fits.
        step: Values searched are multiples of this (2 x cp for seq_len under context parallelism).
        capped: True when ``value`` is the search cap; larger values may fit too.
        evaluated: Estimates computed.
        limit: What stops value + step: ``"memory"``, or the estimator's reason for rejecting it
            (an InputError's message, e.g. the model's max_position_embeddings).
    """

    setting: str
    value: int | None
    step: int
    capped: bool
    evaluated: int
    limit: str = "memory"


def query_step(workload: Workload, setting: str) -> int:
    """The granularity of a setting: seq_len under context parallelism moves in steps of 2 x cp."""
    if setting == "seq_len" and isinstance(workload, TrainingConfig) and workload.parallelism.cp > 1:
        return 2 * workload.parallelism.cp
    return 1


def query_start(workload: Workload, setting: str) -> int:
    """The smallest value of a setting the workload allows: one step, or for an hf max_model_len the
    prompt and the generated tokens it must hold (prompt_len + max_new_tokens; a prompt of at least
    one token when only max_new_tokens is given)."""
    step = query_step(workload, setting)
    if setting == "max_model_len" and isinstance(workload, ServingConfig) \
            and (workload.prompt_len is not None or workload.max_new_tokens is not None):
        least = (workload.prompt_len or 1) + (workload.max_new_tokens or 0)
        return max(step, -(-least // step) * step)
    return step


def largest(spec: ModelSpec, workload: Workload, device: Device, setting: str, *, headroom: float,
            cap: int | None = None) -> Largest:
    """The largest value of ``setting`` for which ``workload`` still fits ``device``.

    Args:
        spec: The model.
        workload: The setup; every field but ``setting`` is held.
        device: The accelerator.
        setting: A field of :data:`QUERIES` for the workload's mode.
        headroom: Share of device memory kept free (the fit rule of :mod:`memest.planning.fit`).
        cap: The largest value tried (default :data:`CAPS`).

    Raises:
        InputError: ``setting`` does not belong to the workload's mode, or the workload is invalid
            even at the smallest value (:func:`query_start`).
    """
    if setting not in QUERIES[_mode(workload)]:
        allowed = ", ".join(FLAGS[s] for s in QUERIES[_mode(workload)])
        raise InputError(f"{FLAGS.get(setting, setting)} cannot be searched for a {workload.mode} job; use one of {allowed}")
    step = query_step(workload, setting)
    start = query_start(workload, setting)
    limit = max(start, (cap or CAPS[setting]) // step * step)
    count = workload.parallelism.world_size
    evaluated = 0

    rejected: dict[int, str] = {}

    def fits(value: int) -> bool:
        nonlocal evaluated
        evaluated += 1
        w = workload.replace(**{setting: value})
        if value == start:
            est = estimate(spec, w, device)  # rejected here: invalid whatever the value, so raise
        else:
            try:
                est = estimate(spec, w, device)
            except InputError as exc:
                rejected[value] = str(exc)
                return False
        return verdict(est, device, count, headroom).fits

    if not fits(start):
        return Largest(setting, None, step, False, evaluated)
    good = start
    while True:  # exponential search: fits(good) holds
        nxt = min(good * 2, limit)
        if nxt == good:
            return Largest(setting, good, step, True, evaluated)
        if not fits(nxt):
            bad = nxt
            break
        good = nxt
    while bad - good > step:  # bisection: fits(good), not fits(bad)
        mid = good + (bad - good) // step // 2 * step
        if fits(mid):
            good = mid
        else:
            bad = mid
    return Largest(setting, good, step, False, evaluated, rejected.get(bad, "memory"))


def limits(spec: ModelSpec, workload: Workload, device: Device, *, headroom: float) -> tuple[Largest, ...]:
    """Every max query of the workload's mode (:data:`QUERIES`), each holding the other settings."""
    return tuple(largest(spec, workload, device, s, headroom=headroom) for s in QUERIES[_mode(workload)])


UTILIZATION_STEP = 100
"""``largest_utilization`` searches gpu_memory_utilization in steps of 1 / 100."""


def largest_utilization(spec: ModelSpec, workload: ServingConfig, device: Device | Fleet, *, headroom: float,
                        below: float | None = None) -> float | None:
    """The largest ``--gpu-memory-utilization`` (a multiple of 0.01, at most 1.0 and, with ``below``,
    under it) at which the vLLM ``workload`` fits ``device`` (:func:`memest.planning.fit.verdict`); None when
    none does, or the engine is not vLLM. On unlike devices (a :class:`~memest.devices.Fleet`) the verdict is
    the least margin over the cards, so the value is the largest at which every card fits.

    Utilization pulls the fit rule two ways: vLLM's share grows with it, so what the process holds
    on the device (rule 3 of :mod:`memest.planning.fit`) grows with it, while the KV pool left after the
    weights and the activation peak (rules 1 and 2) grows with it too. Rule 3 alone holds up to some
    value u3, found by bisection; the job fits at some value exactly when it fits at u3, because at
    any lower value the pool is no larger. ``tests/test_plan_maxfit.py`` compares it with a scan of
    every value.
    """
    if not isinstance(workload, ServingConfig) or workload.engine is not Engine.VLLM:
        return None
    count = workload.parallelism.world_size

    def judge(k: int) -> Verdict:
        w = workload.replace(gpu_memory_utilization=k / UTILIZATION_STEP)
        return verdict(estimate(spec, w, device), device, count, headroom)

    def within_capacity(k: int) -> bool:
        v = judge(k)
        return v.needed_bytes <= v.usable_bytes

    top = UTILIZATION_STEP if below is None else math.ceil(below * UTILIZATION_STEP - 1e-9) - 1
    if top < 1 or not within_capacity(1):
        return None
    good, bad = 1, top + 1  # within_capacity(good); bad is past the top or over capacity
    if within_capacity(top):
        good = top
    else:
        bad = top
        while bad - good > 1:
            mid = (good + bad) // 2
            if within_capacity(mid):
                good = mid
            else:
                bad = mid
    return good / UTILIZATION_STEP if judge(good).fits else None


def _mode(workload: Workload) -> str:
    return "train" if isinstance(workload, TrainingConfig) else "serve"
