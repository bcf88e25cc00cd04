"""Shared test setup: no network, ever (configs come from the packaged catalog or fixtures)."""

import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("MEMEST_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))  # test helpers (cpu_measure, validation cases)


def pytest_collection_modifyitems(config, items):
    """Skip tests marked ``gpu`` when torch sees no CUDA device (torch is imported only if one is collected)."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import pytest

    try:
        import torch

        available = torch.cuda.is_available()
    except ImportError:
        available = False
    if available:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)
