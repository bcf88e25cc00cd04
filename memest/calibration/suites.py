"""Calibration suites: named lists of cases in ``calibrate/suites/<name>.json``.

A suite file::

    {"name": "cpu", "device": "cpu", "description": "...",
     "cases": [{"id": "tiny-llama-train-fp32", "model": "calibrate/models/tiny-llama",
                "args": ["--train", "--precision", "fp32", "--micro-batch-size", "2", "--seq-len", "128"],
                "nproc": 1}]}

``args`` are ``memest calibrate`` flags exactly as typed, so a case can be copied to a shell.
Model paths are relative to the repository root (the folder holding ``calibrate/``). Each case
runs in its own process (``python -m memest calibrate ...``), so an out-of-memory or a crash in
one case leaves the device clean for the next.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from memest.errors import InputError


@dataclass(frozen=True, slots=True)
class Case:
    """One run of a suite.

    Attributes:
        id: Stable name (used in records as ``suite/id``).
        model: Model reference; a relative path is relative to the repository root.
        args: ``memest calibrate`` flags.
        nproc: Processes.
    """

    id: str
    model: str
    args: tuple[str, ...] = ()
    nproc: int = 1


@dataclass(frozen=True, slots=True)
class Suite:
    """A named list of cases.

    Attributes:
        name: The suite's name (its file stem).
        device: ``cuda`` or ``cpu``: the backend the cases are sized for.
        description: What it covers and what device it fits.
        cases: The cases, in run order.
        root: The repository root relative paths resolve against.
    """

    name: str
    device: str
    description: str
    cases: tuple[Case, ...]
    root: Path = field(default=Path("."))


MAX_SUITE_BYTES = 16 * 2**20
"""Largest suite file read (the shipped ones are a few KB); a longer one is cut and fails to parse."""


def find_suite(name: str, search: tuple[Path, ...] | None = None) -> Path:
    """The file of suite ``name``: a path to a JSON file, or ``calibrate/suites/<name>.json`` in
    the current folder or the memest source tree.

    Raises:
        InputError: no such suite; the message lists the suites found.
    """
    path = Path(name)
    if path.suffix == ".json" and path.is_file():
        return path
    folders = search or (Path.cwd() / "calibrate" / "suites", Path(__file__).resolve().parents[2] / "calibrate" / "suites")
    for folder in folders:
        candidate = folder / f"{name}.json"
        if candidate.is_file():
            return candidate
    known = sorted({p.stem for folder in folders if folder.is_dir() for p in folder.glob("*.json")})
    raise InputError(f"unknown suite {name!r}; known: {', '.join(known) or 'none'} "
                     "(files in calibrate/suites/, or pass a path to a suite .json)")


def load_suite(name: str) -> Suite:
    """Read and check a suite.

    Raises:
        InputError: no such suite, or a malformed file (names the field).
    """
    path = find_suite(name)
    try:
        data = json.loads(path.read_bytes()[:MAX_SUITE_BYTES + 1].decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"suite {str(path)!r} is not valid JSON (line {exc.lineno}: {exc.msg})") from exc
    except (OSError, UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise InputError(f"cannot read suite {str(path)!r}: {type(exc).__name__}; pass a suite .json "
                         "(an object with a 'cases' list)") from exc
    if not isinstance(data, dict) or not isinstance(data.get("cases", []), list):
        raise InputError(f"suite {str(path)!r} must be a JSON object with a 'cases' list (see calibrate/suites/); "
                         f"it holds a JSON {type(data).__name__}")
    cases = []
    ids: set[str] = set()
    for i, raw in enumerate(data.get("cases", [])):
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str) or not isinstance(raw.get("model"), str):
            raise InputError(f"suite {str(path)!r} case {i} needs string 'id' and 'model' fields")
        if raw["id"] in ids:
            raise InputError(f"suite {str(path)!r} repeats case id {raw['id']!r}; ids must be unique")
        ids.add(raw["id"])
        args = raw.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise InputError(f"suite {str(path)!r} case {raw['id']!r}: 'args' must be a list of strings")
        nproc = raw.get("nproc", 1)
        if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
            raise InputError(f"suite {str(path)!r} case {raw['id']!r}: 'nproc' is {nproc!r}; it must be a positive "
                             "integer")
        cases.append(Case(raw["id"], raw["model"], tuple(args), nproc))
    device = data.get("device", "cuda")
    if device not in ("cuda", "cpu"):
        raise InputError(f"suite {str(path)!r}: device {device!r} must be cuda or cpu")
    parents = path.resolve().parents
    return Suite(str(data.get("name", path.stem)), device, str(data.get("description", "")), tuple(cases),
                 root=parents[2] if len(parents) > 2 else parents[-1])


def case_command(suite: Suite, case: Case, *, device: str, steps: int | None, record: bool,
                 results_dir: Path | None) -> list[str]:
    """The command line that runs ``case``."""
    model = case.model
    if not Path(model).is_absolute() and (suite.root / model).exists():
        model = str(suite.root / model)
    cmd = [sys.executable, "-m", "memest", "calibrate", model, *case.args, "--device", device,
           "--nproc", str(case.nproc), "--record-tag", f"{suite.name}/{case.id}"]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    cmd.append("--record" if record else "--no-record")
    if results_dir is not None:
        cmd += ["--results-dir", str(results_dir)]
    return cmd


TIMED_OUT = 124
"""The exit code :func:`run_suite` reports for a case stopped by its time limit (as ``timeout`` does)."""


def run_suite(suite: Suite, *, device: str | None = None, steps: int | None = None, record: bool = True,
              results_dir: Path | None = None, case_timeout: float | None = None,
              progress: Callable[[str], None] | None = None) -> list[tuple[Case, int]]:
    """Run every case in its own process; (case, exit code) in order. Exit codes are
    ``memest calibrate``'s: 0 measured, 3 did not fit (recorded), 2 bad input, 1 crash, and
    :data:`TIMED_OUT` when the case ran past ``case_timeout`` seconds (stopped, nothing recorded)."""
    out = []
    for n, case in enumerate(suite.cases, 1):
        if progress is not None:
            progress(f"[{n}/{len(suite.cases)}] {case.id}")
        cmd = case_command(suite, case, device=device or suite.device, steps=steps, record=record,
                           results_dir=results_dir)
        try:
            code = subprocess.run(cmd, check=False, timeout=case_timeout).returncode
        except subprocess.TimeoutExpired:
            code = TIMED_OUT
        out.append((case, code))
    return out
