"""Calibration records: one JSON line per run in ``calibrate/results/<device>.jsonl``.

A record holds everything needed to re-estimate and re-compare the run anywhere: the inputs (model
reference, workload flags and the resolved workload, steps, processes, random or real weights),
the model's facts, the versions (memest, torch, transformers, peft, CUDA, driver), the device, each
rank's measurement, the prediction (every term of every rank) and the comparison rows.

Appending is all or nothing: the whole line is built in memory first, then written under an
exclusive ``flock`` to a file opened ``O_APPEND`` and ``fsync``-ed, so concurrent runs never
interleave; a write that fails part-way (disk full, file-size limit) is truncated back to the
file's previous end, and a file whose last line was cut (by an older memest) gets a newline before
the new record, so a record is either complete on its own line or absent. The reader skips a line
that is not a record and reports it as a :class:`BadRecordLine` warning.
"""

from __future__ import annotations

import json
import os
import secrets
import warnings
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memest import __version__
from memest.calibration.compare import RankComparison, VerdictCheck
from memest.calibration.request import Request
from memest.devices import Device
from memest.errors import InputError
from memest.result import Estimate, estimate_dict, plain
from memest.spec import ModelSpec
from memest.workload import Workload

SCHEMA = 1


def new_id(now: datetime | None = None) -> str:
    """A sortable, unique record id: UTC time + 6 random hex digits (``20260130T141503Z-3fa2c1``)."""
    now = now or datetime.now(timezone.utc)
    return f"{now.strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(3)}"


def build_record(
    *,
    request: Request,
    spec: ModelSpec,
    workload: Workload,
    device: Device,
    estimate: Estimate,
    comparisons: list[RankComparison],
    verdict: VerdictCheck,
    payloads: list[dict[str, Any]],
    steps: int,
) -> dict[str, Any]:
    """The record of one calibration run (plain JSON data, bytes as ints)."""
    env = payloads[0].get("environment", {}) if payloads else {}
    suite, _, case = (request.tag or "").partition("/")
    return {
        "schema": SCHEMA,
        "id": new_id(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "suite": suite or None,
        "case": case or None,
        "outcome": "ok" if verdict.measured_fits else "oom",
        "model": {
            "reference": portable_reference(request.model),
            "name": spec.name,
            "model_type": spec.model_type,
            "num_params": spec.num_params,
            "num_layers": spec.num_layers,
            "hidden_size": spec.hidden_size,
            "vocab_size": spec.vocab_size,
        },
        "inputs": {
            "mode": workload.mode,
            "flags": dict(request.flags),
            "workload": plain(workload),
            "steps": steps,
            "nproc": request.nproc,
            "weights": "checkpoint" if request.weights else "random",
        },
        "versions": {"memest": __version__, **{k: v for k, v in env.items() if k != "memest"}},
        "device": {
            "backend": payloads[0]["measurement"]["backend"] if payloads else None,
            "name": payloads[0]["measurement"]["device_name"] if payloads else device.name,
            "catalog_name": device.name,
            "arch": device.arch,
            "memory_bytes": device.memory_bytes,
            "count": request.nproc,
        },
        "measured": [p["measurement"] | {"static": p.get("static", {})} for p in payloads],
        "predicted": estimate_dict(estimate),
        "comparison": {
            "verdict": {"predicted_fits": verdict.predicted_fits, "measured_fits": verdict.measured_fits,
                        "headroom": verdict.headroom, "status": verdict.status},
            "ranks": [
                {"rank": c.rank, "rows": [{"name": r.name, "predicted": r.predicted, "measured": r.measured,
                                           "error": r.error, "terms": list(r.terms), "moment": r.moment}
                                          for r in c.rows]}
                for c in comparisons
            ],
        },
    }


REPO_ROOT = Path(__file__).resolve().parents[2]
"""The source tree memest runs from (records store model paths inside it relative to it)."""


def portable_reference(reference: str) -> str:
    """A model reference as a record stores it: a path inside the memest source tree becomes
    relative to it (``calibrate/models/tiny-llama``), so records re-estimate on any machine; Hub
    ids, catalog names and other paths are kept as given."""
    path = Path(reference).expanduser()
    if not path.exists():
        return reference
    try:
        return path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return reference


def resolve_reference(reference: str) -> str:
    """Inverse of :func:`portable_reference`: a relative path that exists in the source tree
    becomes absolute; anything else is returned unchanged."""
    candidate = REPO_ROOT / reference
    return str(candidate) if not Path(reference).is_absolute() and candidate.exists() else reference


def _cannot_write(path: Path, exc: OSError) -> InputError:
    return InputError(f"cannot write calibration records to {str(path)!r}: {exc.strerror or exc}; "
                      "pass {results_dir} to a writable folder or {no_record}", field="results_dir")


def check_writable_folder(folder: Path) -> None:
    """Refuse a records folder that cannot be written (checked before a run, so no measurement is lost).

    Creates nothing: the folder, or the nearest folder above it that exists (where it would be
    created), must be a writable directory.

    Raises:
        InputError: something on the way is not a folder, or the folder cannot be written.
    """
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"cannot write calibration records to {str(folder)!r}: {str(existing)!r} is not a folder; "
                         "pass {results_dir} to a writable folder or {no_record}", field="results_dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise _cannot_write(folder, PermissionError(13, "Permission denied"))


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` as one line to ``path`` (created with its folders): the whole line or nothing.

    Raises:
        InputError: the folder cannot be created or the file written; the file is left as it was.
    """
    import fcntl

    data = (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise _cannot_write(path, exc) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        start = os.fstat(fd).st_size
        if start and os.pread(fd, 1, start - 1) != b"\n":
            data = b"\n" + data  # the last line was cut: never glue this record to it
        try:
            _write_all(fd, data)
            os.fsync(fd)
        except OSError as exc:
            os.ftruncate(fd, start)
            raise InputError(f"could not append the calibration record to {str(path)!r} ({exc.strerror or exc}; "
                             "the disk may be full); the file was left as it was") from exc
    finally:
        os.close(fd)  # releases the lock


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` (a short write is continued; one that fails raises OSError)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(28, "No space left on device")
        view = view[written:]


class BadRecordLine(UserWarning):
    """A line of a records file that is not a JSON record; it was skipped."""


def read_records(paths: Iterable[Path]) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every record in the given JSON-lines files, with the file it came from.

    Blank lines are skipped; a line that is not a JSON object (a record cut by a failed write) is
    skipped and reported as a :class:`BadRecordLine` warning naming the file and line.
    """
    for path in paths:
        with path.open("rb") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
                    why = getattr(exc, "msg", type(exc).__name__)
                    warnings.warn(BadRecordLine(f"{str(path)!r} line {n} is not valid JSON ({why}); skipped it "
                                                "(remove or fix that line)"), stacklevel=2)
                    continue
                if not isinstance(rec, dict):
                    warnings.warn(BadRecordLine(f"{str(path)!r} line {n} is a JSON {type(rec).__name__}, not a "
                                                "record; skipped it (remove or fix that line)"), stacklevel=2)
                    continue
                yield path, rec


def record_ref(path: Path, record: dict[str, Any], root: Path | None = None) -> str:
    """``calibrate/results/h100-80gb.jsonl#<id>``: how constants and reports cite a record."""
    shown = path
    if root is not None:
        try:
            shown = path.resolve().relative_to(root.resolve())
        except ValueError:
            shown = path
    return f"{shown.as_posix()}#{record['id']}"
