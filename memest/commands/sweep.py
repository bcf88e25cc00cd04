"""``memest sweep``: the estimate across a range of one setting, as a table and a picture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from memest.cli import JsonOpt, MarkdownOpt, ModelArg, _console, app, check_output_format
from memest.errors import InputError
from memest.options import WORKLOAD_OPTIONS, JobOptions, ranged_workload_options
from memest.sweep import SWEEPABLE, parse_values

PlotOpt = Annotated[Path | None, typer.Option(
    "--plot", show_default=False,
    help="Also draw the terms (stacked, by kind) against the swept setting, with the device's capacity and "
         "usable lines, to FILE (.png, .svg or .pdf; needs matplotlib: pip install 'memest\\[plot]').",
    metavar="FILE")]

_TRAINING = ("seq_len", "micro_batch_size")


def split_sweep(job: JobOptions) -> tuple[str, tuple[int, ...], JobOptions]:
    """Which setting is swept, its values, and the job with every ranged flag made a plain value
    (the swept one at its first value). Without --train/--finetune/--serve, sweeping a training
    setting (--seq-len, --micro-batch-size) means training.

    Raises:
        InputError: no flag or more than one holds a range.
    """
    values = dict(job.values)
    swept: list[tuple[str, tuple[int, ...]]] = []
    for name in SWEEPABLE:
        raw = values[name]
        flag = "--" + name.replace("_", "-")
        parsed = parse_values(raw, flag) if raw is not None else (WORKLOAD_OPTIONS[name][1],)
        if len(parsed) > 1:
            swept.append((name, parsed))
        values[name] = parsed[0]
    if len(swept) != 1:
        given = ", ".join("--" + n.replace("_", "-") for n, _ in swept)
        raise InputError(("sweep one setting at a time (ranges given: " + given + ")") if swept else
                         "give one setting a range, e.g. --seq-len 1k..128k, --micro-batch-size 1..64, "
                         "--batch-size 1..256 or --max-model-len 4k..128k")
    setting, points = swept[0]
    if not (values["train"] or values["finetune"] or values["serve"]):
        values["train" if setting in _TRAINING else "serve"] = True
    return setting, points, JobOptions(values)


@app.command("sweep")
@ranged_workload_options(*SWEEPABLE)
def sweep_command(
    model: ModelArg,
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
    from memest.report import render_sweep, sweep_to_dict, sweep_to_markdown
    from memest.sources import load_model
    from memest.sweep import sweep

    check_output_format(json_, markdown)
    if plot is not None:
        from memest.plot import plot_path

        plot = plot_path(plot)
    setting, values, job = split_sweep(job)
    spec = load_model(model, trust_remote_code=job.trust_remote_code, revision=job.revision)
    result = sweep(spec, job.workload(spec), job.device, setting, values, headroom=job.headroom)
    if json_:
        typer.echo(json.dumps(sweep_to_dict(result), indent=2))
    elif markdown:
        typer.echo(sweep_to_markdown(result), nl=False)
    else:
        _console().print(render_sweep(result))
    if plot is not None:
        from memest.plot import plot_sweep

        typer.echo(f"Plot written to {plot_sweep(result, plot)}", err=True)
