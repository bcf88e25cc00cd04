"""Analytic estimate vs trace for every decoder family's tiny config (tests/trace_models.py), five jobs each.

Prints a Markdown table of (analytic - traced) / traced peak allocated (cuBLAS workspace left out of
both), and with ``--details FAMILY/JOB`` the per-kind comparison and the largest tensors live at
the traced peak. The numbers in benchmarks/trace_findings.md come from this script.

Usage: ``.venv/bin/python benchmarks/trace_agreement.py [--details llama/lora ...]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from trace_models import TINY_SOURCES, tiny_config

from memest.devices import get_device
from memest.estimate import estimate, runtime
from memest.sources import spec_from_config
from memest.trace import compare, trace
from memest.workload import Engine, Method, Recompute, ServingConfig, TrainingConfig

JOBS = {
    "full": TrainingConfig(micro_batch_size=2, seq_len=256),
    "full-recompute": TrainingConfig(micro_batch_size=2, seq_len=256, recompute=Recompute.FULL),
    "lora": TrainingConfig(method=Method.LORA, micro_batch_size=2, seq_len=256),
    "lora-recompute": TrainingConfig(method=Method.LORA, micro_batch_size=2, seq_len=256, recompute=Recompute.FULL),
    "serve": ServingConfig(engine=Engine.HF, max_model_len=256, batch_size=2),
}
DEVICE = get_device("h100")
CUBLAS = runtime.cublas_workspace_bytes(DEVICE)


def error(family: str, job: str) -> tuple[float, str]:
    """(analytic - traced) / traced peak allocated without the cuBLAS workspace, and the traced peak's phase."""
    cfg = tiny_config(family)
    result = trace(cfg, JOBS[job], DEVICE)
    analytic = estimate(spec_from_config(cfg), JOBS[job], DEVICE).per_device.allocated_bytes - CUBLAS
    traced = result.per_device.peak_allocated_bytes - CUBLAS
    return (analytic - traced) / traced, result.per_device.peak_phase


def details(family: str, job: str) -> str:
    cfg = tiny_config(family)
    result = trace(cfg, JOBS[job], DEVICE)
    c = compare(result, estimate(spec_from_config(cfg), JOBS[job], DEVICE))
    lines = [f"#### {family} / {job} (peak in {c.peak_phase})", "", "| kind | analytic B | traced B |", "|---|---:|---:|"]
    lines += [f"| {r.name} | {r.analytic_bytes:,} | {r.traced_bytes:,} |" for r in (*c.kinds, c.allocated)]
    lines += ["", "| live at the traced peak | count | bytes |", "|---|---:|---:|"]
    lines += [f"| {g.kind.value}: {g.label} | {g.count} | {g.bytes:,} |" for g in result.per_device.groups]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--details", nargs="*", default=[], metavar="FAMILY/JOB")
    args = parser.parse_args()
    if args.details:
        for item in args.details:
            print(details(*item.split("/")))
        return
    print("| family (source) | " + " | ".join(JOBS) + " |")
    print("|---|" + "---:|" * len(JOBS))
    for family, source in TINY_SOURCES.items():
        cells = []
        for job in JOBS:
            e, phase = error(family, job)
            cells.append(f"{e:+.1%} ({phase})")
        print(f"| {family} ({source}) | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
