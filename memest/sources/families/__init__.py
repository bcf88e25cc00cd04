"""One adapter per model family: HF config -> ModelSpec with every parameter tensor.

``ADAPTERS`` maps a config's ``model_type`` to the function that builds its ModelSpec. A family
without an adapter falls back to instantiating the transformers class on the meta device
(:mod:`memest.meta`), which needs torch and transformers.
"""

from __future__ import annotations

from collections.abc import Callable

from memest.sources.config import HFConfig
from memest.sources.families import llama
from memest.spec import ModelSpec

Adapter = Callable[[HFConfig], ModelSpec]

ADAPTERS: dict[str, Adapter] = {
    "llama": llama.build,
    "mistral": llama.build,
    "qwen2": llama.build,
}


def supported_model_types() -> list[str]:
    """The model_type values with an analytic adapter, sorted."""
    return sorted(ADAPTERS)
