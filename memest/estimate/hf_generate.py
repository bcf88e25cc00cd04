"""transformers ``generate`` on one device: the peak allocated bytes of a prefill + decode loop.

Symbols: b batch, p prompt tokens, n new tokens, h hidden_size, a heads, i intermediate_size,
V vocab_size, c bytes per activation element. The peak is the larger of two moments:

- **end of prefill**: weights + the cache of b x p tokens + the larger of the largest layer's
  transients at b x p tokens and the logits;
- **last decode step**: weights + the cache of b x (p + n - 1) tokens (the last generated token is
  never fed back) + the copy ``torch.cat`` makes of one layer's cache while it grows
  (``DynamicCache`` / the legacy tuple cache: old and new tensors of one layer are alive together).

Transients of one layer at T = b x p tokens (modules of transformers ``modeling_llama.py``,
``modeling_gpt_bigcode.py``, no grad): the MLP's intermediates (gated: gate, up, activation and
product, 4 i; plain: fc output and activation, 2 i) or attention's Q, K, V and output, plus two
h-sized tensors (residual and normed input); eager attention (transformers 4.34's default) also
holds the fp32 scores and their cast, b x a x p^2 x (4 + c).

Logits: transformers 5 computes them for the last prompt position only (``logits_to_keep=1``) and
``generate`` copies them to fp32 (b x V x (c + 4)); 4.34 computes every prompt position
(b x p x V x c) and Llama-family models upcast them all to fp32 (``logits = logits.float()``).
transformers 4.34's GPT-BigCode registers a ``max_positions x max_positions`` boolean causal-mask
buffer (``GPTBigCodeModel.__init__``), which later versions dropped.

bitsandbytes 4-bit linears dequantize their weight for inputs of more than one token
(``bnb.matmul_4bit`` -> ``MatMul4Bit``: ``dequantize_4bit(...)`` in the stored dtype, then
``.to(compute_dtype)``): the largest linear's copy at both dtypes is alive during prefill; LLM.int8
converts each weight to its tiled layout on the first forward (``F.transform``), one layer's copy
at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memest.devices import Device
from memest.estimate import runtime
from memest.estimate.dtypes import nbytes
from memest.estimate.kv_cache import bytes_per_token, contiguous_cache_bytes, kv_layers
from memest.estimate.serving import compute_bytes, kv_dtype_bytes, max_model_len_of, weight_dtype
from memest.estimate.sharding import stage_tensors, stages
from memest.estimate.weights import QuantScheme, checkpoint_scale, serving_weight_layout, weight_bytes, _skipped
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
        prefill: True when the peak is at the end of prefill.
    """

    weights: int
    buffers: int
    kv_cache: int
    activations: int
    logits: int
    dequant: int
    workspace: int
    prefill: bool

    @property
    def total(self) -> int:
        """Peak allocated."""
        return self.weights + self.buffers + self.kv_cache + self.activations + self.logits + self.dequant + self.workspace


def _layer_transient_per_token(spec: ModelSpec, c: float) -> float:
    worst = 0.0
    h = spec.hidden_size
    for layer, _ in spec.layer_kinds():
        a, mlp = layer.attention, layer.mlp
        width = (4 if mlp.gated else 2) * mlp.intermediate_size * max(1, mlp.num_experts_per_tok)
        attn = (a.num_heads * a.head_dim + 2 * a.num_kv_heads * a.head_dim + a.num_heads * a.v_head_dim)
        worst = max(worst, (max(width, attn) + 2 * h) * c)
    return worst


def _eager_scores(spec: ModelSpec, b: int, p: int, c: float) -> float:
    a = spec.reference_layer.attention
    window = min(p, a.sliding_window or p)
    return b * a.num_heads * p * window * (4 + c)


def _dequant_bytes(spec: ModelSpec, scheme: QuantScheme | None, skip: tuple[str, ...], stored: float, p: int,
                   b: int) -> int:
    if scheme is None or scheme.name not in ("nf4", "fp4", "int8") or b * p <= 1:
        return 0
    largest = max((t.numel for t, _ in spec.tensors() if t.is_linear_weight and not _skipped(t, skip)), default=0)
    if scheme.name == "int8":
        return largest  # one weight in the tiled int8 layout while the row-major copy is alive
    compute = nbytes(scheme.compute_dtype) if scheme.compute_dtype else stored
    return math.ceil(largest * (stored + (compute if compute != stored else 0)))


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
    scheme, skip = serving_weight_layout(spec, s.quantization)
    stage = stages(spec.num_layers, 1)[0]
    w = weight_bytes(stage_tensors(spec, stage), s.parallelism, spec.num_kv_heads, dtype_bytes=c, scheme=scheme, skip=skip)
    if s.checkpoint_params:
        w = math.ceil(w * checkpoint_scale(spec, s.checkpoint_params, c, scheme, skip))
    buffers = 0
    if version == "4.34" and spec.model_type == "gpt_bigcode":
        buffers = (spec.max_position_embeddings or 0) ** 2
    layers = kv_layers(spec.layer_kinds(), 1, kv_dtype_bytes(spec, s))
    p = lens.prompt
    T = b * p
    act = _layer_transient_per_token(spec, c) * T
    if version == "4.34":
        act += _eager_scores(spec, b, p, c)
        upcast = 4 if spec.model_type in UPCAST_LOGITS_434 else 0
        logits = T * spec.vocab_size * (c + upcast) + T * spec.hidden_size * c
    else:
        logits = b * spec.vocab_size * (c + 4) + T * spec.hidden_size * c
    kv_prefill = contiguous_cache_bytes(layers, b, p)
    prefill_peak = kv_prefill + max(act, logits)
    kv_end = contiguous_cache_bytes(layers, b, lens.cached)
    per_layer_growth = max((kv.bytes_per_token * b * lens.cached for kv, _ in layers), default=0)
    decode_peak = kv_end + per_layer_growth
    dequant = _dequant_bytes(spec, scheme, skip, c, p, b)
    workspace = runtime.cublas_workspace_bytes(device)
    if prefill_peak >= decode_peak:
        return GeneratePeak(w, buffers, kv_prefill, math.ceil(act) if act >= logits else 0,
                            math.ceil(logits) if logits > act else 0, dequant, workspace, True)
    return GeneratePeak(w, buffers, kv_end, per_layer_growth, 0, dequant, workspace, False)


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
    moment = "end of prefill" if peak.prefill else "last decode step"
    terms = [Term("weights", Kind.WEIGHTS, peak.weights,
                  f"parameters at {weight_dtype(spec, s)}" + (f", {scheme.name} linear weights" if scheme else ""))]
    if peak.buffers:
        terms.append(Term("weights.buffers", Kind.WEIGHTS, peak.buffers, "GPT-BigCode causal-mask buffer (transformers 4.34)"))
    cached = lens.prompt if peak.prefill else lens.cached
    terms.append(Term("kv_cache", Kind.KV_CACHE, peak.kv_cache, f"{s.batch_size} seqs x {cached} tokens ({moment})"))
    if peak.activations:
        what = "largest layer's transients at b x p" if peak.prefill else "torch.cat copy of one layer's cache"
        terms.append(Term("activations", Kind.ACTIVATIONS, peak.activations, what))
    if peak.logits:
        what = "all prompt positions" if version == "4.34" else "last prompt position, fp32 copy"
        terms.append(Term("logits", Kind.LOGITS, peak.logits, f"prefill logits: {what}"))
    if peak.dequant:
        terms.append(Term("workspace.dequant", Kind.WORKSPACE, peak.dequant, "bitsandbytes dequantized weight copy"))
    terms.append(Term("workspace.cublas", Kind.WORKSPACE, peak.workspace, "cuBLAS workspace"))
    terms.append(Term("runtime.cuda_context", Kind.RUNTIME, runtime.cuda_context_bytes(device), f"{device.arch} context"))
    layers = kv_layers(spec.layer_kinds(), 1, kv_dtype_bytes(spec, s))
    total_len = lens.prompt + lens.new
    per_token = bytes_per_token(layers)
    usable = usable_bytes(device)
    summary = ServingSummary(
        kv_cache_bytes_per_token=per_token,
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
    )
    assumptions = (
        f"transformers {version} generate, b={s.batch_size}, prompt {lens.prompt} + {lens.new} new tokens",
        f"weights in {weight_dtype(spec, s)}" + (f", quantization {s.quantization}" if s.quantization != "none" else ""),
        f"peak at the {moment}",
    )
    return Estimate(ranks=(RankEstimate("all ranks", tuple(terms), 1),), assumptions=assumptions, serving=summary)
