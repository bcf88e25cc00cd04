"""SGLang's start-up memory arithmetic, version by version: the static share, the KV pool, the
request table.

SGLang sizes its KV pool once, at start-up (``python/sglang/srt/model_executor/model_runner.py``,
``init_torch_distributed`` / ``profile_max_num_token`` / ``init_memory_pool``; from 0.5 the same
arithmetic in ``profile_available_bytes``)::

    total      = free memory after the CUDA context and the communicators (GiB, min over ranks)
    rest       = free after the weights are loaded - total x (1 - mem_fraction_static)
               = mem_fraction_static x total - weights
    tokens     = rest // cell_size                    # max_total_num_tokens
    tokens     = min(tokens, --max-total-tokens) // page_size x page_size

``cell_size`` is the KV bytes of one token over the rank's layers (every layer, sliding ones too,
in the versions modelled; MLA caches ``kv_lora_rank + qk_rope_head_dim`` per layer):
:func:`memest.estimate.serving.kv.kv_bytes_per_token`. What ``(1 - mem_fraction_static) x total``
leaves unallocated is SGLang's reserve for activations and the CUDA graphs captured after the pool;
memest does not size it (SGLang's default fraction is chosen so that it suffices).

After the pool SGLang allocates the request table ``ReqToTokenPool``: ``(max_num_reqs + 1) x
(context_len + 4)`` int32 entries, with ``max_num_reqs = min(max(tokens / context_len x 512, 2048),
4096)`` unless ``--max-running-requests`` is given; the scheduler runs at most
``min(max_running_requests or tokens // 2, max_num_reqs + 1)`` requests (the logged
``max_running_requests``). The K and V buffers hold ``tokens + page_size`` slots (slot 0 is padding).

The default ``mem_fraction_static`` (``python/sglang/srt/server_args.py``):

- ``0.4`` (0.4.0-0.4.8, ``ServerArgs.__post_init__``): 0.79 at tp >= 16, 0.81 at >= 8, 0.85 at
  >= 4, 0.87 at >= 2, else 0.88; ``chunked_prefill_size`` 2048 below 25,000 MiB of GPU memory,
  else 8192;
- ``0.5`` (``_handle_gpu_memory_settings``, late 2025): ``chunked_prefill_size`` and
  ``cuda_graph_max_bs`` by GPU memory (:data:`GPU_MEMORY_DEFAULTS`), then
  ``reserved = 512 + max(chunked_prefill_size, 2048) x 1.5 + cuda_graph_max_bs x 2 + tp x pp / 8 x
  1024`` MiB, at least 10 GiB on GPUs above 60 GiB, and ``mem_fraction_static = round((gpu_mem -
  reserved) / gpu_mem, 3)`` with ``gpu_mem`` the GPU's total in MiB. SGLang reads ``gpu_mem`` from
  nvidia-smi's ``memory.total`` (the smallest of the GPUs it lists, for every rank) (81,559 MiB on an H100 80GB); memest from the device's capacity
  (81,090 MiB), so its default can come out 0.001 lower (0.834 against 0.835 on an H100: 0.1% of
  the pool). Builds of 2026 that capture piecewise CUDA graphs by default also reserve 8 MiB per
  piecewise capture size before the floor (0.828 on an H100, sglang issue #29092); not modelled.

Multimodal models (:data:`MULTIMODAL_ARCHITECTURES`): 0.4's ``ModelRunner.__init__`` multiplies
``mem_fraction_static``, given or default, by 0.95 ('Automatically reduce --mem-fraction-static ...
because this is a multimodal model'). Not modelled: 0.5's ``adjust_mem_fraction_for_vlm`` (it reads
the vision tower's width and depth, which memest's model spec does not keep), speculative
decoding's draft pool, DP attention, 0.5's separate sliding-window pool for hybrid models (every
layer is counted full, as 0.4 does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memest.devices import Device, MiB

SGLANG_VERSIONS = ("0.5", "0.4")
"""The versions modelled (``--engine-version``); the first is the default (same as
:data:`memest.workload.ENGINE_VERSIONS`)."""

TP_MEM_FRACTION: tuple[tuple[int, float], ...] = ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87), (1, 0.88))
"""0.4's default mem_fraction_static by tensor-parallel degree (``ServerArgs.__post_init__``)."""

GPU_MEMORY_DEFAULTS: tuple[tuple[int, int, int, int], ...] = (
    (20 * 1024, 2048, 8, 8),
    (35 * 1024, 2048, 24, 80),
    (60 * 1024, 4096, 32, 160),
    (90 * 1024, 8192, 256, 512),
    (160 * 1024, 8192, 256, 512),
)
"""0.5 (``_handle_gpu_memory_settings``): below this many MiB of GPU memory, (chunked_prefill_size,
cuda_graph_max_bs at tp < 4, at tp >= 4); larger GPUs (B200, MI300) take 16384 and 512."""

LARGE_GPU_DEFAULTS = (16384, 512)
RESERVED_BASE_MIB = 512
"""0.5: 'constant meta data (e.g., from attention backend)'."""
RESERVED_PER_PREFILL_TOKEN_MIB = 1.5
RESERVED_PER_GRAPH_BS_MIB = 2
RESERVED_PER_EIGHTH_RANK_MIB = 1024
RESERVED_FLOOR_MIB = 10 * 1024
"""0.5: the reserve is at least this on GPUs above 60 GiB."""

MULTIMODAL_FACTOR = 0.95
"""0.4: ``self.mem_fraction_static *= 0.95`` when ``model_config.is_multimodal``."""

MULTIMODAL_ARCHITECTURES = frozenset({
    "CLIPModel", "DeepseekVL2ForCausalLM", "Gemma3ForConditionalGeneration", "Grok1VForCausalLM", "Grok1AForCausalLM",
    "LlavaLlamaForCausalLM", "Llama4ForConditionalGeneration", "LlavaMistralForCausalLM", "LlavaQwenForCausalLM",
    "LlavaVidForCausalLM", "MiniCPMO", "MiniCPMV", "MultiModalityCausalLM", "MllamaForConditionalGeneration",
    "Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
})
"""``multimodal_model_archs`` of ``python/sglang/srt/configs/model_config.py`` (0.4.4)."""

REQUESTS_PER_CONTEXT = 512
MIN_REQUESTS, MAX_REQUESTS = 2048, 4096
"""``init_memory_pool``: max_num_reqs = min(max(tokens / context_len x 512, 2048), 4096)."""

REQ_TABLE_EXTRA_TOKENS = 4
"""``ReqToTokenPool(max_context_len=context_len + 4)``."""


def chunked_prefill_default(version: str, device: Device) -> int:
    """SGLang's ``--chunked-prefill-size`` when none is given."""
    gpu_mib = device.memory_bytes / MiB
    if version == "0.4":
        return 2048 if gpu_mib < 25_000 else 8192
    for limit, chunk, _, _ in GPU_MEMORY_DEFAULTS:
        if gpu_mib < limit:
            return chunk
    return LARGE_GPU_DEFAULTS[0]


def cuda_graph_max_bs(device: Device, tp: int) -> int:
    """0.5's default ``cuda_graph_max_bs`` (it sizes the default fraction)."""
    gpu_mib = device.memory_bytes / MiB
    for limit, _, small_tp, large_tp in GPU_MEMORY_DEFAULTS:
        if gpu_mib < limit:
            return small_tp if tp < 4 else large_tp
    return LARGE_GPU_DEFAULTS[1]


def mem_fraction_static(version: str, given: float | None, default: float, architecture: str) -> float:
    """The fraction SGLang uses: ``given`` or ``default``, x 0.95 for a multimodal model in 0.4."""
    fraction = given if given is not None else default
    if version == "0.4" and architecture in MULTIMODAL_ARCHITECTURES:
        fraction *= MULTIMODAL_FACTOR
    return fraction


def default_mem_fraction_static(version: str, device: Device, tp: int, pp: int,
                                chunked_prefill_size: int | None) -> float:
    """SGLang's ``mem_fraction_static`` when none is given (see the module docstring)."""
    if version == "0.4":
        return next(f for t, f in TP_MEM_FRACTION if tp >= t)
    gpu_mib = device.memory_bytes / MiB
    chunk = chunked_prefill_size if chunked_prefill_size is not None else chunked_prefill_default(version, device)
    reserved = RESERVED_BASE_MIB + max(chunk, 2048) * RESERVED_PER_PREFILL_TOKEN_MIB
    reserved += cuda_graph_max_bs(device, tp) * RESERVED_PER_GRAPH_BS_MIB + tp * pp / 8 * RESERVED_PER_EIGHTH_RANK_MIB
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, RESERVED_FLOOR_MIB)
    return round((gpu_mib - reserved) / gpu_mib, 3)


@dataclass(frozen=True, slots=True)
class Pool:
    """SGLang's start-up numbers on one rank (bytes unless named otherwise).

    Attributes:
        total: Free memory before the weights (SGLang's ``total_gpu_memory``).
        mem_fraction_static: The fraction used.
        weights: Memory the weights took.
        cell_size: KV bytes per token on the rank.
        tokens: ``max_total_num_tokens`` (0 when nothing is left).
        page_size: Tokens per page.
    """

    total: int
    mem_fraction_static: float
    weights: int
    cell_size: int
    tokens: int
    page_size: int

    @property
    def static(self) -> int:
        """mem_fraction_static x total: what weights and KV pool may take."""
        return math.floor(self.total * self.mem_fraction_static)

    @property
    def rest(self) -> int:
        """What is left for the KV pool ('rest_memory'); negative when the weights do not fit."""
        return self.static - self.weights

    @property
    def kv_bytes(self) -> int:
        """K and V buffers together: ``tokens + page_size`` slots (the logged K size + V size)."""
        return (self.tokens + self.page_size) * self.cell_size if self.tokens > 0 else 0


def pool(total: int, mem_fraction_static: float, weights: int, cell_size: int, page_size: int,
         max_total_tokens: int | None = None) -> Pool:
    """``profile_max_num_token`` and the page alignment of ``init_memory_pool``."""
    p = Pool(total, mem_fraction_static, weights, cell_size, 0, page_size)
    if cell_size <= 0 or p.rest <= 0:
        return p
    tokens = p.rest // cell_size
    if max_total_tokens is not None:
        tokens = min(tokens, max_total_tokens)
    return Pool(total, mem_fraction_static, weights, cell_size, tokens // page_size * page_size, page_size)


def max_num_reqs(tokens: int, context_len: int, max_running_requests: int | None) -> int:
    """Rows of the request table less one (``init_memory_pool``'s ``max_num_reqs``)."""
    if max_running_requests is not None:
        return max_running_requests
    return min(max(int(tokens / context_len * REQUESTS_PER_CONTEXT), MIN_REQUESTS), MAX_REQUESTS)


def running_requests(tokens: int, context_len: int, max_running_requests: int | None) -> int:
    """The scheduler's ``max_running_requests`` (the logged figure): the given cap or half the
    pool's tokens, at most the request table's rows."""
    cap = max_running_requests if max_running_requests is not None else tokens // 2
    return min(cap, max_num_reqs(tokens, context_len, max_running_requests) + 1)


def req_to_token_bytes(tokens: int, context_len: int, max_running_requests: int | None) -> int:
    """The request table ``ReqToTokenPool``: (max_num_reqs + 1) x (context_len + 4) int32."""
    return (max_num_reqs(tokens, context_len, max_running_requests) + 1) * (context_len + REQ_TABLE_EXTRA_TOKENS) * 4
