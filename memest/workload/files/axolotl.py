"""axolotl's YAML config (``src/axolotl/utils/schemas/config.py``; examples ``examples/*/*.yml``).

Keys read: ``base_model``; ``adapter`` (``lora`` / ``qlora``; ``load_in_4bit`` with ``lora`` is QLoRA),
``lora_r``, ``lora_dropout``, ``lora_target_modules`` / ``lora_target_linear``; ``sequence_len``,
``micro_batch_size``, ``gradient_accumulation_steps``, ``gradient_checkpointing``; ``bf16`` (``auto``: bf16 where
the device has it) / ``fp16``; ``optimizer`` (transformers' names); ``attn_implementation``, ``flash_attention`` / ``sdp_attention`` /
``attention``; ``deepspeed``; ``fsdp`` / ``fsdp_config`` (``fsdp_offload_params``); the Liger plugin's
``liger_fused_linear_cross_entropy`` and ``cut_cross_entropy`` (a fused loss).

Precision: ``bf16`` (``fp16``) loads the weights 16-bit (``utils/config/__init__.py`` ``normalize_config``:
``cfg.torch_dtype = torch.bfloat16`` under ``bf16``; ``loaders/model.py`` at 002a637c8:
``self.model_kwargs["torch_dtype"] = self.cfg.torch_dtype`` into ``from_pretrained``): a full fine-tune trains
them in place (the axolotl stack's recipe: pure bf16 states, sharded so under FSDP), a LoRA keeps its frozen base
16-bit with PEFT's fp32 adapters (memest's ``bf16`` recipe; autocast's casts of the adapters' inputs counted as
fp32 copies, an upper bound); under DeepSpeed, DeepSpeed's bf16. A QLoRA base is NF4 (``amp``: autocast over
fp32 adapters).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memest.workload.config import AttnImplementation, Loss, Method, Offload, Precision, Stack
from memest.workload.files._common import Found, typed
from memest.workload.files.trainer import Recipe

NAME = "an axolotl YAML (base_model, micro_batch_size, sequence_len)"
MARKERS = frozenset({"base_model", "micro_batch_size", "sequence_len", "adapter", "lora_target_linear"})
READS = ("base_model", "adapter", "load_in_4bit", "lora_r", "lora_dropout", "lora_target_modules",
         "lora_target_linear", "sequence_len", "micro_batch_size", "gradient_accumulation_steps",
         "gradient_checkpointing", "bf16", "fp16", "optimizer", "attn_implementation", "flash_attention", "sdp_attention", "attention",
         "deepspeed", "fsdp", "fsdp_config.fsdp_offload_params", "liger_fused_linear_cross_entropy",
         "cut_cross_entropy", "sample_packing", "torch_compile")
IGNORED = {
    "load_in_8bit": ("int8 base weights under LoRA; memest keeps the base at its storage dtype", False),
    "activation_offloading": ("activations kept in host memory", False),
    "lora_mlp_kernel": ("axolotl's fused LoRA MLP kernel (fewer saved activations)", False),
    "lora_qkv_kernel": ("axolotl's fused LoRA QKV kernel (fewer saved activations)", False),
    "tensor_parallel_size": ("tensor parallelism under axolotl", 1),
    "context_parallel_size": ("context (sequence) parallelism under axolotl", 1),
}
"""Memory-relevant keys memest does not model -> (what they size, the default)."""


def detect(doc: Any, text: str) -> bool:
    """Whether ``doc`` is an axolotl config: a mapping with one of :data:`MARKERS`."""
    return isinstance(doc, dict) and bool(MARKERS & set(doc))


def read(path: Path, doc: dict[str, Any]) -> Found:
    """The settings an axolotl config implies."""
    r = Recipe(path, doc)
    r.name_model("base_model")
    r.put("stack", Stack.AXOLOTL, "base_model")
    adapter = doc.get("adapter")
    if adapter is not None:
        adapter = str(typed(path, "adapter", adapter, str, "lora or qlora")).lower()
    if adapter not in (None, "lora", "qlora"):
        r.notes.append(f"{path.name}: adapter {adapter} is not modelled (memest models lora and qlora); "
                       "estimated as lora")
    method = Method.FULL if adapter is None else \
        Method.QLORA if adapter == "qlora" or r.flag("load_in_4bit") else Method.LORA
    r.mode(method, "adapter")
    if method is not Method.FULL:
        r.integer("lora_r", "lora_rank")
        r.number("lora_dropout", "lora_dropout")
        if r.flag("lora_target_linear"):
            r.put("lora_targets", "all-linear", "lora_target_linear")
        else:
            r.targets("lora_target_modules")
    r.integer("sequence_len", "seq_len")
    r.integer("micro_batch_size", "micro_batch_size")
    r.integer("gradient_accumulation_steps", "grad_accum_steps")
    r.checkpointing("gradient_checkpointing")
    r.optimizer("optimizer")
    r.attention("attn_implementation")
    if r.flag("flash_attention") or doc.get("attention") == "flash":
        r.put("attn_implementation", AttnImplementation.FLASH_ATTENTION_2,
              "flash_attention" if "flash_attention" in doc else "attention")
    elif r.flag("sdp_attention") or doc.get("attention") == "sdpa":
        r.put("attn_implementation", AttnImplementation.SDPA, "sdp_attention" if "sdp_attention" in doc else "attention")
    for key in ("liger_fused_linear_cross_entropy", "cut_cross_entropy"):
        if r.flag(key):
            r.put("loss", Loss.FUSED, key)
    if r.flag("torch_compile"):  # passed on as TrainingArguments.torch_compile (the Trainer compiles the model)
        r.put("torch_compile", True, "torch_compile")
    fsdp = r.fsdp("fsdp")
    fsdp_config = doc.get("fsdp_config")
    if fsdp and isinstance(fsdp_config, dict) and fsdp_config.get("fsdp_offload_params") is True:
        r.put("offload", Offload.PARAMS, "fsdp_config.fsdp_offload_params")
    r.precision(method, default_bf16=False, sharded=fsdp)
    if method is not Method.QLORA and r.values.get("precision") in (Precision.AMP, Precision.FSDP2):
        r.values["precision"] = Precision.BF16  # 16-bit weights: trained in place, or a LoRA's frozen base
    r.deepspeed("deepspeed")
    return r.found()
