"""Which weights LoRA adapts (``--lora-targets``) and the adapters' elements on one rank."""

from __future__ import annotations

import math

from memest import lora_targets
from memest.estimate.sharding import Stage, stage_tensors
from memest.estimate.training.recipes import RECIPES
from memest.spec import Component, ModelSpec, Split, TensorSpec
from memest.workload import LoraConfig, LoraLibrary, Precision

ADAPTER_BYTES = 4
"""PEFT keeps LoRA adapters in fp32 over a 16-bit base (``autocast_adapter_dtype=True``, PEFT >= 0.12):
4 B weights, 4 B gradients, fp32 Adam states."""


def adapter_bytes(library: LoraLibrary, precision: Precision) -> int:
    """Bytes per adapter element (weight, gradient and torch AdamW state alike): PEFT's fp32
    (:data:`ADAPTER_BYTES`); litgpt and torchtune build the adapters with the rest of the model under
    the run's parameter dtype (litgpt ``fabric.init_module`` under ``bf16-true``; torchtune
    ``training.set_default_dtype(self._dtype)`` in ``lora_finetune_*.py``, which checks it with
    ``validate_expected_param_dtype``), so bf16 under those recipes (:class:`LoraLibrary`)."""
    if library in (LoraLibrary.PEFT, LoraLibrary.UNSLOTH):  # unsloth builds them with PEFT's get_peft_model
        return ADAPTER_BYTES
    return RECIPES[precision].weight


def lora_targets_tensor(tensor: TensorSpec, targets: str) -> bool:
    """True when ``--lora-targets`` puts an adapter on this layer tensor: a 2-D linear weight of the
    attention (``attention``), of any block (``all-linear``), or of a named module."""
    return lora_targets.adapts(tensor, targets)


_targeted = lora_targets_tensor  # the name memest.calibration imports


def lora_adapters(spec: ModelSpec, stage: Stage, lora: LoraConfig, tp: int) -> tuple[tuple[TensorSpec, int, int], ...]:
    """(targeted weight, adapter elements on one rank, count) of a pipeline stage (the spec's own tensors).

    PEFT matches ``target_modules`` by module name anywhere in the model: besides the layers' linears
    it adapts same-named linears outside them (a multimodal checkpoint's vision tower ``q_proj``),
    whose adapters are trained (they get optimizer states and fp32 gradient buffers) though a
    text-only step never runs them. ``all-linear`` takes the layers' linears. The match is PEFT's
    against the ``target_modules`` memest passes it (:func:`memest.lora_targets.peft_target_modules`).
    """
    names = lora_targets.peft_target_modules(spec, lora.targets)
    out: list[tuple[TensorSpec, int, int]] = []
    for tn, count in stage_tensors(spec, stage):
        if len(tn.shape) != 2 or not tn.name.endswith("weight"):
            continue
        layer_linear = tn.is_linear_weight
        outside = tn.component is Component.OTHER and lora.targets != "all-linear"
        if (layer_linear or outside) and lora_targets.peft_matches(tn.module, names):
            out.append((tn, lora_adapter_numel(tn, lora.rank, tp), count))
    return tuple(out)


def lora_adapter_numel(tensor: TensorSpec, rank: int, tp: int) -> int:
    """Elements of the LoRA A (r x in) and B (out x r) matrices for one targeted weight on one rank.

    Under TP, B follows a column-parallel base (out/t) and A a row-parallel one (in/t).
    """
    out_f, in_f = tensor.shape
    if tensor.split in (Split.COL, Split.KV, Split.VOCAB):
        return rank * in_f + math.ceil(rank * out_f / tp)
    if tensor.split is Split.ROW:
        return math.ceil(rank * in_f / tp) + rank * out_f
    return rank * (in_f + out_f)
