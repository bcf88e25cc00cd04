"""What the user wants to run: training or serving settings, precision recipes, parallelism.

- :mod:`~memest.workload.config`: the enums and the workload dataclasses, whose user-facing fields
  declare themselves as settings;
- :mod:`~memest.workload.settings`: the table of those settings (keyword, help, scope, default);
- :mod:`~memest.workload.resolve`: a workload from the settings a user gave (the defaults that depend
  on the model or the device, the mode, the parallel layout) and the refusal of settings the job
  would not read;
- :mod:`~memest.workload.stacks`: what each training stack does by default (the settings a user did
  not give, and who runs the step);
- :mod:`~memest.workload.validate`: checks of a workload against a model.

Every error is an :class:`~memest.errors.InputError` whose message names settings as ``{name}``
placeholders; the CLI renders them as flags, the Python API as keywords.
"""

from memest.workload.config import (
    BLOCK_SIZES,
    ENGINE_VENDORS,
    ENGINE_VERSIONS,
    KV_CACHE_DTYPES,
    QUANTIZATIONS,
    VLLM_NO_FLOAT16,
    WEIGHT_DTYPES,
    AttnImplementation,
    DeepSpeedBuckets,
    Engine,
    Float8,
    Framework,
    FsdpStrategy,
    JobSettings,
    KbitPrep,
    LoraConfig,
    LoraLibrary,
    Loss,
    Method,
    Offload,
    Optimizer,
    Parallelism,
    Precision,
    Recompute,
    ServingConfig,
    Stack,
    TrainingConfig,
    Workload,
    capability_refusal,
    runs_on,
    software,
)
from memest.workload.refusals import refusal, training_refusal
from memest.workload.stacks import (
    STACKS,
    StackDefaults,
    offloaded_checkpoints_at_loss,
    offloaded_checkpoints_on_device,
    resolve_framework,
)
from memest.workload.validate import divisors, lora_module_names, tp_head_problem, validate, workload_notes

__all__ = [
    "BLOCK_SIZES", "ENGINE_VENDORS", "ENGINE_VERSIONS", "KV_CACHE_DTYPES", "QUANTIZATIONS", "VLLM_NO_FLOAT16", "WEIGHT_DTYPES",
    "AttnImplementation", "DeepSpeedBuckets", "Engine", "Float8", "Framework", "FsdpStrategy", "JobSettings", "KbitPrep", "LoraConfig", "LoraLibrary", "Loss",
    "Method", "Offload", "Optimizer", "Parallelism", "Precision", "Recompute", "ServingConfig", "STACKS", "Stack",
    "StackDefaults", "TrainingConfig", "Workload", "divisors", "lora_module_names", "offloaded_checkpoints_at_loss", "offloaded_checkpoints_on_device",
    "capability_refusal", "refusal", "resolve_framework", "runs_on",
    "software", "training_refusal", "tp_head_problem", "validate",
    "workload_notes",
]
