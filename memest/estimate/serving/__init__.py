"""Serving memory per rank, and the capacity questions serving users ask, answered the engine's way.

Six engines (``--engine``):

- ``vllm`` (default): :mod:`memest.estimate.serving.vllm` (the budget of each vLLM version, the
  weights as it loads them, the job's terms and vLLM's own start-up numbers);
- ``sglang``: :mod:`memest.estimate.serving.sglang` (mem_fraction_static, the token pool);
- ``trtllm``: :mod:`memest.estimate.serving.trtllm` (free_gpu_memory_fraction, KV blocks);
- ``hf``: transformers ``generate`` (:mod:`memest.estimate.serving.hf`);
- ``llama.cpp`` / ``ollama``: GGUF files (:mod:`memest.estimate.serving.llamacpp`).

What every engine shares: :mod:`.common` (served dtypes, weights as stored and as loaded) and :mod:`.kv`
(the KV cache per token, paged and contiguous). Inverse queries: :func:`largest_max_model_len`
and :func:`largest_concurrency` (each engine's own arithmetic, no search over estimates); the
fewest devices that fit is a search over estimates: :func:`memest.planning.search.smallest_parallelism`.
"""

from __future__ import annotations

import dataclasses

from memest.devices import Device, Fleet
from memest.errors import InputError
from memest.estimate.serving.common import max_model_len_of
from memest.estimate.serving.hf import generate as hf_generate
from memest.estimate.serving.llamacpp import engine as llamacpp_engine
from memest.estimate.serving.llamacpp import fit as llamacpp_fit
from memest.estimate.serving.llamacpp import ollama
from memest.estimate.serving.sglang import engine as sglang_engine
from memest.estimate.serving.trtllm import engine as trtllm_engine
from memest.estimate.serving.vllm import engine as vllm_engine
from memest.result import Estimate
from memest.spec import ModelSpec
from memest.workload import Engine, ServingConfig

__all__ = ["estimate_serving", "largest_concurrency", "largest_max_model_len"]


def estimate_serving(spec: ModelSpec, s: ServingConfig, device: Device | Fleet) -> Estimate:
    """Per-rank serving memory and the engine's KV arithmetic.

    On unlike devices (a :class:`~memest.devices.Fleet`) llama.cpp and Ollama split the layers over
    them, each device with its own buffers and fit. vLLM, SGLang and TensorRT-LLM shard tensors equally,
    so the card with the smallest pool binds (the smallest card, unless the runtime's own memory differs
    by architecture) and the estimate is that card's: vLLM's engine takes the
    fewest KV blocks of any worker (``get_kv_cache_configs``, ``vllm/v1/core/kv_cache_utils.py``, 0.19:
    "the num_blocks of each rank [changed] to the smallest among all ranks"), SGLang the least free
    memory of the tp group (``get_available_gpu_memory(..., distributed=True)``: an all-reduce MIN,
    ``python/sglang/srt/utils.py``), TensorRT-LLM the fewest KV tokens over ranks ("make sure all ranks
    use same value for maxTokens": an MPI allreduce MIN in ``KVCacheManager``'s pool sizing,
    ``cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp``). On the larger cards the engine holds the
    same KV pool and leaves the rest unused (vLLM: gpu_memory_utilization applies per GPU, and the
    larger workers' KV tensors are shrunk to the common block count). SGLang sizes its default
    ``mem_fraction_static`` (and the ``chunked_prefill_size`` / ``cuda_graph_max_bs`` behind it) once, for
    every rank, from the smallest card's memory (``get_nvgpu_memory_capacity``: the min over nvidia-smi's
    ``memory.total``; :func:`memest.estimate.serving.sglang.engine.sglang_ranks`), so each card is estimated
    at that fraction and the one with the least free memory binds, as its all-reduce MIN makes it.

    With ``parallelism.dp`` replicas (each an engine with its own pool) the estimate is one replica's,
    serving ``ServingConfig.replica_batch_size`` of the ``batch_size`` requests; the summary keeps the
    job's ``batch_size`` and counts the replicas (``ServingSummary.replicas``).

    Raises:
        InputError: an ``--engine-version`` the engine does not have.
    """
    replicas = s.parallelism.dp
    if replicas == 1:
        return _estimate_replica(spec, s, device)
    est = _estimate_replica(spec, s.replace(batch_size=s.replica_batch_size), device)
    if est.serving is None:
        return est
    return dataclasses.replace(est, serving=dataclasses.replace(est.serving, batch_size=s.batch_size,
                                                                replicas=replicas))


def _estimate_replica(spec: ModelSpec, s: ServingConfig, device: Device | Fleet) -> Estimate:
    """One engine's estimate (:func:`estimate_serving`), its ``batch_size`` the replica's own."""
    if isinstance(device, Fleet):
        if s.engine in (Engine.LLAMACPP, Engine.OLLAMA):
            return (ollama.estimate_ollama if s.engine is Engine.OLLAMA else llamacpp_engine.estimate_llamacpp)(
                spec, s, device)
        if s.engine is Engine.SGLANG:  # one mem_fraction_static for all ranks, from the smallest card
            each = {d: sglang_engine.estimate_sglang(spec, s, d, device.smallest) for d in dict.fromkeys(device.devices)}
        else:
            each = {d: _estimate_replica(spec, s, d) for d in dict.fromkeys(device.devices)}
        small, est = min(each.items(), key=lambda item: (_pool_tokens(item[1]), item[0].memory_bytes))
        note = (f"unlike devices {device.name}: {s.engine.value} shards tensors equally over them and takes the smallest "
                f"KV pool of its ranks, so every rank runs at the card with the least room ({small.name}); the others "
                "hold the same pool and leave the rest unused")
        return dataclasses.replace(est, assumptions=(*est.assumptions, note),
                                   extra={**est.extra, "fleet_binding": small.name})
    if s.engine is Engine.HF:
        return hf_generate.estimate_generate(spec, s, device)
    if s.engine is Engine.SGLANG:
        return sglang_engine.estimate_sglang(spec, s, device)
    if s.engine is Engine.TRTLLM:
        return trtllm_engine.estimate_trtllm(spec, s, device)
    if s.engine is Engine.LLAMACPP:
        return llamacpp_engine.estimate_llamacpp(spec, s, device)
    if s.engine is Engine.OLLAMA:
        return ollama.estimate_ollama(spec, s, device)
    return vllm_engine.estimate_vllm(spec, s, device)


def _pool_tokens(est: Estimate) -> int:
    """The KV tokens an estimate's pool holds (0 without a serving summary)."""
    return est.serving.kv_cache_tokens if est.serving is not None else 0


def largest_max_model_len(spec: ModelSpec, s: ServingConfig, device: Device, concurrency: int) -> int:
    """The longest ``--max-model-len`` at which ``concurrency`` requests of that length fit at once
    (vLLM: :func:`memest.estimate.serving.vllm.engine.largest_max_model_len`; hf:
    :func:`memest.estimate.serving.hf.generate.largest_tokens`). 0 when not even one token fits.

    Raises:
        InputError: concurrency below 1.
    """
    if concurrency < 1:
        raise InputError(f"concurrency {concurrency} must be at least 1")
    if s.engine is Engine.HF:
        limit = spec.max_position_embeddings or max_model_len_of(spec, s)
        return hf_generate.largest_tokens(spec, s, device, concurrency, limit)
    if s.engine is Engine.SGLANG:
        return sglang_engine.largest_max_model_len(spec, s, device, concurrency)
    if s.engine is Engine.TRTLLM:
        return trtllm_engine.largest_max_model_len(spec, s, device, concurrency)
    if s.engine in (Engine.LLAMACPP, Engine.OLLAMA):
        return _largest_n_ctx(spec, s.replace(batch_size=concurrency), device)
    return vllm_engine.largest_max_model_len(spec, s, device, concurrency)


def largest_concurrency(spec: ModelSpec, s: ServingConfig, device: Device, max_model_len: int) -> int:
    """How many requests of ``max_model_len`` tokens fit at once over the job's ``parallelism.dp``
    replicas: each replica's (the floor of vLLM's logged maximum concurrency; for hf, the largest
    batch; for llama.cpp / Ollama, whose n_ctx is fixed, the slots ``batch_size``) times the replicas."""
    return s.parallelism.dp * _replica_concurrency(spec, s, device, max_model_len)


def _replica_concurrency(spec: ModelSpec, s: ServingConfig, device: Device, max_model_len: int) -> int:
    """One replica's :func:`largest_concurrency`."""
    if s.engine is Engine.HF:
        return hf_generate.largest_batch(spec, s, device, max_model_len)
    if s.engine is Engine.SGLANG:
        return sglang_engine.largest_concurrency(spec, s, device, max_model_len)
    if s.engine is Engine.TRTLLM:
        return trtllm_engine.largest_concurrency(spec, s, device, max_model_len)
    if s.engine in (Engine.LLAMACPP, Engine.OLLAMA):
        # llama-server's n_ctx is fixed at start (-c, split over its -np slots, one sequence each):
        # it holds its slots' sequences when a slot has max_model_len cells, whatever memory is left
        st = llamacpp_engine.settings(spec, s)
        return st.n_seq if st.n_ctx // st.n_seq >= max_model_len else 0
    return vllm_engine.largest_concurrency(spec, s, device, max_model_len)


def _largest_n_ctx(spec: ModelSpec, s: ServingConfig, device: Device) -> int:
    """llama.cpp: the longest max_model_len at which s.batch_size sequences (n_ctx = the product, the
    KV cells its slots share) fit with the job's layers."""
    limit = max(spec.max_position_embeddings or 0, s.max_model_len or 0, llamacpp_engine.DEFAULT_N_CTX)
    return llamacpp_fit.largest_n_ctx(spec, s, device, 0.0, limit * 8)
