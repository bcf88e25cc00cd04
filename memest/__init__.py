"""memest: how much accelerator memory a model needs, per device, before you rent the hardware.

The Python API (see README.md "Python API"): :func:`estimate_memory` (``memest hf``),
:func:`plan_memory` (``memest plan``), :func:`sweep_memory` (``memest sweep``) and :func:`check_logs`
(``memest check``); bad input raises
:class:`InputError` (:func:`check_logs`: :class:`LogsFailed`, which keeps the logs that could be checked). :func:`track` (:mod:`memest.integrations.track`) checks a running PyTorch loop against its
estimate. Importing memest loads no torch, transformers or huggingface_hub.
"""

__version__ = "0.1.0"

__all__ = ["InputError", "LogCheck", "LogsFailed", "MemestError", "MemoryEstimate", "MemoryPlan", "MemorySweep", "Report",
           "__version__", "check_logs", "estimate_memory", "plan_memory", "sweep_memory", "track"]

_FROM = {"InputError": "memest.errors", "MemestError": "memest.errors", "track": "memest.integrations.track"}


def __getattr__(name: str):  # the API is loaded on first use: `python -m memest` starts with nothing loaded
    if name in __all__ and name != "__version__":
        import importlib

        value = getattr(importlib.import_module(_FROM.get(name, "memest.api")), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'memest' has no attribute {name!r}")
