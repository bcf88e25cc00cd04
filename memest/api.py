"""memest's Python API: the estimate, the plan, the sweep and the log check of the CLI, as functions.

>>> import memest
>>> r = memest.estimate_memory("meta-llama/Llama-3.1-8B", mode="train", gpu="H100-80GB", gpus=8, zero_stage=3)
>>> r.fits, r.per_device.allocated_bytes > 0
(True, True)

Keyword names are the CLI's flags with underscores (``--micro-batch-size`` -> ``micro_batch_size``);
``mode`` is ``train``, ``lora``, ``qlora`` or ``serve`` (the CLI's ``--train``, ``--finetune lora``,
``--finetune qlora``, ``--serve``). Enum settings take their values as strings (``precision="bf16"``).
Each function returns a :class:`Report`: ``to_dict()`` is the JSON the CLI prints with ``--json``
for the same settings (the CLI calls these functions), and its keys are attributes
(``r.per_device.allocated_bytes``). Bad input raises :class:`memest.InputError` with the CLI's
message, naming keywords where the CLI names flags (``seq_len`` for ``--seq-len``); its ``field``
is the keyword at fault.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from memest.devices import Fleet, GiB
from memest.errors import InputError, MemestError
from memest.spec import ModelSpec

MODES = ("train", "lora", "qlora", "serve")
"""The ``mode`` keyword's values."""


class Report:
    """A result as the CLI's ``--json`` prints it, its keys readable as attributes.

    ``to_dict()`` gives the JSON data (a copy); ``r.fits``, ``r.per_device.allocated_bytes``,
    ``r["terms"][0]["bytes"]`` read it. ``result`` is the library's own object (an
    :class:`~memest.planning.search.Assessment`, :class:`~memest.planning.search.Plan` or :class:`~memest.planning.sweep.Sweep`).
    """

    __slots__ = ("_data", "result")

    def __init__(self, data: Mapping[str, Any], result: Any = None) -> None:
        self._data = data
        self.result = result

    def to_dict(self) -> dict[str, Any]:
        """The JSON data (integer bytes), as ``--json`` prints it."""
        return copy.deepcopy(dict(self._data))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not a key (and _data itself while unpickling)
            raise AttributeError(name)
        try:
            return _view(self._data[name])
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no {name!r}; its keys: {', '.join(self._data)}") from None

    def __getitem__(self, key: str) -> Any:
        return _view(self._data[key])

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __dir__(self) -> list[str]:
        return [*self._data, "to_dict", "result"]

    def __repr__(self) -> str:
        keys = ", ".join(list(self._data)[:8])
        return f"<{type(self).__name__} {keys}, ...>"


def _view(value: Any) -> Any:
    if isinstance(value, Mapping):
        return Report(value)
    if isinstance(value, list):
        return [_view(v) for v in value]
    return value


class MemoryEstimate(Report):
    """:func:`estimate_memory`'s answer (``memest hf --json``)."""

    __slots__ = ("config",)

    def __init__(self, data: Mapping[str, Any], result: Any, config: Any) -> None:
        super().__init__(data, result)
        self.config = config


class MemoryPlan(Report):
    """:func:`plan_memory`'s answer (``memest plan --json``)."""

    __slots__ = ()


class MemorySweep(Report):
    """:func:`sweep_memory`'s answer (``memest sweep --json``)."""

    __slots__ = ()


# ---- settings ----


def mode_values(mode: str | None) -> dict[str, Any]:
    """The mode settings ``mode`` stands for (none for None: the settings decide, as without a mode flag).

    Raises:
        InputError: not one of :data:`MODES`.
    """
    from memest.workload import Method

    if mode is None:
        return {}
    if mode == "train":
        return {"train": True}
    if mode in ("lora", "qlora"):
        return {"finetune": Method(mode)}
    if mode == "serve":
        return {"serve": True}
    raise InputError(f"mode {mode!r} is not one of {', '.join(MODES)}", field="mode")


def _default_mode(mode: str | None, settings: Mapping[str, Any]) -> str | None:
    """``mode``; when None, serving unless ``config`` files are given (their mode then decides)."""
    return mode if mode is not None or settings.get("config") else "serve"


def settings_of(mode: str | None, given: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments as settings (``mode`` replacing the mode settings), checked and completed.

    Raises:
        InputError: an unknown keyword, a mode setting passed as a keyword, a value of the wrong type.
    """
    from memest.workload.resolve import check_scope, complete, mode_of

    for name, instead in (("train", "train"), ("finetune", "lora"), ("serve", "serve")):
        if name in given:
            raise InputError(f"pass the mode as mode={instead!r} (one of {', '.join(MODES)}), not {name}=", field=name)
    values = complete({**given, **mode_values(mode)})
    if mode is not None or values["config"]:  # a keyword the job would not read is refused even at its default
        check_scope(values, mode_of(values), given_names=given.keys())
    return values


def checkpoint_params(values: Mapping[str, Any], spec: ModelSpec) -> tuple[tuple[str, int], ...]:
    """With ``exact_weights``, the checkpoint's parameters per stored dtype (read from the Hub's
    safetensors headers); else nothing."""
    if not values.get("exact_weights"):
        return ()
    from memest.sources.hub import safetensors_parameter_counts

    return safetensors_parameter_counts(spec.name, revision=values.get("revision"))


def gguf_tensors(values: Mapping[str, Any]) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """With ``gguf``, the tensors of that file's header (:func:`memest.sources.gguf.read_tensors`); else
    nothing."""
    path = values.get("gguf")
    if not path:
        return ()
    from memest.sources.gguf import read_tensors

    return read_tensors(path)


Model = str | os.PathLike[str] | Mapping[str, Any]
"""A model reference (a Hub id, a catalog name, a path), or a config.json's contents as a mapping."""


def _model(model: Model, values: Mapping[str, Any]) -> tuple[Any, ModelSpec]:
    """The config and the spec of ``model`` (a mapping: read as a config.json's contents, with no
    place to load model code from).

    Raises:
        InputError: a revision with a config given as data; a model that is neither a reference nor a mapping.
    """
    from memest.sources import config_from_data, load_config, spec_from_config

    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if not isinstance(model, str | Mapping):
        raise InputError(f"model {model!r} is not a model reference; pass a Hub id or catalog name (a string such as "
                         "'meta-llama/Llama-3.1-8B'), a path, or a config.json's contents as a dict", field="model")
    if isinstance(model, Mapping):
        if values["revision"] is not None:
            raise InputError(f"{{revision}} {values['revision']!r} names a Hub revision, but the model is a config "
                             "given as data; drop {revision}", field="revision")
        cfg = config_from_data(dict(model))
    else:
        cfg = load_config(model, revision=values["revision"])
    return cfg, spec_from_config(cfg, trust_remote_code=values["trust_remote_code"])


def calibrated(device: Any, values: Mapping[str, Any]) -> Any:
    """``device``, with ``use_calibration`` carrying the runtime constants of the user's records
    (:func:`memest.calibration.constants.with_user_constants`).

    Raises:
        InputError: ``use_calibration`` and no records.
    """
    if not values.get("use_calibration"):
        return device
    from memest.calibration.constants import with_user_constants

    return with_user_constants(device)


def model_reference(model: Model | None, values: Mapping[str, Any]) -> Model:
    """``model``, or the model the ``config`` files name when it is None.

    Raises:
        InputError: no model given and no config file naming one.
    """
    if model is not None:
        return model
    from memest.workload import files

    if not values["config"]:
        raise InputError("model None is not a model reference; pass a Hub id or catalog name, a path, a config.json's "
                         "contents as a dict, or a {config} recipe that names the model", field="model")
    named = files.read(values["config"]).model
    if named is None:
        raise InputError("no model given, and no {config} file names one: pass a model, or a {config} recipe that "
                         "names it (model_name_or_path, base_model, a torchtune model builder, a vLLM model; a Megatron-LM "
                         "launch names none)", field="config")
    return named


def _given(model: Model | None) -> str | None:
    """The model reference the caller gave, as config files would name it (None: none, or a config mapping)."""
    return os.fspath(model) if isinstance(model, str | os.PathLike) else None


def _name(model: Model, spec: ModelSpec) -> str:
    """The model as a ``memest hf`` command names it: the reference as given, or a config given as data's name."""
    return spec.name if isinstance(model, Mapping) else os.fspath(model)


# ---- the three answers ----


def estimate_memory(model: Model | None = None, *, mode: str | None = None, **settings: Any) -> MemoryEstimate:
    """Per-device memory of a job: ``memest hf MODEL ... --json`` as a :class:`MemoryEstimate`.

    Args:
        model: A Hub id or catalog name, a model folder, a config.json or a Meta params.json; or a
            config.json's contents as a mapping (data only: its model code is never loaded); None: the
            model the ``config`` files name (a recipe's ``model_name_or_path``, ``base_model``).
        mode: ``train``, ``lora``, ``qlora`` or ``serve``; None (the default): the ``config`` files' mode,
            else ``serve``.
        settings: The CLI's workload flags with underscores (``gpu="H100"``, ``gpus=8``,
            ``seq_len=8192``, ``precision="bf16"``).

    Raises:
        InputError: a setting the job would not read, a value out of range, an impossible layout.
        UnknownModelError, UnknownDeviceError, ConfigError: as the CLI.
    """
    return estimate_values(model, settings_of(_default_mode(mode, settings), settings))


def estimate_values(model: Model | None, values: Mapping[str, Any], *, hold_batch: bool = False) -> MemoryEstimate:
    """:func:`estimate_memory` from complete settings (``mode`` as the mode settings); the CLI's path.

    ``hold_batch``: every ``batch_size`` sequence is wanted at once, so a serving job that starts and
    only queues gets a recommendation too (:func:`memest.planning.recommend.assess`)."""
    from memest.planning.recommend import assess
    from memest.report import to_dict
    from memest.workload import resolve

    cfg, spec = _model(model_reference(model, values), values)
    device = resolve.devices(values)  # one device, or a Fleet of unlike ones
    if not isinstance(device, Fleet):
        device = calibrated(device, values)
    workload = resolve.resolve(values, spec, device, checkpoint_params=checkpoint_params(values, spec),
                               gguf_tensors=gguf_tensors(values), model=_given(model))
    result = assess(spec, workload, device, headroom=resolve.headroom(values),
                    device_given=resolve.gpu_name(values) is not None,
                    allow_stack_change=values["allow_stack_change"], hold_batch=hold_batch)
    return MemoryEstimate(to_dict(result), result, cfg)


PLAN_DEFAULTS: dict[str, Any] = {"gpus_available": None, "max_gpus": None, "global_batch_size": None,
                                 "allow_method_change": False, "allow_quantization": False, "allow_offload": False,
                                 "allow_optimizer_change": False, "allow_batch_reshape": False, "top": 1, "cost": None, "costs": None, "host_memory": None,
                                 "compare_engines": False}
"""The planner's own keywords (the CLI's search flags) and their defaults (None: the planner's);
``compare_engines`` is what ``engine="any"`` asks for."""

ANY_ENGINE = "any"
"""The ``engine`` value that makes a serving plan compare the engines (:mod:`memest.planning.engines`)."""



def plan_memory(model: Model | None = None, *, mode: str | None = None, gpus_available: str | None = None, max_gpus: int | None = None,
                global_batch_size: int | None = None, allow_method_change: bool = False,
                allow_quantization: bool = False, allow_offload: bool = False,
                allow_optimizer_change: bool = False, allow_batch_reshape: bool = False, top: int = 1,
                cost: Mapping[str, float] | Iterable[str] | None = None, costs: str | Path | None = None,
                host_memory: float | None = None, **settings: Any) -> MemoryPlan:
    """The cheapest setups that fit: ``memest plan MODEL ... --json`` as a :class:`MemoryPlan`.

    Args:
        gpus_available: Device types and counts, ``"8xH100,32xA100-80GB,L4"`` (default: every
            catalog device, or ``gpu``).
        max_gpus: Most devices of one type to try.
        global_batch_size: Training: sequences per optimizer step to hold.
        allow_method_change, allow_quantization, allow_offload, allow_optimizer_change, allow_batch_reshape:
            Widen the search (see ``memest plan --help``).
        top: The best setups of each device type to return (the ``top`` best overall are among them).
        cost: Prices in USD per device-hour, ``{"H100": 2.49}`` or ``["H100=2.49"]``.
        costs: A JSON file of prices.
        host_memory: CPU RAM per server in GiB that offload may use.
        settings: The workload, as for :func:`estimate_memory` (``gpus``, ``dp``, ``tp``, ``pp`` and
            ``sequence_parallel`` are searched: the values given are ignored). ``engine="any"``
            compares the serving engines on each device type instead (:mod:`memest.planning.engines`; the
            answer's ``engine_comparison``, as ``memest plan --serve --engine any --json``).

    Raises:
        InputError: as ``memest plan``.
    """
    compare = isinstance(settings.get("engine"), str) and settings["engine"].lower() == ANY_ENGINE
    if compare:  # a GGUF file is read by the llama.cpp job (memest.planning.engines)
        settings = {k: v for k, v in settings.items() if k != "engine"} | (
            {"engine": "llama.cpp"} if settings.get("gguf") else {})
    search = {"compare_engines": compare,"gpus_available": gpus_available, "max_gpus": max_gpus, "global_batch_size": global_batch_size,
              "allow_method_change": allow_method_change, "allow_quantization": allow_quantization,
              "allow_offload": allow_offload, "allow_optimizer_change": allow_optimizer_change,
              "allow_batch_reshape": allow_batch_reshape, "top": top, "cost": cost, "costs": costs, "host_memory": host_memory}
    return plan_values(model, settings_of(_default_mode(mode, settings), settings), search)


def plan_values(model: Model | None, values: Mapping[str, Any], search: Mapping[str, Any]) -> MemoryPlan:
    """:func:`plan_memory` from complete settings and the planner's keywords; the CLI's path.

    Raises:
        InputError: a search keyword the mode does not read, bad prices or devices, hybrid-shard
            FSDP without ``dp_shard``.
    """
    from memest.planning.search import DEFAULT_HOST_MEMORY_BYTES, DEFAULT_MAX_DEVICES, Space, plan, widenings
    from memest.report import plan_to_dict
    from memest.workload import FsdpStrategy, resolve

    s = {**PLAN_DEFAULTS, **search}
    max_gpus = DEFAULT_MAX_DEVICES if s["max_gpus"] is None else s["max_gpus"]
    host_memory = DEFAULT_HOST_MEMORY_BYTES / GiB if s["host_memory"] is None else s["host_memory"]
    if not host_memory >= 0:  # also NaN
        what = "is negative" if host_memory < 0 else "is not a size"
        raise InputError(f"{{host_memory}} {host_memory:g} GiB {what}; give the CPU RAM per server in GiB, or 0 to "
                         "rule out offload", field="host_memory")
    serving = resolve.mode_of(values) == "serve"
    if serving and s["allow_method_change"]:
        raise InputError("{allow_method_change} lets a training plan try LoRA / QLoRA; for serving use "
                         "{allow_quantization}", field="allow_method_change")
    if serving and s["allow_offload"]:
        raise InputError("{allow_offload} lets a training plan try CPU offload of optimizer states and parameters; "
                         "serving offloads nothing: drop it", field="allow_offload")
    if serving and s["global_batch_size"] is not None:
        raise InputError("{global_batch_size} is the sequences per optimizer step of a training plan; a serving plan "
                         "holds {batch_size} concurrent sequences per replica: drop it", field="global_batch_size")
    if not serving and s["allow_quantization"]:
        raise InputError("{allow_quantization} lets a serving plan try int8/int4/fp8 weights and fp8 KV; for "
                         "training use {allow_method_change} (QLoRA)", field="allow_quantization")
    if s["compare_engines"]:
        return _compare_values(model, values, s, max_gpus, serving)
    devices = tuple(dataclasses.replace(c, device=calibrated(c.device, values))
                    for c in device_choices(s["gpus_available"], resolve.gpu_name(values), max_gpus))
    space = Space(devices=devices, prices=price_table(s["cost"], s["costs"], [c.device for c in devices]),
                  allow_method_change=s["allow_method_change"],
                  allow_quantization=s["allow_quantization"], allow_offload=s["allow_offload"],
                  allow_optimizer_change=s["allow_optimizer_change"], allow_batch_reshape=s["allow_batch_reshape"],
                  allow_stack_change=values["allow_stack_change"], global_batch_size=s["global_batch_size"], host_memory_bytes=round(host_memory * GiB))
    if values["fsdp"] is not None and FsdpStrategy(values["fsdp"]) is FsdpStrategy.HYBRID_SHARD \
            and values["dp_shard"] is None:
        raise InputError("plan with {fsdp} hybrid_shard needs {dp_shard} N (ranks per shard group, e.g. 8): the "
                         "default depends on the device count, which plan searches", field="dp_shard")
    given = resolve.flags_beyond_files(values)
    # the count is searched: give the job the fewest devices its cp x tp x pp allow
    job = {**values, "gpus": (values["tp"] or 1) * values["pp"] * values["cp"], "dp": None, "sequence_parallel": False}
    ref = model_reference(model, values)
    _, spec = _model(ref, values)
    device = resolve.device(job)
    workload = resolve.resolve(job, spec, device, checkpoint_params=checkpoint_params(values, spec),
                               gguf_tensors=gguf_tensors(values), model=_given(model))
    result = widenings(plan(spec, workload, space, headroom=resolve.headroom(values), top=s["top"]))
    return MemoryPlan(plan_to_dict(result, model=_name(ref, spec), given=given), result)


def _compare_values(model: Model | None, values: Mapping[str, Any], s: Mapping[str, Any], max_gpus: int,
                    serving: bool) -> MemoryPlan:
    """``engine="any"``: the serving engines compared on each device type (:func:`plan_values`).

    Raises:
        InputError: not a serving job; with ``allow_quantization`` (compare at one quantization).
    """
    from memest.devices import DEFAULT_DEVICE, get_device
    from memest.planning.engines import compare_engines
    from memest.report.engines import engines_to_dict
    from memest.workload import resolve

    if not serving:
        raise InputError("{engine} any compares the serving engines: it needs a serving job (mode='serve')",
                         field="engine")
    if s["allow_quantization"]:
        raise InputError("{engine} any compares the engines at the job's own weights; drop {allow_quantization} and "
                         "give one {quantization}", field="allow_quantization")
    devices = device_choices(s["gpus_available"], resolve.gpu_name(values), max_gpus)
    ref = model_reference(model, values)
    _, spec = _model(ref, values)
    job = {**values, "gpus": 1, "tp": None, "pp": 1, "dp": None}
    # the job is resolved on a device every compared engine runs on; each row is estimated on its own type
    workload = resolve.resolve(job, spec, get_device(DEFAULT_DEVICE), checkpoint_params=checkpoint_params(values, spec),
                               gguf_tensors=gguf_tensors(values), model=_given(model))
    result = compare_engines(spec, workload, devices, headroom=resolve.headroom(values),
                             prices=price_table(s["cost"], s["costs"], [c.device for c in devices]), top=s["top"])
    return MemoryPlan(engines_to_dict(result, model=_name(ref, spec)), result)


def searched_given(values: Mapping[str, Any]) -> list[str]:
    """The settings the planner searches (:data:`memest.planning.search.SEARCHED`) given a value other than its start
    (a ``config`` file's count, accelerate's ``num_processes``, is the file's, not given)."""
    from memest.planning.search import SEARCHED
    from memest.workload.resolve import from_files

    files_say = from_files(values)
    return [n for n, start in SEARCHED.items() if values[n] != start and n not in files_say]


_AVAILABLE_ITEM = re.compile(r"^\s*(?:([-+]?\d+)\s*[x×*]\s*)?(\S.*?)\s*$")


def device_choices(available: str | None, gpu: str | None, max_gpus: int) -> tuple[Any, ...]:
    """The device types of ``gpus_available`` (or ``gpu``, or the whole catalog) with their limits.

    Raises:
        InputError: both gpu and gpus_available, a malformed or repeated item, a count below 1.
        UnknownDeviceError: an unknown device name.
    """
    from memest.devices import DEVICES, Fleet, get_device, get_devices
    from memest.planning.search import DeviceChoice

    if max_gpus < 1:
        raise InputError(f"{{max_gpus}} is {max_gpus}; it must be at least 1", field="max_gpus")
    if available is not None and gpu is not None:
        raise InputError("pass either {gpu} NAME or {gpus_available} SPEC, not both", field="gpus_available")
    if gpu is not None:
        one = get_devices(gpu)
        if isinstance(one, Fleet):
            raise InputError(f"{{gpu}} {gpu!r} lists several devices; a plan searches device types: give them as "
                             f"{{gpus_available}} {','.join(dict.fromkeys(d.ref for d in one.devices))}", field="gpu")
        return (DeviceChoice(one, max_gpus),)
    if available is None:
        return tuple(DeviceChoice(d, max_gpus) for d in DEVICES)
    out: dict[str, Any] = {}
    for item in available.split(","):
        m = _AVAILABLE_ITEM.match(item)
        if not m:
            raise InputError(f"{{gpus_available}} {available!r}: empty item; write e.g. '8xH100,16xA100-80GB'",
                             field="gpus_available")
        count = int(m.group(1)) if m.group(1) else max_gpus
        if count < 1:
            raise InputError(f"{{gpus_available}} item {item.strip()!r}: the count must be at least 1, a positive "
                             f"number of devices (got {count}); write e.g. 2x{m.group(2)}", field="gpus_available")
        device = get_device(m.group(2))
        if device.name in out:
            raise InputError(f"{{gpus_available}} lists {device.name} twice; give it once with its count",
                             field="gpus_available")
        out[device.name] = DeviceChoice(device, count)
    return tuple(out.values())


def price_table(cost: Mapping[str, float] | Iterable[str] | None, costs: str | Path | None,
                devices: Iterable[Any] = ()) -> Any:
    """The catalog's prices with the file ``costs`` and then ``cost`` (``NAME=USD`` items or a mapping)
    applied; a name may be the label of a custom device among ``devices`` (``my-card`` for ``my-card:24GB``)."""
    from memest.devices import CUSTOM
    from memest.planning.costs import PriceTable, parse_cost_flags, read_cost_file

    custom = [d for d in devices if d.vendor == CUSTOM]
    table = PriceTable.catalog()
    if costs is not None:
        table = table.with_overrides(read_cost_file(costs), custom)
    if cost:
        items = [f"{k}={v}" for k, v in cost.items()] if isinstance(cost, Mapping) else list(cost)
        table = table.with_overrides(parse_cost_flags(items), custom)
    return table


def sweep_memory(model: Model | None = None, *, mode: str | None = None, **settings: Any) -> MemorySweep:
    """The estimate across a range of one setting: ``memest sweep MODEL ... --json`` as a :class:`MemorySweep`.

    One of ``seq_len``, ``micro_batch_size``, ``batch_size``, ``max_model_len`` is a range: a string as
    the CLI takes it (``"1k..128k"``, ``"1..64:+8"``, ``"1,2,4"``) or a sequence of ints. Without
    ``mode``, sweeping ``seq_len`` or ``micro_batch_size`` means training, else serving.

    Raises:
        InputError: no setting or more than one holds a range; as ``memest sweep``.
    """
    from memest.planning.sweep import SWEEPABLE

    ranged: dict[str, str | None] = {}
    for name in SWEEPABLE:
        value = settings.pop(name, None)
        if value is not None and not isinstance(value, str):
            if isinstance(value, bool) or not isinstance(value, int | list | tuple | range):
                raise InputError(f"{{{name}}} {value!r}: give an int, a range string such as '1k..128k' or a "
                                 "sequence of ints", field=name)
            value = ",".join(str(int(v)) for v in (value if not isinstance(value, int) else [value]))
        ranged[name] = value
    return sweep_values(model, settings_of(mode, settings), ranged)


def split_sweep(values: Mapping[str, Any],
                ranged: Mapping[str, str | None]) -> tuple[str, tuple[int, ...], dict[str, Any]]:
    """Which setting is swept, its values, and the settings with every ranged one a plain value (the
    swept one at its first value). Without a mode, sweeping a training setting (seq_len,
    micro_batch_size) means training.

    Raises:
        InputError: no setting or more than one holds a range.
    """
    from memest.planning.sweep import SWEEPABLE, parse_values
    from memest.workload.resolve import MAX_INT
    from memest.workload.settings import settings

    out = dict(values)
    swept: list[tuple[str, tuple[int, ...]]] = []
    for name in SWEEPABLE:
        raw = ranged.get(name)
        parsed = parse_values(raw, name) if raw is not None else (values.get(name, settings()[name].default),)
        if parsed[-1] is not None and parsed[-1] > MAX_INT:
            raise InputError(f"{{{name}}} {raw!r} reaches {parsed[-1]:,}, beyond anything memest can size (at most "
                             f"{MAX_INT:,}, as for every integer setting); end the range lower", field=name)
        if len(parsed) > 1:
            swept.append((name, parsed))
        out[name] = parsed[0]
    single = [name for name in SWEEPABLE if ranged.get(name) is not None and name not in dict(swept)]
    if not swept and single:
        name = single[0]
        raise InputError(f"{{{name}}} {ranged[name]!r} has one value ({out[name]:,}); a sweep needs a range of two or "
                         f"more, e.g. {{{name}}} 1k..128k", field=name)
    if len(swept) != 1:
        given = ", ".join("{" + n + "}" for n, _ in swept)
        raise InputError(("sweep one setting at a time (ranges given: " + given + ")") if swept else
                         "give one setting a range, e.g. {seq_len} 1k..128k, {micro_batch_size} 1..64, "
                         "{batch_size} 1..256 or {max_model_len} 4k..128k", field=swept[0][0] if swept else "seq_len")
    setting, points = swept[0]
    if not (out["train"] or out["finetune"] or out["serve"]):
        out["train" if setting in ("seq_len", "micro_batch_size") else "serve"] = True
    return setting, points, out


def sweep_values(model: Model | None, values: Mapping[str, Any], ranged: Mapping[str, str | None]) -> MemorySweep:
    """:func:`sweep_memory` from complete settings and the ranged settings' raw text; the CLI's path."""
    from memest.planning.sweep import sweep
    from memest.report import sweep_to_dict
    from memest.workload import resolve

    setting, points, job = split_sweep(values, ranged)
    _, spec = _model(model_reference(model, job), job)
    device = calibrated(resolve.device(job), job)
    workload = resolve.resolve(job, spec, device, checkpoint_params=checkpoint_params(job, spec),
                               gguf_tensors=gguf_tensors(job), model=_given(model))
    result = sweep(spec, workload, device, setting, points, headroom=resolve.headroom(job))
    return MemorySweep(sweep_to_dict(result), result)


class LogCheck(Report):
    """One log of :func:`check_logs` (an item of ``memest check --json``); ``result`` is the
    :class:`memest.check.Check`."""

    __slots__ = ()


class LogsFailed(InputError):
    """Some of the logs :func:`check_logs` was given could not be checked; raised once every log was tried.

    Its message is the first failure's (one line; with ``and N more logs failed`` when several did).

    Attributes:
        checks: The :class:`LogCheck` of each log that could be checked, in the order given.
        errors: ``(name, error)`` of each log that could not, in the order given; each message starts
            with the log's name.
    """

    def __init__(self, errors: list[tuple[str, MemestError]], checks: list[LogCheck] | None = None) -> None:
        self.errors = list(errors)
        self.checks = list(checks or ())
        first = self.errors[0][1]
        more = len(self.errors) - 1
        suffix = f" (and {more} more log{'s' if more > 1 else ''} failed)" if more else ""
        super().__init__(first.template + suffix, field=first.field)

    def named(self, name: Any) -> LogsFailed:
        """The same failure with every log's message rendered by ``name`` (the CLI's flags)."""
        return LogsFailed([(n, e.named(name)) for n, e in self.errors], self.checks)

    def to_dict(self) -> dict[str, Any]:
        """The checked logs' items and each failed log's message: ``memest check --json`` when some
        logs were checked and some not."""
        return {"checks": [c.to_dict() for c in self.checks],
                "errors": [{"log": n, "error": str(e)} for n, e in self.errors]}


def check_logs(logs: str | Any | Mapping[str, Any] | Iterable[Any], *, model: str | None = None,
               gpu: str | None = None, engine_version: str | None = None,
               settings: Mapping[str, Any] | None = None, local_files: bool = True) -> list[LogCheck]:
    """Engine start-up logs or training logs against memest's estimate of the jobs they ran:
    ``memest check LOG ... --json`` as a list of :class:`LogCheck` (``[c.to_dict() for c in ...]`` is
    that JSON). Every log is tried: one that cannot be checked does not hide the others.

    ``model`` and ``gpu`` are for the logs that do not name their own (a model memest resolves
    offline, an accelerator it knows: :func:`memest.check.own_model`, :func:`memest.check.own_device`).
    A log naming its own is estimated with it; when it differs from the one given, that log is refused
    naming both, unless the one given is taken by another log of the call (it was meant for that one),
    in which case the log keeps its own and its notes say so.

    Args:
        logs: One log's text; an iterable of texts (named ``<log 1>``, ``<log 2>``, ... in messages)
            or of ``(name, text)`` pairs; or a mapping of names (a path, ``-``) to texts. A :class:`memest.logs.EngineLog` already
            read may stand for a text. Texts, never paths: nothing is read from disk here.
        model: The model to estimate for the logs naming none memest resolves offline (a catalog
            name, a Hub id, or, with ``local_files``, a folder).
        gpu: The accelerator, for the logs naming none memest knows.
        engine_version: The engine arithmetic to apply instead of the log's version's (``"0.19"``).
        settings: Settings the log does not print, by their keywords (``{"seq_len": 4096, "gpus": 8}``);
            ``config``: config files to read them from.
        local_files: False: the model a log names resolves from memest's catalog only, never a path on
            this machine (what ``memest serve`` does with logs it is sent).

    Raises:
        InputError: no log given, or ``logs`` of another type (None, bytes, a number).
        LogsFailed: (an InputError) once every log was tried, when any could not be checked: an empty
            or binary text, a log in no format memest reads (the message lists the formats), one
            without its figures, a number too large to be a figure; as
            :func:`memest.check.check_log` (the model not named, a different model or accelerator
            given than the log's own, no accelerator, a training setting the log lacks, a job memest
            does not estimate); each message starts with the log's name. Its ``checks`` hold the
            logs that could be checked.
    """
    from memest.check import check_log, own_device, own_model
    from memest.logs import EngineLog, check_text, read_log
    from memest.report.check import check_to_dict

    if isinstance(logs, str | EngineLog):
        named: list[tuple[str, Any]] = [("<log>", logs)]
    elif isinstance(logs, Mapping):
        named = list(logs.items())
    elif logs is None or isinstance(logs, bytes | bytearray) or not isinstance(logs, Iterable):
        hint = " (decode it first: log.decode())" if isinstance(logs, bytes | bytearray) else ""
        what = "None" if logs is None else f"of type {type(logs).__name__}"
        raise InputError(f"logs is {what}{hint}; pass a log's text (a string), a list of texts or of "
                         "(name, text) pairs, or a mapping of names to texts")
    else:
        named = [item if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                 else (f"<log {i}>", item) for i, item in enumerate(logs, 1)]
    if not named:
        raise InputError("no log given; pass an engine's start-up log or a training log as text")
    given = dict(settings or {})
    read: dict[int, EngineLog] = {}
    failed: dict[int, MemestError] = {}
    for i, (name, item) in enumerate(named):
        try:
            if isinstance(item, EngineLog):
                read[i] = item
            elif isinstance(item, str):
                read[i] = read_log(check_text(item, name), name)
            else:
                raise InputError(f"{name}: {type(item).__name__} is not a log's text; pass the log itself as a "
                                 "string (read the file yourself: this function reads none)")
        except MemestError as exc:
            failed[i] = exc
    # the model / accelerator given is for the logs naming none; when some log takes it, a log naming a
    # different one of its own keeps its own (noted) rather than being refused
    model_taken = model is not None and any(own_model(log, local_files) is None for log in read.values())
    gpu_taken = gpu is not None and any(own_device(log) is None for log in read.values())
    checks: dict[int, LogCheck] = {}
    for i, log in read.items():
        name = named[i][0]
        notes = []
        log_model, log_gpu = model, gpu
        own = own_model(log, local_files)
        if model_taken and own is not None and model not in (log.model, own):
            log_model = None
            notes.append(f"model: the log's own ({log.model}); the model given ({model}) is for the logs "
                         "naming none memest resolves")
        device = own_device(log)
        if gpu_taken and device is not None and not _same_device(gpu, device):
            log_gpu = None
            notes.append(f"device: the log's own ({log.gpu}); the accelerator given ({gpu}) is for the logs "
                         "naming none memest knows")
        try:
            c = check_log(log, name=name, model=log_model, gpu=log_gpu, engine_version=engine_version,
                          settings=given, local_files=local_files)
        except MemestError as exc:
            failed[i] = exc
            continue
        if notes:
            c = dataclasses.replace(c, notes=(*notes, *c.notes))
        checks[i] = LogCheck(check_to_dict(c), c)
    if failed:
        raise LogsFailed([(named[i][0], failed[i]) for i in sorted(failed)], [checks[i] for i in sorted(checks)])
    return [checks[i] for i in sorted(checks)]


def _same_device(name: str, device: Any) -> bool:
    """True when the accelerator ``name`` is ``device`` (False when memest does not know it)."""
    from memest.devices import get_device

    try:
        return get_device(name).name == device.name
    except MemestError:
        return False


def _advertise_settings(func: Any) -> None:
    """Give ``func`` a signature that lists every setting keyword (``help(memest.estimate_memory)``,
    editors) in place of its ``**settings``; the function itself still takes them as keywords."""
    import inspect

    from memest.workload.settings import settings

    sig = inspect.signature(func)
    own = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    names = {p.name for p in own}
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=getattr(s.default, "value", s.default))
             for name, s in settings().items() if name not in names and name not in ("train", "finetune", "serve")]
    func.__signature__ = sig.replace(parameters=[*own, *extra])


for _func in (estimate_memory, plan_memory, sweep_memory):
    _advertise_settings(_func)
