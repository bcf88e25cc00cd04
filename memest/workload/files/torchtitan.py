"""torchtitan's job config TOML (``torchtitan/models/*/train_configs/*.toml``, ``--job.config_file``).

Keys read (``torchtitan/config/job_config.py`` at 238fa9953e4a, the last commit with TOML configs, and the
older names the files used): ``model.name`` + ``model.flavor`` (:data:`MODELS`); ``training.local_batch_size``
(``training.batch_size`` before June 2025), ``training.global_batch_size`` (gradient accumulation: global /
(local x data-parallel degree)), ``training.seq_len``; ``training.mixed_precision_param`` (``bfloat16``: FSDP2
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` over fp32 shards, memest's ``fsdp2``;
``float32``: fp32) and ``training.dtype`` (``bfloat16``: parameters, gradients and optimizer states all bf16);
``training.enable_cpu_offload`` (FSDP2 ``CPUOffloadPolicy``); ``parallelism.*`` (``training.*`` and
``experimental.*`` before April 2025): ``data_parallel_replicate_degree``, ``data_parallel_shard_degree`` (-1:
the ranks left over), ``tensor_parallel_degree``, ``pipeline_parallel_degree``, ``context_parallel_degree``,
``expert_parallel_degree``, ``pipeline_parallel_microbatch_size``, ``fsdp_reshard_after_forward``;
``activation_checkpoint.mode`` (``none``, ``full``, ``selective``) with ``selective_ac_option`` (``op``:
memest's ``selective_op``; an integer N: every N-th layer checkpointed whole); ``optimizer.name``,
``optimizer.implementation`` (``fused`` by default), ``optimizer.early_step_in_backward`` (the step inside
backward); ``compile.enable`` (``training.compile`` before 2025): torch.compile of each block; float8 training
as ``float8.enable_float8_linear`` (9dec370, December 2024: tensorwise) or ``"float8"`` in ``model.converters``
with ``float8.recipe_name`` / ``quantize.linear.float8.recipe_name`` (none: tensorwise; ``rowwise``,
``rowwise_with_gw_hp``: rowwise) and ``enable_fsdp_float8_all_gather`` in the same table.

FSDP2 shards the parameters (ZeRO-3) whenever the shard degree is not 1; ``fsdp_reshard_after_forward``
``never`` keeps them gathered from forward to backward (ZeRO-2), as ``default`` does under pipeline
parallelism (``torchtitan/models/llama3/infra/parallelize.py`` ``apply_fsdp``: ``reshard_after_forward = not
pp_enabled``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memest.errors import InputError
from memest.workload.config import Float8, Offload, Optimizer, Precision, Recompute, Stack
from memest.workload.files._common import Found, lookup, typed

NAME = "a torchtitan job TOML ([model] name and flavor, [training])"
READS = ("model.name", "model.flavor", "training.local_batch_size", "training.batch_size",
         "training.global_batch_size", "training.seq_len", "training.mixed_precision_param", "training.dtype",
         "training.enable_cpu_offload", "parallelism.data_parallel_replicate_degree",
         "parallelism.data_parallel_shard_degree", "parallelism.tensor_parallel_degree",
         "parallelism.pipeline_parallel_degree", "parallelism.context_parallel_degree",
         "parallelism.expert_parallel_degree", "parallelism.pipeline_parallel_microbatch_size",
         "parallelism.fsdp_reshard_after_forward", "activation_checkpoint.mode",
         "activation_checkpoint.selective_ac_option", "optimizer.name", "optimizer.implementation",
         "optimizer.early_step_in_backward", "compile.enable", "training.compile", "model.converters",
         "float8.enable_float8_linear", "float8.recipe_name", "float8.enable_fsdp_float8_all_gather",
         "quantize.linear.float8.recipe_name", "quantize.linear.float8.enable_fsdp_float8_all_gather")
IGNORED = {
    "activation_checkpoint.memory_budget": ("the compiler's activation memory budget (mode memory_budget)", 0.5),
}
"""Memory-relevant keys memest does not model -> (what they size, torchtitan's default)."""

MODELS: dict[tuple[str, str], str] = {
    ("llama3", "8B"): "meta-llama/Llama-3.1-8B", ("llama3", "70B"): "meta-llama/Llama-3.1-70B",
    ("llama3", "405B"): "meta-llama/Llama-3.1-405B",
    ("qwen3", "0.6B"): "Qwen/Qwen3-0.6B", ("qwen3", "1.7B"): "Qwen/Qwen3-1.7B", ("qwen3", "4B"): "Qwen/Qwen3-4B",
    ("qwen3", "8B"): "Qwen/Qwen3-8B", ("qwen3", "14B"): "Qwen/Qwen3-14B", ("qwen3", "32B"): "Qwen/Qwen3-32B",
}
"""``[model] name`` and ``flavor`` -> the Hub model of that architecture (``torchtitan/models/llama3/__init__.py``
``llama3_args``: 8B dim 4096, 32 layers, 8 KV heads, ``ffn_dim_multiplier`` 1.3, the Llama 3.1 checkpoints its
configs name in ``hf_assets_path``; ``models/qwen3/__init__.py`` ``qwen3_args``); ``debugmodel`` flavors map
to none."""

_SECTIONS = ("parallelism", "training", "experimental")
"""Where the parallel degrees are, newest first (``[parallelism]`` from April 2025; before it
``[training]`` and, for pipeline and context parallelism, ``[experimental]``)."""


def detect(doc: Any, text: str) -> bool:
    """Whether ``doc`` is a torchtitan job config: ``[model]`` with ``name`` and ``flavor``, and ``[training]``."""
    model = doc.get("model") if isinstance(doc, dict) else None
    return isinstance(model, dict) and "flavor" in model and "name" in model and isinstance(doc.get("training"), dict)


def read(path: Path, doc: dict[str, Any]) -> Found:
    """The settings a torchtitan job config implies."""
    values: dict[str, Any] = {"stack": Stack.TORCHTITAN, "train": True}
    origins: dict[str, str] = {"stack": "model.name", "train": "model.name"}
    notes: list[str] = []

    def put(setting: str, value: Any, key: str) -> None:
        values[setting], origins[setting] = value, key

    def integer(key: str) -> int | None:
        value = lookup(doc, key)
        return None if value is None else typed(path, key, value, int, "an integer")

    name, flavor = str(doc["model"]["name"]), str(doc["model"]["flavor"])
    model = MODELS.get((name, flavor))
    if model is None:
        notes.append(f"{path.name}: model {name} flavor {flavor} is not one memest maps to a Hub model (it maps "
                     f"{', '.join(f'{n} {f}' for n, f in MODELS)}); pass MODEL")
    else:
        origins["model"] = "model.flavor"
    degrees = {k: (integer(f"{s}.{k}"), f"{s}.{k}") for k in (
        "data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
        "pipeline_parallel_degree", "context_parallel_degree", "expert_parallel_degree",
        "pipeline_parallel_microbatch_size") for s in reversed(_SECTIONS) if lookup(doc, f"{s}.{k}") is not None}
    replicate = degrees.get("data_parallel_replicate_degree", (1, ""))[0]
    shard = degrees.get("data_parallel_shard_degree", (-1, ""))[0]
    for key, setting in (("tensor_parallel_degree", "tp"), ("pipeline_parallel_degree", "pp"),
                         ("context_parallel_degree", "cp"), ("expert_parallel_degree", "ep")):
        if key in degrees:
            put(setting, degrees[key][0], degrees[key][1])
    pp = values.get("pp", 1)
    shard_key = degrees.get("data_parallel_shard_degree", (-1, "model.name"))[1]
    if shard != 1:  # fully_shard over the shard group (-1: the ranks left over)
        reshard = str(lookup(doc, "parallelism.fsdp_reshard_after_forward") or "default")
        gathered = reshard == "never" or (reshard == "default" and pp > 1)
        put("zero_stage", 2 if gathered else 3,
            shard_key if reshard == "default" else "parallelism.fsdp_reshard_after_forward")
    cp = values.get("cp", 1)
    if shard > 0:
        put("gpus", shard * replicate * values.get("tp", 1) * pp * cp, shard_key)
    if shard > 1 and replicate > 1:  # HSDP: FSDP over shard x cp ranks (torchtitan's dp_shard_cp mesh), replicated
        put("dp_shard", shard * cp, shard_key)
    elif shard == -1 and replicate > 1:
        notes.append(f"{path.name}: data_parallel_replicate_degree {replicate} with data_parallel_shard_degree -1: "
                     "the shard group is the ranks left over; memest shards over all data-parallel ranks unless "
                     "dp_shard is given")
    _batch(path, doc, values, origins, notes, shard * replicate if shard > 0 else None)
    _precision(path, doc, put)
    if lookup(doc, "training.enable_cpu_offload") is True:
        put("offload", Offload.PARAMS, "training.enable_cpu_offload")
    _checkpointing(path, doc, put, notes)
    _optimizer(path, doc, put, notes)
    _compile_and_float8(path, doc, put)
    return Found(values, notes, model, origins)


def _compile_and_float8(path: Path, doc: dict[str, Any], put: Any) -> None:
    for key in ("compile.enable", "training.compile"):
        value = lookup(doc, key)
        if value is not None:
            put("torch_compile", bool(typed(path, key, value, bool, "true or false")), key)
            break
    converters = lookup(doc, "model.converters") or []
    if isinstance(converters, str):
        converters = [c.strip() for c in converters.split(",")]
    on, key = "float8" in converters, "model.converters"
    legacy = lookup(doc, "float8.enable_float8_linear")
    if legacy is not None and not on:
        on, key = bool(typed(path, "float8.enable_float8_linear", legacy, bool, "true or false")), \
            "float8.enable_float8_linear"
    if not on:
        return
    table = "quantize.linear.float8" if lookup(doc, "quantize.linear.float8") is not None else "float8"
    recipe = lookup(doc, f"{table}.recipe_name")
    if recipe is not None:
        recipe = str(typed(path, f"{table}.recipe_name", recipe, str, "tensorwise, rowwise or rowwise_with_gw_hp"))
        if recipe not in ("tensorwise", "rowwise", "rowwise_with_gw_hp"):
            raise InputError(f"{{config}} {path}: {table}.recipe_name is {recipe!r}; expected tensorwise, rowwise "
                             "or rowwise_with_gw_hp", field="config")
        key = f"{table}.recipe_name"
    put("float8", Float8.ROWWISE if recipe and recipe.startswith("rowwise") else Float8.TENSORWISE, key)
    gather = lookup(doc, f"{table}.enable_fsdp_float8_all_gather")
    if gather is not None:
        put("float8_all_gather", bool(typed(path, f"{table}.enable_fsdp_float8_all_gather", gather, bool,
                                            "true or false")), f"{table}.enable_fsdp_float8_all_gather")


def _batch(path: Path, doc: dict[str, Any], values: dict[str, Any], origins: dict[str, str], notes: list[str],
           dp: int | None) -> None:
    key = "training.local_batch_size" if lookup(doc, "training.local_batch_size") is not None else \
        "training.batch_size"
    local = lookup(doc, key)
    if local is not None:
        typed(path, key, local, int, "an integer")
    seq = lookup(doc, "training.seq_len")
    if seq is not None:
        values["seq_len"], origins["seq_len"] = typed(path, "training.seq_len", seq, int, "an integer"), \
            "training.seq_len"
    if values.get("pp", 1) > 1:  # each pipeline micro-batch is what one stage holds activations for
        micro = lookup(doc, "parallelism.pipeline_parallel_microbatch_size") or 1
        values["micro_batch_size"] = typed(path, "parallelism.pipeline_parallel_microbatch_size", micro, int,
                                           "an integer")
        origins["micro_batch_size"] = "parallelism.pipeline_parallel_microbatch_size"
        if local is not None and local % values["micro_batch_size"] == 0:
            values["grad_accum_steps"], origins["grad_accum_steps"] = local // values["micro_batch_size"], key
    elif local is not None:
        values["micro_batch_size"], origins["micro_batch_size"] = local, key
    total = lookup(doc, "training.global_batch_size")
    if total is None or total == -1 or local is None:
        return
    typed(path, "training.global_batch_size", total, int, "an integer")
    if dp is None:
        notes.append(f"{path.name}: training.global_batch_size {total} accumulates {total} / ({key.split('.')[-1]} "
                     f"{local} x the data-parallel degree) micro-batches; memest uses grad_accum_steps as given")
    elif total % (local * dp) == 0:
        values["grad_accum_steps"], origins["grad_accum_steps"] = total // (local * dp), "training.global_batch_size"


def _precision(path: Path, doc: dict[str, Any], put: Any) -> None:
    dtype = lookup(doc, "training.dtype")
    if dtype is not None and typed(path, "training.dtype", dtype, str, "bfloat16 or float32") == "bfloat16":
        put("precision", Precision.BF16, "training.dtype")
        return
    param = lookup(doc, "training.mixed_precision_param")
    if param is None:
        return
    param = typed(path, "training.mixed_precision_param", param, str, "bfloat16 or float32")
    if param not in ("bfloat16", "float32"):
        raise InputError(f"{{config}} {path}: training.mixed_precision_param is {param!r}; expected bfloat16 or "
                         "float32", field="config")
    put("precision", Precision.FSDP2 if param == "bfloat16" else Precision.FP32, "training.mixed_precision_param")


def _checkpointing(path: Path, doc: dict[str, Any], put: Any, notes: list[str]) -> None:
    mode = lookup(doc, "activation_checkpoint.mode")
    if mode is None:
        return
    mode = str(typed(path, "activation_checkpoint.mode", mode, str, "none, selective, full or memory_budget"))
    mode = mode.lower()
    key = "activation_checkpoint.mode"
    if mode in ("none", "full"):
        put("recompute", Recompute(mode), key)
        return
    if mode == "memory_budget":
        notes.append(f"{path.name}: activation_checkpoint.mode memory_budget (the compiler picks what to save) is "
                     "not modelled; estimated without checkpointing (an upper bound)")
        put("recompute", Recompute.NONE, key)
        return
    if mode != "selective":
        raise InputError(f"{{config}} {path}: activation_checkpoint.mode is {mode!r}; expected none, selective, "
                         "full or memory_budget", field="config")
    option = str(lookup(doc, "activation_checkpoint.selective_ac_option") or "2")
    key = "activation_checkpoint.selective_ac_option"
    if option == "op":
        put("recompute", Recompute.SELECTIVE_OP, key)
    elif option.isdigit() and int(option) == 1:
        put("recompute", Recompute.FULL, key)
    elif option.isdigit() and int(option) > 1:
        notes.append(f"{path.name}: selective_ac_option {option} checkpoints every {option}th layer whole and keeps "
                     "the others' activations; memest estimates no checkpointing (an upper bound)")
        put("recompute", Recompute.NONE, key)
    else:
        raise InputError(f"{{config}} {path}: activation_checkpoint.selective_ac_option is {option!r}; expected "
                         "\"op\" or a positive integer", field="config")


def _optimizer(path: Path, doc: dict[str, Any], put: Any, notes: list[str]) -> None:
    name = lookup(doc, "optimizer.name")
    if name is not None:
        name = str(typed(path, "optimizer.name", name, str, "AdamW or Adam"))
        if name in ("AdamW", "Adam"):
            fused = str(lookup(doc, "optimizer.implementation") or "fused") == "fused"
            put("optimizer", Optimizer.ADAMW_FUSED if fused else Optimizer.ADAMW, "optimizer.name")
        else:
            notes.append(f"{path.name}: optimizer.name {name} is not modelled (memest models AdamW and Adam); the "
                         "stack's AdamW is used")
    if lookup(doc, "optimizer.early_step_in_backward") is True:
        put("optimizer_in_bwd", True, "optimizer.early_step_in_backward")
