"""Whole-process start-up time of ``memest hf MODEL --serve --json`` per catalog model, against Llama-2-7B.

The method of ``benchmarks/startup.md``: one warm-up, then counted runs, medians; each counted run of a
model is paired with a run of Llama-2-7B right after it (A B A B ...), so the ratio of each pair cancels
the load other work puts on a shared machine; the table quotes the median of those pairwise ratios.

    python benchmarks/startup_catalog.py [--runs 5] MODEL [MODEL ...]

Prints a markdown table (model, wall median, min - max, CPU s median, ratio to Llama-2-7B).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time

BASELINE = "meta-llama/Llama-2-7b-hf"


def _once(model: str) -> tuple[float, float]:
    """(wall s, CPU s) of one ``memest hf MODEL --serve --json`` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "memest", "hf", model, "--serve", "--json"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print("| model | wall (median) | min – max | CPU s | ratio to Llama-2-7B (pairwise median) |")
    print("|---|---:|---:|---:|---:|")
    for model in args.models:
        _once(model), _once(BASELINE)  # warm-up (page cache, .pyc)
        walls, cpus, ratios = [], [], []
        for _ in range(args.runs):
            wall, cpu = _once(model)
            base, _ = _once(BASELINE)
            walls.append(wall)
            cpus.append(cpu)
            ratios.append(wall / base)
        print(f"| `{model}` | {statistics.median(walls):.2f} s | {min(walls):.2f} – {max(walls):.2f} | "
              f"{statistics.median(cpus):.2f} | {statistics.median(ratios):.2f} |", flush=True)


if __name__ == "__main__":
    main()
