"""llama.cpp's memory at start-up (llama.cpp b4715, ``llama-cli`` / ``llama-server``), per device and in host RAM.

Symbols: L layers, h n_embd, a heads, q = a x d and g = k x d (``n_embd_k_gqa``) widths, f n_ff,
V n_vocab, c = n_ctx, u = n_ubatch.

- **n_ctx** (``-c``) = ``--max-model-len`` x ``--batch-size``: llama-server splits ``-c`` over its
  ``-np`` slots, so batch_size sequences of max_model_len tokens need that many cells (Ollama
  multiplies num_ctx by num_parallel the same way); max_model_len defaults to 4096
  (``common_params.n_ctx``, ``common/common.h``). Padded to 32 cells, 256 with flash attention
  (``llama_kv_cache_get_padding``, ``src/llama.cpp`` b4715: ``GGML_PAD(n_ctx, padding)``).
  ``n_batch`` is at most n_ctx and ``n_ubatch`` at most n_batch (``llama_init_from_model``).
- **Layer placement** (``llm_load_tensors``, ``src/llama-model.cpp``): the last ``-ngl`` of the L + 1
  layers (the blocks, then the output layer) go to the GPUs; ``i_gpu_start = max(L - ngl, 0)``, and
  layer ``il`` goes to the first device whose cumulative ``--tensor-split`` share exceeds
  ``(il - i_gpu_start) / min(ngl, L + 1)`` (``std::upper_bound`` over the normalised cumulative
  split, all in C ``float``; default split: each device's free memory, ``ggml_backend_dev_memory``,
  which is its capacity less llama.cpp's context: ``llama_model::load_tensors``, read in the
  ``pimpl->dev_layer`` code of early 2025 that b4715 has, unchanged since in later builds). Unlike
  devices (a :class:`memest.devices.Fleet`, CUDA0 first) each get their own buffers, context and fit.
  The output layer (output norm and
  matrix; for tied embeddings a duplicate of ``token_embd``) is on the GPU only when ngl > L. The
  token embedding always stays in host RAM (the input layer is the CPU).
- **Model buffers**: each tensor's bytes (:mod:`.quant`), on CUDA with quantized rows padded to 512
  elements (``MATRIX_ROW_PADDING``, ``ggml-cuda.cu`` ``get_alloc_size``) and every tensor aligned to
  128 B; what stays on the host is the mmapped file (``CPU_Mapped``: page cache, not an extra copy).
- **KV cache** (``llama_kv_cache_init``): every layer holds c cells of K and V, ``ggml_row_size(type_k,
  g) + ggml_row_size(type_v, g)`` per cell: the per-token rule of :mod:`memest.estimate.serving.kv`
  with the bytes per element of the cache type (q8_0: 34 B per 32 = 1.0625; q4_0: 18 / 32). It sits
  with its layer (``offload_kqv``, the default). b4715 has no sliding-window cache: Gemma 2/3 keep c
  cells in every layer. MLA models get memest's latent rule (576 elements per token for DeepSeek-V3),
  which is what later builds cache; b4715 still cached full per-head K and V for them (not
  modelled). A quantized V cache needs flash attention (``llama_init_from_model``:
  "V cache quantization requires flash_attn").
- **Output buffer**: logits of n_seq_max outputs, V x 4 B each, in pinned host memory
  (``llama_output_reserve``).
- **Compute buffers**: ggml-alloc's high-water mark over the worst-case graph (u tokens against c
  cells, ``llm_build_context`` with ``worst_case``). On a GPU: the split inputs copied to it (the
  hidden state, u x h f32, and the KQ mask, c x pad(u, 32) f32) plus the largest of the attention
  block (the norm, Q, K, V and roped-Q outputs, u x (h + 2q + 2g) f32, below the scores, which
  without flash attention are c x u x a f32), the MLP (u x (2h + f x (3 if gated else 1)) f32) and,
  on the device with the output layer, the logits (u x V f32). The attention order was derived from
  ``llm_build_gptneox``'s graph and reproduces the CI logs of pythia-2.8b exactly (162.00 MiB); other
  architectures order their graphs alike but were not checked against a log. On the host:
  ``get_rows`` of the token embedding (u x h f32), the KQ mask and the token / position / output-id
  inputs (3 x u x 4 B). Pipeline parallelism over several GPUs (``n_copies = 4`` copies of the
  inputs, ``GGML_SCHED_MAX_COPIES``) is not modelled.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from memest.devices import Device, Fleet
from memest.errors import InputError
from memest.estimate.serving.kv import kv_layer
from memest.estimate.serving.llamacpp.quant import GGUFTensor, file_type, quantized_tensors, source_tensors, type_counts
from memest.result import Estimate, Kind, RankEstimate, ServingSummary, Term
from memest.sources.ggml_types import GGMLType, ggml_type
from memest.spec import ModelSpec
from memest.workload import Engine, ServingConfig

BUILD = "b4715"
"""The llama.cpp build modelled (ggml-org/llama.cpp 3d68f034d, Feb 2025)."""
DEFAULT_N_CTX = 4096
"""``common_params.n_ctx`` (``common/common.h``, b4715)."""
DEFAULT_N_BATCH = 2048
"""``common_params.n_batch``."""
DEFAULT_N_UBATCH = 512
"""``common_params.n_ubatch``."""
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
"""``-ctk`` / ``-ctv`` values (``common/arg.cpp`` ``kv_cache_types``)."""
KV_PAD, KV_PAD_FLASH = 32, 256
"""``llama_kv_cache_get_padding``: cells n_ctx is padded to."""
KQ_MASK_PAD = 32
"""``GGML_KQ_MASK_PAD`` (``ggml/include/ggml.h``, b4715): rows of the KQ mask padded to it."""
CUDA_ALIGN = 128
"""``ggml_backend_cuda_buffer_type_get_alignment``."""
MATRIX_ROW_PADDING = 512
"""``ggml-cuda/common.cuh``: quantized rows padded to this many elements in CUDA buffers."""
F32 = 4
CUDA_CONTEXT = 319 * 2**20
"""What a llama.cpp process holds on a GPU before its first buffer: fitted to the ggml-org CI logs of
``benchmarks/data/llamacpp_cases.json`` (llamacpp_b4715_pythia28b_*_v100: 'using device CUDA0
(Tesla V100-PCIE-16GB) - 15841 MiB free' of the V100's 16,160 MiB NVML total = 319 MiB). No torch:
smaller than memest's PyTorch context (:func:`memest.estimate.runtime.cuda_context_bytes`)."""


def context_bytes(device: Device) -> int:
    """llama.cpp's context on ``device``: :data:`CUDA_CONTEXT` on CUDA / ROCm GPUs, 0 elsewhere (CPU;
    Metal's unified memory has no separate context)."""
    return CUDA_CONTEXT if device.vendor in ("nvidia", "amd") and device.kind != "cpu" else 0


def free_bytes(device: Device) -> int:
    """What ``ggml_backend_dev_memory`` reports free on ``device`` when the model loads: its capacity less
    llama.cpp's context (the CI logs' 'V100-PCIE-16GB - 15841 MiB free' of 16,160 MiB); the default
    ``--tensor-split``."""
    return device.memory_bytes - context_bytes(device)


def devices_of(device: Device | Fleet, count: int) -> tuple[Device, ...]:
    """The job's devices in order: a fleet's, or ``count`` x ``device``."""
    return device.devices if isinstance(device, Fleet) else (device,) * count


@dataclass(frozen=True, slots=True)
class Settings:
    """The resolved llama.cpp settings of a serving job.

    Attributes:
        file_type: The GGUF file type (``q4_k_m``), or ``gguf`` for a file's own tensors.
        type_k: K cache type.
        type_v: V cache type.
        n_ctx: KV cells, padded.
        n_batch: Logical batch.
        n_ubatch: Physical batch (tokens of the worst-case graph).
        n_gpu_layers: Layers (of L + 1) offloaded.
        flash_attn: ``-fa``.
        split: Each device's weight in the layer split as llama.cpp reads it (``--tensor-split``, or each
            device's free bytes); :func:`layer_devices` normalises it.
        n_seq: Sequences (output rows of the output buffer; llama-server ``-np``).
    """

    file_type: str
    type_k: GGMLType
    type_v: GGMLType
    n_ctx: int
    n_batch: int
    n_ubatch: int
    n_gpu_layers: int
    flash_attn: bool
    split: tuple[float, ...]
    n_seq: int


def kv_type(name: str) -> GGMLType:
    """The cache type of ``--kv-cache-dtype`` (``auto`` = f16; fp16/bf16 spelled either way).

    Raises:
        InputError: not a llama.cpp cache type (the message names them).
    """
    key = {"auto": "f16", "fp16": "f16", "float16": "f16", "fp32": "f32", "float32": "f32",
           "bfloat16": "bf16"}.get(name.lower(), name.lower())
    if key not in KV_TYPES:
        raise InputError(f"{{kv_cache_dtype}} {name!r} is not a llama.cpp cache type (-ctk / -ctv); use one of "
                         f"{', '.join(KV_TYPES)}", field="kv_cache_dtype")
    return ggml_type(key)


def default_file_type(s: ServingConfig) -> str:
    """``--quantization`` for llama.cpp: ``none`` is the f16 file ``convert_hf_to_gguf.py`` writes;
    for Ollama its library tags' Q4_K_M."""
    if s.quantization != "none":
        return file_type(s.quantization)
    return "q4_k_m" if s.engine is Engine.OLLAMA else "f16"


def settings(spec: ModelSpec, s: ServingConfig, devices: int | tuple[Device, ...] = 1) -> Settings:
    """llama.cpp's settings for the job, checked as llama.cpp checks them. ``devices``: how many alike
    GPUs, or the GPUs themselves (the default split is their free memory, :func:`free_bytes`).

    Raises:
        InputError: an unknown file or cache type; a quantized V cache without flash attention;
            ``-ngl`` above L + 1; a ``--tensor-split`` that does not match the devices; sizes below 1.
    """
    if s.gguf_tensors:
        check_header(spec, s.gguf_tensors)
    ftype = "gguf" if s.gguf_tensors else default_file_type(s)
    tk = kv_type(s.kv_cache_dtype)
    tv = tk
    if tv.quantized and not s.flash_attn:
        raise InputError(f"{{kv_cache_dtype}} {s.kv_cache_dtype} quantizes the V cache, which llama.cpp allows only "
                         "with flash attention ('V cache quantization requires flash_attn'); add {flash_attn} or use "
                         "f16", field="kv_cache_dtype")
    n_ctx = (s.max_model_len or DEFAULT_N_CTX) * max(1, s.batch_size)
    pad = KV_PAD_FLASH if s.flash_attn else KV_PAD
    n_ctx = -(-n_ctx // pad) * pad
    for name, value in (("n_batch", s.n_batch), ("n_ubatch", s.n_ubatch)):
        if value is not None and value < 1:
            raise InputError(f"{{{name}}} is {value}; it must be a positive integer", field=name)
    n_batch = min(n_ctx, s.n_batch or DEFAULT_N_BATCH)
    n_ubatch = min(n_batch, s.n_ubatch or DEFAULT_N_UBATCH)
    layers = spec.num_layers
    ngl = layers + 1 if s.n_gpu_layers is None else s.n_gpu_layers
    if ngl < 0 or ngl > layers + 1:
        raise InputError(f"{{n_gpu_layers}} {ngl} is outside 0..{layers + 1} ({spec.name} has {layers} layers plus the "
                         f"output layer); use {{n_gpu_layers}} {layers + 1} (or -1) to offload them all", field="n_gpu_layers")
    listed = devices if isinstance(devices, tuple) else ()
    n_dev = len(listed) if listed else int(devices)
    split = s.tensor_split or (tuple(float(free_bytes(d)) for d in listed) if listed else (1.0,) * n_dev)
    if len(split) != n_dev:
        which = (f"the {n_dev} devices of {{gpu}} {','.join(d.ref for d in listed)}" if len(set(listed)) > 1 else
                 f"{n_dev} device{'s' if n_dev > 1 else ''}")
        raise InputError(f"{{tensor_split}} {','.join(f'{x:g}' for x in split)} has {len(split)} shares for "
                         f"{which}; give one share per device" + ("" if listed else f" ({{gpus}} {n_dev})"),
                         field="tensor_split")
    if any(x < 0 for x in split) or sum(split) <= 0:
        raise InputError(f"{{tensor_split}} {','.join(f'{x:g}' for x in split)} must be shares >= 0 with a positive "
                         "sum", field="tensor_split")
    for layer, _ in spec.layer_kinds():
        g = layer.attention.num_kv_heads * layer.attention.head_dim
        if layer.attention.kind == "gqa" and g % tk.block:
            raise InputError(f"{{kv_cache_dtype}} {tk.name}: the {g} K/V elements per cell of {spec.name} are not a "
                             f"multiple of its block of {tk.block}; use f16", field="kv_cache_dtype")
    return Settings(ftype, tk, tv, n_ctx, n_batch, n_ubatch, ngl, s.flash_attn, tuple(split), max(1, s.batch_size))


MATRIX_CATEGORIES = ("attn_qkv", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
"""The layer weights a GGUF file names the same whatever the architecture (``blk.N.<category>...``;
``ffn_up_exps`` / ``ffn_up_shexp`` are experts of ``ffn_up``)."""


def check_header(spec: ModelSpec, tensors: tuple[tuple[str, str, tuple[int, ...]], ...]) -> None:
    """Refuse a ``gguf`` header that is not the model's: another layer count (the ``blk.N`` blocks),
    another hidden size (``token_embd.weight``'s row length), or layer weights of another layout (an
    attention or FFN matrix of the model no block tensor of the file names).

    Raises:
        InputError: the header does not match ``spec``; the message gives both.
    """
    blocks = {int(name.split(".")[1]) for name, _, _ in tensors if name.startswith("blk.") and
              name.split(".")[1].isdigit()}
    layers = max(blocks) + 1 if blocks else 0
    embd = next((shape for name, _, shape in tensors if name == "token_embd.weight"), None)
    hidden = embd[-1] if embd else None
    have = {name.split(".")[2] for name, _, _ in tensors if name.startswith("blk.") and name.count(".") >= 3}
    want = sorted({t.category for t in source_tensors(spec) if t.layer is not None and t.category in MATRIX_CATEGORIES})
    missing = [c for c in want if not any(h == c or h.startswith(c + "_") for h in have)]
    problems = []
    if layers != spec.num_layers or (hidden is not None and hidden != spec.hidden_size):
        problems.append(f"{layers} layers, hidden size {hidden if hidden is not None else '?'} (the model: "
                        f"{spec.num_layers} layers, hidden size {spec.hidden_size})")
    if missing:
        problems.append(f"no {', '.join(missing)} tensors (the model's layers have them)")
    if problems:
        raise InputError(f"the {{gguf}} file is not a GGUF of {spec.name}: its header has {'; '.join(problems)}; "
                         "give the .gguf converted from this model, or drop {gguf} to size the quantization",
                         field="gguf")


def file_tensors(spec: ModelSpec, s: ServingConfig) -> list[GGUFTensor]:
    """The GGUF tensors: from the file's header when ``--gguf`` was given, else as llama-quantize makes
    them (:func:`memest.estimate.serving.llamacpp.quant.quantized_tensors`)."""
    if s.gguf_tensors:
        out = []
        for name, tname, shape in s.gguf_tensors:
            layer = int(name.split(".")[1]) if name.startswith("blk.") else None
            cat = name.split(".")[-2] if name.count(".") >= 1 else name
            if name.startswith("blk."):
                cat = name.split(".")[2]
            out.append(GGUFTensor(name, cat, layer, tuple(shape), ggml_type(tname)))
        return out
    return quantized_tensors(spec, default_file_type(s))


def _f32(x: float) -> float:
    """``x`` as a C ``float`` (llama.cpp computes the split points in float)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def layer_devices(n_layer: int, ngl: int, split: tuple[float, ...]) -> list[int | None]:
    """The device of each of the L + 1 layers (index L is the output layer); None = host (module
    docstring: ``llama_model::load_tensors``). ``split``: each device's weight (any scale), summed and
    normalised in float as llama.cpp does (``split_sum += splits[i]; splits[i] = split_sum``, then
    ``splits[i] /= split_sum``); a layer goes to ``std::upper_bound(splits, float(il - i_gpu_start) /
    act_gpu_layers)``, the first device whose edge is strictly above it."""
    start = max(n_layer - ngl, 0)
    act = min(ngl, n_layer + 1)
    cum, acc = [], 0.0
    for x in split:
        acc = _f32(acc + _f32(x))
        cum.append(acc)
    cum = [_f32(edge / acc) for edge in cum]

    def device(il: int) -> int:
        pos = _f32(_f32(il - start) / act)
        for j, edge in enumerate(cum):
            if pos < edge:
                return j
        return len(cum) - 1

    out: list[int | None] = [device(il) if il >= start and act else None for il in range(n_layer)]
    out.append(device(act - 1 + start) if ngl > n_layer else None)
    return out


def _cuda_bytes(t: GGUFTensor) -> int:
    n = t.nbytes
    ncols = t.shape[-1]
    if t.type.quantized and ncols % MATRIX_ROW_PADDING:
        n += t.type.row_bytes(MATRIX_ROW_PADDING - ncols % MATRIX_ROW_PADDING)
    return -(-n // CUDA_ALIGN) * CUDA_ALIGN


@dataclass(frozen=True, slots=True)
class DeviceBuffers:
    """What llama.cpp allocates on one GPU.

    Attributes:
        layers: Block indices on it (the output layer counted in ``output``).
        output: True when the output layer is on it.
        model: Model buffer (``CUDA0 model buffer size``).
        kv: KV buffer (``CUDA0 KV buffer size``).
        compute: Compute buffer (``CUDA0 compute buffer size``).
    """

    layers: tuple[int, ...]
    output: bool
    model: int
    kv: int
    compute: int


@dataclass(frozen=True, slots=True)
class Buffers:
    """llama.cpp's buffers at start-up.

    Attributes:
        settings: The resolved settings.
        devices: Per GPU.
        host_model: The mmapped file's tensors used from host RAM (``CPU_Mapped model buffer size``).
        host_kv: KV of the layers left in host RAM.
        host_compute: Host compute buffer (``CUDA_Host compute buffer size``).
        output: Output buffer (``CUDA_Host output buffer size``).
        k_bytes: K cache, all layers.
        v_bytes: V cache, all layers.
        file_bytes: All tensors of the file.
        type_counts: Tensors per ggml type.
        n_layer: Blocks (L).
        offloaded: Layers of L + 1 on the GPUs.
    """

    settings: Settings
    devices: tuple[DeviceBuffers, ...]
    host_model: int
    host_kv: int
    host_compute: int
    output: int
    k_bytes: int
    v_bytes: int
    file_bytes: int
    type_counts: dict[str, int]
    n_layer: int
    offloaded: int

    @property
    def host_bytes(self) -> int:
        """Host RAM: the file's pages in use from the host, host KV, host compute and output buffers."""
        return self.host_model + self.host_kv + self.host_compute + self.output


def _kv_cell_bytes(spec: ModelSpec, il: int, st: Settings) -> tuple[int, int]:
    """K and V bytes of one cell of layer ``il`` (the one per-token rule of :mod:`.kv` at the bytes per
    element of type_k and type_v; its K share is d / (d + d_v))."""
    layer = spec.layers[il]
    a = layer.attention
    k = kv_layer(layer, 1, st.type_k.bytes_per_element)
    v = kv_layer(layer, 1, st.type_v.bytes_per_element)
    if k is None or v is None or not k.is_attention:
        return 0, 0
    d, dv = a.head_dim, a.v_head_dim
    return k.bytes_per_token * d // (d + dv), v.bytes_per_token * dv // (d + dv)


def _compute_gpu(spec: ModelSpec, st: Settings, layers: tuple[int, ...], output: bool) -> int:
    """One GPU's compute buffer (module docstring)."""
    if not layers and not output:
        return 0
    u, c, h = st.n_ubatch, st.n_ctx, spec.hidden_size
    inputs = u * h * F32 + c * _pad(u, KQ_MASK_PAD) * F32
    worst = 0
    for il in dict.fromkeys(layers):
        a, mlp = spec.layers[il].attention, spec.layers[il].mlp
        q, g = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        attn = u * (h + 2 * q + 2 * g) * F32
        attn += u * q * F32 if st.flash_attn else c * u * a.num_heads * F32
        ffn = u * (2 * h + mlp.intermediate_size * max(1, mlp.num_experts_per_tok) * (3 if mlp.gated else 1)) * F32
        worst = max(worst, attn, ffn)
    if output:
        worst = max(worst, u * (h + spec.vocab_size) * F32)
    return inputs + worst


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


def buffers(spec: ModelSpec, s: ServingConfig, devices: int | tuple[Device, ...] = 1) -> Buffers:
    """llama.cpp's buffers for the job on ``devices`` GPUs (a count of alike GPUs, or the GPUs; module
    docstring).

    Raises:
        InputError: invalid settings (:func:`settings`).
    """
    st = settings(spec, s, devices)
    devices = len(devices) if isinstance(devices, tuple) else devices
    tensors = file_tensors(spec, s)
    n_layer = spec.num_layers
    where = layer_devices(n_layer, st.n_gpu_layers, st.split)
    model = [0] * devices
    host_model = 0
    tied = not any(t.category == "output" for t in tensors)
    for t in tensors:
        if t.layer is not None:
            dev = where[t.layer]
        elif t.category in ("output", "output_norm"):
            dev = where[n_layer]
        else:
            dev = None  # input layer: token / position embeddings
        if dev is None:
            host_model += t.nbytes
        else:
            model[dev] += _cuda_bytes(t)
        if tied and t.category == "token_embd" and where[n_layer] is not None:
            model[where[n_layer]] += _cuda_bytes(t)  # TENSOR_DUPLICATED as the output matrix
    kv = [0] * devices
    host_kv = k_total = v_total = 0
    for il in range(n_layer):
        kb, vb = _kv_cell_bytes(spec, il, st)
        k_total += kb * st.n_ctx
        v_total += vb * st.n_ctx
        dev = where[il]
        if dev is None:
            host_kv += (kb + vb) * st.n_ctx
        else:
            kv[dev] += (kb + vb) * st.n_ctx
    u, h = st.n_ubatch, spec.hidden_size
    per_dev = []
    for j in range(devices):
        layers = tuple(il for il in range(n_layer) if where[il] == j)
        out = where[n_layer] == j
        per_dev.append(DeviceBuffers(layers, out, model[j], kv[j], _compute_gpu(spec, st, layers, out)))
    host_compute = u * h * F32 + st.n_ctx * _pad(u, KQ_MASK_PAD) * F32 + 3 * u * 4
    on_host = tuple(il for il in range(n_layer) if where[il] is None)
    if on_host or where[n_layer] is None:
        host_compute += _compute_gpu(spec, st, on_host, where[n_layer] is None) - (u * h * F32 + st.n_ctx
                                                                                  * _pad(u, KQ_MASK_PAD) * F32)
    output = st.n_seq * spec.vocab_size * F32
    offloaded = sum(1 for d in where if d is not None)
    return Buffers(st, tuple(per_dev), host_model, host_kv, host_compute, output, k_total, v_total,
                   sum(t.nbytes for t in tensors), type_counts(tensors), n_layer, offloaded)


def _device_label(j: int, d: DeviceBuffers, device: Device | None = None) -> str:
    if not d.layers:
        span = "output layer" if d.output else "no layers"
    else:
        span = f"layers {d.layers[0]}-{d.layers[-1]}" + (" + output" if d.output else "")
    return f"CUDA{j}{f' {device.name}' if device is not None else ''} ({span})"


def estimate_llamacpp(spec: ModelSpec, s: ServingConfig, device: Device | Fleet) -> Estimate:
    """llama.cpp's per-GPU memory and host RAM for the job (``--engine llama.cpp``) on ``device`` x the
    job's device count, or on the unlike devices of a :class:`~memest.devices.Fleet` (one rank per
    device, in order, each with its own layers, context and fit).

    Raises:
        InputError: invalid settings (:func:`settings`).
    """
    n_dev = s.parallelism.world_size
    fleet = isinstance(device, Fleet) and device.mixed
    devs = devices_of(device, n_dev)
    b = buffers(spec, s, devs if fleet else n_dev)
    st = b.settings
    ranks = []
    for j, d in enumerate(b.devices):
        context = context_bytes(devs[j])
        terms = (
            Term("weights", Kind.WEIGHTS, d.model, f"model buffer: {len(d.layers)} layers"
                 + (" + output layer" if d.output else "") + f" of a {st.file_type.upper()} GGUF"),
            Term("kv_cache", Kind.KV_CACHE, d.kv, f"{st.n_ctx:,} cells x {len(d.layers)} layers, K {st.type_k.name} "
                 f"V {st.type_v.name}"),
            Term("workspace.compute", Kind.WORKSPACE, d.compute, f"compute buffer: n_ubatch {st.n_ubatch}"
                 + (", flash attention" if st.flash_attn else ", KQ scores f32")),
            Term("runtime.cuda_context", Kind.RUNTIME, context, "llama.cpp's CUDA context (fitted to the CI logs)"),
        )
        ranks.append(RankEstimate(_device_label(j, d, devs[j] if fleet else None), terms, 1))
    binding = min(range(len(ranks)), key=lambda j: devs[j].memory_bytes - ranks[j].device_used_bytes)
    worst = ranks[binding]
    per_token = (b.k_bytes + b.v_bytes) // st.n_ctx
    gpu_kv = sum(d.kv for d in b.devices)
    fits = all(r.device_used_bytes <= devs[j].memory_bytes for j, r in enumerate(ranks))
    summary = ServingSummary(
        kv_cache_bytes_per_token=per_token,
        max_model_len=st.n_ctx // st.n_seq,
        kv_cache_tokens=st.n_ctx,
        kv_cache_blocks=0,
        max_concurrency=float(st.n_seq),
        kv_budget_bytes=gpu_kv + b.host_kv,
        engine=s.engine.value,
        engine_version=BUILD,
        requested_bytes=devs[binding].memory_bytes,
        non_kv_bytes=worst.device_used_bytes - worst.term("kv_cache").bytes,
        activation_peak_bytes=worst.term("workspace.compute").bytes,
        request_kv_bytes=(b.k_bytes + b.v_bytes) // st.n_seq,
        engine_error=None if fits else "no_memory",
        largest_max_model_len=0,
        largest_max_model_len_one_request=0,
        largest_concurrency=st.n_seq if fits else 0,
        batch_size=s.batch_size,
        device_bytes=worst.device_used_bytes,
    )
    counts = ", ".join(f"{n} x {t}" for t, n in sorted(b.type_counts.items()))
    assumptions = (
        f"llama.cpp {BUILD}: {st.file_type.upper()} GGUF ({counts}), {b.file_bytes / 2**30:.2f} GiB "
        f"({bits_per_weight(b, spec):.2f} BPW)",
        f"n_ctx {st.n_ctx:,}, n_batch {st.n_batch}, n_ubatch {st.n_ubatch}, -ngl {st.n_gpu_layers} "
        f"({b.offloaded}/{b.n_layer + 1} layers on the GPU{'s' if n_dev > 1 else ''}), flash attention "
        f"{'on' if st.flash_attn else 'off'}",
        "host RAM: the mmapped file's pages of the layers left on the host, their KV, the host compute and "
        "output buffers",
    )
    if fleet:
        placed = ", ".join(f"CUDA{j} {x.name} {len(d.layers)} layers" for j, (x, d) in enumerate(zip(devs, b.devices)))
        by = "the tensor split given" if s.tensor_split else "free memory (llama.cpp's default)"
        assumptions += (f"unlike devices, layers split by {by}: {placed}; {devs[binding].name} has the least room "
                        "left",)
    extra = {"llamacpp_host_bytes": b.host_bytes, "llamacpp_host_model_bytes": b.host_model,
             "llamacpp_offloaded_layers": b.offloaded, "llamacpp_layers": b.n_layer + 1,
             "llamacpp_file_type": st.file_type, "llamacpp_file_bytes": b.file_bytes}
    return Estimate(ranks=tuple(ranks), assumptions=assumptions, serving=summary, host_bytes=b.host_bytes,
                    extra=extra)


def bits_per_weight(b: Buffers, spec: ModelSpec) -> float:
    """The file's bits per weight over all tensors (llama.cpp's ``file size ... (x BPW)``)."""
    return b.file_bytes * 8 / spec.num_params if spec.num_params else math.nan
