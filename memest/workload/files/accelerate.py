"""accelerate's config YAML (``accelerate/commands/config/config_args.py``).

Keys read: ``distributed_type`` (``NO``, ``MULTI_GPU``, ``FSDP``, ``DEEPSPEED``), ``mixed_precision`` (``no``,
``fp16``, ``bf16``), ``num_processes`` x ``num_machines``, ``fsdp_config.fsdp_version`` and the sharding it
selects (:func:`_fsdp_strategy`), ``fsdp_offload_params``, ``fsdp_activation_checkpointing``, and
``deepspeed_config`` (``zero_stage``, ``offload_optimizer_device``, ``offload_param_device``,
``gradient_accumulation_steps``; ``deepspeed_config_file``, a DeepSpeed JSON read with it).

The stack is accelerate's under either backend (the framework FSDP or DeepSpeed): under DeepSpeed,
``Accelerator.prepare`` -> ``_prepare_deepspeed`` (``accelerator.py``) fills the JSON's hidden-size ``"auto"``
keys from ``model.config.hidden_size`` (``reduce_bucket_size`` h², ``stage3_prefetch_bucket_size`` int(0.9 h²),
``stage3_param_persistence_threshold`` 10 h), as the HF Trainer does (:data:`memest.workload.resolve.HF_INTEGRATION`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memest.errors import InputError
from memest.workload.config import Framework, FsdpStrategy, Offload, Precision, Stack
from memest.workload.files._common import Found, Include, typed

NAME = "an accelerate config YAML (distributed_type)"
LAUNCHER = True
"""accelerate launches the step: its precision, sharding and offload win over a recipe's switches."""
READS = ("distributed_type", "mixed_precision", "num_processes", "num_machines", "fsdp_config.fsdp_version",
         "fsdp_config.fsdp_sharding_strategy", "fsdp_config.fsdp_reshard_after_forward",
         "fsdp_config.fsdp_offload_params", "fsdp_config.fsdp_activation_checkpointing", "deepspeed_config.zero_stage",
         "deepspeed_config.offload_optimizer_device", "deepspeed_config.offload_param_device",
         "deepspeed_config.gradient_accumulation_steps", "deepspeed_config.deepspeed_config_file")
IGNORED = {
    "fsdp_config.fsdp_forward_prefetch": ("one more unit's parameters gathered ahead in forward", False),
    "fsdp_config.fsdp_cpu_ram_efficient_loading": ("host RAM while loading: rank 0 alone reads the checkpoint",
                                                   False),
}
"""Memory-relevant keys memest does not read -> (what they size, accelerate's default)."""
_SHARDING = {"1": FsdpStrategy.FULL_SHARD, "2": FsdpStrategy.SHARD_GRAD_OP, "3": FsdpStrategy.NO_SHARD,
             "4": FsdpStrategy.HYBRID_SHARD}
"""accelerate's numbered ``fsdp_sharding_strategy`` values (``torch.distributed.fsdp.ShardingStrategy``'s, 1-based:
``utils/dataclasses.py`` maps a name to ``FSDP_SHARDING_STRATEGY.index(name) + 1``, then ``ShardingStrategy(int)``;
5, ``HYBRID_SHARD_ZERO2``, is not modelled)."""
ACCELERATE_VERSION = "1.14.0"
"""The accelerate release whose FSDP plugin memest follows (tag v1.14.0; FSDP2's ``reshard_after_forward`` since
v1.6.0)."""


def detect(doc: Any, text: str) -> bool:
    """Whether ``doc`` (the parsed file; ``text`` its text) is an accelerate config: a mapping with ``distributed_type``."""
    return isinstance(doc, dict) and "distributed_type" in doc


def read(path: Path, doc: dict[str, Any]) -> Found:
    """The settings an accelerate config implies, and the notes on what it left open."""
    values, notes, origins = _accelerate(path, doc)
    ds_file = (doc.get("deepspeed_config") or {}).get("deepspeed_config_file") \
        if isinstance(doc.get("deepspeed_config"), dict) else None
    # the JSON's settings fill what the YAML leaves (its own deepspeed keys are then unread); its stack, deepspeed,
    # gives way to the YAML's: accelerate runs the step and hands the model to DeepSpeed
    includes = (Include(str(ds_file), key="deepspeed_config.deepspeed_config_file", yields=True),) if ds_file else ()
    return Found(values, notes, origins=origins, includes=includes)


def _accelerate(path: Path, doc: dict[str, Any]) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    kind = str(doc["distributed_type"]).upper()
    values: dict[str, Any] = {}
    notes: list[str] = []
    origins = {"gpus": "num_processes", "stack": "distributed_type", "framework": "distributed_type",
               "precision": "mixed_precision",
               "recompute": "fsdp_config.fsdp_activation_checkpointing"}
    processes = typed(path, "num_processes", doc.get("num_processes", 1), int, "an integer")
    machines = typed(path, "num_machines", doc.get("num_machines", 1), int, "an integer")
    values["gpus"] = max(1, processes) * max(1, machines)
    mixed = str(doc.get("mixed_precision", "no")).lower()
    if kind == "FSDP":
        values["stack"], values["framework"] = Stack.ACCELERATE, Framework.FSDP
        fsdp = doc.get("fsdp_config") or {}
        typed(path, "fsdp_config", fsdp, dict, "a mapping")
        values["fsdp"], origins["fsdp"] = _fsdp_strategy(path, fsdp, notes)
        if typed(path, "fsdp_offload_params", fsdp.get("fsdp_offload_params", False), bool, "true or false"):
            values["offload"] = Offload.PARAMS
            origins["offload"] = "fsdp_config.fsdp_offload_params"
        if typed(path, "fsdp_activation_checkpointing", fsdp.get("fsdp_activation_checkpointing", False), bool,
                  "true or false"):
            values["recompute"] = "full"
        values["precision"] = {"bf16": Precision.FSDP2, "fp16": Precision.FP16, "no": Precision.FP32}.get(mixed)
    elif kind == "DEEPSPEED":
        ds = doc.get("deepspeed_config") or {}
        typed(path, "deepspeed_config", ds, dict, "a mapping")
        # accelerate's own DeepSpeed path: ``Accelerator.prepare`` -> ``_prepare_deepspeed`` fills the JSON's "auto"
        # (the HF integration, :data:`memest.workload.resolve.HF_INTEGRATION`), so the stack is accelerate's
        values["stack"], values["framework"] = Stack.ACCELERATE, Framework.DEEPSPEED
        if ds.get("deepspeed_config_file"):  # accelerate then reads the JSON, not its own keys
            values["precision"] = None
            return {k: v for k, v in values.items() if v is not None}, notes, origins
        origins |= {"zero_stage": "deepspeed_config.zero_stage", "grad_accum_steps":
                    "deepspeed_config.gradient_accumulation_steps"}
        values["zero_stage"] = typed(path, "deepspeed_config.zero_stage", ds.get("zero_stage", 0), int, "0-3")
        params = str(ds.get("offload_param_device", "none")).lower() in ("cpu", "nvme")
        optim = str(ds.get("offload_optimizer_device", "none")).lower() in ("cpu", "nvme")
        values["offload"] = Offload.PARAMS if params else Offload.OPTIMIZER if optim else Offload.NONE
        for key in ("offload_optimizer_device", "offload_param_device"):
            if str(ds.get(key, "none")).lower() == "nvme":  # accelerate writes zero_optimization.<...>.device
                notes.append(f"{path.name}: deepspeed_config.{key} nvme: "
                             + ("ZeRO-1/2 treat any offload device as cpu (DeepSpeed stage_1_and_2.py), so the states "
                                "stay in host RAM, as counted" if values["zero_stage"] < 3 else
                                "ZeRO-3 swaps the offloaded states to NVMe; memest models that swap from a DeepSpeed "
                                "JSON only and counts them in host RAM here (an over-count of host RAM)"))
        origins["offload"] = f"deepspeed_config.offload_{'param' if params else 'optimizer'}_device"
        if "gradient_accumulation_steps" in ds:
            values["grad_accum_steps"] = typed(path, "deepspeed_config.gradient_accumulation_steps",
                                                ds["gradient_accumulation_steps"], int, "an integer")
        values["precision"] = {"bf16": Precision.MIXED, "fp16": Precision.FP16, "no": Precision.FP32}.get(mixed)
    elif kind in ("MULTI_GPU", "NO"):  # DDP over the processes (the stack: the job's, else the HF Trainer)
        values["precision"] = {"bf16": Precision.AMP, "fp16": Precision.AMP, "no": Precision.FP32}.get(mixed)
    else:
        raise InputError(f"{{config}} {path}: distributed_type {kind} is not modelled; memest reads NO, MULTI_GPU, "
                         "FSDP and DEEPSPEED", field="config")
    return {k: v for k, v in values.items() if v is not None}, notes, origins


def _fsdp_strategy(path: Path, fsdp: dict[str, Any], notes: list[str]) -> tuple[FsdpStrategy, str]:
    """The sharding an accelerate FSDP config selects, and the key it came from (or the default assumed, in words),
    as accelerate v1.14.0 (:data:`ACCELERATE_VERSION`) reads it: ``accelerate launch`` copies ``fsdp_config``'s keys
    to its arguments and sets ``FSDP_VERSION``, ``FSDP_SHARDING_STRATEGY`` (``--fsdp_sharding_strategy``, default
    ``FULL_SHARD``) and ``FSDP_RESHARD_AFTER_FORWARD`` (default ``"true"``) (``utils/launch.py``
    ``prepare_multi_gpu_env``), which ``FullyShardedDataParallelPlugin.__post_init__`` (``utils/dataclasses.py``)
    reads:

    - ``fsdp_version`` 1 (the default): ``sharding_strategy`` from ``FSDP_SHARDING_STRATEGY``, a name or its
      number (:data:`_SHARDING`); FSDP1 is wrapped with ``sharding_strategy or reshard_after_forward``
      (``accelerator.py``), and the launcher always sets the former, so a v1 file's ``fsdp_reshard_after_forward``
      is not what runs (said in a note).
    - ``fsdp_version`` 2: ``sharding_strategy`` is not read; ``reshard_after_forward`` is a bool
      (``str_to_bool``; anything else raises) passed to every ``fully_shard`` unit (``fsdp_utils.py``
      ``fsdp2_prepare_model``): true frees each unit's gathered parameters after its forward (FULL_SHARD, ZeRO-3),
      false keeps them gathered until its backward, as FSDP1's SHARD_GRAD_OP does (ZeRO-2).
    """
    version = typed(path, "fsdp_config.fsdp_version", fsdp.get("fsdp_version", 1), int, "1 or 2")
    if version not in (1, 2):
        raise InputError(f"{{config}} {path}: fsdp_config.fsdp_version is {version!r}; expected 1 or 2", field="config")
    if version == 2:
        if "fsdp_sharding_strategy" in fsdp:
            notes.append(f"{path.name}: fsdp_config.fsdp_sharding_strategy is not read under fsdp_version 2 "
                         "(accelerate reads fsdp_reshard_after_forward there)")
        key = "fsdp_reshard_after_forward"
        if key not in fsdp:
            return FsdpStrategy.FULL_SHARD, ("fsdp_config (no fsdp_reshard_after_forward: accelerate launch's "
                                             "default, true)")
        value = fsdp[key]
        flag = value if isinstance(value, bool) else {"true": True, "1": True, "yes": True, "false": False, "0": False,
                                                      "no": False}.get(str(value).lower())
        if flag is None:
            raise InputError(f"{{config}} {path}: fsdp_config.{key} is {value!r}; expected true or false under "
                             "fsdp_version 2", field="config")
        return (FsdpStrategy.FULL_SHARD if flag else FsdpStrategy.SHARD_GRAD_OP), f"fsdp_config.{key}"
    if "fsdp_sharding_strategy" not in fsdp:
        if "fsdp_reshard_after_forward" in fsdp:
            notes.append(f"{path.name}: fsdp_config.fsdp_reshard_after_forward is not what FSDP1 runs: accelerate "
                         "launch always sets FSDP_SHARDING_STRATEGY (default FULL_SHARD), which accelerate uses first; "
                         "memest reads FULL_SHARD")
        return FsdpStrategy.FULL_SHARD, "fsdp_config (no fsdp_sharding_strategy: accelerate launch's default, FULL_SHARD)"
    strategy = str(fsdp["fsdp_sharding_strategy"])
    try:
        return _SHARDING.get(strategy) or FsdpStrategy(strategy.lower()), "fsdp_config.fsdp_sharding_strategy"
    except ValueError:
        raise InputError(f"{{config}} {path}: fsdp_config.fsdp_sharding_strategy is {strategy!r}; expected "
                         "FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD or NO_SHARD (or 1-4)", field="config") from None
