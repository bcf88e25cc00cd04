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

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from memest.errors import MemestError
from memest.options import JobOptions, cli_message, workload_options

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


@app.command("hf")
@workload_options
def hf_command(
    model: ModelArg,
    *,
    json_: JsonOpt = False,
    markdown: MarkdownOpt = False,
    explain: ExplainOpt = False,
    check: CheckOpt = False,
    trace: TraceOpt = False,
    plot: PlotOpt = None,
    job: JobOptions,
) -> None:
    """Estimate per-device memory for MODEL: terms, fit verdict and the cheapest change that fits."""
    check_output_format(json_, markdown)
    if plot is not None:
        from memest.plot import plot_path

        plot = plot_path(plot)
    from memest.api import estimate_values
    from memest.report import render, to_markdown

    answer = estimate_values(model, job.values)  # the Python API's path: --json is its to_dict()
    result = answer.result
    traced = None
    if trace or plot is not None:
        from memest.commands.progress import progress_on_stderr
        from memest.trace import console

        warning = console.slow_trace_warning(result.spec, result.workload)
        if warning is not None:
            typer.echo(warning, err=True)
        with progress_on_stderr(_console(stderr=True), "tracing", start="model build") as progress:
            traced = console.trace_for_cli(answer.config, result.workload, job.device, result.estimate,
                                           trust_remote_code=job.trust_remote_code, plot=plot, progress=progress)
    if json_:
        doc = answer.to_dict()
        if traced is not None:
            doc["trace"] = console.to_dict(*traced)
        typer.echo(json.dumps(doc, indent=2))
    elif markdown:
        typer.echo(to_markdown(result) + (console.to_markdown(*traced) if traced else ""), nl=False)
    else:
        _console().print(render(result, explain=explain))
        if traced is not None:
            _console().print(console.render(*traced))
    if check and not result.verdict.fits:
        raise typer.Exit(EXIT_NO_FIT)


@app.command("models")
def models_command(
    json_: JsonOpt = False,
) -> None:
    """List the offline catalog: models memest knows without network."""
    from memest.report import count
    from memest.sources import catalog, load_model

    items = []
    for model_id in catalog.entries():
        spec = load_model(model_id)
        items.append((model_id, spec.model_type, spec.num_params, spec.num_layers, spec.max_position_embeddings))
    if json_:
        typer.echo(json.dumps([{"name": n, "model_type": t, "num_params": p, "num_layers": layers,
                                "max_position_embeddings": ctx} for n, t, p, layers, ctx in items], indent=2))
        return
    from memest.tables import Narrowest, name_col, new_table, number_col

    title = "memest offline catalog (sources: memest/catalog/SOURCES.md)"
    numbers = ("params", "layers", "max context")
    wide = new_table(name_col("model"), name_col("model_type"), *map(number_col, numbers), title=title)
    narrow = new_table(name_col("model (model_type)"), *map(number_col, numbers), title=title)  # the type below
    for n, t, p, layers, ctx in items:
        wide.add_row(n, t, count(p), str(layers), f"{ctx:,}" if ctx else "-")
        narrow.add_row(f"{n}\n[dim]{t}[/dim]", count(p), str(layers), f"{ctx:,}" if ctx else "-")
    _console().print(Narrowest(wide, narrow))


@app.command("gpus")
def gpus_command(
    json_: JsonOpt = False,
) -> None:
    """List the accelerator catalog: memory per device and where each capacity comes from."""
    from memest.devices import DEVICES
    from memest.report import gib

    if json_:
        typer.echo(json.dumps([{"name": d.name, "memory_bytes": d.memory_bytes, "vendor": d.vendor, "kind": d.kind,
                                "arch": d.arch, "per_node": d.per_node, "hourly_usd": d.hourly_usd,
                                "capacity_basis": d.capacity_basis, "measured": d.measured, "source": d.source,
                                "aliases": list(d.aliases)}
                               for d in DEVICES], indent=2))
        return
    from memest.tables import Narrowest, name_col, new_table, number_col, prose_col

    title = ("memest accelerator catalog (memory per device; GiB = 2^30 bytes). Capacity: measured = a published "
             "reading of the usable total, nominal = the vendor's figure, working set = Apple's Metal share of unified "
             "RAM. Any size also works: --gpu 48GB, --gpu my-card:47.5GiB")
    wide = new_table(name_col("device"), number_col("memory"), prose_col("capacity"), number_col("$/h"),
                     prose_col("source"), prose_col("aliases"), title=title)
    narrow = new_table(name_col("device"), number_col("memory"), number_col("$/h"),
                       prose_col("capacity: source (aliases)"), title=title)
    for d in DEVICES:
        price = "-" if d.hourly_usd is None else f"{d.hourly_usd:.2f}"
        aliases = ", ".join(d.aliases[:3])
        wide.add_row(d.name, gib(d.memory_bytes), d.capacity_basis, price, d.source, aliases)
        narrow.add_row(d.name, gib(d.memory_bytes), price,
                       f"{d.capacity_basis}: {d.source}" + (f" [dim]({aliases})[/dim]" if aliases else ""))
    _console().print(Narrowest(wide, narrow))


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


# Commands kept in their own modules register themselves on `app`; imported last, as they use the
# option aliases above.
from memest.commands import calibrate as _calibrate_command, plan as _plan_command, sweep as _sweep_command  # noqa: E402,F401
