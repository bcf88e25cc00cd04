"""The 4-bit base of a QLoRA job as each library stores it (:class:`~memest.workload.LoraLibrary`).

| library | format of a linear weight | lm_head | bytes per weight | source |
|---|---|---|---|---|
| peft | bitsandbytes NF4, double quant: uint8 per 2 weights, uint8 absmax per 64, fp32 scale per 256 absmaxes | 16-bit | 0.5 + 1/64 + 4/16384 | transformers ``BitsAndBytesConfig(bnb_4bit_use_double_quant=True)``, ``get_keys_to_not_convert`` |
| litgpt | bitsandbytes NF4, no double quant (``compress_statistics=False``): fp32 absmax per 64 | NF4 too | 0.5 + 4/64 | Fabric ``BitsandbytesPrecision`` ``_NF4Linear``; bitsandbytes 0.42 ``functional.quantize_4bit`` (``absmax`` fp32 per block) |
| torchtune | torchao ``NF4Tensor``: uint8 per 2 weights, int8 scaler per 64, bf16 factor per 256 scalers | 16-bit | 0.5 + 1/64 + 2/16384 | torchao ``quantization/quantize_/workflows/nf4/nf4_tensor.py`` (commit d1094d8) ``double_quantize_scalers``; ``to_nf4(block_size=64, scaler_block_size=256)`` |

litgpt is modelled as of its published config-hub table (``config_hub/finetune/README.md``, commit
00af8b0, Sep 2024: ``bitsandbytes==0.42.0``, whose ``MatMul4Bit`` keeps each 4-bit linear's input,
:attr:`memest.estimate.activations.Execution.saves_4bit_inputs`, as ``ctx.tensors``, past its backward until
litgpt's ``fit()`` lets the graph go: :func:`memest.estimate.training.activation_terms._previous_microbatch`). Later litgpt (Oct 2024, #1770)
swaps ``transformer.wte`` for bitsandbytes' ``StableEmbedding`` after the optimizer is built, and
(Dec 2024, #1893) moves to a bitsandbytes that keeps no inputs: neither is modelled. Every library
dequantizes one weight at a time to the compute dtype for its matmul (bitsandbytes ``MatMul4Bit``:
``F.dequantize_4bit(B, quant_state).to(A.dtype)``; torchao ``LinearNF4``: ``weight.to(input.dtype)``),
litgpt's lm_head included.
"""

from __future__ import annotations

from collections.abc import Iterable

from memest.estimate.weights import SCHEMES, QuantScheme, scale_bytes, weight_bytes
from memest.spec import Component, ModelSpec, TensorSpec
from memest.workload import LoraLibrary, Parallelism

NF4: dict[LoraLibrary, QuantScheme] = {
    LoraLibrary.PEFT: SCHEMES["nf4"],
    LoraLibrary.UNSLOTH: SCHEMES["nf4"],  # transformers' BitsAndBytesConfig, double quant
    LoraLibrary.LITGPT: QuantScheme("nf4", 4, group_size=64, granularity="flat", scale_bytes=4),
    LoraLibrary.TORCHTUNE: QuantScheme("nf4", 4, group_size=64, double_quant=True, granularity="flat",
                                       nested_scale_bytes=2),
}
"""Each library's NF4 format (the module table)."""

_WORDS = {LoraLibrary.PEFT: "NF4 linear weights (64-blocks, double quant)",
          LoraLibrary.UNSLOTH: "NF4 linear weights (64-blocks, double quant)",
          LoraLibrary.LITGPT: "litgpt bnb.nf4 linear weights and lm_head (64-blocks, fp32 absmax)",
          LoraLibrary.TORCHTUNE: "torchao NF4Tensor linear weights (64-blocks, int8 scalers, bf16 factors)"}


def quantizes_lm_head(library: LoraLibrary) -> bool:
    """True when the library stores the lm_head in NF4 too (litgpt: Fabric replaces every Linear)."""
    return library is LoraLibrary.LITGPT


def untied_head_numel(spec: ModelSpec, library: LoraLibrary, last_stage: bool) -> int:
    """Elements of the lm_head litgpt adds to a checkpoint that ties it to the embedding: litgpt 0.4's
    ``GPT`` always builds ``lm_head = nn.Linear(n_embd, padded_vocab_size)`` (``litgpt/model.py``,
    commit 00af8b0) and ``convert_hf_checkpoint.py`` copies ``transformer.wte.weight`` into it; 0
    elsewhere."""
    if library is not LoraLibrary.LITGPT or not last_stage or not spec.tie_word_embeddings:
        return 0
    return spec.vocab_size * spec.hidden_size


def base_bytes(tensors: Iterable[tuple[TensorSpec, int]], par: Parallelism, num_kv_heads: int,
               library: LoraLibrary, emb: int, other: int, untied_head: int = 0) -> tuple[int, str]:
    """Bytes of the frozen base on one rank and its formula: the linear weights in the library's NF4,
    embeddings (and a 16-bit lm_head) at ``emb`` bytes, norms and the rest at ``other``; ``untied_head``
    elements of a litgpt lm_head (:func:`untied_head_numel`) in NF4."""
    scheme = NF4[library]
    head_nf4 = quantizes_lm_head(library)
    linear, embeds, heads = [], [], []
    for tn, c in tensors:
        if tn.component is Component.LM_HEAD and head_nf4 and len(tn.shape) == 2:
            heads.append((tn, c))
        elif tn.component in (Component.EMBEDDING, Component.LM_HEAD):
            embeds.append((tn, c))
        else:
            linear.append((tn, c))
    total = (weight_bytes(linear, par, num_kv_heads, dtype_bytes=other, scheme=scheme)
             + weight_bytes(embeds, par, num_kv_heads, dtype_bytes=emb, scheme=scheme)
             + sum(scheme.tensor_bytes(tn.shape) * c for tn, c in heads)
             + (scheme.tensor_bytes((untied_head // 64, 64)) if untied_head else 0))
    rest = "embeddings" if head_nf4 else "embeddings and lm_head"
    return total, f"{_WORDS[library]} + {rest} x {emb} B + norms and other weights x {other} B"



TRANSFORMERS_LOADED = frozenset({LoraLibrary.PEFT, LoraLibrary.UNSLOTH})
"""Libraries whose 4-bit base transformers' ``from_pretrained`` quantizes (bitsandbytes ``Params4bit``)."""


def unsharded_state_bytes(tensors: Iterable[tuple[TensorSpec, int]], par: Parallelism, num_kv_heads: int,
                          library: LoraLibrary) -> int:
    """Bytes of the base's bitsandbytes quant states on one rank when FSDP or ZeRO-3 shards the parameters: every
    quantized linear's absmax (and, under double quant, its nested fp32 scales) whole on every rank.

    transformers 4.48.1 ``modeling_utils._load_state_dict_into_meta_model`` quantizes each weight on the GPU
    (the bitsandbytes quantizer's ``update_device_map`` puts an unset device map on the current CUDA device)
    and, under FSDP or ZeRO-3, moves only its data to the CPU or meta device: ``type(value)(value.data.to(
    param_to), **value.__dict__)`` keeps ``quant_state`` (bitsandbytes ``QuantState``: ``absmax``, ``state2``)
    on the GPU. The quant state is an attribute of the ``Params4bit``, not a parameter or buffer, so FSDP's
    flat parameters and ZeRO-3's partitions never hold it: only the packed 4-bit values are sharded (in
    ``bnb_4bit_quant_storage``). 0 for the other libraries (torchao's ``NF4Tensor`` shards its scalers with
    its data; litgpt quantizes through Fabric, not modelled sharded)."""
    if library not in TRANSFORMERS_LOADED:
        return 0
    scheme = NF4[library]
    return sum(scale_bytes(tn, par, num_kv_heads, scheme) * c for tn, c in tensors
               if tn.component not in (Component.EMBEDDING, Component.LM_HEAD))
