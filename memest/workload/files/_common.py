"""What the config-file readers share: typed values, the "auto" note, the YAML loader's one-line errors."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from memest.errors import InputError


class Found(NamedTuple):
    """What one file says.

    Attributes:
        values: Settings by keyword (:class:`memest.workload.config.JobConfig` field names).
        notes: What the file left to someone else, or what memest did not model, in words.
        model: The model the file names (a Hub id or a path), if any.
        origins: Where each of ``values`` was read: setting keyword -> the file's key (and line, when known).
    """

    values: dict[str, Any]
    notes: list[str]
    model: str | None = None
    origins: Mapping[str, str] = MappingProxyType({})


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
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or "cannot be parsed"
        raise InputError(f"{{config}} {path}: {where}malformed YAML ({problem})", field="config") from None


def typed(path: Path, key: str, value: Any, kind: type, what: str) -> Any:
    """``value`` when it is a ``kind`` (an int is never a bool).

    Raises:
        InputError: naming the file, the key, the value and ``what`` is expected.
    """
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        raise InputError(f"{{config}} {path}: {key} is {value!r}; expected {what}", field="config")
    return value


def auto(path: Path, key: str, setting: str, notes: list[str]) -> None:
    """Note that ``key`` is ``"auto"``: memest keeps ``setting`` as given, else its default."""
    notes.append(f"{path.name}: {key} is \"auto\" (the HF Trainer fills it from its TrainingArguments); "
                 f"memest uses {setting} as given, else its default")
