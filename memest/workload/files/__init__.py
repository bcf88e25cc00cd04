"""Settings from the config files users already have, one module per format.

:func:`read` parses each file (JSON when it starts with ``{``, TOML when it is named ``*.toml`` or starts
with a ``[table]``, else YAML; a shell script with a launch line need not parse), finds its format from its
content (each format module's ``detect``), reads the files it points to (a recipe's ``deepspeed``), and
merges what they say into one :class:`Read`: the settings by keyword, the model a file names, the notes
(what a file left open, the memory-relevant keys memest does not model) and where each setting was read
(file, line, key). Settings given explicitly win over a file's (:func:`memest.workload.resolve.complete`).

Files that disagree are refused, naming both, except where one decides for the other: a *launcher* file
(``LAUNCHER = True``: a DeepSpeed JSON, an accelerate config, which say who runs the step) decides the
precision, sharding and offload over a recipe's switches, and a recipe's stack (trl, axolotl, ...) over a
launcher's (``deepspeed``, ``accelerate``), whose framework stays.

A format module has ``NAME`` (in words, for messages), ``detect(doc, text)``, ``read(path, doc) -> Found``,
and optionally ``LAUNCHER``, ``READS`` (the dotted keys it reads) and ``IGNORED`` (memory-relevant dotted keys
it knows memest does not model -> (what they size, the value at which they change nothing); a file that sets
one to another value, not ``"auto"``, gets a note). The formats: :data:`FORMATS`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from enum import Enum
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from memest.errors import InputError
from memest.workload.config import DEEPSPEED_BUCKET_KEYS, Framework, Precision
from memest.workload.files import (
    accelerate,
    axolotl,
    deepspeed,
    llamafactory,
    megatron,
    nemo,
    torchtitan,
    torchtune,
    trainer,
    vllm,
)
from memest.workload.files._common import (
    FALSY,
    AutoNote,
    Found,
    Include,
    error_line,
    key_lines,
    load_toml,
    load_yaml,
    looks_toml,
    lookup,
)

FORMATS: tuple[ModuleType, ...] = (torchtune, torchtitan, nemo, accelerate, llamafactory, axolotl, trainer, deepspeed,
                                   vllm, megatron)
"""The format modules, in the order their ``detect`` is tried (the most specific first: a torchtune recipe and a
torchtitan TOML have ``optimizer`` and ``gradient_accumulation_steps`` keys as a DeepSpeed JSON does,
a NeMo 1 config has ``trainer`` and ``model`` sections
as others may, LLaMA-Factory and axolotl recipes share TrainingArguments keys, and TrainingArguments shares ``bf16`` and
``gradient_accumulation_steps`` with a DeepSpeed JSON; the command lines last); each has ``NAME``,
``detect(doc, text)`` and ``read(path, doc) -> Found``. ``doc`` is the parsed file (JSON, TOML or YAML; None
when a script parses as none of them) and ``detect`` also sees its text, for formats that are command lines
(``COMMAND = True``: their ``document(path, doc, text)`` gives the mapping ``read`` reads, their
``key_lines(text, doc)`` its lines)."""

LAUNCHER_DECIDES = frozenset({"precision", "zero_stage", "offload", "fsdp", "framework", "gpus"})
"""Settings a launcher file (DeepSpeed, accelerate) decides over a recipe's: the step runs as it says
(transformers ``integrations/deepspeed.py`` fills DeepSpeed's ``"auto"`` from the TrainingArguments and
refuses a mismatch; the Trainer hands the model to DeepSpeed or FSDP, whose precision then runs)."""


class Read(NamedTuple):
    """What the config files say, together.

    Attributes:
        values: Settings by keyword.
        notes: What the files left open or memest does not model, in words.
        model: The model the files name, or None.
        origins: Setting keyword (and ``"model"``) -> where it was read (``ds.json:5 zero_optimization.stage``).
        buckets: DeepSpeed's bucket sizes the files set (:attr:`Found.buckets`) -> (elements or ``"auto"``, where).
    """

    values: dict[str, Any]
    notes: tuple[str, ...]
    model: str | None
    origins: dict[str, str]
    buckets: dict[str, tuple[int | str, str]] = {}


class _Reading(NamedTuple):
    """One file (or inline config) read: its format, what it says, where its keys are."""

    path: Path
    module: ModuleType | None
    doc: Any
    found: Found
    lines: dict[str, int]
    prefix: str  # the including file's key of an inline config ("deepspeed."), else ""
    yields: bool = False  # its settings give way to the others' (Include.yields)

    @property
    def launcher(self) -> bool:
        """The file says who runs the step (a DeepSpeed JSON, an accelerate config)."""
        return bool(getattr(self.module, "LAUNCHER", False))


def formats() -> str:
    """The formats memest reads, in words (for error messages)."""
    names = [module.NAME for module in FORMATS]
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]


def read(paths: Iterable[str | Path], model: str | None = None) -> Read:
    """What the files say, merged (see the module docstring).

    Args:
        model: The model the caller was given, if any: it wins over the files', said in a note.

    Raises:
        InputError: a file that cannot be read, is malformed (the message names the file and line), is
            of no known format, or holds a value of the wrong type; two files that disagree (naming both).
    """
    readings: list[_Reading] = []
    missing: list[str] = []
    for path in paths:
        _collect(Path(path), readings, missing)
    return _together(readings, missing, model)


def read_data(doc: dict[str, Any], name: str, model: str | None = None) -> Read:
    """What a config held in memory says, as :func:`read` reads a file of the same contents: a running
    job's ``TrainingArguments.to_dict()`` (:mod:`memest.integrations.hf`), with its ``deepspeed`` config
    inline or as a path (found as :func:`locate` finds it from the working folder).

    Args:
        doc: The config's keys and values (one of :data:`FORMATS`).
        name: What the notes and origins call it (``TrainingArguments``).
        model: As for :func:`read`.

    Raises:
        InputError: as :func:`read` (``name`` in place of a file).
    """
    path = Path(name)
    readings: list[_Reading] = []
    missing: list[str] = []
    _collect_doc(path, _format(path, doc, ""), doc, "", readings, missing)
    return _together(readings, missing, model)


def _together(readings: list[_Reading], missing: list[str], model: str | None) -> Read:
    """The readings merged into one :class:`Read` (see :func:`read`)."""
    values, owner = _merge(readings)
    modes = [m for m in ("train", "finetune", "serve") if values.get(m)]
    if len(modes) > 1:  # a training recipe and a serving config (or a full and an adapter recipe)
        first, second = owner[modes[0]], owner[modes[1]]
        raise InputError(f"{{config}} files disagree on the mode: {first.path} is a {modes[0]} job "
                         f"({_where(first, first.found.origins.get(modes[0], ''))}), {second.path} a {modes[1]} job "
                         f"({_where(second, second.found.origins.get(modes[1], ''))}); pass one of them",
                         field="config")
    notes = [_filled(note, r, owner) for r in readings for note in r.found.notes]
    notes += missing + [n for r in readings for n in _ignored(r)]
    origins = {name: _where(r, r.found.origins.get(name, "")) for name, r in owner.items()}
    named = [r for r in readings if r.found.model]
    for other in named[1:]:
        if other.found.model != named[0].found.model:
            raise _conflict("model", named[0], named[0].found.model, other, other.found.model)
    found_model = named[0].found.model if named else None
    if named:
        origins["model"] = _where(named[0], named[0].found.origins.get("model", ""))
        if model is not None and model != found_model:
            notes.append(f"the model given ({model}) is used, not {found_model} named at {origins['model']}")
    buckets: dict[str, tuple[int | str, str]] = {}
    for r in readings:
        for name, value in r.found.buckets.items():
            buckets.setdefault(name, (value, _where(r, DEEPSPEED_BUCKET_KEYS[name])))
    return Read(values, tuple(dict.fromkeys(notes)), found_model, origins, buckets)


def _merge(readings: list[_Reading]) -> tuple[dict[str, Any], dict[str, _Reading]]:
    """The settings of all readings, and the reading each came from (see the module docstring for who wins).

    Raises:
        InputError: two readings give one setting different values and neither decides for the other.
    """
    values: dict[str, Any] = {}
    owner: dict[str, _Reading] = {}
    for reading in sorted(readings, key=lambda r: r.yields):  # a yielding file fills only what is left
        for name in sorted(reading.found.values, key=lambda n: n != "stack"):  # the stack first: the clearest
            value = reading.found.values[name]
            if reading.yields and name in values:
                continue
            if name not in values or values[name] == value:
                values.setdefault(name, value)
                owner.setdefault(name, reading)
                continue
            first = owner[name]
            if first.launcher == reading.launcher or name not in LAUNCHER_DECIDES | {"stack"}:
                raise _conflict(name, first, values[name], reading, value)
            launcher = reading if reading.launcher else first
            # the stack is the recipe's; the precision the launcher's only when it runs the step itself
            # (DeepSpeed, FSDP), not over plain DDP, where the recipe's dtype stays
            launcher_wins = name != "stack" and (name != "precision" or bool(
                {"framework", "fsdp"} & set(launcher.found.values)))
            if reading.launcher == launcher_wins:
                values[name], owner[name] = value, reading
    _under_deepspeed(values, owner)
    return values, owner


def read_one(path: Path) -> Found:
    """One file's settings and notes (the files it includes are not read: see :func:`read`)."""
    module, doc, _ = _parse(path)
    return module.read(path, doc)


def _parse(path: Path) -> tuple[ModuleType, Any, str]:
    if path.is_dir():
        raise InputError(f"{{config}} {path}: is a directory; pass the path of a config file in it",
                         field="config")
    if not path.exists():
        raise InputError(f"{{config}} {path}: does not exist; pass the path of a config file the run used",
                         field="config")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{{config}} {path}: not a text file (byte {exc.start} is not UTF-8); pass {formats()}",
                         field="config") from None
    except OSError as exc:
        raise InputError(f"{{config}} {path}: cannot be read ({exc.__class__.__name__}); pass {formats()}",
                         field="config") from None
    if "\0" in text:
        raise InputError(f"{{config}} {path}: not a text file (it holds NUL bytes); pass {formats()}",
                         field="config")
    if not any(line.strip() and not line.lstrip().startswith("#") for line in text.splitlines()):
        raise InputError(f"{{config}} {path}: is empty{' (comments only)' if text.strip() else ''}; pass "
                         f"{formats()}", field="config")
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{{config}} {path}: {error_line(text, exc.lineno)}: malformed JSON ({exc.msg})",
                             field="config") from None
    elif looks_toml(path, text):
        doc = load_toml(path, text)
    else:
        try:
            doc = load_yaml(path, text)
        except InputError:  # a shell script need not parse as YAML
            if not any(getattr(m, "COMMAND", False) and m.detect(None, text) for m in FORMATS):
                raise
            doc = None
    module = _format(path, doc, text)
    if hasattr(module, "document"):
        doc = module.document(path, doc, text)
    return module, doc, text


def _format(path: Path, doc: Any, text: str) -> ModuleType:
    for module in FORMATS:
        if module.detect(doc, text):
            return module
    if _looks_litgpt(doc):
        raise InputError(f"{{config}} {path}: not a format memest reads (a litgpt config: memest has no reader for "
                         "it; pass its settings as flags with {stack} litgpt ({micro_batch_size}, {seq_len}, "
                         "{lora_rank}, ...))", field="config")
    raise InputError(f"{{config}} {path}: not a format memest reads; pass {formats()}", field="config")


_LITGPT_KEYS = frozenset({"precision", "quantize", "devices", "lora_r", "checkpoint_dir", "out_dir"})
_LITGPT_TRAIN_KEYS = frozenset({"micro_batch_size", "global_batch_size", "max_seq_length"})


def _looks_litgpt(doc: Any) -> bool:
    """A litgpt ``config_hub`` YAML (``config_hub/finetune/*/lora.yaml`` at commit 00af8b0): its top-level keys
    (``precision``, ``quantize``, ``devices``, ``lora_r``) with a ``train:`` block of ``micro_batch_size`` /
    ``global_batch_size`` / ``max_seq_length``, or an ``optimizer: {class_path: ...}``."""
    if not isinstance(doc, dict):
        return False
    train, optimizer = doc.get("train"), doc.get("optimizer")
    return bool(_LITGPT_KEYS & doc.keys()) and (
        (isinstance(train, dict) and bool(_LITGPT_TRAIN_KEYS & train.keys()))
        or (isinstance(optimizer, dict) and "class_path" in optimizer))


def _collect(path: Path, out: list[_Reading], notes: list[str], yields: bool = False) -> None:
    """``path`` read into ``out``, then each config it includes (a missing included file: a note)."""
    module, doc, text = _parse(path)
    _collect_doc(path, module, doc, text, out, notes, yields)


def _collect_doc(path: Path, module: ModuleType, doc: Any, text: str, out: list[_Reading], notes: list[str],
                 yields: bool = False) -> None:
    """``doc`` (of format ``module``, parsed from ``text``) read into ``out``, then each config it includes."""
    found = module.read(path, doc)
    lines = getattr(module, "key_lines", key_lines)(text, doc)
    out.append(_Reading(path, module, doc, found, lines, "", yields))
    for inc in found.includes:
        if inc.doc is not None:
            inner = _format(path, inc.doc, "")
            prefix = inc.key + "."
            out.append(_Reading(path, inner, inc.doc, inner.read(path, inc.doc),
                                {k[len(prefix):]: n for k, n in lines.items() if k.startswith(prefix)}, prefix))
            continue
        located = locate(str(inc.name), path)
        if located is None:
            notes.append(f"{path.name}: {inc.key} names {inc.name}, not found beside it, above it or in the working "
                         "folder: its settings are not read (pass it as another config file)")
            continue
        _collect(located, out, notes, yields or inc.yields)


def locate(name: str, beside: Path) -> Path | None:
    """The file a config names: as written when absolute, else relative to the naming file's folder, then to
    each folder above it (LLaMA-Factory's examples name ``examples/deepspeed/...`` from the repository root),
    then to the working folder."""
    given = Path(os.path.expanduser(name))
    if given.is_absolute():
        return given if given.is_file() else None
    for folder in (beside.resolve().parent, *beside.resolve().parents[1:], Path.cwd()):
        if (folder / given).is_file():
            return folder / given
    return None


def _under_deepspeed(values: dict[str, Any], owner: dict[str, _Reading]) -> None:
    """A recipe's bf16 / fp16 switch under a DeepSpeed launcher is DeepSpeed's: bf16 parameters with an fp32
    master (transformers ``integrations/deepspeed.py``: ``fill_match("bf16.enabled", args.bf16)``)."""
    if values.get("framework") is not Framework.DEEPSPEED or "precision" not in owner:
        return
    reading = owner["precision"]
    if reading.launcher:
        return
    key = reading.found.origins.get("precision", "")
    values["precision"] = Precision.FP16 if key.endswith("fp16") else Precision.MIXED


def _filled(note: str, r: _Reading, owner: dict[str, _Reading]) -> str:
    """A DeepSpeed ``"auto"`` note, or, when another file gives that setting, what fills it (as the HF Trainer
    fills ``"auto"`` from the TrainingArguments beside it)."""
    if not isinstance(note, AutoNote) or owner.get(note.setting, r) is r:
        return note
    by = owner[note.setting]
    return (f"{r.path.name}: {note.key} \"auto\" is filled from {_where(by, by.found.origins.get(note.setting, ''))}, "
            "as the HF Trainer fills it")


def _ignored(r: _Reading) -> list[str]:
    """Notes for the memory-relevant keys a file sets that memest does not model (its module's ``IGNORED``)."""
    out = []
    for key, (what, default) in getattr(r.module, "IGNORED", {}).items():
        value = lookup(r.doc, key)
        if value in FALSY or value == default or (isinstance(value, str) and value.lower() in (*FALSY, "auto")):
            continue
        shown = f"{value:g}" if isinstance(value, float) else repr(value)
        out.append(f"{_where(r, key)} is {shown} ({what}): memest does not model it, the estimate leaves it out")
    return out


def _where(r: _Reading, key: str) -> str:
    """``file:line key`` (``file key`` when the line is not known)."""
    line = r.lines.get(key)
    shown = r.prefix + key
    return f"{r.path.name}:{line} {shown}" if line else f"{r.path.name} {shown}".rstrip()


def _shown(value: Any) -> str:
    return str(value.value if isinstance(value, Enum) else value)


def _conflict(name: str, first: _Reading, a: Any, second: _Reading, b: Any) -> InputError:
    where_a = _where(first, first.found.origins.get(name, ""))
    where_b = _where(second, second.found.origins.get(name, ""))
    return InputError(f"{{config}} files disagree on {name}: {first.path} says {_shown(a)} ({where_a}), "
                      f"{second.path} says {_shown(b)} ({where_b}); pass one of them", field="config")


__all__ = ["FALSY", "FORMATS", "Found", "Include", "Read", "formats", "locate", "lookup", "read", "read_data", "read_one"]
