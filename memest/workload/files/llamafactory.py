"""LLaMA-Factory's training YAML (``src/llamafactory/hparams/``; examples ``examples/train_*/*.yaml``).

Keys read: ``model_name_or_path``; ``finetuning_type`` (``lora``, ``full``; ``freeze``: a note, estimated as
full), ``quantization_bit`` 4 with LoRA (QLoRA), ``lora_rank``, ``lora_dropout``, ``lora_target`` (``all``:
every linear); ``cutoff_len``, ``per_device_train_batch_size``, ``gradient_accumulation_steps``; ``bf16`` /
``fp16`` / ``pure_bf16``; ``optim``; ``flash_attn`` (``fa2``, ``sdpa``, ``disabled``: eager);
``enable_liger_kernel``, ``use_unsloth`` (unsloth's fused loss and checkpointing); ``deepspeed`` (a JSON path,
in the examples relative to the repository root: looked for above the recipe too);
``disable_gradient_checkpointing``.

Precision: LLaMA-Factory loads the model 16-bit: at its compute dtype up to v0.9.3 (``hparams/parser.py``: bf16
under ``bf16`` / ``pure_bf16``, fp16 under ``fp16``, else ``extras/misc.py`` ``infer_optim_dtype``: bf16 where the
device has it, else fp16; ``model/patcher.py`` ``patch_config``: ``init_kwargs["torch_dtype"] =
model_args.compute_dtype``), at the checkpoint's stored dtype from v0.9.4 (``model/loader.py`` ``load_model``:
``init_kwargs["torch_dtype"] = "auto"``, bf16 for the checkpoints it trains). ``model/adapter.py`` ``init_adapter``
then upcasts the trained parameters to fp32 (``cast_trainable_params_to_fp32``, unless ``pure_bf16``) and the
Trainer autocasts: a full fine-tune is the stack's ``amp`` recipe (every parameter trains, so fp32), a LoRA keeps
its frozen base 16-bit with fp32 adapters: memest's ``bf16`` recipe. Read at LLaMA-Factory v0.9.3 and
ff6d4d12e (v0.9.6.dev0).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memest.workload.config import AttnImplementation, Loss, Method, Precision, Recompute, Stack
from memest.workload.files._common import Found, typed
from memest.workload.files.trainer import Recipe

NAME = "a LLaMA-Factory YAML (stage, finetuning_type, cutoff_len)"
MARKERS = frozenset({"finetuning_type", "cutoff_len", "lora_target", "quantization_bit", "template"})
READS = ("model_name_or_path", "stage", "finetuning_type", "quantization_bit", "lora_rank", "lora_dropout",
         "lora_target", "cutoff_len", "per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "fp16",
         "pure_bf16", "optim", "flash_attn", "enable_liger_kernel", "use_unsloth", "deepspeed",
         "disable_gradient_checkpointing")
IGNORED = {
    "use_unsloth_gc": ("unsloth's offloaded gradient checkpoints", False),
    "freeze_trainable_layers": ("the layers a freeze fine-tune trains", None),
    "use_galore": ("GaLore's low-rank optimizer states", False),
    "use_badam": ("BAdam's block-wise optimizer states", False),
    "use_apollo": ("APOLLO's low-rank optimizer states", False),
}
"""Memory-relevant keys memest does not model -> (what they size, the default)."""
_ATTN = {"fa2": AttnImplementation.FLASH_ATTENTION_2, "sdpa": AttnImplementation.SDPA,
         "disabled": AttnImplementation.EAGER, "eager": AttnImplementation.EAGER}


def detect(doc: Any, text: str) -> bool:
    """Whether ``doc`` is a LLaMA-Factory config: a mapping with one of :data:`MARKERS`."""
    return isinstance(doc, dict) and bool(MARKERS & set(doc))


def read(path: Path, doc: dict[str, Any]) -> Found:
    """The settings a LLaMA-Factory config implies."""
    r = Recipe(path, doc)
    r.name_model("model_name_or_path")
    r.put("stack", Stack.LLAMAFACTORY, "finetuning_type")
    kind = str(typed(path, "finetuning_type", doc.get("finetuning_type", "lora"), str, "lora, full or freeze")).lower()
    if kind == "freeze":
        r.notes.append(f"{path.name}: finetuning_type freeze trains a few layers; memest estimates it as full "
                       "training (an upper bound)")
    stage = str(doc.get("stage", "sft")).lower()
    if stage not in ("sft", "pt"):
        r.notes.append(f"{path.name}: stage {stage} also holds a reference (ppo: reward and value) model or its "
                       "adapters' base; memest estimates the policy's training only")
    bits = doc.get("quantization_bit")
    if bits is not None:
        typed(path, "quantization_bit", bits, int, "4 or 8")
    method = Method.FULL if kind != "lora" else Method.QLORA if bits == 4 else Method.LORA
    r.mode(method, "finetuning_type" if bits != 4 else "quantization_bit")
    if bits == 8 and method is not Method.FULL:
        r.notes.append(f"{path.name}: quantization_bit 8 (an int8 base) is not modelled; estimated as LoRA on a "
                       "16-bit base (an upper bound)")
    if method is not Method.FULL:
        r.integer("lora_rank", "lora_rank")
        r.number("lora_dropout", "lora_dropout")
        target = doc.get("lora_target")
        if target is not None:
            target = str(typed(path, "lora_target", target, str, "all or comma-separated module names"))
            r.put("lora_targets", "all-linear" if target == "all" else target, "lora_target")
    r.integer("cutoff_len", "seq_len")
    r.integer("per_device_train_batch_size", "micro_batch_size")
    r.integer("gradient_accumulation_steps", "grad_accum_steps")
    if r.flag("disable_gradient_checkpointing"):
        r.put("recompute", Recompute.NONE, "disable_gradient_checkpointing")
    r.optimizer("optim")
    attn = doc.get("flash_attn")
    if attn is not None:
        name = str(typed(path, "flash_attn", attn, str, "auto, fa2, sdpa or disabled")).lower()
        if name in _ATTN:
            r.put("attn_implementation", _ATTN[name], "flash_attn")
    for key in ("enable_liger_kernel", "use_unsloth"):
        if r.flag(key):
            r.put("loss", Loss.FUSED, key)
    if r.flag("use_unsloth"):
        r.put("recompute", Recompute.FULL, "use_unsloth")
    r.precision(method, default_bf16=False, sharded=False)
    if r.flag("pure_bf16"):
        r.put("precision", Precision.BF16, "pure_bf16")
    elif method is Method.LORA:  # the frozen base stays at the 16-bit load dtype (module docstring)
        r.put("precision", Precision.BF16, r.origins.get("precision", "finetuning_type"))
        if r.flag("bf16") or r.flag("fp16"):
            r.notes.append(f"{path.name}: {'fp16' if r.flag('fp16') else 'bf16'} autocasts over the 16-bit frozen "
                           "base; memest counts its casts of the fp32 adapters' inputs as PEFT's fp32 copies "
                           "(an upper bound)")
    r.deepspeed("deepspeed")
    return r.found()
