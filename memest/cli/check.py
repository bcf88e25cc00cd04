"""``memest check LOG [LOG ...]``: engine start-up logs against memest's estimate of the same jobs
(see :mod:`memest.check`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from memest.cli.app import JsonOpt, _console, app
from memest.errors import InputError

LogsArg = Annotated[list[str], typer.Argument(help="Start-up logs of vLLM (0.6, V1), SGLang or llama.cpp / Ollama; "
                                                   "'-' reads stdin.", show_default=False)]
ModelOpt = Annotated[str | None, typer.Option(
    "--model", show_default=False,
    help="The model to estimate (catalog name, Hub id or config folder) when the log names none memest resolves offline.")]
GpuOpt = Annotated[str | None, typer.Option(
    "--gpu", show_default=False, help="The accelerator (see 'memest gpus') when the log names none memest knows.")]
EngineVersionOpt = Annotated[str | None, typer.Option(
    "--engine-version", show_default=False,
    help="The engine arithmetic to apply (default: the one of the log's version or format).")]


def _read(name: str) -> str:
    from memest.logs import read_bytes

    if name == "-":
        return read_bytes(sys.stdin.buffer.read(), "-")
    path = Path(name)
    if not path.exists() or path.is_dir():
        raise InputError(f"log {name!r} is not a file; pass the path of an engine's start-up log, or '-' for stdin")
    return read_bytes(path.read_bytes(), name)


@app.command("check")
def check_command(
    logs: LogsArg,
    model: ModelOpt = None,
    gpu: GpuOpt = None,
    engine_version: EngineVersionOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Compare an engine's start-up log with memest's estimate of the job it ran.

    Reads the model, the settings and the memory figures the engine printed (weights, activation peak,
    KV cache memory, tokens and blocks, concurrency, buffers), re-estimates the same job and prints
    logged vs memest per figure with the error and the term of the largest gap.
    """
    from memest.check import check_log
    from memest.logs import read_log

    if logs.count("-") > 1:
        raise InputError("'-' (stdin) is given more than once; stdin can be read once")
    checks = [check_log(read_log(_read(name), name), name=name, model=model, gpu=gpu, engine_version=engine_version)
              for name in logs]
    from memest.report.check import check_to_dict, render_check

    if json_:
        typer.echo(json.dumps([check_to_dict(c) for c in checks], indent=2))
        return
    console = _console()
    for c in checks:
        console.print(render_check(c))
