"""Settings from the config files users already have, one module per format.

:func:`read` parses each file (JSON when it starts with ``{``, else YAML), finds its format from its
content (each format module's ``detect``), and returns the settings it implies by keyword, with notes for
what it left to someone else. Settings given explicitly win over a file's
(:func:`memest.workload.resolve.complete`). The formats: :data:`FORMATS`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from memest.errors import InputError
from memest.workload.files import accelerate, deepspeed
from memest.workload.files._common import Found, load_yaml

FORMATS: tuple[ModuleType, ...] = (accelerate, deepspeed)
"""The format modules, in the order their ``detect`` is tried; each has ``NAME``, ``detect(doc)`` and
``read(path, doc) -> Found``. ``doc`` is the parsed file (JSON or YAML; None when it parses as
neither) and ``detect(doc, text)`` also sees its text, for formats that are command lines."""


def formats() -> str:
    """The formats memest reads, in words (for error messages)."""
    names = [module.NAME for module in FORMATS]
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]


def read(paths: Iterable[str | Path]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The settings the files imply (a later file's value wins) and the notes on what they left open.

    Raises:
        InputError: a file that cannot be read, is malformed (the message names the file and line),
            is of no known format, or holds a value of the wrong type.
    """
    values: dict[str, Any] = {}
    notes: list[str] = []
    for path in paths:
        found = read_one(Path(path))
        values |= found.values
        notes += found.notes
    return values, tuple(notes)


def read_one(path: Path) -> Found:
    """One file's settings and notes (see :func:`read`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{{config}} {path}: cannot be read ({exc.__class__.__name__}); pass {formats()}",
                         field="config") from None
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{{config}} {path}: line {exc.lineno}: malformed JSON ({exc.msg})",
                             field="config") from None
    else:
        doc = load_yaml(path, text)
    for module in FORMATS:
        if module.detect(doc, text):
            return module.read(path, doc)
    raise InputError(f"{{config}} {path}: not a format memest reads; pass {formats()}", field="config")
