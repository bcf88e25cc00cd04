"""The measurement protocol around the steps, on one process, and where the processes come from.

:func:`measure` (one process): pick the device and create its meter before any tensor exists
(the CUDA context is read then), build the model, run one warm-up step, start the meter
(baseline), run the measured steps, read the figures. An out-of-memory anywhere is a result:
the figures at the failure are returned with ``outcome="oom"``. Whatever happens — success,
out-of-memory, Ctrl-C — the model and optimizer are dropped and the allocator's cache is
emptied before returning, so the device is released.

:func:`run`: in-process for one process; under torchrun (already inside, or launched here for
``--nproc`` > 1) each rank measures and rank 0 gathers.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memest.calibration.request import (
    DEFAULT_TRAIN_STEPS,
    Request,
    calibration_workload,
    check_supported,
)
from memest.errors import InputError
from memest.sources import load_config, spec_from_config
from memest.workload import ServingConfig, TrainingConfig

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


def resolve_backend(backend: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a CUDA device, else ``cpu``."""
    if backend != "auto":
        return backend
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def default_steps(request: Request, workload: Any, spec: Any) -> int:
    """The measured steps: training steps (the request's, else 3), or the decode steps the serving
    estimate models (see :func:`~memest.calibration.request.calibration_workload`).

    Raises:
        InputError: fewer than 2 steps.
    """
    if isinstance(workload, ServingConfig):
        from memest.estimate.serving.hf.generate import lengths  # the decode steps the estimate models

        return lengths(spec, workload).new
    steps = request.steps if request.steps is not None else DEFAULT_TRAIN_STEPS
    if steps < 2:
        raise InputError(f"{{steps}} {steps}: measure at least 2 steps (the first after warm-up can miss "
                         "steady-state buffers)", field="steps")
    return steps


def environment(backend: str) -> dict[str, Any]:
    """Versions and device facts for the record: memest, torch, transformers, peft, CUDA, driver."""
    import torch

    from memest.calibration.measure import driver_version

    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    out: dict[str, Any] = {
        "memest": version("memest"),
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "peft": version("peft"),
        "bitsandbytes": version("bitsandbytes"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cuda": torch.version.cuda,
        "driver": None,
        "device_capability": None,
        "cpu_threads": torch.get_num_threads(),
    }
    if backend == "cuda":
        out["driver"] = driver_version()
        out["cudnn"] = torch.backends.cudnn.version()
        major, minor = torch.cuda.get_device_capability()
        out["device_capability"] = f"{major}.{minor}"
        nccl = getattr(torch.cuda, "nccl", None)
        if nccl is not None and hasattr(nccl, "version"):
            out["nccl"] = ".".join(str(v) for v in nccl.version())
    return out


def measure(request: Request, *, progress: Progress = _quiet, env: Any = None) -> dict[str, Any]:
    """Measure ``request`` on this process's device; the payload rank 0 gathers.

    Args:
        request: What to run.
        progress: Called with a short line at each stage.
        env: This process's :class:`~memest.calibration.distributed.DistEnv` under torchrun.

    Returns:
        ``{"measurement": Measurement.to_dict(), "static": {...}, "environment": {...}}``.

    Raises:
        MemestError: bad input (caught before any tensor is created where possible).
    """
    from memest.calibration import distributed
    from memest.calibration.measure import CpuMeter, CudaMeter, first_line, is_out_of_memory
    from memest.calibration.models import import_stack

    torch, _ = import_stack()
    cfg = load_config(request.model)
    job = request.job()
    spec = spec_from_config(cfg, trust_remote_code=bool(job["trust_remote_code"]))
    workload = calibration_workload(job, spec, request.nproc, request.steps)
    backend = resolve_backend(request.backend)
    check_supported(workload, backend=backend, nproc=request.nproc, spec=spec)
    steps = default_steps(request, workload, spec)
    rank, world = (env.rank, env.world_size) if env is not None else (0, 1)
    meter: Any = CudaMeter(env.local_rank if env is not None else 0) if backend == "cuda" else CpuMeter()
    device = getattr(meter, "device", torch.device("cpu"))
    started_group = False
    if distributed.needs_process_group(workload, world):
        started_group = distributed.init_process_group(backend, env)
    session: Any = None
    error: str | None = None
    times: list[float] = []
    static: dict[str, int] = {}
    try:
        try:
            progress(f"building {spec.name} on {device} with random weights" if not request.weights
                     else f"loading {spec.name} weights onto {device}")
            session = _prepare(cfg, spec, workload, request, device=device, steps=steps, world=world)
            progress("warm-up step")
            session.warmup()
            _sync(torch, device)
            meter.start(live_bytes=session.live_bytes())
            runs = steps if isinstance(workload, TrainingConfig) else 1
            for i in range(runs):
                if i:
                    meter.lap(live_bytes=session.live_bytes())
                progress(f"measured step {i + 1}/{steps}" if isinstance(workload, TrainingConfig)
                         else f"prefill {session.prompt_len} tokens x {session.batch_size}, decode {session.new_tokens} steps")
                t0 = time.perf_counter()
                session.step()
                _sync(torch, device)
                times.append(time.perf_counter() - t0)
            static = session.static_bytes()
        except BaseException as exc:
            if not is_out_of_memory(exc):
                raise
            error = first_line(exc)
        progress("reading the figures" if error is None else f"out of memory: {error}")
        measurement = meter.stop(steps, step_seconds=tuple(times), error=error, rank=rank, world_size=world)
    finally:
        session = None
        meter.release()
        if started_group and env is None:
            distributed.destroy_process_group()
    return {"measurement": measurement.to_dict(), "static": static, "environment": environment(backend)}


def _sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _prepare(cfg: Any, spec: Any, workload: Any, request: Request, *, device: Any, steps: int, world: int) -> Any:
    from memest.calibration import distributed
    from memest.calibration.models import build_model, torch_dtype
    from memest.estimate.serving.common import weight_dtype

    vocab = spec.vocab_size
    checkpoint = request.model if request.weights else None
    if isinstance(workload, ServingConfig):
        from memest.calibration.serving import prepare_serving

        model = build_model(cfg, spec, device=device, dtype=torch_dtype(weight_dtype(spec, workload)),
                            attn_implementation="sdpa", checkpoint=checkpoint)
        return prepare_serving(model, spec, workload, device=device, vocab_size=vocab)
    from memest.calibration.training import model_dtype, prepare_training, quantize_nf4
    from memest.workload import Method

    qlora = workload.method is Method.QLORA
    import torch

    model = build_model(cfg, spec, device=torch.device("cpu") if qlora else device,
                        dtype=torch_dtype(model_dtype(workload)),
                        attn_implementation=getattr(workload.attn_implementation, "value", workload.attn_implementation),
                        checkpoint=checkpoint)
    if qlora:
        model = quantize_nf4(model, device)
    return prepare_training(model, spec, workload, device=device, wrap=distributed.wrapper(workload, world, device),
                            vocab_size=vocab)


def run(request: Request, *, progress: Progress = _quiet) -> list[dict[str, Any]] | None:
    """Every rank's payload (rank order), or None on a non-zero rank of a torchrun job.

    One process: measured here. ``--nproc`` N outside torchrun: launched under torchrun. Inside
    torchrun / accelerate: this rank measures; rank 0 gathers.

    Raises:
        InputError: torchrun's world size differs from ``--nproc``.
        LaunchError: the launched job failed without figures.
    """
    from memest.calibration import distributed

    env = distributed.DistEnv.from_environ()
    if env is None:
        if request.nproc == 1:
            return [measure(request, progress=progress)]
        return distributed.launch(request.to_dict(), request.nproc, progress=progress)
    if env.world_size != request.nproc and request.nproc != 1:
        raise InputError(f"{{nproc}} {request.nproc} differs from the torchrun world size {env.world_size}; "
                         f"drop {{nproc}} inside torchrun", field="nproc")
    request = Request.from_dict(dict(request.to_dict(), nproc=env.world_size))
    payload = measure(request, progress=progress if env.rank == 0 else _quiet, env=env)
    if payload["measurement"]["outcome"] != "ok":
        # the others wait in a collective that will never complete: report alone; torchrun stops them
        run_dir = os.environ.get(distributed.RUN_DIR_ENV)
        if run_dir is None:
            return [payload]
        write_json(Path(run_dir) / f"rank-{env.rank}.json", payload)
        raise SystemExit(distributed.EXIT_OOM)
    gathered = distributed.gather(payload, env)
    distributed.destroy_process_group()
    return gathered


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically (a temporary file, then ``os.replace``)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
