"""``memest plan``: the cheapest setups that fit, ranked by cost (see :mod:`memest.planning.search`)."""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, get_args

import typer

from memest.api import ANY_ENGINE
from memest.cli.app import JsonOpt, MarkdownOpt, ModelArg, _console, app, check_output_format, need_model
from memest.cli.options import WORKLOAD_OPTIONS, JobOptions, flag_name, workload_options
from memest.devices import GiB
from memest.errors import InputError
from memest.planning.search import DEFAULT_HOST_MEMORY_BYTES, DEFAULT_MAX_DEVICES
from memest.workload import Engine

SEARCH = "Search"

GpusAvailableOpt = Annotated[str | None, typer.Option(
    "--gpus-available", rich_help_panel=SEARCH, show_default=False,
    help="Device types to consider and how many of each you can get: '8xH100,32xA100-80GB,L4' "
         "(no count: up to --max-gpus). Default: every catalog device, or --gpu.")]
MaxGpusOpt = Annotated[int, typer.Option("--max-gpus", rich_help_panel=SEARCH,
                                         help="Most devices of one type to try.")]
GlobalBatchOpt = Annotated[int | None, typer.Option(
    "--global-batch-size", rich_help_panel=SEARCH, show_default=False,
    help="Training: sequences per optimizer step to hold (micro-batch x accumulation x dp) "
         "Default: hold the per-replica batch (micro-batch x accumulation).")]
AllowMethodOpt = Annotated[bool, typer.Option("--allow-method-change", metavar="", rich_help_panel=SEARCH,
                                              help="Training: consider LoRA / QLoRA instead of the method asked.")]
AllowQuantOpt = Annotated[bool, typer.Option("--allow-quantization", metavar="", rich_help_panel=SEARCH,
                                             help="Serving: consider int8/int4/fp8 weights and an fp8 KV cache.")]
AllowOffloadOpt = Annotated[bool, typer.Option("--allow-offload", metavar="", rich_help_panel=SEARCH,
                                               help="Training: consider CPU offload of optimizer states and "
                                                    "parameters (slow: the ranking has no throughput model).")]
AllowOptimizerOpt = Annotated[bool, typer.Option("--allow-optimizer-change", metavar="", rich_help_panel=SEARCH,
                                                 help="Training: consider 8-bit AdamW in place of the AdamW asked.")]
AllowReshapeOpt = Annotated[bool, typer.Option("--allow-batch-reshape", metavar="", rich_help_panel=SEARCH,
                                               help="Training: consider a smaller micro-batch with more "
                                                    "accumulation steps (the same batch per step).")]
CostOpt = Annotated[list[str] | None, typer.Option(
    "--cost", rich_help_panel=SEARCH, show_default=False,
    help="Price of a device in USD per device-hour, NAME=USD (repeatable), e.g. --cost H100=2.49.")]
CostsOpt = Annotated[Path | None, typer.Option(
    "--costs", rich_help_panel=SEARCH, show_default=False,
    help='JSON file of device name -> USD per device-hour, e.g. {"H100": 2.49, "A100-80GB": 1.29}.')]
TopOpt = Annotated[int | None, typer.Option("--top", rich_help_panel=SEARCH, show_default=False,
                                            help="The N best setups overall (JSON: the N best of each device "
                                                 "type). Default: the best of each device type, 10 rows.")]
HostMemoryOpt = Annotated[float, typer.Option(
    "--host-memory", rich_help_panel=SEARCH,
    help="CPU RAM per server in GiB that offloaded optimizer states and parameters may use; 0 rules out offload.")]

def _engine_any(func: Callable[..., Any]) -> Callable[..., Any]:
    """Let ``--engine`` also take ``any`` in ``memest plan`` (compare the serving engines): the option is read
    as text, ``any`` recorded in :data:`_ENGINE_ANY` and the job given the default engine."""
    sig = inspect.signature(func)
    annotation, default = WORKLOAD_OPTIONS["engine"]
    info = get_args(annotation)[1]
    names = "|".join([*(e.value for e in Engine), ANY_ENGINE])
    option = typer.Option(flag_name("engine"), help=f"{info.help} 'any': compare vllm, sglang, trtllm and llama.cpp "
                          "on each device type (the one holding the most sequences is named).",
                          rich_help_panel=info.rich_help_panel, metavar=f"<{names}>")
    params = [p.replace(annotation=Annotated[str, option], default=default.value) if p.name == "engine" else p
              for p in sig.parameters.values()]

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        text = str(kwargs["engine"]).strip().lower()
        _ENGINE_ANY.set(text == ANY_ENGINE)
        if text == ANY_ENGINE:  # a GGUF file is read by the llama.cpp job (memest.planning.engines)
            kwargs["engine"] = Engine.LLAMACPP if kwargs.get("gguf") else default
        else:
            try:
                kwargs["engine"] = Engine(text)
            except ValueError:
                raise InputError(f"--engine {kwargs['engine']!r} is not one of {names.replace('|', ', ')}") from None
        return func(**kwargs)

    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


_ENGINE_ANY: contextvars.ContextVar[bool] = contextvars.ContextVar("memest_engine_any", default=False)
"""Whether this ``memest plan`` was given ``--engine any`` (set by :func:`_engine_any`)."""


@app.command("plan")
@_engine_any
@workload_options
def plan_command(
    model: ModelArg = None,
    *,
    gpus_available: GpusAvailableOpt = None,
    max_gpus: MaxGpusOpt = DEFAULT_MAX_DEVICES,
    global_batch_size: GlobalBatchOpt = None,
    allow_method_change: AllowMethodOpt = False,
    allow_quantization: AllowQuantOpt = False,
    allow_offload: AllowOffloadOpt = False,
    allow_optimizer_change: AllowOptimizerOpt = False,
    allow_batch_reshape: AllowReshapeOpt = False,
    cost: CostOpt = None,
    costs: CostsOpt = None,
    top: TopOpt = None,
    host_memory: HostMemoryOpt = DEFAULT_HOST_MEMORY_BYTES / GiB,
    json_: JsonOpt = False,
    markdown: MarkdownOpt = False,
    job: JobOptions,
) -> None:
    """The cheapest setups that fit MODEL, ranked by $/h, then communication, then disruption.

    Searches device type and count, TP/PP/DP, ZeRO and recompute within the job's stack (the 8-bit optimizer,
    micro-batch reshaping, another stack, LoRA/QLoRA, quantization and CPU offload only when allowed). --gpus, --dp, --tp and --pp are
    searched, not taken (--ep and --cp are kept); the other workload flags are the job and the starting
    point of each setting.
    """
    from memest.api import model_reference, plan_values, searched_given
    from memest.report import plan_to_markdown, render_plan

    check_output_format(json_, markdown)
    need_model(model, job.values["config"])
    if top is not None and top < 1:
        raise InputError(f"--top is {top}; it must be at least 1 (the best setups to print)")
    compare = _ENGINE_ANY.get()
    answer = plan_values(model, job.values, {"compare_engines": compare,
        "gpus_available": gpus_available, "max_gpus": max_gpus, "global_batch_size": global_batch_size,
        "allow_method_change": allow_method_change, "allow_quantization": allow_quantization,
        "allow_offload": allow_offload, "allow_optimizer_change": allow_optimizer_change,
        "allow_batch_reshape": allow_batch_reshape, "top": top or 1, "cost": cost, "costs": costs,
        "host_memory": host_memory})
    if compare:
        from memest.report.engines import engines_to_markdown, render_engines

        name = str(model_reference(model, job.values))
        if json_:
            typer.echo(json.dumps(answer.to_dict(), indent=2))
        elif markdown:
            typer.echo(engines_to_markdown(answer.result, model=name), nl=False)
        else:
            _console().print(render_engines(answer.result, model=name))
        return
    ignored = [flag_name(n) for n in searched_given(job.values)]
    if ignored:
        typer.echo(f"Note: plan searches {', '.join(ignored)}; the values given are ignored (limit devices with "
                   "--gpus-available or --max-gpus; sequence parallelism is tried wherever tp > 1).", err=True)
    if json_:
        typer.echo(json.dumps(answer.to_dict(), indent=2))
        return
    given = job.given_flags()
    model = str(model_reference(model, job.values))  # the printed commands name it
    if markdown:
        typer.echo(plan_to_markdown(answer.result, top=top or 10, model=model, given=given), nl=False)
    else:
        _console().print(render_plan(answer.result, top=top or 10, model=model, given=given))
