"""``memest.track``: memest's estimate of a plain PyTorch training loop, checked against the steps it runs.

>>> with memest.track(model, optimizer, seq_len=1024, micro_batch_size=4) as t:  # doctest: +SKIP
...     for batch in batches:
...         loss = model(**batch).loss; loss.backward(); optimizer.step(); optimizer.zero_grad()
>>> t.report  # doctest: +SKIP

The job is read from the objects (:func:`memest.integrations._job.model_keys`: the model's config, base
parameter dtype, PEFT LoRA adapter, 4-bit base, checkpointing, attention kernel; the optimizer's class,
:func:`~memest.integrations._job.optimizer_value`) with the stack ``pytorch``; what the objects cannot say is
given as memest settings: ``seq_len`` and ``micro_batch_size`` (else the first forward's ``input_ids`` shape,
read by a forward pre-hook), ``precision`` (read from the parameters: ``fp32`` or ``bf16``; a loop under
``torch.autocast(bf16)`` over fp32 parameters is ``precision="amp"``), ``grad_accum_steps``, ``gpu``.

The block is measured as one window (:mod:`memest.calibration.measure`: the CUDA allocator's peak statistics
and NVML, or the CPU profiler's memory timeline over the block: keep the block to a few steps on the CPU). The
estimate is of the steady state, with the optimizer states already made: run one step before the block for
the figure memest predicts (a first step inside it also makes the states, at its optimizer step).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from memest.integrations._job import Log, Watch, batch_shape, local_device, model_keys, optimizer_value, pure_half, read_keys


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
        steps: Stored in the record as the measured steps (the block is one window).
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
    with watch.guard("reading the job"):
        if watch.active:
            job.append((*job_of(model, optimizer), local_device(model)))
            if "seq_len" in settings:
                _estimate(watch, job, None)
            else:
                def first(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
                    hook.remove()
                    _estimate(watch, job, batch_shape(args, kwargs))

                hook = model.register_forward_pre_hook(first, with_kwargs=True)
    with watch.guard("measuring the block"):
        if watch.active:
            watch.start(model, optimizer)
    try:
        yield tracked
    finally:
        if hook is not None:
            hook.remove()
        with watch.guard("comparing the block"):
            if watch.active and watch.estimate is not None:
                watch.stop()
            elif watch.active:
                watch._drop_meter()
                watch.log("memest: the block ran no forward with input_ids and no seq_len was given: nothing to "
                          "compare")


def _estimate(watch: Watch, job: list[Any], shape: tuple[int, int] | None) -> None:
    with watch.guard("estimating the job"):
        if not job or not watch.active:
            return
        config, values, notes, device = job.pop()
        if shape is not None:
            values.setdefault("micro_batch_size", shape[0])
            values["seq_len"] = shape[1]
        watch.estimate_job(config, values, notes, device)


def job_of(model: Any, optimizer: Any) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(config.json contents, memest settings, notes) of a plain PyTorch loop's model and optimizer."""
    from memest.workload import Stack

    config, keys, notes = model_keys(model)
    values, read_notes = read_keys({"bf16": False, "fp16": False, **keys}, "the model")
    values["stack"] = Stack.PYTORCH
    name, opt_notes = optimizer_value(optimizer) if optimizer is not None else (None, [])
    if name is not None:
        values["optimizer"] = name
    return config, values, notes + read_notes + opt_notes + pure_half(values, keys.get("torch_dtype"))
