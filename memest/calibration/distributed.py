"""Many devices: torchrun, DDP / FSDP2, and per-rank figures gathered on rank 0.

``memest calibrate --nproc N`` (outside torchrun) writes the request to a temporary folder and
starts ``python -m torch.distributed.run --standalone --nproc-per-node N -m
memest.calibration.worker``; each worker measures its own device, rank 0 gathers every rank's
figures with ``dist.gather_object`` and writes them back, and the calling process compares and
records. Run inside ``torchrun`` or ``accelerate launch`` (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``
set), ``memest calibrate`` measures in place and rank 0 reports.

Backends: NCCL on CUDA (one device per process, ``cuda:LOCAL_RANK``), gloo on CPU. Wrapping
follows the ZeRO stage: 0 -> ``DistributedDataParallel`` (default buckets); 2 -> FSDP2 ``fully_shard(reshard_after_forward=False)``
(SHARD_GRAD_OP); 3, or ``--precision fsdp2`` -> ``fully_shard`` on every decoder layer, then on the
model (FULL_SHARD; torchtitan's and accelerate's wrapping).

An out-of-memory on one rank cannot be gathered (the others wait in a collective): that rank
writes its own figures to the run folder and exits with code 3; torchrun then stops the others.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from memest.errors import MemestError
from memest.workload import Precision, TrainingConfig

RUN_DIR_ENV = "MEMEST_CALIBRATE_RUN_DIR"
"""Set by the launching process: where workers write ``result.json`` (rank 0) and ``rank-N.json``
(a rank that ran out of memory)."""
TIMEOUT = timedelta(minutes=10)
"""Collective timeout: a rank stuck behind a failed peer gives up after this."""
EXIT_OOM = 3


class LaunchError(MemestError):
    """torchrun failed without a result (a crash, not an out-of-memory)."""


@dataclass(frozen=True, slots=True)
class DistEnv:
    """This process's place in a torchrun / accelerate job.

    Attributes:
        rank: Global rank.
        world_size: Processes in the job.
        local_rank: Rank on this node (the CUDA ordinal).
    """

    rank: int
    world_size: int
    local_rank: int

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> DistEnv | None:
        """The job torchrun / accelerate described in the environment, or None outside one."""
        env = os.environ if environ is None else environ
        if "RANK" not in env or "WORLD_SIZE" not in env:
            return None
        return cls(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", env["RANK"])))


def init_process_group(backend_device: str, env: DistEnv | None) -> bool:
    """Start torch.distributed for ``env`` (NCCL on CUDA, gloo on CPU); a one-process group
    (in-memory store) when ``env`` is None. Returns True when this call started it."""
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    backend = "nccl" if backend_device == "cuda" else "gloo"
    if env is None:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=TIMEOUT)
    else:
        dist.init_process_group(backend, timeout=TIMEOUT)
    return True


def destroy_process_group() -> None:
    """Stop torch.distributed if it runs."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def needs_process_group(t: Any, world_size: int) -> bool:
    """True when the workload runs under DDP / FSDP2 (more than one process, or FSDP2 on one)."""
    if world_size > 1:
        return True
    return isinstance(t, TrainingConfig) and (t.precision is Precision.FSDP2 or t.parallelism.zero_stage >= 2)


def wrapper(t: TrainingConfig, world_size: int, device: Any) -> Any:
    """A function that applies ``t``'s data parallelism to a model and returns what to call."""

    def wrap(model: Any) -> Any:
        import torch

        z = t.parallelism.zero_stage
        if t.precision is Precision.FSDP2 or z >= 2:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            from memest.calibration.models import decoder_layers

            mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                  if t.precision is Precision.FSDP2 else MixedPrecisionPolicy())
            reshard = z != 2
            for layer in decoder_layers(model):
                fully_shard(layer, mp_policy=mp, reshard_after_forward=reshard)
            fully_shard(model, mp_policy=mp, reshard_after_forward=reshard)
            return model
        if world_size > 1:
            from torch.nn.parallel import DistributedDataParallel

            return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        return model

    return wrap


def gather(payload: dict[str, Any], env: DistEnv) -> list[dict[str, Any]] | None:
    """Every rank's payload on rank 0 (``dist.gather_object``), in rank order; None elsewhere."""
    import torch.distributed as dist

    out: list[Any] | None = [None] * env.world_size if env.rank == 0 else None
    dist.gather_object(payload, out, dst=0)
    return out


def launch(request: dict[str, Any], nproc: int, *, progress: Any = None) -> list[dict[str, Any]]:
    """Run the request under ``torchrun --nproc-per-node nproc`` and return every rank's payload.

    Raises:
        LaunchError: torchrun failed and left no figures (the message has its last output lines).
    """
    with tempfile.TemporaryDirectory(prefix="memest-calibrate-") as tmp:
        run_dir = Path(tmp)
        (run_dir / "request.json").write_text(json.dumps(request))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "memest.calibration.worker", str(run_dir / "request.json")]
        env = dict(os.environ, **{RUN_DIR_ENV: str(run_dir)})
        env.setdefault("OMP_NUM_THREADS", "1")
        if progress is not None:
            progress(f"launching {nproc} processes: torchrun --nproc-per-node {nproc}")
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        tail: list[str] = []
        worker_error = None
        for line in proc.stdout or ():
            line = line.rstrip()
            tail = (tail + [line])[-20:]
            if line.startswith("[memest] Error: "):
                worker_error = line.removeprefix("[memest] Error: ")
            elif progress is not None and line.startswith("[memest]"):
                progress(line.removeprefix("[memest]").strip())
        code = proc.wait()
        result = run_dir / "result.json"
        if result.exists():
            return json.loads(result.read_text())
        failed = sorted(run_dir.glob("rank-*.json"))
        if failed:
            return [json.loads(p.read_text()) for p in failed]
        if worker_error is not None:
            raise LaunchError(worker_error)
        raise LaunchError(f"torchrun exited with code {code} and no measurement; last output: "
                          + " | ".join(tail[-6:]))
