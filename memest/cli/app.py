"""The typer application every command registers on, and what the commands share: the exit codes,
the output options, the console tables are printed on and its width."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(
    name="memest",
    help="How much accelerator memory a model needs, per device, for a training or serving job — "
    "and the cheapest setup that fits. Every figure is an estimate with a ± band; "
    "`memest calibrate` checks it on your hardware.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
)

def _print_version(value: bool) -> None:
    if value:
        from memest import __version__

        typer.echo(f"memest {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print memest's version and exit.",
                                          callback=_print_version, is_eager=True)] = False,
) -> None:
    """How much accelerator memory a model needs, per device, for a training or serving job — and the
    cheapest setup that fits. Every figure is an estimate with a ± band; `memest calibrate` checks it
    on your hardware."""


PIPE_WIDTH = 140
"""Columns of tables and help text when stdout is not a terminal (a pipe, a file, CI logs)."""

EXIT_UNEXPECTED = 1
EXIT_INPUT = 2
EXIT_NO_FIT = 3

ModelArg = Annotated[str, typer.Argument(help="Hub id or catalog name (see 'memest models'), a model folder, "
                                         "a config.json, or a Meta params.json.", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (integer bytes) instead of a table.")]
MarkdownOpt = Annotated[bool, typer.Option("--markdown", help="Print a Markdown table.")]
ExplainOpt = Annotated[bool, typer.Option("--explain", help="Show each term's formula and the assumptions.")]
CheckOpt = Annotated[bool, typer.Option("--check", help="Exit with code 3 when the job does not fit.")]
TraceOpt = Annotated[bool, typer.Option("--trace", help="Also run the model code on PyTorch's meta device, count every "
                                        "tensor, and print the traced peak beside the estimate (needs torch).")]
PlotOpt = Annotated[Path | None, typer.Option("--plot", help="Write the traced memory timeline to FILE (.png, .svg, "
                                              ".pdf; implies --trace; needs matplotlib).", metavar="FILE")]


def check_output_format(json_: bool, markdown: bool) -> None:
    """Refuse ``--json`` with ``--markdown``: each replaces the table.

    Raises:
        InputError: both were given.
    """
    if json_ and markdown:
        from memest.errors import InputError

        raise InputError("choose one of --json, --markdown (both replace the table)")


def _console(stderr: bool = False) -> Any:
    """The console every table is printed on (:func:`output_width` columns), or stderr's: progress is
    redrawn in place, so on a terminal it takes the terminal's own width."""
    from rich.console import Console

    width = _terminal_columns(sys.stderr) if stderr else None
    return Console(stderr=stderr, soft_wrap=False, width=width or output_width())


def _terminal_columns(stream: Any) -> int | None:
    try:
        return os.get_terminal_size(stream.fileno()).columns if stream.isatty() else None
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture), or no size
        return None


def output_width() -> int | None:
    """Columns of printed tables: ``COLUMNS`` when set, else the terminal's (None: rich asks it), else
    :data:`PIPE_WIDTH` when stdout is not a terminal."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return None if sys.stdout.isatty() else PIPE_WIDTH
