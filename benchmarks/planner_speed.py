"""How fast the planner evaluates setups on the analytic path (no torch), for benchmarks/planner_speed.md.

Three figures:

- **estimates/s**: ``memest.estimate.estimate`` calls per second over a fixed mix of setups (the
  raw estimator, what each candidate costs);
- **Llama-2-70B training estimates/s**: the same over a grid of distinct training setups of
  Llama-2-70B (parallel layouts, ZeRO stages, micro-batches, recompute, LoRA), each estimated once on
  a freshly loaded spec, so that nothing is remembered from an earlier pass: what a plan of that
  model pays per candidate;
- **planner**: ``memest.planning.search.plan`` over the whole catalog of devices, counting the setups it
  estimated (``Plan.evaluated``) and the setups it decided (``Plan.setups``: estimated, pruned, or
  ruled out by a cheaper fit) per second of wall time. Max queries are timed separately.

Run from the repository root: ``.venv/bin/python benchmarks/planner_speed.py [--repeat 5]``. Each
figure is the median of the repeats, timed in CPU seconds of this process (``time.process_time``):
on a machine shared with other jobs, wall time mostly measures the neighbours; the wall-clock
seconds of a whole plan are printed too. Point PYTHONPATH at another checkout to time its
estimator (``--estimator-only``, for a before/after comparison).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

from memest.devices import DEVICES, get_device
from memest.estimate import estimate
from memest.sources import load_model
from memest.workload import Parallelism, Recompute, ServingConfig, TrainingConfig

ESTIMATOR_MIX = [
    ("meta-llama/Llama-2-7b-hf", TrainingConfig(seq_len=4096, parallelism=Parallelism(dp=8, zero_stage=3))),
    ("meta-llama/Llama-2-7b-hf", TrainingConfig(micro_batch_size=4, recompute=Recompute.FULL,
                                                parallelism=Parallelism(tp=2, pp=2, dp=2, zero_stage=1))),
    ("meta-llama/Llama-2-70b-hf", TrainingConfig(parallelism=Parallelism(tp=8, pp=4, dp=4, zero_stage=3))),
    ("meta-llama/Llama-3.1-70B", ServingConfig(max_model_len=8192, batch_size=16, parallelism=Parallelism(tp=4))),
    ("meta-llama/Llama-3.1-405B", ServingConfig(max_model_len=8192, parallelism=Parallelism(tp=8, pp=2))),
    ("Qwen/Qwen2.5-0.5B", TrainingConfig(micro_batch_size=8, seq_len=8192)),
]

PLANS = [
    ("Llama-2-7B full training, mbs 8, seq 4096", "meta-llama/Llama-2-7b-hf", TrainingConfig(micro_batch_size=8, seq_len=4096), {}),
    ("Llama-2-70B full training, mbs 4, seq 4096", "meta-llama/Llama-2-70b-hf", TrainingConfig(micro_batch_size=4, seq_len=4096), {}),
    ("Llama-2-70B training, LoRA allowed", "meta-llama/Llama-2-70b-hf", TrainingConfig(micro_batch_size=4, seq_len=4096),
     {"allow_method_change": True}),
    ("Llama-3.1-405B full training, seq 8192", "meta-llama/Llama-3.1-405B", TrainingConfig(seq_len=8192), {}),
    ("Llama-3.1-70B serving, 8k x 16, quantization allowed", "meta-llama/Llama-3.1-70B",
     ServingConfig(max_model_len=8192, batch_size=16), {"allow_quantization": True}),
    ("Mixtral-8x7B full training, mbs 2, seq 4096", "mistralai/Mixtral-8x7B-v0.1", TrainingConfig(micro_batch_size=2, seq_len=4096), {}),
]


def median_time(fn, repeat: int, clock=time.process_time) -> float:
    times = []
    for _ in range(repeat):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def estimator_rate(repeat: int, n: int = 300) -> float:
    device = get_device("H100")
    jobs = [(load_model(m), w) for m, w in ESTIMATOR_MIX]

    def run() -> None:
        for _ in range(n):
            for spec, w in jobs:
                estimate(spec, w, device)

    run()  # warm: stage splits and stage tensor lists are cached after the first estimate
    return n * len(jobs) / median_time(run, repeat)


def training_grid() -> list[TrainingConfig]:
    """Distinct Llama-2-70B training setups, as a planner enumerates them (valid ones only)."""
    from memest.errors import InputError
    from memest.workload import Method, validate

    spec = load_model("meta-llama/Llama-2-70b-hf")
    grid = []
    for tp, pp in ((1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (8, 4), (4, 4)):
        for dp in (1, 4, 16):
            for zero in (0, 1, 2, 3):
                for method in (Method.FULL, Method.LORA):
                    for recompute in (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL):
                        for mbs in (1, 4):
                            w = TrainingConfig(method=method, micro_batch_size=mbs, seq_len=4096, recompute=recompute,
                                               grad_accum_steps=8 // mbs,
                                               parallelism=Parallelism(tp=tp, pp=pp, dp=dp, zero_stage=zero))
                            try:
                                validate(spec, w)
                            except InputError:  # an invalid combination: the planner skips it too
                                continue
                            grid.append(w)
    return grid


def training_grid_rate(repeat: int) -> tuple[float, int]:
    """(estimates per CPU second, setups) over :func:`training_grid`, each pass on a fresh spec."""
    device = get_device("H100")
    grid = training_grid()
    times = []
    for _ in range(repeat):
        spec = load_model("meta-llama/Llama-2-70b-hf")  # a new object: no remembered stage or layer results
        start = time.process_time()
        for w in grid:
            estimate(spec, w, device)
        times.append(time.process_time() - start)
    return len(grid) / statistics.median(times), len(grid)


def planner_rows(repeat: int) -> list[tuple[str, int, int, float, float, float]]:
    from memest.planning.search import DeviceChoice, Space, plan

    rows = []
    for label, model, workload, allow in PLANS:
        spec = load_model(model)
        space = Space(devices=tuple(DeviceChoice(d) for d in DEVICES), **allow)
        result = plan(spec, workload, space, max_queries=False)
        search = median_time(lambda: plan(spec, workload, space, max_queries=False), repeat)
        full = median_time(lambda: plan(spec, workload, space), repeat, clock=time.perf_counter)
        rows.append((label, result.evaluated, result.setups, search, result.evaluated / search, full))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--estimator-only", action="store_true")
    args = parser.parse_args()
    print(f"python {platform.python_version()} · {platform.machine()} · torch imported: {'torch' in sys.modules}")
    print(f"estimator: {estimator_rate(args.repeat):,.0f} estimates per CPU second over {len(ESTIMATOR_MIX)} setups "
          f"(median of {args.repeat})")
    rate, setups = training_grid_rate(args.repeat)
    print(f"Llama-2-70B training: {rate:,.0f} estimates per CPU second over {setups} distinct setups, fresh spec "
          f"(median of {args.repeat})")
    if args.estimator_only:
        return
    print()
    print("| plan (26 device types, up to 1024 each) | estimated | decided | search CPU s | estimates/s | decided/s "
          "| whole plan, wall s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, evaluated, setups, search, rate, full in planner_rows(args.repeat):
        print(f"| {label} | {evaluated:,} | {setups:,} | {search:.2f} | {rate:,.0f} | {setups / search:,.0f} | {full:.2f} |")
    print(f"\ntorch imported: {'torch' in sys.modules}")


if __name__ == "__main__":
    main()
