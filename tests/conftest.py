"""Shared test setup: no network, ever (configs come from the packaged catalog or fixtures)."""

import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("MEMEST_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))  # test helpers (cpu_measure, validation cases)
