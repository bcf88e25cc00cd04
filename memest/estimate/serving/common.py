"""What every serving engine shares: the served dtypes, the default length, the weights as stored and
as the caching allocator counts them once an engine has loaded them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from memest.dtypes import nbytes
from memest.estimate.runtime import cuda_block_bytes
from memest.estimate.sharding import Stage, stage_tensors
from memest.estimate.weights import checkpoint_scale, serving_weight_layout, weight_bytes
from memest.spec import ModelSpec
from memest.workload import Engine, ServingConfig


def weight_dtype(spec: ModelSpec, s: ServingConfig) -> str:
    """The dtype unquantized weights are served in: ``--dtype``, else the checkpoint's; for the
    serving engines (vLLM, SGLang, TensorRT-LLM) an fp32 checkpoint in bfloat16.

    vLLM's ``dtype="auto"`` (``vllm/config/model.py`` ``_resolve_auto_dtype``) serves a float32
    checkpoint in the platform's first supported dtype, bfloat16 on CUDA devices of compute
    capability 8.0 and later (float16 before, the same 2 bytes; Gemma 2/3 fall back to float32 there,
    which memest does not model), and other checkpoints in their own dtype. transformers loads a
    checkpoint in its own dtype under ``dtype="auto"`` (the default since transformers 5), float32
    included. SGLang's ``ModelConfig`` (``_get_and_verify_dtype``, copied from vLLM) and TensorRT-LLM
    also serve a float32 checkpoint in 16 bits (2 bytes either way).
    """
    if s.dtype != "auto":
        return s.dtype
    stored = (spec.torch_dtype or "bfloat16").lower().removeprefix("torch.")
    if stored in ("float32", "fp32", "float"):
        return "float32" if s.engine is Engine.HF else "bfloat16"
    return stored


def quantization_note(spec: ModelSpec, s: ServingConfig) -> str:
    """How the linear weights are stored, for the assumptions: ``--quantization``, else the
    checkpoint's own quantization_config (fp8, MXFP4, AWQ, ...), else nothing."""
    if s.quantization != "none":
        return f", quantization {s.quantization}"
    scheme, _ = serving_weight_layout(spec, s.quantization)
    return f", linear weights as the checkpoint stores them ({scheme.name})" if scheme else ""


def compute_bytes(spec: ModelSpec, s: ServingConfig) -> float:
    """Bytes per activation element: the served dtype (quantized weights compute in 16 bits)."""
    return nbytes(weight_dtype(spec, s))


def max_model_len_of(spec: ModelSpec, s: ServingConfig) -> int:
    """``--max-model-len``, else the model's max_position_embeddings (vLLM's derived default)."""
    return s.max_model_len or spec.max_position_embeddings or 2048


def _exact(spec: ModelSpec, s: ServingConfig, w: int) -> int:
    """``w`` scaled to the checkpoint's exact bytes with ``--exact-weights`` (else ``w``)."""
    if not s.checkpoint_params:
        return w
    scheme, skip = serving_weight_layout(spec, s.quantization)
    return math.ceil(w * checkpoint_scale(spec, s.checkpoint_params, compute_bytes(spec, s), scheme, skip))


def stage_weight_bytes(spec: ModelSpec, s: ServingConfig, stage: Stage) -> int:
    """Weights one rank of ``stage`` holds as served (quantized formats, TP shards, checkpoint
    scale from ``--exact-weights``)."""
    scheme, skip = serving_weight_layout(spec, s.quantization)
    w = weight_bytes(stage_tensors(spec, stage), s.parallelism, spec.num_kv_heads, dtype_bytes=compute_bytes(spec, s),
                     scheme=scheme, skip=skip)
    return _exact(spec, s, w)


@dataclass(frozen=True, slots=True)
class Allocation:
    """One weight allocation an engine makes, ``count`` times on a rank.

    Attributes:
        nbytes: Its bytes (a float: quantized formats store fractional bytes per element).
        count: How many the rank holds (the layers that repeat it).
        rounded: True when PyTorch's CUDA caching allocator hands it out (its block rounding applies).
    """

    nbytes: float
    count: int
    rounded: bool = True


def loaded_weight_bytes(spec: ModelSpec, s: ServingConfig, allocations: Iterable[Allocation]) -> int:
    """The weights as the caching allocator counts them once an engine has loaded them: each of the
    engine's allocations (:func:`memest.estimate.serving.vllm.weights.allocations`,
    :func:`memest.estimate.serving.hf.generate.allocations`) rounded by
    :func:`memest.estimate.runtime.cuda_block_bytes` where the allocator hands it out, times its
    count; scaled to the checkpoint's exact bytes with ``--exact-weights``."""
    w = sum(cuda_block_bytes(math.ceil(a.nbytes)) * a.count if a.rounded else a.nbytes * a.count for a in allocations)
    return _exact(spec, s, math.ceil(w))
