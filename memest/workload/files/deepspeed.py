"""DeepSpeed's JSON config (``deepspeed/runtime/config.py``, ``runtime/zero/config.py``).

Keys read: ``zero_optimization.stage``, ``zero_optimization.offload_optimizer.device`` /
``offload_param.device`` (``cpu`` / ``nvme`` = host), ``bf16.enabled`` / ``fp16.enabled``,
``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``. ``"auto"`` (filled by the HF Trainer from
its TrainingArguments) keeps memest's setting as given, else its default, and says so. ``overlap_comm``,
``contiguous_gradients``, ``sub_group_size`` and ``offload_optimizer.buffer_count`` are read with the buckets;
an offload device ``nvme`` gets a note (:func:`_nvme_notes`). The bucket sizes
(:data:`~memest.workload.config.DEEPSPEED_BUCKET_KEYS`: ``reduce_bucket_size``, ``stage3_prefetch_bucket_size``,
``stage3_param_persistence_threshold``) are read as numbers or ``"auto"``, which the HF integration fills from the
model's hidden size (:func:`memest.workload.resolve.deepspeed_buckets`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memest.errors import InputError
from memest.workload.config import DEEPSPEED_BUCKET_KEYS, DEEPSPEED_SWITCHES, Framework, Offload, Precision, Stack
from memest.workload.files._common import Found, auto, lookup, typed

NAME = "a DeepSpeed JSON (zero_optimization, bf16, fp16, train_micro_batch_size_per_gpu)"
LAUNCHER = True
"""DeepSpeed runs the step: its precision, stage and offload win over a recipe's switches."""
READS = ("zero_optimization.stage", "zero_optimization.offload_optimizer.device", "zero_optimization.offload_param.device",
         "bf16.enabled", "fp16.enabled", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
         *(k for k in DEEPSPEED_BUCKET_KEYS.values() if k != "zero_optimization.offload_optimizer.device"))
IGNORED = {
    "zero_optimization.stage3_max_live_parameters": ("parameters ZeRO-3 keeps gathered", 1e9),
    "zero_optimization.allgather_bucket_size": ("ZeRO-1/2 all-gather buffer", 5e8),
    "data_types.grad_accum_dtype": ("gradient accumulation dtype", None),
    "activation_checkpointing.partition_activations": ("activation checkpoints split over model-parallel ranks",
                                                       False),
    "activation_checkpointing.cpu_checkpointing": ("activation checkpoints in host memory", False),
}
"""Memory-relevant keys memest does not read -> (what they size, DeepSpeed's default: ``runtime/zero/config.py``,
``runtime/activation_checkpointing/config.py``); a file that sets one to another value gets a note."""
KEYS = frozenset({"zero_optimization", "bf16", "fp16", "train_micro_batch_size_per_gpu",
                  "train_batch_size", "gradient_accumulation_steps", "optimizer"})


def detect(doc: Any, text: str) -> bool:
    """Whether ``doc`` (the parsed file; ``text`` its text) is a DeepSpeed config: a mapping with one of its top-level
    :data:`KEYS`, where ``optimizer`` counts only as DeepSpeed writes it, a mapping with a ``type``
    (``deepspeed/runtime/config.py`` ``get_optimizer_name``: ``param_dict["optimizer"]["type"]``); litgpt's config
    hub YAML has an ``optimizer`` with a ``class_path`` and is no DeepSpeed config."""
    if not isinstance(doc, dict):
        return False
    keys = KEYS & set(doc)
    if keys == {"optimizer"}:
        return isinstance(doc["optimizer"], dict) and "type" in doc["optimizer"]
    return bool(keys)


def read(path: Path, doc: dict[str, Any]) -> Found:
    """The settings a DeepSpeed config implies, and the notes on what it left open."""
    values, notes, origins = _deepspeed(path, doc)
    return Found(values, notes, origins=origins, buckets=_buckets(path, doc))


def _buckets(path: Path, doc: dict[str, Any]) -> dict[str, int | str]:
    """The bucket sizes the file sets (:data:`DEEPSPEED_BUCKET_KEYS`): elements (DeepSpeed takes ``5e8`` as a
    float, ``pp_int``), or ``"auto"``; ``overlap_comm`` and ``contiguous_gradients`` as true or false."""
    out: dict[str, int | str] = {}
    for name, key in DEEPSPEED_BUCKET_KEYS.items():
        value = lookup(doc, key)
        if value is None:
            continue
        if name == "optimizer_nvme":  # the device: only nvme is kept (cpu / none are the offload setting's)
            if str(value).lower() == "nvme":
                out[name] = True
            continue
        if name in DEEPSPEED_SWITCHES:  # overlap_comm, contiguous_gradients
            out[name] = typed(path, key, value, bool, "true or false")
            continue
        if value == "auto":
            out[name] = "auto"
            continue
        number = typed(path, key, value, (int, float), 'a number of elements or "auto"')
        if number < 0 or number != number or number == float("inf"):
            raise InputError(f"{{config}} {path}: {key} is {value!r}; expected a number of elements >= 0 or "
                             '"auto"', field="config")
        out[name] = int(number)
    return out


def _deepspeed(path: Path, doc: dict[str, Any]) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    values: dict[str, Any] = {"stack": Stack.DEEPSPEED, "framework": Framework.DEEPSPEED}
    origins = {"stack": "zero_optimization", "framework": "zero_optimization", "offload": "zero_optimization"}
    notes: list[str] = []
    zero = doc.get("zero_optimization", {})
    typed(path, "zero_optimization", zero, dict, "an object")
    stage = zero.get("stage", 0)
    if stage == "auto":
        auto(path, "zero_optimization.stage", "zero_stage", notes)
    else:
        values["zero_stage"] = typed(path, "zero_optimization.stage", stage, int, "0, 1, 2 or 3")
        origins["zero_stage"] = "zero_optimization.stage"
    offload = Offload.NONE
    for key, kind in (("offload_optimizer", Offload.OPTIMIZER), ("offload_param", Offload.PARAMS)):
        section = zero.get(key) or {}
        typed(path, f"zero_optimization.{key}", section, dict, "an object")
        if str(section.get("device", "none")).lower() in ("cpu", "nvme"):
            offload = kind if kind is Offload.PARAMS or offload is Offload.NONE else offload
            origins["offload"] = f"zero_optimization.{key}.device"
    values["offload"] = offload
    notes += _nvme_notes(path, zero, values.get("zero_stage"))
    for key, precision in (("bf16", Precision.MIXED), ("fp16", Precision.FP16)):
        enabled = (doc.get(key) or {}).get("enabled", False)
        if enabled == "auto":
            auto(path, f"{key}.enabled", "precision", notes)
        elif typed(path, f"{key}.enabled", enabled, bool, "true, false or \"auto\""):
            values["precision"] = precision
            origins["precision"] = f"{key}.enabled"
    for key, setting in (("train_micro_batch_size_per_gpu", "micro_batch_size"),
                         ("gradient_accumulation_steps", "grad_accum_steps")):
        if key not in doc:
            continue
        if doc[key] == "auto":
            auto(path, key, setting, notes)
        else:
            values[setting] = typed(path, key, doc[key], int, "a positive integer or \"auto\"")
            origins[setting] = key
    return values, notes, origins


def _nvme_notes(path: Path, zero: dict[str, Any], stage: int | None) -> list[str]:
    """What an ``offload_*.device`` of ``nvme`` does, which memest's host RAM figure does not split out
    (DeepSpeed v0.19.5):

    - below ZeRO-3 nothing is swapped: ``stage_1_and_2.py`` ``DeepSpeedZeroOptimizer.__init__`` sets
      ``cpu_offload = True`` for any ``offload_optimizer.device`` but ``none`` and has no swapper, so the fp32
      master, the optimizer states and the gradient partition stay in (pinned) host RAM, as with ``cpu``: the
      host RAM figure is right;
    - at ZeRO-3 (``stage3.py`` ``_configure_offloading``: ``swap_optimizer = device == nvme``) the optimizer's
      states are swapped to files under ``nvme_path`` through pinned buffers: host RAM holds those buffers and the
      gradient partition, not the states (modelled: :func:`memest.estimate.training.deepspeed.nvme_optimizer_swap`);
      ``offload_param`` nvme (``params_in_nvme_and_cpu``: ``buffer_count`` 5 x ``buffer_size`` 1e8 elements of
      pinned buffers, up to ``max_in_cpu`` 1e9 elements kept in host RAM) is not modelled: memest counts the
      16-bit parameters in host RAM (an over-count, said in the note)."""
    notes = []
    for key in ("offload_optimizer", "offload_param"):
        section = zero.get(key) or {}
        if str(section.get("device", "none")).lower() != "nvme":
            continue
        where = f"{path.name}: zero_optimization.{key}.device nvme"
        if stage is not None and stage < 3:
            notes.append(f"{where} at ZeRO {stage}: DeepSpeed swaps to NVMe only at ZeRO 3 (ZeRO-1/2 treat any "
                         "offload device as cpu: stage_1_and_2.py), so the offloaded states stay in host RAM, "
                         "as counted")
        elif key == "offload_optimizer":
            notes.append(f"{where}: ZeRO-3 swaps the fp32 master, optimizer states and fp32 gradients to "
                         f"{section.get('nvme_path') or 'nvme_path'}; host RAM counts the swapper's pinned buffers "
                         "(buffer_count x the largest sub_group_size sub-group x 4 B per rank) and the gradient "
                         "partition instead, not the NVMe's bytes")
        else:
            notes.append(f"{where}: ZeRO-3 swaps the 16-bit parameters to {section.get('nvme_path') or 'nvme_path'} "
                         "through pinned host buffers; memest does not model that swap and counts them in host RAM "
                         "(an over-count of host RAM)")
    return notes
