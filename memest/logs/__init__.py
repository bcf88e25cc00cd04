"""Engine start-up logs and training logs: which engine or trainer wrote one, the job it ran and the
memory figures it printed.

:func:`read_log` detects the format from the text and hands it to that format's parser (one module
each: :mod:`.vllm`, :mod:`.sglang`, :mod:`.trtllm`, :mod:`.llamacpp`; training logs :mod:`.torchtitan`,
:mod:`.torchtune`, :mod:`.hf_trainer`), which returns an :class:`EngineLog`. A log
missing a figure simply lacks that key; :mod:`memest.check` compares the figures it has. This layer
only extracts: it predicts nothing (DESIGN.md, "Layers").
"""

from __future__ import annotations

import math
from types import ModuleType

from memest.errors import InputError
from memest.logs import hf_trainer, llamacpp, sglang, torchtitan, torchtune, trtllm, vllm
from memest.logs.record import FIGURES, EngineLog, Logged

__all__ = ["FIGURES", "FORMATS", "EngineLog", "Logged", "check_text", "read_bytes", "read_log"]

FORMATS: dict[str, ModuleType] = {"TensorRT-LLM": trtllm, "SGLang": sglang, "llama.cpp / Ollama": llamacpp,
                                   "torchtitan": torchtitan, "torchtune": torchtune,
                                   "HF Trainer memory metrics": hf_trainer, "vLLM (0.6, V1)": vllm}
"""The formats read, in the order they are tried (the most specific markers first)."""


def read_bytes(data: bytes, name: str) -> str:
    """A log file's text (:func:`check_text` of its UTF-8, undecodable bytes replaced).

    Raises:
        InputError: the file is empty or binary (not text).
    """
    return check_text(data.decode("utf-8", errors="replace"), name)


def check_text(text: str, name: str) -> str:
    """``text``, when it can be a log, its lone surrogates (a JSON ``"\\ud800"``, no character) replaced by ``?``,
    so that what is read from it (and quoted in an answer) is text.

    Raises:
        InputError: it is empty (or only whitespace) or binary (a NUL in its first 64 Ki characters).
    """
    if not text.strip():
        raise InputError(f"{name}: the log is empty; pass an engine's start-up log or a training log "
                         f"(formats read: {_formats()})")
    if "\x00" in text[:65536]:
        raise InputError(f"{name}: the log is a binary file, not a text log; pass an engine's start-up log or a "
                         f"training log (formats read: {_formats()})")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", errors="replace").decode("utf-8")
    return text


def read_log(text: str, name: str = "<log>") -> EngineLog:
    """The engine, job and figures of a start-up log.

    Raises:
        InputError: no format's lines are in ``text``, or it has none of the figures its format prints.
    """
    for label, module in FORMATS.items():
        if module.detect(text):
            try:
                log: EngineLog = module.parse(text)
            except (OverflowError, ValueError) as exc:  # int('9' * 5000), int(float('1' * 400)): no figure
                if isinstance(exc, InputError):
                    raise
                raise InputError(f"{name} ({label}) prints a number too large to be a memory figure or a "
                                 f"setting ({str(exc)[:60]}); pass the engine's log as it printed it") from None
            _check_sizes(log, name)
            if not log.figures:
                raise InputError(f"{name} ({log.format}) prints none of its memory figures "
                                 f"({', '.join(repr(line) for line in module.FIGURE_LINES)}); pass the whole start-up log")
            return log
    raise InputError(f"{name}: the log is not a start-up or training log memest reads (formats read: {_formats()}); "
                     "pass the engine's log from its start to 'ready', or the trainer's log through its first steps")


LARGEST = 2**62
"""The largest figure (bytes, tokens, blocks) a log is read with: 4 EiB, past any device or pool; a
larger one is no engine's output."""


def _check_sizes(log: EngineLog, name: str) -> None:
    """Raises InputError when a figure the log prints is beyond :data:`LARGEST` (or not a number)."""
    for key, f in log.figures.items():
        if not (isinstance(f.value, int) and abs(f.value) <= LARGEST
                or isinstance(f.value, float) and math.isfinite(f.value) and abs(f.value) <= LARGEST):
            shown = str(f.value) if len(str(f.value)) <= 24 else f"a number of {len(str(f.value)):,} digits"
            raise InputError(f"{name} ({log.format}) prints {key} {shown} {f.unit}, beyond any device or pool "
                             f"(at most {LARGEST:,}); pass the engine's log as it printed it")


def _formats() -> str:
    return ", ".join(FORMATS)

