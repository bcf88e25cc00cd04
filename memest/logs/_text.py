"""Helpers the log parsers share: numbers as engines print them, and bytes from their units."""

from __future__ import annotations

import re

from memest.devices import GiB, MiB
from memest.logs.record import Logged

NUMBER = r"([0-9][0-9,]*(?:\.[0-9]+)?)"
"""A printed number, thousands separators allowed (``476,016``, ``14.99``)."""

GAP = r".{0,500}?"
r"""The words between a line's lead and the figure it reads (``Load weight end. ... mem usage=``): at most
500 characters of the same line. Every pattern here runs in time linear in the log: a gap, a name or a
value between a literal and what follows it is bounded or of a class its neighbours exclude, never two
unbounded quantifiers over the same characters (``\s*[(=]?\s*``), never a line's scan repeated from each
of many leads on it (a pasted log is untrusted text: ``memest serve`` reads it)."""

UNITS = {"gib": GiB, "gb": GiB, "mib": MiB, "mb": MiB}
"""Units as the engines print them. vLLM's and SGLang's 'GB' and llama.cpp's 2023 'MB' are binary
(bytes / 2^30, / 2^20: the engines divide by powers of two), so every unit here is."""


def number(text: str) -> float:
    """``'476,016'`` -> 476016.0."""
    return float(text.replace(",", ""))


def nbytes(value: str, unit: str) -> int:
    """Bytes of a printed size (``'14.99', 'GiB'``)."""
    return round(number(value) * UNITS[unit.lower()])


def first(pattern: str, text: str, flags: int = 0) -> re.Match[str] | None:
    """The first match of ``pattern`` in ``text``."""
    return re.search(pattern, text, flags)


def last(pattern: str, text: str, flags: int = 0) -> re.Match[str] | None:
    """The last match of ``pattern`` in ``text`` (an engine that sizes a pool twice logs the final one last)."""
    found = None
    for found in re.finditer(pattern, text, flags):
        pass
    return found


def line_of(text: str, match: re.Match[str]) -> str:
    """The whole (stripped) line a match lies on."""
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    return text[start:end if end >= 0 else len(text)].strip()


def size_figure(pattern: str, text: str) -> Logged | None:
    """A size figure from the first match of ``pattern``: group 1 the number, group 2 the unit."""
    m = first(pattern, text)
    return None if m is None else Logged(nbytes(m.group(1), m.group(2)), "bytes", line_of(text, m))


def last_size_figure(pattern: str, text: str) -> Logged | None:
    """A size figure from the last match of ``pattern``: group 1 the number, group 2 the unit."""
    m = last(pattern, text)
    return None if m is None else Logged(nbytes(m.group(1), m.group(2)), "bytes", line_of(text, m))


def count_figure(pattern: str, text: str, unit: str) -> Logged | None:
    """A count from the first match of ``pattern`` (group 1)."""
    m = first(pattern, text)
    return None if m is None else Logged(int(number(m.group(1))), unit, line_of(text, m))


def keep(figures: dict[str, Logged | None]) -> dict[str, Logged]:
    """The figures the log printed (None: it did not)."""
    return {k: v for k, v in figures.items() if v is not None}
