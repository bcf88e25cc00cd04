"""The ``memest`` command line.

Exit codes:

- 0: the estimate was printed (with ``--check``: and the job fits);
- 1: memest failed unexpectedly (a bug: rerun with ``MEMEST_DEBUG=1`` and report the traceback);
- 2: bad input — an unknown model or device, a malformed config, impossible parallelism, a one-value flag given twice,
  a non-positive size, a bad flag. One line on stderr names the value and the fix;
- 3: with ``--check``, the estimate was printed and the job does not fit as asked: it does not fit,
  or (vLLM, SGLang, TensorRT-LLM) the engine starts but holds fewer than ``--batch-size`` sequences of
  ``--max-model-len`` at once, which without ``--check`` exits 0 (the rest wait);
- 130: interrupted (Ctrl-C).

The library never prints; this module parses flags, calls the library and hands the result to
:mod:`memest.report`. It imports no torch, transformers or huggingface_hub: the analytic path
starts in well under a second.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any


def _interrupted_while_starting(signum: int, frame: Any) -> None:
    """Ctrl-C while the modules below load: the one "Interrupted." line, exit 130 (no import traceback)."""
    sys.stderr.write("Interrupted.\n")
    sys.stderr.flush()
    os._exit(130)


_STARTING = threading.current_thread() is threading.main_thread()
_SIGINT_BEFORE = signal.signal(signal.SIGINT, _interrupted_while_starting) if _STARTING else None

import typer  # noqa: E402

# Each command module registers its command on `app` when imported.
from memest.cli import calibrate, catalog, check, hf, plan, serve, sweep  # noqa: E402,F401  (registration)
from memest.cli.app import EXIT_INPUT, EXIT_NO_FIT, EXIT_UNEXPECTED, PIPE_WIDTH, app, output_width  # noqa: E402
from memest.cli.options import cli_message  # noqa: E402
from memest.errors import MemestError  # noqa: E402

if _STARTING:
    signal.signal(signal.SIGINT, _SIGINT_BEFORE)  # loaded: Ctrl-C is a KeyboardInterrupt again, caught in main()

EXIT_INTERRUPTED = 130

__all__ = ["EXIT_INPUT", "EXIT_NO_FIT", "EXIT_UNEXPECTED", "PIPE_WIDTH", "app", "main", "output_width"]


def main() -> None:
    """Console entry point: the one error boundary.

    Every input error — memest's own and click's usage errors (unknown flag, bad choice, a value
    that is not a number) — is one line on stderr with exit code 2; help and ``typer.Exit`` keep
    their exit codes. Ctrl-C is one "Interrupted." line and exit code 130, whatever a library made
    of the KeyboardInterrupt (torch and transformers turn one during an import into an ImportError).
    """
    debug = os.environ.get("MEMEST_DEBUG", "").strip() not in ("", "0")
    if not debug:
        _quiet_dependencies()
    if not sys.stdout.isatty():
        # rich (typer's --help) sizes its console from COLUMNS, else 80 columns when not on a terminal,
        # which cuts long option names (--attn-implementa…); give piped help the width of our tables
        os.environ.setdefault("COLUMNS", str(PIPE_WIDTH))
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _on_ctrl_c) if on_main_thread else None
    _CTRL_C.clear()
    try:
        _dispatch(debug)
    finally:
        if on_main_thread:
            signal.signal(signal.SIGINT, previous)


_CTRL_C = threading.Event()
"""Set when SIGINT arrived during :func:`main`."""


def _on_ctrl_c(signum: int, frame: Any) -> None:
    _CTRL_C.set()
    raise KeyboardInterrupt


def _exit(message: str, code: int) -> None:
    """Print ``message`` (one line) on stderr and exit with ``code``.

    After a Ctrl-C (SIGINT), "Interrupted." and 130, at once: the interrupted libraries' threads and
    exit handlers (torch's, mid-import) are not waited for, as they can turn the exit into a second
    interruption.
    """
    if not _CTRL_C.is_set():
        typer.echo(message, err=True)
        sys.exit(code)
    typer.echo("Interrupted.", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)


def _notice_on_stderr(message: str) -> None:
    """A library notice (:func:`memest.sources.spec_cache.notify`) as one line on stderr."""
    typer.echo(message, err=True)


def _dispatch(debug: bool) -> None:
    from memest.sources.spec_cache import notices

    try:
        with notices(_notice_on_stderr):
            code = app(standalone_mode=False)
    except typer.Exit as exc:
        if exc.exit_code == EXIT_INTERRUPTED or _CTRL_C.is_set():  # typer turns Ctrl-C into Exit(130), silently
            _exit("Interrupted.", EXIT_INTERRUPTED)
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        _exit("Interrupted.", EXIT_INTERRUPTED)
    except MemestError as exc:
        if debug:
            raise
        _exit(f"Error: {cli_message(exc)}", EXIT_INPUT)
    except Exception as exc:
        kinds = {cls.__name__ for cls in type(exc).__mro__}  # click's, or typer's vendored copy of it
        if "NoArgsIsHelpError" in kinds:
            exc.show()  # type: ignore[attr-defined]
            sys.exit(0)
        if "UsageError" in kinds and not debug:
            ctx = getattr(exc, "ctx", None)
            command = ctx.command_path if ctx is not None else "memest"
            _exit(f"Error: {_usage_message(exc, sys.argv[1:])} (see '{command} --help')", EXIT_INPUT)
        if debug:
            raise
        _exit(f"Error: memest failed unexpectedly: {type(exc).__name__}: {exc}. "
              "Rerun with MEMEST_DEBUG=1 for the traceback and report it.", EXIT_UNEXPECTED)
    if code == EXIT_INTERRUPTED or _CTRL_C.is_set():  # typer turns Ctrl-C into Exit(130) and click returns it
        _exit("Interrupted.", EXIT_INTERRUPTED)
    if isinstance(code, int) and code:
        sys.exit(code)


QUIET_MODULES = ("transformers", "torch", "peft", "accelerate", "huggingface_hub", "bitsandbytes", "deepspeed")
"""Libraries whose warnings the CLI hides unless ``MEMEST_DEBUG=1``: their deprecation notices and
advice are about their own API, not the user's job, and memest reports what matters itself."""


def _quiet_dependencies() -> None:
    """Hide the warnings of :data:`QUIET_MODULES` (Python warnings, and transformers' logger, read
    when transformers loads, so torchrun workers inherit it too)."""
    import warnings

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    for module in QUIET_MODULES:
        warnings.filterwarnings("ignore", module=rf"{module}(\.|$)")


def _usage_message(exc: Any, argv: list[str]) -> str:
    """click's message for a usage error, with the value given when it is a bad value the message does
    not echo (typer's number conversion says only "Input should be a valid integer")."""
    # typer's pydantic adapter prefixes a parser's or an enum's ValueError with "Value error, ": not the user's words
    message = str(exc.format_message()).replace("Value error, ", "")
    param = getattr(exc, "param", None)
    opts = tuple(getattr(param, "opts", ()) or ())
    if not opts or "BadParameter" not in {cls.__name__ for cls in type(exc).__mro__}:
        return message
    value = None
    for i, arg in enumerate(argv):
        for opt in opts:
            if arg == opt and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(f"{opt}="):
                value = arg[len(opt) + 1:]
    if value is not None and value.startswith("--") and "is not one of" in message:
        # a flag that takes a value, given alone before another flag (--fsdp --gpus 2): say so, with the choices
        choices = message.split("is not one of", 1)[1].strip().rstrip(".")
        return f"'{opts[0]}' takes a value, one of {choices}; it was followed by the flag '{value}'"
    if value is None or repr(value) in message:
        return message
    reason = str(getattr(exc, "message", message)).replace("Value error, ", "")
    return f"Invalid value for '{opts[0]}': {value!r}: {reason}"
