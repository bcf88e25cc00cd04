"""Serving memory per rank: weights as stored, KV cache, the forward's activation peak, runtime.

KV cache per token on one rank (bytes), summed over the rank's layers:

- softmax attention: 2 x k_r x d x e (K and V), k_r = k / t, or 1 when t > k (replicated heads);
  sliding-window layers hold at most the window;
- MLA (DeepSeek-V2/V3, vLLM): (kv_lora_rank + qk_rope_head_dim) x e, one latent shared by heads
  and not split by tp;
- mamba: a fixed state per sequence instead (state_elements x e).

e = bytes of the KV-cache dtype. vLLM allocates paged blocks of ``block_size`` tokens; its budget
(vLLM ``gpu_worker.determine_available_memory``) is ``gpu_memory_utilization`` x capacity minus
the weights, the activation peak of a profiling forward of ``max_num_batched_tokens`` tokens and
the non-torch memory; what remains becomes KV blocks.
"""

from __future__ import annotations

import math

from memest.devices import Device
from memest.estimate import runtime
from memest.estimate.dtypes import nbytes
from memest.estimate.sharding import Stage, stage_tensors, stages
from memest.estimate.weights import serving_weight_layout, weight_bytes
from memest.result import Estimate, Kind, RankEstimate, ServingSummary, Term
from memest.spec import LayerSpec, ModelSpec
from memest.workload import Engine, ServingConfig

GiB = 1 << 30

CUDA_GRAPH_BYTES = round(0.91 * GiB)
"""CUDA-graph pool of vLLM 0.19 (51 capture sizes up to 512) for Llama-3.1-8B on one H100
(case vllm019_llama31_8b_tp1: 0.91 GiB actual)."""


def weight_dtype(spec: ModelSpec, s: ServingConfig) -> str:
    """The dtype unquantized weights are served in: ``--dtype``, else the checkpoint's, fp32 as fp16.

    vLLM's ``dtype="auto"`` serves fp32 checkpoints in fp16 and others in their own dtype.
    """
    if s.dtype != "auto":
        return s.dtype
    stored = (spec.torch_dtype or "bfloat16").lower().removeprefix("torch.")
    return "float16" if stored in ("float32", "fp32", "float") else stored


def kv_dtype_bytes(spec: ModelSpec, s: ServingConfig) -> float:
    """Bytes per KV-cache element."""
    return nbytes(weight_dtype(spec, s)) if s.kv_cache_dtype == "auto" else nbytes(s.kv_cache_dtype)


def layer_kv_bytes_per_token(layer: LayerSpec, tp: int, e: float) -> float:
    """KV-cache bytes per token of one layer on one TP rank (0 for state-space layers)."""
    a = layer.attention
    if a.kind == "mla":
        return (a.kv_lora_rank + a.qk_rope_head_dim) * e
    if a.kind != "gqa":
        return 0.0
    k_local = max(1, a.num_kv_heads // tp)
    per = (k_local * a.head_dim + k_local * a.v_head_dim) * e
    if a.cross_attention:
        per *= 2
    return per


def kv_bytes_per_token(spec: ModelSpec, s: ServingConfig, stage: Stage | None = None) -> int:
    """KV-cache bytes one token takes on one rank (full-attention layers; windows ignored)."""
    e = kv_dtype_bytes(spec, s)
    start, stop = (stage.start, stage.stop) if stage else (0, spec.num_layers)
    total = sum(layer_kv_bytes_per_token(layer, s.parallelism.tp, e) * n for layer, n in spec.layer_kinds(start, stop))
    return math.ceil(total)


def _kv_cache_bytes(spec: ModelSpec, s: ServingConfig, stage: Stage, max_len: int, seqs: int) -> int:
    """KV bytes for ``seqs`` sequences of ``max_len`` tokens, windows capped, blocks rounded up."""
    e = kv_dtype_bytes(spec, s)
    block = s.block_size if s.engine is Engine.VLLM else 1
    total = 0.0
    for layer, n in spec.layer_kinds(stage.start, stage.stop):
        window = layer.attention.sliding_window
        tokens = max_len if window is None else min(max_len, window + (s.max_num_batched_tokens or 0))
        tokens = math.ceil(tokens / block) * block
        total += layer_kv_bytes_per_token(layer, s.parallelism.tp, e) * tokens * n
        if layer.attention.kind == "mamba":
            total += layer.attention.state_elements * e * n
    return math.ceil(total * seqs)


def engine_defaults(s: ServingConfig, device: Device) -> ServingConfig:
    """Fill vLLM's defaults: ``max_num_batched_tokens`` 8192 and ``max_num_seqs`` 1024 on devices
    of 70 GiB or more, 2048 / 256 below (vLLM ``EngineArgs`` defaults for ``vllm serve``)."""
    if s.max_num_batched_tokens is not None:
        return s
    big = device.memory_bytes >= 70 * GiB
    return s.replace(max_num_batched_tokens=8192 if big else 2048, max_num_seqs=1024 if big else 256)


def _activation_bytes(spec: ModelSpec, s: ServingConfig, stage: Stage, c: float) -> tuple[int, int]:
    """(activation peak, logits) of one forward of max_num_batched_tokens tokens on one rank."""
    tp = s.parallelism.tp
    tokens = s.max_num_batched_tokens or 8192
    if s.engine is Engine.HF:
        tokens = s.batch_size * (s.max_model_len or spec.max_position_embeddings or 2048)
    layer = spec.reference_layer
    i_local = layer.mlp.intermediate_size / tp
    width = layer.mlp.num_experts_per_tok or 1
    mlp = (3 if layer.mlp.gated else 2) * i_local * width
    act = tokens * (mlp + 3 * spec.hidden_size) * c
    if not stage.last or spec.task not in ("causal_lm", "seq2seq"):
        return math.ceil(act), 0
    seqs = s.max_num_seqs if s.engine is Engine.VLLM else s.batch_size
    logits = seqs * spec.vocab_size * (c + 4 + 4)
    return math.ceil(act), math.ceil(logits)


def estimate_serving(spec: ModelSpec, s: ServingConfig, device: Device) -> Estimate:
    """Per-rank serving memory and the engine's KV budget."""
    s = engine_defaults(s, device)
    par = s.parallelism
    max_len = s.max_model_len or spec.max_position_embeddings or 2048
    dtype = weight_dtype(spec, s)
    c = nbytes(dtype)
    scheme, skip = serving_weight_layout(spec, s.quantization)
    ranks: list[RankEstimate] = []
    summary: ServingSummary | None = None
    for stage in stages(spec.num_layers, par.pp):
        tensors = stage_tensors(spec, stage)
        w = weight_bytes(tensors, par, spec.num_kv_heads, dtype_bytes=c, scheme=scheme, skip=skip)
        kv = _kv_cache_bytes(spec, s, stage, max_len, s.batch_size)
        act, logits = _activation_bytes(spec, s, stage, c)
        context = runtime.cuda_context_bytes(device)
        nccl = runtime.nccl_bytes(par.tp * par.pp)
        terms = [
            Term("weights", Kind.WEIGHTS, w, f"stage parameters / tp at {dtype}" + (f", {scheme.name} linear weights" if scheme else "")),
            Term("kv_cache", Kind.KV_CACHE, kv, f"{s.batch_size} seqs x {max_len} tokens x KV bytes/token"),
            Term("activations", Kind.ACTIVATIONS, act, "forward peak: tokens x (MLP intermediates + 3 h) x c"),
        ]
        if logits:
            terms.append(Term("logits", Kind.LOGITS, logits, "seqs x V x (c + 8) sampler logits"))
        terms.append(Term("workspace.cublas", Kind.WORKSPACE, runtime.cublas_workspace_bytes(device), "cuBLAS workspace"))
        terms.append(Term("runtime.cuda_context", Kind.RUNTIME, context, f"{device.arch} context"))
        if nccl:
            terms.append(Term("runtime.nccl", Kind.RUNTIME, nccl, "NCCL communicators"))
        if s.engine is Engine.VLLM and not s.enforce_eager:
            terms.append(Term("runtime.cuda_graphs", Kind.RUNTIME, CUDA_GRAPH_BYTES, "vLLM CUDA-graph pool"))
        label = "all ranks" if par.pp == 1 else f"pp stage {stage.index}"
        rank = RankEstimate(label, tuple(terms), par.tp)
        ranks.append(rank)
        per_token = kv_bytes_per_token(spec, s, stage)
        budget = math.floor(s.gpu_memory_utilization * device.memory_bytes) - w - act - logits - nccl
        block_bytes = per_token * s.block_size
        blocks = max(0, budget // block_bytes) if block_bytes else 0
        tokens = blocks * s.block_size
        stage_summary = ServingSummary(
            kv_cache_bytes_per_token=per_token,
            max_model_len=max_len,
            kv_cache_tokens=tokens,
            kv_cache_blocks=blocks,
            max_concurrency=tokens / max_len if max_len else 0.0,
            kv_budget_bytes=max(0, budget),
        )
        if summary is None or stage_summary.kv_cache_tokens < summary.kv_cache_tokens:
            summary = stage_summary
    assumptions = [
        f"weights served in {dtype}" + (f" with {scheme.name} linear weights" if scheme else ""),
        f"KV cache in {s.kv_cache_dtype if s.kv_cache_dtype != 'auto' else dtype}",
        f"engine {s.engine.value}: max_num_batched_tokens {s.max_num_batched_tokens}, max_num_seqs {s.max_num_seqs}",
    ]
    return Estimate(ranks=tuple(ranks), assumptions=tuple(assumptions), serving=summary)
