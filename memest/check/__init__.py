"""``memest check``: an engine's start-up log against memest's estimate of the same job.

:func:`check_log` takes an :class:`~memest.logs.EngineLog` (the job and the figures the engine
printed, :mod:`memest.logs`), re-estimates that job through memest's own path (the settings resolved
by :mod:`memest.workload.resolve`, the terms by :func:`memest.estimate.estimate`) and pairs each
logged figure with memest's value of the same quantity: the log is the measurement. It then names the
estimate's term (weights, activations, runtime, KV cache, workspace) with the largest gap in bytes.
Figures the log does not print are not compared; nothing is printed here (the report layer renders).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from memest.devices import Device, get_device
from memest.errors import InputError, MemestError
from memest.estimate import estimate
from memest.logs import EngineLog
from memest.result import Estimate, Kind
from memest.sources import catalog, load_config, spec_from_config
from memest.spec import ModelSpec
from memest.workload import ENGINE_VERSIONS, resolve, validate

TERMS: dict[str, Kind | None] = {
    "weights": Kind.WEIGHTS, "activation_peak": Kind.ACTIVATIONS, "non_torch": Kind.RUNTIME,
    "requested": None, "non_kv": None, "kv_cache_memory": Kind.KV_CACHE, "kv_cache_tokens": Kind.KV_CACHE,
    "kv_cache_blocks": Kind.KV_CACHE, "max_concurrency": Kind.KV_CACHE, "k_size": Kind.KV_CACHE,
    "v_size": Kind.KV_CACHE, "context_len": None, "kv_buffer": Kind.KV_CACHE, "compute_buffer": Kind.WORKSPACE,
    "file_size": Kind.WEIGHTS,
}
"""The estimate's term each figure measures (None: a setting or a sum, no one term)."""

DERIVED = {"vllm": ("kv_cache_memory", "non_kv", "requested")}
"""Figures an engine derives from the others (vLLM's KV pool is the budget less the other terms):
left out when naming the term of the largest gap, which they inherit."""


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


def offline_model(reference: str) -> str | None:
    """The model a log names as memest resolves it without the Hub: an existing path, or a catalog
    entry under the full reference, its last two path components (``org/name``) or its last one."""
    from pathlib import Path

    if Path(reference).expanduser().exists():
        return reference
    parts = [p for p in re.split(r"[/\\]", reference.strip()) if p]
    for candidate in (reference.strip(), "/".join(parts[-2:]), parts[-1] if parts else ""):
        if candidate and catalog.resolve(candidate) is not None:
            return candidate
    return None


def _model(log: EngineLog, given: str | None) -> tuple[str, ModelSpec]:
    if given is not None:
        reference = given
    elif log.model is None:
        raise InputError(f"the {log.format} log does not name its model; pass it with {{model}} (a catalog name, see "
                         "'memest models', a Hub id or a config.json folder)", field="model")
    else:
        found = offline_model(log.model)
        if found is None:
            raise InputError(f"the log's model {log.model!r} is not in memest's offline catalog; pass it with "
                             "{model} (a catalog name, see 'memest models', a Hub id or a config.json folder)",
                             field="model")
        reference = found
    cfg = load_config(reference)
    return cfg.name, spec_from_config(cfg)


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


def _device(log: EngineLog, gpu: str | None, notes: list[str]) -> Device:
    device = get_device(gpu) if gpu else _named_device(log.gpu) if log.gpu else None
    if device is None and log.device_total_bytes is None:
        raise InputError(f"the {log.format} log names no accelerator memest knows"
                         + (f" ({log.gpu!r})" if log.gpu else "") + "; pass it with {gpu} (see 'memest gpus')",
                         field="gpu")
    if device is None:
        assert log.device_total_bytes is not None
        device = dataclasses.replace(get_device("logged:1GiB"), memory_bytes=log.device_total_bytes)
        notes.append("device: the log's total memory (no accelerator named; runtime constants are the generic ones)")
    elif log.device_total_bytes is not None and log.device_total_bytes != device.memory_bytes:
        device = dataclasses.replace(device, memory_bytes=log.device_total_bytes)
        notes.append(f"device: {device.name} with the log's total memory")
    else:
        notes.append(f"device: {device.name}" + (" (from the log)" if not gpu else ""))
    return device


def modelled_version(log: EngineLog, given: str | None) -> str | None:
    """The engine arithmetic to apply: the one given, else the log's version where memest models it
    (``0.19.0`` -> ``0.19``), else for vLLM the one of the log's format (V1 -> the newest, the V0 worker
    -> ``0.6``), else None (memest's default)."""
    if given is not None:
        return given
    known = ENGINE_VERSIONS.get(log.engine, ())
    if log.version:
        short = ".".join(log.version.lstrip("v").split(".")[:2])
        for candidate in (short, log.version, f"b{log.version}"):
            if candidate in known:
                return candidate
    if log.engine == "vllm":
        return known[0] if log.format == "vLLM V1" else "0.6"
    return None


def job_values(log: EngineLog, spec: ModelSpec, version: str | None) -> dict[str, Any]:
    """The settings of the log's job by memest's setting names (complete: :func:`resolve.complete`)."""
    values: dict[str, Any] = {"serve": True, "engine": log.engine, **log.settings}
    if version is not None:
        values["engine_version"] = version
    if log.engine in ("vllm", "sglang"):
        values.setdefault("gpus", values.get("tp", 1) * values.get("pp", 1))
    if log.engine == "llama.cpp" and "quantization" in values:
        values["quantization"] = gguf_file_type(values["quantization"])
    if "n_gpu_layers" in values:  # llama.cpp's -ngl 99 means every layer; the log's count is the layers offloaded
        values["n_gpu_layers"] = min(values["n_gpu_layers"], spec.num_layers + 1)
    return resolve.complete(values)


def gguf_file_type(printed: str) -> str:
    """memest's name of a GGUF file type as llama.cpp prints it, lowered (``q4_k_m``; ``q2_k_m`` -> ``q2_k``:
    llama.cpp calls Q2_K 'Q2_K - Medium')."""
    from memest.estimate.serving.llamacpp.quant import ALIASES, FILE_TYPES

    if printed in FILE_TYPES or printed in ALIASES:
        return printed
    base = re.sub(r"_[sml]$", "", printed)
    return base if base in FILE_TYPES else printed


# ---- memest's values of the logged figures ----


def predicted(log: EngineLog, e: Estimate) -> dict[str, int | float]:
    """memest's value of each figure this engine's log prints, from the estimate ``e``."""
    rank = e.ranks[0]
    s = e.serving
    assert s is not None
    weights = sum(t.bytes for t in rank.terms if t.kind is Kind.WEIGHTS)
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


def largest_gap(engine: str, rows: tuple[Row, ...]) -> Row | None:
    """The row of a term (not a figure derived from the others) with the largest gap in bytes."""
    derived = DERIVED.get(engine, ())
    sizes = [r for r in rows if r.unit == "bytes" and r.term is not None]
    direct = [r for r in sizes if r.figure not in derived] or sizes
    return max(direct, key=lambda r: abs(r.predicted - r.measured), default=None)


def check_log(log: EngineLog, *, name: str = "<log>", model: str | None = None, gpu: str | None = None,
              engine_version: str | None = None) -> Check:
    """The log's figures beside memest's estimate of the job the log describes.

    Args:
        model: The model to estimate instead of the one the log names (which must resolve offline).
        gpu: The accelerator, when the log names none memest knows (its total memory, when printed,
            replaces the catalog's).
        engine_version: The engine arithmetic to apply instead of the one the log's version implies.

    Raises:
        InputError: the model is not named or not resolvable offline; no accelerator is known; the
            log's settings are invalid for memest.
    """
    notes: list[str] = []
    try:
        model_name, spec = _model(log, model)
        device = _device(log, gpu, notes)
    except InputError as exc:
        raise InputError(f"{name}: {exc.template}", field=exc.field) from exc
    version = modelled_version(log, engine_version)
    try:
        values = job_values(log, spec, version)
        workload = resolve.resolve(values, spec, device)
        validate(spec, workload)
        e = estimate(spec, workload, device)
    except InputError as exc:
        raise InputError(f"{name}: the job the log describes is not one memest estimates: {exc}") from exc
    ours = predicted(log, e)
    rows = tuple(Row(k, TERMS[k], ours[k], f.value, f.unit, f.line) for k, f in log.figures.items() if k in ours)
    if log.version and version:
        notes.append(f"{log.format} {log.version}, compared with memest's {log.engine} {version} arithmetic")
    elif version is None:
        notes.append(f"the log prints no {log.engine} version: memest's default {log.engine} "
                     f"{ENGINE_VERSIONS[log.engine][0]} arithmetic applies")
    return Check(name=name, log=log, model=model_name, engine_version=version, device=device, rows=rows,
                 not_compared=tuple(k for k in log.figures if k not in ours),
                 not_logged=tuple(k for k in ours if k not in log.figures),
                 largest_gap=largest_gap(log.engine, rows), notes=tuple(notes), estimate=e)

