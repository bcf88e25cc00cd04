"""The typer application every command registers on, and what the commands share: the exit codes,
the output options, the console tables are printed on and its width."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.core


def _help_table(*args: Any, **kwargs: Any) -> Any:
    """The table typer's ``--help`` lays out each panel of options or commands in
    (``typer.rich_utils.Table``): rich's, except that its name and type columns never shrink — on a
    narrow terminal rich cut them with "…" (``--attn-implementa…``) — and its last column, the help,
    wraps instead, a word wider than it folded onto the next line rather than cut."""
    return _whole_names_table()(*args, **kwargs)


@functools.cache
def _whole_names_table() -> type:
    from rich.columns import Columns
    from rich.table import Table  # imported only to print help: the analytic path starts without rich
    from rich.text import Text

    def one_text(cell: Any) -> Any:
        """typer's help cell (its text and ``[default: 1]`` side by side, each cut at the cell's
        width) as one text that wraps."""
        if isinstance(cell, Columns) and all(isinstance(item, Text) for item in cell.renderables):
            return Text(" ").join(cell.renderables)
        return cell

    def off_flag_below(cells: list[Any]) -> list[Any]:
        """An option row's off flag (``--keep-grads``) under its flag, not in a column of its own beside it: the
        name column is then as wide as the longest flag, not the longest flag and off flag side by side."""
        if len(cells) in (5, 6) and all(isinstance(c, Text) for c in cells):  # [required,] long, short, off
            long, off = cells[-5], cells[-3]
            if off.plain:
                cells[-5] = Text("\n").join([long, off])
                cells[-3] = Text("")
        return cells

    class WholeNamesTable(Table):
        def add_row(self, *renderables: Any, **kwargs: Any) -> None:
            *cells, last = renderables
            super().add_row(*off_flag_below(cells), one_text(last), **kwargs)  # the first row makes the columns
            *names, types, help_column = self.columns
            for column in names:
                column.no_wrap = True  # rich's width collapse leaves no_wrap columns whole
            types.overflow = help_column.overflow = "fold"

    return WholeNamesTable


def _with_whole_names(format_help: Any) -> Any:
    def wrapped(self: Any, ctx: Any, formatter: Any) -> Any:
        import typer.rich_utils

        typer.rich_utils.Table = _help_table  # typer offers no setting for its help table's columns
        return format_help(self, ctx, formatter)

    return wrapped


def _refuse_repeated_options(command: Any, ctx: Any, args: list[str]) -> None:
    """Refuse an option that takes one value given twice (``--gpu A100 --gpu H100``): click would keep
    the last one silently. click's own parser lists every option in the order it met them, repeats
    included; an option declared to repeat (``--config``) and a switch (``--train``) may repeat.
    (typer carries its own copy of click, so options are told by their attributes, and the error is
    raised by ``ctx.fail``: a usage error of that copy, exit code 2 at the CLI's boundary.)
    """
    if ctx.resilient_parsing:
        return
    try:
        _, _, order = command.make_parser(ctx).parse_args(args=list(args))
    except Exception:  # noqa: BLE001  (a malformed command line: the real parse reports it)
        return
    seen: set[str] = set()
    for param in order:
        if getattr(param, "param_type_name", "") != "option" or param.multiple or param.is_flag or param.count:
            continue
        if param.name in seen:
            ctx.fail(f"{max(param.opts, key=len)} was given more than once; give it once (only one value is used)")
        seen.add(param.name)


class _HelpCommand(typer.core.TyperCommand):
    """A command whose ``--help`` keeps flag names whole (:func:`_help_table`) and that refuses a
    one-value option given twice (:func:`_refuse_repeated_options`)."""

    format_help = _with_whole_names(typer.core.TyperCommand.format_help)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        _refuse_repeated_options(self, ctx, args)
        return super().parse_args(ctx, args)


class _HelpGroup(typer.core.TyperGroup):
    """``memest --help``, its command names kept whole (:func:`_help_table`)."""

    format_help = _with_whole_names(typer.core.TyperGroup.format_help)


class _App(typer.Typer):
    """typer's application, each command registered on it a :class:`_HelpCommand`."""

    def command(self, *args: Any, cls: Any = None, **kwargs: Any) -> Any:
        return super().command(*args, cls=cls or _HelpCommand, **kwargs)


app = _App(
    cls=_HelpGroup,
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

ModelArg = Annotated[str | None, typer.Argument(help="Hub id or catalog name (see 'memest models'), a model folder, "
                                                "a config.json, or a Meta params.json (omit it when a --config "
                                                "recipe names the model).", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", metavar="", help="Print JSON (integer bytes) instead of a table.")]
MarkdownOpt = Annotated[bool, typer.Option("--markdown", metavar="", help="Print a Markdown table.")]
ExplainOpt = Annotated[bool, typer.Option("--explain", metavar="", help="Show each term's formula and the assumptions.")]
CheckOpt = Annotated[bool, typer.Option("--check", metavar="", help="Exit with code 3 when the job does not fit. For vLLM, SGLang "
                                        "and TensorRT-LLM also when the engine starts but its KV pool holds fewer than "
                                        "--batch-size sequences of --max-model-len at once (without --check that job "
                                        "exits 0: the rest wait), and then the cheapest setup that holds them all is "
                                        "shown.")]
TraceOpt = Annotated[bool, typer.Option("--trace", metavar="", help="Also run the model code on PyTorch's meta device, count every "
                                        "tensor, and print the traced peak beside the estimate (needs torch).")]
PlotOpt = Annotated[Path | None, typer.Option("--plot", help="Write the traced memory timeline to FILE (.png, .svg, "
                                              ".pdf; implies --trace; needs matplotlib).", metavar="FILE")]


def need_model(model: str | None, config: tuple[str, ...] | list[str] | None) -> None:
    """Refuse a command given neither MODEL nor a ``--config`` file (one that names no model is refused by
    the library, naming the file's keys).

    Raises:
        InputError: neither was given.
    """
    if model is None and not config:
        from memest.errors import InputError

        raise InputError("no MODEL given: pass one (a Hub id, catalog name or model folder), or --config FILE with "
                         "a recipe that names it (model_name_or_path, base_model)")


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
