"""``memest.track``: memest's estimate of a plain PyTorch training loop, checked against the steps it runs.

>>> with memest.track(model, optimizer, seq_len=1024, micro_batch_size=4) as t:  # doctest: +SKIP
...     for batch in batches:
...         loss = model(**batch).loss; loss.backward(); optimizer.step(); optimizer.zero_grad()
>>> t.report  # doctest: +SKIP

The job is read from the objects (:func:`memest.integrations._job.model_keys`: the model's config, base
parameter dtype, PEFT LoRA adapter, 4-bit base, checkpointing, attention kernel; the optimizer's class,
:func:`~memest.integrations._job.optimizer_value`) with the stack ``pytorch``; what the objects cannot say is
given as memest settings: ``seq_len`` and ``micro_batch_size`` (else the first forward's ``input_ids`` shape,
read by a forward pre-hook), ``precision`` (read from the parameters: ``fp32`` or ``bf16``; a loop whose forward
runs under ``torch.autocast`` over fp32 parameters is ``precision="amp"``, read where the estimate is made: the first
forward, or the block's entry when ``seq_len`` is given, :func:`~memest.integrations._job.autocast_precision`),
``grad_accum_steps``, ``gpu``.

The block is measured step by step (:mod:`memest.calibration.measure`: the CUDA allocator's peak statistics
and NVML, or the CPU profiler's memory timeline: keep the block to a few steps on the CPU): the first forward of
each optimizer step after the first inside the block (every ``grad_accum_steps`` forwards, read by the same
forward pre-hook) closes one measured window and opens the next, so the CPU figure is the smallest step's peak,
as ``memest calibrate`` takes it (a free that gloo makes on its own thread is missed by the profiler and only ever
adds bytes to a step). Keep evaluation forwards out of the block. The estimate is of the steady state, with the
optimizer states already made: run one step before the block for the figure memest predicts (a first step
inside it also makes the states, at its optimizer step).

Under torchrun (a torch.distributed process group) the data parallelism is read from the model handed over
(:func:`~memest.integrations._job.parallel_of`: ``DistributedDataParallel`` or FSDP2 ``fully_shard`` units,
``gpus`` the world size); every rank measures its block, rank 0 alone logs, gathers the ranks' figures and
appends one record of them all (:class:`~memest.integrations._job.Watch`). Enter and leave the block on every
rank.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from memest.integrations._job import (
    Log,
    Watch,
    autocast_precision,
    batch_shape,
    local_device,
    model_keys,
    optimizer_value,
    parallel_of,
    pure_half,
    rank_of,
    read_keys,
)


class Tracked:
    """What :func:`track` yields: the watch of the block, its estimate and, after the block, the comparison.

    Attributes:
        watch: The :class:`~memest.integrations._job.Watch`.
    """

    def __init__(self, watch: Watch) -> None:
        self.watch = watch

    @property
    def estimate(self) -> Any:
        """The :class:`~memest.result.Estimate` (None until the first forward when ``seq_len`` was not given)."""
        return self.watch.estimate

    @property
    def calibration(self) -> Any:
        """The :class:`~memest.calibration.compare.Calibration` after the block (None before, or on failure)."""
        return self.watch.calibration

    @property
    def report(self) -> list[dict[str, Any]]:
        """Predicted versus measured per figure of rank 0 after the block: ``{"name", "predicted",
        "measured", "error"}`` (bytes; error = (predicted - measured) / measured); empty before."""
        cal = self.watch.calibration
        if cal is None:
            return []
        return [{"name": r.name, "predicted": r.predicted, "measured": r.measured, "error": r.error}
                for r in cal.ranks[0].rows]

    @property
    def record_path(self) -> Any:
        """The records file appended to, or None."""
        return self.watch.record_path


@contextmanager
def track(model: Any, optimizer: Any = None, *, steps: int = 1, record: bool = True,
          results_path: str | os.PathLike[str] | None = None, log: Log | None = None, warn: Log | None = None,
          **settings: Any) -> Iterator[Tracked]:
    """Estimate the loop's job, measure the block, log predicted versus measured (see the module docstring).

    Args:
        model: A transformers model (PEFT-wrapped or not), on the device it trains on.
        optimizer: Its torch optimizer (its class gives ``optimizer``; its states are counted as measured).
        steps: Unused (kept for the signature): the record stores the measured steps the block ran.
        record, results_path, log, warn: As :class:`memest.integrations.hf.MemestCallback`.
        settings: memest settings that win over what is read (``seq_len``, ``micro_batch_size``,
            ``precision``, ``grad_accum_steps``, ``gpu``, ``headroom``).

    Yields:
        A :class:`Tracked`.
    """
    watch = Watch(steps=steps, record=record, results_path=results_path, log=log, warn=warn, origin="track",
                  settings=settings)
    tracked = Tracked(watch)
    hook = None
    job: list[Any] = []
    per_step = settings.get("grad_accum_steps", 1)
    forwards = 0

    def pre_forward(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        nonlocal forwards
        forwards += 1
        if job:
            _estimate(watch, job, batch_shape(args, kwargs))
            return
        with watch.guard("measuring the block"):
            if watch.active and forwards > 1 and (forwards - 1) % per_step == 0:
                watch.lap()  # the first forward of the next optimizer step

    with watch.guard("reading the job"):
        if watch.active:
            job.append((*job_of(model, optimizer), local_device(model)))
            if "seq_len" in settings:
                _estimate(watch, job, None)
            hook = model.register_forward_pre_hook(pre_forward, with_kwargs=True)
    with watch.guard("measuring the block"):
        if watch.active:
            watch.start(model, optimizer)
    try:
        yield tracked
    finally:
        if hook is not None:
            hook.remove()
        watch.stop()  # on every rank (rank 0 gathers)
        with watch.guard("comparing the block"):
            if watch.active and watch.estimate is None:
                watch.log("memest: the block ran no forward with input_ids and no seq_len was given: nothing to "
                          "compare")


def _estimate(watch: Watch, job: list[Any], shape: tuple[int, int] | None) -> None:
    with watch.guard("estimating the job"):
        if not job or not watch.active:
            return
        config, values, notes, device = job.pop()
        notes = notes + autocast_precision(values, "cpu" if device.kind == "cpu" else "cuda")
        if shape is not None:
            values.setdefault("micro_batch_size", shape[0])
            values["seq_len"] = shape[1]
        watch.estimate_job(config, values, notes, device)


def job_of(model: Any, optimizer: Any, wrapped: Any = None) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(config.json contents, memest settings, notes) of a plain PyTorch loop's model and optimizer; the data
    parallelism is read from ``wrapped`` (the module the loop calls, when it is not ``model``)."""
    from memest.workload import Stack

    config, keys, notes = model_keys(model)
    values, read_notes = read_keys({"bf16": False, "fp16": False, **keys}, "the model")
    values["stack"] = Stack.PYTORCH
    name, opt_notes = optimizer_value(optimizer) if optimizer is not None else (None, [])
    if name is not None:
        values["optimizer"] = name
    parallel, par_notes = parallel_of(model if wrapped is None else wrapped, rank_of()[1])
    half = pure_half(values, keys.get("torch_dtype")) if "precision" not in parallel else []
    values.update(parallel)
    return config, values, notes + read_notes + opt_notes + par_notes + half
