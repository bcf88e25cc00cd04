"""Serving memory per rank, and the capacity questions serving users ask, answered the engine's way.

Two engines (``--engine``):

- ``vllm`` (default): :mod:`memest.estimate.serving.vllm` (the budget of each vLLM version, the
  weights as it loads them, the job's terms and vLLM's own start-up numbers);
- ``hf``: transformers ``generate`` (:mod:`memest.estimate.serving.hf`).

What both share: :mod:`.common` (served dtypes, weights as stored and as loaded) and :mod:`.kv`
(the KV cache per token, paged and contiguous). Inverse queries: :func:`largest_max_model_len`
and :func:`largest_concurrency` (each engine's own arithmetic, no search over estimates); the
fewest devices that fit is a search over estimates: :func:`memest.planning.search.smallest_parallelism`.
"""

from __future__ import annotations

from memest.devices import Device
from memest.errors import InputError
from memest.estimate.serving.common import max_model_len_of
from memest.estimate.serving.hf import generate as hf_generate
from memest.estimate.serving.vllm import engine as vllm_engine
from memest.result import Estimate
from memest.spec import ModelSpec
from memest.workload import Engine, ServingConfig

__all__ = ["estimate_serving", "largest_concurrency", "largest_max_model_len"]


def estimate_serving(spec: ModelSpec, s: ServingConfig, device: Device) -> Estimate:
    """Per-rank serving memory and the engine's KV arithmetic.

    Raises:
        InputError: an ``--engine-version`` the engine does not have.
    """
    if s.engine is Engine.HF:
        return hf_generate.estimate_generate(spec, s, device)
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
    return vllm_engine.largest_max_model_len(spec, s, device, concurrency)


def largest_concurrency(spec: ModelSpec, s: ServingConfig, device: Device, max_model_len: int) -> int:
    """How many requests of ``max_model_len`` tokens fit at once (the floor of vLLM's logged
    maximum concurrency; for hf, the largest batch)."""
    if s.engine is Engine.HF:
        return hf_generate.largest_batch(spec, s, device, max_model_len)
    return vllm_engine.largest_concurrency(spec, s, device, max_model_len)
