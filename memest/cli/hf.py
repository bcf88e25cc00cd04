"""``memest hf``: the per-device estimate of one job, its verdict and the cheapest change that fits."""

from __future__ import annotations

import json

import typer

from memest.cli.app import (
    EXIT_NO_FIT,
    CheckOpt,
    ExplainOpt,
    JsonOpt,
    MarkdownOpt,
    ModelArg,
    PlotOpt,
    TraceOpt,
    _console,
    app,
    check_output_format,
    need_model,
)
from memest.cli.options import JobOptions, workload_options


@app.command("hf")
@workload_options
def hf_command(
    model: ModelArg = None,
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
    need_model(model, job.values["config"])
    if plot is not None:
        from memest.report.plot import plot_path

        plot = plot_path(plot)
    from memest.api import estimate_values
    from memest.report import render, to_markdown

    # the Python API's path: --json is its to_dict(); --check asks for every --batch-size sequence at once
    answer = estimate_values(model, job.values, hold_batch=check)
    result = answer.result
    traced = None
    if trace or plot is not None:
        from memest.cli.progress import progress_on_stderr
        from memest.report import trace as console

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
