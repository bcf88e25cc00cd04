"""Serving memory per rank, and the capacity questions serving users ask, answered the engine's way.

Two engines (``--engine``):

- ``vllm`` (default): weights, the profiled activation peak and non-torch memory are taken from
  ``gpu_memory_utilization`` x capacity; the rest becomes paged KV blocks
  (:mod:`memest.estimate.vllm_engine` for the budget of each vLLM version,
  :mod:`memest.estimate.kv_cache` for the pages). The terms are what *this job* needs on a rank
  (``batch_size`` requests of ``max_model_len`` tokens); the summary gives what vLLM itself
  reports: KV tokens and blocks, the maximum concurrency it logs, and the start-up error it raises
  when one request of max_model_len does not fit, with the largest max_model_len that would.
- ``hf``: transformers ``generate`` (:mod:`memest.estimate.hf_generate`).

Inverse queries: :func:`largest_max_model_len` and :func:`largest_concurrency` (the engine's own
closed-form arithmetic, no search over estimates); :func:`smallest_parallelism` (estimates each
layout and judges it by :func:`memest.fit.verdict`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from memest.devices import Device
from memest.estimate import runtime, vllm_engine
from memest.estimate.dtypes import nbytes
from memest.estimate.kv_cache import PagedLayout, bytes_per_token, kv_element_bytes, kv_layers, paged_layout
from memest.estimate.sharding import Stage, stage_tensors, vllm_stages
from memest.estimate.weights import checkpoint_scale, serving_weight_layout, weight_bytes
from memest.result import Estimate, Kind, RankEstimate, ServingSummary, Term
from memest.spec import ModelSpec
from memest.workload import Engine, Parallelism, ServingConfig, tp_head_problem, validate

GiB = 1 << 30
_POSITION_TABLES = ("wpe", "position", "pos_emb")
_NO_ROPE_TYPES = ("bloom", "mpt", "gpt2", "gpt_bigcode", "opt", "bert", "t5", "falcon_alibi")


def weight_dtype(spec: ModelSpec, s: ServingConfig) -> str:
    """The dtype unquantized weights are served in: ``--dtype``, else the checkpoint's; for vLLM an
    fp32 checkpoint in bfloat16.

    vLLM's ``dtype="auto"`` (``vllm/config/model.py`` ``_resolve_auto_dtype``) serves a float32
    checkpoint in the platform's first supported dtype, bfloat16 on CUDA devices of compute
    capability 8.0 and later (float16 before, the same 2 bytes; Gemma 2/3 fall back to float32 there,
    which memest does not model), and other checkpoints in their own dtype. transformers loads a
    checkpoint in its own dtype under ``dtype="auto"`` (the default since transformers 5), float32
    included.
    """
    if s.dtype != "auto":
        return s.dtype
    stored = (spec.torch_dtype or "bfloat16").lower().removeprefix("torch.")
    if stored in ("float32", "fp32", "float"):
        return "bfloat16" if s.engine is Engine.VLLM else "float32"
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


def kv_dtype_bytes(spec: ModelSpec, s: ServingConfig) -> float:
    """Bytes per KV-cache element (``--kv-cache-dtype``; ``auto`` = the served dtype)."""
    return kv_element_bytes(s.kv_cache_dtype, weight_dtype(spec, s))


def max_model_len_of(spec: ModelSpec, s: ServingConfig) -> int:
    """``--max-model-len``, else the model's max_position_embeddings (vLLM's derived default)."""
    return s.max_model_len or spec.max_position_embeddings or 2048


def kv_bytes_per_token(spec: ModelSpec, s: ServingConfig, stage: Stage | None = None) -> int:
    """KV-cache bytes one token takes on one rank, over the rank's attention layers (windows ignored)."""
    start, stop = (stage.start, stage.stop) if stage else (0, spec.num_layers)
    return bytes_per_token(kv_layers(spec.layer_kinds(start, stop), s.parallelism.tp, kv_dtype_bytes(spec, s)))


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


def _rope_cache_block(spec: ModelSpec, c: float) -> int:
    """The rotary cache as the caching allocator holds it (none for models without rotary positions)."""
    raw = rope_cache_bytes(spec, c)
    return vllm_engine.cuda_block_bytes(raw) if raw else 0


def stage_weight_bytes(spec: ModelSpec, s: ServingConfig, stage: Stage) -> int:
    """Weights one rank of ``stage`` holds as served (quantized formats, TP shards, checkpoint
    scale from ``--exact-weights``)."""
    c = compute_bytes(spec, s)
    scheme, skip = serving_weight_layout(spec, s.quantization)
    w = weight_bytes(stage_tensors(spec, stage), s.parallelism, spec.num_kv_heads, dtype_bytes=c, scheme=scheme, skip=skip)
    if s.checkpoint_params:
        w = math.ceil(w * checkpoint_scale(spec, s.checkpoint_params, c, scheme, skip))
    return w


# ---- vLLM ----


def _vllm_weight_bytes(spec: ModelSpec, s: ServingConfig, stage: Stage) -> int:
    c = compute_bytes(spec, s)
    scheme, skip = serving_weight_layout(spec, s.quantization)
    w = vllm_engine.loaded_weight_bytes(stage_tensors(spec, stage), s.parallelism, spec.num_kv_heads,
                                        dtype_bytes=c, scheme=scheme, skip=skip)
    if s.checkpoint_params:
        w = math.ceil(w * checkpoint_scale(spec, s.checkpoint_params, c, scheme, skip))
    return w + _mla_dequantized(spec, s, stage)


def _mla_dequantized(spec: ModelSpec, s: ServingConfig, stage: Stage) -> int:
    scheme, skip = serving_weight_layout(spec, s.quantization)
    return vllm_engine.mla_dequantized_bytes(stage_tensors(spec, stage), s.parallelism, spec.num_kv_heads,
                                             dtype_bytes=compute_bytes(spec, s), scheme=scheme, skip=skip)


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
    budget: vllm_engine.Budget
    peak: vllm_engine.ProfilePeak
    num_blocks: int


def vllm_ranks(spec: ModelSpec, s: ServingConfig, device: Device) -> list[VllmRank]:
    """Every pipeline stage's vLLM start-up arithmetic.

    Raises:
        InputError: unknown ``--engine-version``.
    """
    version = vllm_engine.check_version(s.engine_version or vllm_engine.DEFAULT_VLLM_VERSION)
    par = s.parallelism
    max_len = max_model_len_of(spec, s)
    settings = vllm_engine.engine_settings(version, device, max_len, s.max_num_batched_tokens, s.max_num_seqs)
    c = compute_bytes(spec, s)
    e = kv_dtype_bytes(spec, s)
    out = []
    for stage in vllm_stages(spec.num_layers, par.pp):
        kinds = spec.layer_kinds(stage.start, stage.stop)
        layout = paged_layout(kv_layers(kinds, par.tp, e), s.block_size)
        weights = _vllm_weight_bytes(spec, s, stage) + _rope_cache_block(spec, c)
        peak = vllm_engine.profile_peak(spec, kinds, last=stage.last, tp=par.tp, c=c, settings=settings,
                                        max_model_len=max_len, block_size=s.block_size, version=version,
                                        device=device)
        non_torch = vllm_engine.non_torch_bytes(version, par.tp, last=stage.last, pp=par.pp)
        b = vllm_engine.budget(version, device, s.gpu_memory_utilization, weights, peak.total, non_torch)
        out.append(VllmRank(stage, layout, b, peak, layout.num_blocks(b.available)))
    return out


def _vllm_terms(spec: ModelSpec, s: ServingConfig, device: Device, r: VllmRank, version: str,
                mnbt: int) -> list[Term]:
    max_len = max_model_len_of(spec, s)
    need = s.batch_size * r.layout.request_bytes(max_len, mnbt)
    scheme, _ = serving_weight_layout(spec, s.quantization)
    stored = stage_weight_bytes(spec, s, r.stage)
    rope = _rope_cache_block(spec, compute_bytes(spec, s))
    terms = [
        Term("weights", Kind.WEIGHTS, stored,
             f"stage parameters / tp at {weight_dtype(spec, s)}" + (f", {scheme.name} linear weights" if scheme else "")),
    ]
    if rope:
        terms.append(Term("weights.rope_cache", Kind.WEIGHTS, rope, "rotary cos/sin cache: max_position x rotary dim x c"))
    mla = _mla_dequantized(spec, s, r.stage)
    if mla:
        terms.append(Term("weights.mla_dequantized", Kind.WEIGHTS, mla,
                          "kv_b_proj dequantized to c for MLA's W_UK_T / W_UV (process_weights_after_loading)"))
    rounding = r.budget.weights - stored - rope - mla
    if rounding > 0:
        terms.append(Term("weights.block_rounding", Kind.WEIGHTS, rounding,
                          "caching-allocator rounding of vLLM's merged weight tensors (2 MiB segments)"))
    terms += [
        Term("kv_cache", Kind.KV_CACHE, need,
             f"{s.batch_size} requests x {max_len} tokens in {r.layout.block_size}-token pages "
             f"({r.layout.page_bytes:,} B/page, windows capped)"),
    ]
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
        nccl = runtime.nccl_bytes(s.parallelism.tp * s.parallelism.pp)
        if nccl:
            terms.append(Term("runtime.nccl", Kind.RUNTIME, nccl, "NCCL communicators (outside vLLM's budget)"))
    else:
        terms.append(Term("runtime.non_torch", Kind.RUNTIME, r.budget.non_torch,
                          "non-torch memory since start-up: CUDA context, NCCL, allocator cache"))
    graphs = cuda_graph_bytes(s, device, r.stage.num_layers)
    if graphs:
        terms.append(Term("runtime.cuda_graphs", Kind.RUNTIME, graphs,
                          "CUDA-graph pool, captured after the KV cache: 0.39 GiB + 16.6 MiB x layers of the stage"))
    return terms


def cuda_graph_bytes(s: ServingConfig, device: Device, num_layers: int) -> int:
    """vLLM's CUDA-graph pool on one rank: none with ``--enforce-eager`` or on devices without CUDA /
    HIP graphs (TPU, Gaudi)."""
    if s.enforce_eager or device.kind == "tpu" or device.vendor == "intel":
        return 0
    return vllm_engine.cuda_graph_bytes(num_layers)


def outside_budget_bytes(s: ServingConfig, device: Device, version: str, num_layers: int) -> int:
    """What a vLLM process holds on one device beyond gpu_memory_utilization x capacity: the CUDA
    graphs captured after the KV cache (not with ``--enforce-eager``) for a stage of
    ``num_layers`` layers, and for 0.19, whose budget starts after them (see
    :mod:`memest.estimate.vllm_engine`), the CUDA context and the NCCL communicators."""
    out = cuda_graph_bytes(s, device, num_layers)
    if version == "0.19":
        out += runtime.cuda_context_bytes(device) + runtime.nccl_bytes(s.parallelism.tp * s.parallelism.pp)
    return out


def _estimate_vllm(spec: ModelSpec, s: ServingConfig, device: Device) -> Estimate:
    version = s.engine_version or vllm_engine.DEFAULT_VLLM_VERSION
    ranks = vllm_ranks(spec, s, device)
    max_len = max_model_len_of(spec, s)
    settings = vllm_engine.engine_settings(version, device, max_len, s.max_num_batched_tokens, s.max_num_seqs)
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
    tokens = layout.tokens(blocks)
    per_token = max(kv_bytes_per_token(spec, s, r.stage) for r in ranks)
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
        max_model_len=max_len,
        kv_cache_tokens=tokens,
        kv_cache_blocks=blocks,
        max_concurrency=layout.max_concurrency(blocks, max_len, mnbt),
        kv_budget_bytes=max(0, limiting.budget.available),
        engine="vllm",
        engine_version=s.engine_version or vllm_engine.DEFAULT_VLLM_VERSION,
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
        device_bytes=limiting.budget.requested + outside_budget_bytes(
            s, device, s.engine_version or vllm_engine.DEFAULT_VLLM_VERSION, max(r.stage.num_layers for r in ranks)),
    )


# ---- inverse queries ----


def largest_max_model_len(spec: ModelSpec, s: ServingConfig, device: Device, concurrency: int,
                          *, ranks: list[VllmRank] | None = None) -> int:
    """The longest ``--max-model-len`` at which ``concurrency`` requests of that length fit at once.

    vLLM: the largest L with ``concurrency x blocks_per_request(L) <= num_blocks`` (the scheduler
    admits a request when its blocks are free), capped at the model's max_position_embeddings;
    the pool does not depend on L (the profile run is bounded by max_num_batched_tokens).
    hf: see :func:`memest.estimate.hf_generate.largest_tokens`. 0 when not even one token fits.

    Raises:
        InputError: concurrency below 1.
    """
    from memest.errors import InputError

    if concurrency < 1:
        raise InputError(f"concurrency {concurrency} must be at least 1")
    limit = spec.max_position_embeddings or max_model_len_of(spec, s)
    if s.engine is Engine.HF:
        from memest.estimate import hf_generate

        return hf_generate.largest_tokens(spec, s, device, concurrency, limit)
    ranks = ranks or vllm_ranks(spec, s, device)
    version = s.engine_version or vllm_engine.DEFAULT_VLLM_VERSION
    mnbt = vllm_engine.engine_settings(version, device, max_model_len_of(spec, s), s.max_num_batched_tokens,
                                       s.max_num_seqs).max_num_batched_tokens
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
    maximum concurrency; for hf, the largest batch)."""
    if s.engine is Engine.HF:
        from memest.estimate import hf_generate

        return hf_generate.largest_batch(spec, s, device, max_model_len)
    ranks = ranks or vllm_ranks(spec, s, device)
    version = s.engine_version or vllm_engine.DEFAULT_VLLM_VERSION
    mnbt = vllm_engine.engine_settings(version, device, max_model_len_of(spec, s), s.max_num_batched_tokens,
                                       s.max_num_seqs).max_num_batched_tokens
    r = _engine_blocks(ranks)
    per = r.layout.blocks_per_request(max_model_len, mnbt)
    if not per:  # no KV cache at all (encoder-only models): the scheduler's max_num_seqs is the limit
        return vllm_engine.engine_settings(version, device, max_model_len_of(spec, s), s.max_num_batched_tokens,
                                           s.max_num_seqs).max_num_seqs if r.budget.available > 0 else 0
    return r.num_blocks // per


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
    from memest.errors import InputError
    from memest.fit import verdict

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


# ---- entry point ----


def estimate_serving(spec: ModelSpec, s: ServingConfig, device: Device) -> Estimate:
    """Per-rank serving memory and the engine's KV arithmetic.

    Raises:
        InputError: an ``--engine-version`` the engine does not have.
    """
    if s.engine is Engine.HF:
        from memest.estimate import hf_generate

        return hf_generate.estimate_generate(spec, s, device)
    return _estimate_vllm(spec, s, device)
