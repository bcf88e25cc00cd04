"""The prefill of transformers 5 ``generate``, moment by moment: what a no-grad forward keeps alive.

Without autograd a tensor lives while a Python name refers to it, so the prefill peak is the
largest of a few moments of one decoder layer (:func:`prefill_peak`), with the KV cache of the
layers run so far, or the end of the prefill (:func:`end_of_prefill`); :class:`ForwardCode` holds
what differs between families' forward code. The moments, their tensors and the limitations:
DESIGN.md, "transformers prefill, moment by moment".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memest.estimate.serving.kv import kv_caches
from memest.spec import AttentionSpec, LayerSpec, ModelSpec

FP32 = 4
INT64 = 8
RMS_NORM_BYTES_PER_H = 8
"""RMSNorm's fp32 temporaries per hidden element (the upcast and ``pow`` or ``* rsqrt``; or the
fp32 product and its cast back)."""
RMS_NORM_STAT_BYTES = 4
"""RMSNorm's fp32 variance, per token."""
GENERATE_INT64_INPUTS = 4
"""(b, p) int64 tensors ``generate`` keeps through the prefill (``generation/utils.py``): the
attention mask (``torch.ones`` when none is given), the position ids made from it
(``_prepare_position_ids_for_generation``: ``cumsum - 1``, then ``masked_fill``), and the sliced and
cloned input ids its loop feeds the model."""
ROTARY_TEMPS = 3
"""a·d-sized temporaries of ``apply_rotary_pos_emb`` alive at once on q: ``q * cos``,
``rotate_half(q)`` (its ``torch.cat``) and ``rotate_half(q) * sin``."""

ACTIVATION_LIVE: dict[str, int] = {
    "gelu_new": 4,
    "gelu_python_tanh": 4,
    "gelu_accurate": 4,
    "gelu_python": 4,
    "gelu_fast": 5,
    "quick_gelu": 3,
    "mish": 3,
    "relu2": 3,
}
"""i-sized tensors alive at once while a plain MLP's activation runs, its input included
(transformers ``activations.py``). Activations not listed are one fused op: input and output, 2."""
FUSED_ACTIVATION_LIVE = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardCode:
    """What a family's transformers 5.24 decoder code keeps alive, where it differs between families.

    Attributes:
        held_at_attention: h-sized tensors of the layer alive while attention runs (its input and
            the norm output).
        held_at_norm: h-sized tensors of the layer alive while its largest RMSNorm runs.
        held_at_mlp: h-sized tensors of the layer alive while the MLP runs.
        position_table: Learned position embeddings, looked up at ``generate``'s (b, p) position
            ids, kept by the model's forward.
        rotary_bytes: Bytes per element of the rotary cos/sin (None: c; 0: no rotary).
        activation_live: i-sized tensors of the MLP's activation (overrides the config's name).
        routing_fp32: The router returns fp32 weights, so the weighted expert outputs are fp32.
        expert_gate_live: i-sized tensors the experts' gating adds to the gate_up output.
        softmax_scores: Eager attention: score-sized tensors alive at the softmax, as (in c,
            in fp32).
        held_scores: Eager attention: score-sized tensors in c alive after the attention returns
            (its probabilities, and for BLOOM the previous layer's too).
        fused_qkv_held: Eager BLOOM: the fused QKV output ((a + 2k)·d) and a contiguous copy of
            the queries stay alive through the attention.
        bool_mask: A (1, 1, p, p) bool causal mask is built for every forward.
    """

    held_at_attention: int = 2
    held_at_norm: int = 2
    held_at_mlp: int = 3
    position_table: bool = False
    rotary_bytes: float | None = None
    activation_live: int | None = None
    routing_fp32: bool = False
    expert_gate_live: int = 2
    softmax_scores: tuple[int, int] = (1, 2)
    held_scores: int = 1
    fused_qkv_held: bool = False
    bool_mask: bool = False


DEFAULT_CODE = ForwardCode()
"""The Llama pattern (``LlamaDecoderLayer``): input, post-attention residual and norm output at
the MLP; also Mistral, Qwen2/3, Gemma, Phi, Phi-3, GPT-NeoX (the MLP reads the second norm's
output beside the input and the attention output) and the MoE families."""

FORWARD_CODE: dict[str, ForwardCode] = {
    # Olmo2DecoderLayer is post-norm: the MLP reads the residual itself; the rotary cos/sin stay fp32
    "olmo2": ForwardCode(held_at_attention=1, held_at_norm=3, held_at_mlp=2, rotary_bytes=FP32),
    # OPTDecoderLayer: fc1/activation inline, so the final_layer_norm output is dropped
    "opt": ForwardCode(held_at_mlp=2, position_table=True, rotary_bytes=0),
    # GPT2Block keeps ``attn_output`` beside the residual and ln_2's output
    "gpt2": ForwardCode(held_at_mlp=4, position_table=True, rotary_bytes=0),
    "gpt_bigcode": ForwardCode(held_at_mlp=4, position_table=True, rotary_bytes=0),
    # FalconModel materialises a bool mask for every forward; two parallel norms: see forward_code
    "falcon": ForwardCode(bool_mask=True),
    # BloomBlock returns its attention probabilities, which BloomModel's ``outputs`` keeps through the
    # next layer; bloom_gelu_forward is Python; ALiBi, no rotary
    "bloom": ForwardCode(activation_live=5, softmax_scores=(3, 2), held_scores=2, fused_qkv_held=True,
                         rotary_bytes=0),
    # gpt-oss: sinks softmax in the compute dtype (scores + mask, their concatenation less the max, the
    # probabilities); GptOssExperts._apply_gate: two clamps, the GLU, up + 1 and the product
    "gpt_oss": ForwardCode(softmax_scores=(3, 0), expert_gate_live=5),
    "mixtral": ForwardCode(routing_fp32=True),
    "deepseek_v2": ForwardCode(routing_fp32=True),
    "deepseek_v3": ForwardCode(routing_fp32=True),
}
"""Families whose decoder code differs from :data:`DEFAULT_CODE` (by ``model_type``)."""

FALCON_PARALLEL_NORMS = ForwardCode(held_at_attention=3, held_at_mlp=4, bool_mask=True)
"""Falcon's ``new_decoder_architecture`` with ``ln_attn`` and ``ln_mlp``: both norm outputs exist
before attention runs (``FalconDecoderLayer.forward``)."""


def forward_code(spec: ModelSpec) -> ForwardCode:
    """The :class:`ForwardCode` of a model's family."""
    if spec.model_type == "falcon" and any(t.name.startswith("ln_mlp.") for t in spec.reference_layer.tensors):
        return FALCON_PARALLEL_NORMS
    return FORWARD_CODE.get(spec.model_type, DEFAULT_CODE)


@dataclass(frozen=True, slots=True)
class PrefillMoment:
    """The largest moment of a prefill (bytes for the whole batch).

    Attributes:
        where: The moment in words (``MLP of layer 32``).
        activations: Everything alive but the weights, the logits and the KV cache.
        logits: The logits alive at that moment.
        kv_cache: The KV cache alive at that moment.
    """

    where: str
    activations: int
    logits: int
    kv_cache: int = 0

    @property
    def total(self) -> int:
        """activations + logits + kv_cache."""
        return self.activations + self.logits + self.kv_cache


def uses_sdpa(spec: ModelSpec) -> bool:
    """False for families transformers runs with eager attention only (:attr:`ModelSpec.sdpa_supported`)."""
    return spec.sdpa_supported


def layer_cache_bytes(layer: LayerSpec, b: int, p: int, e: float) -> int:
    """Bytes of one layer's transformers cache after the prefill of b prompts of p tokens (0 for
    layers without a cache). Sliding-window layers count every token: the cache keeps a view of the
    prefill's full K/V (``DynamicSlidingWindowLayer.update``); a state layer its state, a
    cross-attention layer its encoder tokens, a compressed cache (DeepSeek-V4) its entries and its
    buffer's view of the prompt (:meth:`KVLayer.prefill_bytes`)."""
    return sum(kv.prefill_bytes(p) * b if kv.kind in ("state", "cross", "compressed") else kv.bytes_per_token * b * p
               for kv in kv_caches(layer, 1, e, transformers=True))


def _model_held(spec: ModelSpec, code: ForwardCode, b: int, p: int, c: float) -> float:
    """Bytes the model's forward holds through all layers."""
    T, h = b * p, spec.hidden_size
    held = T * h * c + GENERATE_INT64_INPUTS * INT64 * T  # inputs_embeds; generate's int64 (b, p) inputs
    if code.position_table:
        held += T * h * c
    rotary = c if code.rotary_bytes is None else code.rotary_bytes
    held += 2 * T * spec.head_dim * rotary  # cos and sin at generate's (b, p) position ids
    windows = {layer.attention.sliding_window for layer, _ in spec.layer_kinds() if layer.attention.kind == "gqa"}
    if not uses_sdpa(spec):
        held += len(windows) * b * p * p * c  # eager_mask: torch.where over the expanded bool mask
    elif code.bool_mask or any(w is not None and p >= w for w in windows):
        held += p * p  # one (1, 1, p, p) bool mask, expanded over the batch as a view
    return held


def _mlp_bytes(layer: LayerSpec, code: ForwardCode, h: int, T: int, c: float) -> tuple[float, str]:
    """The MLP's own tensors at its largest moment (bytes), and what it is."""
    mlp = layer.mlp
    i = mlp.intermediate_size
    act = code.activation_live or ACTIVATION_LIVE.get(mlp.activation, FUSED_ACTIVATION_LIVE)
    if not mlp.is_moe:
        if not mlp.gated:
            return act * i * T * c, "MLP"
        fused = any(t.name.endswith("gate_up_proj.weight") for t in layer.tensors)
        units = 2 + max(2, act - 1) if fused else max(3, act)
        return units * i * T * c, "MLP"
    S = T * mlp.num_experts_per_tok
    w = FP32 if code.routing_fp32 else c
    bias = any(t.name.endswith("gate_up_proj_bias") for t in layer.tensors)
    gate_units = 2 + (code.expert_gate_live if mlp.gated else act - 1) + (2 if bias else 0)
    # router logits; top-k ids and weights; the sort's expert ids and permutation, histc's int32 input,
    # the sorted weights
    rows = T * mlp.num_experts * c + T * mlp.num_experts_per_tok * (INT64 + w) + S * (2 * INT64 + 4 + w)
    gated = S * (h + gate_units * i) * c
    end = S * h * (2 * c + 2 * w) + S * INT64  # + the inverse permutation
    shared = 0.0
    if mlp.num_shared_experts:
        shared = T * (h + 3 * mlp.shared_intermediate_size) * c  # routed output beside the shared MLP
    return max(gated, end, shared) + rows, "experts"


def _attention_bytes(spec: ModelSpec, layer: LayerSpec, code: ForwardCode, b: int, p: int, c: float,
                     cuda: bool = True) -> float:
    """Attention's own tensors at its largest moment (bytes; the cache excluded)."""
    a = layer.attention
    T = b * p
    q = a.num_heads * a.head_dim
    kv_proj = a.num_kv_heads * (a.head_dim + a.v_head_dim)
    sdpa = uses_sdpa(spec)
    if not sdpa:
        extra = q  # the queries after rotary
        if a.num_kv_heads < a.num_heads:
            extra += a.num_heads * (a.head_dim + a.v_head_dim)  # repeat_kv's expanded K and V
        if code.fused_qkv_held:
            extra += q + kv_proj  # the fused QKV output (the queries above are its contiguous copy)
        n_c, n_fp32 = code.softmax_scores
        scores = b * a.num_heads * p * p * (n_c * c + n_fp32 * FP32)
        return extra * T * c + scores
    rotary = code.rotary_bytes != 0
    core = q + kv_proj + (ROTARY_TEMPS * q if rotary else a.num_heads * a.v_head_dim)
    if cuda and _math_sdpa(a, code, p, c):
        # the math fallback (aten attention.cpp _scaled_dot_product_attention_math): K and V repeated to
        # a heads (enable_gqa), the scaled q, the (b, a, p, p) scores and their masked copy, and the
        # causal mask as a (p, p) float bias
        held = q + kv_proj + a.num_heads * (a.head_dim + a.v_head_dim) + q
        return max(core * T * c, held * T * c + b * a.num_heads * p * p * 2 * c + p * p * c)
    return core * T * c


def _math_sdpa(a: AttentionSpec, code: ForwardCode, p: int, c: float) -> bool:
    """True when SDPA on a CUDA device falls back to the math kernel
    (``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``): FlashAttention needs fp16/bf16 and
    the memory-efficient kernel has no grouped-query support, which transformers asks for
    (``enable_gqa``, no ``repeat_kv``) whenever the causal mask is skipped (``use_gqa_in_sdpa``)."""
    if c < FP32 or a.num_kv_heads >= a.num_heads:
        return False
    masked = code.bool_mask or (a.sliding_window is not None and p >= a.sliding_window)
    return not masked


def prefill_peak(spec: ModelSpec, b: int, p: int, c: float, e: float, *, cuda: bool = True) -> PrefillMoment:
    """The largest moment of the prefill of b prompts of p tokens (see the module docstring).

    Args:
        spec: The model.
        b: Sequences.
        p: Prompt tokens per sequence.
        c: Bytes per activation element.
        e: Bytes per KV-cache element.
        cuda: The device runs SDPA with CUDA's kernel choice (:func:`_math_sdpa`); False on the CPU.
    """
    code = forward_code(spec)
    h, T = spec.hidden_size, b * p
    model = _model_held(spec, code, b, p, c)
    sdpa = uses_sdpa(spec)
    eager_held = 0 if sdpa else code.held_scores * b * spec.num_heads * p * p * c
    best = PrefillMoment("", 0, 0, 0)
    cache = 0.0
    seen: dict[int, tuple[float, float, float, str]] = {}
    for index, layer in enumerate(spec.layers):
        before = cache
        cache += layer_cache_bytes(layer, b, p, e)
        if id(layer) not in seen:
            attn = _attention_bytes(spec, layer, code, b, p, c, cuda) if layer.attention.kind in ("gqa", "mla") else 0.0
            norm = 0.0
            if layer.norm == "rms":
                norm = code.held_at_norm * h * T * c + (RMS_NORM_BYTES_PER_H * h + RMS_NORM_STAT_BYTES) * T
            mlp, what = _mlp_bytes(layer, code, h, T, c)
            seen[id(layer)] = (attn, norm, mlp + code.held_at_mlp * h * T * c, what)
        attn, norm, mlp, what = seen[id(layer)]
        held_attn = code.held_at_attention * h * T * c
        moments = (
            (f"attention of layer {index + 1}", model + held_attn + attn, before if sdpa else cache),
            (f"RMSNorm of layer {index + 1}", model + norm + eager_held, cache),
            (f"{what} of layer {index + 1}", model + mlp + eager_held, cache),
        )
        for where, act, kv in moments:
            if act + kv > best.total:
                best = PrefillMoment(where, math.ceil(act), 0, math.ceil(kv))
    return best


def end_of_prefill(spec: ModelSpec, b: int, p: int, c: float) -> PrefillMoment:
    """The largest moment after the last layer (KV cache not included): the final norm (the model's
    ``inputs_embeds`` and last hidden state beside an RMSNorm's fp32 temporaries, or LayerNorm's
    output), the lm_head on the last position (its normed input and b x V x c logits), or
    ``generate``'s fp32 copy of the logits (b x V x (c + 4)).
    """
    T, h, V = b * p, spec.hidden_size, spec.vocab_size
    rms = spec.layers[-1].norm == "rms"
    norm = 2 * T * h * c + ((RMS_NORM_BYTES_PER_H * h + RMS_NORM_STAT_BYTES) * T if rms else T * h * c)
    head = T * h * c
    candidates = (
        PrefillMoment("final norm", math.ceil(norm), 0),
        PrefillMoment("lm_head on the last position", math.ceil(head), math.ceil(b * V * c)),
        PrefillMoment("fp32 copy of the last logits", 0, math.ceil(b * V * (c + FP32))),
    )
    return max(candidates, key=lambda m: m.total)
