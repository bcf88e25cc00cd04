"""``memest check``: an engine's start-up log (or a trainer's log) against memest's estimate of the same job.

:func:`check_log` takes an :class:`~memest.logs.EngineLog` (the job and the figures the engine or
trainer printed, :mod:`memest.logs`), re-estimates that job through memest's own path (the settings
resolved by :mod:`memest.workload.resolve`, the terms by :func:`memest.estimate.estimate`; a training
log through the training path with its stack's defaults) and pairs each logged figure with memest's
value of the same quantity: the log is the measurement. It then names the estimate's term (weights,
activations, runtime, KV cache, workspace) with the largest gap in bytes. Figures the log does not
print are not compared; settings a training log does not print are refused by name, never guessed;
nothing is printed here (the report layer renders).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from memest.devices import Device, get_device
from memest.errors import InputError, MemestError
from memest.estimate import estimate
from memest.estimate.serving.vllm.budget import V064
from memest.logs import EngineLog
from memest.logs import vllm as vllm_log
from memest.result import Estimate, Kind
from memest.sources import catalog, catalog_config, config_from_data, load_config, spec_from_config
from memest.spec import ModelSpec
from memest.workload import ENGINE_VERSIONS, ServingConfig, TrainingConfig, Workload, resolve, validate

TERMS: dict[str, Kind | None] = {
    "weights": Kind.WEIGHTS, "activation_peak": Kind.ACTIVATIONS, "non_torch": Kind.RUNTIME,
    "requested": None, "non_kv": None, "kv_cache_memory": Kind.KV_CACHE, "kv_cache_tokens": Kind.KV_CACHE,
    "kv_cache_blocks": Kind.KV_CACHE, "max_concurrency": Kind.KV_CACHE, "k_size": Kind.KV_CACHE,
    "v_size": Kind.KV_CACHE, "context_len": None, "kv_buffer": Kind.KV_CACHE, "compute_buffer": Kind.WORKSPACE,
    "file_size": Kind.WEIGHTS, "free_memory": None, "kv_budget": Kind.KV_CACHE, "runtime_buffers": Kind.ACTIVATIONS,
    "kv_bytes_per_token": Kind.KV_CACHE, "peak_reserved": None, "peak_allocated": None, "peak_active": None,
    "init_allocated": Kind.WEIGHTS, "init_reserved": Kind.WEIGHTS, "train_states": Kind.OPTIMIZER_STATES,
}
"""The estimate's term each figure measures (None: a setting or a sum, no one term)."""

DERIVED = {"vllm": ("kv_cache_memory", "non_kv", "requested"),
           "trtllm": ("kv_cache_memory", "kv_budget", "free_memory", "non_kv")}
"""Figures an engine derives from the others (vLLM's KV pool is the budget less the other terms;
TensorRT-LLM's pool a fraction of what weights, activations and buffers leave free): they inherit the
other terms' gaps, so only what those cannot account for counts when naming the term of the largest gap
(:func:`largest_gap`)."""

TRAINING_REQUIRED = ("micro_batch_size", "seq_len")
"""Settings a training estimate cannot do without: a training log that prints neither (nor gets them
from the caller) is refused, naming them (memest's defaults would be a guess)."""


@dataclass(frozen=True, slots=True)
class Row:
    """One logged figure and memest's value of the same quantity.

    Attributes:
        figure: The figure's name (:data:`memest.logs.FIGURES`).
        term: The estimate's term it measures, or None.
        predicted: memest's value (bytes for sizes).
        measured: The log's value, in the same unit.
        unit: ``bytes``, ``tokens``, ``blocks`` or ``x``.
        line: The log line the figure was read from.
    """

    figure: str
    term: Kind | None
    predicted: int | float
    measured: int | float
    unit: str
    line: str

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured; None when the log printed 0."""
        return (self.predicted - self.measured) / self.measured if self.measured else None


@dataclass(frozen=True)
class Check:
    """A log compared with memest's estimate of its job.

    Attributes:
        name: Where the log came from (a path, ``-`` for stdin).
        log: The log, read.
        model: The model memest estimated (catalog or Hub id, or path).
        engine_version: The engine arithmetic memest applied (``0.19``), or None (the default).
        device: The accelerator estimated.
        rows: Each compared figure, in log order of :data:`TERMS`.
        not_compared: Figures the log printed that memest has no value of.
        not_logged: Figures of this engine memest predicts that the log does not print.
        largest_gap: The row whose term explains the largest gap in bytes, or None.
        notes: What memest took from where (device, version, model), for the reader.
        estimate: The estimate itself.
    """

    name: str
    log: EngineLog
    model: str
    engine_version: str | None
    device: Device
    rows: tuple[Row, ...]
    not_compared: tuple[str, ...]
    not_logged: tuple[str, ...]
    largest_gap: Row | None
    notes: tuple[str, ...] = ()
    estimate: Estimate | None = field(default=None, repr=False)


# ---- the job the log describes ----


def offline_model(reference: str, *, local_files: bool = True) -> str | None:
    """The model a log names as memest resolves it without the Hub: an existing path (unless
    ``local_files`` is False), or a catalog entry under the full reference, its last two path components
    (``org/name``) or its last one."""
    from pathlib import Path

    if local_files and Path(reference).expanduser().exists():
        return reference
    parts = [p for p in re.split(r"[/\\]", reference.strip()) if p]
    for candidate in (reference.strip(), "/".join(parts[-2:]), parts[-1] if parts else ""):
        if candidate and catalog.resolve(candidate) is not None:
            return candidate
    return None


def own_model(log: EngineLog, local_files: bool = True) -> str | None:
    """The model the log names, as memest resolves it offline (:func:`offline_model`), or None: the log
    names none, or one memest cannot resolve (a GGUF file, a private checkpoint). A log naming its own
    is estimated with it; a model the caller gives is for the logs this returns None for."""
    return None if log.model is None else offline_model(log.model, local_files=local_files)


def _logged_config(found: str, local_files: bool) -> Any:
    """The config of a model the log names (``found`` by :func:`own_model`): the catalog's own copy when
    ``local_files`` is False (a name that is also a folder here is not read)."""
    if not local_files:
        cfg = catalog_config(found)
        assert cfg is not None
        return cfg
    return load_config(found)


def _shapes(spec: ModelSpec) -> ModelSpec:
    """``spec`` without what names it (its name, source, notes): two references to the same architecture
    (a base model and its instruct fine-tune) compare equal."""
    return dataclasses.replace(spec, name="", source="", notes=())


def _model(log: EngineLog, given: str | None, local_files: bool = True) -> tuple[str, ModelSpec]:
    found = own_model(log, local_files)
    if found is not None:  # the log's own model wins; a different one given is refused, naming both
        cfg = _logged_config(found, local_files)
        spec = spec_from_config(cfg)
        if given is not None and given != found and not _same_model(given, spec):
            resolved = "" if cfg.name == log.model else f" (memest's {cfg.name})"
            raise InputError(f"the log names the model {log.model!r}{resolved} but "
                             f"{{model}} names {given!r}; {{model}} is for a log naming no model memest resolves "
                             "offline: leave it out to check the log's model", field="model")
        return cfg.name, spec
    if given is None and log.model_config is not None:
        cfg = config_from_data(log.model_config, name=log.model or "the log's model")
        return f"{cfg.name} (shapes from the log)", spec_from_config(cfg)
    if given is None and log.model is None:
        raise InputError(f"the {log.format} log does not name its model; pass it with {{model}} (a catalog name, see "
                         "'memest models', a Hub id or a config.json folder)", field="model")
    if given is None:
        raise InputError(f"the log's model {log.model!r} is not in memest's offline catalog; pass it with "
                         "{model} (a catalog name, see 'memest models', a Hub id or a config.json folder)",
                         field="model")
    cfg = load_config(given)
    return cfg.name, spec_from_config(cfg)


def _same_model(given: str, spec: ModelSpec) -> bool:
    """True when the model ``given`` has the shapes of ``spec`` (False when it does not resolve)."""
    try:
        return _shapes(spec_from_config(load_config(given))) == _shapes(spec)
    except MemestError:
        return False


def _named_device(name: str) -> Device | None:
    """A device the log names (``Tesla V100-PCIE-16GB``, ``NVIDIA H100 80GB HBM3``), or None."""
    tries = [name, re.sub(r"^(NVIDIA|Tesla|GeForce)\s+", "", name)]
    tries.append(re.sub(r"-(PCIE|SXM\d?)", "", tries[-1]))
    for candidate in tries:
        try:
            return get_device(candidate)
        except MemestError:
            continue
    return None


def own_device(log: EngineLog) -> Device | None:
    """The accelerator the log names, when memest knows it (``NVIDIA H100 80GB HBM3`` -> H100-80GB), else
    None. A log naming its own is estimated on it; a device the caller gives is for the logs this returns
    None for."""
    return _named_device(log.gpu) if log.gpu else None


LOGGED_DEVICE = "logged:1GiB"
"""The device of a log that names none memest knows but prints its total memory: a custom device
(generic runtime constants) whose memory is replaced by the log's."""


def _device(log: EngineLog, gpu: str | None, notes: list[str]) -> Device:
    own = own_device(log)
    if own is not None and gpu is not None and get_device(gpu).name != own.name:
        raise InputError(f"the log names its accelerator {log.gpu!r} (memest's {own.name}) but {{gpu}} names "
                         f"{gpu!r}; {{gpu}} is for a log naming no accelerator memest knows: leave it out to check "
                         "the log's", field="gpu")
    device = own or (get_device(gpu) if gpu else None)
    if device is None and log.device_total_bytes is None:
        raise InputError(f"the {log.format} log names no accelerator memest knows"
                         + (f" ({log.gpu!r})" if log.gpu else "") + "; pass it with {gpu} (see 'memest gpus')",
                         field="gpu")
    if device is None:
        assert log.device_total_bytes is not None
        device = dataclasses.replace(get_device(LOGGED_DEVICE), memory_bytes=log.device_total_bytes)
        notes.append("device: the log's total memory (no accelerator named; runtime constants are the generic ones)")
    elif log.device_total_bytes is not None and log.device_total_bytes != device.memory_bytes:
        device = dataclasses.replace(device, memory_bytes=log.device_total_bytes)
        notes.append(f"device: {device.name} with the log's total memory")
    else:
        notes.append(f"device: {device.name}" + (" (from the log)" if own is not None else ""))
    return device


def logged_device(device: Device) -> bool:
    """True for the device of a log naming none (:data:`LOGGED_DEVICE`): only its memory is known."""
    return device.aliases == get_device(LOGGED_DEVICE).aliases


V064_NOTE = ("vLLM 0.6.4 measures non_torch_memory device-wide after the profile run ((total - free) - torch's "
             "allocated bytes): the process's CUDA context, NCCL, and any other process's memory on the device; "
             "memest counts the context (its value for the device's family, measured on one GPU of it: an H100 for "
             "Turing and newer, so a GPU with fewer SMs holds less) and NCCL, and takes the device as otherwise empty")
"""A 0.6.4 log's known gap: the non-torch figure, and the KV pool with it."""


def modelled_version(log: EngineLog, given: str | None) -> str | None:
    """The engine arithmetic to apply: the one given, else the log's version where memest models it
    (``0.19.0`` -> ``0.19``), else for vLLM the one of the log's format (V1 -> the newest, 0.6.4's
    one-line profile -> ``0.6.4``, the V0 worker's profile table -> ``0.6``), else None (memest's default).
    A vLLM 0.6.x banner over 0.6.4's one-line profile is 0.6.4 (the profile line is what sets the arithmetic)."""
    if given is not None:
        return given
    known = ENGINE_VERSIONS.get(log.engine, ())
    if log.version:
        short = ".".join(log.version.lstrip("v").split(".")[:2])
        for candidate in (short, log.version, f"b{log.version}"):
            if candidate in known:
                if log.engine == "vllm" and candidate == "0.6" and vllm_log.is_064_profile(log):
                    return V064  # a 0.6.x banner over 0.6.4's one-line profile: 0.6.4's non-torch measure
                return candidate
    if log.engine == "vllm":
        if log.format == "vLLM V1":
            return known[0]
        return V064 if vllm_log.is_064_profile(log) else "0.6"
    if log.engine == "trtllm":  # memest models the PyTorch backend as 1.1 and a TensorRT engine as 0.19
        return "1.1" if log.format == "TensorRT-LLM PyTorch backend" else "0.19"
    return None


def job_values(log: EngineLog, spec: ModelSpec, version: str | None,
               given: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings of the log's job by memest's setting names (complete: :func:`resolve.complete`);
    ``given`` (the caller's settings, and ``config`` files) fill what the log does not print (a setting
    given that the log states otherwise is refused first: :func:`refuse_contradictions`)."""
    given = dict(given or {})
    if log.training:
        values: dict[str, Any] = {"stack": log.engine, **log.settings, **given}
        if not values.get("finetune"):
            values["train"] = True
        return resolve.complete(values)
    values = {"serve": True, "engine": log.engine, **log.settings, **given}
    if version is not None:
        values["engine_version"] = version
    if log.engine in ("vllm", "sglang", "trtllm"):
        values.setdefault("gpus", values.get("tp", 1) * values.get("pp", 1))
    if log.engine == "llama.cpp" and "quantization" in values:
        values["quantization"] = gguf_file_type(values["quantization"])
    if "n_gpu_layers" in values:  # llama.cpp's -ngl 99 means every layer; the log's count is the layers offloaded
        values["n_gpu_layers"] = min(values["n_gpu_layers"], spec.num_layers + 1)
    return resolve.complete(values)


def refuse_contradictions(log: EngineLog, spec: ModelSpec, version: str | None, given: dict[str, Any]) -> None:
    """Refuse a setting given that differs from the value the log states: the log is the job that ran, and a
    setting given is for what it does not print (``max_model_len=8192`` against a log of
    ``max_seq_len=32768`` would compare another job's estimate with the log's figures). Both values are
    compared as the job reads them (:func:`job_values`: llama.cpp's ``-ngl 99`` is every layer). A setting
    the log leaves open (``EngineLog.assumed``: torchtitan's 'selective' checkpointing) takes the value given.

    Raises:
        InputError: the first setting given that the log states otherwise, naming both values.
    """
    stated = [n for n in given if n in log.settings and n not in log.assumed and n != "config"]
    if not stated:
        return
    logged = job_values(log, spec, version, {})
    wanted = job_values(log, spec, version, {n: given[n] for n in stated})
    for n in stated:
        if wanted[n] != logged[n]:
            raise InputError(f"the log states {n}={_shown(logged[n])}, and {{{n}}} gives {_shown(wanted[n])}: a "
                             "setting given is for what the log does not print; leave it out to check the job "
                             "the log ran", field=n)


def _shown(value: Any) -> str:
    return str(getattr(value, "value", value))


def gguf_file_type(printed: str) -> str:
    """memest's name of a GGUF file type as llama.cpp prints it, lowered (``q4_k_m``; ``q2_k_m`` -> ``q2_k``:
    llama.cpp calls Q2_K 'Q2_K - Medium')."""
    from memest.estimate.serving.llamacpp.quant import ALIASES, FILE_TYPES

    if printed in FILE_TYPES or printed in ALIASES:
        return printed
    base = re.sub(r"_[sml]$", "", printed)
    return base if base in FILE_TYPES else printed


# ---- memest's values of the logged figures ----


def predicted(log: EngineLog, e: Estimate, spec: ModelSpec | None = None, workload: Workload | None = None,
              device: Device | None = None) -> dict[str, int | float]:
    """memest's value of each figure this engine's (or trainer's) log prints, from the estimate ``e``
    of the job ``workload`` of model ``spec`` on ``device`` (TensorRT-LLM's and training's figures need them)."""
    if log.training:
        assert isinstance(workload, TrainingConfig)
        return training_predicted(e, workload)
    rank = e.ranks[0]
    s = e.serving
    assert s is not None
    weights = sum(t.bytes for t in rank.terms if t.kind is Kind.WEIGHTS)
    if log.engine == "trtllm":
        assert spec is not None and isinstance(workload, ServingConfig) and device is not None
        return trtllm_predicted(e, spec, workload, device.memory_bytes)
    if log.engine == "vllm":
        return {"weights": weights, "activation_peak": s.activation_peak_bytes, "non_torch": s.non_torch_bytes,
                "requested": s.requested_bytes, "non_kv": s.non_kv_bytes, "kv_cache_memory": s.kv_budget_bytes,
                "kv_cache_tokens": s.kv_cache_tokens, "kv_cache_blocks": s.kv_cache_blocks,
                "max_concurrency": s.max_concurrency}
    if log.engine == "sglang":
        half = s.kv_cache_tokens * s.kv_cache_bytes_per_token // 2  # K and V: the pool's tokens x bytes per token
        return {"weights": weights, "k_size": half, "v_size": half, "kv_cache_tokens": s.kv_cache_tokens,
                "context_len": s.max_model_len}
    terms = {t.name: t.bytes for t in rank.terms}
    return {"weights": terms["weights"], "kv_buffer": terms["kv_cache"], "compute_buffer": terms["workspace.compute"],
            "kv_cache_memory": s.kv_budget_bytes, "file_size": e.extra["llamacpp_file_bytes"]}


def trtllm_predicted(e: Estimate, spec: ModelSpec, s: ServingConfig, device_bytes: int) -> dict[str, int | float]:
    """memest's value of each figure a TensorRT-LLM log prints (:mod:`memest.estimate.serving.trtllm`):
    the pool of the rank with the fewest blocks, the weights of the first rank, the fitted activation and
    buffer terms apart (the log prints them apart)."""
    from memest.estimate.serving.common import compute_bytes
    from memest.estimate.serving.trtllm import budget as tb
    from memest.estimate.serving.trtllm.engine import max_batch_size_of, max_num_tokens_of

    summary = e.serving
    assert summary is not None
    weights = sum(t.bytes for t in e.ranks[0].terms if t.kind is Kind.WEIGHTS)
    return {
        "weights": weights,
        "activation_peak": tb.activation_bytes(max_num_tokens_of(s), spec.hidden_size, compute_bytes(spec, s)),
        "runtime_buffers": tb.buffer_bytes(max_batch_size_of(s), spec.vocab_size),
        "non_torch": summary.non_torch_bytes,
        "non_kv": summary.non_kv_bytes,
        "free_memory": device_bytes - summary.non_kv_bytes,
        "kv_budget": summary.kv_budget_bytes,
        "kv_cache_memory": summary.kv_cache_tokens * summary.kv_cache_bytes_per_token,
        "kv_cache_tokens": summary.kv_cache_tokens,
        "kv_cache_blocks": summary.kv_cache_blocks,
        "kv_bytes_per_token": summary.kv_cache_bytes_per_token,
    }


def training_predicted(e: Estimate, t: TrainingConfig) -> dict[str, int | float]:
    """memest's value of each figure a training log prints, for the rank that needs the most memory:
    the step's peak allocated and reserved (torchtune's 'active' is the allocated peak: the caching
    allocator's active bytes are the allocated blocks), the weights as loaded (the model-init figures),
    and what a finished step leaves allocated (HF's train delta: optimizer states, and the gradients
    when they are kept between steps)."""
    rank = e.per_device
    kinds = rank.by_kind()
    weights = kinds.get(Kind.WEIGHTS, 0)
    states = kinds.get(Kind.OPTIMIZER_STATES, 0) + (0 if t.set_grads_to_none else kinds.get(Kind.GRADIENTS, 0))
    return {"peak_reserved": rank.reserved_bytes, "peak_allocated": rank.allocated_bytes,
            "peak_active": rank.allocated_bytes, "init_allocated": weights, "init_reserved": weights,
            "weights": weights, "train_states": states}


PEAKS = ("peak_reserved", "peak_allocated", "peak_active")
"""A training log's step peaks, the figure its gap is told by first (reserved, as torchtitan and nvidia-smi
see it, then allocated)."""


def largest_gap(engine: str, rows: tuple[Row, ...], training: bool = False) -> Row | None:
    """The row of the term with the largest gap in bytes; for a training log its step peak (:data:`PEAKS`),
    which the estimate's terms add up to.

    A figure the engine derives from the others (:data:`DERIVED`: vLLM's KV pool is the budget less the
    other terms) inherits their gaps, so it counts only with the part of its gap that the compared terms'
    gaps cannot account for (its gap less the sum of theirs): a pool 2 GiB off beside weights 1 GiB off
    names the weights, a pool 617 MiB off beside weights 0.13 MiB off (the log prints no other term) names
    the KV cache. A tie goes to the term the log measures directly."""
    if training:
        peak = next((r for name in PEAKS for r in rows if r.figure == name), None)
        if peak is not None:
            return peak
    derived = DERIVED.get(engine, ())
    sizes = [r for r in rows if r.unit == "bytes" and r.term is not None]
    direct = [r for r in sizes if r.figure not in derived]
    explained = sum(_gap(r) for r in direct)
    scored = [(r, _gap(r)) for r in direct] + [(r, _gap(r) - explained) for r in sizes if r.figure in derived]
    return max(scored, key=lambda item: item[1], default=(None, 0))[0]


def _gap(r: Row) -> int | float:
    return abs(r.predicted - r.measured)


def missing_settings(log: EngineLog, values: dict[str, Any], given: dict[str, Any]) -> tuple[str, ...]:
    """The settings a training estimate needs (:data:`TRAINING_REQUIRED`, and those the parser names as
    missing) that neither the log, the caller nor the ``config`` files give."""
    if not log.training:
        return ()
    files = resolve.from_files(values)
    need = dict.fromkeys((*TRAINING_REQUIRED, *log.missing))
    return tuple(n for n in need if n not in log.settings and n not in given and n not in files)


def check_log(log: EngineLog, *, name: str = "<log>", model: str | None = None, gpu: str | None = None,
              engine_version: str | None = None, settings: dict[str, Any] | None = None,
              local_files: bool = True) -> Check:
    """The log's figures beside memest's estimate of the job the log describes.

    Args:
        model: The model to estimate when the log names none memest resolves offline (:func:`own_model`);
            a log naming its own is estimated with that, and a different model given for it is refused.
        gpu: The accelerator, when the log names none memest knows (:func:`own_device`; its total
            memory, when printed, replaces the catalog's); a different one given for a log naming its
            own is refused.
        engine_version: The engine arithmetic to apply instead of the one the log's version implies.
        settings: Settings of the job the log does not print, by memest's setting names
            (:func:`memest.workload.settings.settings`; ``config``: config files to read them from,
            whose model is estimated when neither ``model`` nor the log names one). One the log states
            with another value is refused (:func:`refuse_contradictions`).
        local_files: False: the model the log names resolves from memest's catalog only, never a path
            on this machine (a service checking logs it was sent).

    Raises:
        InputError: the model is not named or not resolvable offline; ``model`` or ``gpu`` names another
            than the log's own (the message names both); no accelerator is known; a
            training log lacks a setting the estimate needs (named); a setting given contradicts the
            log's value of it (both named); the log's settings are invalid for memest.
    """
    notes: list[str] = []
    given = dict(settings or {})
    if model is None and log.model is None and given.get("config"):  # the run's config file may name it
        from memest.workload import files

        model = files.read(tuple(given["config"])).model
    try:
        model_name, spec = _model(log, model, local_files)
        device = _device(log, gpu, notes)
    except InputError as exc:
        raise InputError(f"{name}: {exc.template}", field=exc.field) from exc
    version = None if log.training else modelled_version(log, engine_version)
    try:
        refuse_contradictions(log, spec, version, given)
        values = job_values(log, spec, version, given)
    except InputError as exc:
        raise InputError(f"{name}: {exc.template}", field=exc.field) from exc
    absent = missing_settings(log, values, given)
    if absent:
        placeholders = [f"{{{n}}}" for n in absent]
        named = placeholders[0] if len(absent) == 1 else ", ".join(placeholders[:-1]) + " and " + placeholders[-1]
        raise InputError(f"{name}: the {log.format} log does not print {named}, which the estimate needs; give "
                         f"{'them' if len(absent) > 1 else 'it'} as the run had {'them' if len(absent) > 1 else 'it'} "
                         "(memest does not guess a training job's shape)", field=absent[0])
    try:
        workload = resolve.resolve(values, spec, device)
        validate(spec, workload)
        e = estimate(spec, workload, device)
    except InputError as exc:
        raise InputError(f"{name}: the job the log describes is not one memest estimates: {exc}") from exc
    ours = predicted(log, e, spec, workload, device)
    rows = tuple(Row(k, TERMS[k], ours[k], f.value, f.unit, f.line) for k, f in log.figures.items() if k in ours)
    if log.training:
        from memest.workload.stacks import STACKS

        label = STACKS[workload.stack].label if isinstance(workload, TrainingConfig) and workload.stack else log.engine
        notes.append(f"{log.format} log, estimated with memest's {label} defaults where the log is silent")
    elif log.version and version:
        notes.append(f"{log.format} {log.version}, compared with memest's {log.engine} {version} arithmetic")
    elif version is None:
        notes.append(f"the log prints no {log.engine} version: memest's default {log.engine} "
                     f"{ENGINE_VERSIONS[log.engine][0]} arithmetic applies")
    elif log.engine == "trtllm":
        notes.append(f"the log prints no TensorRT-LLM version: memest's {version} arithmetic of the {log.format}")
    if log.engine == "vllm" and version == V064:
        notes.append(V064_NOTE)
    notes += log.notes
    if given:
        notes.append("given: " + ", ".join(f"{k}={v}" for k, v in given.items()))
    return Check(name=name, log=log, model=model_name, engine_version=version, device=device, rows=rows,
                 not_compared=tuple(k for k in log.figures if k not in ours),
                 not_logged=tuple(k for k in ours if k not in log.figures and not _alias(k, log)),
                 largest_gap=largest_gap(log.engine, rows, log.training), notes=tuple(notes), estimate=e)


def _alias(figure: str, log: EngineLog) -> bool:
    """A predicted figure that is another name of one the log prints (training's weights and init figures)."""
    return log.training and figure in ("weights", "init_allocated", "init_reserved", "peak_active", "train_states") \
        and figure not in log.figures
