"""Shared test setup: no network, ever (configs come from the packaged catalog or fixtures)."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("MEMEST_OFFLINE", "1")
