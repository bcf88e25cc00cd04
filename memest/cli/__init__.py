"""The ``memest`` command line.

Exit codes:

- 0: the estimate was printed (with ``--check``: and the job fits);
- 1: memest failed unexpectedly (a bug: rerun with ``MEMEST_DEBUG=1`` and report the traceback);
- 2: bad input — an unknown model or device, a malformed config, impossible parallelism,
  a non-positive size, a bad flag. One line on stderr names the value and the fix;
- 3: with ``--check``, the estimate was printed and the job does not fit;
- 130: interrupted (Ctrl-C).

The library never prints; this module parses flags, calls the library and hands the result to
:mod:`memest.report`. It imports no torch, transformers or huggingface_hub: the analytic path
starts in well under a second.
"""

from __future__ import annotations

import os
import sys

import typer

from memest.cli.app import EXIT_INPUT, EXIT_NO_FIT, EXIT_UNEXPECTED, PIPE_WIDTH, app, output_width
from memest.cli.options import cli_message
from memest.errors import MemestError

# Each command module registers its command on `app` when imported.
from memest.cli import calibrate, catalog, hf, plan, sweep  # noqa: E402,F401  (registration)

__all__ = ["EXIT_INPUT", "EXIT_NO_FIT", "EXIT_UNEXPECTED", "PIPE_WIDTH", "app", "main", "output_width"]


def main() -> None:
    """Console entry point: the one error boundary.

    Every input error — memest's own and click's usage errors (unknown flag, bad choice, a value
    that is not a number) — is one line on stderr with exit code 2; help and ``typer.Exit`` keep
    their exit codes.
    """
    debug = os.environ.get("MEMEST_DEBUG", "").strip() not in ("", "0")
    if not sys.stdout.isatty():
        # rich (typer's --help) sizes its console from COLUMNS, else 80 columns when not on a terminal,
        # which cuts long option names (--attn-implementa…); give piped help the width of our tables
        os.environ.setdefault("COLUMNS", str(PIPE_WIDTH))
    try:
        code = app(standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("Interrupted.", err=True)
        sys.exit(130)
    except MemestError as exc:
        if debug:
            raise
        typer.echo(f"Error: {cli_message(exc)}", err=True)
        sys.exit(EXIT_INPUT)
    except KeyboardInterrupt:
        typer.echo("Interrupted.", err=True)
        sys.exit(130)
    except Exception as exc:
        kinds = {cls.__name__ for cls in type(exc).__mro__}  # click's, or typer's vendored copy of it
        if "NoArgsIsHelpError" in kinds:
            exc.show()  # type: ignore[attr-defined]
            sys.exit(0)
        if "UsageError" in kinds and not debug:
            ctx = getattr(exc, "ctx", None)
            command = ctx.command_path if ctx is not None else "memest"
            typer.echo(f"Error: {exc.format_message()} (see '{command} --help')", err=True)  # type: ignore[attr-defined]
            sys.exit(EXIT_INPUT)
        if debug:
            raise
        typer.echo(f"Error: memest failed unexpectedly: {type(exc).__name__}: {exc}. "
                   "Rerun with MEMEST_DEBUG=1 for the traceback and report it.", err=True)
        sys.exit(EXIT_UNEXPECTED)
    if isinstance(code, int) and code:
        sys.exit(code)
