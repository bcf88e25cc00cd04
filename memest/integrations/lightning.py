"""``MemestLightningCallback``: :class:`memest.integrations.hf.MemestCallback`'s behaviour for a Lightning
``Trainer`` (lightning 2.x ``lightning.pytorch.Callback``, or the older ``pytorch_lightning`` package). memest
does not depend on lightning: importing this module without it raises ImportError.

What Lightning hands a callback (lightning 2.6 ``pytorch/callbacks/callback.py``, ``loops/training_epoch_loop.py``):
``on_train_start(trainer, pl_module)`` once the model is set up (on its device, in its precision) and the
optimizers exist; per batch ``on_train_batch_start(trainer, pl_module, batch, batch_idx)`` and
``on_train_batch_end(...)``; ``trainer.global_step`` counts optimizer steps (one per
``accumulate_grad_batches`` batches).

- **The job**: the transformers model is ``pl_module`` itself or the first of its submodules with a
  transformers config; it and ``trainer.optimizers[0]`` are read as :func:`memest.integrations.track.job_of`
  reads a plain loop's, with ``trainer.precision`` (``32-true`` fp32, ``bf16-mixed`` / ``16-mixed`` autocast over
  fp32 parameters: amp, ``bf16-true`` / ``16-true``: 16-bit parameters), ``accumulate_grad_batches`` and
  ``world_size``.
- **The sequence length**: ``seq_len=`` when given, else the first batch's ``input_ids`` (a mapping's, or the
  first tensor of a tuple).
- **The measurement**: as the HF callback, the first optimizer step makes the optimizer states; steps 2 ..
  1 + ``steps`` are measured (the first batch of step 2 starts the meter, the first of each later step laps
  it, the end of the last batch of the last step stops it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

try:
    from lightning.pytorch import Callback
except ImportError:  # the older package name
    from pytorch_lightning import Callback

from memest.integrations._job import DEFAULT_STEPS, Log, Watch, batch_shape, local_device
from memest.integrations.track import job_of

PRECISION = {"32-true": "fp32", "32": "fp32", "64-true": "fp32", "bf16-mixed": "amp", "16-mixed": "amp",
             "bf16-true": "bf16", "16-true": "bf16", "transformer-engine": None}
"""``trainer.precision`` (lightning 2.x ``_PRECISION_INPUT_STR``) -> memest's precision (16-true: the same bytes as
bf16); None: read from the parameters."""


def transformers_model(module: Any) -> Any:
    """``module`` when it has a transformers config, else its first submodule that has one.

    Raises:
        ValueError: none has.
    """
    for m in module.modules():
        if hasattr(getattr(m, "config", None), "to_dict"):
            return m
    raise ValueError(f"{type(module).__name__} holds no transformers model (a module with .config); memest reads "
                     "the architecture from it")


def batch_of(batch: Any) -> tuple[int, int] | None:
    """(micro-batch, tokens) of a Lightning batch: a mapping's ``input_ids``, a tensor, or a tuple's first."""
    if isinstance(batch, Mapping):
        return batch_shape((), batch)
    if isinstance(batch, list | tuple):
        return batch_shape(tuple(batch), {})
    return batch_shape((batch,), {})


class MemestLightningCallback(Callback):
    """Log memest's estimate of the Lightning job, warn before step 1 when it will not fit, and compare it with
    the measured peak of the first steps. Arguments as :class:`memest.integrations.hf.MemestCallback`."""

    def __init__(self, *, seq_len: int | None = None, steps: int = DEFAULT_STEPS, record: bool = True,
                 results_path: str | os.PathLike[str] | None = None, log: Log | None = None, warn: Log | None = None,
                 **settings: Any) -> None:
        if seq_len is not None:
            settings["seq_len"] = seq_len
        self.watch = Watch(steps=steps, record=record, results_path=results_path, log=log, warn=warn,
                           origin="lightning", settings=settings)
        self._begin = 0
        self._seen: int | None = None
        self._job: tuple[Any, ...] | None = None
        self._model: Any = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        w = self.watch
        self._begin = trainer.global_step
        with w.guard("reading the job"):
            if not w.active:
                return
            self._model = transformers_model(pl_module)
            optimizer = trainer.optimizers[0] if trainer.optimizers else None
            config, values, notes = job_of(self._model, optimizer, getattr(trainer.strategy, "model", None))
            precision = PRECISION.get(str(trainer.precision))
            if precision is not None:
                values["precision"] = precision
            values["grad_accum_steps"] = int(trainer.accumulate_grad_batches)
            values["gpus"] = int(trainer.world_size)
            self._job = (config, values, notes, local_device(self._model))
            if "seq_len" in w.settings:
                self._estimate(None)

    def _estimate(self, shape: tuple[int, int] | None) -> None:
        w = self.watch
        with w.guard("estimating the job"):
            if self._job is None or not w.active:
                return
            config, values, notes, device = self._job
            self._job = None
            if shape is not None:
                values = {**values, "micro_batch_size": shape[0], "seq_len": shape[1]}
            w.estimate_job(config, values, notes, device)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        w = self.watch
        if self._job is not None:
            with w.guard("reading the batch"):
                self._estimate(batch_of(batch))
        with w.guard("measuring the steps"):
            done = trainer.global_step - self._begin
            if not w.active or w.estimate is None or done == self._seen:
                return
            self._seen = done
            if done == 1:
                w.start(self._model, trainer.optimizers[0])
            elif 1 < done <= w.steps:
                w.lap()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step - self._begin == 1 + self.watch.steps:
            self.watch.stop()  # on every rank, at the same step (rank 0 gathers); once

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        w = self.watch
        done = trainer.global_step - self._begin
        if done >= 2:
            w.stop()
        else:
            with w.guard("comparing the measured steps"):
                if w.active and w.estimate is not None:
                    w.log(f"memest: the run took {done} optimizer step(s); memest measures the steps after the "
                          "first, so nothing was measured")
