"""How long ``memest.trace`` takes: Llama-2-7B and Llama-2-70B training steps at seq_len 4096.

Each case runs ``--repeats`` times, each in a fresh Python process, and prints:

- ``trace s``: :attr:`memest.trace.TraceResult.seconds` — model build on meta, the traced step
  (warm-up optimizer step, forward, backward, optimizer step), the allocator replay and summary;
- ``process s``: the whole process (Python start, torch + transformers import, config load,
  trace) — what ``memest hf ... --trace`` adds to a run.

Usage: ``.venv/bin/python benchmarks/trace_speed.py [--repeats 3] [--markdown]``. The machine
is shared, so run it a few times and report the spread (benchmarks/trace_speed.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

CASES = {
    "Llama-2-7B train s=4096 (mixed, b=1)": ("meta-llama/Llama-2-7b-hf", {"seq_len": 4096}),
    "Llama-2-70B train s=4096 (mixed, b=1)": ("meta-llama/Llama-2-70b-hf", {"seq_len": 4096}),
    "Llama-2-7B train s=4096 recompute full": ("meta-llama/Llama-2-7b-hf", {"seq_len": 4096, "recompute": "full"}),
    "Llama-2-7B FSDP2 N=1024 s=4096": ("meta-llama/Llama-2-7b-hf",
                                        {"seq_len": 4096, "precision": "fsdp2", "dp": 1024, "zero_stage": 3}),
}

CHILD = """
import json, sys, time
from memest.sources import load_config
from memest.trace import trace
from memest.workload import Parallelism, Precision, Recompute, TrainingConfig
model, kw = sys.argv[1], json.loads(sys.argv[2])
par = Parallelism(dp=kw.pop("dp", 1), zero_stage=kw.pop("zero_stage", 0))
if "precision" in kw: kw["precision"] = Precision(kw["precision"])
if "recompute" in kw: kw["recompute"] = Recompute(kw["recompute"])
r = trace(load_config(model), TrainingConfig(parallelism=par, **kw))
print(json.dumps({"trace_s": r.seconds, "ops": r.num_ops, "peak": r.per_device.peak_allocated_bytes}))
"""


def run_case(model: str, kw: dict) -> tuple[float, float, int, int]:
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD, model, json.dumps(kw)], capture_output=True, text=True,
                         check=True)
    wall = time.perf_counter() - started
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    return doc["trace_s"], wall, doc["ops"], doc["peak"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args()
    rows = []
    for name, (model, kw) in CASES.items():
        traces, walls = [], []
        for _ in range(args.repeats):
            t, w, ops, peak = run_case(model, dict(kw))
            traces.append(t)
            walls.append(w)
            print(f"{name}: trace {t:.2f} s, process {w:.2f} s", file=sys.stderr)
        rows.append((name, traces, walls, ops, peak))
    if args.markdown:
        print("| case | trace s (median, min-max) | process s (median, min-max) | operators | peak allocated GiB |")
        print("|---|---:|---:|---:|---:|")
    for name, traces, walls, ops, peak in rows:
        t = f"{statistics.median(traces):.2f} ({min(traces):.2f}-{max(traces):.2f})"
        w = f"{statistics.median(walls):.2f} ({min(walls):.2f}-{max(walls):.2f})"
        if args.markdown:
            print(f"| {name} | {t} | {w} | {ops:,} | {peak / 2**30:,.2f} |")
        else:
            print(f"{name:45s} trace {t:>20s}  process {w:>20s}  {ops:>7,} ops  peak {peak / 2**30:,.2f} GiB")


if __name__ == "__main__":
    main()
