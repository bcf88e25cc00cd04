"""``memest calibrate``: run a few real steps of the job and print predicted versus measured.

The command parses flags, hands the run to :mod:`memest.calibration`, appends the record and
renders the comparison. It registers itself on :data:`memest.cli.app` when imported and imports no
torch itself: the measurement happens in :func:`memest.calibration.runner.run` (this process, or
torchrun workers).
"""

from __future__ import annotations

import json
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from memest.cli.app import EXIT_NO_FIT, JsonOpt, _console, app
from memest.cli.options import JobOptions, workload_options
from memest.errors import InputError

ModelArg = Annotated[str | None, typer.Argument(
    help="Hub id or catalog name, a model folder or a config.json (as for 'memest hf'); omit with --suite.",
    show_default=False)]
class Backend(str, Enum):
    """Where calibrate runs."""

    AUTO = "auto"
    CUDA = "cuda"
    CPU = "cpu"


DeviceOpt = Annotated[Backend, typer.Option("--device", help="Where to run: cuda, cpu, or auto (CUDA when torch sees "
                                            "a GPU).", case_sensitive=False)]
StepsOpt = Annotated[int | None, typer.Option("--steps", help="Measured steps after one warm-up: training steps "
                                              "(default 3), or decode steps when serving (default 8).",
                                              show_default=False)]
NprocOpt = Annotated[int, typer.Option("--nproc", help="Processes, one device each, launched under torchrun "
                                       "(DDP for --zero-stage 0, FSDP2 for 2/3 or --precision fsdp2). Inside "
                                       "torchrun or accelerate launch the job's world size is used.")]
SuiteOpt = Annotated[str | None, typer.Option("--suite", help="Run every case of calibrate/suites/NAME.json (or a "
                                              "suite file) instead of one MODEL, each in its own process.")]
WeightsOpt = Annotated[bool, typer.Option("--weights", metavar="", help="Load the checkpoint's real weights (downloads them) "
                                          "instead of random ones.")]
RecordOpt = Annotated[bool, typer.Option("--record/--no-record", metavar="", help="Append the result to "
                                         "RESULTS_DIR/<device>.jsonl.")]
ResultsDirOpt = Annotated[Path | None, typer.Option("--results-dir", help="Folder of the records (default: "
                                                    "./calibrate/results; the suite's repository for --suite).",
                                                    show_default=False)]
CaseTimeoutOpt = Annotated[float | None, typer.Option("--case-timeout", help="With --suite: stop a case after this many "
                                                      "seconds (nothing is recorded for it).", show_default=False)]
TagOpt = Annotated[str | None, typer.Option("--record-tag", hidden=True, help="suite/case id stored in the record.")]
ReportOpt = Annotated[bool, typer.Option("--report", metavar="", help="Summarize the records in RESULTS_DIR (default "
                                         "./calibrate/results): median and worst error per figure, per device and "
                                         "stack, and the runtime constants they imply; runs nothing.")]


@app.command("calibrate")
@workload_options
def calibrate_command(
    model: ModelArg = None,
    *,
    device: DeviceOpt = Backend.AUTO,
    steps: StepsOpt = None,
    nproc: NprocOpt = 1,
    suite: SuiteOpt = None,
    weights: WeightsOpt = False,
    record: RecordOpt = True,
    results_dir: ResultsDirOpt = None,
    json_: JsonOpt = False,
    case_timeout: CaseTimeoutOpt = None,
    record_tag: TagOpt = None,
    report: ReportOpt = False,
    job: JobOptions,
) -> None:
    """Run warm-up + a few real steps of the job on this machine and compare with the estimate.

    Training runs forward, backward and the optimizer step with the precision recipe; serving runs
    a prefill and decode steps with the HF cache. Prints predicted and measured per term and in
    total, and whether the fit verdict was right; an out-of-memory is recorded as 'did not fit'
    (exit code 3).
    """
    if report:
        if model is not None or suite is not None:
            raise InputError("--report summarizes the records already written and runs nothing: drop "
                             f"{'the MODEL' if model is not None else '--suite'}, or drop --report to calibrate")
        _report(results_dir or Path("calibrate") / "results", json_=json_)
        return
    if suite is not None:
        _run_suite(suite, device=None if device is Backend.AUTO else device.value, steps=steps, record=record,
                   results_dir=results_dir, case_timeout=case_timeout)
        return
    if case_timeout is not None:
        raise InputError(f"--case-timeout {case_timeout:g} applies to --suite runs (each case in its own process); a "
                         "single MODEL runs in this process: drop --case-timeout, or pass --suite NAME")
    if model is None and not job.values["config"]:
        raise InputError("pass a MODEL to calibrate, or --config FILE with a recipe that names it, or --suite NAME "
                         "to run a suite (see calibrate/suites/)")
    if model is None:
        from memest.api import model_reference

        model = str(model_reference(None, job.values))
    if device is Backend.CPU and job.gpu:
        raise InputError(f"--gpu {job.gpu} with --device cpu: calibrate measures the device it runs on (here the "
                         "CPU) and predicts for it; drop --gpu, or run on the GPU with --device cuda")
    from memest.calibration.compare import device_slug, evaluate
    from memest.calibration.records import append_record, build_record, check_writable_folder
    from memest.calibration.request import Request, calibration_workload, check_supported, flags_of
    from memest.calibration.runner import default_steps, run
    from memest.sources import load_model

    headroom = job.headroom  # every input is checked before any work: a finished measurement is never refused
    spec = load_model(model, trust_remote_code=job.trust_remote_code, revision=job.revision)
    workload = calibration_workload(job.values, spec, nproc, steps)
    check_supported(workload, backend=device.value, nproc=nproc, spec=spec)
    _check_cpu_run(spec, workload, device, nproc)
    if weights:
        from memest.calibration.models import check_weights

        check_weights(model)
    records_dir = results_dir or Path("calibrate") / "results"
    if record:
        check_writable_folder(records_dir)
    request = Request(model=model, flags=flags_of(job.values), backend=device.value, steps=steps, nproc=nproc, weights=weights,
                      tag=record_tag)
    n_steps = default_steps(request, workload, spec)
    payloads = run(request, progress=_progress())
    if payloads is None:  # a non-zero rank inside torchrun: rank 0 reports
        return
    result = evaluate(spec, workload, payloads, headroom=headroom)
    rec = build_record(request=request, spec=spec, workload=workload, device=result.device, estimate=result.estimate,
                       comparisons=list(result.ranks), verdict=result.verdict, payloads=payloads, steps=n_steps)
    where, not_recorded = None, None
    if record:
        where = records_dir / f"{device_slug(result.device)}.jsonl"
        try:
            append_record(where, rec)
        except InputError as exc:  # e.g. the disk filled during the run: print the measurement, then fail
            where, not_recorded = None, exc
    if json_:
        typer.echo(json.dumps(rec, indent=2))
    else:
        _console().print(render(spec, workload, result, rec, where))
    if not_recorded is not None:
        raise InputError(f"{not_recorded.template}; the measurement printed above was not recorded",
                         field=not_recorded.field)
    if not result.fits:
        raise typer.Exit(EXIT_NO_FIT)


def _report(folder: Path, *, json_: bool) -> None:
    """Print the summary of every record in ``folder``'s ``*.jsonl`` files.

    Raises:
        InputError: no records there.
    """
    import warnings

    from memest.calibration.records import read_records
    from memest.calibration.summary import summarize, summary_dict
    from memest.report.calibration import render_summary

    files = sorted(folder.glob("*.jsonl")) if folder.is_dir() else []
    with warnings.catch_warnings(record=True) as skipped:
        warnings.simplefilter("always")
        records = list(read_records(files))
    for w in skipped:
        typer.echo(f"Warning: {w.message}", err=True)
    if not records:
        raise InputError(f"no calibration records in {str(folder)!r}: run 'memest calibrate MODEL ...' (or train with "
                         "memest.integrations.hf.MemestCallback) first, or pass --results-dir to the folder that "
                         "holds them")
    groups = summarize(records)
    if json_:
        typer.echo(json.dumps(summary_dict(groups), indent=2))
    else:
        _console().print(render_summary(groups, str(folder)))


HOST_RAM_SHARE = 0.8
"""A CPU calibration may take at most this share of the host's available RAM (MemAvailable): the
run holds the job's tensors in RAM beside the OS, Python, torch and the profiler's records."""


def host_available_bytes() -> int | None:
    """RAM available to a new process without swapping: ``MemAvailable`` of /proc/meminfo (Linux),
    else free pages (``os.sysconf``); None when neither is readable."""
    import os

    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _check_cpu_run(spec: Any, workload: Any, device: Backend, nproc: int) -> None:
    """Before measuring on the CPU: say so when ``--device auto`` found no CUDA, and refuse a run
    whose estimated peak (every process on this host) exceeds :data:`HOST_RAM_SHARE` of the available
    RAM, which would swap or invoke the out-of-memory killer instead of measuring.

    Raises:
        InputError: the estimate does not fit the host's RAM.
    """
    from memest.calibration.compare import local_device
    from memest.calibration.runner import resolve_backend
    from memest.estimate import estimate
    from memest.report import size

    if resolve_backend(device.value) != "cpu":
        return
    if device is Backend.AUTO:
        typer.echo("Warning: torch sees no CUDA device, so calibrate measures on the CPU (tensor bytes in host RAM); "
                   "pass --device cuda on a GPU machine, or --device cpu to silence this.", err=True)
    available = host_available_bytes()
    if available is None:
        return
    est = estimate(spec, workload, local_device("cpu", "cpu", available))
    needed = sum(rank.allocated_bytes * rank.count for rank in est.ranks)
    if needed > HOST_RAM_SHARE * available:
        processes = f" over {nproc} processes" if nproc > 1 else ""
        raise InputError(f"calibrating {spec.name} on the CPU needs about {size(needed)} of RAM{processes} (the "
                         f"estimate's peak), more than {HOST_RAM_SHARE:.0%} of the {size(available)} available; "
                         "use a smaller model, or --device cuda on a GPU machine")


def _progress() -> Any:
    console = _console(stderr=True)
    start = time.perf_counter()

    def show(message: str) -> None:
        console.print(f"[dim]{time.perf_counter() - start:6.1f}s  {message}[/dim]", highlight=False)

    return show


def _run_suite(name: str, *, device: str | None, steps: int | None, record: bool, results_dir: Path | None,
               case_timeout: float | None) -> None:
    from memest.calibration.suites import TIMED_OUT, load_suite, run_suite
    from memest.report.tables import Narrowest, name_col, new_table, prose_col

    s = load_suite(name)
    out_dir = results_dir or s.root / "calibrate" / "results"
    progress = _progress()
    progress(f"suite {s.name}: {len(s.cases)} cases on {device or s.device}" + (f", records in {out_dir}" if record else ""))
    results = run_suite(s, device=device, steps=steps, record=record, results_dir=out_dir, case_timeout=case_timeout,
                        progress=progress)
    table = new_table(name_col("case"), prose_col("result"), title=f"suite {s.name}")
    labels = {0: "measured", EXIT_NO_FIT: "did not fit (recorded)", 2: "bad input", 130: "interrupted",
              TIMED_OUT: "timed out (not recorded)"}
    for case, code in results:
        table.add_row(case.id, labels.get(code, f"failed (exit {code})"))
    _console().print(Narrowest(table))
    if any(code not in (0, EXIT_NO_FIT) for _, code in results):
        raise typer.Exit(1)


def render(spec: Any, workload: Any, result: Any, rec: dict[str, Any], where: Path | None) -> Any:
    """A rich renderable: the job, one predicted-vs-measured table per rank, the verdict."""
    from rich.console import Group
    from rich.text import Text

    from memest.report import describe_model, describe_workload, percent, size
    from memest.report.tables import Narrowest, name_col, new_table, number_col

    first = result.ranks[0].measurement
    versions = rec["versions"]
    parts: list[Any] = [
        Text.assemble(("Model   ", "bold"), spec.name, "  ", (describe_model(spec), "dim")),
        Text.assemble(("Job     ", "bold"), describe_workload(workload)),
        Text.assemble(("Device  ", "bold"), f"{len(result.ranks)} × {first.device_name} ({size(result.device.memory_bytes)})"
                      f" · {rec['inputs']['steps']} measured steps · {rec['inputs']['weights']} weights"
                      f" · torch {versions.get('torch')}, transformers {versions.get('transformers')}"
                      + (f", CUDA {versions['cuda']}, driver {versions.get('driver')}" if versions.get("cuda") else "")),
    ]
    for rank in result.ranks:
        m = rank.measurement
        title = f"rank {rank.rank}" + (f" — DID NOT FIT: {m.error}" if not m.fits else "")
        table = new_table(name_col(""), *map(number_col, ("predicted", "measured", "delta", "delta %")),
                          title=title if len(result.ranks) > 1 or not m.fits else None)
        terms = {t.name: t.bytes for t in result.estimate.ranks[0].terms}
        for row in rank.rows:
            name = f"[bold]{row.name}[/bold]" if row.total else row.name
            table.add_row(name, _fmt(row.predicted, size), _fmt(row.measured, size),
                          _fmt(row.delta, size, signed=True), f"{row.error:+.1%}" if row.error is not None else "–")
            if len(row.terms) > 1 or (row.terms and row.terms[0] != row.name):
                for term in row.terms:
                    table.add_row(f"[dim]  {term}[/dim]", f"[dim]{size(terms.get(term, 0))}[/dim]", "", "", "")
        parts.append(Narrowest(table))
        if m.num_alloc_retries or m.num_ooms:
            parts.append(Text(f"rank {rank.rank}: the allocator retried {m.num_alloc_retries} cudaMalloc call(s) and "
                              f"raised {m.num_ooms} out-of-memory error(s): the peak was squeezed", style="yellow"))
    v = result.verdict
    style = {"right": "bold green", "conservative": "yellow", "missed": "bold red"}[v.status]
    parts.append(Text(
        f"Verdict: predicted {'FITS' if v.predicted_fits else 'DOES NOT FIT'} ({percent(v.headroom)} headroom kept); "
        f"ran: {'fits' if v.measured_fits else 'out of memory'} → {v.status}", style=style))
    if where is not None:
        parts.append(Text(f"recorded {where}#{rec['id']}", style="dim"))
    if first.backend == "cpu":
        parts.append(Text("CPU: measured = the profiler memory timeline's peak of tensor bytes by category; no CUDA "
                          "context, cuBLAS workspace or caching allocator on either side.", style="dim"))
    return Group(*parts)


def _fmt(n: int | None, size: Any, *, signed: bool = False) -> str:
    if n is None:
        return "–"
    return ("+" if signed and n > 0 else "") + size(n)
