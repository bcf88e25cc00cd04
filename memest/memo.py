"""Remembered results of pure functions: the one way memest caches.

``plan`` and ``sweep`` estimate thousands of setups of one model in one process, most of which
share their model states, their activations or their stage splits, so the estimator remembers
those. The rule that keeps a remembered value from going stale: only a **pure** function is
remembered, and its **arguments are the whole key**. Every value it reads comes in through an
argument, and every argument is a small frozen (hashable) value — a ModelSpec, a Stage, a LayerSpec,
or a view built from exactly the fields of a workload the function reads (a NamedTuple whose field
names are the workload's, so that reading any other field fails instead of being left out of the
key). No ``id()``-keyed dictionaries, no weak references, no mutable caches on dataclasses.

:func:`remembered` wraps such a function in a bounded :func:`functools.lru_cache` and registers
it; :func:`clear_all` forgets every remembered value (tests use it to estimate from a fresh state).
This module imports only the standard library.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_REMEMBERED: list[Any] = []


def remembered(maxsize: int) -> Callable[[F], F]:
    """Remember up to ``maxsize`` results of a pure function of hashable arguments (least recently
    used dropped first)."""

    def wrap(fn: F) -> F:
        cached = functools.lru_cache(maxsize=maxsize)(fn)
        _REMEMBERED.append(cached)
        return cached  # type: ignore[return-value]

    return wrap


def clear_all() -> None:
    """Forget every remembered result."""
    for fn in _REMEMBERED:
        fn.cache_clear()
