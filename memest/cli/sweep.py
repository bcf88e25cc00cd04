"""``memest sweep``: the estimate across a range of one setting, as a table and a picture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from memest.cli.app import JsonOpt, MarkdownOpt, ModelArg, _console, app, check_output_format, need_model
from memest.cli.options import JobOptions, ranged_workload_options
from memest.planning.sweep import SWEEPABLE

PlotOpt = Annotated[Path | None, typer.Option(
    "--plot", show_default=False,
    help="Also draw the terms (stacked, by kind) against the swept setting, with the device's capacity and "
         "usable lines, to FILE (.png, .svg or .pdf; needs matplotlib: pip install 'memest\\[plot]').",
    metavar="FILE")]


@app.command("sweep")
@ranged_workload_options(*SWEEPABLE)
def sweep_command(
    model: ModelArg = None,
    *,
    plot: PlotOpt = None,
    json_: JsonOpt = False,
    markdown: MarkdownOpt = False,
    job: JobOptions,
) -> None:
    """Estimate MODEL across a range of one setting: every term at every point, and where it stops fitting.

    Give one of --seq-len, --micro-batch-size, --batch-size or --max-model-len a range (1k..128k); with
    --plot FILE.png (.svg, .pdf) the terms are drawn stacked against it with the device's capacity and usable lines.
    """
    from memest.api import sweep_values
    from memest.report import render_sweep, sweep_to_markdown

    check_output_format(json_, markdown)
    need_model(model, job.values["config"])
    if plot is not None:
        from memest.report.plot import plot_path

        plot = plot_path(plot)
    ranged = {name: job.values[name] for name in SWEEPABLE}
    answer = sweep_values(model, {k: v for k, v in job.values.items() if k not in ranged}, ranged)
    result = answer.result
    if json_:
        typer.echo(json.dumps(answer.to_dict(), indent=2))
    elif markdown:
        typer.echo(sweep_to_markdown(result), nl=False)
    else:
        _console().print(render_sweep(result))
    if plot is not None:
        from memest.report.plot import plot_sweep

        typer.echo(f"Plot written to {plot_sweep(result, plot)}", err=True)
