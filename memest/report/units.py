"""How bytes, shares and counts are written for people: GiB = 2^30 bytes, always labelled; parameter
counts with decimal suffixes (B = 10^9)."""

from __future__ import annotations

from memest.devices import GiB, MiB
from memest.result import plural as plural  # the one rule, re-exported for the reports

CONFIRM = (
    "Confirm on the device: `memest calibrate MODEL <same flags>` runs a few real steps and prints predicted "
    "vs measured; or watch nvidia-smi and torch.cuda.max_memory_allocated() during a short run."
)


def gib(n: float) -> str:
    """Bytes as GiB with two decimals and the unit."""
    return f"{n / GiB:,.2f} GiB"


def size(n: float) -> str:
    """Bytes in GiB from 1 GiB up, else in MiB (tiny models on CPU), two decimals, unit shown."""
    if abs(n) >= GiB:
        return gib(n)
    return f"{n / MiB:,.2f} MiB"


def percent(share: float) -> str:
    """A share as a whole percentage (``10%``), or with the decimals it takes (one for 0.999 ->
    ``99.9%``) where rounding would show 0% or 100% for a share that is neither."""
    shown = f"{share:.0%}"
    for digits in range(1, 7):
        if share in (0, 1) or float(shown.rstrip("%")) not in (0, 100):
            break
        shown = f"{share:.{digits}%}"
    return shown


def count(n: int) -> str:
    """A parameter count with a decimal suffix (B = 10^9, M = 10^6)."""
    if n >= 10**9:
        return f"{n / 1e9:,.2f} B"
    if n >= 10**6:
        return f"{n / 1e6:,.1f} M"
    return f"{n:,}"


def size_label(n: int) -> str:
    """A token or batch count the way people write it: 131072 -> ``128k``, 1000 -> ``1,000``."""
    for suffix, unit in (("M", 1 << 20), ("k", 1 << 10)):
        if n >= unit and n % unit == 0:
            return f"{n // unit}{suffix}"
    return f"{n:,}"


