"""The fit rule: a setup fits when its per-device *device used* figure (what nvidia-smi would show)
is at most ``(1 - headroom)`` x the device's memory.

One rule, used by ``memest hf``, the planner (:mod:`memest.plan`), the max queries
(:mod:`memest.maxfit`) and sweeps (:mod:`memest.sweep`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memest.devices import Device
from memest.result import Estimate


def usable_bytes(device: Device, headroom: float) -> int:
    """Memory a job may use on ``device``: floor(capacity x (1 - headroom)), in bytes."""
    return math.floor(device.memory_bytes * (1 - headroom))


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether an estimate fits a device.

    Attributes:
        device: The accelerator.
        count: Devices in the job.
        headroom: Share of memory kept free.
        needed_bytes: Per-device device-used estimate (the rank that needs the most).
        high_bytes: Upper edge of its band.
    """

    device: Device
    count: int
    headroom: float
    needed_bytes: int
    high_bytes: int

    @property
    def usable_bytes(self) -> int:
        """Memory the job may use: capacity x (1 - headroom)."""
        return usable_bytes(self.device, self.headroom)

    @property
    def fits(self) -> bool:
        """True when the estimate is within the usable memory."""
        return self.needed_bytes <= self.usable_bytes

    @property
    def fits_with_band(self) -> bool:
        """True when even the band's upper edge fits the device's full capacity."""
        return self.high_bytes <= self.device.memory_bytes

    @property
    def margin_bytes(self) -> int:
        """Usable minus needed (negative when it does not fit)."""
        return self.usable_bytes - self.needed_bytes

    @property
    def free_bytes(self) -> int:
        """Capacity minus needed: what is left on the device (negative when over capacity)."""
        return self.device.memory_bytes - self.needed_bytes


def verdict(est: Estimate, device: Device, count: int, headroom: float) -> Verdict:
    """The fit verdict of an estimate on ``count`` x ``device``."""
    rank = est.per_device
    return Verdict(device, count, headroom, rank.device_used_bytes, rank.high_bytes)
