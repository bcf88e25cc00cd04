"""Progress of a long library call on stderr, for the commands.

The library reports progress through a callback, ``progress(what, done, total)`` (``total`` 0 when
unknown), and never prints; :func:`progress_on_stderr` turns the callback into output. On a
terminal it is a transient rich bar. Otherwise (a pipe, a log file) it is one line at most every
:data:`LINE_SECONDS`, the first once that long has passed, so a quick run prints nothing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

Progress = Callable[[str, int, int], None]

LINE_SECONDS = 5.0
"""Seconds between progress lines when stderr is not a terminal."""


@contextlib.contextmanager
def progress_on_stderr(console: Any, label: str, *, start: str = "",
                       clock: Callable[[], float] = time.monotonic) -> Iterator[Progress]:
    """A progress callback that shows ``label`` and the callback's ``what``, ``done`` of ``total``.

    Args:
        console: The rich console of stderr.
        label: What is in progress (``tracing``).
        start: What is shown before the first call (``model build``).
        clock: Seconds, for the lines' spacing (a test's clock).
    """
    if console.is_terminal:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn(f"{label} {{task.description}}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
            task = bar.add_task(start, total=None)

            def update(what: str, done: int, total: int) -> None:
                bar.update(task, description=what, completed=done, total=total or None)

            yield update
        return
    began = clock()
    last = [began]

    def line(what: str, done: int, total: int) -> None:
        now = clock()
        if now - last[0] < LINE_SECONDS:
            return
        last[0] = now
        of = f" {done:,}/{total:,}" if total else ""
        console.print(f"{label} {what}{of} ({now - began:.0f} s)", markup=False, highlight=False)

    yield line
