"""memest: how much accelerator memory a model needs, per device, before you rent the hardware.

The Python API (see README.md "Python API"): :func:`estimate_memory` (``memest hf``),
:func:`plan_memory` (``memest plan``) and :func:`sweep_memory` (``memest sweep``); bad input raises
:class:`InputError`. Importing memest loads no torch, transformers or huggingface_hub.
"""

__version__ = "0.1.0"

from memest.api import MemoryEstimate, MemoryPlan, MemorySweep, Report, estimate_memory, plan_memory, sweep_memory
from memest.errors import InputError, MemestError

__all__ = ["InputError", "MemestError", "MemoryEstimate", "MemoryPlan", "MemorySweep", "Report", "__version__",
           "estimate_memory", "plan_memory", "sweep_memory"]
