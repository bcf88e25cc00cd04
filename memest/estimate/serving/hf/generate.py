"""transformers ``generate`` on one device: the peak allocated bytes of a prefill + decode loop.

:func:`generate_peak` takes the larger of the prefill (transformers 5:
:mod:`memest.estimate.serving.hf.prefill`; 4.34: the largest layer's transients and the logits)
and the last decode step (weights + the cache + one layer's growing copy);
:func:`estimate_generate` makes the estimate, :func:`largest_batch` / :func:`largest_tokens` the
max queries. The moments and their sources: DESIGN.md, "transformers generate".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memest.devices import Device
from memest.dtypes import nbytes
from memest.estimate import runtime
from memest.estimate.serving.common import (
    Allocation,
    compute_bytes,
    loaded_weight_bytes,
    max_model_len_of,
    quantization_note,
    weight_dtype,
)
from memest.estimate.serving.hf import prefill as hf_prefill
from memest.estimate.serving.kv import (
    KVLayer,
    bytes_per_token,
    contiguous_cache_bytes,
    kv_dtype_bytes,
    kv_layers,
    state_bytes_per_sequence,
)
from memest.estimate.sharding import stage_tensors, stages
from memest.estimate.weights import QuantScheme, is_quantized, serving_weight_layout, tensor_bytes
from memest.result import Estimate, Kind, RankEstimate, ServingSummary, Term
from memest.spec import ModelSpec
from memest.workload import ServingConfig

DEFAULT_HF_VERSION = "5"
UPCAST_LOGITS_434 = ("llama", "mistral", "mixtral", "qwen2", "gemma", "persimmon", "fuyu")
"""Model types whose transformers 4.34 CausalLM head upcasts all logits to fp32."""


@dataclass(frozen=True, slots=True)
class Lengths:
    """Prompt and generated tokens per sequence.

    Attributes:
        prompt: p.
        new: n.
    """

    prompt: int
    new: int

    @property
    def cached(self) -> int:
        """Positions cached at the last decode step: p + n - 1 (p when nothing is generated)."""
        return self.prompt + max(self.new - 1, 0)


def lengths(spec: ModelSpec, s: ServingConfig) -> Lengths:
    """p and n from ``--prompt-len``, ``--max-new-tokens`` and ``--max-model-len`` (one of them may
    be implied by the others; with neither, the whole max_model_len is prefilled)."""
    total = max_model_len_of(spec, s)
    if s.prompt_len is not None and s.max_new_tokens is not None:
        return Lengths(s.prompt_len, s.max_new_tokens)
    if s.prompt_len is not None:
        return Lengths(s.prompt_len, max(total - s.prompt_len, 0))
    if s.max_new_tokens is not None:
        return Lengths(max(total - s.max_new_tokens, 1), s.max_new_tokens)
    return Lengths(total, 0)


@dataclass(frozen=True, slots=True)
class GeneratePeak:
    """The parts of the generate peak on one device (bytes).

    Attributes:
        weights: Parameters as loaded.
        buffers: Registered buffers counted with the model (GPT-BigCode's mask in 4.34).
        kv_cache: The cache at the peak moment.
        activations: Layer transients at the peak moment (0 when logits set it).
        logits: Logits at the peak moment (0 when a layer sets it).
        dequant: bitsandbytes' dequantized weight copy.
        workspace: cuBLAS workspace.
        prefill: True when the peak is in the prefill.
        where: The moment of the peak in words.
    """

    weights: int
    buffers: int
    kv_cache: int
    activations: int
    logits: int
    dequant: int
    workspace: int
    prefill: bool
    where: str = ""

    @property
    def total(self) -> int:
        """Peak allocated."""
        return self.weights + self.buffers + self.kv_cache + self.activations + self.logits + self.dequant + self.workspace


def _layer_transient_per_token(spec: ModelSpec, c: float) -> float:
    """transformers 4.34: the largest layer's transients per token (bytes; module docstring)."""
    worst = 0.0
    h = spec.hidden_size
    for layer, _ in spec.layer_kinds():
        a, mlp = layer.attention, layer.mlp
        width = (4 if mlp.gated else 2) * mlp.intermediate_size * max(1, mlp.num_experts_per_tok)
        attn = (a.num_heads * a.head_dim + 2 * a.num_kv_heads * a.head_dim + a.num_heads * a.v_head_dim)
        worst = max(worst, (max(width, attn) + 2 * h) * c)
    return worst


def _legacy_eager_scores(spec: ModelSpec, b: int, p: int, c: float) -> float:
    """transformers 4.34: eager attention's fp32 scores and their cast, alive in the forward (bytes;
    not the scores training saves for backward, :func:`memest.estimate.activations._eager_scores`)."""
    a = spec.reference_layer.attention
    window = min(p, a.sliding_window or p)
    return b * a.num_heads * p * window * (4 + c)


def _dequant_bytes(spec: ModelSpec, scheme: QuantScheme | None, skip: tuple[str, ...], stored: float, p: int,
                   b: int) -> int:
    if scheme is None or scheme.name not in ("nf4", "fp4", "int8") or b * p <= 1:
        return 0
    largest = max((t.numel for t, _ in spec.tensors() if is_quantized(t, scheme, skip)), default=0)
    if scheme.name == "int8":
        return largest  # one weight in the tiled int8 layout while the row-major copy is alive
    compute = nbytes(scheme.compute_dtype) if scheme.compute_dtype else stored
    return math.ceil(largest * (stored + (compute if compute != stored else 0)))


def _legacy_prefill(spec: ModelSpec, b: int, p: int, c: float, kv_prefill: int) -> hf_prefill.PrefillMoment:
    """transformers 4.34's prefill: the largest layer's transients at b x p tokens with eager scores,
    or every prompt position's logits (see the module docstring)."""
    T = b * p
    act = _layer_transient_per_token(spec, c) * T + _legacy_eager_scores(spec, b, p, c)
    upcast = 4 if spec.model_type in UPCAST_LOGITS_434 else 0
    logits = T * spec.vocab_size * (c + upcast) + T * spec.hidden_size * c
    if act >= logits:
        return hf_prefill.PrefillMoment("largest layer's transients at b x p", math.ceil(act), 0, kv_prefill)
    return hf_prefill.PrefillMoment("logits of every prompt position", 0, math.ceil(logits), kv_prefill)


def generate_peak(spec: ModelSpec, s: ServingConfig, device: Device, batch: int | None = None,
                  lens: Lengths | None = None) -> GeneratePeak:
    """The peak allocated bytes of ``generate`` (see the module docstring).

    Args:
        spec: The model.
        s: The serving workload (engine hf).
        device: For the cuBLAS workspace.
        batch: b (default: ``s.batch_size``).
        lens: p and n (default: from ``s``).
    """
    b = batch if batch is not None else s.batch_size
    lens = lens or lengths(spec, s)
    version = s.engine_version or DEFAULT_HF_VERSION
    c = compute_bytes(spec, s)
    e = kv_dtype_bytes(spec, s)
    scheme, skip = serving_weight_layout(spec, s.quantization)
    w = loaded_weight_bytes(spec, s, allocations(spec, s, caching_allocator=device.vendor in ("nvidia", "amd")))
    buffers = causal_mask_buffer_bytes(spec)
    layers = cache_layers(spec, e)
    p = lens.prompt
    kv_prefill = sum(hf_prefill.layer_cache_bytes(layer, b, p, e) for layer in spec.layers)
    if version == "4.34":
        prefill = _legacy_prefill(spec, b, p, c, contiguous_cache_bytes(layers, b, p))
    else:
        end = hf_prefill.end_of_prefill(spec, b, p, c)
        end = hf_prefill.PrefillMoment(end.where, end.activations, end.logits, kv_prefill)
        cuda = device.vendor in ("nvidia", "amd")  # CPU SDPA has an fp32 grouped-query flash kernel
        prefill = max(hf_prefill.prefill_peak(spec, b, p, c, e, cuda=cuda), end, key=lambda m: m.total)
    kv_end = contiguous_cache_bytes(layers, b, lens.cached)
    per_layer_growth = max((kv.sequence_bytes(lens.cached) * b if kv.kind == "compressed"  # torch.cat of the entries
                            else kv.bytes_per_token * b * (lens.cached if kv.window is None
                                                           else min(lens.cached, kv.window))
                            for kv, _ in layers), default=0)
    decode_peak = kv_end + per_layer_growth
    dequant = _dequant_bytes(spec, scheme, skip, c, p, b)
    workspace = runtime.cublas_workspace_bytes(device)
    if prefill.total >= decode_peak:
        return GeneratePeak(w, buffers, prefill.kv_cache, prefill.activations, prefill.logits, dequant, workspace, True,
                            prefill.where)
    return GeneratePeak(w, buffers, kv_end, per_layer_growth, 0, dequant, workspace, False,
                        "torch.cat copy of one layer's cache")


def allocations(spec: ModelSpec, s: ServingConfig, *, caching_allocator: bool = True) -> list[Allocation]:
    """The weight allocations transformers makes once it has loaded a checkpoint: every parameter is
    its own allocation (``from_pretrained`` materialises one tensor per checkpoint key), rounded by
    :func:`memest.estimate.runtime.cuda_block_bytes` (512 B; a tensor of 10 MiB or more gets a
    segment rounded to 2 MiB and keeps a remainder of up to 1 MiB). bitsandbytes makes its linears
    by quantizing a 16-bit copy on the device (``Int8Params.cuda`` / ``Params4bit.cuda``: packed
    weight and scales are new allocations while that copy is alive), so where their blocks fall is
    not modelled: quantized linears count their stored bytes. Without PyTorch's CUDA caching
    allocator (``caching_allocator=False``: CPU, TPU, Gaudi) the tensors' own bytes."""
    c = compute_bytes(spec, s)
    scheme, skip = serving_weight_layout(spec, s.quantization)
    stage = stages(spec.num_layers, 1)[0]
    return [Allocation(tensor_bytes(t, s.parallelism, spec.num_kv_heads, dtype_bytes=c, scheme=scheme, skip=skip),
                       count, rounded=caching_allocator and not is_quantized(t, scheme, skip))
            for t, count in stage_tensors(spec, stage)]


def causal_mask_buffer_bytes(spec: ModelSpec) -> int:
    """GPT-BigCode's ``max_positions x max_positions`` bool causal-mask buffer
    (``GPTBigCodeModel.__init__``: ``self.bias = nn.Buffer(torch.tril(...))``, non-persistent), built
    with the model in transformers 4.34 and 5.24 alike (findings §7); 0 for other families."""
    if spec.model_type != "gpt_bigcode":
        return 0
    return (spec.max_position_embeddings or 0) ** 2


def cache_layers(spec: ModelSpec, e: float) -> list[tuple[KVLayer, int]]:
    """The model's layers as transformers caches them (one rank; Falcon's broadcast heads)."""
    return kv_layers(spec.layer_kinds(), 1, e, transformers=True)


def usable_bytes(device: Device) -> int:
    """What one process may allocate on the device: capacity less the CUDA context."""
    return device.memory_bytes - runtime.cuda_context_bytes(device)


def fits(spec: ModelSpec, s: ServingConfig, device: Device) -> bool:
    """True when the generate peak fits the device (no headroom)."""
    return generate_peak(spec, s, device).total <= usable_bytes(device)


def largest_batch(spec: ModelSpec, s: ServingConfig, device: Device, max_model_len: int) -> int:
    """The largest batch whose generate peak fits the device at ``max_model_len`` tokens (the peak
    grows linearly in b, so this is closed-form: the fixed part and the per-sequence slope)."""
    base = lengths(spec, s)
    lens = base if max_model_len == max_model_len_of(spec, s) else Lengths(max(max_model_len - base.new, 1), base.new)
    usable = usable_bytes(device)
    first = generate_peak(spec, s, device, batch=1, lens=lens).total
    if first > usable:
        return 0
    one = generate_peak(spec, s, device, batch=2, lens=lens).total - first  # slope per sequence
    if one <= 0:
        return 1
    b = 1 + (usable - first) // one
    while b > 1 and generate_peak(spec, s, device, batch=b, lens=lens).total > usable:
        b -= 1  # the peak can switch moments (prefill / decode) as b grows: step back to a fit
    return b


def largest_tokens(spec: ModelSpec, s: ServingConfig, device: Device, batch: int, limit: int) -> int:
    """The longest sequence (prompt + new tokens, the new-token count kept) at which ``batch``
    sequences fit; 0 when none. The peak is monotone in length: bisection over the formula."""
    new = lengths(spec, s).new

    def ok(total: int) -> bool:
        lens = Lengths(max(total - new, 1), new)
        return generate_peak(spec, s, device, batch=batch, lens=lens).total <= usable_bytes(device)

    if not ok(new + 1):
        return 0
    lo, hi = new + 1, max(limit, new + 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def estimate_generate(spec: ModelSpec, s: ServingConfig, device: Device) -> Estimate:
    """Peak memory of ``generate`` for ``s.batch_size`` sequences on one device."""
    version = s.engine_version or DEFAULT_HF_VERSION
    lens = lengths(spec, s)
    peak = generate_peak(spec, s, device)
    scheme, _ = serving_weight_layout(spec, s.quantization)
    moment = f"prefill ({peak.where})" if peak.prefill else "last decode step"
    terms = [Term("weights", Kind.WEIGHTS, peak.weights,
                  f"parameters at {weight_dtype(spec, s)}" + (f", {scheme.name} linear weights" if scheme else ""))]
    if peak.buffers:
        terms.append(Term("weights.buffers", Kind.WEIGHTS, peak.buffers,
                          "GPT-BigCode causal-mask buffer: max_position_embeddings^2 bool"))
    cached = lens.prompt if peak.prefill else lens.cached
    terms.append(Term("kv_cache", Kind.KV_CACHE, peak.kv_cache, f"{s.batch_size} seqs x {cached} tokens ({moment})"))
    if peak.activations:
        terms.append(Term("activations", Kind.ACTIVATIONS, peak.activations, peak.where))
    if peak.logits:
        what = "all prompt positions" if version == "4.34" else "last prompt position, fp32 copy"
        terms.append(Term("logits", Kind.LOGITS, peak.logits, f"prefill logits: {what}"))
    if peak.dequant:
        terms.append(Term("workspace.dequant", Kind.WORKSPACE, peak.dequant, "bitsandbytes dequantized weight copy"))
    terms.append(Term("workspace.cublas", Kind.WORKSPACE, peak.workspace, "cuBLAS workspace"))
    terms.append(Term("runtime.cuda_context", Kind.RUNTIME, runtime.cuda_context_bytes(device), f"{device.arch} context"))
    layers = cache_layers(spec, kv_dtype_bytes(spec, s))
    total_len = lens.prompt + lens.new
    per_token = bytes_per_token(layers)
    usable = usable_bytes(device)
    summary = ServingSummary(
        kv_cache_bytes_per_token=per_token,
        state_bytes_per_sequence=state_bytes_per_sequence(layers),
        max_model_len=total_len,
        kv_cache_tokens=s.batch_size * total_len,
        kv_cache_blocks=0,
        max_concurrency=float(largest_batch(spec, s, device, total_len)),
        kv_budget_bytes=max(0, usable - (peak.total - peak.kv_cache)),
        engine="hf",
        engine_version=version,
        requested_bytes=usable,
        non_kv_bytes=peak.total - peak.kv_cache,
        activation_peak_bytes=peak.activations + peak.logits,
        request_kv_bytes=contiguous_cache_bytes(layers, 1, lens.cached),
        engine_error=None if peak.total <= usable else "no_memory",
        largest_max_model_len=largest_tokens(spec, s, device, s.batch_size, spec.max_position_embeddings or total_len),
        largest_max_model_len_one_request=largest_tokens(spec, s, device, 1, spec.max_position_embeddings or total_len),
        largest_concurrency=largest_batch(spec, s, device, total_len),
        batch_size=s.batch_size,
    )
    assumptions = (
        f"transformers {version} generate, b={s.batch_size}, prompt {lens.prompt} + {lens.new} new tokens",
        f"weights in {weight_dtype(spec, s)}" + quantization_note(spec, s),
        f"peak at the {moment}",
    )
    rank = RankEstimate("all ranks", tuple(terms), s.parallelism.world_size)
    return Estimate(ranks=(rank,), assumptions=assumptions, serving=summary)
