"""``MemestCallback``: memest's estimate of an HF Trainer job, checked against its first steps.

>>> trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[MemestCallback()])  # doctest: +SKIP

What the Trainer hands a callback (transformers 5.24 ``trainer_callback.py``, ``CallbackHandler.call_event``):
``args`` (TrainingArguments), ``state`` and ``control`` positionally, and ``model``, ``optimizer``,
``train_dataloader`` among the keywords. ``_inner_training_loop`` (``trainer.py``) calls ``on_train_begin`` once
the model is wrapped and the optimizer exists, then per optimizer step ``on_step_begin`` (after the step's
micro-batches are fetched), the forwards and backwards, ``optimizer.step()``, ``on_optimizer_step``,
``model.zero_grad()`` and ``on_step_end``.

- **The job** (``on_train_begin``): the model's config, base parameter dtype, PEFT LoRA adapter, 4-bit base,
  checkpointing and attention kernel (:func:`memest.integrations._job.model_keys`) and the TrainingArguments'
  memory keys (``per_device_train_batch_size``, ``gradient_accumulation_steps``, ``bf16`` / ``fp16``,
  ``gradient_checkpointing``, ``optim``, ``use_liger_kernel``, ``deepspeed`` (the config the Trainer filled,
  ``args.hf_deepspeed_config.config``), ``fsdp`` / ``fsdp_config``, trl's ``max_length``) go through the
  recipe reader :mod:`memest.workload.files.trainer`; the stack is ``trl`` for trl's configs, else
  ``hf-trainer``; ``gpus`` is ``args.world_size`` (under torchrun the Trainer wraps the model in
  ``DistributedDataParallel``: the stack's data parallelism); a model already ``fully_shard``-ed (its parameters
  DTensors) without ``fsdp`` / ``deepspeed`` arguments is read as :func:`memest.integrations._job.parallel_of` reads it.
- **The sequence length**: ``seq_len=`` when given (the estimate is then logged at ``on_train_begin``);
  else the first forward's ``input_ids`` shape, read by a forward pre-hook on the model that removes itself
  (the estimate is logged and the fit checked before that forward runs). Reading a batch from the dataloader
  instead would draw from the sampler's random generator and change the run's data order. The micro-batch of
  that forward wins over ``per_device_train_batch_size`` (the last batch of an epoch can be smaller; the
  first is not).
- **The measurement**: the first optimizer step creates the optimizer states; steps 2 .. 1 + ``steps`` are
  measured (``on_step_begin`` of step 2 starts the meter, each later ``on_step_begin`` laps it,
  ``on_step_end`` of the last stops it): on CUDA ``torch.cuda.memory_stats`` peaks and NVML's per-process
  used (nvidia-ml-py), on the CPU the profiler's memory timeline, step by step
  (:mod:`memest.calibration.measure`). Then predicted versus measured per figure is logged and a record
  appended (``record=False`` opts out). Under torchrun every rank measures its own steps; rank 0 alone logs,
  gathers the ranks' figures and appends one record of them all (:class:`memest.integrations._job.Watch`).

Every failure inside the callback is caught and logged once; the run goes on.
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback

from memest.integrations._job import (
    DEFAULT_STEPS,
    Log,
    Watch,
    batch_shape,
    local_device,
    model_keys,
    parallel_of,
    pure_half,
    read_keys,
)
from memest.result import plural

TRAINING_ARGUMENT_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "fp16",
                          "gradient_checkpointing", "optim", "use_liger_kernel", "fsdp", "fsdp_config",
                          "torch_compile", "max_length", "max_seq_length")
"""The TrainingArguments (and trl config) keys handed to the recipe reader: those of
:data:`memest.workload.files.trainer.READS` and ``IGNORED`` that TrainingArguments holds (the model's own keys
come from the model; ``deepspeed`` is added as the Trainer filled it)."""


class MemestCallback(TrainerCallback):
    """Log memest's estimate of the Trainer's job, warn before step 1 when it will not fit, and compare it with
    the measured peak of the first steps (see the module docstring).

    Args:
        seq_len: Tokens per sequence (default: the first forward's).
        steps: Optimizer steps measured after the first (default 2).
        record: Append a ``calibrate/results`` record of the comparison.
        results_path: A folder (``<device>.jsonl`` in it) or a ``.jsonl`` file; default ``./calibrate/results``.
        log: Called with each line (default: the ``memest`` logger at INFO).
        warn: Called with each warning (default: ``log`` when given, else the ``memest`` logger at WARNING).
        settings: memest settings that win over what is read, as :func:`memest.estimate_memory` takes them
            (``gpu="H100"`` to judge the fit on another device, ``headroom=0.05``).

    Attributes:
        watch: The :class:`~memest.integrations._job.Watch`: ``watch.estimate``, ``watch.calibration`` (the
            comparison), ``watch.record_path`` once the steps are measured.
    """

    def __init__(self, *, seq_len: int | None = None, steps: int = DEFAULT_STEPS, record: bool = True,
                 results_path: str | os.PathLike[str] | None = None, log: Log | None = None, warn: Log | None = None,
                 **settings: Any) -> None:
        if seq_len is not None:
            settings["seq_len"] = seq_len
        self.watch = Watch(steps=steps, record=record, results_path=results_path, log=log, warn=warn,
                           origin="hf-callback", settings=settings)
        self._begin_step: int | None = None
        self._hook: Any = None
        self._job: tuple[dict[str, Any], dict[str, Any], list[str], Any] | None = None

    # -- the job --

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        w = self.watch
        self._begin_step = state.global_step
        with w.guard("reading the job"):
            if not w.active or model is None:
                return
            config, values, notes = job_of(model, args)
            self._job = (config, values, notes, local_device(model))
            if "seq_len" in w.settings:
                self._estimate(None)
            else:
                self._hook = model.register_forward_pre_hook(self._first_forward, with_kwargs=True)

    def _first_forward(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._remove_hook()
        self._estimate(batch_shape(args, kwargs))

    def _estimate(self, shape: tuple[int, int] | None) -> None:
        w = self.watch
        with w.guard("estimating the job"):
            if self._job is None or not w.active:
                return
            config, values, notes, device = self._job
            self._job = None
            values = dict(values)
            if shape is not None:
                batch, tokens = shape
                values["seq_len"] = tokens
                if values.get("micro_batch_size") not in (None, batch):
                    notes = [*notes, f"the first forward holds {plural(batch, 'sequence')}, not per_device_train_batch_size "
                                     f"{values['micro_batch_size']}: estimated with {batch}"]
                values["micro_batch_size"] = batch
            w.estimate_job(config, values, notes, device)

    def _remove_hook(self) -> None:
        hook, self._hook = self._hook, None
        if hook is not None:
            hook.remove()

    # -- the measured steps --

    def _done(self, state: Any) -> int:
        return state.global_step - (self._begin_step or 0)

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                      **kwargs: Any) -> None:
        w = self.watch
        with w.guard("measuring the steps"):
            if not w.active or w.estimate is None:
                return
            done = self._done(state)
            if done == 1:
                w.start(model, optimizer)
            elif 1 < done <= w.steps:
                w.lap()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._done(state) == 1 + self.watch.steps:
            self.watch.stop()  # on every rank, at the same step (rank 0 gathers)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        w = self.watch
        self._remove_hook()
        if self._done(state) >= 2:
            w.stop()  # the run ended before 1 + steps optimizer steps: compare those measured (once)
        else:
            with w.guard("comparing the measured steps"):
                if w.active and w.estimate is not None:
                    w.log(f"memest: the run took {self._done(state)} optimizer step(s); memest measures the steps "
                          "after the first, so nothing was measured")


def job_of(model: Any, args: Any) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(config.json contents, memest settings, notes) of a Trainer job: the model's keys and the
    TrainingArguments' read together by :mod:`memest.workload.files.trainer`."""
    from memest.workload import Stack

    config, keys, notes = model_keys(model)
    data = args.to_dict()
    doc = {k: data[k] for k in TRAINING_ARGUMENT_KEYS if k in data and data[k] is not None}
    ds = getattr(args, "hf_deepspeed_config", None)
    if ds is not None and isinstance(getattr(ds, "config", None), dict):
        doc["deepspeed"] = ds.config
    elif data.get("deepspeed"):
        doc["deepspeed"] = data["deepspeed"]
    doc.update(keys)
    values, read_notes = read_keys(doc, "TrainingArguments")
    trl = type(args).__module__.split(".")[0] == "trl"
    values["stack"] = Stack.TRL if trl else Stack.HF_TRAINER
    world = int(getattr(args, "world_size", 1) or 1)
    parallel, par_notes = parallel_of(model, world)
    if any(values.get(k) for k in ("framework", "fsdp", "zero_stage")):
        parallel = {"gpus": world}  # the TrainingArguments' FSDP / DeepSpeed settings say it
    elif "framework" not in parallel:
        parallel, par_notes = {"gpus": world}, []  # the Trainer wraps its DDP itself (args.world_size ranks)
    values.update(parallel)
    return config, values, notes + read_notes + par_notes + pure_half(values, keys.get("torch_dtype"))
