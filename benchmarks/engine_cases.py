"""Every SGLang and TensorRT-LLM case of benchmarks/data/engines.json: memest's prediction vs the log.

Run ``python benchmarks/engine_cases.py`` to regenerate ``benchmarks/engine_cases.md`` from
:mod:`memest.validation.engines` (where each case is mapped onto memest's inputs); the tests
(tests/test_validation_engines.py) check the same comparisons.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPORT = Path(__file__).resolve().parent / "engine_cases.md"

os.environ.setdefault("MEMEST_OFFLINE", "1")  # models not in the catalog are reported, not fetched
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from memest.validation.engines import render  # noqa: E402

if __name__ == "__main__":
    text = render()
    REPORT.write_text(text)
    print(text)
