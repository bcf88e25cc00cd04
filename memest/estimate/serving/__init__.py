"""Serving memory per rank, and the capacity questions serving users ask, answered the engine's way.

Two engines (``--engine``):

- ``vllm`` (default): :mod:`memest.estimate.serving.vllm` (the budget of each vLLM version, the
  weights as it loads them, the job's terms and vLLM's own start-up numbers);
- ``hf``: transformers ``generate`` (:mod:`memest.estimate.serving.hf`);
- ``llama.cpp`` / ``ollama``: GGUF files (:mod:`memest.estimate.serving.llamacpp`).

What both share: :mod:`.common` (served dtypes, weights as stored and as loaded) and :mod:`.kv`
(the KV cache per token, paged and contiguous). Inverse queries: :func:`largest_max_model_len`
and :func:`largest_concurrency` (each engine's own arithmetic, no search over estimates);
:func:`smallest_parallelism` (estimates each layout and judges it by :func:`memest.fit.verdict`).
"""

from __future__ import annotations

import dataclasses

from memest.devices import Device
from memest.errors import InputError
from memest.estimate.serving.common import max_model_len_of
from memest.estimate.serving.hf import generate as hf_generate
from memest.estimate.serving.llamacpp import engine as llamacpp_engine
from memest.estimate.serving.llamacpp import fit as llamacpp_fit
from memest.estimate.serving.llamacpp import ollama
from memest.estimate.serving.vllm import engine as vllm_engine
from memest.result import Estimate
from memest.spec import ModelSpec
from memest.workload import Engine, Parallelism, ServingConfig, tp_head_problem, validate

__all__ = ["MAX_PP_QUERY", "estimate_serving", "largest_concurrency", "largest_max_model_len", "smallest_parallelism"]


def estimate_serving(spec: ModelSpec, s: ServingConfig, device: Device) -> Estimate:
    """Per-rank serving memory and the engine's KV arithmetic.

    Raises:
        InputError: an ``--engine-version`` the engine does not have.
    """
    if s.engine is Engine.HF:
        return hf_generate.estimate_generate(spec, s, device)
    if s.engine is Engine.LLAMACPP:
        return llamacpp_engine.estimate_llamacpp(spec, s, device)
    if s.engine is Engine.OLLAMA:
        return ollama.estimate_ollama(spec, s, device)
    return vllm_engine.estimate_vllm(spec, s, device)


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
    if s.engine in (Engine.LLAMACPP, Engine.OLLAMA):
        return _largest_n_ctx(spec, s.replace(batch_size=concurrency), device)
    return vllm_engine.largest_max_model_len(spec, s, device, concurrency)


def largest_concurrency(spec: ModelSpec, s: ServingConfig, device: Device, max_model_len: int) -> int:
    """How many requests of ``max_model_len`` tokens fit at once (the floor of vLLM's logged
    maximum concurrency; for hf, the largest batch)."""
    if s.engine is Engine.HF:
        return hf_generate.largest_batch(spec, s, device, max_model_len)
    if s.engine in (Engine.LLAMACPP, Engine.OLLAMA):
        return _largest_n_ctx(spec, s.replace(batch_size=1), device) // max(1, max_model_len)
    return vllm_engine.largest_concurrency(spec, s, device, max_model_len)


def _largest_n_ctx(spec: ModelSpec, s: ServingConfig, device: Device) -> int:
    """llama.cpp: the longest max_model_len at which s.batch_size sequences (n_ctx = the product, the
    KV cells its slots share) fit with the job's layers."""
    limit = max(spec.max_position_embeddings or 0, s.max_model_len or 0, llamacpp_engine.DEFAULT_N_CTX)
    return llamacpp_fit.largest_n_ctx(spec, s, device, 0.0, limit * 8)


MAX_PP_QUERY = 16
""":func:`smallest_parallelism` tries pipeline degrees up to this."""


def _parallel_candidates(spec: ModelSpec, device: Device) -> list[Parallelism]:
    tps = [t for t in (1, 2, 4, 8, 16, 32, 64) if device.per_node % t == 0 and tp_head_problem(spec, t) is None]
    pps = [p for p in (1, 2, 4, 8, 16) if p <= min(spec.num_layers, MAX_PP_QUERY)]
    out = [Parallelism(tp=t, pp=p) for t in tps for p in pps]
    return sorted(out, key=lambda par: (par.tp * par.pp, par.pp))


def smallest_parallelism(spec: ModelSpec, s: ServingConfig, device: Device, *, headroom: float) -> Parallelism | None:
    """The fewest devices (tp first, then pp) on which the job fits by the verdict's own rule
    (:func:`memest.fit.verdict`: for vLLM, it starts, its pool holds ``batch_size`` requests of
    max_model_len, and it stays within the device's capacity).

    Tries each power-of-two layout with tp dividing a node that the model's heads allow (the
    planner's rules, with the other degrees asked kept; one replica), up to :data:`MAX_PP_QUERY`
    pipeline stages (vLLM splits layers unevenly, so any pp up to num_layers runs); transformers
    generate runs on one device only. None when none fits.
    """
    from memest.fit import verdict  # planning sits above the estimate (this search belongs to it)

    for candidate in _parallel_candidates(spec, device):
        if s.engine is Engine.HF and (candidate.pp > 1 or candidate.tp > 1):
            continue
        par = dataclasses.replace(s.parallelism, tp=candidate.tp, pp=candidate.pp, dp=1, cp=1, zero_stage=0)
        trial = s.replace(parallelism=par)
        try:
            validate(spec, trial)
            est = estimate_serving(spec, trial, device)
        except InputError:
            continue
        if verdict(est, device, par.world_size, headroom).fits:
            return par
    return None
