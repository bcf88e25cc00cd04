"""What the config-file readers share: what one file says (:class:`Found`), typed values, the "auto" note,
the YAML loader's one-line errors, and where each key sits in a file's text (:func:`key_lines`)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from memest.errors import InputError


class Include(NamedTuple):
    """Another config a file points to (a recipe's ``deepspeed`` key).

    Attributes:
        name: The file as the including file writes it (None: ``doc`` is inline).
        doc: The inline config (a mapping under ``key``), or None to read ``name``.
        key: The including file's key that names it (``deepspeed``).
        yields: Its settings give way to the including file's (vLLM: a flag on the command line wins over
            the same key in its ``--config`` YAML) instead of being refused as a disagreement.
    """

    name: str | None
    doc: Any = None
    key: str = ""
    yields: bool = False


class Found(NamedTuple):
    """What one file says.

    Attributes:
        values: Settings by keyword (:class:`memest.workload.config.JobConfig` field names).
        notes: What the file left to someone else, or what memest did not model, in words.
        model: The model the file names (a Hub id or a path), if any.
        origins: Where each of ``values`` (and ``model``, under ``"model"``) was read: setting keyword ->
            the file's key, dotted (``zero_optimization.stage``); the reader finds its line.
        includes: Other configs the file points to, read with it (:class:`Include`).
        buckets: DeepSpeed's bucket sizes the file sets: :class:`memest.workload.config.DeepSpeedBuckets` field ->
            elements, or ``"auto"`` (left to the HF integration), by its dotted key (no setting: no flag sets them).
    """

    values: dict[str, Any]
    notes: list[str]
    model: str | None = None
    origins: Mapping[str, str] = MappingProxyType({})
    includes: tuple[Include, ...] = ()
    buckets: Mapping[str, int | str] = MappingProxyType({})


FALSY = (None, False, 0, "", "no", "none", "false", [], {})
"""Values that switch a key off: an ignored key set to one of them is not warned about."""


def error_line(text: str, line: int) -> str:
    """Where a parser's error is, for a message: ``line N`` (from 1). A parser that reached the end of the
    text points past its last line (PyYAML's 0-based mark of the stream's end is the line after the last
    newline): that is the last line, ``line N (the end of the file)``."""
    last = max(len(text.splitlines()), 1)
    return f"line {line}" if line <= last else f"line {last} (the end of the file)"


def load_yaml(path: Path, text: str) -> Any:
    """``text`` parsed as YAML (safe loader).

    Raises:
        InputError: malformed YAML; the message names the file and line.
    """
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{error_line(text, mark.line + 1)}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or "cannot be parsed"
        raise InputError(f"{{config}} {path}: {where}malformed YAML ({problem})", field="config") from None


_TABLE = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\-]+)\s*\]\s*(#.*)?$")
_TOML_KEY = re.compile(r"^\s*([A-Za-z0-9_\-]+)\s*=")


def looks_toml(path: Path, text: str) -> bool:
    """Whether a file is TOML: named ``*.toml``, or its first line that is not blank or a comment is a
    ``[table]`` header (a YAML file cannot start so and go on with ``key: value`` lines)."""
    if path.suffix.lower() == ".toml":
        return True
    first = next((line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")), "")
    return bool(_TABLE.match(first))


def load_toml(path: Path, text: str) -> Any:
    """``text`` parsed as TOML (the standard library's ``tomllib``; on Python 3.10 ``tomli``, the same parser
    packaged, a dependency there).

    Raises:
        InputError: malformed TOML; the message names the file and line.
    """
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        at = re.search(r"\(at line (\d+), column \d+\)", message)
        where = f"{error_line(text, int(at.group(1)))}: " if at else ""
        problem = message[:at.start()].strip() if at else message
        raise InputError(f"{{config}} {path}: {where}malformed TOML ({problem})", field="config") from None


def key_lines(text: str, doc: Any) -> dict[str, int]:
    """The line (from 1) of each dotted key of a mapping ``doc`` parsed from ``text``.

    YAML: the marks of the composed nodes (exact). JSON (text starting with ``{``): a search for each
    ``"key":`` after its parent's position, in document order (exact for JSON as written by people and
    tools; a key spelled inside a string value before it could be matched first). TOML (text starting with
    a ``[table]`` header): each ``key =`` line under the last header (dotted keys and inline tables are not
    followed).
    """
    if not isinstance(doc, dict):
        return {}
    if text.lstrip().startswith("{"):
        out: dict[str, int] = {}
        _json_lines(text, doc, "", 0, out)
        return out
    if looks_toml(Path(), text):
        return _toml_lines(text)
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    out = {}
    _yaml_lines(node, "", out)
    return out


def _toml_lines(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    table = ""
    for number, line in enumerate(text.splitlines(), 1):
        header = _TABLE.match(line)
        if header:
            table = header.group(1) + "."
            out.setdefault(header.group(1), number)
            continue
        key = _TOML_KEY.match(line)
        if key:
            out.setdefault(table + key.group(1), number)
    return out


def _yaml_lines(node: Any, prefix: str, out: dict[str, int]) -> None:
    import yaml

    if not isinstance(node, yaml.MappingNode):
        return
    for key, value in node.value:
        name = prefix + str(key.value)
        out.setdefault(name, key.start_mark.line + 1)
        _yaml_lines(value, name + ".", out)


def _json_lines(text: str, doc: dict[str, Any], prefix: str, start: int, out: dict[str, int]) -> None:
    at = start
    for key, value in doc.items():
        found = text.find(json.dumps(str(key)), at)
        if found < 0:
            continue
        out.setdefault(prefix + str(key), text.count("\n", 0, found) + 1)
        if isinstance(value, dict):
            _json_lines(text, value, f"{prefix}{key}.", found, out)
        at = found + 1


def lookup(doc: Any, key: str) -> Any:
    """The value at a dotted ``key`` of nested mappings, or None."""
    for part in key.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def typed(path: Path, key: str, value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    """``value`` when it is a ``kind`` (an int is never a bool).

    Raises:
        InputError: naming the file, the key, the value and ``what`` is expected.
    """
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = isinstance(value, kinds) and not (bool not in kinds and isinstance(value, bool))
    if not ok:
        raise InputError(f"{{config}} {path}: {key} is {value!r}; expected {what}", field="config")
    return value


class AutoNote(str):
    """The note that a key is ``"auto"``, knowing the setting it leaves open and the key (a recipe read with the
    file fills it: :func:`memest.workload.files.read` then says so instead)."""

    setting: str
    key: str


def auto(path: Path, key: str, setting: str, notes: list[str]) -> None:
    """Note that ``key`` is ``"auto"``: memest keeps ``setting`` as given, else its default."""
    note = AutoNote(f"{path.name}: {key} is \"auto\" (the HF Trainer fills it from its TrainingArguments); "
                    f"memest uses {setting} as given, else its default")
    note.setting, note.key = setting, key
    notes.append(note)
