"""Precision recipes: bytes per element of each kind of model state.

| recipe | weights | param.grad | fp32 master | optimizer state element | compute | source |
|---|---|---|---|---|---|---|
| mixed | 2 (bf16) | 2 | 4 | 4 | bf16 | ZeRO paper §3.1 (K = 12 with Adam), DeepSpeed ``bf16``, Megatron ``--bf16`` |
| fp16  | 2 (fp16) | 2 | 4 | 4 | fp16 | DeepSpeed ``fp16`` (loss scaling) |
| amp   | 4 (fp32) | 4 | 0 | 4 | bf16 autocast | HF Trainer ``bf16=True``: torch.autocast over fp32 params |
| fsdp2 | 4 (fp32, sharded) | 4 (sharded, ``reduce_dtype`` fp32) | 0 | 4 | bf16 gathered copies | FSDP2 ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, torchtitan |
| bf16  | 2 | 2 | 0 | 2 | bf16 | torch AdamW keeps states in the param dtype (torchtune, HF ``torch_dtype=bf16``) |
| fp32  | 4 | 4 | 0 | 4 | fp32 | |
"""

from __future__ import annotations

from dataclasses import dataclass

from memest.workload import KbitPrep, Precision, TrainingConfig


@dataclass(frozen=True, slots=True)
class Recipe:
    """Bytes per element of a precision recipe (see the module table).

    Attributes:
        weight: Stored parameters.
        grad: param.grad (FSDP: the sharded gradient at ``reduce_dtype``).
        master: fp32 master copy kept by the optimizer wrapper (0: none).
        state: One optimizer-state element.
        compute: Activations and matmul outputs.
    """

    weight: int
    grad: int
    master: int
    state: int
    compute: int


RECIPES: dict[Precision, Recipe] = {
    Precision.MIXED: Recipe(weight=2, grad=2, master=4, state=4, compute=2),
    Precision.FP16: Recipe(weight=2, grad=2, master=4, state=4, compute=2),
    Precision.AMP: Recipe(weight=4, grad=4, master=0, state=4, compute=2),
    Precision.FSDP2: Recipe(weight=4, grad=4, master=0, state=4, compute=2),
    Precision.BF16: Recipe(weight=2, grad=2, master=0, state=2, compute=2),
    Precision.FP32: Recipe(weight=4, grad=4, master=0, state=4, compute=4),
}


def kbit_weight_bytes(t: TrainingConfig) -> tuple[int, int]:
    """Bytes per element of a QLoRA base's non-quantized weights: (embeddings and lm_head, the rest:
    norms, biases, other modules), by how the script prepared the model (:class:`KbitPrep`).

    ``none`` keeps them at the compute dtype; PEFT ``prepare_model_for_kbit_training`` upcasts every
    fp16/bf16 parameter that is not ``Params4bit`` to fp32 (``peft/utils/other.py``, 0.13); trl's
    ``peft_module_casting_to_bf16`` (``trl/trainer/utils.py``, 0.13), called by ``SFTTrainer`` only when
    ``args.bf16``, then casts modules named ``lm_head`` / ``embed_tokens`` / ``wte`` / ``wpe`` back to
    bf16 and leaves the norms fp32 (with ``--precision fp16`` the embeddings stay fp32).
    """
    c = RECIPES[t.precision].compute
    if t.prepare_kbit_training is KbitPrep.NONE:
        return c, c
    if t.prepare_kbit_training is KbitPrep.TRL and t.precision is not Precision.FP16 and t.half_dtype != "fp16":
        return 2, 4
    return 4, 4
