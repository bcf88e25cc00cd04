"""Architecture facts of a model: :class:`ModelSpec` and the parts it is made of.

A ModelSpec is a symbolic state dict. Every parameter tensor of the model is listed with its
shape, the component it belongs to and how tensor parallelism shards it; every decoder (or
encoder) layer carries the facts the memory formulas need (heads, KV heads, head_dim, MLP width,
experts, sliding window, ...). Parameter counts, stored bytes under any dtype or quantization, and
per-rank shards under TP/PP/ZeRO are all derived from these tensors, so they cannot disagree.

Field names follow the words of DESIGN.md (``num_kv_heads``, ``head_dim``, ...). Shapes use the
layout PyTorch uses: an ``nn.Linear`` weight is ``(out_features, in_features)``; a stack of expert
weights is ``(num_experts, out_features, in_features)``.

This module imports only the standard library (and :mod:`memest.errors`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from memest.errors import ConfigError
from memest.memo import remembered


class Component(str, Enum):
    """Which part of the model a parameter tensor belongs to (the rows of a parameter breakdown)."""

    EMBEDDING = "embedding"
    """Token embeddings, learned position and token-type embeddings."""
    ATTENTION = "attention"
    """Q/K/V/O projections and their biases, MLA down/up projections, attention sinks."""
    MLP = "mlp"
    """Dense feed-forward weights, including the shared experts of an MoE layer."""
    EXPERTS = "experts"
    """Routed experts (leading dimension = num_experts)."""
    ROUTER = "router"
    """The MoE gate that scores experts (and its bias / correction terms)."""
    NORM = "norm"
    """LayerNorm / RMSNorm scales and biases."""
    LM_HEAD = "lm_head"
    """The output projection to the vocabulary; absent when tied to the embedding."""
    OTHER = "other"
    """Everything else: state-space mixers, vision towers, projectors, poolers, classifier heads."""


class Split(str, Enum):
    """How tensor parallelism (Megatron-LM, vLLM) shards a tensor across the ``tp`` ranks."""

    NONE = "none"
    """Replicated on every TP rank (norms, routers, row-parallel biases, position embeddings)."""
    COL = "col"
    """Column-parallel: the output features (dim -2 of a weight, the bias) are divided by tp."""
    ROW = "row"
    """Row-parallel: the input features (dim -1 of a weight) are divided by tp."""
    KV = "kv"
    """Column-parallel over KV heads: divided by min(tp, num_kv_heads); replicated beyond."""
    VOCAB = "vocab"
    """Vocab-parallel embedding or lm_head: the rows (vocab) are divided by tp."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One parameter tensor.

    Attributes:
        name: Its name as in the transformers module, relative to the layer for layer tensors
            (``"self_attn.q_proj.weight"``) and to the model otherwise (``"lm_head.weight"``).
        shape: Its shape in elements.
        component: The breakdown row it is counted in.
        split: How tensor parallelism shards it.
    """

    name: str
    shape: tuple[int, ...]
    component: Component
    split: Split = Split.NONE
    numel: int = field(default=0, init=False, repr=False, compare=False)
    """Number of elements (computed with the tensor)."""
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "numel", math.prod(self.shape))
        object.__setattr__(self, "_hash", hash((self.name, self.shape, self.component.value, self.split.value)))

    def __hash__(self) -> int:
        """The hash of the compared fields, computed with the tensor (the estimator remembers results per
        tensor and per layer, :mod:`memest.memo`)."""
        return self._hash

    @property
    def is_linear_weight(self) -> bool:
        """True for the weight of a linear projection (or an expert stack) in a layer.

        These are the tensors weight quantization (int8, NF4, GPTQ, AWQ, fp8, MXFP4) converts and
        LoRA can target; embeddings, norms, biases and routers keep their 16-bit dtype.
        """
        if len(self.shape) < 2 or self.component not in (Component.ATTENTION, Component.MLP, Component.EXPERTS):
            return False
        if self.name.endswith("weight"):
            return True
        # transformers >= 5 stores routed experts as bare 3-D parameters (mlp.experts.gate_up_proj)
        return self.component is Component.EXPERTS and len(self.shape) >= 3

    @property
    def module(self) -> str:
        """The module path without the parameter name (``"self_attn.q_proj"``)."""
        return self.name.rsplit(".", 1)[0] if "." in self.name else ""


AttentionKind = Literal["gqa", "mla", "cross", "mamba", "linear", "conv", "none"]
"""What a layer's token mixer is, and so what it caches (:mod:`memest.estimate.serving.kv` derives
every engine's cache from it):

- ``gqa``: softmax self-attention over cached K and V (MHA when num_kv_heads = num_heads, MQA when
  1): every token of the sequence (full), at most :attr:`AttentionSpec.sliding_window` tokens
  (sliding), or the tokens of the current :attr:`AttentionSpec.chunk_size` chunk (chunked local
  attention, Llama 4 ``attention_chunk_size``);
- ``mla``: DeepSeek multi-head latent attention: one latent of kv_lora_rank + qk_rope_head_dim
  elements per token;
- ``cross``: a layer that attends only to encoder outputs (mllama ``cross_attention_layers``): it
  caches K and V of :attr:`AttentionSpec.encoder_tokens` per request, nothing per generated token;
- ``mamba`` (Mamba / Mamba-2 SSM), ``linear`` (linear attention: Gated DeltaNet, lightning
  attention), ``conv`` (short convolution, LFM2): a fixed-size state per sequence
  (:class:`StateSpec`), nothing per token;
- ``none``: no token mixing (an MLP-only block of Nemotron-H)."""
STATE_KINDS: frozenset[str] = frozenset({"mamba", "linear", "conv"})
"""The kinds that keep a fixed-size state per sequence instead of per-token K and V."""
RopeKind = Literal["none", "rotate", "concat"]
"""How queries and keys get their positions: ``none`` (learned or ALiBi positions: Q and K are the
projection's outputs, or views of them), ``rotate`` (a rotary embedding over the whole head:
``q * cos + rotate_half(q) * sin`` makes new tensors laid out like the projection's output),
``concat`` (the rotary part and the pass-through part are concatenated, ``torch.cat``: partial
rotary (Phi, GPT-NeoX), Phi-3's rotary code, MLA's q_nope/q_pe; the new Q and K are contiguous in
head-major order, so a flash kernel's output, laid out like Q, needs a contiguous copy)."""
QKNormKind = Literal["none", "head", "full"]
"""Norms on the queries and keys before the rotary embedding: ``head`` (per head over head_dim:
Qwen3, Gemma 3), ``full`` (over all heads of the projection: OLMo-2), ``none``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StateSpec:
    """The recurrent state one sequence keeps in a state layer (``mamba``, ``linear``, ``conv``).

    Two parts, as vLLM's ``MambaStateShapeCalculator`` (``vllm/model_executor/layers/mamba/
    mamba_utils.py``) and transformers' ``LinearAttentionLayer`` (``cache_utils.py``) hold them:

    - the conv state: the last inputs of the depthwise causal convolution, ``conv_channels`` wide
      plus ``groups x group_channels`` (Mamba-2's B and C, 2 x ssm_state_size per group); vLLM keeps
      ``conv_kernel - 1`` columns, transformers ``conv_kernel``;
    - the SSM / recurrent state: ``ssm_elements`` (Mamba d_in x N, Mamba-2 heads x head_dim x N,
      Gated DeltaNet v_heads x v_dim x k_dim, lightning attention heads x d x d).

    - RWKV's token-shift states (``shift_channels``): the previous token's input of the time mix and of
      the channel mix, one column each whatever the engine (transformers ``RwkvSelfAttention`` /
      ``RwkvFeedForward`` ``state[0]`` / ``state[1]``), at the model's dtype like the conv state.

    Tensor parallelism divides both by tp (vLLM ``divide(conv_dim, tp)``, ``divide(num_heads, tp)``);
    Mamba-2 first grows ``groups`` to tp when tp does not divide it (``extra_groups_for_head_shards``).

    Attributes:
        conv_channels: Conv-state channels outside the groups (0: no conv state).
        conv_kernel: The convolution's kernel width K.
        groups: Mamba-2 ``n_groups`` (0 for other mixers).
        group_channels: Conv-state channels per group.
        ssm_elements: Elements of the recurrent state (0: none, LFM2's short convolution).
        ssm_dtype: The recurrent state's dtype when the config fixes it (``mamba_ssm_cache_dtype``:
            ``float32``); None = the model's dtype.
        shift_channels: Elements of the token-shift states (RWKV: 2 x hidden_size), one column.
    """

    conv_channels: int = 0
    conv_kernel: int = 0
    groups: int = 0
    group_channels: int = 0
    ssm_elements: int = 0
    ssm_dtype: str | None = None
    shift_channels: int = 0

    def conv_elements(self, tp: int, *, transformers: bool = False) -> int:
        """Conv-state elements per sequence on one of ``tp`` ranks (vLLM: K - 1 columns;
        ``transformers``: its cache's K columns, on one rank), token-shift states included."""
        shift = self.shift_channels // tp
        if not self.conv_channels and not self.groups:
            return shift
        groups = self.groups
        if groups and groups % tp:
            groups = tp  # vLLM extra_groups_for_head_shards: n_groups + (tp - n_groups)
        width = self.conv_kernel if transformers else self.conv_kernel - 1
        return (self.conv_channels + groups * self.group_channels) // tp * width + shift

    def ssm_elements_on(self, tp: int) -> int:
        """Recurrent-state elements per sequence on one of ``tp`` ranks."""
        return self.ssm_elements // tp


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionSpec:
    """The token mixer of one layer.

    Attributes:
        kind: See :data:`AttentionKind`.
        num_heads: Query heads (a).
        num_kv_heads: Key/value heads (k); equal to num_heads for MHA and MLA.
        head_dim: Per-head dimension of queries and keys (d), from the config when it gives one.
        v_head_dim: Per-head dimension of values; equal to head_dim except for MLA.
        sliding_window: Tokens a sliding-window layer attends to; None for full attention.
        chunk_size: Chunked local attention (Llama 4 ``attention_chunk_size``): tokens attend
            within their chunk only; None otherwise.
        q_lora_rank: MLA query compression rank (None: queries are not compressed).
        kv_lora_rank: MLA latent width cached per token.
        qk_rope_head_dim: MLA decoupled RoPE key width cached per token.
        state: The per-sequence state of a ``mamba`` / ``linear`` / ``conv`` layer (required for
            those kinds); on a ``gqa`` layer, the state of a Mamba mixer that runs beside its
            attention (Falcon-H1: each layer caches K/V and a state); None otherwise.
        kv_shared: One tensor serves as both K and V (Gemma 4 global layers
            ``attention_k_eq_v``): the cache holds it once.
        index_head_dim: The key width a sparse-attention indexer caches per token beside an MLA
            latent (DeepSeek-V3.2 / GLM-5 DSA ``index_head_dim``), or per compressed entry beside a
            compressed layer's entries (DeepSeek-V4 CSA ``index_head_dim``); 0 without an indexer.
        compress_rate: Compressed attention (DeepSeek-V4 ``compress_rates``): besides its sliding
            window of K = V, the layer caches one compressed entry of ``head_dim`` per
            ``compress_rate`` tokens (CSA 4, HCA 128), and its indexer (``index_head_dim``) one key
            per entry likewise; 0 for a layer without a compressor.
        compress_overlap: The compressor pools overlapping windows (DeepSeek-V4 CSA: two series of
            ``head_dim``, entry w mixes window w - 1 and w), so it projects ``2 x head_dim`` per token
            and transformers keeps the last window's first series as state; False for HCA.
        kv_copied_by_transformers: ``kv_shared`` holds in the model, but transformers' cache layer
            stores the one tensor as both its K and its V (DeepSeek-V4 ``sliding_attention`` layers:
            ``DynamicSlidingWindowLayer.update(kv, kv)`` concatenates each), so its cache holds two
            copies where engines hold one.
        kv_reused: The layer attends over another layer's cached K and V and caches nothing itself
            (Gemma 4 ``num_kv_shared_layers``; vLLM ``kv_sharing_target_layer_name``).
        encoder_tokens: A ``cross`` layer's K/V positions per request (mllama: the image tokens
            of one image, max_num_tiles x (patches + 1)).
        cross_attention: True for a decoder layer that also attends to encoder outputs (T5).
        causal: False for bidirectional encoder attention (BERT, the T5 encoder).
        rope: How Q and K get their positions (see :data:`RopeKind`).
        qk_norm: Norms on Q and K (see :data:`QKNormKind`); their kind is the layer's ``norm``.
        logit_softcapping: Eager scores pass through ``tanh`` soft-capping (Gemma 2
            ``attn_logit_softcapping``), whose output is kept for backward.
        sinks: Learned attention sinks (gpt-oss): eager softmax over s + 1 columns in the compute
            dtype, no fp32 copy.
        alibi: ALiBi position biases added to the scores (BLOOM ``alibi.baddbmm``); BLOOM's attention
            keeps the biased raw scores and the fused QKV output in locals through the softmax.
        kv_broadcast: True when transformers broadcasts K and V to all num_heads before its cache
            update (Falcon's ``new_decoder_architecture``), so its cache holds num_heads heads;
            engines with their own attention (vLLM) cache num_kv_heads.
    """

    kind: AttentionKind = "gqa"
    num_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int = 0
    sliding_window: int | None = None
    chunk_size: int | None = None
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    state: StateSpec | None = None
    kv_shared: bool = False
    kv_reused: bool = False
    index_head_dim: int = 0
    compress_rate: int = 0
    compress_overlap: bool = False
    kv_copied_by_transformers: bool = False
    encoder_tokens: int = 0
    cross_attention: bool = False
    causal: bool = True
    rope: RopeKind = "rotate"
    qk_norm: QKNormKind = "none"
    logit_softcapping: bool = False
    sinks: bool = False
    alibi: bool = False
    kv_broadcast: bool = False

    def __post_init__(self) -> None:
        """Derive ``v_head_dim``; check the head counts.

        Raises:
            ConfigError: a negative head count, query heads without KV heads, or num_heads not a
                multiple of num_kv_heads (grouped-query attention gives every KV head the same number
                of query heads; transformers' ``repeat_kv`` and vLLM refuse other configs).
                num_kv_heads = 0 with num_heads = 0 is an attention-free mixer (Mamba, RWKV).


        A state kind without its :class:`StateSpec` (or a state on an ``mla``, ``cross`` or ``none``
        layer) is an adapter's bug: ValueError.
        """
        if self.kind in STATE_KINDS and self.state is None:
            raise ValueError(f"attention kind {self.kind!r}: a state is required for {sorted(STATE_KINDS)}")
        if self.state is not None and self.kind not in (*STATE_KINDS, "gqa"):
            raise ValueError(f"attention kind {self.kind!r} keeps no state")
        if self.v_head_dim == 0:
            object.__setattr__(self, "v_head_dim", self.head_dim)
        a, k = self.num_heads, self.num_kv_heads
        if a < 0 or k < 0:
            raise ConfigError(f"num_attention_heads ({a}) and num_key_value_heads ({k}) must not be negative; "
                              "fix the config")
        if a and not k:
            raise ConfigError(f"num_key_value_heads is 0 with num_attention_heads {a}; set num_key_value_heads to a "
                              f"divisor of {a} (or drop it: it defaults to num_attention_heads)")
        if k and a % k:
            raise ConfigError(f"num_attention_heads ({a}) is not divisible by num_key_value_heads ({k}): each KV head "
                              "must serve the same number of query heads (vLLM refuses the config, transformers fails "
                              f"in repeat_kv); set num_key_value_heads to a divisor of {a}")

    @property
    def has_state(self) -> bool:
        """True for layers that keep a fixed-size state per sequence (mamba, linear, conv)."""
        return self.kind in STATE_KINDS

    @property
    def has_heads(self) -> bool:
        """True for softmax attention with query heads; False for attention-free mixers (Mamba,
        RWKV), which have no heads for tensor parallelism to divide."""
        return self.num_heads > 0


@dataclass(frozen=True, slots=True, kw_only=True)
class MLPSpec:
    """The feed-forward block of one layer.

    Attributes:
        gated: True for GLU variants (SwiGLU, GeGLU: gate and up projections, i wide each).
        intermediate_size: Width i of the dense MLP, or of one routed expert in an MoE layer.
        activation: The activation function name as the config writes it (``silu``, ``gelu``, ...),
            or memest's name for one a module hard-codes: ``swiglu_limit`` (gpt-oss
            ``GptOssExperts._apply_gate``: clamped gate and up, ``gate * sigmoid(alpha * gate) *
            (up + 1)``).
        num_experts: Routed experts; 0 for a dense layer.
        num_experts_per_tok: Experts each token is routed to (top-k).
        num_shared_experts: Experts every token goes through (DeepSeek, Qwen2-MoE).
        shared_intermediate_size: Total width of the shared experts.
    """

    gated: bool
    intermediate_size: int
    activation: str = "silu"
    num_experts: int = 0
    num_experts_per_tok: int = 0
    num_shared_experts: int = 0
    shared_intermediate_size: int = 0

    def __post_init__(self) -> None:
        """Check the routing.

        Raises:
            ConfigError: an MoE layer routing each token to fewer than 1 or more than num_experts
                experts (top-k must pick k distinct experts).
        """
        if self.num_experts > 0 and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ConfigError(f"num_experts_per_tok is {self.num_experts_per_tok} with {self.num_experts} experts; "
                              f"a token is routed to between 1 and {self.num_experts} of them")

    @property
    def is_moe(self) -> bool:
        """True when the layer routes tokens to experts."""
        return self.num_experts > 0


@dataclass(frozen=True, slots=True)
class BufferSpec:
    """A registered buffer the model allocates with its parameters (not a parameter: not trained,
    not counted in ``num_params``).

    Attributes:
        name: Its name as in the transformers module (``transformer.bias``).
        shape: Its shape in elements.
        itemsize: Bytes per element (1 for bool).
    """

    name: str
    shape: tuple[int, ...]
    itemsize: int

    @property
    def nbytes(self) -> int:
        """Bytes it takes."""
        return math.prod(self.shape) * self.itemsize


NormKind = Literal["rms", "rms_fp32", "layer"]
"""``rms``: RMSNorm that casts the normalized input back to the input dtype before the weight
(Llama ``LlamaRMSNorm``, T5); ``rms_fp32``: RMSNorm that multiplies the fp32 normalized input by the
weight and casts the product (Gemma ``(1 + w)``, OLMo-2); ``layer``: LayerNorm."""
NormPosition = Literal["pre", "post", "sandwich"]
"""Where a layer's norms sit: ``pre`` (the blocks read the normed residual: Llama, GPT-2), ``post``
(the blocks read the residual; their outputs are normed before the residual add: OLMo-2),
``sandwich`` (both: Gemma 2 and 3)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerSpec:
    """One transformer (or state-space) layer.

    Attributes:
        attention: Its token mixer.
        mlp: Its feed-forward block.
        norm: The norms' kind (see :data:`NormKind`; the norms' inputs are kept for backward).
        norm_position: Where the norms sit (see :data:`NormPosition`).
        parallel_residual: True when attention and MLP read the same input (GPT-J, NeoX, Falcon,
            Phi).
        parallel_norms: With ``parallel_residual``: 1 when attention and MLP read one norm's
            output (Phi, GPT-J, Falcon-7B), 2 when each has its own norm of the shared input
            (GPT-NeoX ``input_layernorm`` / ``post_attention_layernorm``, Falcon
            ``new_decoder_architecture`` ``ln_attn`` / ``ln_mlp``).
        tensors: Its parameter tensors, names relative to the layer.
        stack: ``decoder`` for causal-LM and seq2seq decoder layers, ``encoder`` otherwise.
    """

    attention: AttentionSpec
    mlp: MLPSpec
    norm: NormKind = "rms"
    norm_position: NormPosition = "pre"
    parallel_residual: bool = False
    parallel_norms: int = 1
    tensors: tuple[TensorSpec, ...] = ()
    stack: Literal["decoder", "encoder"] = "decoder"
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.attention, self.mlp, self.norm, self.norm_position,
                                                self.parallel_residual, self.parallel_norms, self.tensors, self.stack)))

    def __hash__(self) -> int:
        """The hash of the compared fields, computed with the layer (see :meth:`TensorSpec.__hash__`)."""
        return self._hash

    @property
    def num_params(self) -> int:
        """Parameters in this layer."""
        return sum(t.numel for t in self.tensors)


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantizationSpec:
    """How a checkpoint stores its weights, read from ``quantization_config``.

    Attributes:
        method: ``bitsandbytes`` (8-bit or NF4/FP4), ``gptq``, ``awq``, ``fp8``, ``mxfp4``,
            ``compressed-tensors``, ...: the ``quant_method`` the config names.
        bits: Bits per quantized weight.
        group_size: Weights sharing one scale (GPTQ/AWQ group, NF4 block, MXFP4 block); None for
            per-channel or per-tensor scales.
        block_shape: Block of a block-wise fp8 scale (DeepSeek-V3: ``(128, 128)``).
        double_quant: bitsandbytes nested quantization of the NF4 absmax scales.
        skip_modules: Module name patterns kept unquantized (``modules_to_not_convert``).
        strategy: Scale granularity when the config names it (compressed-tensors ``strategy``:
            ``tensor``, ``channel``, ``group``, ``block``); None = the method's usual one.
        compute_dtype: bitsandbytes 4-bit ``bnb_4bit_compute_dtype`` (the dtype weights are
            dequantized to for a matmul); None when not given.
    """

    method: str
    bits: int
    group_size: int | None = None
    block_shape: tuple[int, int] | None = None
    double_quant: bool = False
    skip_modules: tuple[str, ...] = ()
    strategy: str | None = None
    compute_dtype: str | None = None


_POSITION_TABLE = re.compile(r"(^|\.)(wpe|position_embeddings|embed_positions)\.weight$")
"""Names of learned absolute position tables (GPT-2 ``transformer.wpe``, BERT
``embeddings.position_embeddings``, OPT ``decoder.embed_positions``)."""

TaskKind = Literal["causal_lm", "masked_lm", "seq2seq", "classification"]


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Everything memest knows about a model's architecture.

    Attributes:
        name: The reference it was loaded as, normalised (``meta-llama/Llama-2-7b-hf``).
        model_type: The config's ``model_type`` (``llama``, ``mixtral``, ...).
        architecture: The first class named in ``architectures``.
        hidden_size: Model width h.
        vocab_size: Rows of the embedding matrix V.
        max_position_embeddings: Longest context the config allows, if it states one.
        tie_word_embeddings: True when the lm_head shares the embedding matrix (counted once).
        layers: The layers in order (encoder layers first for seq2seq models).
        embedding: Tensors before the first layer (first pipeline stage): embeddings, embedding
            norms, vision towers of multimodal checkpoints.
        head: Tensors after the last layer (last pipeline stage): final norm, lm_head, pooler.
        task: What the head computes; ``causal_lm`` and ``seq2seq`` produce vocabulary logits.
        torch_dtype: The checkpoint's dtype as the config states it (``bfloat16``), if it does.
        quantization: The checkpoint's quantization, if any.
        source: Where the config came from (``catalog``, a path, ``hub``).
        notes: What the adapter wants users to know (derived configs, uncounted modules).
        hidden_dropout: Dropout probability on the residual branches (after the attention output
            and the MLP) and the embeddings; training keeps a 1-byte mask per element.
        attention_dropout: Dropout probability on the attention probabilities (eager attention
            keeps a mask of the s x s matrix).
        buffers: Registered buffers transformers allocates with the model and keeps on the device
            (GPT-BigCode's causal mask); rotary ``inv_freq`` tables are left out (a few KiB).
        final_logit_softcapping: The logits pass through ``tanh`` soft-capping (Gemma 2
            ``final_logit_softcapping``), whose output is kept for backward.
        sdpa_supported: False for families transformers runs with eager attention only
            (``attn_implementation="sdpa"`` raises: bloom, gemma2, gpt-oss), which keep the s x s
            scores.
    """

    name: str
    model_type: str
    architecture: str
    hidden_size: int
    vocab_size: int
    max_position_embeddings: int | None
    tie_word_embeddings: bool
    layers: tuple[LayerSpec, ...]
    embedding: tuple[TensorSpec, ...]
    head: tuple[TensorSpec, ...]
    task: TaskKind = "causal_lm"
    torch_dtype: str | None = None
    quantization: QuantizationSpec | None = None
    source: str = "catalog"
    notes: tuple[str, ...] = ()
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    buffers: tuple[BufferSpec, ...] = ()
    final_logit_softcapping: bool = False
    sdpa_supported: bool = True
    _kinds: tuple[tuple[LayerSpec, int], ...] = field(default=(), init=False, repr=False, compare=False)
    _pattern: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        kinds = group_layers(self.layers)
        object.__setattr__(self, "_kinds", kinds)
        object.__setattr__(self, "_pattern", _layer_pattern(self.layers, kinds))
        object.__setattr__(self, "_hash", hash((self.name, self.model_type, self.architecture, self.hidden_size,
                                                self.vocab_size, self._pattern, self.max_position_embeddings,
                                                self.tie_word_embeddings, self.task, self.torch_dtype,
                                                self.quantization, self.source)))

    # The estimator remembers results per spec (memest.memo), so a spec is hashed and compared often:
    # its hash is computed once, with the spec, and comparing takes time per distinct layer, not per layer.

    def __hash__(self) -> int:
        """A hash of the fields that tell models apart (equal specs hash alike: these fields are among
        those :meth:`__eq__` compares)."""
        return self._hash

    def __eq__(self, other: object) -> bool:
        """Every field equal; the layers compared as their distinct layers and the order they occur in
        (equal exactly when the layer tuples are)."""
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, ModelSpec)
        return (self._pattern == other._pattern and self._kinds == other._kinds
                and all(getattr(self, name) == getattr(other, name) for name in _COMPARED_BESIDES_LAYERS))

    # ---- the representative layer's facts (the first decoder layer, else the first layer) ----

    @property
    def reference_layer(self) -> LayerSpec:
        """The layer whose attention/MLP facts are quoted as the model's (first decoder layer)."""
        for layer in self.layers:
            if layer.stack == "decoder" and layer.attention.kind in ("gqa", "mla"):
                return layer
        return self.layers[0]

    @property
    def num_layers(self) -> int:
        """L: all layers (encoder + decoder for seq2seq)."""
        return len(self.layers)

    @property
    def num_heads(self) -> int:
        """a: query heads per layer."""
        return self.reference_layer.attention.num_heads

    @property
    def num_kv_heads(self) -> int:
        """k: key/value heads per layer."""
        return self.reference_layer.attention.num_kv_heads

    @property
    def head_dim(self) -> int:
        """d: per-head dimension of queries and keys."""
        return self.reference_layer.attention.head_dim

    @property
    def intermediate_size(self) -> int:
        """i: dense MLP width (or per-expert width for MoE layers)."""
        return self.reference_layer.mlp.intermediate_size

    @property
    def learned_positions(self) -> int | None:
        """Positions a learned absolute position table holds, or None when the model has none
        (rotary, ALiBi or relative positions, or none at all).

        Read from the embedding's position table (GPT-2 / GPT-BigCode ``wpe``, BERT
        ``position_embeddings``, OPT ``embed_positions``, which keeps 2 extra rows for its offset):
        its rows, capped by ``max_position_embeddings``. A sequence longer than this indexes past the
        table (an IndexError in PyTorch), so it cannot run at all.
        """
        rows = [t.shape[0] for t in self.embedding
                if t.component is Component.EMBEDDING and len(t.shape) == 2 and _POSITION_TABLE.search(t.name)]
        if not rows:
            return None
        limit = min(rows)
        return min(limit, self.max_position_embeddings) if self.max_position_embeddings else limit

    @property
    def buffer_bytes(self) -> int:
        """Bytes of the registered buffers (:attr:`buffers`)."""
        return sum(b.nbytes for b in self.buffers)

    @property
    def num_experts(self) -> int:
        """Routed experts per MoE layer (0 for dense models)."""
        return max((layer.mlp.num_experts for layer in self.layers), default=0)

    @property
    def num_experts_per_tok(self) -> int:
        """Experts each token is routed to (0 for dense models)."""
        return max((layer.mlp.num_experts_per_tok for layer in self.layers), default=0)

    # ---- parameters ----

    def layer_kinds(self, start: int = 0, stop: int | None = None) -> tuple[tuple[LayerSpec, int], ...]:
        """Distinct layers in ``layers[start:stop]`` with how many times each occurs.

        Slices are grouped once and remembered (the planner asks for the same pipeline stages
        thousands of times).
        """
        if start == 0 and (stop is None or stop >= len(self.layers)):
            return self._kinds
        return tuple((self.layers[index], count) for index, count in _slice_groups(self, start, stop))

    def tensors(self) -> Iterator[tuple[TensorSpec, int]]:
        """Every distinct parameter tensor with its multiplicity (tied tensors listed once)."""
        for t in self.embedding:
            yield t, 1
        for layer, count in self._kinds:
            for t in layer.tensors:
                yield t, count
        for t in self.head:
            yield t, 1

    @property
    def num_params(self) -> int:
        """Total parameters, tied weights counted once."""
        return sum(t.numel * n for t, n in self.tensors())

    def params_by_component(self) -> dict[Component, int]:
        """Parameters per :class:`Component`, in the enum's order, zero rows omitted."""
        out = dict.fromkeys(Component, 0)
        for t, n in self.tensors():
            out[t.component] += t.numel * n
        return {c: v for c, v in out.items() if v}

    @property
    def num_active_params(self) -> int:
        """Parameters used per token: routed experts counted at top-k of num_experts."""
        total = 0
        for t, n in self.tensors():
            numel = t.numel * n
            if t.component is Component.EXPERTS:
                layer_mlp = _expert_layer(self, t)
                numel = numel * layer_mlp.num_experts_per_tok // layer_mlp.num_experts
            total += numel
        return total

    def replace(self, **changes: Any) -> ModelSpec:
        """A copy with some fields changed (dataclasses.replace)."""
        return dataclasses.replace(self, **changes)


_COMPARED_BESIDES_LAYERS = tuple(f.name for f in dataclasses.fields(ModelSpec) if f.compare and f.name != "layers")


def _layer_pattern(layers: tuple[LayerSpec, ...], kinds: tuple[tuple[LayerSpec, int], ...]) -> tuple[int, ...]:
    """For each layer, the index in ``kinds`` (:func:`group_layers`) of the distinct layer it equals."""
    index = {id(layer): n for n, (layer, _) in enumerate(kinds)}
    out = []
    for layer in layers:
        n = index.get(id(layer))
        if n is None:
            n = next(i for i, (kind, _) in enumerate(kinds) if kind == layer)
        out.append(n)
    return tuple(out)


@remembered(maxsize=4096)
def _slice_groups(spec: ModelSpec, start: int, stop: int | None) -> tuple[tuple[int, int], ...]:
    """:meth:`ModelSpec.layer_kinds` of a slice as (index in ``spec.layers`` of each distinct layer's first
    occurrence, count) (remembered per spec and slice). Indices, not layers: an equal spec that finds this
    entry takes its own layer objects, which the estimator compares by identity."""
    layers = spec.layers[start:stop]
    first = {id(layer): n for n, layer in reversed(list(enumerate(layers)))}
    return tuple((start + first[id(layer)], count) for layer, count in group_layers(layers))


def group_layers(layers: Iterable[LayerSpec]) -> tuple[tuple[LayerSpec, int], ...]:
    """Distinct layers with their counts, in order of first appearance.

    Adapters build equal layers as one shared object, so grouping by identity is exact and fast;
    equal but distinct objects are merged too.
    """
    counts: dict[int, list[Any]] = {}
    for layer in layers:
        entry = counts.get(id(layer))
        if entry is None:
            for other in counts.values():
                if other[0] == layer:
                    entry = other
                    break
            else:
                entry = counts[id(layer)] = [layer, 0]
        entry[1] += 1
    return tuple((layer, n) for layer, n in counts.values())


def _expert_layer(spec: ModelSpec, tensor: TensorSpec) -> MLPSpec:
    for layer, _ in spec.layer_kinds():
        if any(t is tensor for t in layer.tensors):
            return layer.mlp
    raise ValueError(f"tensor {tensor.name!r} is not in a layer of {spec.name!r}")
