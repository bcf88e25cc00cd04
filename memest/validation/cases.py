"""The published cases: ``benchmarks/data/validation_cases.json`` of a source checkout (not packaged).

Each case is a dict as published (``id``, ``kind``, ``model``, ``measured``, ``confidence``, ...);
``benchmarks/data/validation_cases.README.md`` describes the fields.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CASES_JSON = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "validation_cases.json"


def load_cases(*kinds: str) -> list[dict[str, Any]]:
    """Every published case, in file order; only those of ``kinds`` when given."""
    cases = json.loads(CASES_JSON.read_text())
    return [c for c in cases if not kinds or c.get("kind") in kinds]


def cases_by_id() -> dict[str, dict[str, Any]]:
    """Every published case by its id."""
    return {c["id"]: c for c in load_cases()}
