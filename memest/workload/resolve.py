"""A workload from the settings a user gave, with the defaults and checks every caller gets.

``values`` maps setting keywords (:func:`memest.workload.settings.settings`) to what the user gave;
missing ones take their defaults. :func:`resolve` picks the mode, refuses settings the job would not
read (:func:`check_scope`), and fills in what depends on the model, the device or other settings:
the training sequence length (min(2048, max_position_embeddings)), the serving tensor-parallel degree
(what ``gpus`` leaves after pp x dp), the data-parallel degree, ``fsdp`` as a ZeRO stage and
framework, and FSDP hybrid-shard groups (one node).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Collection, Iterable, Mapping
from enum import Enum
from typing import Any

from memest.devices import DEFAULT_DEVICE, Device, Fleet, get_devices
from memest.errors import InputError
from memest.spec import ModelSpec
from memest.workload import files, stacks
from memest.workload.config import (
    DEEPSPEED_BUCKET_KEYS,
    ENGINE_VENDORS,
    DeepSpeedBuckets,
    Engine,
    Float8,
    Framework,
    FsdpStrategy,
    KbitPrep,
    LoraConfig,
    LoraLibrary,
    Method,
    Parallelism,
    ServingConfig,
    Stack,
    TrainingConfig,
    Workload,
    capability_refusal,
    resolve_framework,
    runs_on,
)
from memest.workload.refusals import training_refusal
from memest.workload.settings import Setting, defaults, enum_of, given_flags, settings
from memest.workload.validate import divisors, named_by_file, tp_head_problem

MAX_INT = 2**31 - 1
"""The largest value an integer setting takes (sequences, tokens, devices, ranks): larger ones
describe no real job and would make the divisor searches of the planner slow."""

FSDP_ZERO_STAGE = {FsdpStrategy.FULL_SHARD: 3, FsdpStrategy.HYBRID_SHARD: 3, FsdpStrategy.SHARD_GRAD_OP: 2,
                   FsdpStrategy.NO_SHARD: 0}
"""The ZeRO stage each FSDP sharding strategy is."""


def complete(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with the settings not in it from the ``config`` files (those the job reads), else their
    defaults. Complete settings (every name present) are returned as they are: the files fill a job once.

    Raises:
        InputError: a name that is no setting.
    """
    known = settings()
    unknown = [n for n in values if n not in known]
    if unknown:
        raise InputError(f"unknown setting {unknown[0]!r}; the settings are: {', '.join(known)}", field=unknown[0])
    out = defaults() | {name: _coerce(known[name], value) for name, value in values.items()}
    if out["config"]:  # a setting in ``values`` was given, even at its default: a file fills only the others
        found = files.read(out["config"]).values
        mode_given = any(out[m] for m in MODE_SETTINGS if m in values)  # the user's mode wins over a file's
        fill = {name: _coerce(known[name], value) for name, value in found.items()
                if name not in values and not (mode_given and name in MODE_SETTINGS)}
        if not mode_given and not any(fill.get(m) for m in MODE_SETTINGS) and \
                any(known[name].scope == "training" for name in fill):
            fill["train"] = True  # no mode anywhere: files of training settings (a DeepSpeed JSON) are training
        mode = mode_of(out | fill)
        out |= {name: value for name, value in fill.items() if _read_by(out | fill, mode, name)}
    return out


MODE_SETTINGS = ("train", "finetune", "serve")


def _read_by(values: Mapping[str, Any], mode: str, name: str) -> bool:
    """Whether a job of ``mode`` reads setting ``name`` (a file's value it would not read is left out: a LoRA
    recipe's rank under {train})."""
    try:
        check_scope(values, mode, given_names=(name,))
    except InputError:
        return False
    return True


def flags_beyond_files(values: Mapping[str, Any]) -> dict[str, str]:
    """The ``memest hf`` flags of complete settings ``values`` that the ``config`` files do not already give
    (:func:`memest.workload.settings.given_flags`): a printed command repeats ``{config}``, not what it says,
    and keeps a setting given over a file even at its default."""
    if not values["config"]:
        return given_flags(dict(values))
    found = _file_values(values)
    mode = mode_of(values)
    over = frozenset(n for n, v in found.items() if values[n] != v and (n in MODE_SETTINGS or _read_by(values, mode, n)))
    return given_flags({n: v for n, v in values.items() if n not in from_files(values)}, always=over)


def from_files(values: Mapping[str, Any]) -> frozenset[str]:
    """The settings of complete ``values`` whose value is the ``config`` files' (not given by the caller)."""
    if not values["config"]:
        return frozenset()
    return frozenset(n for n, v in _file_values(values).items() if values[n] == v)


def _file_values(values: Mapping[str, Any]) -> dict[str, Any]:
    known = settings()
    return {n: _coerce(known[n], v) for n, v in files.read(values["config"]).values.items()}


def config_report(v: Mapping[str, Any], model: str | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The config files' notes, and what was read from which file, line and key, for complete settings ``v``
    (before a stack's defaults fill them). A setting the job reads whose value differs from a file's was given
    explicitly: one note names them all.

    Args:
        model: The model reference the caller gave, if any (it wins over the files', said once).
    """
    if not v["config"]:
        return (), ()
    r = files.read(v["config"], model=model)
    known = settings()
    read, overridden, unread = [], [], []
    if r.model is not None and (model is None or model == r.model):
        read.append(f"model {r.model} from {r.origins['model']}")
    mode = mode_of(v)
    for name, value in r.values.items():
        value = _coerce(known[name], value)
        where = r.origins[name]
        if name in MODE_SETTINGS and v[name] != value:
            overridden.append(f"the mode ({mode}) over {name} {_shown(value)} ({where})")
        elif name not in MODE_SETTINGS and not _read_by(v, mode, name):
            unread.append(f"{name} ({where})")
        elif v[name] == value:
            read.append(f"{name} {_shown(value)} from {where}")
        else:  # the files fill every setting not given that the job reads
            overridden.append(f"{name} {_shown(v[name])} over {_shown(value)} ({where})")
    notes = r.notes + ((f"settings given override the config files: {'; '.join(overridden)}",) if overridden else ())
    if unread:
        notes += (f"a {mode} job does not read the config files' {', '.join(unread)}",)
    return notes, tuple(read)


def _coerce(s: Setting, value: Any) -> Any:
    """A setting's value as its type: an enum from its value (any case); others checked, not converted.

    A list or tuple of a list setting's items (:attr:`Setting.items`) becomes its comma-separated text.

    Raises:
        InputError: a value of another type, or not one of an enum's values.
    """
    if value is None:
        if s.default is None:
            return None
        raise InputError(f"{{{s.name}}} is None; drop it for its default ({_shown(s.default)})", field=s.name)
    enum = enum_of(s.type)
    if enum is not None:
        allowed = s.choices or tuple(m.value for m in enum)
        try:
            member = value if isinstance(value, enum) else \
                enum(str(value).lower()) if isinstance(value, str) else enum(value)
        except ValueError:
            member = None
        if member is None or member.value not in allowed:
            fix = f"; {s.fix}" if s.choices else ""
            given = value.value if isinstance(value, Enum) else value
            raise InputError(f"{{{s.name}}} {given!r} is not one of {', '.join(allowed)}{fix}", field=s.name)
        return member
    if s.items is not None and isinstance(value, list | tuple):
        return _joined(s, value)
    kinds = [k for k in (s.type, *typing.get_args(s.type)) if isinstance(k, type) and k is not type(None)]
    kind = kinds[0] if kinds else object
    ok = {bool: isinstance(value, bool), int: isinstance(value, int) and not isinstance(value, bool),
          float: isinstance(value, int | float) and not isinstance(value, bool),
          str: isinstance(value, str)}.get(kind, True)
    if not ok:
        raise InputError(f"{{{s.name}}} {value!r} is not {_article(kind)}", field=s.name)
    return value


def _joined(s: Setting, items: list[Any] | tuple[Any, ...]) -> str:
    """A list setting's items as the comma-separated text the CLI takes (``["q_proj", "v_proj"]`` ->
    ``"q_proj,v_proj"``).

    Raises:
        InputError: no items, or an item of another type.
    """
    kind = s.items
    for item in items:
        ok = isinstance(item, str) if kind is str else isinstance(item, int | float) and not isinstance(item, bool)
        if not ok:
            raise InputError(f"{{{s.name}}} item {item!r} is not {_article(kind)}; give a list of them or one "
                             "comma-separated string", field=s.name)
    if not items:
        raise InputError(f"{{{s.name}}} is an empty list; give at least one item, or drop it for its default",
                         field=s.name)
    return ",".join(str(item) for item in items)


def _shown(value: Any) -> str:
    return str(value.value if isinstance(value, Enum) else value)


def _article(kind: type) -> str:
    return {bool: "True or False", int: "an integer", float: "a number", str: "a string"}.get(kind, kind.__name__)


def given(values: Mapping[str, Any], name: str) -> bool:
    """True when a setting differs from its default (was given)."""
    return values[name] != settings()[name].default


def mode_of(values: Mapping[str, Any]) -> str:
    """``train``, ``finetune`` or ``serve`` (the default).

    Raises:
        InputError: more than one mode.
    """
    modes = [m for m in ("train", "serve") if values["train" if m == "train" else "serve"]]
    modes += ["finetune"] if values["finetune"] else []
    if len(modes) > 1:
        raise InputError(f"choose one of {{train}}, {{finetune}}, {{serve}} (got "
                         f"{', '.join('{' + m + '}' for m in modes)})",
                         field=modes[-1])
    return modes[0] if modes else "serve"


def check_scope(values: Mapping[str, Any], mode: str, given_names: Collection[str] | None = None) -> None:
    """Refuse settings the chosen mode, method or engine would not read (each :class:`Setting`'s
    ``scope``, ``methods`` and ``engine``).

    Args:
        given_names: The settings the caller named (a CLI flag typed, a keyword passed), whatever
            their value; None: those that differ from their defaults.

    Raises:
        InputError: such a setting was given.
    """
    defaulted = not (values["train"] or values["finetune"] or values["serve"])
    training = mode != "serve"
    for name, s in settings().items():
        if not (name in given_names if given_names is not None else given(values, name)):
            continue
        if s.scope in ("training", "serving") and (s.scope == "training") != training:
            fix = s.fix
            if defaulted:  # serving because no mode was given
                fix = f"add {{train}} or {{finetune}} (serving is the default), or {fix}"
            raise InputError(f"{{{name}}} is a {s.scope} flag ({s.what}); {fix}", field=name)
        if training and s.methods:
            method = values["finetune"] or Method.FULL
            if Method(method).value not in s.methods:
                needs = " or ".join(f"{{finetune}} {m}" for m in s.methods)
                asked = "{train}" if method is Method.FULL else f"{{finetune}} {Method(method).value}"
                raise InputError(f"{{{name}}} applies to {needs}, not {asked}; drop it", field=name)
        if not training and name in ("tp", "pp") and Engine(values["engine"]) in FLEET_ENGINES \
                and values[name] not in (None, 1):
            raise InputError(f"{{{name}}} {values[name]}: {{engine}} {Engine(values['engine']).value} splits the "
                             "model by layers over the devices, never by tensor or pipeline parallelism; pass "
                             f"{{gpus}} {values[name]} (and {{tensor_split}} for uneven shares) instead", field=name)
        if not training and s.engine is not None:
            engine = Engine(values["engine"])
            engines = s.engine if isinstance(s.engine, tuple) else (s.engine,)
            if engine.value not in engines:
                other = " / {engine} ".join(engines)
                raise InputError(f"{{{name}}} is a {{engine}} {other} flag; {{engine}} {engine.value} does not "
                                 f"read it: drop it or pass {{engine}} {other}", field=name)


def check_sizes(values: Mapping[str, Any]) -> None:
    """Integer settings at most :data:`MAX_INT`; device counts and degrees at least 1.

    Raises:
        InputError: a value outside those bounds.
    """
    for name, value in values.items():
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_INT:
            raise InputError(f"{{{name}}} {value} is beyond anything memest can size (at most {MAX_INT:,}); give a "
                             "realistic value", field=name)
    for name in ("gpus", "pp", "cp", "ep", "tp", "dp"):
        value = values[name]
        if value is not None and value < 1:
            raise InputError(f"{{{name}}} is {value}; it must be at least 1", field=name)


def gpu_name(values: Mapping[str, Any]) -> str | None:
    """The ``gpu`` name as given, or None when it was not.

    Raises:
        InputError: an empty name.
    """
    name = values["gpu"]
    if name is not None and not name.strip():
        raise InputError(f"{{gpu}} {name!r} is empty; pass a device name such as H100 (see 'memest gpus'), or drop "
                         f"{{gpu}} for the default {DEFAULT_DEVICE}", field="gpu")
    return name


def device(values: Mapping[str, Any]) -> Device:
    """The ``gpu`` device, or the default.

    Raises:
        InputError: an empty name; a list of devices (only :func:`devices` reads one).
        UnknownDeviceError: an unknown name.
    """
    found = devices(values)
    if isinstance(found, Fleet):
        raise InputError(f"{{gpu}} {found.name!r} lists several devices; only a serving estimate reads a list (memest "
                         "hf): give one device here", field="gpu")
    return found


def devices(values: Mapping[str, Any]) -> Device | Fleet:
    """The ``gpu`` device, the :class:`~memest.devices.Fleet` a comma-separated list names
    (``RTX-4090,RTX-3090``), or the default device.

    Raises:
        InputError: an empty name.
        UnknownDeviceError: an unknown name, or a list with an empty or unknown item.
    """
    return get_devices(gpu_name(values) or DEFAULT_DEVICE)


FLEET_ENGINES = (Engine.LLAMACPP, Engine.OLLAMA)
"""Engines that split a model over unlike cards (llama.cpp's layer split, ``--tensor-split``)."""
SMALLEST_CARD_ENGINES = (Engine.VLLM, Engine.SGLANG, Engine.TRTLLM)
"""Tensor-parallel engines: their shards are equal, so on unlike cards they run at the smallest card's memory
(:func:`memest.estimate.estimate`)."""


def _fleet_count(v: dict[str, Any], fleet: Fleet) -> None:
    """Set ``gpus`` to the devices listed, refusing another count given."""
    if given(v, "gpus") and v["gpus"] != len(fleet):
        raise InputError(f"{{gpus}} {v['gpus']} disagrees with the {len(fleet)} devices of {{gpu}} {fleet.name!r}; drop "
                         f"{{gpus}} (the list sets it) or pass {{gpus}} {len(fleet)}", field="gpus")
    v["gpus"] = len(fleet)


def check_fleet(mode: str, engine: Engine | None, fleet: Fleet, v: Mapping[str, Any] | None = None) -> None:
    """Refuse a job on unlike devices that memest does not model: training, and engines other than
    :data:`FLEET_ENGINES` and :data:`SMALLEST_CARD_ENGINES`; for the latter, anything but one
    tensor-parallel group (pp and dp 1).

    Raises:
        InputError: naming the devices and the engines that take unlike cards.
    """
    if not fleet.mixed:
        return
    engines = ", ".join(e.value for e in FLEET_ENGINES) + " (layer split); " + \
        ", ".join(e.value for e in SMALLEST_CARD_ENGINES) + " (at the smallest card)"
    if mode != "serve":
        raise InputError(f"training on unlike devices ({{gpu}} {fleet.name}) is not modelled: every rank holds an equal "
                         "share; give one {gpu} type with {gpus} N (serving engines that take unlike cards: "
                         f"{engines})", field="gpu")
    if engine not in FLEET_ENGINES + SMALLEST_CARD_ENGINES:
        raise InputError(f"{{engine}} {engine.value if engine else None} does not split over unlike devices ({{gpu}} "
                         f"{fleet.name}); engines that do: {engines}", field="engine")
    if engine in SMALLEST_CARD_ENGINES and v is not None and (v["pp"] > 1 or (v["dp"] or 1) > 1):
        raise InputError(f"{{engine}} {engine.value} on unlike devices ({{gpu}} {fleet.name}) is modelled as one "
                         "tensor-parallel group; drop {pp} / {dp}", field="engine")


def headroom(values: Mapping[str, Any]) -> float:
    """``headroom``, checked.

    Raises:
        InputError: not in [0, 1).
    """
    h = values["headroom"]
    if not 0 <= h < 1:
        raise InputError(f"{{headroom}} {h} must be in [0, 1), e.g. 0.1 for 10%", field="headroom")
    return float(h)


def tensor_split(value: str | tuple[float, ...] | None) -> tuple[float, ...]:
    """``tensor_split`` as shares (``"10,6"`` from the CLI, or shares already).

    Raises:
        InputError: a share that is not a number.
    """
    if value is None:
        return ()
    if not isinstance(value, str):
        return tuple(float(x) for x in value)
    try:
        return tuple(float(x) for x in value.replace("/", ",").split(","))
    except ValueError:
        raise InputError(f"{{tensor_split}} {value!r} is not a list of numbers; write one share per GPU, e.g. "
                         "{tensor_split} 10,6", field="tensor_split") from None


def resolve(values: Mapping[str, Any], spec: ModelSpec, device: Device | Fleet, *, scope: bool = True,
            checkpoint_params: tuple[tuple[str, int], ...] = (),
            gguf_tensors: tuple[tuple[str, str, tuple[int, ...]], ...] = (), model: str | None = None) -> Workload:
    """The workload ``values`` describe for ``spec`` on ``device`` (a :class:`~memest.devices.Fleet`: ``gpus`` is
    its length, :func:`check_fleet` its rules).

    Args:
        values: Settings by keyword; missing ones take their defaults.
        scope: Refuse settings the job would not read (:func:`check_scope`).
        checkpoint_params: The checkpoint's parameters per stored dtype, for ``exact_weights``.
        gguf_tensors: The tensors of the ``gguf`` file's header.
        model: The model reference the caller gave (a config file naming another is said in the notes).

    Raises:
        InputError: conflicting modes, a setting the mode (method, engine) does not read, a size out
            of bounds, or a device count the parallel degrees do not divide.
    """
    v = complete(values)
    try:
        return _resolve(v, spec, device, scope, checkpoint_params, gguf_tensors, model)
    except InputError as exc:
        if not v["config"] or exc.field in values:
            raise
        raise named_by_file(exc, dict(files.read(v["config"]).origins)) from None


def _resolve(v: dict[str, Any], spec: ModelSpec, device: Device | Fleet, scope: bool,
             checkpoint_params: tuple[tuple[str, int], ...], gguf_tensors: tuple[tuple[str, str, tuple[int, ...]], ...],
             model: str | None) -> Workload:
    mode = mode_of(v)
    if scope:
        check_scope(v, mode)
    fleet = device if isinstance(device, Fleet) else None
    if fleet is not None:
        check_fleet(mode, Engine(v["engine"]) if mode == "serve" else None, fleet, v)
        _fleet_count(v, fleet)
        device = fleet.smallest
    check_sizes(v)
    notes, read = config_report(v, model)
    if mode != "serve":
        t = _training(v, spec, device)
        found = files.read(v["config"]).buckets if v["config"] else {}
        buckets, filled, more = deepspeed_buckets(found, t.stack, t.parallelism.zero_stage, spec)
        return t.replace(config_notes=notes + more + t.config_notes, config_read=read + filled,
                         deepspeed_buckets=buckets)
    engine = Engine(v["engine"])
    devices = fleet.devices if fleet is not None else (device,)
    for each in devices:
        if not runs_on(engine.value, each.vendor):
            others = engines_on(d.vendor for d in devices)
            use = " or ".join(", ".join(f"{{engine}} {e.value}" for e in others).rsplit(", ", 1))
            raise InputError(f"{{engine}} {engine.value} does not run on {each.name} ({each.vendor}); use "
                             f"{use or 'another engine'}, or another {{gpu}}", field="engine")
    for each in devices:
        limit_devices(each, v["gpus"] if fleet is None else len(fleet.devices))
    max_len = v["max_model_len"]
    if max_len is None and v["prompt_len"] is not None and v["max_new_tokens"] is not None:
        max_len = v["prompt_len"] + v["max_new_tokens"]
    fields = {f.name for f in dataclasses.fields(ServingConfig)}
    declared = {st.attr: v[name] for name, st in settings().items() if st.scope == "serving" and st.attr in fields}
    served = ServingConfig(**declared | {
        "max_model_len": max_len,
        "engine": engine,
        "tensor_split": tensor_split(v["tensor_split"]),
        "gguf_tensors": gguf_tensors,
        "checkpoint_params": checkpoint_params,
        "parallelism": serving_parallelism(v, spec),
        **dict(zip(("n_gpu_layers", "config_notes"), gpu_layers(v["n_gpu_layers"], spec, engine, notes))),
        "config_read": read,
    })
    for each in devices:
        found = capability_refusal(served, each)
        if found:
            raise InputError(f"{found[1]}; use another {{gpu}} or another {{{found[0]}}}", field=found[0])
    return served


def limit_devices(device: Device, count: int) -> None:
    """Refuse more devices of ``device``'s kind than one job can use (:attr:`Device.max_devices`: one Apple
    Mac is one GPU).

    Raises:
        InputError: ``count`` above it.
    """
    if device.max_devices is not None and count > device.max_devices:
        raise InputError(f"{{gpus}} {count}: {device.name} is one GPU per machine (unified memory), so a job "
                         f"uses at most {device.max_devices}; pass {{gpus}} {device.max_devices} or a larger Mac",
                         field="gpus")


HF_INTEGRATION = frozenset({Stack.HF_TRAINER, Stack.TRL, Stack.ACCELERATE, Stack.AXOLOTL, Stack.LLAMAFACTORY,
                            Stack.UNSLOTH})
"""Stacks that hand the model to DeepSpeed through the HF integration, which fills the DeepSpeed JSON's ``"auto"``:
the HF Trainer and the trainers built on it (trl, axolotl, LLaMA-Factory, unsloth), and accelerate's
``Accelerator.prepare`` (``accelerate/accelerator.py`` ``_prepare_deepspeed``, the same keys and values)."""


def deepspeed_buckets(found: Mapping[str, tuple[int | str, str]], stack: Stack | None, zero_stage: int,
                      spec: ModelSpec) -> tuple[DeepSpeedBuckets, tuple[str, ...], tuple[str, ...]]:
    """DeepSpeed's bucket sizes from what the files set (:attr:`memest.workload.files.Read.buckets`), what was read
    (for ``config_read``) and the notes on ``"auto"``.

    ``"auto"`` under the HF integration (:data:`HF_INTEGRATION`) is filled as transformers fills it
    (``integrations/deepspeed.py`` ``HfTrainerDeepSpeedConfig.trainer_config_finalize``, transformers 5.24.0, the
    same since 4.x): ``reduce_bucket_size`` = hidden_size², and under ZeRO-3 ``stage3_prefetch_bucket_size`` =
    int(0.9 x hidden_size²) and ``stage3_param_persistence_threshold`` = 10 x hidden_size (below ZeRO-3 they stay
    ``"auto"``, unread by DeepSpeed). Elsewhere ``"auto"`` is DeepSpeed's default, said in a note.
    """
    defaults = DeepSpeedBuckets()
    if not found:
        return defaults, (), ()
    h = spec.hidden_size
    hf = stack in HF_INTEGRATION
    filled_by = {"reduce_bucket_size": h * h}
    if zero_stage >= 3:
        filled_by |= {"prefetch_bucket_size": int(0.9 * h * h), "param_persistence_threshold": 10 * h}
    words = {"reduce_bucket_size": f"hidden_size² = {h:,}²", "prefetch_bucket_size": f"int(0.9 x hidden_size²) = "
             f"int(0.9 x {h:,}²)", "param_persistence_threshold": f"10 x hidden_size = 10 x {h:,}"}
    values: dict[str, int | bool] = {}
    read: list[str] = []
    notes: list[str] = []
    for name, (value, where) in found.items():
        key = DEEPSPEED_BUCKET_KEYS[name].split(".", 1)[1]
        if name == "optimizer_nvme":
            values[name] = bool(value)
            read.append(f"{key} nvme from {where}")
        elif isinstance(value, bool):  # overlap_comm, contiguous_gradients
            values[name] = value
            read.append(f"{key} {str(value).lower()} from {where}")
        elif value != "auto":
            values[name] = int(value)
            read.append(f"{key} {int(value):,} from {where}")
        elif hf and name in filled_by:
            values[name] = filled_by[name]
            notes.append(f"{where} is \"auto\": the HF integration fills it as {words[name]} = "
                         f"{filled_by[name]:,} elements ({stack.value if stack else 'hf-trainer'} under DeepSpeed)")
        elif hf:
            notes.append(f"{where} is \"auto\": the HF integration fills it only under ZeRO-3; DeepSpeed does not "
                         "read it below")
        else:
            default = getattr(defaults, name)
            notes.append(f"{where} is \"auto\", which only the HF integration (HF Trainer, accelerate) fills; memest "
                         f"uses DeepSpeed's default, {default:,} elements")
    return dataclasses.replace(defaults, **values), tuple(read), tuple(notes)


def gpu_layers(n_gpu_layers: int | None, spec: ModelSpec, engine: Engine,
               notes: tuple[str, ...]) -> tuple[int | None, tuple[str, ...]]:
    """llama.cpp / Ollama's layers on the GPU (``-ngl`` / ``num_gpu``) as memest models them, and the notes with
    what was read into them: -1 is each engine's default (llama.cpp ``common/arg.cpp`` at 145b6280 stores ``-ngl``
    as given, default -1, and ``common.cpp`` passes it on only when it is not -1, leaving llama.cpp's own default,
    every layer; Ollama ``api/types.go`` ``NumGPU: -1``: set from the memory free), memest's None; a count above the
    num_layers + 1 layers there are (``-ngl 999``, the idiom for "all") offloads every layer, num_layers + 1. Any
    other value is kept (a negative one is refused by the engine's estimate)."""
    if n_gpu_layers is None:
        return None, notes
    every = spec.num_layers + 1
    if n_gpu_layers == -1:
        default = "as many layers as fit" if engine is Engine.OLLAMA else "every layer"
        return None, notes + (f"n_gpu_layers -1 is {engine.value}'s default: {default} on the GPU",)
    if n_gpu_layers > every:
        return every, notes + (f"n_gpu_layers {n_gpu_layers} is more than the {every} layers of {spec.name} "
                               f"({spec.num_layers} + the output layer): all {every} offloaded",)
    return n_gpu_layers, notes


def engines_on(vendors: Iterable[str]) -> tuple[Engine, ...]:
    """The serving engines that run on devices of every one of ``vendors`` (:func:`runs_on`): those that
    list the vendor first (built for it: llama.cpp and Ollama on Apple), then those that run on any device
    (hf), each group in :class:`Engine`'s order."""
    wanted = set(vendors)
    fits = [e for e in Engine if all(runs_on(e.value, vendor) for vendor in wanted)]
    return tuple(sorted(fits, key=lambda e: e.value not in ENGINE_VENDORS))


def _training(v: dict[str, Any], spec: ModelSpec, device: Device) -> TrainingConfig:
    group = (v["tp"] or 1) * v["pp"] * v["cp"]
    replicas = v["dp"] or max(1, v["gpus"] // group)
    stack, assumed = stacks.stack_of(v, replicas)
    filled = tuple(name for name in stacks.FILLED if v[name] is None)
    v = stacks.apply(v, stack, replicas)
    par, framework = training_parallelism(v, device)
    t = TrainingConfig(
        method=Method(v["finetune"]) if v["finetune"] else Method.FULL,
        micro_batch_size=v["micro_batch_size"],
        seq_len=v["seq_len"] if v["seq_len"] is not None else min(2048, spec.max_position_embeddings or 2048),
        grad_accum_steps=v["grad_accum_steps"],
        precision=v["precision"],
        optimizer=v["optimizer"],
        recompute=v["recompute"],
        attn_implementation=v["attn_implementation"],
        loss=v["loss"],
        lora=LoraConfig(rank=v["lora_rank"], targets=v["lora_targets"], dropout=v["lora_dropout"]),
        offload=v["offload"],
        optimizer_in_bwd=bool(v["optimizer_in_bwd"]),
        activation_offloading=bool(v["activation_offloading"]),
        parallelism=par,
        framework=framework,
        set_grads_to_none=v["set_grads_to_none"],
        target_len=v["target_len"],
        prepare_kbit_training=v["prepare_kbit_training"] or KbitPrep.TRL,
        lora_library=v["lora_library"] or LoraLibrary.PEFT,
        torch_compile=v["torch_compile"],
        float8=v["float8"],
        float8_all_gather=bool(v["float8_all_gather"]),
        custom_sharded_layers=",".join(name.strip() for name in (v["custom_sharded_layers"] or "").split(",")
                                       if name.strip()),
        fsdp_flat_params=bool(v["fsdp_flat_params"]),
        no_sync_accumulation=bool(v["no_sync_accumulation"]),
        stack=stack,
        stack_assumed=assumed,
        stack_filled=filled,
        half_dtype=v.get("half_dtype", "bf16"),
    )
    t = stacks.on_device(t, device.arch, device.vendor, device.name)  # the stack's fp16 where bf16 does not run
    check_framework_runs(t, device)
    return t


def _value_words(t: TrainingConfig, field: str) -> str:
    """The value of the setting ``field`` a refusal names (``tensorwise``, ``unsloth``, ``qlora``)."""
    return {"float8": Float8(t.float8).value, "stack": t.stack.value if t.stack else "", "finetune": t.method.value,
            "precision": t.precision.value}[field]


def check_framework_runs(t: TrainingConfig, device: Device) -> None:
    """Refuse a training job whose framework (``auto`` resolved) does not run on ``device``'s vendor
    (:func:`memest.workload.runs_on`), or that asks for what the device cannot run
    (:func:`memest.workload.config.training_refusal`: float8 below sm_89, unsloth off CUDA / ROCm / XPU,
    bitsandbytes NF4 on Apple).

    Raises:
        InputError: naming the framework, the device and the frameworks that do run there.
    """
    framework = resolve_framework(t)
    if runs_on(framework.value, device.vendor):
        refused = training_refusal(t, device.arch, device.vendor)
        if refused is not None:
            field, why = refused
            kind = device.vendor if device.arch == device.vendor else f"{device.vendor} {device.arch}"
            fix = "; use another {gpu} or drop it"
            if field == "precision":  # bf16 where it does not run: the stack's fp16 recipe, else fp32
                fix = f"; use {{precision}} {'fp16' if stacks.fp16_fallback(t) else 'fp32'}, or another {{gpu}}"
            raise InputError(f"{{{field}}} {_value_words(t, field)} does not run on {device.name} ({kind}): {why}"
                             + fix, field=field)
        return
    chosen = (f"{{framework}} {framework.value}" if t.framework is not Framework.AUTO else
              f"{framework.value} ({{framework}} auto picks it for {{precision}} {t.precision.value} at this layout)")
    others = [f.value for f in Framework if f is not Framework.AUTO and runs_on(f.value, device.vendor)]
    fix = (f"pass {{framework}} {' / '.join(others)}, or use another {{gpu}}" if others else
           "memest models no training framework that runs there: use another {gpu}")
    raise InputError(f"training under {chosen} does not run on {device.name} ({device.vendor}); {fix}",
                     field="framework")


def serving_parallelism(v: Mapping[str, Any], spec: ModelSpec) -> Parallelism:
    """Serving degrees from gpus, tp, pp and dp: gpus = tp x pp x dp. Without tp, tp is what gpus
    leaves after pp x dp (vLLM ``tensor_parallel_size``; dp = 1 unless given).

    Raises:
        InputError: gpus not divisible by pp x dp, or not tp x pp x dp; a default tp that cannot
            split the heads (the message names the default and suggests tp / dp).
    """
    gpus, pp, dp, tp = v["gpus"], v["pp"], v["dp"], v["tp"]
    if tp is None:
        group = pp * (dp or 1)
        if gpus % group:
            what = "pp x dp" if dp is not None else "{pp}"
            raise InputError(f"{{gpus}} {gpus} is not divisible by {what} = {group}; use a multiple of {group} "
                             "({gpus} = tp x pp x dp)", field="gpus")
        tp = gpus // group
        # llama.cpp / Ollama split layers, not heads: any device count runs (the layer split of
        # memest.estimate.serving.llamacpp.engine.layer_devices)
        problem = None if Engine(v["engine"]) in (Engine.LLAMACPP, Engine.OLLAMA) else tp_head_problem(spec, tp)
        if problem:
            ok = max(t for t in divisors(gpus // pp) if tp_head_problem(spec, t) is None)
            raise InputError(f"{{gpus}} {gpus} serves with tensor parallelism {tp} by default (gpus / (pp x dp)), "
                             f"which {problem[0]}; pass {{tp}} and {{dp}}, e.g. {{tp}} {ok} {{dp}} {gpus // (pp * ok)}",
                             field="gpus")
        dp = dp or 1
    elif dp is None:
        if gpus % (tp * pp):
            raise InputError(f"{{gpus}} {gpus} is not divisible by tp x pp = {tp * pp}; use a multiple of {tp * pp}",
                             field="gpus")
        dp = gpus // (tp * pp)
    elif gpus != tp * pp * dp:
        raise InputError(f"{{gpus}} {gpus} is not tp x pp x dp = {tp * pp * dp}; pass {{gpus}} {tp * pp * dp} or drop "
                         "{dp}", field="gpus")
    return Parallelism(tp=tp, pp=pp, dp=dp, ep=v["ep"])


def training_parallelism(v: Mapping[str, Any], device: Device) -> tuple[Parallelism, Framework]:
    """Parallel degrees and framework from gpus/dp, tp/pp/cp/ep, zero_stage/fsdp: dp = gpus /
    (tp x pp x cp) unless given; ``fsdp`` sets the framework and its ZeRO stage; hybrid_shard shards
    over the ranks of one node (``device.per_node``) unless dp_shard is given.

    Raises:
        InputError: sequence parallelism without tp > 1, gpus and dp disagree, gpus is not
            divisible, or fsdp conflicts with zero_stage / framework.
    """
    tp, pp, cp = v["tp"] or 1, v["pp"], v["cp"]
    if v["sequence_parallel"] and tp == 1:
        raise InputError("{sequence_parallel} needs {tp} > 1: it splits the activations outside the tensor-parallel "
                         "regions over the tp ranks; add {tp} N or drop it", field="sequence_parallel")
    group = tp * pp * cp
    gpus, dp = v["gpus"], v["dp"]
    if dp is not None:
        if gpus not in (1, dp * group):
            raise InputError(f"{{gpus}} {gpus} is not dp x tp x pp x cp = {dp * group}; drop one of {{gpus}} / {{dp}}",
                             field="gpus")
    else:
        if gpus % group and gpus == 1:  # the default: one device
            raise InputError(f"tp x pp x cp = {group} spreads the job over {group} devices, and {{gpus}} is 1; add "
                             f"{{gpus}} {group} (or a multiple)", field="gpus")
        if gpus % group:
            raise InputError(f"{{gpus}} {gpus} is not divisible by tp x pp x cp = {group}; use a multiple of {group}",
                             field="gpus")
        dp = gpus // group
    zero, framework, dp_shard = v["zero_stage"], Framework(v["framework"]), v["dp_shard"]
    fsdp = FsdpStrategy(v["fsdp"]) if v["fsdp"] is not None else None
    if fsdp is not None:
        if framework not in (Framework.AUTO, Framework.FSDP):
            raise InputError(f"{{fsdp}} {fsdp.value} runs under FSDP; drop {{framework}} {framework.value}",
                             field="fsdp")
        stage = FSDP_ZERO_STAGE[fsdp]
        if zero:  # two sharding backends named: the job runs one (DeepSpeed's ZeRO or FSDP), not both
            raise InputError(f"{{fsdp}} {fsdp.value} is FSDP's sharding and {{zero_stage}} {zero} DeepSpeed's ZeRO; a "
                             f"job runs one: drop {{zero_stage}} (FSDP {fsdp.value} is ZeRO stage {stage}) or "
                             "{fsdp}", field="fsdp")
        zero, framework = stage, Framework.FSDP
        if fsdp is FsdpStrategy.HYBRID_SHARD and dp_shard is None:
            dp_shard = math.gcd(dp * cp, max(1, device.per_node // (tp * pp)))
    par = Parallelism(tp=tp, pp=pp, cp=cp, dp=dp, ep=v["ep"], zero_stage=zero,
                      sequence_parallel=v["sequence_parallel"], dp_shard=dp_shard)
    return par, framework
