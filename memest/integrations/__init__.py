"""memest inside a running job: the estimate of the job as it is set up, checked against its own steps.

- :class:`memest.integrations.hf.MemestCallback` — a ``transformers.TrainerCallback`` for the HF Trainer (and
  trl's trainers, which subclass it);
- :func:`memest.integrations.track.track` (also ``memest.track``) — a context manager around the steps of a plain
  PyTorch loop;
- :class:`memest.integrations.lightning.MemestLightningCallback` — a Lightning callback (only when lightning is
  installed; memest does not depend on it).

Each reads the job from its objects (the model's config, parameter dtypes, trainable flags, PEFT adapters and
quantization; the optimizer; the TrainingArguments and world size), estimates it through :mod:`memest.api`,
warns before the first step when the estimate says it will not fit, measures the peak over the first steps
(:mod:`memest.calibration.measure`: the CUDA allocator's statistics and NVML, or the CPU profiler's memory
timeline), reports predicted versus measured per figure and appends a ``calibrate/results`` record
(:mod:`memest.calibration.records`). A failure inside memest is caught and logged once: the job never stops for it.

Nothing here is imported by ``import memest`` or the CLI; each module imports torch / transformers only when
it is itself imported (this package's ``__init__`` imports neither).
"""

from __future__ import annotations

from typing import Any

__all__ = ["MemestCallback", "track"]


def __getattr__(name: str) -> Any:  # the integrations are loaded on first use
    if name == "track":
        from memest.integrations.track import track

        return track
    if name == "MemestCallback":
        from memest.integrations.hf import MemestCallback

        return MemestCallback
    raise AttributeError(f"module 'memest.integrations' has no attribute {name!r}")
