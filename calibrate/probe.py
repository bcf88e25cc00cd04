"""What is alive at the CPU peak: the tensors behind a ``memest calibrate --device cpu`` figure.

Usage::

    python calibrate/probe.py MODEL '{"train": true, "precision": "fp32", "micro_batch_size": 2, "seq_len": 128}'
    torchrun --nproc-per-node 2 calibrate/probe.py MODEL '{"train": true, "precision": "fsdp2", "zero_stage": 3}'

Runs the same protocol as ``memest calibrate`` (warm-up, then measured steps each profiled on its
own) and, for the last step, prints the operators running at the peak and the live tensors grouped
by profiler category and the operator that allocated them. With the categorised timeline (one
process) every live tensor is listed; when the timeline's data-flow analysis fails (FSDP2 over
gloo) the allocations made since the step began are replayed instead (tensors alive before the
step are then only in the total). This is how benchmarks/calibration_findings.md was written.
"""

from __future__ import annotations

import collections
import json
import sys
from typing import Any

from memest.calibration import measure
from memest.calibration import distributed, runner
from memest.calibration.request import Request

TOP = 16


def _ops(event: Any) -> str:
    names, p = [], event.parent
    while p is not None and len(names) < 2:
        if not p.name.startswith(("autograd::engine", "<built-in")):
            names.append(p.name.split("site-packages/")[-1][:70])
        p = p.parent
    return " < ".join(names) or "?"


def _context(event: Any) -> str:
    names, p = [], event.parent
    while p is not None:
        names.append(p.name[:50])
        p = p.parent
    return " < ".join(names[:4])


def live_at_peak(prof: Any) -> tuple[int, str, list[tuple[str, str, int, int]]]:
    """(peak bytes, what ran, [(category, allocating op, bytes, count)]) of one profile."""
    from torch._C._profiler import _EventType
    from torch.profiler._memory_profiler import Action, TensorKey

    tree_nodes = None
    try:
        mp = prof._memory_profile()
        tree_nodes = mp._op_tree.sorted_nodes
        op_of = {e.typed[1].id: _ops(e) for e in tree_nodes
                 if e.typed[0] == _EventType.Allocation and e.typed[1].alloc_size > 0}
        live: dict[Any, int] = {}
        best: tuple[int, dict[Any, int], int] = (-1, {}, 0)
        for t, action, (key, version), n in mp.timeline:
            if key.device.type != "cpu":
                continue
            if action in (Action.PREEXISTING, Action.CREATE):
                live[(key, version)] = n
            elif action == Action.INCREMENT_VERSION:
                live.pop((key, version), None)
                live[(key, version + 1)] = n
            else:
                live.pop((key, version), None)
            total = sum(live.values())
            if total > best[0]:
                best = (total, dict(live), t)
        groups: collections.Counter[tuple[str, str]] = collections.Counter()
        counts: collections.Counter[tuple[str, str]] = collections.Counter()
        for (key, version), n in best[1].items():
            cat = mp._categories.get(key, version) if isinstance(key, TensorKey) else None
            op = op_of.get(key.id, "(alive before the step)") if isinstance(key, TensorKey) else "?"
            groups[(cat.name if cat else "UNKNOWN", op)] += n
            counts[(cat.name if cat else "UNKNOWN", op)] += 1
        running = [e for e in tree_nodes if e.typed[0] != _EventType.Allocation
                   and e.start_time_ns <= best[2] <= e.start_time_ns + max(e.duration_time_ns, 0)]
        where = " < ".join(e.name[:50] for e in reversed(running[-4:]))
        return best[0], where, [(c, o, n, counts[(c, o)]) for (c, o), n in groups.most_common()]
    except AssertionError:
        from torch.profiler._memory_profiler import OpTree

        live2: dict[int, tuple[int, str]] = {}
        top: tuple[int, dict[int, tuple[int, str]], Any] = (-1, {}, None)
        for e in OpTree(prof.profiler.kineto_results).sorted_nodes:
            if e.typed[0] != _EventType.Allocation or e.typed[1].device.type != "cpu":
                continue
            f = e.typed[1]
            if f.alloc_size > 0:
                live2[f.ptr] = (f.alloc_size, _ops(e))
            else:
                live2.pop(f.ptr, None)
            if f.total_allocated > top[0]:
                top = (f.total_allocated, dict(live2), e)
        groups2: collections.Counter[str] = collections.Counter()
        counts2: collections.Counter[str] = collections.Counter()
        for size, op in top[1].values():
            groups2[op] += size
            counts2[op] += 1
        where = _context(top[2]) if top[2] is not None else "?"
        return top[0], where, [("(allocated in the step)", o, n, counts2[o]) for o, n in groups2.most_common()]


def main() -> None:
    model, flags = sys.argv[1], json.loads(sys.argv[2])
    captured: list[Any] = []
    real = measure.allocations_peak

    def spy(prof: Any, device: str = "cpu") -> int:
        captured.append(prof)
        return real(prof, device)

    measure.allocations_peak = spy
    env = distributed.DistEnv.from_environ()
    nproc = env.world_size if env else 1
    payload = runner.measure(Request(model=model, flags=flags, backend="cpu", nproc=nproc), env=env)
    m = payload["measurement"]
    peak, where, rows = live_at_peak(captured[-1])
    head = (f"rank {m['rank']}: measured {m['peak_allocated_bytes']:,} B ({m['peak_method']}), steps "
            f"{m['step_peak_bytes']}; last step's peak {peak:,} B")
    lines = [head, f"  running: {where}"]
    lines += [f"  {n:>12,} {c:>4}  {cat:24} {op}" for cat, op, n, c in rows[:TOP]]
    print("\n".join(lines), flush=True)
    if env is not None:
        distributed.destroy_process_group()


if __name__ == "__main__":
    main()
