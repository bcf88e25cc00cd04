"""``memest check LOG [LOG ...]``: engine start-up logs and training logs against memest's estimate of
the same jobs (see :mod:`memest.check`)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated

import typer

from memest.cli.app import JsonOpt, _console, app
from memest.errors import InputError, MemestError

LogsArg = Annotated[list[str], typer.Argument(
    help="Start-up logs of vLLM (0.6, V1), SGLang, TensorRT-LLM or llama.cpp / Ollama, or training logs of "
         "torchtitan, torchtune or the HF Trainer (its memory metrics, train_results.json, trainer_state.json); "
         "'-' reads stdin.", show_default=False)]
ModelOpt = Annotated[str | None, typer.Option(
    "--model", show_default=False,
    help="The model to estimate (catalog name, Hub id or config folder) for the logs that name none memest "
         "resolves offline (a GGUF file, a private checkpoint). A log naming its own is checked with that; a "
         "different --model for it is an error, unless another log given takes --model.")]
GpuOpt = Annotated[str | None, typer.Option(
    "--gpu", show_default=False,
    help="The accelerator (see 'memest gpus') for the logs that name none memest knows. A log naming its own "
         "is checked on that; a different --gpu for it is an error, unless another log given takes --gpu.")]
SettingOpt = Annotated[list[str] | None, typer.Option(
    "--setting", show_default=False, metavar="NAME=VALUE",
    help="A setting of the job the log does not print, as memest names it without the dashes "
         "(micro-batch-size=2, seq-len=4096, gpus=8, quantization=fp8); repeat for several.")]
ConfigOpt = Annotated[list[str] | None, typer.Option(
    "--config", show_default=False,
    help="A training config file the run used (TrainingArguments / trl / axolotl / LLaMA-Factory YAML, DeepSpeed "
         "JSON, accelerate config): the settings the log does not print.")]
EngineVersionOpt = Annotated[str | None, typer.Option(
    "--engine-version", show_default=False,
    help="The engine arithmetic to apply (default: the one of the log's version or format).")]


def _read(name: str) -> str:
    from memest.logs import read_bytes

    if name == "-":
        return read_bytes(sys.stdin.buffer.read(), "-")
    path = Path(name)
    if path.is_dir():
        raise InputError(f"{name}: is a directory; pass the path of a log file in it, or '-' for stdin")
    if not path.exists():
        raise InputError(f"{name}: does not exist; pass the path of an engine's start-up log, or '-' for stdin")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{name}: cannot be read ({exc.strerror or type(exc).__name__}); pass a log file "
                         "you can read, or '-' for stdin") from None
    return read_bytes(data, name)


def _value(text: str) -> object:
    """A ``--setting`` value as its type: an integer, a number, true / false, else the text."""
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d*\.\d+(?:e-?\d+)?", text):
        return float(text)
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_settings(items: list[str] | None, config: list[str] | None) -> dict[str, object]:
    """``--setting NAME=VALUE`` items (and ``--config`` files) as settings by memest's names.

    Raises:
        InputError: an item without ``=``, or a name that is no setting.
    """
    from memest.workload.settings import settings

    known = settings()
    out: dict[str, object] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        key = name.strip().lstrip("-").replace("-", "_")
        if not sep or not value.strip():
            raise InputError(f"--setting {item!r} is not NAME=VALUE; write it as --setting seq-len=4096")
        if key not in known or key == "config":
            raise InputError(f"--setting {name!r} is not a setting memest knows; the settings are the flags of "
                             "'memest hf' without their dashes (micro-batch-size, seq-len, gpus, quantization, ...)")
        out[key] = _value(value.strip())
    if config:
        out["config"] = list(config)
    return out


def check_flag(name: str) -> str:
    """A setting as ``memest check`` takes it: ``--model`` / ``--gpu``, else ``--setting NAME=...``."""
    from memest.cli.options import flag_name

    if name in ("model", "gpu"):
        return f"--{name}"
    return f"--setting {flag_name(name).lstrip('-')}=..."


@app.command("check")
def check_command(
    logs: LogsArg,
    model: ModelOpt = None,
    gpu: GpuOpt = None,
    setting: SettingOpt = None,
    config: ConfigOpt = None,
    engine_version: EngineVersionOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Compare an engine's start-up log, or a training log, with memest's estimate of the job it ran.

    Reads the model, the settings and the memory figures the engine or trainer printed (weights,
    activation peak, KV cache memory, tokens and blocks, concurrency, buffers; a training step's peak
    allocated / reserved / active), re-estimates the same job and prints logged vs memest per figure
    with the error and the term of the largest gap. A setting the log does not print is named: give it
    with --setting (or --config). --model and --gpu are for the logs that do not name their own. Each
    log is checked apart: one that cannot be is named on stderr, the others are still compared, and the
    exit code is 2.
    """
    from memest.api import LogsFailed, check_logs
    from memest.errors import MemestError

    if logs.count("-") > 1:
        raise InputError("'-' (stdin) is given more than once; stdin can be read once")
    given = parse_settings(setting, config)
    texts: list[tuple[str, str]] = []
    unread: dict[int, MemestError] = {}
    for i, name in enumerate(logs):
        try:
            texts.append((name, _read(name)))
        except MemestError as exc:
            unread[i] = exc
    checks: list = []
    failed: list[tuple[str, MemestError]] = []
    if texts:
        try:
            checks = check_logs(texts, model=model, gpu=gpu, engine_version=engine_version, settings=given)
        except LogsFailed as exc:
            checks, failed = exc.checks, exc.errors
    # the failures in the order the logs were given: the unread ones, then those check_logs refused
    errors = _in_order(logs, unread, failed)
    if errors and not checks:
        if len(errors) == 1:
            raise errors[0][1].named(check_flag)
        _print_errors(errors)
        raise typer.Exit(2)
    from memest.report.check import render_check

    if json_:
        items = [c.to_dict() for c in checks]
        if errors:
            typer.echo(json.dumps({"checks": items, "errors": [{"log": n, "error": cli_message(e)}
                                                                 for n, e in errors]}, indent=2))
        else:
            typer.echo(json.dumps(items, indent=2))
    else:
        console = _console()
        for c in checks:
            console.print(render_check(c.result))
    if errors:
        _print_errors(errors)
        raise typer.Exit(2)


def cli_message(exc: MemestError) -> str:
    """An error's message as ``memest check`` names settings (``--model``, ``--setting seq-len=...``)."""
    return exc.render(check_flag)


def _in_order(logs: list[str], unread: dict[int, MemestError],
              failed: list[tuple[str, MemestError]]) -> list[tuple[str, MemestError]]:
    """Each failed log's ``(name, error)`` in the order the logs were given (``failed``: those read, in order)."""
    slots = dict(unread)
    free = [i for i in range(len(logs)) if i not in unread]
    for name, exc in failed:
        i = next(i for i in free if logs[i] == name)
        free.remove(i)
        slots[i] = exc
    return [(logs[i], slots[i]) for i in sorted(slots)]


def _print_errors(errors: list[tuple[str, MemestError]]) -> None:
    """Each log's error, one line on stderr (its message starts with the log's name)."""
    for _, exc in errors:
        typer.echo(f"Error: {cli_message(exc)}", err=True)
