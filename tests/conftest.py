"""Shared test setup: no network, ever (configs come from the packaged catalog or fixtures)."""

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("MEMEST_OFFLINE", "1")
# specs built on the meta device are cached on disk (memest.sources.spec_cache): in a folder of this run, never
# the user's cache, removed at exit; subprocesses (CLI tests) inherit it
os.environ["MEMEST_CACHE_DIR"] = tempfile.mkdtemp(prefix="memest-test-cache-")
os.environ.pop("MEMEST_NO_CACHE", None)
atexit.register(shutil.rmtree, os.environ["MEMEST_CACHE_DIR"], ignore_errors=True)
sys.path.insert(0, str(Path(__file__).parent))  # test helpers (cpu_measure, trace_models, inprocess)

TINY_LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 1000,
    "max_position_embeddings": 256, "torch_dtype": "bfloat16",
}
"""A tiny Llama: 202,048 parameters = embed 1000 x 64 = 64,000 + 2 layers x 36,992 (q 64x64 4,096, k and v
64x32 2,048 each, o 4,096, gate/up/down 64x128 8,192 each, two norms 64 each) + final norm 64 + lm_head 64,000."""


@pytest.fixture(scope="session")
def tiny():
    """The ModelSpec of :data:`TINY_LLAMA` (built once; specs are not mutated by estimates)."""
    from memest.sources import spec_from_config
    from memest.sources.config import HFConfig

    return spec_from_config(HFConfig(TINY_LLAMA, name="tiny", source="test"))


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
