"""Every ``serve`` case of benchmarks/data/validation_cases.json: memest's prediction vs the measurement.

Run ``python benchmarks/serving_cases.py`` to regenerate ``benchmarks/serving_cases.md`` from
:mod:`memest.validation.serving` (where each case is mapped onto memest's inputs); the tests
(tests/test_validation_serving.py) check the same comparisons. ``benchmarks/accuracy.py`` imports
:func:`load_cases` and :func:`comparisons` from here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPORT = Path(__file__).resolve().parent / "serving_cases.md"

os.environ.setdefault("MEMEST_OFFLINE", "1")  # models not in the catalog are reported, not fetched
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from memest.validation.serving import comparisons, load_cases, render

__all__ = ["comparisons", "load_cases", "render"]


if __name__ == "__main__":
    text = render()
    REPORT.write_text(text)
    print(text)
