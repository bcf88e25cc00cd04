"""``memest plan``: the cheapest setups that fit, ranked by cost (see :mod:`memest.plan`)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated

import typer

from memest.cli import JsonOpt, MarkdownOpt, ModelArg, _console, app, check_output_format
from memest.costs import PriceTable, parse_cost_flags, read_cost_file
from memest.devices import DEVICES, GiB, get_device
from memest.errors import InputError
from memest.options import JobOptions, workload_options
from memest.plan import DEFAULT_HOST_MEMORY_BYTES, DEFAULT_MAX_DEVICES, DeviceChoice, Space
from memest.workload import FsdpStrategy

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
AllowMethodOpt = Annotated[bool, typer.Option("--allow-method-change", rich_help_panel=SEARCH,
                                              help="Training: consider LoRA / QLoRA instead of the method asked.")]
AllowQuantOpt = Annotated[bool, typer.Option("--allow-quantization", rich_help_panel=SEARCH,
                                             help="Serving: consider int8/int4/fp8 weights and an fp8 KV cache.")]
AllowOffloadOpt = Annotated[bool, typer.Option("--allow-offload", rich_help_panel=SEARCH,
                                               help="Training: consider CPU offload of optimizer states and "
                                                    "parameters (slow: the ranking has no throughput model).")]
CostOpt = Annotated[list[str] | None, typer.Option(
    "--cost", rich_help_panel=SEARCH, show_default=False,
    help="Price of a device in USD per device-hour, NAME=USD (repeatable), e.g. --cost H100=2.49.")]
CostsOpt = Annotated[Path | None, typer.Option(
    "--costs", rich_help_panel=SEARCH, show_default=False,
    help='JSON file of device name -> USD per device-hour, e.g. {"H100": 2.49, "A100-80GB": 1.29}.')]
TopOpt = Annotated[int, typer.Option("--top", rich_help_panel=SEARCH, help="Rows to print (JSON has every fit).")]
HostMemoryOpt = Annotated[float, typer.Option(
    "--host-memory", rich_help_panel=SEARCH,
    help="CPU RAM per server in GiB that offloaded optimizer states and parameters may use; 0 rules out offload.")]

_AVAILABLE_ITEM = re.compile(r"^\s*(?:([-+]?\d+)\s*[x×*]\s*)?(\S.*?)\s*$")
_SEARCHED_FLAGS = {"gpus": 1, "dp": None, "tp": None, "pp": 1, "sequence_parallel": False}
"""Workload flags plan chooses itself, with the values it starts from (sequence parallelism is
turned on wherever a layout has tp > 1)."""


def device_choices(available: str | None, gpu: str | None, max_gpus: int) -> tuple[DeviceChoice, ...]:
    """The device types of ``--gpus-available`` (or ``--gpu``, or the whole catalog) with their limits.

    Raises:
        InputError: both --gpu and --gpus-available, a malformed or repeated item, a count below 1.
        UnknownDeviceError: an unknown device name.
    """
    if max_gpus < 1:
        raise InputError(f"--max-gpus is {max_gpus}; it must be at least 1")
    if available is not None and gpu is not None:
        raise InputError("pass either --gpu NAME or --gpus-available SPEC, not both")
    if gpu is not None:
        return (DeviceChoice(get_device(gpu), max_gpus),)
    if available is None:
        return tuple(DeviceChoice(d, max_gpus) for d in DEVICES)
    out: dict[str, DeviceChoice] = {}
    for item in available.split(","):
        m = _AVAILABLE_ITEM.match(item)
        if not m:
            raise InputError(f"--gpus-available {available!r}: empty item; write e.g. '8xH100,16xA100-80GB'")
        count = int(m.group(1)) if m.group(1) else max_gpus
        if count < 1:
            raise InputError(f"--gpus-available item {item.strip()!r}: the count must be at least 1, a positive number "
                             f"of devices (got {count}); write e.g. 2x{m.group(2)}")
        device = get_device(m.group(2))
        if device.name in out:
            raise InputError(f"--gpus-available lists {device.name} twice; give it once with its count")
        out[device.name] = DeviceChoice(device, count)
    return tuple(out.values())


def price_table(cost: list[str] | None, costs: Path | None) -> PriceTable:
    """The catalog's prices with ``--costs FILE`` and then ``--cost NAME=USD`` applied."""
    table = PriceTable.catalog()
    if costs is not None:
        table = table.with_overrides(read_cost_file(costs))
    if cost:
        table = table.with_overrides(parse_cost_flags(cost))
    return table


@app.command("plan")
@workload_options
def plan_command(
    model: ModelArg,
    *,
    gpus_available: GpusAvailableOpt = None,
    max_gpus: MaxGpusOpt = DEFAULT_MAX_DEVICES,
    global_batch_size: GlobalBatchOpt = None,
    allow_method_change: AllowMethodOpt = False,
    allow_quantization: AllowQuantOpt = False,
    allow_offload: AllowOffloadOpt = False,
    cost: CostOpt = None,
    costs: CostsOpt = None,
    top: TopOpt = 10,
    host_memory: HostMemoryOpt = DEFAULT_HOST_MEMORY_BYTES / GiB,
    json_: JsonOpt = False,
    markdown: MarkdownOpt = False,
    job: JobOptions,
) -> None:
    """The cheapest setups that fit MODEL, ranked by $/h, then communication, then disruption.

    Searches device type and count, TP/PP/DP, ZeRO, recompute, micro-batch with accumulation and the 8-bit
    optimizer (LoRA/QLoRA, quantization and CPU offload only when allowed). --gpus, --dp, --tp and --pp are
    searched, not taken (--ep and --cp are kept); the other workload flags are the job and the starting
    point of each setting.
    """
    from memest.plan import plan
    from memest.report import plan_to_dict, plan_to_markdown, render_plan
    from memest.sources import load_model

    check_output_format(json_, markdown)
    if top < 1:
        raise InputError(f"--top is {top}; it must be at least 1 (rows of the table; --json has every fit)")
    if not host_memory >= 0:  # also NaN
        what = "is negative" if host_memory < 0 else "is not a size"
        raise InputError(f"--host-memory {host_memory:g} GiB {what}; give the CPU RAM per server in GiB, "
                         "or 0 to rule out offload")
    serving = not (job.values["train"] or job.values["finetune"])
    if serving and allow_method_change:
        raise InputError("--allow-method-change lets a training plan try LoRA / QLoRA; for serving use "
                         "--allow-quantization")
    if not serving and allow_quantization:
        raise InputError("--allow-quantization lets a serving plan try int8/int4/fp8 weights and fp8 KV; for "
                         "training use --allow-method-change (QLoRA)")
    space = Space(devices=device_choices(gpus_available, job.gpu, max_gpus), prices=price_table(cost, costs),
                  allow_method_change=allow_method_change, allow_quantization=allow_quantization,
                  allow_offload=allow_offload, global_batch_size=global_batch_size, host_memory_bytes=round(host_memory * GiB))
    ignored = ["--" + n.replace("_", "-") for n, default in _SEARCHED_FLAGS.items() if job.values[n] != default]
    if ignored:
        typer.echo(f"Note: plan searches {', '.join(ignored)}; the values given are ignored (limit devices with "
                   "--gpus-available or --max-gpus; sequence parallelism is tried wherever tp > 1).", err=True)
    v = job.values  # the count is searched: give the job the fewest devices its cp x tp x pp allow
    if v["fsdp"] is FsdpStrategy.HYBRID_SHARD and v["dp_shard"] is None:
        raise InputError("plan with --fsdp hybrid_shard needs --dp-shard N (ranks per shard group, e.g. 8): "
                         "the default depends on the device count, which plan searches")
    given = job.given_flags()
    job = JobOptions({**v, "gpus": (v["tp"] or 1) * v["pp"] * v["cp"], "dp": None, "sequence_parallel": False})
    spec = load_model(model, trust_remote_code=job.trust_remote_code, revision=job.revision)
    result = plan(spec, job.workload(spec), space, headroom=job.headroom)
    if json_:
        typer.echo(json.dumps(plan_to_dict(result, model=model, given=given), indent=2))
    elif markdown:
        typer.echo(plan_to_markdown(result, top=top, model=model, given=given), nl=False)
    else:
        _console().print(render_plan(result, top=top, model=model, given=given))
