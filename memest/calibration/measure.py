"""Measuring real memory on a device: the backends behind ``memest calibrate``.

Two meters share one protocol: the caller builds the model and runs a warm-up step, :meth:`start`
records a baseline, the caller runs N >= 2 steps, :meth:`stop` reads the peaks into a
:class:`Measurement`. :class:`CudaMeter` reads the caching allocator's statistics, the CUDA
context and NVML; :class:`CpuMeter` the profiler's memory timeline (:func:`timeline_peak`) and its
allocation events (:func:`allocations_peak`), one step at a time. What each figure means and why:
DESIGN.md, "Measuring (calibrate)".

torch is imported inside the functions and methods of this module only; importing it is cheap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from memest.errors import MissingDependencyError

CPU_CATEGORIES = ("PARAMETER", "OPTIMIZER_STATE", "INPUT", "TEMPORARY", "ACTIVATION", "GRADIENT", "AUTOGRAD_DETAIL",
                  "UNKNOWN")
"""The profiler memory timeline's categories (``torch.profiler._memory_profiler.Category``, plus
UNKNOWN for storages it could not attribute)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """What one process measured over the measured steps. Bytes are ints; None = not available.

    Attributes:
        backend: ``cuda`` or ``cpu``.
        device_name: The device as the runtime names it (``NVIDIA H100 80GB HBM3``, ``cpu``).
        steps: Measured steps (after the warm-up).
        outcome: ``ok``, or ``oom`` when the device ran out of memory (the figures are then those
            at the failure).
        error: The first line of the out-of-memory message.
        rank: This process's rank (0 without torch.distributed).
        world_size: Processes in the job.
        peak_allocated_bytes: CUDA ``allocated_bytes.all.peak`` over the measured steps; CPU the
            memory timeline's peak of the smallest step (see :class:`CpuMeter`).
        peak_reserved_bytes: CUDA ``reserved_bytes.all.peak`` (None on CPU).
        peak_active_bytes: CUDA ``active_bytes.all.peak``.
        peak_requested_bytes: CUDA ``requested_bytes.all.peak`` (before 512 B rounding).
        baseline_allocated_bytes: Allocated when the measured steps began (weights, and optimizer
            states created by the warm-up step).
        baseline_reserved_bytes: Reserved then (CUDA).
        reserved_end_bytes: Reserved after the steps (CUDA).
        num_alloc_retries: cudaMalloc retries after a cache flush during the steps.
        num_ooms: Out-of-memory errors raised during the steps.
        cuda_context_bytes: Device memory the process used after CUDA initialised, before any tensor.
        context_method: How the context was read: ``nvml_process``, ``nvml_device_delta``, or
            ``mem_get_info`` (includes other processes on the device).
        device_total_bytes: ``mem_get_info`` total (CUDA) or physical RAM (CPU).
        device_free_end_bytes: ``mem_get_info`` free after the steps.
        nvml_used_before_bytes: NVML device used before CUDA initialised (other processes).
        nvml_device_used_bytes: NVML device used after the steps (nvidia-smi's figure).
        nvml_process_used_bytes: NVML used by this process after the steps (None when the driver
            does not list our pid, e.g. in a container with its own pid namespace).
        by_category: CPU: bytes per timeline category at the peak.
        peak_method: CPU: ``timeline`` (the categorised memory timeline) or ``allocations`` (live
            tensors at the start + the allocator's running total; the timeline failed).
        allocations_peak_bytes: CPU: the second figure (see the module docstring).
        timeline_error: CPU: why the timeline failed, when it did.
        step_peak_bytes: Peak allocated of each measured step (CPU: each step profiled alone;
            CUDA: peak statistics reset between steps).
        step_seconds: Wall time of each measured step (noisy; for progress only).
    """

    backend: str
    device_name: str
    steps: int
    outcome: str = "ok"
    error: str | None = None
    rank: int = 0
    world_size: int = 1
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    peak_active_bytes: int | None = None
    peak_requested_bytes: int | None = None
    baseline_allocated_bytes: int | None = None
    baseline_reserved_bytes: int | None = None
    reserved_end_bytes: int | None = None
    num_alloc_retries: int = 0
    num_ooms: int = 0
    cuda_context_bytes: int | None = None
    context_method: str | None = None
    device_total_bytes: int | None = None
    device_free_end_bytes: int | None = None
    nvml_used_before_bytes: int | None = None
    nvml_device_used_bytes: int | None = None
    nvml_process_used_bytes: int | None = None
    by_category: dict[str, int] = field(default_factory=dict)
    peak_method: str | None = None
    allocations_peak_bytes: int | None = None
    timeline_error: str | None = None
    step_peak_bytes: tuple[int, ...] = ()
    step_seconds: tuple[float, ...] = ()

    @property
    def fits(self) -> bool:
        """True when the steps ran without running out of memory."""
        return self.outcome == "ok"

    @property
    def non_torch_bytes(self) -> int | None:
        """Device memory outside PyTorch's allocator after the steps: context, cuBLAS/NCCL handles.

        NVML process used - reserved now; without the per-process figure, NVML device used minus
        what the device used before CUDA initialised (other processes) - reserved now.
        """
        if self.reserved_end_bytes is None:
            return None
        if self.nvml_process_used_bytes is not None:
            return self.nvml_process_used_bytes - self.reserved_end_bytes
        if self.nvml_device_used_bytes is not None and self.nvml_used_before_bytes is not None:
            return self.nvml_device_used_bytes - self.nvml_used_before_bytes - self.reserved_end_bytes
        return None

    @property
    def device_used_bytes(self) -> int | None:
        """What nvidia-smi would show for this process at the peak: peak reserved + non-torch memory."""
        non_torch = self.non_torch_bytes
        if self.peak_reserved_bytes is None or non_torch is None:
            return None
        return self.peak_reserved_bytes + non_torch

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON records (derived figures included under their property names)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["step_seconds"] = list(self.step_seconds)
        out["step_peak_bytes"] = list(self.step_peak_bytes)
        out["non_torch_bytes"] = self.non_torch_bytes
        out["device_used_bytes"] = self.device_used_bytes
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        """Inverse of :meth:`to_dict` (derived figures are recomputed, unknown keys ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["step_seconds"] = tuple(values.get("step_seconds", ()))
        values["step_peak_bytes"] = tuple(values.get("step_peak_bytes", ()))
        values["by_category"] = dict(values.get("by_category") or {})
        return cls(**values)


def is_out_of_memory(exc: BaseException) -> bool:
    """True for an out-of-memory error: ``torch.OutOfMemoryError`` (CUDA) or the CPU allocator's
    ``RuntimeError: ... can't allocate memory`` (``c10/core/impl/alloc_cpu.cpp``)."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message``, for records."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


_PEAK_KEYS = ("allocated_bytes.all.peak", "reserved_bytes.all.peak", "active_bytes.all.peak", "requested_bytes.all.peak")
"""The ``memory_stats`` peaks carried across :meth:`CudaMeter.lap` resets."""


# ---- NVML ----


class Nvml:
    """NVML readings of one device (``pynvml`` from nvidia-ml-py). Open with :meth:`open`."""

    def __init__(self, pynvml: Any, handle: Any) -> None:
        self._nvml = pynvml
        self._handle = handle

    @classmethod
    def open(cls, cuda_index: int) -> Nvml | None:
        """The NVML handle of CUDA device ``cuda_index`` (honouring CUDA_VISIBLE_DEVICES), or None
        when nvidia-ml-py is not installed or the driver does not answer."""
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(_nvml_index(cuda_index))
        except pynvml.NVMLError:
            return None
        return cls(pynvml, handle)

    def device_used(self) -> int:
        """Device memory used by every process (nvidia-smi's 'Memory-Usage'), bytes."""
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def process_used(self, pid: int) -> int | None:
        """Device memory used by process ``pid``, or None when the driver does not list it."""
        for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle):
            if proc.pid == pid and proc.usedGpuMemory is not None:
                return int(proc.usedGpuMemory)
        return None

    def driver_version(self) -> str:
        """The driver release (``550.54.15``)."""
        version = self._nvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)


def _nvml_index(cuda_index: int) -> int:
    """NVML's index of a CUDA ordinal: CUDA_VISIBLE_DEVICES renumbers devices, NVML does not."""
    import torch

    try:
        return int(torch.cuda._get_nvml_device_index(cuda_index))  # private, but the mapping PyTorch itself uses
    except (AttributeError, RuntimeError, ValueError):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if ids and all(v.isdigit() for v in ids) and cuda_index < len(ids):
            return int(ids[cuda_index])
        return cuda_index


def driver_version() -> str | None:
    """The NVIDIA driver release from NVML, or None without nvidia-ml-py or a driver."""
    nvml = Nvml.open(0)
    return nvml.driver_version() if nvml is not None else None


# ---- CUDA ----


class CudaMeter:
    """Measure one CUDA device. Create it before any tensor is put on the device.

    Args:
        index: The CUDA ordinal (``LOCAL_RANK`` under torchrun).
        running: The job's tensors already exist (a meter created inside a running job,
            :mod:`memest.integrations`): the CUDA context cannot be told apart from them (``cuda_context_bytes``
            None), and NVML's device used now is no baseline of other processes (the non-torch figure then
            needs NVML's per-process reading).

    Raises:
        MissingDependencyError: torch has no CUDA, or no device ``index``.
    """

    backend = "cuda"

    def __init__(self, index: int = 0, *, running: bool = False) -> None:
        import torch

        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise MissingDependencyError(
                f"no CUDA device {index} (torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}); "
                "install a CUDA build of torch or use {device} cpu", field="device"
            )
        self.index = index
        self.device = torch.device("cuda", index)
        self.nvml = Nvml.open(index)
        self._used_before = self.nvml.device_used() if self.nvml is not None else None
        torch.cuda.set_device(index)
        torch.cuda.init()
        torch.cuda.synchronize(index)  # creates the primary context; no tensor yet
        free, total = torch.cuda.mem_get_info(index)
        self.device_total_bytes = int(total)
        self.device_name = torch.cuda.get_device_name(index)
        self.capability = torch.cuda.get_device_capability(index)
        self.context_bytes, self.context_method = self._context(total - free)
        if running:
            self.context_bytes, self.context_method, self._used_before = None, None, None
        self._baseline: dict[str, int] = {}
        self._step_peaks: list[int] = []
        self._maxima: dict[str, int] = {}

    def _context(self, used_by_all: int) -> tuple[int, str]:
        if self.nvml is not None:
            mine = self.nvml.process_used(os.getpid())
            if mine is not None:
                return mine, "nvml_process"
            if self._used_before is not None:
                return self.nvml.device_used() - self._used_before, "nvml_device_delta"
        return int(used_by_all), "mem_get_info"

    def start(self, live_bytes: int | None = None) -> None:
        """After the warm-up: free the cache, reset the peaks and counters, record the baseline.

        Args:
            live_bytes: Unused (the allocator's own counters give the baseline).
        """
        import torch

        gc.collect()
        torch.cuda.synchronize(self.index)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.index)
        torch.cuda.reset_accumulated_memory_stats(self.index)
        stats = torch.cuda.memory_stats(self.index)
        self._baseline = {
            "allocated": int(stats.get("allocated_bytes.all.current", 0)),
            "reserved": int(stats.get("reserved_bytes.all.current", 0)),
        }

    def lap(self, live_bytes: int | None = None) -> None:
        """Between measured steps: keep the step's peak, reset the peak statistics for the next."""
        import torch

        torch.cuda.synchronize(self.index)
        stats = torch.cuda.memory_stats(self.index)
        self._step_peaks.append(int(stats.get("allocated_bytes.all.peak", 0)))
        self._maxima = {key: max(self._maxima.get(key, 0), int(stats[key])) for key in _PEAK_KEYS if key in stats}
        torch.cuda.reset_peak_memory_stats(self.index)

    def stop(self, steps: int, *, step_seconds: tuple[float, ...] = (), error: str | None = None,
             rank: int = 0, world_size: int = 1) -> Measurement:
        """Read the peaks of the measured steps (or, after an out-of-memory ``error``, at the failure)."""
        import torch

        torch.cuda.synchronize(self.index)
        stats = dict(torch.cuda.memory_stats(self.index))
        if error is None:
            self._step_peaks.append(int(stats.get("allocated_bytes.all.peak", 0)))
        for key in _PEAK_KEYS:  # the peaks of earlier laps
            if key in stats or key in self._maxima:
                stats[key] = max(int(stats.get(key, 0)), self._maxima.get(key, 0))
        free, total = torch.cuda.mem_get_info(self.index)
        pid_used = self.nvml.process_used(os.getpid()) if self.nvml is not None else None
        dev_used = self.nvml.device_used() if self.nvml is not None else None
        return Measurement(
            backend="cuda",
            device_name=self.device_name,
            steps=steps,
            outcome="oom" if error is not None else "ok",
            error=error,
            rank=rank,
            world_size=world_size,
            peak_allocated_bytes=int(stats.get("allocated_bytes.all.peak", 0)),
            peak_reserved_bytes=int(stats.get("reserved_bytes.all.peak", 0)),
            peak_active_bytes=int(stats.get("active_bytes.all.peak", 0)),
            peak_requested_bytes=int(stats["requested_bytes.all.peak"]) if "requested_bytes.all.peak" in stats else None,
            baseline_allocated_bytes=self._baseline.get("allocated"),
            baseline_reserved_bytes=self._baseline.get("reserved"),
            reserved_end_bytes=int(stats.get("reserved_bytes.all.current", 0)),
            num_alloc_retries=int(stats.get("num_alloc_retries", 0)),
            num_ooms=int(stats.get("num_ooms", 0)),
            cuda_context_bytes=self.context_bytes,
            context_method=self.context_method,
            device_total_bytes=int(total),
            device_free_end_bytes=int(free),
            nvml_used_before_bytes=self._used_before,
            nvml_device_used_bytes=dev_used,
            nvml_process_used_bytes=pid_used,
            step_peak_bytes=tuple(self._step_peaks),
            step_seconds=step_seconds,
        )

    def release(self) -> None:
        """Give cached blocks back to the device (after the model and optimizer are dropped)."""
        import torch

        gc.collect()
        torch.cuda.synchronize(self.index)
        torch.cuda.empty_cache()


# ---- CPU ----


class CpuMeter:
    """Measure tensors on the CPU with the profiler's memory timeline (see the module docstring).

    Each measured step is profiled on its own (:meth:`lap` closes one profile and opens the next),
    so a free the profiler missed in one step (see the module docstring on gloo) cannot inflate the
    next. The measured steps are identical (after the warm-up) and a missed free only ever adds
    bytes, so the figure is the smallest step peak; every step's peak is kept. In one process all
    steps agree to the byte (tested).
    """

    backend = "cpu"

    def __init__(self) -> None:
        self.device_name = "cpu"
        self.device_total_bytes = physical_memory()
        self.context_bytes = None
        self._prof: Any = None
        self._live: int | None = None
        self._laps: list[_Lap] = []

    def start(self, live_bytes: int | None = None) -> None:
        """After the warm-up: start profiling the first measured step.

        Args:
            live_bytes: Bytes of the tensors the job holds now (for the allocations figure).
        """
        from torch.profiler import ProfilerActivity, profile

        gc.collect()
        self._live = live_bytes
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                             with_stack=True)
        with _quiet_native_stderr():
            self._prof.__enter__()

    def lap(self, live_bytes: int | None = None) -> None:
        """Between measured steps: analyse the step just profiled, start profiling the next."""
        self._close()
        self.start(live_bytes)

    def _close(self) -> None:
        prof, self._prof = self._prof, None
        if prof is None:
            return
        with _quiet_native_stderr():
            prof.__exit__(None, None, None)
        delta = allocations_peak(prof)
        alloc_peak = self._live + delta if self._live is not None else None
        try:
            peak, baseline, by_category = timeline_peak(prof)
            self._laps.append(_Lap(peak, baseline, by_category, "timeline", alloc_peak, None))
        except AssertionError as exc:  # the profiler's data-flow analysis gives up on some graphs
            self._laps.append(_Lap(alloc_peak, self._live, {}, "allocations", alloc_peak, first_line(exc)[:300]))

    def stop(self, steps: int, *, step_seconds: tuple[float, ...] = (), error: str | None = None,
             rank: int = 0, world_size: int = 1) -> Measurement:
        """Stop profiling and take the largest step's peak, by category."""
        if error is None:
            self._close()
        elif self._prof is not None:
            with _quiet_native_stderr():
                self._prof.__exit__(None, None, None)
            self._prof = None
        laps = [lap for lap in self._laps if lap.peak is not None]
        # the steps after the warm-up are identical and a missed free (gloo) only ever adds bytes:
        # the smallest step peak is the truest; every step's peak is kept
        worst = min(laps, key=lambda lap: lap.peak or 0) if laps and error is None else None
        return Measurement(
            backend="cpu",
            device_name=self.device_name,
            steps=steps,
            outcome="oom" if error is not None else "ok",
            error=error,
            rank=rank,
            world_size=world_size,
            peak_allocated_bytes=worst.peak if worst else None,
            baseline_allocated_bytes=worst.baseline if worst else None,
            device_total_bytes=self.device_total_bytes,
            by_category=worst.by_category if worst else {},
            peak_method=worst.method if worst else None,
            allocations_peak_bytes=max((lap.allocations or 0) for lap in laps) if laps else None,
            timeline_error=next((lap.error for lap in self._laps if lap.error), None),
            step_peak_bytes=tuple(lap.peak or 0 for lap in laps),
            step_seconds=step_seconds,
        )

    def release(self) -> None:
        """Stop a running profile and collect garbage (the CPU allocator frees memory itself)."""
        if self._prof is not None:
            with _quiet_native_stderr():
                self._prof.__exit__(None, None, None)
            self._prof = None
        gc.collect()


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Silence the native stderr (file descriptor 2) while the profiler starts or stops: kineto logs
    ``USDT: ... profiler_start`` / ``STAGE: ...`` lines there that no setting turns off. Python's
    ``sys.stderr`` is flushed first and restored after; with ``MEMEST_DEBUG=1`` nothing is hidden."""
    import sys

    if os.environ.get("MEMEST_DEBUG", "").strip() not in ("", "0"):
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no descriptor 2 (an embedded interpreter)
        yield
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@dataclass(frozen=True, slots=True)
class _Lap:
    peak: int | None
    baseline: int | None
    by_category: dict[str, int]
    method: str
    allocations: int | None
    error: str | None


def timeline_peak(prof: Any, device: str = "cpu") -> tuple[int, int, dict[str, int]]:
    """(peak bytes, bytes alive before the profile, bytes per category at the peak) of a finished
    ``torch.profiler.profile`` run with profile_memory, record_shapes and with_stack.

    Follows ``MemoryProfileTimeline._coalesce_timeline`` (torch/profiler/_memory_profiler.py): the
    timeline's sizes are one running total per category, updated event by event.
    """
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, Action, MemoryProfileTimeline

    timeline = MemoryProfileTimeline(prof._memory_profile())
    names = ["UNKNOWN" if c is None else c.name for c in _CATEGORY_TO_INDEX]
    _, sizes = timeline._coalesce_timeline(device)
    import torch

    dev = torch.device(device)
    baseline = sum(n for t, action, (key, _), n in timeline.timeline
                   if action is Action.PREEXISTING and key.device == dev)
    if not sizes:
        return 0, baseline, {}
    totals = [sum(row) for row in sizes]
    at = max(range(len(totals)), key=totals.__getitem__)
    by_category = {name: int(v) for name, v in zip(names, sizes[at][1:], strict=True) if v}
    return int(totals[at]), int(baseline), by_category


def allocations_peak(prof: Any, device: str = "cpu") -> int:
    """The highest ``total_allocated`` among a finished profile's allocation events on ``device``:
    bytes allocated since the profile began, net of frees, at its highest (0 without events)."""
    from torch._C._profiler import _EventType
    from torch.profiler._memory_profiler import OpTree

    peak = 0
    for event in OpTree(prof.profiler.kineto_results).sorted_nodes:
        if event.typed[0] == _EventType.Allocation and event.typed[1].device.type == device:
            peak = max(peak, int(event.typed[1].total_allocated))
    return peak


def physical_memory() -> int | None:
    """The host's physical RAM in bytes (``os.sysconf``), or None where it cannot be read."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
