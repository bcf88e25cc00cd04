"""Checks of a workload against itself and a model: each raises :class:`~memest.errors.InputError`
with a one-line message naming the setting (a ``{name}`` placeholder the CLI renders as its flag and
the Python API as its keyword), the value and the fix."""

from __future__ import annotations

import re

from memest import lora_targets
from memest.errors import InputError
from memest.result import plural
from memest.spec import ModelSpec, Split
from memest.workload.config import (
    BLOCK_SIZES,
    CUSTOM_SHARDED_LAYERS,
    ENGINE_VERSIONS,
    ENGINES_SERVING,
    GGUF_ENGINES,
    KV_CACHE_DTYPES,
    QUANTIZATIONS,
    VLLM_NO_FLOAT16,
    WEIGHT_DTYPES,
    AttnImplementation,
    Engine,
    Float8,
    Framework,
    LoraLibrary,
    Loss,
    Method,
    Offload,
    Precision,
    Recompute,
    ServingConfig,
    TrainingConfig,
    Workload,
)
from memest.workload.stacks import STACKS, resolve_framework, runs_engine, stacks_running, stacks_supporting, supports


def validate(spec: ModelSpec, workload: Workload) -> None:
    """Check a workload against a model.

    Raises:
        InputError: a size is not positive, a parallel degree does not divide what it splits,
            a setting does not apply to the model or the method. A setting a config file gave is named by
            the file, line and key (:func:`named_by_file`).
    """
    try:
        _validate(spec, workload)
    except InputError as exc:
        raise named_by_file(exc, read_origins(workload.config_read)) from None


def read_origins(config_read: tuple[str, ...]) -> dict[str, str]:
    """Setting -> where a config file gave it, from a workload's ``config_read`` (``zero_stage 3 from
    ds.json:12 zero_optimization.stage`` -> ``zero_stage``: ``ds.json:12 zero_optimization.stage``)."""
    out: dict[str, str] = {}
    for entry in config_read:
        name, _, rest = entry.partition(" ")
        if " from " in rest:
            out.setdefault(name, rest.rsplit(" from ", 1)[1])
    return out


def named_by_file(exc: InputError, origins: dict[str, str]) -> InputError:
    """``exc`` with the settings it names written where a config file gave them (``origins``: setting -> ``file:line
    key``): ``ds.json:3: zero_optimization.stage is 5; it must be 0, 1, 2 or 3``, not the setting's own name,
    which the user never wrote; every other setting it names that a file gave, too (a fix ``use {grad_accum_steps}
    1`` is the file's ``gradient_accumulation_steps``), by its key (file and key where another file gave it).
    ``exc`` itself when none of its settings was read from a file."""
    if exc.field is None:
        return exc
    named = [m.group(1) for m in re.finditer(r"\{([a-z][a-z0-9_]*)\}", exc.template)]
    read = [n for n in dict.fromkeys([exc.field, *named]) if n in named and " " in origins.get(n, "")]
    if not read:
        return exc
    file = origins[read[0]].split(" ", 1)[0]
    template = exc.template
    for name in read:
        where, key = origins[name].split(" ", 1)  # where: file:line
        same = where.split(":", 1)[0] == file.split(":", 1)[0]
        template = template.replace(f"{{{name}}}", key if name == read[0] or same else f"{where} {key}")
    out = InputError(f"{file}: {template}", field=exc.field)
    out.__cause__ = exc
    return out


def _validate(spec: ModelSpec, workload: Workload) -> None:
    par = workload.parallelism
    for name in ("tp", "pp", "dp", "cp", "ep"):
        value = getattr(par, name)
        if value < 1:
            raise InputError(f"{{{name}}} is {value}; it must be at least 1", field=name)
    if par.zero_stage not in (0, 1, 2, 3):
        raise InputError(f"{{zero_stage}} is {par.zero_stage}; it must be 0, 1, 2 or 3", field="zero_stage")
    layer_split = isinstance(workload, ServingConfig) and workload.engine in GGUF_ENGINES  # llama.cpp splits layers
    problem = None if layer_split else tp_head_problem(spec, par.tp)
    if problem:
        raise InputError(f"{{tp}} {par.tp} {problem[0]}; {problem[1]}", field="tp")
    if par.pp > spec.num_layers:
        raise InputError(f"{{pp}} {par.pp} is more than the {spec.num_layers} layers of {spec.name}; use {{pp}} <= "
                         f"{spec.num_layers}", field="pp")
    if par.ep > 1:
        if spec.num_experts == 0:
            raise InputError(f"{{ep}} {par.ep} needs a mixture-of-experts model; {spec.name} has no experts",
                             field="ep")
        if spec.num_experts % par.ep:
            raise InputError(f"{{ep}} {par.ep} does not divide the {spec.num_experts} experts of {spec.name}",
                             field="ep")
        if (par.dp * par.cp * par.tp) % par.ep:
            raise InputError(f"{{ep}} {par.ep} must divide the dp x cp x tp ranks ({par.dp * par.cp * par.tp})",
                             field="ep")
    if isinstance(workload, TrainingConfig):
        _validate_training(workload)
        _validate_training_model(spec, workload)
    else:
        _validate_serving(workload)
        _validate_serving_model(spec, workload)


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` (at least 1), ascending, found in O(sqrt n) steps: n may be a user's
    value (a micro-batch of 10^9 has 100 divisors, found in 31,623 steps)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def tp_head_problem(spec: ModelSpec, tp: int) -> tuple[str, str] | None:
    """Why tensor parallelism ``tp`` cannot split the attention of ``spec``, and the fix; or None.

    tp must divide num_heads of every layer with heads, and either divide num_kv_heads or be a
    multiple of it (vLLM ``QKVParallelLinear`` replicates KV heads beyond num_kv_heads). Layers
    without heads (Mamba mixers, RWKV) set no head rule, but key/value projections in them cannot be
    divided by KV heads. The reason reads after "--tp N" (``"does not divide num_heads (32) of
    MODEL"``), the fix after it (``"use a tp that divides 32"``).
    """
    if tp == 1:
        return None
    kinds = spec.layer_kinds()
    # KV projections are divided by min(tp, num_kv_heads) (memest.estimate.sharding): of the layer
    # that holds them, and of the model for whole-stage sums
    headless_kv = any(t.split is Split.KV for layer, _ in kinds if not layer.attention.has_heads for t in layer.tensors)
    if headless_kv or (spec.num_kv_heads == 0 and any(t.split is Split.KV for t, _ in spec.tensors())):
        return (f"cannot split the key/value projections of {spec.name}, whose layers have no KV heads "
                "(num_kv_heads 0) to divide them by", "use {tp} 1")
    for a, k in dict.fromkeys((layer.attention.num_heads, layer.attention.num_kv_heads)
                              for layer, _ in kinds if layer.attention.has_heads):
        if a % tp:
            return f"does not divide num_heads ({a}) of {spec.name}", f"use a tp that divides {a}"
        if tp > k and tp % k:
            return (f"is above num_kv_heads ({k}) of {spec.name} but not a multiple of it",
                    "KV heads cannot be replicated evenly: use a divisor or a multiple of it")
        if tp <= k and k % tp:
            return f"does not divide num_kv_heads ({k}) of {spec.name}", f"use a tp that divides {k}"
    return None


def workload_notes(spec: ModelSpec, workload: Workload) -> tuple[str, ...]:
    """What the user should know about a valid workload that its estimate does not show.

    A sequence beyond ``max_position_embeddings`` of a model with rotary or ALiBi positions runs (the
    memory is what is estimated) but the model was not trained at that length: it needs RoPE scaling
    (``rope_scaling``) or relies on extrapolation. Models with a learned position table cannot run it
    at all (:func:`validate` refuses).
    """
    said = tuple(getattr(workload, "config_notes", ()))
    return said + _length_notes(spec, workload)


def _length_notes(spec: ModelSpec, workload: Workload) -> tuple[str, ...]:
    limit = spec.max_position_embeddings
    if not limit or spec.learned_positions is not None:
        return ()
    if isinstance(workload, TrainingConfig):
        flag, length = "--seq-len", workload.seq_len
    elif workload.engine is Engine.HF and workload.max_model_len is not None:
        flag, length = "--max-model-len", workload.max_model_len
    else:
        return ()
    if length <= limit:
        return ()
    alibi = any(layer.attention.alibi for layer, _ in spec.layer_kinds())
    how = "relies on ALiBi extrapolation" if alibi else "needs RoPE scaling (rope_scaling) or extrapolation"
    return (f"{flag} {length:,} is beyond {spec.name}'s max_position_embeddings ({limit:,}): the model was not "
            f"trained on sequences this long and {how}; memory is estimated for the length asked",)


def _positive(flag: str, value: int) -> None:
    if value < 1:
        raise InputError(f"{{{flag}}} is {value}; it must be a positive integer", field=flag)


_ATTN_VALUES = frozenset(e.value for e in AttnImplementation)
_LOSS_VALUES = frozenset(e.value for e in Loss)
_FLOAT8_VALUES = frozenset(e.value for e in Float8)


def _validate_float8(t: TrainingConfig) -> None:
    """torchao float8 training converts trained linears (full training); its FSDP2 float8 all-gather
    (``Float8LinearConfig.enable_fsdp_float8_all_gather``) supports tensorwise scaling only (torchao 0.18.0
    ``float8/config.py`` ``__post_init__``) and needs weights sharded by FSDP."""
    if t.method is not Method.FULL or not t.float8_all_gather:  # LoRA / QLoRA never read them (declared: methods)
        return
    if t.float8 != Float8.TENSORWISE:
        raise InputError("{float8_all_gather} needs {float8} tensorwise (torchao's float8 all-gather has no "
                         f"rowwise path); {{float8}} is {Float8(t.float8).value}", field="float8_all_gather")
    if t.parallelism.zero_stage < 3:
        raise InputError("{float8_all_gather} all-gathers FSDP2's sharded weights: add {zero_stage} 3 (FSDP) "
                         "or drop it", field="float8_all_gather")


def _validate_megatron_adapters(t: TrainingConfig) -> None:
    """NeMo's adapters (:attr:`LoraLibrary.MEGATRON`) wrap Megatron-core linears over a 16-bit base: no 4-bit
    base (NeMo 2 has no QLoRA, :mod:`memest.workload.stacks`) and no other framework's layers."""
    if t.lora_library is not LoraLibrary.MEGATRON or (t.stack is not None and not supports(t.stack, t.method)):
        return  # a stack that does not run the method is refused naming the stacks that do
    if t.method is Method.QLORA:
        raise InputError("{lora_library} megatron (NeMo's adapters) has no 4-bit base; use {finetune} lora, or "
                         "another {lora_library} for QLoRA", field="lora_library")
    fw = resolve_framework(t)
    if fw is not Framework.MEGATRON:
        raise InputError(f"{{lora_library}} megatron runs NeMo's adapters inside Megatron-core layers, but the job "
                         f"runs {fw.value}; use {{stack}} nemo, or another {{lora_library}}", field="lora_library")


def _validate_custom_sharded(t: TrainingConfig) -> None:
    """torchtune's ``custom_sharded_layers`` names modules of the decoder that ``fully_shard`` wraps (torchtune
    ``training/_distributed.py`` ``shard_model``); only FSDP reads it (the planner's other layouts leave it unread)."""
    if not t.custom_sharded_layers:
        return
    for name in t.custom_sharded_layers.split(","):
        if name not in CUSTOM_SHARDED_LAYERS:
            raise InputError(f"{{custom_sharded_layers}} has {name!r}; expected {' or '.join(CUSTOM_SHARDED_LAYERS)} "
                             "(the decoder layers are FSDP units already)", field="custom_sharded_layers")


def _validate_training(t: TrainingConfig) -> None:
    _positive("micro_batch_size", t.micro_batch_size)
    _positive("seq_len", t.seq_len)
    _positive("grad_accum_steps", t.grad_accum_steps)
    if t.target_len is not None:
        _positive("target_len", t.target_len)
    for flag, value, enum, values in (("attn_implementation", t.attn_implementation, AttnImplementation, _ATTN_VALUES),
                                      ("loss", t.loss, Loss, _LOSS_VALUES),
                                      ("float8", t.float8, Float8, _FLOAT8_VALUES)):
        if value not in values:
            raise InputError(f"{{{flag}}} {value!r} is not one of {', '.join(e.value for e in enum)}", field=flag)
    _validate_float8(t)
    _validate_custom_sharded(t)
    if t.method is not Method.FULL:
        _positive("lora_rank", t.lora.rank)
        if not 0 <= t.lora.dropout < 1:
            raise InputError(f"{{lora_dropout}} {t.lora.dropout} must be in [0, 1)", field="lora_dropout")
        _validate_megatron_adapters(t)
    par = t.parallelism
    if par.cp > 1 and t.seq_len % (2 * par.cp):
        raise InputError(f"{{seq_len}} {t.seq_len} must be divisible by 2 x cp ({2 * par.cp}) for context parallelism",
                         field="seq_len")
    if par.dp_shard is not None:
        group = par.dp * par.cp
        if par.dp_shard < 1 or group % par.dp_shard:
            raise InputError(f"{{dp_shard}} {par.dp_shard} must divide the dp x cp ranks ({group}); use a divisor "
                             f"of {group}", field="dp_shard")
    one_unsharded = t.stack is not None and STACKS[t.stack].one_unsharded  # its own refusal: _validate_device_count
    if t.offload is not Offload.NONE and par.zero_stage == 0 and not one_unsharded:
        raise InputError(f"{{offload}} {t.offload.value} needs ZeRO ({{zero_stage}} 1-3 or FSDP); add {{zero_stage}} 3",
                         field="offload")
    if t.offload is Offload.PARAMS and par.zero_stage != 3 and resolve_framework(t) is Framework.FSDP:
        # torch runs it: FSDP1 CPUOffload(offload_params=True) takes any sharded strategy (_flat_param.py
        # uses_sharded_strategy), FSDP2 fully_shard(reshard_after_forward=False, offload_policy=CPUOffloadPolicy())
        # has no check against it (torch 2.13 _fully_shard.py); memest does not model that pairing
        raise InputError("{offload} (the parameters offloaded) with {fsdp} keeping each unit gathered from forward to "
                         "backward (SHARD_GRAD_OP, ZeRO-2) is not modelled: torch runs it, memest models offloaded "
                         "parameters only when each unit is resharded after its forward; make it FULL_SHARD (in an "
                         "accelerate config fsdp_sharding_strategy: FULL_SHARD, or fsdp_reshard_after_forward: true "
                         "under fsdp_version 2)", field="offload")
    if t.offload is Offload.PARAMS and par.zero_stage != 3:
        raise InputError("parameter offload ({offload}) needs {zero_stage} 3 (DeepSpeed offloads parameters only "
                         "under ZeRO-3, where they are partitioned)", field="offload")
    _validate_in_backward(t)
    if t.method is Method.QLORA and t.precision is Precision.FP32:
        raise InputError("{finetune} qlora computes in 16-bit; use {precision} bf16 or fp16 instead of fp32",
                         field="finetune")
    _validate_stack(t)
    _validate_framework(t, resolve_framework(t))


def _validate_stack(t: TrainingConfig) -> None:
    """A method the job's stack does not run (:attr:`memest.workload.stacks.StackDefaults.methods`), and a
    sharding setting the stack would not read: DeepSpeed and Megatron-LM / NeMo run their own engine, so an
    FSDP strategy or another framework named with them is refused, not dropped.

    Raises:
        InputError: naming the pair and the stacks that do run the method (or the stack's own framework).
    """
    if t.stack is None:
        return
    d = STACKS[t.stack]
    if not supports(t.stack, t.method):
        others = ", ".join(k.value for k in stacks_supporting(t.method))
        words = {Method.LORA: "LoRA", Method.QLORA: "QLoRA (4-bit base)"}.get(t.method, t.method.value)
        assumed = f" (assumed: {t.stack_assumed})" if t.stack_assumed else ""
        raise InputError(f"{{finetune}} {t.method.value} does not run under {{stack}} {t.stack.value}{assumed}: "
                         f"{d.label} has no {words} in-tree; stacks that run it: {others}", field="finetune")
    _validate_device_count(t)
    # a stack named with another framework (an assumed one is the framework's own, unless a caller set it)
    if (not t.stack_assumed and d.one in (Framework.DEEPSPEED, Framework.MEGATRON)
            and t.framework not in (Framework.AUTO, d.one)):
        named = "{fsdp} / {framework} fsdp" if t.framework is Framework.FSDP else f"{{framework}} {t.framework.value}"
        own = "its ZeRO is {zero_stage}" if d.one is Framework.DEEPSPEED else "its distributed optimizer is {zero_stage} 1"
        raise InputError(f"{{stack}} {t.stack.value} runs {d.label}'s own engine, which would not read {named}: drop "
                         f"it ({own}), or name a stack that runs it (FSDP: {{stack}} accelerate, fsdp, torchtune or "
                         "hf-trainer)", field="stack")
    if (not t.stack_assumed and t.precision is Precision.MIXED and d.zero is Framework.DEEPSPEED
            and d.one is not Framework.DEEPSPEED and resolve_framework(t) in (Framework.PYTORCH, Framework.DDP)):
        # transformers 4.57: bf16 parameters over an fp32 master exist only under DeepSpeed (its bf16.enabled); the
        # Trainer's own bf16=True / fp16=True autocast over fp32 parameters (module memest.workload.stacks)
        raise InputError(f"{{precision}} mixed (bf16 params, fp32 master) is DeepSpeed's recipe; {d.label} without "
                         f"DeepSpeed runs {d.bf16} as {d.recipe}: drop {{precision}} (or {{precision}} amp), or add "
                         "{zero_stage} 1-3 to run it under DeepSpeed", field="precision")
    if not t.stack_assumed and not runs_engine(t.stack, t.framework):
        fw = t.framework
        words = {Framework.DEEPSPEED: "DeepSpeed", Framework.MEGATRON: "Megatron-LM"}.get(fw, fw.value)
        others = [k.value for k in stacks_running(fw)]
        shards = " (it shards with FSDP: {zero_stage} 2 / 3)" if d.many[0] is Framework.FSDP else ""
        where = read_origins(t.config_read).get("framework")  # a config file's engine: name the file
        named = f"{{framework}} {fw.value}" if where is None else f"{fw.value} ({where.replace(' ', ': ', 1)})"
        raise InputError(f"{{stack}} {t.stack.value} does not run {named}: {d.label} has no {words} "
                         f"path; drop {'it' if where is None else 'that file'}{shards}, or use a stack that runs {words}: "
                         f"{{stack}} {', '.join(others[:-1])} or {others[-1]}", field="stack")


def _validate_device_count(t: TrainingConfig) -> None:
    """What a stack fixes by its device count (:attr:`memest.workload.stacks.StackDefaults.many_fixed`,
    ``many_methods``, ``one_unsharded``; litgpt ``finetune/full.py`` / ``lora.py`` at commit 0077627d: its
    ``FSDPStrategy`` on several devices, strategy ``"auto"`` on one, and no ``--quantize`` on several).

    Raises:
        InputError: a method the stack does not run on several devices, a ``recompute``, ``zero_stage`` or
            ``offload`` other than the one it hard-codes there, or a ZeRO stage or an offload on one device where
            it shards nothing.
    """
    assert t.stack is not None
    d, par = STACKS[t.stack], t.parallelism
    gpus = par.world_size
    if gpus > 1 and d.many_methods is not None and t.method not in d.many_methods:
        words = {Method.QLORA: "QLoRA (a quantized base)"}.get(t.method, t.method.value)
        raise InputError(f"{{finetune}} {t.method.value} does not run on several devices under {{stack}} "
                         f"{t.stack.value}: {d.label} has no multi-GPU {words}; use {{gpus}} 1, or another {{stack}}",
                         field="finetune")
    fixed = dict(d.many_fixed)
    if gpus > 1 and "recompute" in fixed and t.recompute is not fixed["recompute"]:
        raise InputError(f"{{recompute}} {t.recompute.value} does not run on several devices under {{stack}} "
                         f"{t.stack.value}: {d.label} checkpoints every layer there; drop it (or {{recompute}} "
                         f"{Recompute(fixed['recompute']).value}), or use {{gpus}} 1", field="recompute")
    if gpus > 1 and "zero_stage" in fixed and par.zero_stage != fixed["zero_stage"]:
        raise InputError(f"{{zero_stage}} {par.zero_stage} does not run on several devices under {{stack}} "
                         f"{t.stack.value}: {d.label} shards with FSDP FULL_SHARD there (zero stage "
                         f"{fixed['zero_stage']}); drop it, or use another {{stack}}", field="zero_stage")
    if gpus > 1 and "offload" in fixed and t.offload is not fixed["offload"]:
        raise InputError(f"{{offload}} {t.offload.value} does not run on several devices under {{stack}} "
                         f"{t.stack.value}: {d.label}'s FSDPStrategy there sets cpu_offload=False; drop it, or use "
                         "another {stack}", field="offload")
    if gpus == 1 and d.one_unsharded and t.offload is not Offload.NONE:
        raise InputError(f"{{offload}} {t.offload.value} does not run on one device under {{stack}} {t.stack.value}: "
                         f"{d.label} runs no sharding backend there (strategy \"auto\"), so nothing offloads; drop it",
                         field="offload")
    if gpus == 1 and d.one_unsharded and par.zero_stage:
        raise InputError(f"{{zero_stage}} {par.zero_stage} does not run on one device under {{stack}} "
                         f"{t.stack.value}: {d.label} runs no FSDP there; drop it, or use more {{gpus}}",
                         field="zero_stage")


def _validate_in_backward(t: TrainingConfig) -> None:
    """The optimizer step in backward and activation offloading, as the stacks that have them allow them
    (torchtune 0.6 ``recipes/full_finetune_*.py`` ``__init__``: no gradient accumulation with
    ``optimizer_in_bwd``; ``enable_activation_offloading`` only with ``enable_activation_checkpointing``)."""
    stack = STACKS[t.stack] if t.stack is not None else None
    if t.optimizer_in_bwd and t.method is Method.FULL:  # a full-training setting: LoRA jobs do not read it
        if stack is not None and stack.optimizer_in_bwd is None:
            raise InputError(f"{{optimizer_in_bwd}} is torchtune's; {stack.label} has no optimizer step in backward: "
                             "drop it or use {stack} torchtune", field="optimizer_in_bwd")
        if t.grad_accum_steps > 1:
            raise InputError(f"{{optimizer_in_bwd}} steps each parameter as its gradient is made, so it cannot "
                             f"accumulate {{grad_accum_steps}} {t.grad_accum_steps} micro-batches (torchtune refuses "
                             "it): use {grad_accum_steps} 1 or drop {optimizer_in_bwd}", field="optimizer_in_bwd")
        if resolve_framework(t) not in (Framework.PYTORCH, Framework.FSDP):
            raise InputError(f"{{optimizer_in_bwd}} runs under torchtune's single-device and FSDP recipes, not "
                             f"{{framework}} {resolve_framework(t).value}: drop it", field="optimizer_in_bwd")
    if t.activation_offloading:
        if stack is not None and stack.activation_offloading is None:
            having = " or ".join(k.value for k, d in STACKS.items() if d.activation_offloading is not None)
            raise InputError(f"{{activation_offloading}} is torchtune's enable_activation_offloading, trl's "
                             f"activation_offloading or unsloth's gradient checkpointing; {stack.label} has none: drop "
                             f"it or use {{stack}} {having}", field="activation_offloading")
        if t.recompute is not Recompute.FULL:
            raise InputError(f"{{activation_offloading}} is modelled for activation checkpoints moved to host RAM and "
                             f"needs {{recompute}} full (not {t.recompute.value}), as torchtune requires "
                             "enable_activation_checkpointing", field="activation_offloading")


def _validate_training_model(spec: ModelSpec, t: TrainingConfig) -> None:
    """Checks that need the model: decoder length, sequence length, LoRA targets.

    Raises:
        InputError: ``--target-len`` on a model without a decoder stack of its own (not seq2seq);
            a length beyond a learned absolute position table (:attr:`ModelSpec.learned_positions`);
            ``--lora-targets`` naming no module or a module the model does not have; ``--lora-rank``
            above the hidden size.
    """
    if t.target_len is not None and spec.task != "seq2seq":
        raise InputError(f"{{target_len}} applies to encoder-decoder models (T5); {spec.name} is {spec.task}: "
                         "drop {target_len} and set the whole sequence with {seq_len}", field="target_len")
    pp = t.parallelism.pp
    if pp > 1 and spec.num_layers % pp and resolve_framework(t) is Framework.MEGATRON:
        # Megatron-LM megatron/training/arguments.py validate_args: without decoder_first/last_pipeline_num_layers
        # (uneven stages, not modelled), "assert num_layers % transformer_pipeline_model_parallel_size == 0,
        # 'Number of layers should be divisible by the pipeline-model-parallel size'"
        ok = ", ".join(str(n) for n in divisors(spec.num_layers) if 1 < n <= max(pp * 4, 8))
        raise InputError(f"{{pp}} {pp} does not divide the {spec.num_layers} layers of {spec.name}: Megatron-LM "
                         "asserts 'Number of layers should be divisible by the pipeline-model-parallel size' unless "
                         f"uneven first / last stages are set (not modelled); use a {{pp}} that divides "
                         f"{spec.num_layers}" + (f" ({ok})" if ok else ""), field="pp")
    table = spec.learned_positions
    if table is not None:
        for flag, value in (("seq_len", t.seq_len), ("target_len", t.target_len)):
            if value is not None and value > table:
                raise InputError(f"{{{flag}}} {value} is more than the {table} positions of {spec.name}'s learned "
                                 f"position embeddings (no row for position {table}); use {{{flag}}} <= {table}",
                                 field=flag)
    if t.method is not Method.FULL:
        _validate_lora_targets(spec, t.lora.targets)
        if t.lora.rank > spec.hidden_size:
            raise InputError(f"{{lora_rank}} {t.lora.rank} is more than {spec.name}'s hidden size "
                             f"({spec.hidden_size}): "
                             "the adapters would be larger than a full-rank update; use {lora_rank} <= "
                             f"{spec.hidden_size} (typically 8-256)", field="lora_rank")


def lora_module_names(spec: ModelSpec) -> tuple[str, ...]:
    """Module names (the last part, ``q_proj``) that ``--lora-targets`` may name, in model order
    (:func:`memest.lora_targets.nameable_modules`)."""
    return lora_targets.nameable_modules(spec)


def _validate_lora_targets(spec: ModelSpec, targets: str) -> None:
    """``--lora-targets``: ``attention`` (needs attention projections), ``all-linear``, or module
    names of :func:`lora_module_names`.

    Raises:
        InputError: an empty list or item, an unknown name (PEFT raises "Target modules ... not
            found" when none matches), or ``attention`` on a model without attention projections.
    """
    known = lora_module_names(spec)
    choices = ", ".join(known) or "none"
    if targets == lora_targets.ALL_LINEAR:
        return
    if targets == lora_targets.ATTENTION:
        if not lora_targets.layer_modules(spec, targets):
            raise InputError(f"{{lora_targets}} attention: {spec.name} has no attention projections; name its modules "
                             f"instead (it has {choices}) or use all-linear", field="lora_targets")
        return
    items = lora_targets.named_modules(targets)
    if not any(items) or not all(items):
        raise InputError(f"{{lora_targets}} {targets!r} has an empty module name; write attention, all-linear, or "
                         f"names separated by commas from those of {spec.name}: {choices}", field="lora_targets")
    unknown = [x for x in items if x not in known]
    if unknown:
        raise InputError(f"{{lora_targets}} names {', '.join(map(repr, unknown))}, not a module of {spec.name} (PEFT "
                         f"would raise 'Target modules not found'); use attention, all-linear or some of: {choices}",
                         field="lora_targets")


def _validate_framework(t: TrainingConfig, fw: Framework) -> None:
    par = t.parallelism
    name = fw.value
    if fw is Framework.PYTORCH and par.world_size > 1:
        raise InputError(f"{{framework}} pytorch runs one process, but the job has {par.world_size} devices; "
                         "use {framework} ddp, fsdp, deepspeed or megatron", field="framework")
    if fw in (Framework.PYTORCH, Framework.DDP) and par.zero_stage:
        raise InputError(f"{{framework}} {name} does not shard states; drop {{zero_stage}} {par.zero_stage} "
                         "or use {framework} deepspeed / fsdp", field="framework")
    if fw in (Framework.PYTORCH, Framework.DDP) and (par.tp > 1 or par.pp > 1):
        raise InputError(f"{{framework}} {name} has no tensor or pipeline parallelism; use {{framework}} megatron",
                         field="framework")
    if fw is Framework.MEGATRON and par.zero_stage > 1:
        raise InputError(f"{{framework}} megatron shards only optimizer states (distributed optimizer = "
                         f"{{zero_stage}} 1), not {{zero_stage}} {par.zero_stage}", field="framework")
    if fw is Framework.FSDP and par.zero_stage == 1:
        raise InputError("FSDP has no ZeRO-1; use {zero_stage} 2 (SHARD_GRAD_OP) or 3 (FULL_SHARD)", field="zero_stage")
    if t.precision is Precision.FSDP2 and fw is not Framework.FSDP:
        raise InputError(f"{{precision}} fsdp2 is FSDP's mixed precision; it cannot run under {{framework}} {name}",
                         field="precision")
    if t.offload is not Offload.NONE and fw not in (Framework.DEEPSPEED, Framework.FSDP):
        raise InputError(f"{{offload}} {t.offload.value} is a DeepSpeed / FSDP feature; use {{framework}} deepspeed "
                         "or fsdp", field="offload")
    if t.offload is Offload.OPTIMIZER and fw is Framework.FSDP:
        raise InputError("FSDP offloads parameters, gradients and optimizer states together (CPUOffloadPolicy); "
                         "use {offload} params, or {framework} deepspeed for optimizer-only offload", field="offload")


def _validate_serving(s: ServingConfig) -> None:
    _positive("batch_size", s.batch_size)
    _positive("block_size", s.block_size)
    if s.engine is Engine.VLLM and s.block_size not in BLOCK_SIZES:
        raise InputError(f"{{block_size}} {s.block_size} is not one vLLM accepts; use one of "
                         f"{', '.join(map(str, BLOCK_SIZES))}", field="block_size")
    if s.max_model_len is not None:
        _positive("max_model_len", s.max_model_len)
    if s.max_num_batched_tokens is not None:
        _positive("max_num_batched_tokens", s.max_num_batched_tokens)
        if s.engine is Engine.VLLM and s.max_num_seqs is not None and s.max_num_batched_tokens < s.max_num_seqs:
            raise InputError(f"{{max_num_batched_tokens}} {s.max_num_batched_tokens} is less than {{max_num_seqs}} "
                             f"{s.max_num_seqs}; vLLM refuses it (SchedulerConfig: max_num_batched_tokens must be >= "
                             "max_num_seqs): raise it or lower {max_num_seqs}", field="max_num_batched_tokens")
    if s.max_num_seqs is not None:
        _positive("max_num_seqs", s.max_num_seqs)
        if s.engine is Engine.VLLM and s.batch_size > s.max_num_seqs:
            raise InputError(f"{{batch_size}} {s.batch_size} is more than {{max_num_seqs}} {s.max_num_seqs}: vLLM "
                             "runs at most max_num_seqs requests at once (the rest queue); raise {max_num_seqs} or "
                             "lower {batch_size}", field="batch_size")
    if s.prompt_len is not None:
        _positive("prompt_len", s.prompt_len)
    if s.max_new_tokens is not None:
        _positive("max_new_tokens", s.max_new_tokens)
    if s.prompt_len is not None and s.max_new_tokens is not None and s.max_model_len is not None \
            and s.prompt_len + s.max_new_tokens > s.max_model_len:
        raise InputError(f"{{prompt_len}} {s.prompt_len} + {{max_new_tokens}} {s.max_new_tokens} exceeds "
                         f"{{max_model_len}} "
                         f"{s.max_model_len}; raise {{max_model_len}} or shorten them", field="prompt_len")
    versions = ENGINE_VERSIONS[s.engine.value]
    if s.engine_version is not None and s.engine_version not in versions:
        raise InputError(f"{{engine_version}} {s.engine_version!r} is not a {s.engine.value} version memest models; "
                         f"use one of {', '.join(versions)}", field="engine_version")
    if not 0 < s.gpu_memory_utilization <= 1:
        raise InputError(f"{{gpu_memory_utilization}} is {s.gpu_memory_utilization}; it must be in (0, 1]",
                         field="gpu_memory_utilization")
    _validate_sglang_trtllm(s)
    if s.dtype not in WEIGHT_DTYPES:
        raise InputError(f"{{dtype}} {s.dtype!r} is not one of {', '.join(WEIGHT_DTYPES)}", field="dtype")
    if s.engine in (Engine.LLAMACPP, Engine.OLLAMA):
        return  # GGUF file and cache types: memest.estimate.serving.llamacpp.engine.settings checks them
    if s.quantization not in QUANTIZATIONS:
        raise InputError(f"{{quantization}} {s.quantization!r} is not one of {', '.join(QUANTIZATIONS)}",
                         field="quantization")
    if s.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise InputError(f"{{kv_cache_dtype}} {s.kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}",
                         field="kv_cache_dtype")


def _validate_sglang_trtllm(s: ServingConfig) -> None:
    """The SGLang and TensorRT-LLM settings: sizes positive, fractions in range, the batch within
    the engine's cap on concurrent requests (the rest would queue)."""
    if s.mem_fraction_static is not None and not 0 < s.mem_fraction_static < 1:
        raise InputError(f"{{mem_fraction_static}} is {s.mem_fraction_static}; it must be in (0, 1), e.g. 0.88",
                         field="mem_fraction_static")
    if not 0 < s.kv_cache_free_gpu_mem_fraction <= 1:
        raise InputError(f"{{kv_cache_free_gpu_mem_fraction}} is {s.kv_cache_free_gpu_mem_fraction}; it must be in "
                         "(0, 1], e.g. 0.9", field="kv_cache_free_gpu_mem_fraction")
    _positive("page_size", s.page_size)
    _positive("tokens_per_block", s.tokens_per_block)
    if s.tokens_per_block & (s.tokens_per_block - 1):
        raise InputError(f"{{tokens_per_block}} {s.tokens_per_block} is not a power of two; TensorRT-LLM requires "
                         "one (e.g. 32 or 64)", field="tokens_per_block")
    for name in ("max_running_requests", "chunked_prefill_size", "max_batch_size", "max_num_tokens"):
        if getattr(s, name) is not None:
            _positive(name, getattr(s, name))
    for name in ("max_running_requests", "max_batch_size"):
        cap = getattr(s, name)
        if cap is not None and s.batch_size > cap:
            raise InputError(f"{{batch_size}} {s.batch_size} is more than {{{name}}} {cap}: the engine runs at most "
                             f"{plural(cap, 'request')} at once (the rest queue); raise {{{name}}} or lower {{batch_size}}",
                             field="batch_size")


def _several_devices(spec: ModelSpec, serving: frozenset[Engine] | None) -> str:
    """The fix for a model asked of ``--engine hf`` on several devices: the first engine that serves the
    family and splits it (vLLM, SGLang, TensorRT-LLM by tensor / pipeline parallelism; llama.cpp by layers over
    {gpus}), or one device where only transformers serves it (RWKV-4 / RWKV-5: :data:`ENGINES_SERVING`)."""
    for engine in (Engine.VLLM, Engine.SGLANG, Engine.TRTLLM):
        if serving is None or engine in serving:
            return f"use {{engine}} {engine.value} for {{tp}}/{{pp}}"
    if Engine.LLAMACPP in serving:
        return "use {engine} llama.cpp, which splits the layers over the devices of {gpus}"
    return (f"no engine memest models serves model_type {spec.model_type!r} on more than one device; "
            "serve it on one device ({gpus} 1, no {tp} / {pp})")


def _validate_serving_model(spec: ModelSpec, s: ServingConfig) -> None:
    """Checks that need the model: the engine serves it, the length, and for vLLM the dtype.

    Raises:
        InputError: an engine that does not serve the model_type (:data:`ENGINES_SERVING`);
        InputError: for vLLM, ``--dtype fp16`` for a model type vLLM refuses it for (:data:`VLLM_NO_FLOAT16`);
        InputError: for vLLM, max_model_len beyond the model's max_position_embeddings (vLLM
            refuses it too, without ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``); for any engine, a length
            beyond a learned absolute position table (:attr:`ModelSpec.learned_positions`).
    """
    serving = ENGINES_SERVING.get(spec.model_type)
    if serving is not None and s.engine not in serving:
        names = ", ".join(e.value for e in Engine if e in serving)
        raise InputError(f"{s.engine.value} does not serve model_type {spec.model_type!r} ({spec.name}); engines "
                         f"that do: {names}; use {{engine}} "
                         f"{next((e for e in Engine if e in serving and e is not Engine.HF), Engine.HF).value}",
                         field="engine")
    if s.engine is Engine.HF and (s.parallelism.tp > 1 or s.parallelism.pp > 1):
        raise InputError("{engine} hf models one device (generate has no tensor/pipeline parallelism); "
                         + _several_devices(spec, serving), field="engine")
    if s.engine is Engine.VLLM and s.dtype in ("fp16", "float16") and spec.model_type in VLLM_NO_FLOAT16:
        raise InputError(f"vLLM refuses {{dtype}} {s.dtype} for model_type {spec.model_type!r} of {spec.name} "
                         "(numerical instability; vllm/config/model.py _FLOAT16_NOT_SUPPORTED_MODELS); use "
                         "{dtype} bf16 or fp32", field="dtype")
    stored = spec.quantization.method if spec.quantization is not None else None
    if stored is not None and s.quantization not in ("none", stored):
        # vLLM: "Quantization method specified in the model config (...) does not match the quantization
        # method specified in the `quantization` argument" (ModelConfig._verify_quantization)
        raise InputError(f"{{quantization}} {s.quantization} for {spec.name}, whose checkpoint is already quantized "
                         f"({stored}, its quantization_config): it loads as stored; drop {{quantization}}",
                         field="quantization")
    limit = spec.max_position_embeddings
    if s.engine is Engine.VLLM and s.max_model_len is not None and limit is not None and s.max_model_len > limit:
        raise InputError(f"{{max_model_len}} {s.max_model_len} is more than {spec.name}'s max_position_embeddings "
                         f"({limit}); use {{max_model_len}} <= {limit}", field="max_model_len")
    table = spec.learned_positions
    total = s.max_model_len
    if total is None and s.prompt_len is not None:
        total = s.prompt_len + (s.max_new_tokens or 0)
    if table is not None and total is not None and total > table:
        raise InputError(f"a sequence of {total} tokens is more than the {table} positions of {spec.name}'s learned "
                         f"position embeddings (no row for position {table}); keep {{max_model_len}} (or "
                         f"{{prompt_len}} + "
                         f"{{max_new_tokens}}) <= {table}", field="max_model_len")
