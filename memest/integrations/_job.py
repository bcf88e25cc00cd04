"""What the integrations share: the job read from its objects, its estimate, its measurement and its record.

:func:`model_keys` reads a model (its transformers config, the dtype its base parameters hold, its PEFT LoRA
adapters, 4-bit quantization, gradient checkpointing, attention kernel) as TrainingArguments / trl keys, so
that one reader, :mod:`memest.workload.files.trainer` (through :func:`memest.workload.files.read_data`), turns
them and a Trainer's arguments into memest's settings. :class:`Watch` does the rest for one job: the estimate
through :func:`memest.api.estimate_values`, the warning before the first step, the meter over the measured steps
(:class:`~memest.calibration.measure.CudaMeter` / :class:`~memest.calibration.measure.CpuMeter`, as
``memest calibrate`` measures), the comparison (:func:`memest.calibration.compare.evaluate`) and the record
(:func:`memest.calibration.records.build_record`, :func:`~memest.calibration.records.append_record`).

Many processes (torchrun, accelerate launch): :func:`rank_of` reads the rank and world size from
torch.distributed (else torchrun's ``RANK`` / ``WORLD_SIZE``), :func:`parallel_of` the data parallelism from the
model as wrapped (``DistributedDataParallel``, FSDP2 ``fully_shard`` units). Every rank estimates and measures its
own steps; rank 0 alone logs, gathers the ranks' figures at the stop (``dist.gather_object``, as ``memest
calibrate --nproc`` gathers its workers') and appends one record of them all, so no two processes write the
records file (:func:`~memest.calibration.records.append_record` also locks it, for separate jobs).

Every failure inside a :class:`Watch` is caught and logged once (:meth:`Watch.guard`); the job goes on. The
gather is the one collective: :meth:`Watch.stop` joins it on every rank at the same step, a failed rank sending
nothing. torch is imported inside functions only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from memest.errors import InputError

Log = Callable[[str], Any]
"""Where the integrations' lines go: called with one line of text."""

LOGGER = logging.getLogger("memest")
"""The default destination: INFO for the estimate and the comparison, WARNING for a job that will not fit and
for a failure inside memest."""

DEFAULT_STEPS = 2
"""Optimizer steps measured after the first (which creates the optimizer states): as ``memest calibrate``,
at least two (:data:`memest.calibration.request.DEFAULT_TRAIN_STEPS` is 3; two keep the profiled window short
inside a real run)."""


def default_log(level: int) -> Log:
    """:data:`LOGGER` at ``level``."""
    return lambda line: LOGGER.log(level, line)


# ---- the job, read from its objects ----


def base_model(model: Any) -> Any:
    """The model under its wrappers: PEFT's ``get_base_model()``, DDP / FSDP's ``module``."""
    while hasattr(model, "module") and not hasattr(model, "config"):
        model = model.module
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def model_keys(model: Any) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(config.json contents, TrainingArguments / trl keys, notes) of a transformers model as it is now.

    The keys (read by :mod:`memest.workload.files.trainer`): ``torch_dtype`` (the dtype holding most of the
    base parameters' elements), ``attn_implementation`` (``config._attn_implementation``),
    ``gradient_checkpointing`` (``is_gradient_checkpointing``), and with PEFT LoRA adapters ``use_peft``,
    ``lora_r``, ``lora_dropout``, ``lora_target_modules`` (the active adapter's ``LoraConfig``) and
    ``load_in_4bit`` (a bitsandbytes 4-bit base). A bitsandbytes ``quantization_config`` is dropped from the
    config (memest's QLoRA sizes the NF4 base itself).

    Raises:
        InputError: the model has no transformers config.
    """
    base = base_model(model)
    config = getattr(base, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise InputError(f"the model ({type(base).__name__}) has no transformers config (model.config); memest reads "
                         "the architecture from it: pass a transformers PreTrainedModel, or estimate with "
                         "memest.estimate_memory(config, ...)", field="model")
    cfg = json.loads(json.dumps(config.to_dict(), default=str))
    keys: dict[str, Any] = {}
    notes: list[str] = []
    counts: Counter[str] = Counter()
    trainable = total = 0
    for name, p in model.named_parameters():
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
        if "lora_" not in name:
            counts[str(p.dtype).removeprefix("torch.")] += p.numel()
    quant = cfg.get("quantization_config") or {}
    four_bit = bool(getattr(base, "is_loaded_in_4bit", False) or quant.get("load_in_4bit"))
    if quant.get("quant_method") == "bitsandbytes" or four_bit or quant.get("load_in_8bit"):
        cfg.pop("quantization_config", None)
    if quant.get("load_in_8bit"):
        notes.append("the base is loaded in 8 bits (bitsandbytes load_in_8bit): memest keeps it at 16 bits")
    dtypes = [d for d, _ in counts.most_common() if d not in ("uint8", "int8")]
    if dtypes:
        keys["torch_dtype"] = dtypes[0]
    attn = getattr(config, "_attn_implementation", None)
    if isinstance(attn, str):
        keys["attn_implementation"] = attn
    checkpointing = "is_activation_checkpointing" if hasattr(type(base), "is_activation_checkpointing") else \
        "is_gradient_checkpointing"  # transformers 5 renamed it (the old name warns)
    if getattr(base, checkpointing, False):
        keys["gradient_checkpointing"] = True
    peft = getattr(model, "peft_config", None)
    if isinstance(peft, Mapping) and peft:
        active = getattr(model, "active_adapter", None)
        adapter = peft.get(active) if isinstance(active, str) and active in peft else next(iter(peft.values()))
        kind = str(getattr(getattr(adapter, "peft_type", None), "value", getattr(adapter, "peft_type", "")))
        if kind.upper() == "LORA":
            keys["use_peft"] = True
            keys["lora_r"] = int(adapter.r)
            keys["lora_dropout"] = float(adapter.lora_dropout)
            targets = adapter.target_modules
            if targets is not None:
                keys["lora_target_modules"] = targets if isinstance(targets, str) else sorted(targets)
            keys["load_in_4bit"] = four_bit
            if len(peft) > 1:
                notes.append(f"the model holds {len(peft)} PEFT adapters; memest estimates the active one "
                             f"({active}) alone")
        else:
            notes.append(f"PEFT {kind or type(adapter).__name__} adapters are not modelled (memest models LoRA); "
                         "estimated as a full fine-tune")
    elif total and trainable < total:
        notes.append(f"{trainable:,} of {total:,} parameters are trainable (no PEFT LoRA adapter found): memest "
                     "estimates every parameter trained")
    return cfg, keys, notes


def read_keys(doc: dict[str, Any], name: str) -> tuple[dict[str, Any], list[str]]:
    """memest's settings (and notes) from TrainingArguments / trl keys, through the recipe reader."""
    from memest.workload import files

    found = files.read_data({"output_dir": name, **doc}, name)
    return dict(found.values), list(found.notes)


def pure_half(values: dict[str, Any], dtype: str | None) -> list[str]:
    """A model held in bf16 / fp16 trains in that dtype whatever the autocast switch: precision ``bf16`` (the
    recipe reader's rule covers a full fine-tune with ``torch_dtype``; this covers LoRA's base and a run without
    the switch). DeepSpeed's precision (``mixed`` / ``fp16``) stays. Returns the note, if any."""
    from memest.workload import Framework, Precision

    if dtype not in ("bfloat16", "float16") or values.get("framework") is Framework.DEEPSPEED:
        return []
    if values.get("precision") in (None, Precision.AMP, Precision.FP32):
        values["precision"] = Precision.BF16
        if dtype == "float16":
            return ["the parameters are float16: estimated as pure 16-bit (precision bf16, the same bytes)"]
    return []


def autocast_precision(values: dict[str, Any], device_type: str) -> list[str]:
    """A loop that runs its forward under ``torch.autocast`` over fp32 parameters (read where it is called: the
    first forward, or the block's entry) trains ``precision="amp"`` (fp32 weights, gradients and optimizer, the
    matmuls in the autocast dtype: the weight copies autocast makes, ``memest.workload.config.Precision.AMP``).
    Sets it in ``values`` when they say fp32 (the parameters' dtype); returns the note, if any. The autocast state
    is ``torch.is_autocast_enabled(device_type)`` / ``torch.get_autocast_dtype(device_type)`` (torch >= 2.4)."""
    import torch

    from memest.workload import Precision

    if values.get("precision") is not Precision.FP32 or not torch.is_autocast_enabled(device_type):
        return []
    dtype = torch.get_autocast_dtype(device_type)
    if dtype not in (torch.bfloat16, torch.float16):
        return []
    values["precision"] = Precision.AMP
    name = str(dtype).removeprefix("torch.")
    return [f"the forward runs under torch.autocast({name}) over fp32 parameters: precision amp (fp32 params, "
            f"autocast {'bf16' if dtype is torch.bfloat16 else 'fp16'})"]


def optimizer_value(optimizer: Any) -> tuple[str | None, list[str]]:
    """memest's ``optimizer`` value for a torch optimizer object (None and a note when it is not one memest
    models). torch AdamW / Adam: ``adamw_fused`` with ``fused=True``, else ``adamw``; SGD: ``sgd`` (no momentum:
    torch SGD without momentum keeps no state); transformers / bitsandbytes names as the Trainer's ``optim``."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer
    kind = type(inner).__name__
    defaults = getattr(inner, "defaults", {}) or {}
    if kind in ("AdamW", "Adam"):
        return ("adamw_fused" if defaults.get("fused") else "adamw"), []
    if kind == "SGD":
        if defaults.get("momentum"):
            return None, [f"SGD with momentum {defaults['momentum']} is not modelled (memest's sgd keeps no state)"]
        return "sgd", []
    by_name = {"Adafactor": "adafactor", "AdamW8bit": "adamw8bit", "PagedAdamW8bit": "paged_adamw8bit",
               "PagedAdamW": "paged_adamw32bit", "PagedAdamW32bit": "paged_adamw32bit",
               "Lion": "lion", "Lion32bit": "lion"}
    if kind in by_name:
        return by_name[kind], []
    return None, [f"the optimizer {kind} is not one memest models; the stack's default is assumed"]


def rank_of() -> tuple[int, int]:
    """(rank, world size) of this process: torch.distributed's when it is initialised, else torchrun's
    ``RANK`` / ``WORLD_SIZE``, else (0, 1)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def parallel_of(model: Any, world: int) -> tuple[dict[str, Any], list[str]]:
    """memest's data-parallel settings (and notes) for the model as it is wrapped, in a job of ``world`` processes.

    - **FSDP2** (``torch.distributed.fsdp.fully_shard``: the model or its submodules are ``FSDPModule``, the
      parameters DTensors): ``framework`` fsdp; ``zero_stage`` 3 when the units below the root reshard their
      parameters after forward (``FSDPParamGroup.post_forward_mesh_info`` set: FULL_SHARD), else 2
      (``reshard_after_forward=False``: SHARD_GRAD_OP); ``precision`` fsdp2 when the units' ``MixedPrecisionPolicy``
      computes in bf16 over the sharded parameters (``param_dtype`` bfloat16; otherwise the parameters' dtype
      says, :func:`model_keys`). Read from torch 2.13 ``distributed/fsdp/_fully_shard/_fsdp_param_group.py``:
      the root's own group never reshards after forward (``FSDPState._lazy_init``), so it is not read.
    - **DDP** (``torch.nn.parallel.DistributedDataParallel``): ``framework`` ddp (a full replica per rank plus the
      gradient buckets, :mod:`memest.estimate.training.ddp`).
    - Neither, with ``world`` > 1: the stack's data parallelism over ``world`` ranks, said in a note (the
      wrapper may be outside what was handed over).

    ``gpus`` is ``world`` in every case.
    """
    values: dict[str, Any] = {"gpus": world}
    notes: list[str] = []
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:  # a torch without torch.distributed
        return values, notes
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if units:
        from memest.workload import Framework, Precision

        below = [u for u in units if u is not model]
        groups = [g for g in (_param_group(u) for u in below) if g is not None]
        values["framework"] = Framework.FSDP
        values["zero_stage"] = 3 if any(g.post_forward_mesh_info is not None for g in groups) else 2
        if not below:
            notes.append("fully_shard wraps the model alone (no unit per decoder layer): memest estimates one "
                         "unit per decoder layer")
        mp = next((g.mp_policy for g in (groups or [_param_group(model)]) if g is not None), None)
        import torch

        if mp is not None and mp.param_dtype == torch.bfloat16:
            values["precision"] = Precision.FSDP2
        mesh = next((getattr(p, "device_mesh", None) for p in model.parameters()), None)
        if mesh is not None and mesh.ndim > 1:
            notes.append(f"the FSDP mesh has {mesh.ndim} dimensions (HSDP): memest estimates sharding over all "
                         f"{world} ranks")
        return values, notes
    if isinstance(model, DistributedDataParallel):
        from memest.workload import Framework

        values["framework"] = Framework.DDP
        if getattr(model, "gradient_as_bucket_view", False):
            notes.append("DistributedDataParallel(gradient_as_bucket_view=True): the gradients are views of the "
                         "buckets; memest counts both")
    elif world > 1:
        notes.append(f"{world} processes and the model is neither a DistributedDataParallel module nor "
                     "fully_shard-ed: estimated with the stack's data parallelism (hand memest the wrapped model)")
    return values, notes


def _param_group(unit: Any) -> Any:
    """The ``FSDPParamGroup`` of one ``fully_shard`` unit (None for a unit that holds no parameter of its own)."""
    state = unit._get_fsdp_state()
    return getattr(state, "_fsdp_param_group", None)


def batch_shape(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[int, int] | None:
    """(micro-batch, tokens) of a forward call: ``input_ids`` (or ``inputs_embeds``) among its arguments."""
    for value in (kwargs.get("input_ids"), kwargs.get("inputs_embeds"), args[0] if args else None):
        shape = getattr(value, "shape", None)
        if shape is not None and len(shape) >= 2:
            return int(shape[0]), int(shape[1])
    return None


# ---- one job watched ----


class Watch:
    """One job: its estimate, the measured steps, the comparison and the record.

    Under torch.distributed (torchrun, accelerate launch) every rank reads the job, estimates it and measures its
    own steps; rank 0 alone logs, gathers every rank's figures (:func:`memest.calibration.distributed.gather`,
    ``dist.gather_object``, as ``memest calibrate --nproc`` does), compares each rank and appends one record
    holding them all. Without a process group (``RANK`` / ``WORLD_SIZE`` set, none initialised) rank 0 measures
    and records itself alone.

    Args:
        steps: Optimizer steps to measure after the first.
        record: Append a record of the comparison.
        results_path: A folder (records go to ``<device>.jsonl`` in it) or a ``.jsonl`` file; default
            ``./calibrate/results``, as ``memest calibrate``.
        log: Where lines go (default: the ``memest`` logger, INFO); on rank 0 only.
        warn: Where warnings go (default: ``log`` when given, else the ``memest`` logger at WARNING); on rank 0
            only, but for a failure inside memest on another rank (logged with its rank).
        origin: What made the record (``hf-callback``, ``track``, ``lightning``), stored in it.
        settings: memest settings that win over what is read (``gpu``, ``seq_len``, ``headroom``, ...).
    """

    def __init__(self, *, steps: int, record: bool, results_path: str | os.PathLike[str] | None, log: Log | None,
                 warn: Log | None, origin: str, settings: Mapping[str, Any]) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise InputError(f"steps {steps!r}: measure at least 1 optimizer step after the first (which creates "
                             "the optimizer states), e.g. steps=2", field="steps")
        self.steps = steps
        self.record = record
        self.results_path = Path(results_path) if results_path is not None else Path("calibrate") / "results"
        self.rank, self.world = rank_of()
        self._log = log or default_log(logging.INFO)
        self._warn = warn or log or default_log(logging.WARNING)
        self.origin = origin
        self.settings = dict(settings)
        self.active = True
        self.config: dict[str, Any] | None = None
        self.values: dict[str, Any] | None = None
        self.notes: list[str] = []
        self.estimate: Any = None
        self.calibration: Any = None
        self.record_path: Path | None = None
        self.record_data: dict[str, Any] | None = None
        self._meter: Any = None
        self._backend: str | None = None
        self._model: Any = None
        self._optimizer: Any = None
        self._windows = 0
        self._failed = False
        self._stopped = False

    @property
    def lead(self) -> bool:
        """This process is rank 0 (it logs, compares and records)."""
        return self.rank == 0

    def log(self, line: str) -> None:
        """Log a line (rank 0 only)."""
        if self.lead:
            self._log(line)

    def warn(self, line: str) -> None:
        """Log a warning (rank 0 only)."""
        if self.lead:
            self._warn(line)

    # -- errors never stop the job --

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Run a piece of the watch; any failure is logged once, the watch stops, the job goes on."""
        if not self.active:
            yield
            return
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - memest must never interrupt a training run
            self._fail(what, exc)

    def _fail(self, what: str, exc: Exception) -> None:
        """Stop watching after a failure, logged once (with its rank on a rank other than 0)."""
        self.active = False
        self._drop_meter()
        if not self._failed:
            self._failed = True
            where = "" if self.lead else f"rank {self.rank}: "
            self._warn(f"memest: {where}{what} failed ({type(exc).__name__}: "
                       f"{str(exc).splitlines()[0] if str(exc) else ''}); memest stops watching this run, the run "
                       "goes on")

    # -- the estimate --

    def estimate_job(self, config: dict[str, Any], values: dict[str, Any], notes: list[str], device: Any) -> None:
        """Estimate the job (``values``: memest settings, the caller's :attr:`settings` win), log it, and warn
        when it will not fit on ``device`` (the local :class:`~memest.devices.Device`) or the ``gpu`` given."""
        from memest.api import estimate_values, settings_of
        from memest.estimate import estimate
        from memest.planning.fit import verdict
        from memest.report.integration import estimate_line, fit_warning

        self.rank, self.world = rank_of()
        self.config = config
        given = {**values, **self.settings}
        if "gpu" not in self.settings and device.kind != "cpu" and _in_catalog(device.name):
            given["gpu"] = device.name
        method = given.pop("finetune", None)
        given.pop("train", None)
        mode = given.pop("mode", None) or (str(getattr(method, "value", method)) if method is not None else "train")
        self.values = settings_of(mode, given)
        self.notes = notes
        result = estimate_values(config, self.values)
        assessment = result.result
        spec, workload = assessment.spec, assessment.workload
        if given.get("gpu") is not None:
            self.estimate, check, on = assessment.estimate, assessment.verdict, assessment.verdict.device
        else:
            self.estimate = estimate(spec, workload, device)
            check = verdict(self.estimate, device, workload.parallelism.world_size, float(self.values["headroom"]))
            on = device
        self._spec, self._workload = spec, workload
        self.log(estimate_line(self.model_name, workload, self.estimate, on))
        for note in notes:
            self.log(f"memest: {note}")
        if not check.fits:
            self.warn(fit_warning(check))

    @property
    def model_name(self) -> str:
        """The model as its config names it (``_name_or_path``), else its ``model_type``."""
        cfg = self.config or {}
        return str(cfg.get("_name_or_path") or cfg.get("model_type") or "the model")

    # -- the measurement --

    def start(self, model: Any, optimizer: Any) -> None:
        """Start measuring (after the first optimizer step: the optimizer states exist). A rank other than 0
        measures only when a process group can bring its figures to rank 0."""
        import torch

        from memest.calibration.measure import CpuMeter, CudaMeter

        self.rank, self.world = rank_of()
        if not self.lead and not _grouped():
            return
        if self.record and self.lead:
            from memest.calibration.records import check_writable_folder

            try:
                check_writable_folder(self.results_path.parent if self.results_path.suffix == ".jsonl"
                                      else self.results_path)
            except InputError as exc:
                self.warn(f"memest: {exc}; the comparison is logged, not recorded")
                self.record = False
        device = next(iter(base_model(model).parameters())).device
        self._model, self._optimizer = model, optimizer
        if device.type == "cuda":
            self._backend = "cuda"
            self._meter = CudaMeter(device.index or 0, running=True)
        elif device.type == "cpu":
            self._backend = "cpu"
            self._meter = CpuMeter()
        else:
            raise InputError(f"memest measures CUDA and CPU runs; this one runs on {device.type}", field="device")
        torch.cuda.synchronize() if self._backend == "cuda" else None
        self._meter.start(live_bytes=self._live_bytes())
        self._windows = 1

    def lap(self) -> None:
        """Between measured steps."""
        if self._meter is not None:
            self._meter.lap(live_bytes=self._live_bytes())
            self._windows += 1

    def stop(self) -> None:
        """Stop measuring, gather every rank's figures on rank 0, compare them with the estimate, log and record.

        Call it at the same step on every rank, whether this rank's watch is still active or not: under a
        process group the gather is a collective that every rank joins once (a rank whose watch failed sends
        nothing, and rank 0 compares the others). Not a guarded piece itself: each part is guarded inside."""
        if self._stopped:
            return
        self._stopped = True
        payload: dict[str, Any] | None = None
        with self.guard("reading the measured steps"):
            if self.active and self._meter is not None:
                payload = self._payload()
        payloads = self._gather(payload)
        with self.guard("comparing the measured steps"):
            if not (self.active and self.lead and self.estimate is not None):
                return
            from memest.calibration.compare import evaluate
            from memest.report.integration import comparison_lines

            measured = [p for p in payloads if p is not None]
            if not measured:
                self.log("memest: no rank measured its steps: nothing to compare")
                return
            missing = [r for r, p in enumerate(payloads) if p is None]
            self.calibration = evaluate(self._spec, self._workload, measured, headroom=float(self.values["headroom"]))
            for line in comparison_lines(self.calibration):
                self.log(line)
            if missing:
                self.log(f"memest: rank(s) {', '.join(map(str, missing))} sent no figures (see their log); the "
                         "others are compared")
            if self.record:
                self._record(measured)

    def _payload(self) -> dict[str, Any]:
        """This rank's figures, as a ``memest calibrate`` worker sends them: ``{"measurement", "static",
        "environment"}``."""
        from memest.calibration.runner import environment

        meter, self._meter = self._meter, None
        measurement = meter.stop(self._windows, rank=self.rank, world_size=self.world)
        payload = {"measurement": measurement.to_dict(), "static": self._static_bytes(),
                   "environment": environment(self._backend or "cpu")}
        meter.release()
        self._model = self._optimizer = None
        return payload

    def _gather(self, payload: dict[str, Any] | None) -> list[dict[str, Any] | None]:
        """Every rank's payload on rank 0, in rank order (``[payload]`` without a process group; ``[]`` on the
        other ranks). A failed gather is logged once and leaves rank 0 its own figures."""
        if not _grouped():
            return [payload]
        from memest.calibration.distributed import DistEnv, gather

        try:
            out = gather(payload, DistEnv(self.rank, self.world, self.rank))
        except Exception as exc:  # noqa: BLE001 - memest must never interrupt a training run
            if self.active:
                self._fail("gathering the ranks' figures", exc)
            return [payload] if self.lead else []
        return list(out) if out is not None else []

    def _drop_meter(self) -> None:
        meter, self._meter = self._meter, None
        if meter is not None:
            with contextlib.suppress(Exception):
                meter.release()

    def _live_bytes(self) -> int:
        import itertools

        from memest.calibration.training import optimizer_state_tensors, tensors_bytes

        base = base_model(self._model)
        return tensors_bytes(itertools.chain(base.parameters(), base.buffers(),
                                             optimizer_state_tensors(_inner(self._optimizer))))

    def _static_bytes(self) -> dict[str, int]:
        from memest.calibration.models import parameter_bytes
        from memest.calibration.training import optimizer_state_tensors, tensors_bytes

        return {"weights": parameter_bytes(base_model(self._model)),
                "optimizer_states": tensors_bytes(optimizer_state_tensors(_inner(self._optimizer))),
                "master_weights": 0}

    def _record(self, payloads: list[dict[str, Any]]) -> None:
        from memest.calibration.compare import device_slug
        from memest.calibration.records import append_record, build_record
        from memest.calibration.request import Request, flags_of

        cal = self.calibration
        reference = self.model_name
        request = Request(model=reference, flags=flags_of(self.values), backend=self._backend or "cpu",
                          steps=self._windows, nproc=self.world, weights=True)
        rec = build_record(request=request, spec=self._spec, workload=self._workload, device=cal.device,
                           estimate=cal.estimate, comparisons=list(cal.ranks), verdict=cal.verdict, payloads=payloads,
                           steps=self._windows)
        rec["origin"] = self.origin
        rec["model"]["config"] = self.config
        path = self.results_path if self.results_path.suffix == ".jsonl" else \
            self.results_path / f"{device_slug(cal.device)}.jsonl"
        append_record(path, rec)
        self.record_path, self.record_data = path, rec
        self.log(f"memest: recorded {path}#{rec['id']}")


def _grouped() -> bool:
    """True when a torch.distributed process group of more than one process runs (the ranks can gather)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _inner(optimizer: Any) -> Any:
    return getattr(optimizer, "optimizer", optimizer) if optimizer is not None else None


def _in_catalog(name: str) -> bool:
    from memest.devices import get_device
    from memest.errors import UnknownDeviceError

    try:
        get_device(name)
    except UnknownDeviceError:
        return False
    return True


def local_device(model: Any) -> Any:
    """The :class:`~memest.devices.Device` the model's parameters are on, as ``memest calibrate`` names it
    (:func:`memest.calibration.compare.local_device`): the CUDA device with its memory, or the CPU with the
    host's RAM."""
    import torch

    from memest.calibration import compare
    from memest.calibration.measure import physical_memory

    device = next(iter(base_model(model).parameters())).device
    if device.type == "cuda":
        index = device.index or 0
        _, total = torch.cuda.mem_get_info(index)
        major, minor = torch.cuda.get_device_capability(index)
        return compare.local_device("cuda", torch.cuda.get_device_name(index), int(total), f"{major}.{minor}")
    return compare.local_device("cpu", "cpu", physical_memory())
