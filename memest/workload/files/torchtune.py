"""torchtune's recipe YAML (``recipes/configs/*/*.yaml``, read by ``tune run RECIPE --config FILE``).

Keys read (torchtune 0.6 ``recipes/full_finetune_*.py``, ``recipes/lora_finetune_*.py``; the same keys at
its last commit): ``model._component_``, the model builder (``torchtune.models.llama3_1.llama3_1_8b``;
``lora_`` / ``qlora_`` builders are LoRA / QLoRA, :data:`BUILDERS` the Hub model each builds) with
``model.lora_rank``, ``model.lora_dropout``, ``model.lora_attn_modules``, ``model.apply_lora_to_mlp``,
``model.apply_lora_to_output``; ``batch_size`` (per device), ``gradient_accumulation_steps``,
``tokenizer.max_seq_len``; ``optimizer._component_`` (:data:`OPTIMIZERS`) with ``optimizer.fused`` /
``optimizer.momentum``; ``optimizer_in_bwd``; ``enable_activation_checkpointing`` (torchtune checkpoints
every transformer layer whole: full), ``enable_activation_offloading``; ``compile``; ``dtype`` (``bf16``:
parameters, gradients and optimizer states all bf16, no fp32 copy: memest's pure ``bf16``; ``fp32``);
``loss._component_`` (:data:`LOSSES`); ``fsdp_cpu_offload`` (FSDP2 ``CPUOffloadPolicy``: parameters,
gradients and optimizer states in host memory, the step on the CPU); ``custom_sharded_layers`` (the modules
``shard_model`` wraps as FSDP2 units of their own, ``tok_embeddings`` and ``output`` as memest models them; other
names are noted); ``tensor_parallel_dim``.
``dataset.packed`` needs no reading: packed samples fill ``max_seq_len`` exactly, the length memest sizes
either way (unpacked batches are padded to their longest sample, at most that).

``lora_alpha`` scales the adapters' output and sizes nothing; ``lora_attn_modules`` name torchtune's
modules, read as the Hub model's (``output_proj`` is ``o_proj``; ``apply_lora_to_mlp`` adapts ``w1`` /
``w2`` / ``w3``: ``gate_proj``, ``down_proj``, ``up_proj``; ``models/llama3/_component_builders.py``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from memest.errors import InputError
from memest.workload.config import CUSTOM_SHARDED_LAYERS, Loss, Method, Offload, Optimizer, Precision, Recompute, Stack
from memest.workload.files._common import Found, lookup, typed
from memest.workload.files.trainer import Recipe

NAME = "a torchtune recipe YAML (model: _component_: torchtune.models....)"
READS = ("model._component_", "model.lora_rank", "model.lora_dropout", "model.lora_attn_modules",
         "model.apply_lora_to_mlp", "model.apply_lora_to_output", "batch_size", "gradient_accumulation_steps",
         "tokenizer.max_seq_len", "optimizer._component_", "optimizer.fused", "optimizer.momentum",
         "optimizer_in_bwd", "enable_activation_checkpointing", "enable_activation_offloading", "compile", "dtype",
         "loss._component_", "fsdp_cpu_offload", "custom_sharded_layers", "tensor_parallel_dim")
IGNORED = {
    "fsdp_reshard_after_forward": ("FSDP2 parameters kept gathered from forward to backward", True),
    "model.use_dora": ("DoRA's magnitude vectors and their activations", False),
    "model.quantize_base": ("a quantized base under a lora_ builder", False),
    "quantizer._component_": ("QAT's fake-quantized linears", None),
    "context_parallel_dim": ("context parallelism under torchtune", 1),
    "data_parallel_replicate_dim": ("replicas of the FSDP shard group (HSDP)", 1),
}
"""Memory-relevant keys memest does not model -> (what they size, torchtune's default)."""

BUILDERS: dict[str, str] = {
    "llama2_7b": "meta-llama/Llama-2-7b-hf", "llama2_13b": "meta-llama/Llama-2-13b-hf",
    "llama2_70b": "meta-llama/Llama-2-70b-hf",
    "llama3_8b": "meta-llama/Meta-Llama-3-8B", "llama3_70b": "meta-llama/Meta-Llama-3-70B",
    "llama3_1_8b": "meta-llama/Llama-3.1-8B", "llama3_1_70b": "meta-llama/Llama-3.1-70B",
    "llama3_1_405b": "meta-llama/Llama-3.1-405B",
    "llama3_2_1b": "meta-llama/Llama-3.2-1B", "llama3_2_3b": "meta-llama/Llama-3.2-3B",
    "llama3_3_70b": "meta-llama/Llama-3.3-70B-Instruct",
    "mistral_7b": "mistralai/Mistral-7B-v0.1",
    "gemma_2b": "google/gemma-2b", "gemma_7b": "google/gemma-7b",
    "gemma2_2b": "google/gemma-2-2b", "gemma2_9b": "google/gemma-2-9b", "gemma2_27b": "google/gemma-2-27b",
    "qwen2_0_5b": "Qwen/Qwen2-0.5B", "qwen2_1_5b": "Qwen/Qwen2-1.5B", "qwen2_7b": "Qwen/Qwen2-7B",
    "qwen2_5_0_5b": "Qwen/Qwen2.5-0.5B", "qwen2_5_1_5b": "Qwen/Qwen2.5-1.5B", "qwen2_5_3b": "Qwen/Qwen2.5-3B",
    "qwen2_5_7b": "Qwen/Qwen2.5-7B", "qwen2_5_14b": "Qwen/Qwen2.5-14B", "qwen2_5_32b": "Qwen/Qwen2.5-32B",
    "qwen2_5_72b": "Qwen/Qwen2.5-72B",
    "qwen3_0_6b": "Qwen/Qwen3-0.6B", "qwen3_1_7b": "Qwen/Qwen3-1.7B", "qwen3_4b": "Qwen/Qwen3-4B",
    "qwen3_8b": "Qwen/Qwen3-8B", "qwen3_14b": "Qwen/Qwen3-14B", "qwen3_32b": "Qwen/Qwen3-32B",
    "phi3_mini": "microsoft/Phi-3-mini-4k-instruct", "phi4_14b": "microsoft/phi-4",
}
"""torchtune model builders (``torchtune/models/*/_model_builders.py``, 0.6.1; qwen3 at its last commit), without
their ``lora_`` / ``qlora_`` prefix and ``_base`` / ``_instruct`` suffix -> the Hub model of that architecture
(the base checkpoint: an instruct fine-tune has the same shapes; Llama 3.3 has only its instruct model)."""

OPTIMIZERS: dict[str, Optimizer] = {
    "torch.optim.AdamW": Optimizer.ADAMW, "torch.optim.Adam": Optimizer.ADAMW,
    "bitsandbytes.optim.PagedAdamW8bit": Optimizer.PAGED_ADAMW8BIT,
    "bitsandbytes.optim.AdamW8bit": Optimizer.ADAMW8BIT, "bitsandbytes.optim.Adam8bit": Optimizer.ADAMW8BIT,
    "bitsandbytes.optim.PagedAdamW": Optimizer.PAGED_ADAMW32BIT,
    "bitsandbytes.optim.PagedAdamW32bit": Optimizer.PAGED_ADAMW32BIT,
    "torchao.optim.AdamW8bit": Optimizer.ADAMW8BIT, "torch.optim.SGD": Optimizer.SGD,
}
"""``optimizer._component_`` -> memest's optimizer: the same states per parameter (torch AdamW with
``fused: True`` is ``adamw_fused``; SGD with ``momentum`` > 0 keeps one state; ``PagedAdamW8bit`` and
``PagedAdamW`` / ``PagedAdamW32bit`` keep their large states in CUDA managed memory, outside the allocator; torchao ``AdamW8bit`` quantizes its states in blocks
of 256 as bitsandbytes does, ``torchao/optim/adam.py`` ``block_size=256``)."""

LOSSES: dict[str, Loss] = {
    "torchtune.modules.loss.CEWithChunkedOutputLoss": Loss.CHUNKED,
    "torchtune.modules.loss.LinearCrossEntropyLoss": Loss.CHUNKED,
    "torch.nn.CrossEntropyLoss": Loss.DEFAULT,
}
"""``loss._component_`` -> memest's loss. ``LinearCrossEntropyLoss`` (``torchtune/modules/loss/
cross_entropy_loss.py``, which replaced ``CEWithChunkedOutputLoss`` in the recipes after 0.6) projects 8
chunks of hidden states through the output layer inside the loss and upcasts each chunk's logits to fp32
for ``F.cross_entropy``: autograd keeps every chunk's logits and fp32 log-probabilities for backward, as
the chunked loss does (its masking of ignored tokens only shrinks them)."""

_MODULES = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}
_MLP = ("gate_proj", "down_proj", "up_proj")


def detect(doc: Any, text: str) -> bool:
    """Whether ``doc`` is a torchtune recipe: a mapping whose ``model._component_`` names a torchtune builder."""
    component = lookup(doc, "model._component_") if isinstance(doc, dict) else None
    return isinstance(component, str) and component.startswith("torchtune.models.")


def read(path: Path, doc: dict[str, Any]) -> Found:
    """The settings a torchtune recipe implies."""
    r = Recipe(path, doc)
    component = str(doc["model"]["_component_"])
    builder = component.rsplit(".", 1)[-1]
    method = Method.QLORA if builder.startswith("qlora_") else \
        Method.LORA if builder.startswith("lora_") else Method.FULL
    base = re.sub(r"_(base|instruct)$", "", re.sub(r"^q?lora_", "", builder))
    if base in BUILDERS:
        r.model, r.origins["model"] = BUILDERS[base], "model._component_"
    else:
        r.notes.append(f"{path.name}: model builder {component} is not one memest maps to a Hub model "
                       f"(it maps {', '.join(sorted(BUILDERS))}); pass MODEL")
    r.put("stack", Stack.TORCHTUNE, "model._component_")
    if method is Method.FULL:
        r.put("train", True, "model._component_")
    else:
        r.put("finetune", method, "model._component_")
        _lora(r)
    r.integer("batch_size", "micro_batch_size")
    r.integer("gradient_accumulation_steps", "grad_accum_steps")
    if "tokenizer" in doc:
        r.integer("tokenizer.max_seq_len", "seq_len")
        if r.get("tokenizer.max_seq_len") is None:
            r.notes.append(f"{path.name}: tokenizer.max_seq_len is null (each sample as long as the dataset "
                           "makes it); memest sizes seq_len as given, else its default")
    _optimizer(r)
    for key, setting in (("optimizer_in_bwd", "optimizer_in_bwd"),
                         ("enable_activation_offloading", "activation_offloading")):
        if r.get(key) is not None:
            r.put(setting, r.flag(key), key)
    if r.get("enable_activation_checkpointing") is not None:
        r.put("recompute", Recompute.FULL if r.flag("enable_activation_checkpointing") else Recompute.NONE,
              "enable_activation_checkpointing")
    _dtype(r)
    _loss(r)
    if r.flag("compile"):  # training.compile_model (each layer) and compile_loss
        r.put("torch_compile", True, "compile")
    if r.flag("fsdp_cpu_offload"):
        r.put("offload", Offload.PARAMS, "fsdp_cpu_offload")
    _custom_sharded(r)
    tp = r.get("tensor_parallel_dim")
    if tp is not None and typed(path, "tensor_parallel_dim", tp, int, "an integer") > 1:
        r.put("tp", tp, "tensor_parallel_dim")
    return r.found()


def _custom_sharded(r: Recipe) -> None:
    """``custom_sharded_layers``: module names ``shard_model`` wraps with ``fully_shard`` (commit 30b8519e86d2
    ``recipes/full_finetune_distributed.py``: ``lambda n, m: n in custom_sharded_layers``); memest models the
    decoder's ``tok_embeddings`` and ``output`` and notes any other name."""
    names = r.get("custom_sharded_layers")
    if names is None:
        return
    names = typed(r.path, "custom_sharded_layers", names, list, "a list of module names (tok_embeddings, output)")
    kept = [str(n) for n in names if n in CUSTOM_SHARDED_LAYERS]
    if other := [str(n) for n in names if n not in CUSTOM_SHARDED_LAYERS]:
        r.notes.append(f"{r.path.name}: custom_sharded_layers names {', '.join(other)}; memest models "
                       f"{' and '.join(CUSTOM_SHARDED_LAYERS)} as FSDP units of their own, not other modules")
    if kept:
        r.put("custom_sharded_layers", ",".join(kept), "custom_sharded_layers")


def _lora(r: Recipe) -> None:
    r.integer("model.lora_rank", "lora_rank")
    r.number("model.lora_dropout", "lora_dropout")
    names = r.get("model.lora_attn_modules")
    targets: list[str] = []
    if names is not None:
        for name in typed(r.path, "model.lora_attn_modules", names, list, "a list of q_proj, k_proj, v_proj, "
                                                                           "output_proj"):
            if name not in _MODULES:
                raise InputError(f"{{config}} {r.path}: model.lora_attn_modules has {name!r}; expected q_proj, "
                                 "k_proj, v_proj or output_proj", field="config")
            targets.append(_MODULES[name])
    if r.flag("model.apply_lora_to_mlp"):
        targets += _MLP
    if targets:
        r.put("lora_targets", ",".join(targets), "model.lora_attn_modules" if names is not None else
              "model.apply_lora_to_mlp")
    if r.flag("model.apply_lora_to_output"):
        r.notes.append(f"{r.path.name}: model.apply_lora_to_output is True; memest does not count the output "
                       "layer's adapter (rank x (hidden + vocab) parameters and their states)")


def _optimizer(r: Recipe) -> None:
    name = r.get("optimizer._component_")
    if name is None:
        return
    name = str(typed(r.path, "optimizer._component_", name, str, "an optimizer class path"))
    if name not in OPTIMIZERS:
        r.notes.append(f"{r.path.name}: optimizer._component_ {name} is not an optimizer memest models (it models "
                       f"{', '.join(OPTIMIZERS)}); the stack's default optimizer is used")
        return
    optimizer = OPTIMIZERS[name]
    if optimizer is Optimizer.ADAMW and name.startswith("torch.") and r.flag("optimizer.fused"):
        optimizer = Optimizer.ADAMW_FUSED
    momentum = r.get("optimizer.momentum")
    if optimizer is Optimizer.SGD and momentum is not None and \
            typed(r.path, "optimizer.momentum", momentum, (int, float), "a number") > 0:
        optimizer = Optimizer.SGD_MOMENTUM
    r.put("optimizer", optimizer, "optimizer._component_")


def _dtype(r: Recipe) -> None:
    dtype = r.get("dtype")
    if dtype is None:
        return
    dtype = str(typed(r.path, "dtype", dtype, str, "bf16 or fp32"))
    if dtype not in ("bf16", "fp32"):
        raise InputError(f"{{config}} {r.path}: dtype is {dtype!r}; expected bf16 or fp32 (torchtune's recipes "
                         "train in no other dtype)", field="config")
    r.put("precision", Precision.BF16 if dtype == "bf16" else Precision.FP32, "dtype")


def _loss(r: Recipe) -> None:
    name = r.get("loss._component_")
    if name is None:
        return
    name = str(typed(r.path, "loss._component_", name, str, "a loss class path"))
    if name in LOSSES:
        r.put("loss", LOSSES[name], "loss._component_")
    else:
        r.notes.append(f"{r.path.name}: loss._component_ {name} is not a loss memest models (it models "
                       f"{', '.join(LOSSES)}); the stack's chunked loss is used")
