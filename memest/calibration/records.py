"""Calibration records: one JSON line per run in ``calibrate/results/<device>.jsonl``.

A record holds everything needed to re-estimate and re-compare the run anywhere: the inputs (model
reference, workload flags and the resolved workload, steps, processes, random or real weights),
the model's facts, the versions (memest, torch, transformers, peft, CUDA, driver), the device, each
rank's measurement, the prediction (every term of every rank) and the comparison rows.

Appending is atomic: the whole line is built in memory first, then written with one ``write`` to
a file opened ``O_APPEND`` and ``fsync``-ed, so concurrent runs never interleave and an interrupted
run (Ctrl-C before the write) leaves the file as it was — a record is either complete or absent.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memest import __version__
from memest.calibration.compare import RankComparison, VerdictCheck
from memest.calibration.request import Request
from memest.devices import Device
from memest.errors import InputError
from memest.result import estimate_dict, plain
from memest.result import Estimate
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
                                           "error": r.error, "terms": list(r.terms)} for r in c.rows]}
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


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` as one line to ``path`` (created with its folders), atomically.

    Raises:
        InputError: the folder cannot be created or the file written.
    """
    data = (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise InputError(f"cannot write calibration records to {str(path)!r}: {exc.strerror}; "
                         "pass --results-dir to a writable folder or --no-record") from exc
    try:
        written = os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    if written != len(data):
        raise InputError(f"short write to {str(path)!r} ({written} of {len(data)} bytes); the disk may be full")


def read_records(paths: Iterable[Path]) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every record in the given JSON-lines files, with the file it came from (blank lines skipped).

    Raises:
        InputError: a line is not valid JSON (names the file and line).
    """
    for path in paths:
        with path.open() as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    yield path, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InputError(f"{str(path)!r} line {n} is not valid JSON ({exc.msg}); remove or fix that line") from exc


def record_ref(path: Path, record: dict[str, Any], root: Path | None = None) -> str:
    """``calibrate/results/h100-80gb.jsonl#<id>``: how constants and reports cite a record."""
    shown = path
    if root is not None:
        try:
            shown = path.resolve().relative_to(root.resolve())
        except ValueError:
            shown = path
    return f"{shown.as_posix()}#{record['id']}"
