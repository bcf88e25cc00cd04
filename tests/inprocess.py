"""``python -m memest ARGS`` run inside the test process: the same entry point, without the start-up.

:func:`run_memest` calls :func:`memest.cli.main` (the console script's one error boundary) with
``sys.argv`` and ``__main__`` as ``python -m memest`` sets them (click names the program from them),
the environment replaced by ``env`` for the call, stdout and stderr captured, Python's default warning filters printing to the captured stderr (pytest would record
warnings instead, hiding a warning a user sees), and the logging handlers that write to stderr
(transformers') writing to the captured stderr too. The result is a :class:`subprocess.CompletedProcess`
with the exit code a subprocess would have, so a test checks the same exit code and messages either
way (tests/test_inprocess.py compares both). Start-up itself (imports, signals, the console script) is
checked by the tests that still run a real subprocess (tests/test_imports.py, test_cli.py, the import
checks of test_plan_cli.py and test_trace_cli.py, and the torchrun calibrations).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
import traceback
import types
import warnings
from collections.abc import Mapping
from pathlib import Path


class _Timeout(BaseException):
    """Raised by the alarm: a BaseException, so main()'s ``except Exception`` does not turn it into exit 1."""


def _print_warning(message, category, filename, lineno, file=None, line=None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def _default_warning_filters() -> None:
    """The filters of a fresh ``python`` (no -W, no PYTHONWARNINGS): what a user's terminal shows."""
    warnings.resetwarnings()
    warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
    for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
        warnings.filterwarnings("ignore", category=category)


def _stderr_handlers() -> list[logging.StreamHandler]:
    """The logging handlers that print to this process's stderr (a subprocess's fd 2)."""
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in list(logging.Logger.manager.loggerDict))]
    return [h for logger in loggers for h in logger.handlers
            if type(h) is logging.StreamHandler and h.stream in (sys.stderr, sys.__stderr__)]


def _main_module() -> types.ModuleType:
    """A stand-in for ``sys.modules["__main__"]`` as ``python -m memest`` sets it."""
    module = types.ModuleType("__main__")
    module.__package__ = "memest"
    return module


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    sys.stderr.write(f"{exc.code}\n")  # sys.exit("message"): printed, exit status 1
    return 1


def run_memest(*args: str, env: Mapping[str, str] | None = None, timeout: float | None = 120) -> subprocess.CompletedProcess:
    """``memest ARGS`` in this process; raises :class:`subprocess.TimeoutExpired` after ``timeout`` seconds."""
    import memest
    from memest.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_argv, saved_main = dict(os.environ), sys.argv, sys.modules["__main__"]
    previous_alarm, alarm_set = None, False
    handlers = {h: h.stream for h in _stderr_handlers()}
    code = 0
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        # what `python -m memest` has: click names the program from these ('python -m memest' in usage lines)
        sys.argv = [str(Path(memest.__file__).with_name("__main__.py")), *args]
        sys.modules["__main__"] = _main_module()
        for handler in handlers:
            handler.setStream(err)
        if timeout is not None:
            def alarm(signum, frame):
                raise _Timeout

            previous_alarm = signal.signal(signal.SIGALRM, alarm)
            alarm_set = True
            signal.setitimer(signal.ITIMER_REAL, timeout)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            _default_warning_filters()
            warnings.showwarning = _print_warning
            try:
                main()
            except SystemExit as exc:
                code = _exit_code(exc)
            except Exception:  # uncaught (MEMEST_DEBUG=1 re-raises): Python prints the traceback, exit status 1
                traceback.print_exc()
                code = 1
    except _Timeout:
        raise subprocess.TimeoutExpired(["memest", *args], timeout, out.getvalue(), err.getvalue()) from None
    finally:
        if alarm_set:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous_alarm if previous_alarm is not None else signal.SIG_DFL)
        for handler, stream in handlers.items():
            handler.setStream(stream)
        sys.argv = saved_argv
        sys.modules["__main__"] = saved_main
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["memest", *args], code, out.getvalue(), err.getvalue())
