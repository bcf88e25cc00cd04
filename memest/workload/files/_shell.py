"""Command lines in shell scripts and text files: a launch line found, its variables expanded, its flags read.

A script is read the way a person reads it, not run: lines joined at a trailing backslash or inside a
quoted string, ``#`` comments dropped (:mod:`shlex`), the variables assigned at the top level (``NAME=value``, ``export
NAME=value``, arrays ``NAME=( ... )`` over several lines, ``+=`` appending, each expanded with those before
it) substituted where the command uses them (``$NAME``, ``${NAME}``, ``${NAME[@]}``, ``"${NAME[@]}"``;
unquoted values split into words as the shell splits them). Assignments inside functions, ``if`` blocks,
loops or ``case`` branches (indented) are not read;
``$1`` and command substitutions stay as written. The command ends at a pipe, ``;``, ``&``, ``&&`` or a
redirection.

:class:`Flags` is what a format reads from the command: ``--name value`` / ``--name=value`` pairs by name
as written (``tensor-parallel-size``), a flag followed by another flag (or nothing) is ``True``, and the
positional words in order. Values stay text; :func:`integer`, :func:`number` and :func:`boolean` convert
them, with the one-line error of a wrong type.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from memest.errors import InputError

_ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)$", re.S)
_QUOTED_ARRAY = re.compile(r"\"\$\{([A-Za-z_][A-Za-z0-9_]*)\[@\]\}\"")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(\[[@*]\])?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_ARRAY = re.compile(r"^\s*(?:export\s+)?[A-Za-z_][A-Za-z0-9_]*\+?=\(")
_ENDS = frozenset({"|", "||", "&&", ";", "&", ";;"})


class Flags(dict[str, Any]):
    """A command's ``--flag value`` pairs by flag name as written (no leading dashes); ``program`` is the
    word the format matched (``serve``, ``pretrain_gpt.py``), ``before`` the flags of the launcher ahead of
    it (torchrun's ``--nproc_per_node``), ``positional`` the other words after it, ``line`` the command's
    first line (from 1), ``blocked`` the variables it uses that the script also sets inside a block (``if``,
    loop, ``case``, function), whose words there are not read."""

    program: str = ""
    before: dict[str, Any]
    positional: tuple[str, ...] = ()
    line: int = 0
    blocked: tuple[str, ...] = ()


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """The script's lines, comments dropped, joined at trailing backslashes, each with the number (from 1)
    of its first line; an array assignment left open (``NAME=(``) runs to its closing ``)``, a quoted string
    to its closing quote."""
    out: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        if not pending:
            start = number
        body = _strip_comment(line).rstrip()
        more = body.endswith("\\")
        pending.append(body[:-1] if more else body)
        joined = " ".join(pending)
        if more or (_ARRAY.match(joined) and joined.count("(") > joined.count(")")) or _open_quote(joined):
            continue
        out.append((start, joined))
        pending = []
    if pending:
        out.append((start, " ".join(pending)))
    return out


def _open_quote(text: str) -> bool:
    """Whether ``text`` ends inside a quoted string (``GPT_ARGS="`` whose words go on over the next lines)."""
    try:
        shlex.split(text)
    except ValueError:
        return True
    return False


def _strip_comment(line: str) -> str:
    """``line`` without its ``#`` comment (a ``#`` that starts a word outside quotes)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # an unclosed quote: split on blanks
        return text.split()


def _expand(text: str, scalars: dict[str, str], arrays: dict[str, list[str]]) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        if name in arrays:
            words = arrays[name] if match.group(2) else arrays[name][:1]
            return shlex.join(words)
        return scalars.get(name, match.group(0))

    def spliced(match: re.Match[str]) -> str:  # "${NAME[@]}": one word per item, as the shell splices it
        name = match.group(1)
        return shlex.join(arrays[name]) if name in arrays else match.group(0)

    return _VAR.sub(one, _QUOTED_ARRAY.sub(spliced, text))


def commands(text: str) -> list[tuple[int, list[str], tuple[str, ...]]]:
    """Each top-level command of a script (its first line, its words, the variables it uses that are also set
    inside a block and so not read there) with the variables before it expanded."""
    scalars: dict[str, str] = {}
    arrays: dict[str, list[str]] = {}
    blocked: set[str] = set()
    out: list[tuple[int, list[str], tuple[str, ...]]] = []
    for number, line in _logical_lines(text):
        indented = line[:1].isspace()
        assign = _ASSIGN.match(line.strip())
        if assign and indented:
            blocked.add(assign.group(1))
        if assign and not indented:
            name, append, value = assign.group(1), assign.group(2), assign.group(3).strip()
            if value.startswith("(") and value.rstrip().endswith(")"):
                words = _words(_expand(value.strip()[1:-1], scalars, arrays))
                arrays[name] = (arrays.get(name, []) if append else []) + words
                scalars.pop(name, None)
                continue
            words = _words(_expand(value, scalars, arrays))
            if len(words) <= 1 and not value.startswith("$("):
                scalars[name] = (scalars.get(name, "") if append else "") + (words[0] if words else "")
                arrays.pop(name, None)
                continue
        words = _words(_expand(line, scalars, arrays))
        if words:
            used = {m.group(1) or m.group(3) for m in _VAR.finditer(line)}
            out.append((number, words, tuple(sorted(used & blocked))))
    return out


def find(text: str, match: Callable[[list[str], int], int]) -> Flags | None:
    """The first command of ``text`` whose words ``match`` (-> the index of the word after the program, or
    -1), read into :class:`Flags`; None when no command matches."""
    for number, words, blocked in commands(text):
        for i in range(len(words)):
            after = match(words, i)
            if after >= 0:
                flags = _flags(words[after:])
                flags.program, flags.line, flags.blocked = words[after - 1], number, blocked
                flags.before = _flags(words[:i])
                return flags
    return None


def _flags(words: Sequence[str]) -> Flags:
    flags = Flags()
    flags.before = {}
    positional: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word in _ENDS or re.match(r"^\d?[<>]", word):
            break
        if word.startswith("-") and len(word) > 1 and not _is_number(word):
            name, eq, value = word.lstrip("-").partition("=")
            if eq:
                flags[name] = value
            elif i + 1 < len(words) and not _is_flag(words[i + 1]) and words[i + 1] not in _ENDS \
                    and not re.match(r"^\d?[<>]", words[i + 1]):
                flags[name] = words[i + 1]
                i += 1
            else:
                flags[name] = True
        else:
            positional.append(word)
        i += 1
    flags.positional = tuple(positional)
    return flags


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _is_flag(word: str) -> bool:
    return word.startswith("-") and len(word) > 1 and not _is_number(word)


def blocked_note(path: Path, flags: Flags) -> list[str]:
    """The note that a command uses variables set inside blocks, which were not read (none when it uses none)."""
    if not flags.blocked:
        return []
    names = ", ".join(f"${name}" for name in flags.blocked)
    return [f"{path.name}: {names} also set inside an if / case / loop block of the script; the words set there are "
            "not read (give those settings as flags)"]


def flag_lines(text: str, flags: Flags) -> dict[str, int]:
    """The line (from 1) of each flag of ``flags``: the first line, not a comment, where ``--name`` is written
    (a search, as for JSON keys: a flag that reaches the command through a variable is found where the
    variable is assigned); the positional model at the command's line."""
    lines = text.splitlines()
    out: dict[str, int] = {}
    for name in flags:
        pattern = re.compile(rf"(?<![\w-])--?{re.escape(name)}(?![\w-])")
        for number, line in enumerate(lines, 1):
            if not line.lstrip().startswith("#") and pattern.search(line.split(" #")[0]):
                out[name] = number
                break
    if flags.positional:
        out.setdefault("model", flags.line)
    return out


def integer(path: Path, key: str, value: Any) -> int:
    """``value`` as an integer: an int, or a text of digits (a command line's).

    Raises:
        InputError: naming the file, the key and the value.
    """
    if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise InputError(f"{{config}} {path}: {key} is {value!r}; expected an integer", field="config")


def number(path: Path, key: str, value: Any) -> float:
    """``value`` as a number: an int or float, or its text.

    Raises:
        InputError: naming the file, the key and the value.
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and _is_number(value):
        return float(value)
    raise InputError(f"{{config}} {path}: {key} is {value!r}; expected a number", field="config")


def boolean(path: Path, key: str, value: Any) -> bool:
    """``value`` as a switch: a bool, or ``true`` / ``false`` (a flag given alone is True).

    Raises:
        InputError: naming the file, the key and the value.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    raise InputError(f"{{config}} {path}: {key} is {value!r}; expected true or false", field="config")
