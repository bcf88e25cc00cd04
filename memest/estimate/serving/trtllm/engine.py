"""TensorRT-LLM serving on one rank per pipeline stage: the KV sizing
(:mod:`memest.estimate.serving.trtllm.budget`), the terms of this job and TensorRT-LLM's own numbers.

The memory outside the KV cache is the CUDA context (and NCCL with more than one rank), the weights
as stored (:func:`memest.estimate.serving.common.stage_weight_bytes`; a TensorRT engine or the
PyTorch backend's modules hold them without the vLLM-style merging) and the fitted activation and
buffer term. A sequence of L tokens takes ``ceil(L / tokens_per_block)`` blocks; ``max_seq_len``
is memest's ``--max-model-len``; at most ``max_batch_size`` requests run at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from memest.devices import Device
from memest.estimate import runtime
from memest.estimate.serving.common import (
    compute_bytes,
    max_model_len_of,
    quantization_note,
    stage_weight_bytes,
    weight_dtype,
)
from memest.estimate.serving.kv import kv_bytes_per_token
from memest.estimate.serving.trtllm import budget as tb
from memest.estimate.sharding import Stage, vllm_stages
from memest.result import Estimate, Kind, RankEstimate, ServingSummary, Term, plural
from memest.spec import ModelSpec
from memest.workload import ServingConfig


@dataclass(frozen=True, slots=True)
class TrtllmRank:
    """One pipeline stage's numbers.

    Attributes:
        stage: The pipeline stage.
        weights: Weight bytes of a rank.
        runtime: Activations and runtime buffers (fitted).
        outside: CUDA context and NCCL.
        pool: The KV arithmetic.
    """

    stage: Stage
    weights: int
    runtime: int
    outside: int
    pool: tb.Pool

    @property
    def non_kv(self) -> int:
        """Everything but the KV cache."""
        return self.weights + self.runtime + self.outside


def max_batch_size_of(s: ServingConfig) -> int:
    """``max_batch_size``, else TensorRT-LLM's default."""
    return s.max_batch_size if s.max_batch_size is not None else tb.DEFAULT_MAX_BATCH_SIZE


def max_num_tokens_of(s: ServingConfig) -> int:
    """``max_num_tokens``, else TensorRT-LLM's default."""
    return s.max_num_tokens if s.max_num_tokens is not None else tb.DEFAULT_MAX_NUM_TOKENS


def trtllm_ranks(spec: ModelSpec, s: ServingConfig, device: Device) -> list[TrtllmRank]:
    """Every pipeline stage's KV sizing."""
    par = s.parallelism
    outside = runtime.cuda_context_bytes(device) + runtime.nccl_bytes(par.tp * par.pp, device)
    c = compute_bytes(spec, s)
    buffers = (tb.activation_bytes(max_num_tokens_of(s), spec.hidden_size, c)
               + tb.buffer_bytes(max_batch_size_of(s), spec.vocab_size))
    out = []
    for stage in vllm_stages(spec.num_layers, par.pp):
        weights = stage_weight_bytes(spec, s, stage)
        free = device.memory_bytes - weights - buffers - outside
        pool = tb.Pool(free, s.kv_cache_free_gpu_mem_fraction, kv_bytes_per_token(spec, s, stage), s.tokens_per_block)
        out.append(TrtllmRank(stage, weights, buffers, outside, pool))
    return out


def largest_concurrency(spec: ModelSpec, s: ServingConfig, device: Device, max_model_len: int,
                        *, ranks: list[TrtllmRank] | None = None) -> int:
    """Sequences of ``max_model_len`` tokens whose blocks fit at once, at most max_batch_size."""
    ranks = ranks or trtllm_ranks(spec, s, device)
    r = min(ranks, key=lambda x: x.pool.blocks)
    return min(r.pool.blocks // r.pool.blocks_per_request(max_model_len), max_batch_size_of(s))


def largest_max_model_len(spec: ModelSpec, s: ServingConfig, device: Device, concurrency: int,
                          *, ranks: list[TrtllmRank] | None = None) -> int:
    """The longest length at which ``concurrency`` sequences fit the blocks at once (whole blocks
    each), capped at the model's max_position_embeddings; 0 when none fits."""
    ranks = ranks or trtllm_ranks(spec, s, device)
    r = min(ranks, key=lambda x: x.pool.blocks)
    limit = spec.max_position_embeddings or max_model_len_of(spec, s)
    return max(0, min(r.pool.blocks // concurrency * s.tokens_per_block, limit))


def _terms(spec: ModelSpec, s: ServingConfig, device: Device, r: TrtllmRank) -> list[Term]:
    max_len = max_model_len_of(spec, s)
    need = s.batch_size * r.pool.blocks_per_request(max_len) * s.tokens_per_block * r.pool.bytes_per_token
    terms = [
        Term("weights", Kind.WEIGHTS, r.weights, f"stage parameters / tp at {weight_dtype(spec, s)}"),
        Term("kv_cache", Kind.KV_CACHE, need,
             f"{plural(s.batch_size, 'sequence')} x {max_len} tokens in {s.tokens_per_block}-token blocks "
             f"({r.pool.bytes_per_token:,} B/token)"),
        Term("activations", Kind.ACTIVATIONS, r.runtime,
             f"activations of max_num_tokens {max_num_tokens_of(s)} and buffers of max_batch_size "
             f"{max_batch_size_of(s)} (fitted)"),
        Term("runtime.cuda_context", Kind.RUNTIME, runtime.cuda_context_bytes(device), f"{device.arch} context"),
    ]
    nccl = runtime.nccl_bytes(s.parallelism.tp * s.parallelism.pp, device)
    if nccl:
        terms.append(Term("runtime.nccl", Kind.RUNTIME, nccl, "NCCL communicators"))
    return terms


def estimate_trtllm(spec: ModelSpec, s: ServingConfig, device: Device) -> Estimate:
    """Per-rank memory of this job under TensorRT-LLM and its own start-up numbers (the summary)."""
    version = s.engine_version or tb.TRTLLM_VERSIONS[0]
    ranks = trtllm_ranks(spec, s, device)
    max_len = max_model_len_of(spec, s)
    out = []
    for r in ranks:
        label = "all ranks" if len(ranks) == 1 else f"pp stage {r.stage.index}"
        out.append(RankEstimate(label, tuple(_terms(spec, s, device, r)), s.parallelism.world_size // s.parallelism.pp))
    limiting = min(ranks, key=lambda x: x.pool.blocks)
    p = limiting.pool
    request = p.blocks_per_request(max_len) * s.tokens_per_block * p.bytes_per_token
    error = None
    if p.blocks <= 0:
        error = "no_memory"
    elif p.blocks_per_request(max_len) > p.blocks:
        error = "max_model_len"
    summary = ServingSummary(
        kv_cache_bytes_per_token=max(r.pool.bytes_per_token for r in ranks),
        max_model_len=max_len,
        kv_cache_tokens=p.tokens,
        kv_cache_blocks=p.blocks,
        max_concurrency=p.tokens / max_len,
        kv_budget_bytes=p.available,
        engine="trtllm",
        engine_version=version,
        requested_bytes=limiting.non_kv + p.available,
        non_kv_bytes=limiting.non_kv,
        activation_peak_bytes=limiting.runtime,
        non_torch_bytes=limiting.outside,
        request_kv_bytes=request,
        engine_error=error,
        largest_max_model_len=largest_max_model_len(spec, s, device, s.batch_size, ranks=ranks),
        largest_max_model_len_one_request=largest_max_model_len(spec, s, device, 1, ranks=ranks),
        largest_concurrency=largest_concurrency(spec, s, device, max_len, ranks=ranks),
        batch_size=s.batch_size,
        device_bytes=limiting.non_kv + p.allocated,
    )
    backend = "PyTorch backend" if version == "1.1" else "TensorRT engine (C++ runtime)"
    assumptions = (
        f"TensorRT-LLM {version} {backend}: KV = {s.kv_cache_free_gpu_mem_fraction:g} x the memory free after "
        f"weights, activations and buffers; {s.tokens_per_block}-token blocks",
        f"weights served in {weight_dtype(spec, s)}" + quantization_note(spec, s),
        f"max_batch_size {max_batch_size_of(s)}, max_num_tokens {max_num_tokens_of(s)}; activations and buffers "
        "from two fitted constants",
    )
    return Estimate(ranks=tuple(out), assumptions=assumptions, serving=summary)
