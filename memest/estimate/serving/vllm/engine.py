"""vLLM serving on one rank per pipeline stage: the start-up arithmetic, the terms of this job, and
vLLM's own capacity answers.

Weights, the profiled activation peak and non-torch memory are taken from
``gpu_memory_utilization`` x capacity (:mod:`memest.estimate.serving.vllm.budget`, version by
version; weights as loaded: :mod:`memest.estimate.serving.vllm.weights`); the rest becomes paged KV
blocks (:mod:`memest.estimate.serving.kv`). The terms are what *this job* needs on a rank
(``batch_size`` requests of ``max_model_len`` tokens); the summary gives what vLLM itself reports:
KV tokens and blocks, the maximum concurrency it logs, and the start-up error it raises when one
request of max_model_len does not fit, with the largest max_model_len that would.
:func:`largest_max_model_len` and :func:`largest_concurrency` are the engine's own closed-form
arithmetic (no search over estimates).
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
from memest.estimate.serving.kv import (
    PagedLayout,
    kv_bytes_per_token,
    kv_dtype_bytes,
    kv_state_bytes,
    vllm_layout,
)
from memest.estimate.serving.vllm import budget as vllm_budget
from memest.estimate.serving.vllm.weights import loaded_bytes, mla_dequantized, rope_cache_block
from memest.estimate.sharding import Stage, vllm_stages
from memest.estimate.weights import serving_weight_layout
from memest.result import Estimate, Kind, RankEstimate, ServingSummary, Term, plural
from memest.spec import ModelSpec
from memest.workload import ServingConfig


@dataclass(frozen=True, slots=True)
class VllmRank:
    """vLLM's start-up numbers for one pipeline stage's ranks.

    Attributes:
        stage: The pipeline stage.
        layout: Its paged KV layout.
        budget: Its budget arithmetic.
        peak: The profiled activation peak.
        num_blocks: Blocks its available memory holds.
    """

    stage: Stage
    layout: PagedLayout
    budget: vllm_budget.Budget
    peak: vllm_budget.ProfilePeak
    num_blocks: int


DEEPSEEK_V4_POOL_NOTE = (
    "DeepSeek-V4: vLLM's own cache layout (fp8_ds_mla entries of 584 B, 132 B indexer keys, fp32 compressor "
    "states, pages aligned to 576 B, blocks of 256 / 64 / 4 / 8 tokens); --kv-cache-dtype and --block-size are "
    "not read"
)


def vllm_ranks(spec: ModelSpec, s: ServingConfig, device: Device) -> list[VllmRank]:
    """Every pipeline stage's vLLM start-up arithmetic.

    Raises:
        InputError: unknown ``--engine-version``.
    """
    version = vllm_budget.check_version(s.engine_version or vllm_budget.DEFAULT_VLLM_VERSION)
    par = s.parallelism
    max_len = max_model_len_of(spec, s)
    settings = vllm_budget.engine_settings(version, device, max_len, s.max_num_batched_tokens, s.max_num_seqs,
                                           spec=spec)
    c = compute_bytes(spec, s)
    e = kv_dtype_bytes(spec, s)
    out = []
    for stage in vllm_stages(spec.num_layers, par.pp):
        kinds = spec.layer_kinds(stage.start, stage.stop)
        layout = vllm_layout(spec, kinds, par.tp, e, c, s.block_size)  # mamba_cache_dtype auto
        weights = loaded_bytes(spec, s, stage) + rope_cache_block(spec, c)
        peak = vllm_budget.profile_peak(spec, kinds, last=stage.last, tp=par.tp, c=c, settings=settings,
                                        max_model_len=max_len, block_size=s.block_size, version=version,
                                        device=device)
        non_torch = vllm_budget.non_torch_bytes(version, par.tp, last=stage.last, pp=par.pp, device=device)
        b = vllm_budget.budget(version, device, s.gpu_memory_utilization, weights, peak.total, non_torch)
        out.append(VllmRank(stage, layout, b, peak, layout.num_blocks(b.available)))
    return out


def _vllm_terms(spec: ModelSpec, s: ServingConfig, device: Device, r: VllmRank, version: str,
                mnbt: int) -> list[Term]:
    max_len = max_model_len_of(spec, s)
    need = s.batch_size * r.layout.request_bytes(max_len, mnbt)
    scheme, _ = serving_weight_layout(spec, s.quantization)
    stored = stage_weight_bytes(spec, s, r.stage)
    rope = rope_cache_block(spec, compute_bytes(spec, s))
    terms = [
        Term("weights", Kind.WEIGHTS, stored,
             f"stage parameters / tp at {weight_dtype(spec, s)}" + (f", {scheme.name} linear weights" if scheme else "")),
    ]
    if rope:
        terms.append(Term("weights.rope_cache", Kind.WEIGHTS, rope, "rotary cos/sin cache: max_position x rotary dim x c"))
    mla = mla_dequantized(spec, s, r.stage)
    if mla:
        terms.append(Term("weights.mla_dequantized", Kind.WEIGHTS, mla,
                          "kv_b_proj dequantized to c for MLA's W_UK_T / W_UV (process_weights_after_loading)"))
    rounding = r.budget.weights - stored - rope - mla
    if rounding > 0:
        terms.append(Term("weights.block_rounding", Kind.WEIGHTS, rounding,
                          "caching-allocator rounding of vLLM's merged weight tensors (2 MiB segments)"))
    state = s.batch_size * r.layout.request_state_bytes(max_len, mnbt)
    terms.append(Term("kv_cache", Kind.KV_CACHE, need - state,
                      f"{plural(s.batch_size, 'request')} x {max_len} tokens in {r.layout.min_block_size}-token pages "
                      f"({r.layout.page_bytes:,} B/page, windows capped)"))
    if state:
        terms.append(Term("kv_cache.state", Kind.KV_CACHE, state,
                          f"{plural(s.batch_size, 'request')} x one page per state / cross-attention layer: recurrent and conv "
                          "states, encoder K/V (fixed per request)"))
    p = r.peak
    if p.persistent:
        terms.append(Term("activations.moe_workspace", Kind.ACTIVATIONS, p.persistent,
                          "fused-experts workspaces T x top_k x (max(i/t, h) + max(2i/t, h)) x c, kept"))
    if p.sampler > p.forward:
        terms.append(Term("logits", Kind.LOGITS, p.sampler,
                          "profiled sampler: hidden T x h + N x V logits, fp32 copy, softmax, noise (> forward peak)"))
    else:
        terms.append(Term("activations", Kind.ACTIVATIONS, p.forward,
                          "profiled forward of max_num_batched_tokens: largest layer's intermediates"))
    terms.append(Term("workspace.cublas", Kind.WORKSPACE, p.workspace, "cuBLAS workspace"))
    if version == "0.19":
        terms.append(Term("runtime.non_torch", Kind.RUNTIME, r.budget.non_torch,
                          "non-torch memory the forward adds (all-reduce buffers, lazily loaded kernels)"))
        terms.append(Term("runtime.cuda_context", Kind.RUNTIME, runtime.cuda_context_bytes(device),
                          f"{device.arch} context (outside vLLM's budget)"))
        nccl = runtime.nccl_bytes(s.parallelism.tp * s.parallelism.pp, device)
        if nccl:
            terms.append(Term("runtime.nccl", Kind.RUNTIME, nccl, "NCCL communicators (outside vLLM's budget)"))
    elif version == vllm_budget.V064:
        terms.append(Term("runtime.non_torch", Kind.RUNTIME, r.budget.non_torch,
                          f"non-torch memory after the profile run: {device.arch} CUDA context, NCCL "
                          "(other processes' memory on the device not counted)"))
    else:
        terms.append(Term("runtime.non_torch", Kind.RUNTIME, r.budget.non_torch,
                          "non-torch memory since start-up: CUDA context, NCCL, allocator cache"))
    graphs = vllm_budget.cuda_graph_bytes(device, r.stage.num_layers, enforce_eager=s.enforce_eager)
    if graphs:
        terms.append(Term("runtime.cuda_graphs", Kind.RUNTIME, graphs,
                          "CUDA-graph pool, captured after the KV cache: 0.39 GiB + 16.6 MiB x layers of the stage"))
    return terms


def estimate_vllm(spec: ModelSpec, s: ServingConfig, device: Device) -> Estimate:
    """Per-rank memory of this job under vLLM and vLLM's own start-up numbers (the summary).

    Raises:
        InputError: an ``--engine-version`` vLLM does not have.
    """
    version = s.engine_version or vllm_budget.DEFAULT_VLLM_VERSION
    ranks = vllm_ranks(spec, s, device)
    max_len = max_model_len_of(spec, s)
    settings = vllm_budget.engine_settings(version, device, max_len, s.max_num_batched_tokens, s.max_num_seqs,
                                           spec=spec)
    mnbt = settings.max_num_batched_tokens
    out = []
    for r in ranks:
        label = "all ranks" if len(ranks) == 1 else f"pp stage {r.stage.index}"
        out.append(RankEstimate(label, tuple(_vllm_terms(spec, s, device, r, version, mnbt)),
                                s.parallelism.world_size // s.parallelism.pp))
    summary = _vllm_summary(spec, s, device, ranks, mnbt)
    assumptions = (
        f"vLLM {version} start-up budget; max_num_batched_tokens {mnbt}, max_num_seqs {settings.max_num_seqs}",
        f"weights served in {weight_dtype(spec, s)}" + quantization_note(spec, s),
        f"KV cache in {s.kv_cache_dtype if s.kv_cache_dtype != 'auto' else weight_dtype(spec, s)}",
        "KV pool = what is left of gpu_memory_utilization x capacity; the terms show what this job's requests need",
        *((DEEPSEEK_V4_POOL_NOTE,) if any(layer.attention.compress_rate for layer in spec.layers) else ()),
    )
    return Estimate(ranks=tuple(out), assumptions=assumptions, serving=summary)


def _engine_blocks(ranks: list[VllmRank]) -> VllmRank:
    """The rank that limits the pool: vLLM gives every worker the smallest block count."""
    return min(ranks, key=lambda r: r.num_blocks)


def _vllm_summary(spec: ModelSpec, s: ServingConfig, device: Device, ranks: list[VllmRank], mnbt: int) -> ServingSummary:
    max_len = max_model_len_of(spec, s)
    limiting = _engine_blocks(ranks)
    blocks = limiting.num_blocks
    layout = limiting.layout
    tokens = layout.pool_tokens(blocks, max_len, mnbt)
    per_token = max(r.layout.bytes_per_token() or kv_bytes_per_token(spec, s, r.stage) for r in ranks)
    state = max(kv_state_bytes(spec, s, r.stage) for r in ranks)
    worst = min(ranks, key=lambda r: r.budget.available - r.layout.request_bytes(max_len, mnbt))
    needed = worst.layout.request_bytes(max_len, mnbt)
    available = worst.budget.available
    error = None
    largest = worst.layout.largest_max_model_len(max(available, 0), max_len, mnbt)
    if available <= 0:
        error = "no_memory"
    elif needed > available:
        error = "max_model_len"
    return ServingSummary(
        kv_cache_bytes_per_token=per_token,
        state_bytes_per_sequence=state,
        max_model_len=max_len,
        kv_cache_tokens=tokens,
        kv_cache_blocks=blocks,
        max_concurrency=layout.max_concurrency(blocks, max_len, mnbt),
        kv_budget_bytes=max(0, limiting.budget.available),
        engine="vllm",
        engine_version=s.engine_version or vllm_budget.DEFAULT_VLLM_VERSION,
        requested_bytes=limiting.budget.requested,
        non_kv_bytes=limiting.budget.non_kv,
        activation_peak_bytes=limiting.budget.activation,
        non_torch_bytes=limiting.budget.non_torch,
        request_kv_bytes=needed,
        engine_error=error,
        largest_max_model_len=largest_max_model_len(spec, s, device, s.batch_size, ranks=ranks),
        largest_max_model_len_one_request=largest,
        largest_concurrency=largest_concurrency(spec, s, device, max_len, ranks=ranks),
        batch_size=s.batch_size,
        device_bytes=limiting.budget.requested + vllm_budget.outside_budget_bytes(
            s.engine_version or vllm_budget.DEFAULT_VLLM_VERSION, device, max(r.stage.num_layers for r in ranks),
            enforce_eager=s.enforce_eager, world_size=s.parallelism.tp * s.parallelism.pp),
    )


# ---- inverse queries ----


def largest_max_model_len(spec: ModelSpec, s: ServingConfig, device: Device, concurrency: int,
                          *, ranks: list[VllmRank] | None = None) -> int:
    """The longest ``--max-model-len`` at which ``concurrency`` (at least 1) requests of that length
    fit at once: the largest L with ``concurrency x blocks_per_request(L) <= num_blocks`` (the
    scheduler admits a request when its blocks are free), capped at the model's
    max_position_embeddings; the pool does not depend on L (the profile run is bounded by
    max_num_batched_tokens). 0 when not even one token fits."""
    limit = spec.max_position_embeddings or max_model_len_of(spec, s)
    ranks = ranks or vllm_ranks(spec, s, device)
    version = s.engine_version or vllm_budget.DEFAULT_VLLM_VERSION
    mnbt = vllm_budget.engine_settings(version, device, max_model_len_of(spec, s), s.max_num_batched_tokens,
                                       s.max_num_seqs, spec=spec).max_num_batched_tokens
    r = _engine_blocks(ranks)
    if concurrency * r.layout.blocks_per_request(1, mnbt) > r.num_blocks:
        return 0
    lo, hi = 1, limit
    while lo < hi:  # blocks_per_request is monotone in L: vLLM's own bisection (estimate_max_model_len)
        mid = (lo + hi + 1) // 2
        if concurrency * r.layout.blocks_per_request(mid, mnbt) <= r.num_blocks:
            lo = mid
        else:
            hi = mid - 1
    return lo


def largest_concurrency(spec: ModelSpec, s: ServingConfig, device: Device, max_model_len: int,
                        *, ranks: list[VllmRank] | None = None) -> int:
    """How many requests of ``max_model_len`` tokens fit at once (the floor of vLLM's logged
    maximum concurrency)."""
    ranks = ranks or vllm_ranks(spec, s, device)
    version = s.engine_version or vllm_budget.DEFAULT_VLLM_VERSION
    mnbt = vllm_budget.engine_settings(version, device, max_model_len_of(spec, s), s.max_num_batched_tokens,
                                       s.max_num_seqs, spec=spec).max_num_batched_tokens
    r = _engine_blocks(ranks)
    per = r.layout.blocks_per_request(max_model_len, mnbt)
    if not per:  # no KV cache at all (encoder-only models): the scheduler's max_num_seqs is the limit
        return vllm_budget.engine_settings(version, device, max_model_len_of(spec, s), s.max_num_batched_tokens,
                                           s.max_num_seqs, spec=spec).max_num_seqs if r.budget.available > 0 else 0
    return r.num_blocks // per
