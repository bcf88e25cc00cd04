"""SGLang serving on one rank per pipeline stage: the start-up arithmetic
(:mod:`memest.estimate.serving.sglang.budget`), the terms of this job, and SGLang's own numbers.

The free memory SGLang starts from is the device's capacity less the CUDA context and, with more
than one rank, the NCCL communicators (:mod:`memest.estimate.runtime`). The weights are those vLLM
loads (:func:`memest.estimate.serving.vllm.weights.loaded_bytes` and the rotary cache): SGLang's
linear layers (``python/sglang/srt/layers/linear.py``) are vLLM's, merging q/k/v and gate/up the
same way. SGLang's pool is token-granular: a request of L tokens takes ``ceil(L / page_size)``
pages; its ``--context-length`` is memest's ``--max-model-len`` (both default to the model's
max_position_embeddings).
"""

from __future__ import annotations

from dataclasses import dataclass

from memest.devices import Device
from memest.estimate import runtime
from memest.estimate.serving.common import compute_bytes, max_model_len_of, quantization_note, weight_dtype
from memest.estimate.serving.kv import kv_bytes_per_token
from memest.estimate.serving.sglang import budget as sg
from memest.estimate.serving.vllm.weights import loaded_bytes, rope_cache_block
from memest.estimate.sharding import Stage, vllm_stages
from memest.result import Estimate, Kind, RankEstimate, ServingSummary, Term, plural
from memest.spec import ModelSpec
from memest.workload import ServingConfig


def version_of(s: ServingConfig) -> str:
    """``--engine-version``, else the newest modelled."""
    return s.engine_version or sg.SGLANG_VERSIONS[0]


def free_before_load(device: Device, world_size: int) -> int:
    """Free memory on a rank when SGLang measures ``total_gpu_memory``: the capacity less the CUDA
    context and the NCCL communicators (initialised before, ``init_torch_distributed``)."""
    return device.memory_bytes - runtime.cuda_context_bytes(device) - runtime.nccl_bytes(world_size, device)


def mem_fraction(spec: ModelSpec, s: ServingConfig, device: Device, sized_by: Device | None = None) -> float:
    """The mem_fraction_static SGLang runs with: ``--mem-fraction-static``, else its default
    (:func:`memest.estimate.serving.sglang.budget.mem_fraction_static`) from the memory of ``sized_by``
    (the smallest card of unlike ones: :func:`sglang_ranks`), else of ``device``."""
    par = s.parallelism
    version = version_of(s)
    default = sg.default_mem_fraction_static(version, sized_by or device, par.tp, par.pp, s.chunked_prefill_size)
    return sg.mem_fraction_static(version, s.mem_fraction_static, default, spec.architecture)


@dataclass(frozen=True, slots=True)
class SglangRank:
    """One pipeline stage's start-up numbers.

    Attributes:
        stage: The pipeline stage.
        pool: Its pool arithmetic.
    """

    stage: Stage
    pool: sg.Pool


def sglang_ranks(spec: ModelSpec, s: ServingConfig, device: Device, sized_by: Device | None = None) -> list[SglangRank]:
    """Every pipeline stage's pool (SGLang takes the smallest token count over the stages) on ``device``.

    Args:
        sized_by: On unlike cards, the one SGLang sizes its defaults by: the smallest. ``ServerArgs``
            (``_handle_gpu_memory_settings``) reads ``gpu_mem = get_device_memory_capacity()`` once, in the
            launcher, for every rank; on CUDA that is ``get_nvgpu_memory_capacity()``, the ``min`` of
            ``nvidia-smi --query-gpu=memory.total`` over every GPU it lists (sgl-project/sglang
            ``python/sglang/srt/utils/common.py`` at 004f0c7a8d398a9c4b6844c1d8071502fa88e78c). None: ``device``.
    """
    par = s.parallelism
    total = free_before_load(device, par.tp * par.pp)
    fraction = mem_fraction(spec, s, device, sized_by)
    c = compute_bytes(spec, s)
    out = []
    for stage in vllm_stages(spec.num_layers, par.pp):
        weights = loaded_bytes(spec, s, stage) + rope_cache_block(spec, c)
        out.append(SglangRank(stage, sg.pool(total, fraction, weights, kv_bytes_per_token(spec, s, stage),
                                             s.page_size)))
    return out


def pool_tokens(ranks: list[SglangRank]) -> int:
    """``max_total_num_tokens``: the smallest over the pipeline stages (all-reduced MIN)."""
    return min(r.pool.tokens for r in ranks)


def request_tokens(length: int, page_size: int) -> int:
    """Pool slots one request of ``length`` tokens takes: whole pages."""
    return -(-length // page_size) * page_size


def largest_concurrency(spec: ModelSpec, s: ServingConfig, device: Device, max_model_len: int,
                        *, ranks: list[SglangRank] | None = None) -> int:
    """Requests of ``max_model_len`` tokens the pool holds at once, at most the scheduler's
    max_running_requests."""
    ranks = ranks or sglang_ranks(spec, s, device)
    tokens = pool_tokens(ranks)
    if tokens <= 0:
        return 0
    running = sg.running_requests(tokens, max_model_len_of(spec, s), s.max_running_requests)
    return min(tokens // request_tokens(max_model_len, s.page_size), running)


def largest_max_model_len(spec: ModelSpec, s: ServingConfig, device: Device, concurrency: int,
                          *, ranks: list[SglangRank] | None = None) -> int:
    """The longest length at which ``concurrency`` requests fit the pool at once (whole pages),
    capped at the model's max_position_embeddings; 0 when not even one token each fits."""
    ranks = ranks or sglang_ranks(spec, s, device)
    limit = spec.max_position_embeddings or max_model_len_of(spec, s)
    per = pool_tokens(ranks) // concurrency // s.page_size * s.page_size
    return max(0, min(per, limit))


def _terms(spec: ModelSpec, s: ServingConfig, device: Device, r: SglangRank, tokens: int) -> list[Term]:
    max_len = max_model_len_of(spec, s)
    need = s.batch_size * request_tokens(max_len, s.page_size) * r.pool.cell_size
    terms = [
        Term("weights", Kind.WEIGHTS, r.pool.weights,
             f"stage parameters / tp at {weight_dtype(spec, s)}, merged as loaded, rotary cache"),
        Term("kv_cache", Kind.KV_CACHE, need,
             f"{plural(s.batch_size, 'request')} x {max_len} tokens in {s.page_size}-token pages ({r.pool.cell_size:,} B/token)"),
        Term("runtime.req_to_token", Kind.RUNTIME, sg.req_to_token_bytes(tokens, max_len, s.max_running_requests),
             "request table: (max_num_reqs + 1) x (context_len + 4) x int32"),
        Term("runtime.cuda_context", Kind.RUNTIME, runtime.cuda_context_bytes(device), f"{device.arch} context"),
    ]
    nccl = runtime.nccl_bytes(s.parallelism.tp * s.parallelism.pp, device)
    if nccl:
        terms.append(Term("runtime.nccl", Kind.RUNTIME, nccl, "NCCL communicators"))
    return terms


def estimate_sglang(spec: ModelSpec, s: ServingConfig, device: Device, sized_by: Device | None = None) -> Estimate:
    """Per-rank memory of this job under SGLang and SGLang's own start-up numbers (the summary); ``sized_by``:
    the card SGLang's defaults are sized by when it is not ``device`` (:func:`sglang_ranks`)."""
    version = version_of(s)
    ranks = sglang_ranks(spec, s, device, sized_by)
    tokens = pool_tokens(ranks)
    max_len = max_model_len_of(spec, s)
    out = []
    for r in ranks:
        label = "all ranks" if len(ranks) == 1 else f"pp stage {r.stage.index}"
        out.append(RankEstimate(label, tuple(_terms(spec, s, device, r, tokens)),
                                s.parallelism.world_size // s.parallelism.pp))
    limiting = min(ranks, key=lambda r: r.pool.rest)
    p = limiting.pool
    request = request_tokens(max_len, s.page_size) * p.cell_size
    error = None
    if tokens <= 0:
        error = "no_memory"
    elif request_tokens(max_len, s.page_size) > tokens:
        error = "max_model_len"
    par = s.parallelism
    req_table = sg.req_to_token_bytes(max(tokens, 0), max_len, s.max_running_requests)
    held = device.memory_bytes - p.total + p.weights + p.kv_bytes + req_table
    summary = ServingSummary(
        kv_cache_bytes_per_token=max(r.pool.cell_size for r in ranks),
        max_model_len=max_len,
        kv_cache_tokens=max(tokens, 0),
        kv_cache_blocks=max(tokens, 0) // s.page_size,
        max_concurrency=tokens / max_len if tokens > 0 else 0.0,
        kv_budget_bytes=max(0, p.rest),
        engine="sglang",
        engine_version=version,
        requested_bytes=p.static,
        non_kv_bytes=p.weights,
        non_torch_bytes=runtime.cuda_context_bytes(device) + runtime.nccl_bytes(par.tp * par.pp, device),
        request_kv_bytes=request,
        engine_error=error,
        largest_max_model_len=largest_max_model_len(spec, s, device, s.batch_size, ranks=ranks),
        largest_max_model_len_one_request=largest_max_model_len(spec, s, device, 1, ranks=ranks),
        largest_concurrency=largest_concurrency(spec, s, device, max_len, ranks=ranks),
        batch_size=s.batch_size,
        device_bytes=held,
    )
    assumptions = (
        f"SGLang {version} start-up: mem_fraction_static {p.mem_fraction_static:g} of "
        f"{p.total / (1 << 30):.2f} GiB free before the weights; page_size {s.page_size}",
        f"weights served in {weight_dtype(spec, s)}" + quantization_note(spec, s),
        f"KV cache in {s.kv_cache_dtype if s.kv_cache_dtype != 'auto' else weight_dtype(spec, s)}, every layer full",
        "activations and CUDA graphs live in SGLang's (1 - mem_fraction_static) reserve, not sized here",
    )
    return Estimate(ranks=tuple(out), assumptions=assumptions, serving=summary)
