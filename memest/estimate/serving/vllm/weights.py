"""The weights of one vLLM rank as the caching allocator counts them ('Model loading took'):
projections merged as vLLM merges them, the rotary cos/sin cache, and MLA's dequantized copies.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from memest.estimate.runtime import cuda_block_bytes
from memest.estimate.serving.common import Allocation, compute_bytes, loaded_weight_bytes
from memest.estimate.sharding import Stage, shard_numel, stage_tensors
from memest.estimate.weights import QuantScheme, is_quantized, serving_weight_layout, tensor_bytes
from memest.spec import ModelSpec, TensorSpec
from memest.workload import Parallelism, ServingConfig

_POSITION_TABLES = ("wpe", "position", "pos_emb")
_NO_ROPE_TYPES = ("bloom", "mpt", "gpt2", "gpt_bigcode", "opt", "bert", "t5", "falcon_alibi")

_MERGED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
           "up_proj": "gate_up_proj", "q_a_proj": "fused_qkv_a_proj", "kv_a_proj_with_mqa": "fused_qkv_a_proj"}
"""Projections vLLM allocates as one tensor (``QKVParallelLinear``, ``MergedColumnParallelLinear``;
DeepSeek's ``fused_qkv_a_proj`` when q_lora_rank is set)."""


def _allocation_key(t: TensorSpec) -> str:
    module, _, param = t.name.rpartition(".")
    parent, _, leaf = module.rpartition(".")
    merged = _MERGED.get(leaf)
    return f"{parent}.{merged}.{param}" if merged else t.name


def allocations(tensors: Iterable[tuple[TensorSpec, int]], par: Parallelism, num_kv_heads: int, *,
                dtype_bytes: float, scheme: QuantScheme | None, skip: tuple[str, ...]) -> list[Allocation]:
    """vLLM's weight allocations on one rank: the projections it merges (:data:`_MERGED`) as one
    tensor each, every other parameter on its own, all through the caching allocator."""
    groups: dict[tuple[int, str], float] = {}
    for t, count in tensors:
        key = (count, _allocation_key(t))
        groups[key] = groups.get(key, 0.0) + tensor_bytes(t, par, num_kv_heads, dtype_bytes=dtype_bytes,
                                                          scheme=scheme, skip=skip)
    return [Allocation(nbytes, count) for (count, _), nbytes in groups.items()]


def mla_dequantized_bytes(tensors: Iterable[tuple[TensorSpec, int]], par: Parallelism, num_kv_heads: int, *,
                          dtype_bytes: float, scheme: QuantScheme | None, skip: tuple[str, ...]) -> int:
    """Bytes of the 16-bit copies vLLM's MLA keeps of a quantized ``kv_b_proj`` on one rank.

    ``MLAAttention.process_weights_after_loading`` (``vllm/model_executor/layers/attention/mla_attention.py``;
    ``vllm/v1/attention/backends/mla/common.py`` before) builds ``W_UK_T`` and ``W_UV`` from
    ``get_and_maybe_dequant_weights(kv_b_proj)``: views of the weight itself when it is unquantized
    (0 bytes), of a dequantized (kv_lora_rank, heads/tp x (qk_nope + v)) tensor at the activation
    dtype when it is quantized (fp8 DeepSeek-V3 checkpoints), kept beside the quantized weight.
    """
    return sum(cuda_block_bytes(math.ceil(shard_numel(t, par, num_kv_heads) * dtype_bytes)) * count
               for t, count in tensors if t.module.endswith("kv_b_proj") and is_quantized(t, scheme, skip))


def rope_cache_bytes(spec: ModelSpec, c: float) -> int:
    """vLLM's rotary ``cos_sin_cache`` buffer, one per rank (shared by the layers through
    ``get_rope``'s cache): max_position_embeddings x rotary dim x c (``RotaryEmbedding.__init__``).

    Counted in vLLM's 'Model loading took'; models with learned or ALiBi positions have none.
    """
    if spec.model_type in _NO_ROPE_TYPES or any(p in t.name for t in spec.embedding for p in _POSITION_TABLES):
        return 0
    attn = spec.reference_layer.attention
    rotary = attn.qk_rope_head_dim if attn.kind == "mla" else attn.head_dim
    return math.ceil((spec.max_position_embeddings or 0) * rotary * c)


def rope_cache_block(spec: ModelSpec, c: float) -> int:
    """The rotary cache as the caching allocator holds it (none for models without rotary positions)."""
    raw = rope_cache_bytes(spec, c)
    return cuda_block_bytes(raw) if raw else 0


def mla_dequantized(spec: ModelSpec, s: ServingConfig, stage: Stage) -> int:
    """:func:`mla_dequantized_bytes` of one rank of ``stage``."""
    scheme, skip = serving_weight_layout(spec, s.quantization)
    return mla_dequantized_bytes(stage_tensors(spec, stage), s.parallelism, spec.num_kv_heads,
                                 dtype_bytes=compute_bytes(spec, s), scheme=scheme, skip=skip)


def loaded_bytes(spec: ModelSpec, s: ServingConfig, stage: Stage) -> int:
    """The merged weights of one rank of ``stage`` as loaded (``--exact-weights`` scale included)
    and MLA's dequantized copies; the rotary cache is counted apart (:func:`rope_cache_block`)."""
    scheme, skip = serving_weight_layout(spec, s.quantization)
    layout = allocations(stage_tensors(spec, stage), s.parallelism, spec.num_kv_heads,
                         dtype_bytes=compute_bytes(spec, s), scheme=scheme, skip=skip)
    return loaded_weight_bytes(spec, s, layout) + mla_dequantized(spec, s, stage)
