"""KV cache of one rank: bytes per token per layer, paged layouts, and the engines' token arithmetic.

:func:`kv_layer` turns one layer's :class:`~memest.spec.AttentionSpec` into a :class:`KVLayer`
(bytes per token, a state per sequence); :func:`paged_layout` follows vLLM 0.19's paged allocator
(pages, groups, blocks, concurrency); :func:`contiguous_cache_bytes` is transformers' contiguous
cache. The formulas per attention kind and the allocator's rules, with their sources: DESIGN.md,
"KV cache".
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from memest.dtypes import nbytes
from memest.estimate.serving.common import weight_dtype
from memest.estimate.sharding import Stage
from memest.spec import LayerSpec, ModelSpec, StateSpec
from memest.workload import ServingConfig

KV_DTYPE_BYTES_AUTO = "auto"


def kv_element_bytes(kv_cache_dtype: str, served_dtype: str) -> float:
    """Bytes per KV-cache element: the served weight dtype for ``auto``, else the named dtype.

    Raises:
        InputError: unknown dtype name.
    """
    return nbytes(served_dtype if kv_cache_dtype == KV_DTYPE_BYTES_AUTO else kv_cache_dtype)


def kv_dtype_bytes(spec: ModelSpec, s: ServingConfig) -> float:
    """Bytes per KV-cache element of a serving job (``--kv-cache-dtype``; ``auto`` = the served dtype)."""
    return kv_element_bytes(s.kv_cache_dtype, weight_dtype(spec, s))


KVKind = Literal["full", "sliding", "chunked", "mla", "cross", "state", "compressed"]
"""What one layer caches, as vLLM's ``get_kv_cache_spec`` names it (``vllm/v1/kv_cache_interface.py``):
``full`` (``FullAttentionSpec``), ``sliding`` (``SlidingWindowSpec``), ``chunked``
(``ChunkedLocalAttentionSpec``), ``mla`` (``MLAAttentionSpec``), ``cross`` (``CrossAttentionSpec``:
the encoder's tokens of a request), ``state`` (``MambaSpec``: mamba, linear attention, short conv),
``compressed`` (one entry per ``compress_rate`` tokens: DeepSeek-V4's compressor and indexer caches,
vLLM ``MLAAttentionSpec(compress_ratio=...)``)."""


@dataclass(frozen=True, slots=True)
class KVLayer:
    """What one layer caches on one TP rank.

    Attributes:
        kind: See :data:`KVKind`.
        bytes_per_token: Cache bytes per cached position (a ``cross`` layer's positions are the
            request's encoder tokens; 0 for ``state``).
        window: Tokens a sliding layer attends to, or a chunked layer's chunk (None otherwise).
        state_bytes: Bytes of recurrent state per sequence (``state`` only).
        encoder_tokens: Positions a ``cross`` layer caches per request.
        compress_rate: Tokens per entry of a ``compressed`` cache (``bytes_per_token`` is then the
            bytes of one entry); 0 otherwise.
        pending_bytes: Bytes per token a ``compressed`` cache holds for the tokens of a window not
            yet closed (transformers ``buffer_kv`` + ``buffer_gate``: at most compress_rate - 1).
        overlap_bytes: Bytes a ``compressed`` cache keeps once a window has closed (transformers
            ``DeepseekV4CSACache.overlap_kv`` + ``overlap_gate``: the last window's first series).
    """

    kind: KVKind
    bytes_per_token: int
    window: int | None = None
    state_bytes: int = 0
    encoder_tokens: int = 0
    compress_rate: int = 0
    pending_bytes: int = 0
    overlap_bytes: int = 0

    @property
    def is_attention(self) -> bool:
        """True for layers whose cache is paged by tokens (every kind but ``state``)."""
        return self.kind != "state"

    @property
    def per_generated_token(self) -> int:
        """Bytes one more token of a sequence adds here (windows ignored): 0 for ``cross`` and
        ``state`` layers, whose cache does not grow with the sequence; a ``compressed`` cache one
        entry per compress_rate tokens, rounded up to whole bytes."""
        if self.kind == "compressed":
            return -(-self.bytes_per_token // self.compress_rate)
        return 0 if self.kind in ("cross", "state") else self.bytes_per_token

    def prefill_bytes(self, tokens: int) -> int:
        """Bytes one sequence holds after a prefill of ``tokens`` positions in transformers: a
        compressed cache's buffer is then a view of the whole prompt's projection (``tokens``
        positions of it); other kinds as :meth:`sequence_bytes`."""
        if self.kind != "compressed":
            return self.sequence_bytes(tokens)
        entries = tokens // self.compress_rate
        return self.bytes_per_token * entries + self.pending_bytes * tokens + (self.overlap_bytes if entries else 0)

    def sequence_bytes(self, tokens: int) -> int:
        """Bytes one sequence of ``tokens`` positions holds in a contiguous cache (transformers):
        a full layer every token, a sliding or chunked layer at most its window
        (``DynamicSlidingWindowLayer``, which transformers also uses for ``chunked_attention`` with
        ``sliding_window = attention_chunk_size``), a cross layer its encoder tokens, a state layer
        its state; a compressed cache one entry per closed window of compress_rate tokens
        (``DeepseekV4HCACache.store_compression_weights`` emits only whole windows), the buffered
        tokens and, once a window has closed, the overlap state. The buffer is a view
        (``kv[:, usable:]``) of the last step's concatenation of the buffered tokens and the new one,
        so after a decode step to ``tokens`` positions it holds the storage of
        ``(tokens - 1) mod compress_rate + 1`` tokens, even when that step closed the window."""
        if self.kind == "compressed":
            entries = tokens // self.compress_rate
            pending = (tokens - 1) % self.compress_rate + 1 if tokens else 0
            return (self.bytes_per_token * entries + self.pending_bytes * pending
                    + (self.overlap_bytes if entries else 0))
        if self.kind == "state":
            return self.state_bytes
        if self.kind == "cross":
            return self.bytes_per_token * self.encoder_tokens
        kept = tokens if self.window is None else min(tokens, self.window)
        return self.bytes_per_token * kept


def kv_layer(layer: LayerSpec, tp: int, e: float, *, transformers: bool = False,
             state_e: float | None = None) -> KVLayer | None:
    """The cache of one layer on one TP rank, or None when it caches nothing (encoders, MLP-only
    blocks); a layer that also runs a Mamba mixer has a second cache (:func:`kv_caches`).

    Args:
        layer: The layer.
        tp: Tensor-parallel degree.
        e: Bytes per KV-cache element.
        transformers: The layout of transformers' own cache (``--engine hf``): layers whose
            attention broadcasts K and V to all query heads before the cache update
            (:attr:`AttentionSpec.kv_broadcast`, Falcon's ``new_decoder_architecture``) cache
            num_heads heads; conv states keep K columns (``LinearAttentionLayer``) where vLLM keeps
            K - 1 (``MambaStateShapeCalculator``).
        state_e: Bytes per element of a state layer's conv state (and of its SSM state unless the
            config fixes that dtype): vLLM's ``mamba_cache_dtype`` ``auto`` is the model dtype,
            whatever ``--kv-cache-dtype`` is; None = ``e``.
    """
    a = layer.attention
    if layer.stack == "encoder" or not a.causal or a.kind == "none" or a.kv_reused:
        return None
    if a.has_state:
        return _state_cache(a.state, tp, e if state_e is None else state_e, transformers=transformers)
    if a.kind == "mla":
        return KVLayer("mla", math.ceil((a.kv_lora_rank + a.qk_rope_head_dim) * e))
    if a.kind not in ("gqa", "cross"):
        raise ValueError(f"no cache rule for attention kind {a.kind!r}")
    heads = a.num_heads if transformers and a.kv_broadcast else a.num_kv_heads
    k_local = max(1, heads // tp)
    shared = a.kv_shared and not (transformers and a.kv_copied_by_transformers)
    per = k_local * (a.head_dim if shared else a.head_dim + a.v_head_dim) * e
    if a.kind == "cross":
        return KVLayer("cross", math.ceil(per), encoder_tokens=a.encoder_tokens)
    if a.cross_attention:
        per *= 2
    if a.sliding_window is not None:
        return KVLayer("sliding", math.ceil(per), window=a.sliding_window)
    if a.chunk_size is not None:
        return KVLayer("chunked", math.ceil(per), window=a.chunk_size)
    return KVLayer("full", math.ceil(per))


def _state_cache(state: StateSpec | None, tp: int, se: float, *, transformers: bool) -> KVLayer:
    """The state cache of ``state``: conv elements at ``se`` bytes, SSM elements at the dtype the
    config fixes, else ``se``."""
    assert state is not None
    ssm_e = nbytes(state.ssm_dtype) if state.ssm_dtype else se
    conv = state.conv_elements(tp, transformers=transformers)
    return KVLayer("state", 0, state_bytes=math.ceil(conv * se + state.ssm_elements_on(tp) * ssm_e))


def kv_caches(layer: LayerSpec, tp: int, e: float, *, transformers: bool = False,
              state_e: float | None = None) -> tuple[KVLayer, ...]:
    """Every cache one layer keeps on one TP rank: :func:`kv_layer`'s, the state of a Mamba mixer
    running beside the attention (Falcon-H1, whose layers vLLM gives a ``FullAttentionSpec`` and a
    ``MambaSpec`` each), and the key cache of a sparse-attention indexer beside MLA (DeepSeek-V3.2,
    GLM-5: a second ``MLAAttentionSpec`` per layer)."""
    kv = kv_layer(layer, tp, e, transformers=transformers, state_e=state_e)
    if kv is None:
        return ()
    a = layer.attention
    if a.kind == "gqa" and a.state is not None:
        return kv, _state_cache(a.state, tp, e if state_e is None else state_e, transformers=transformers)
    if a.kind == "mla" and a.index_head_dim:
        return kv, _indexer_cache(a.index_head_dim, e, transformers=transformers)
    if a.compress_rate:
        caches = [kv, _compressed_cache(a.head_dim, a.compress_rate, a.compress_overlap, e, transformers=transformers)]
        if a.index_head_dim:
            caches.append(_compressed_cache(a.index_head_dim, a.compress_rate, True, e, transformers=transformers))
        return tuple(caches)
    return (kv,)


FP32_BYTES = 4


def _compressed_cache(width: int, rate: int, overlap: bool, e: float, *, transformers: bool) -> KVLayer:
    """The compressed entries of a DeepSeek-V4 compressor (``width`` = head_dim) or of its CSA
    indexer (``width`` = index_head_dim), one per ``rate`` tokens, at the cache dtype.

    transformers 5.24 (``DeepseekV4HCACache`` / ``DeepseekV4CSACache`` in
    ``models/deepseek_v4/modeling_deepseek_v4.py``) also holds, per token of the open window, the
    projected ``kv`` and ``gate`` (``buffer_kv`` / ``buffer_gate``: width each, 2 x width for an
    overlapping compressor) and, for an overlapping one, once a window has closed, the last window's
    first series: ``overlap_kv`` (rate x width at the cache dtype) and ``overlap_gate`` (rate x width
    in fp32: the gate has the fp32 ``position_bias`` added before it is saved).

    vLLM (``vllm/model_executor/layers/deepseek_v4_attention.py``) is not modelled: it stores fp8
    entries with scales (584 B per compressed entry, 132 B per indexer key) and a compressor state
    cache of its own; memest assumes its pool holds transformers' entries at ``--kv-cache-dtype``
    (the estimate's assumptions say so).
    """
    if not transformers:
        return KVLayer("compressed", math.ceil(width * e), compress_rate=rate)
    series = 2 if overlap else 1
    return KVLayer("compressed", math.ceil(width * e), compress_rate=rate,
                   pending_bytes=math.ceil(2 * series * width * e),
                   overlap_bytes=math.ceil(rate * width * (e + FP32_BYTES)) if overlap else 0)


INDEXER_QUANT_BLOCK = 128
"""Indexer keys per fp32 scale in vLLM's fp8 indexer cache (``quant_block_size``)."""


def _indexer_cache(index_head_dim: int, e: float, *, transformers: bool) -> KVLayer:
    """A DSA indexer's key cache: vLLM ``DeepseekV32IndexerCache`` (an ``MLAAttentionSpec`` of one
    head, uint8): fp8 keys and one fp32 scale per 128, ``d_i + d_i / 128 x 4`` bytes per token
    whatever the KV dtype (132 for d_i = 128); transformers ``DynamicIndexedLayer``: the keys at the
    cache dtype."""
    if transformers:
        return KVLayer("full", math.ceil(index_head_dim * e))
    return KVLayer("mla", index_head_dim + index_head_dim // INDEXER_QUANT_BLOCK * 4)


def kv_layers(kinds: Iterable[tuple[LayerSpec, int]], tp: int, e: float, *,
              transformers: bool = False, state_e: float | None = None) -> list[tuple[KVLayer, int]]:
    """The distinct caches of some layers (``ModelSpec.layer_kinds`` of a stage) with their counts
    (:func:`kv_caches`; ``transformers``, ``state_e``: see :func:`kv_layer`)."""
    out: dict[KVLayer, int] = {}
    for layer, n in kinds:
        for kv in kv_caches(layer, tp, e, transformers=transformers, state_e=state_e):
            out[kv] = out.get(kv, 0) + n
    return list(out.items())


def bytes_per_token(layers: Iterable[tuple[KVLayer, int]]) -> int:
    """KV-cache bytes one token adds on a rank, over all its attention layers (windows ignored;
    cross and state layers add nothing per token: :attr:`KVLayer.per_generated_token`)."""
    return sum(kv.per_generated_token * n for kv, n in layers)


def state_bytes_per_sequence(layers: Iterable[tuple[KVLayer, int]]) -> int:
    """Bytes one sequence holds on a rank whatever its length: state layers' states and cross
    layers' encoder K/V."""
    return sum((kv.state_bytes + kv.bytes_per_token * kv.encoder_tokens) * n for kv, n in layers
               if kv.kind in ("state", "cross"))


def contiguous_cache_bytes(layers: Iterable[tuple[KVLayer, int]], batch: int, tokens: int) -> int:
    """Bytes of a contiguous cache (transformers ``DynamicCache`` / ``StaticCache``) on one rank:
    ``batch`` sequences of :meth:`KVLayer.sequence_bytes` in every layer.

    Args:
        layers: The rank's caches with counts.
        batch: Sequences (b).
        tokens: Positions cached per sequence (prompt + generated tokens).
    """
    return sum(kv.sequence_bytes(tokens) * batch * n for kv, n in layers)


# ---- vLLM's paged layout ----


@dataclass(frozen=True, slots=True)
class KVGroup:
    """One KV-cache group of vLLM's allocator (its layers share one block table).

    Attributes:
        kind: The layers' :data:`KVKind`.
        block_size: Tokens per page of this group.
        window: Sliding window or attention chunk (sliding and chunked groups).
        num_layers: Real layers in the group (padding layers excluded).
        encoder_tokens: Positions a cross group caches per request.
    """

    kind: KVKind
    block_size: int
    window: int | None
    num_layers: int
    encoder_tokens: int = 0


@dataclass(frozen=True, slots=True)
class PagedLayout:
    """How vLLM pages one rank's KV cache.

    Attributes:
        groups: The KV-cache groups.
        page_bytes: Bytes of one page of one layer (the same for every group), or, for a single
            group of full-attention layers of different widths, of all its layers together.
        layers_per_page: Layers one block spans: ``group_size`` (the layers that share one memory
            pool), or 1 when ``page_bytes`` already covers all layers.
        block_size: ``--block-size`` (the attention groups' tokens per page before mamba growth).
        page_covers_layers: True when ``page_bytes`` is the page of all the group's layers together
            (``UniformTypeKVCacheSpecs``), False when it is one layer's.
        deepseek_v4: vLLM's DeepSeek-V4 layout (:func:`deepseek_v4_layout`): every group's block is
            ``page_bytes``, and the pool's tokens are reported as concurrency x max_model_len.
    """

    groups: tuple[KVGroup, ...]
    page_bytes: int
    layers_per_page: int
    block_size: int
    page_covers_layers: bool = False
    deepseek_v4: bool = False

    def bytes_per_token(self) -> int | None:
        """DeepSeek-V4: bytes the pool grows by per token of a request, one block of the full group per
        256 tokens (the sliding and state groups do not grow); None for other layouts (their
        :func:`bytes_per_token` of the layers)."""
        return -(-self.page_bytes // self.groups[0].block_size) if self.deepseek_v4 and self.groups else None

    def pool_tokens(self, num_blocks: int, max_model_len: int, max_num_batched_tokens: int) -> int:
        """The 'GPU KV cache size' vLLM logs: :meth:`tokens`, or for DeepSeek-V4 (whose V4 release
        logs ``max_concurrency x max_model_len``, ``_report_kv_cache_config``) that product."""
        if self.deepseek_v4:
            return int(self.max_concurrency(num_blocks, max_model_len, max_num_batched_tokens) * max_model_len)
        return self.tokens(num_blocks)

    @property
    def block_bytes(self) -> int:
        """Bytes of one block across the layers that share it (``page x group_size``)."""
        return self.page_bytes * self.layers_per_page

    @property
    def min_block_size(self) -> int:
        """Smallest tokens-per-page over the groups (``block_size`` when there is none)."""
        return min((g.block_size for g in self.groups), default=self.block_size)

    def num_blocks(self, available_bytes: int) -> int:
        """Blocks that fit ``available_bytes`` (vLLM ``get_num_blocks``; 0 when none)."""
        if not self.groups or self.block_bytes == 0:
            return 0
        return max(0, available_bytes // self.page_bytes // self.layers_per_page)

    def tokens(self, num_blocks: int) -> int:
        """The 'GPU KV cache size' vLLM logs for ``num_blocks`` (``_report_kv_cache_config``)."""
        if not self.groups:
            return 0
        return num_blocks // len(self.groups) * self.min_block_size

    def blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Blocks one request of ``max_model_len`` tokens can occupy, all groups together."""
        pages = sum(_group_pages(g, max_model_len, max_num_batched_tokens) for g in self.groups)
        return pages

    def request_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Bytes one request of ``max_model_len`` tokens needs on this rank, every layer counted
        (vLLM ``max_memory_usage_bytes`` summed over layers, which ``check_enough_kv_cache_memory``
        compares with the available memory)."""
        if self.page_covers_layers:
            return sum(_group_pages(g, max_model_len, max_num_batched_tokens) for g in self.groups) * self.page_bytes
        pages = sum(_group_pages(g, max_model_len, max_num_batched_tokens) * g.num_layers for g in self.groups)
        return pages * self.page_bytes

    def request_state_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """The part of :meth:`request_bytes` in state and cross-attention groups: what a request holds
        whatever its length (state pages padded to the attention page)."""
        if self.page_covers_layers:
            return 0
        return sum(_group_pages(g, max_model_len, max_num_batched_tokens) * g.num_layers for g in self.groups
                   if g.kind in ("state", "cross")) * self.page_bytes

    def max_concurrency(self, num_blocks: int, max_model_len: int, max_num_batched_tokens: int) -> float:
        """vLLM's 'Maximum concurrency for max_model_len tokens per request'."""
        per_request = self.blocks_per_request(max_model_len, max_num_batched_tokens)
        return num_blocks / per_request if per_request else 0.0

    def largest_max_model_len(self, available_bytes: int, limit: int, max_num_batched_tokens: int) -> int:
        """The largest max_model_len whose one request fits ``available_bytes`` (vLLM
        ``estimate_max_model_len``: the same bisection over ``max_memory_usage_bytes``); 0 if none.

        Args:
            available_bytes: KV memory of the rank.
            limit: The longest length to consider (the model's or the user's max_model_len).
            max_num_batched_tokens: Tokens per step (bounds sliding-window layers).
        """
        if self.request_bytes(1, max_num_batched_tokens) > available_bytes:
            return 0
        lo, hi = 1, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.request_bytes(mid, max_num_batched_tokens) <= available_bytes:
                lo = mid
            else:
                hi = mid - 1
        return lo


def _group_pages(g: KVGroup, max_model_len: int, max_num_batched_tokens: int) -> int:
    """Pages one request takes in a group (``max_memory_usage_bytes`` of its spec / page size)."""
    if g.kind == "state":
        return 1  # MambaSpec, mamba_cache_mode "none": one state per request
    if g.kind == "cross":
        return -(-g.encoder_tokens // g.block_size)  # CrossAttentionSpec: the encoder's tokens
    if g.kind == "sliding" and g.window is not None:
        tokens = min(g.window - 1 + max_num_batched_tokens, max_model_len)
        return -(-tokens // g.block_size) + 1
    if g.kind == "compressed":
        return -(-max_model_len // g.block_size)  # g.block_size: the tokens whose entries fill a page
    if g.kind == "chunked" and g.window is not None:
        tokens = min(g.window + max_num_batched_tokens, max_model_len)  # ChunkedLocalAttentionSpec
        return -(-tokens // g.block_size)
    return -(-max_model_len // g.block_size)


def paged_layout(layers: list[tuple[KVLayer, int]], block_size: int) -> PagedLayout:
    """vLLM 0.19's KV-cache groups and page size for one rank's layers.

    Args:
        layers: The rank's caches with counts (:func:`kv_layers`).
        block_size: ``--block-size`` (tokens per page).
    """
    attention = [(kv, n) for kv, n in layers if kv.is_attention]
    states = [(kv, n) for kv, n in layers if not kv.is_attention]
    if not layers:
        return PagedLayout((), 0, 1, block_size)
    if states:
        return _mamba_hybrid_layout(attention, states, block_size)
    if len(attention) == 1:
        kv, n = attention[0]
        group = KVGroup(kv.kind, block_size, kv.window, n, kv.encoder_tokens)
        return PagedLayout((group,), kv.bytes_per_token * block_size, n, block_size)
    kinds = {(kv.kind, kv.window, kv.encoder_tokens) if kv.kind in ("sliding", "chunked", "cross")
             else (kv.kind, kv.compress_rate, 0) if kv.kind == "compressed" else ("full", None, 0)
             for kv, _ in attention}
    if len(kinds) == 1 and ("full", None, 0) in kinds:
        # UniformTypeKVCacheSpecs: one group, a page covers every layer
        page = sum(kv.bytes_per_token * block_size * n for kv, n in attention)
        group = KVGroup(attention[0][0].kind, block_size, None, sum(n for _, n in attention))
        return PagedLayout((group,), page, 1, block_size, page_covers_layers=True)
    return _hybrid_layout(attention, block_size)


def _hybrid_layout(attention: list[tuple[KVLayer, int]], block_size: int) -> PagedLayout:
    """Groups of different kinds on one page size. A ``compressed`` cache's page for ``block_size``
    tokens holds their ceil(block_size / compress_rate) entries; on the common page it holds
    page / entry entries, the entries of (page / entry) x compress_rate tokens."""
    pages = {kv: (-(-block_size // kv.compress_rate) if kv.kind == "compressed" else block_size) * kv.bytes_per_token
             for kv, _ in attention}
    page = max(pages.values())
    blocks = {}
    for kv, p in pages.items():
        if kv.kind == "compressed":
            p = kv.bytes_per_token
        if page % p:
            from memest.errors import InputError

            raise InputError(
                f"KV pages of {p} and {page} bytes cannot be unified by vLLM (not a multiple); "
                "this layer mix is not supported by vLLM's hybrid allocator"
            )
        blocks[kv] = page // p * kv.compress_rate if kv.kind == "compressed" else block_size * (page // p)
    counts = [n for _, n in attention]
    group_size = min(counts)
    if max(counts) < group_size * 1.5:
        group_size = max(counts)
    groups: list[KVGroup] = []
    for kv, n in attention:
        num_groups = -(-n // group_size)
        for i in range(num_groups):
            real = len(range(i, n, num_groups))
            groups.append(KVGroup(kv.kind, blocks[kv], kv.window, real, kv.encoder_tokens))
    return PagedLayout(tuple(groups), page, group_size, block_size)


def _mamba_hybrid_layout(
    attention: list[tuple[KVLayer, int]], states: list[tuple[KVLayer, int]], block_size: int
) -> PagedLayout:
    """Attention and state layers (mamba, linear attention, short conv: all ``MambaSpec``)."""
    attn_bpt = max((kv.bytes_per_token for kv, _ in attention), default=0)
    mamba_page = max(kv.state_bytes for kv, _ in states)
    attn_block = block_size
    if attn_bpt and attn_bpt * block_size < mamba_page:
        attn_block = 16 * -(-mamba_page // (16 * attn_bpt))
    page = max(attn_bpt * attn_block, mamba_page)
    counts = [n for _, n in attention + states]
    group_size = min(counts)
    if max(counts) < group_size * 1.5:
        group_size = max(counts)
    groups: list[KVGroup] = []
    for kv, n in attention + states:
        num_groups = -(-n // group_size)
        for i in range(num_groups):
            real = len(range(i, n, num_groups))
            groups.append(KVGroup(kv.kind, attn_block, kv.window, real, kv.encoder_tokens))
    return PagedLayout(tuple(groups), page, group_size, block_size)


def kv_bytes_per_token(spec: ModelSpec, s: ServingConfig, stage: Stage | None = None) -> int:
    """KV-cache bytes one token takes on one rank, over the rank's attention layers (windows ignored)."""
    start, stop = (stage.start, stage.stop) if stage else (0, spec.num_layers)
    return bytes_per_token(kv_layers(spec.layer_kinds(start, stop), s.parallelism.tp, kv_dtype_bytes(spec, s)))


def kv_state_bytes(spec: ModelSpec, s: ServingConfig, stage: Stage | None = None, *, transformers: bool = False) -> int:
    """Bytes one sequence holds on one rank whatever its length (:func:`state_bytes_per_sequence`;
    conv states in the served dtype, vLLM's ``mamba_cache_dtype`` auto)."""
    start, stop = (stage.start, stage.stop) if stage else (0, spec.num_layers)
    layers = kv_layers(spec.layer_kinds(start, stop), s.parallelism.tp, kv_dtype_bytes(spec, s),
                       transformers=transformers, state_e=nbytes(weight_dtype(spec, s)))
    return state_bytes_per_sequence(layers)


# ---- vLLM's DeepSeek-V4 layout ----

V4_ENTRY_BYTES = 584
"""Bytes of one DeepSeek-V4 K = V entry in vLLM's ``fp8_ds_mla`` cache: 448 fp8 NoPE + 64 bf16 RoPE (128 B) + 7
UE8M0 scales + 1 pad (``MLAAttentionSpec.real_page_size_bytes`` / ``SlidingWindowMLASpec``: ``storage_block_size *
584``, hard-coded whatever the head geometry)."""
V4_PAGE_ALIGNMENT = 576
"""FlashMLA's page alignment: every V4 page is rounded up to a multiple of 576 B (``alignment=576``,
``_apply_alignment_padding``)."""
V4_BLOCK_SIZE = 256
"""Tokens per block of V4's full groups: ``DeepseekSparseSWABackend.get_preferred_block_size`` (256); the fixed
SWA and compressor-state blocks below are sized against it ("The KV block shape [256//4, head_dim] = [64, 584]")."""
V4_SWA_BLOCK = 64
"""Tokens per page of the sliding-window cache (``DeepseekV4SWACache.block_size = 64``)."""
V4_STATE_BLOCK = {4: 4, 128: 8}
"""Tokens per page of a compressor's state cache by compress rate (``CompressorStateCache``: 4 for C4, 8 for
C128; other rates are refused)."""


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def approximate_gcd(values: list[int], lower_bound: int) -> int:
    """vLLM ``_approximate_gcd``: the d in [lower_bound, max(values)] that minimises sum(round_up(x, d) - x),
    the larger d on a tie."""
    best_d, best_pad = max(1, lower_bound), None
    for d in range(max(1, lower_bound), max(values) + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad < best_pad or (pad == best_pad and d > best_d):
            best_d, best_pad = d, pad
    return best_d


def deepseek_v4_pages(layer: LayerSpec) -> dict[str, tuple[tuple[int, int] | None, int]]:
    """The vLLM caches of one DeepSeek-V4 layer: name -> (bucket key, page bytes). The bucket key is
    ``(block_size, sliding_window)`` for the ``SlidingWindowMLASpec`` caches, None for the full
    ``MLAAttentionSpec`` ones (``group_and_unify_kv_cache_specs`` buckets them so).

    - ``swa`` (every layer, ``DeepseekV4SWACache``): 64 tokens x 584 B, aligned: 37,376 -> 37,440.
    - ``kv`` (compress rate m > 1, ``DeepseekV4MLAAttention.get_kv_cache_spec``): 256 // m entries x 584 B, aligned
      (m 4: 37,440; m 128: 1,728).
    - ``indexer`` (CSA, ``DeepseekV4IndexerCache``): 256 // m keys x (d_i + d_i / 128 x 4) B (fp8 keys and one fp32
      scale per 128), aligned (d_i 128, m 4: 64 x 132 = 8,448 -> 8,640).
    - ``state`` / ``indexer_state`` (``CompressorStateCache``): fp32 kv_state + score_state of 2 x coff x width per
      slot (coff 2 for the overlapping m = 4, else 1), window coff x m, 4 (m 4) or 8 (m 128) slots a page, aligned
      (head_dim 512: 4 x 8,192 = 8 x 4,096 = 32,768 -> 32,832; d_i 128: 4 x 2,048 = 8,192 -> 8,640).

    Raises:
        InputError: a compress rate other than 4 or 128 (``CompressorStateCache`` asserts it).
    """
    a = layer.attention
    out: dict[str, tuple[tuple[int, int] | None, int]] = {
        "swa": ((V4_SWA_BLOCK, a.sliding_window or 0), _round_up(V4_SWA_BLOCK * V4_ENTRY_BYTES, V4_PAGE_ALIGNMENT)),
    }
    m = a.compress_rate
    if m <= 1:
        return out
    if m not in V4_STATE_BLOCK:
        from memest.errors import InputError

        raise InputError(f"compress rate {m}: vLLM's DeepSeek-V4 compressor takes rates 4 and 128 only "
                         "(CompressorStateCache); serve this config with {engine} hf", field="engine")
    entries = V4_BLOCK_SIZE // m
    out["kv"] = (None, _round_up(entries * V4_ENTRY_BYTES, V4_PAGE_ALIGNMENT))
    coff = 2 if m == 4 else 1
    key = (V4_STATE_BLOCK[m], coff * m)
    out["state"] = (key, _round_up(V4_STATE_BLOCK[m] * 2 * coff * a.head_dim * FP32_BYTES, V4_PAGE_ALIGNMENT))
    if a.index_head_dim:
        d_i = a.index_head_dim
        out["indexer"] = (None, _round_up(entries * (d_i + d_i // INDEXER_QUANT_BLOCK * 4), V4_PAGE_ALIGNMENT))
        out["indexer_state"] = (key, _round_up(V4_STATE_BLOCK[m] * 2 * coff * d_i * FP32_BYTES, V4_PAGE_ALIGNMENT))
    return out


def deepseek_v4_layout(kinds: Iterable[tuple[LayerSpec, int]]) -> PagedLayout:
    """vLLM's KV-cache groups and block for DeepSeek-V4 layers (``get_kv_cache_groups``, the "DeepseekV4 case").

    Sources (vllm-project/vllm as the search index stores it): ``vllm/model_executor/layers/deepseek_v4_attention.py``
    (commit 0a291a2e; ``get_kv_cache_spec`` of the attention, ``DeepseekV4IndexerCache``),
    ``vllm/v1/attention/backends/mla/sparse_swa.py`` (03dc5649; ``DeepseekV4SWACache``, ``get_kv_cache_shape`` 584),
    ``vllm/model_executor/layers/deepseek_compressor.py`` (0de10a27; ``CompressorStateCache``),
    ``vllm/v1/kv_cache_interface.py`` (``real_page_size_bytes``, ``_apply_alignment_padding``,
    ``UniformTypeKVCacheSpecs.get_page_sizes`` / ``get_num_layer_tuples`` / ``max_memory_usage_pages``) and
    ``vllm/v1/core/kv_cache_utils.py`` of the first V4 release (``group_and_unify_kv_cache_specs``,
    ``_approximate_gcd``, ``_get_kv_cache_groups_uniform_groups``, ``_max_memory_usage_bytes_from_groups``; later
    versions pack the groups, ``_get_packed_kv_cache_layout``, which this does not follow).

    1. Each layer's caches: :func:`deepseek_v4_pages`.
    2. One full group of every ``kv`` / ``indexer`` page (block 256 tokens); its layer tuples T0 = the most layers
       sharing one page size, tuple bytes = the sum of its distinct page sizes.
    3. The sliding caches bucketed by (block, window): the SWA caches (64, window), C4 states (4, 8), C128 states
       (8, 128). Each bucket's tuple count is the most layers sharing a page size; d = approximate GCD of all counts
       (at least T0); each page is padded to the nearest full-group page size at least as large, and a bucket is
       split into ceil(layers per size / d) groups, tuples dealt round-robin.
    4. One block = tuple bytes x (the most tuples in any group), whichever group holds it; a request takes
       ceil(L / 256) full blocks and, per sliding group, ceil(min(window - 1 + max_num_batched_tokens, L) / block) + 1.

    The pages are vLLM's ``fp8_ds_mla`` layout, the only one that release runs ("DeepseekV4 only supports fp8
    kv-cache format"): ``--kv-cache-dtype`` and ``--block-size`` are not read. TP does not divide them (one KV
    head, replicated). Under pipeline parallelism each stage is grouped on its own layers (vLLM groups the whole
    model, then projects the groups on each stage: the tuple counts can differ).

    Raises:
        InputError: a compress rate vLLM's V4 does not take, or a layer mix vLLM's grouping asserts against
            (no compressed layer, a sliding page above every full page, unequal layer counts per page size).
    """
    from memest.errors import InputError

    full: list[int] = []
    buckets: dict[tuple[int, int], list[int]] = {}
    for layer, n in kinds:
        if layer.stack == "encoder" or layer.attention.kind == "none":
            continue
        for key, page in deepseek_v4_pages(layer).values():
            (full if key is None else buckets.setdefault(key, [])).extend([page] * n)
    if not full:
        raise InputError("DeepSeek-V4 under vLLM needs a compressed (CSA / HCA) layer on every pipeline stage: "
                         "vLLM's V4 grouping asserts one; use fewer {pp} stages", field="pp")
    sizes = sorted(set(full))
    tuple_bytes = sum(sizes)

    def tuples(pages: list[int]) -> int:
        return max(pages.count(p) for p in set(pages))

    counts = [tuples(full)] + [tuples(pages) for pages in buckets.values()]
    d = approximate_gcd(counts, lower_bound=counts[0])
    groups = [KVGroup("mla", V4_BLOCK_SIZE, None, len(full))]
    most = counts[0]
    for (block, window), pages in buckets.items():
        padded: dict[int, int] = {}
        for p in pages:
            bigger = [s for s in sizes if s >= p]
            if not bigger:
                raise InputError(f"a DeepSeek-V4 sliding page of {p} B exceeds every full page ({sizes[-1]} B); "
                                 "vLLM's V4 grouping asserts against it")
            padded[bigger[0]] = padded.get(bigger[0], 0) + 1
        if len(set(padded.values())) != 1:
            raise InputError(f"DeepSeek-V4 pages {sorted(padded)} of unequal layer counts {sorted(padded.values())} "
                             "in one vLLM group; vLLM's V4 grouping asserts equal counts")
        per_size = next(iter(padded.values()))
        num_groups = -(-per_size // d)
        for i in range(num_groups):
            real = len(range(i, per_size, num_groups))
            most = max(most, real)
            groups.append(KVGroup("sliding", block, window, real * len(padded)))
    return PagedLayout(tuple(groups), tuple_bytes * most, 1, V4_BLOCK_SIZE, page_covers_layers=True,
                       deepseek_v4=True)


def vllm_layout(spec: ModelSpec, kinds: list[tuple[LayerSpec, int]], tp: int, e: float, state_e: float,
                block_size: int) -> PagedLayout:
    """vLLM's pool of one rank holding ``kinds`` (a stage's layers of ``spec``): :func:`deepseek_v4_layout` for a
    model with compressed attention (DeepSeek-V4, every layer of which vLLM caches its own way), else
    :func:`paged_layout` of :func:`kv_layers` (``state_e``: their conv-state bytes)."""
    if any(layer.attention.compress_rate for layer in spec.layers):
        return deepseek_v4_layout(kinds)
    return paged_layout(kv_layers(kinds, tp, e, state_e=state_e), block_size)
