"""Ollama: its defaults and its own pre-load estimate of the layer split (Ollama v0.11.6).

Defaults (``envconfig/config.go``, ``api/types.go`` ``DefaultOptions``): ``num_ctx`` 4096
(``OLLAMA_CONTEXT_LENGTH``), ``num_batch`` 512, ``num_gpu`` -1 (as many layers as fit), flash
attention off (``OLLAMA_FLASH_ATTENTION``), the KV cache in f16 unless flash attention is on and
``OLLAMA_KV_CACHE_TYPE`` names q8_0 or q4_0; the library's default tags are Q4_K_M files.

The estimate (``llm/memory.go`` ``estimateGPULayers``; ``fs/ggml/ggml.go`` ``GraphSize``), made
before loading, decides how many layers go to the GPU:

- KV per layer = context x (d_k + d_v) x k x bytes per element, context = num_ctx x num_parallel
  (the one per-token rule of :mod:`memest.estimate.serving.kv`, at Ollama's bytes per element:
  f16 2, q8_0 1, q4_0 0.5, ``kvCacheBytesPerElement``: not the 34 / 32 of llama.cpp's q8_0 blocks);
  Gemma 3's local layers (all but every 6th) hold ``num_parallel x sliding_window + batch`` cells;
- the graph: per architecture formulas (``llama``; ``gemma``/``gemma2``/``gemma3``; ``qwen2``),
  ``fullOffload`` when every layer is on the GPU, ``partialOffload`` otherwise; another architecture
  gets ``partial = gqa x kv_total / 6``, ``full = partial``;
- layers are placed from the last block down while ``free > used + graph + layer`` (used starts at
  one block + its KV as a buffer), then the output layer (output norm + output, or the tied
  ``token_embd``); ``memory.required.partial`` is what the GPUs get, ``.full`` adds the overflow.

Ollama's ``vocab`` is the tokenizer's token count; memest uses the config's vocab_size. Vision
projectors (``projector.weights`` / ``.graph``) are not modelled.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from memest.devices import Device, Fleet
from memest.estimate.serving.kv import kv_layer
from memest.estimate.serving.llamacpp import engine
from memest.result import Estimate
from memest.spec import ModelSpec
from memest.workload import ServingConfig

VERSION = "0.11.6"
DEFAULT_NUM_CTX = 4096
DEFAULT_NUM_BATCH = 512
KV_BYTES = {"q8_0": 1.0, "q4_0": 0.5}
"""``kvCacheBytesPerElement``; any other type counts 2 (f16)."""
MINIMUM_MEMORY = {"nvidia": 457 * 2**20, "amd": 457 * 2**20, "apple": 512 * 2**20}
"""``MinimumMemory`` each GPU keeps free (``discover/gpu.go`` ``cudaMinimumMemory`` /
``rocmMinimumMemory``, ``gpu_darwin.go`` ``metalMinimumMemory``)."""
GEMMA3_GLOBAL_EVERY = 6
"""``gemma3GlobalCacheCount``: every 6th layer of Gemma 3 keeps the full context."""


def _arch(spec: ModelSpec) -> str:
    t = spec.model_type
    if t in ("llama", "mistral"):
        return "llama"
    if t in ("gemma", "gemma2", "gemma3", "gemma3_text"):
        return "gemma3" if t.startswith("gemma3") else t
    return t


@dataclass(frozen=True, slots=True)
class OllamaEstimate:
    """Ollama's pre-load estimate (the ``msg=offload`` log line).

    Attributes:
        layers_model: Blocks + 1 (``layers.model``).
        layers_offload: Layers it puts on the GPUs (``layers.offload``).
        required_full: ``memory.required.full``.
        required_partial: ``memory.required.partial`` (what the GPUs get).
        kv: ``memory.required.kv``.
        weights_repeating: ``memory.weights.repeating`` (the blocks).
        weights_nonrepeating: ``memory.weights.nonrepeating`` (the output layer).
        graph_full: ``memory.graph.full``.
        graph_partial: ``memory.graph.partial``.
        allocations: Per GPU (``memory.required.allocations``).
        layer_counts: Layers placed per GPU (``layerCounts``: the ``--tensor-split`` Ollama passes to
            llama.cpp when there are several GPUs).
    """

    layers_model: int
    layers_offload: int
    required_full: int
    required_partial: int
    kv: int
    weights_repeating: int
    weights_nonrepeating: int
    graph_full: int
    graph_partial: int
    allocations: tuple[int, ...]
    layer_counts: tuple[int, ...] = ()

    @property
    def weights_total(self) -> int:
        """``memory.weights.total``."""
        return self.weights_repeating + self.weights_nonrepeating


def kv_cache_type(s: ServingConfig) -> str:
    """The KV type Ollama uses: the asked one only with flash attention, else f16."""
    asked = s.kv_cache_dtype.lower()
    return asked if s.flash_attn and asked in KV_BYTES else "f16"


def graph_sizes(spec: ModelSpec, context: int, batch: int, kv_total: int) -> tuple[int, int]:
    """(partialOffload, fullOffload) of ``GraphSize`` for the model's architecture."""
    emb, vocab = spec.hidden_size, spec.vocab_size
    heads, heads_kv = spec.num_heads, max(1, spec.num_kv_heads)
    head_k = spec.head_dim
    arch = _arch(spec)
    if arch == "llama":
        full = max(4 * batch * (1 + 4 * emb + context * (1 + heads)), 4 * batch * (emb + vocab))
        partial = 4 * batch * emb + max(
            4 * batch * (1 + emb + max(context, emb)) + emb * emb * 9 // 16
            + 4 * context * (batch * heads + head_k * heads_kv),
            4 * batch * (emb + vocab) + emb * vocab * 105 // 128)
        return partial, full
    if arch in ("gemma", "gemma2", "gemma3"):
        full = max(4 * batch * (emb + vocab),
                   4 * batch * (2 + context + context * heads + 2 * emb + 2 * head_k * heads))
        partial = max(4 * emb * batch + emb * vocab * 105 // 128 + 4 * vocab * batch,
                      4 * batch * (2 * emb + 1 + 2 * head_k * heads + context + context * heads)
                      + 4 * head_k * context * 8 + emb * head_k * heads * 9 // 16)
        return partial, full
    if arch == "qwen2":
        full = max(4 * batch * (emb + vocab), 4 * batch * (1 + 2 * emb + context + context * heads))
        partial = max(4 * batch * (emb + vocab) + emb * vocab * 105 // 128,
                      4 * (batch * (1 + 2 * emb + context * (1 + heads)) + emb * (1 + context)))
        return partial, full
    partial = heads // heads_kv * kv_total // 6
    return partial, partial


def estimate_layers(spec: ModelSpec, s: ServingConfig, available: tuple[int, ...], overhead: int = 0,
                    minimum: int = MINIMUM_MEMORY["nvidia"], projector: tuple[int, int] = (0, 0)) -> OllamaEstimate:
    """Ollama's ``estimateGPULayers`` for GPUs with ``available`` free bytes each (module docstring).

    Args:
        spec: The model.
        s: The serving job (Ollama's settings).
        available: Free bytes per GPU.
        overhead: ``OLLAMA_GPU_OVERHEAD``.
        minimum: ``MinimumMemory`` of the GPUs.
        projector: Vision projector weights and graph bytes, which the Ollama engine loads with the
            output layer (``VisionGraphSize``; not modelled by memest: pass them when known).

    Raises:
        InputError: an unknown file type.
    """
    tensors = engine.file_tensors(spec, s)
    n_layer = spec.num_layers
    num_parallel = max(1, s.batch_size)
    num_ctx = s.max_model_len or DEFAULT_NUM_CTX
    context = num_ctx * num_parallel
    batch = min(num_ctx, s.n_batch or DEFAULT_NUM_BATCH)
    e = 2.0 if kv_cache_type(s) == "f16" else KV_BYTES[kv_cache_type(s)]
    kv = []
    arch = _arch(spec)
    for il, layer in enumerate(spec.layers):
        cache = kv_layer(layer, 1, e)
        cells = context
        if arch == "gemma3" and (il + 1) % GEMMA3_GLOBAL_EVERY and layer.attention.sliding_window:
            cells = num_parallel * layer.attention.sliding_window + batch
        kv.append(cache.bytes_per_token * cells if cache is not None else 0)
    kv_total = sum(kv)
    partial, full = graph_sizes(spec, context, batch, kv_total)
    if len(available) > 1:
        full = partial
    blocks = [0] * n_layer
    output = 0
    for t in tensors:
        if t.layer is not None:
            blocks[t.layer] += t.nbytes
    tied = not any(t.category == "output" for t in tensors)
    for t in tensors:
        if t.category in ("output", "output_norm") or (tied and t.category == "token_embd"):
            output += t.nbytes
    graph = max(partial, full)
    layer0 = blocks[0] + kv[0] if n_layer else 0
    gpus = [j for j, free in enumerate(available) if free >= overhead + graph + minimum + 2 * layer0]
    alloc = [0] * len(available)
    for j in gpus:
        alloc[j] += minimum + layer0
    split = [0] * len(available)
    count = overflow = 0
    ngl = s.n_gpu_layers
    for il in range(n_layer - 1, -1, -1):
        size = blocks[il] + kv[il]
        if ngl is not None and count >= ngl:
            overflow += size
            continue
        placed = False
        while gpus:
            j = gpus[il % len(gpus)]
            if available[j] > overhead + alloc[j] + graph + size:
                alloc[j] += size
                split[j] += 1
                count += 1
                placed = True
                break
            gpus.remove(j)
        if not placed:
            overflow += size
    fully = count >= n_layer
    last = output + sum(projector)
    if last and (ngl is None or count < ngl):
        for k in range(len(gpus), 0, -1):
            j = gpus[count % k]
            if available[j] > overhead + alloc[j] + graph + last:
                alloc[j] += last
                split[j] += 1
                count += 1
                break
    if count < n_layer + 1:
        fully = False
        overflow += last
    for j in range(len(available)):
        if split[j] > 0:
            alloc[j] += full if fully else partial
    req_partial = sum(alloc)
    return OllamaEstimate(n_layer + 1, count, req_partial + overflow, req_partial, kv_total, sum(blocks), output,
                          full, partial, tuple(alloc), tuple(split))


def estimate_ollama(spec: ModelSpec, s: ServingConfig, device: Device | Fleet) -> Estimate:
    """Ollama's placement on ``device`` (its own estimate, whose layer count it then runs with), and
    llama.cpp's buffers at that ``-ngl`` (:func:`engine.estimate_llamacpp`). On unlike devices (a
    :class:`~memest.devices.Fleet`) each GPU's free memory is its own, and the layer counts Ollama
    placed become llama.cpp's tensor split (``llm/memory.go``: ``tensorSplit`` = the layer counts when
    there are several GPUs; ``llm/server.go`` passes it as ``--tensor-split``)."""
    n_dev = s.parallelism.world_size
    devs = engine.devices_of(device, n_dev)
    est = estimate_layers(spec, s, tuple(d.memory_bytes for d in devs),
                          minimum=max(MINIMUM_MEMORY.get(d.vendor, MINIMUM_MEMORY["nvidia"]) for d in devs))
    # alike GPUs keep llama.cpp's even split (Ollama's round-robin counts differ from it by a layer at most)
    split = est.layer_counts if isinstance(device, Fleet) and device.mixed and not s.tensor_split else s.tensor_split
    if split and not any(split):
        split = ()  # nothing on the GPUs: llama.cpp's all-zero split is its default
    run = s.replace(n_gpu_layers=est.layers_offload, kv_cache_dtype=kv_cache_type(s),
                    max_model_len=s.max_model_len or DEFAULT_NUM_CTX, n_batch=s.n_batch or DEFAULT_NUM_BATCH,
                    n_ubatch=s.n_ubatch or s.n_batch or DEFAULT_NUM_BATCH, tensor_split=tuple(float(x) for x in split))
    base = engine.estimate_llamacpp(spec, run, device)
    assert base.serving is not None
    summary = dataclasses.replace(base.serving, engine="ollama", engine_version=VERSION)
    assumptions = (f"Ollama {VERSION}: its estimate puts {est.layers_offload}/{est.layers_model} layers on the GPU "
                   f"(required full {est.required_full / 2**30:.1f} GiB, partial {est.required_partial / 2**30:.1f} "
                   f"GiB, KV {est.kv / 2**20:.1f} MiB, graph {est.graph_full / 2**20:.1f} / "
                   f"{est.graph_partial / 2**20:.1f} MiB full / partial)", *base.assumptions)
    extra = {**base.extra, "ollama_layers_offload": est.layers_offload, "ollama_required_full_bytes": est.required_full,
             "ollama_required_partial_bytes": est.required_partial}
    return Estimate(ranks=base.ranks, assumptions=assumptions, serving=summary, host_bytes=base.host_bytes, extra=extra)

