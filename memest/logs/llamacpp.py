"""llama.cpp's start-up log (``llama-cli``, ``llama-server``, and Ollama's runner, which logs the same lines).

Lines read: ``using device CUDA0 (NAME) - N MiB free`` / ``Device 0: NAME, compute capability``; the
command (``--model FILE``); ``file type = Q4_K - Medium`` and ``file size = 1.66 GiB``; ``offloaded
33/33 layers to GPU``; ``CUDA0 model buffer size = X MiB`` (``llm_load_tensors:`` or ``load_tensors:``);
``n_ctx = N``, ``n_batch``, ``n_ubatch``, ``flash_attn``; ``llama_kv_cache_init: ... type_k = 'f16',
type_v = 'f16'`` and ``CUDA0 KV buffer size = X MiB``; ``KV self size = X MiB``; ``CUDA0 compute
buffer size = X MiB``. llama.cpp's MiB (and 2023 builds' 'MB') are bytes / 2^20.
"""

from __future__ import annotations

import re
from typing import Any

from memest.logs._text import NUMBER, first, keep, size_figure
from memest.logs.record import EngineLog, Logged

FIGURE_LINES = ("model buffer size", "KV self size", "compute buffer size")
"""The lines of figures named when a log has none of them."""

MARKERS = (r"llama_model_loader", r"llama_kv_cache_init", r"llm_load_tensors", r"load_tensors:", r"llama_init_from_model",
           r"llama_new_context_with_model", r"print_info: file type", r"ggml_cuda_init")

SIZE = rf"{NUMBER}\s*(MiB|MB|GiB)"

_SIZES = {"medium": "_m", "small": "_s", "large": "_l"}


def detect(text: str) -> bool:
    """True when ``text`` is a llama.cpp (or Ollama runner) log."""
    return any(re.search(m, text) for m in MARKERS)


def file_type(printed: str, text: str) -> str | None:
    """memest's ``quantization`` for llama.cpp from the printed file type (``Q4_K - Medium`` -> ``q4_k_m``);
    for 'guessed' types, the most common tensor type other than f32 (``type  f16:  130 tensors`` -> ``f16``)."""
    printed = printed.strip()
    if "guessed" in printed.lower() or printed.lower().startswith("all "):
        counts = [(int(n), t) for t, n in re.findall(r"- type\s+(\w+):\s+(\d+) tensors", text) if t.lower() != "f32"]
        return max(counts)[1].lower() if counts else None
    printed = re.sub(r"^mostly\s+", "", printed, flags=re.IGNORECASE)
    base, _, size = printed.partition(" - ")
    return base.strip().lower() + _SIZES.get(size.strip().lower(), "")


def _settings(text: str) -> tuple[dict[str, Any], str | None, str | None]:
    out: dict[str, Any] = {}
    for key in ("n_ctx", "n_batch", "n_ubatch"):
        m = first(rf"\b{key}\s*=\s*(\d+)", text)
        if m is not None:
            out["max_model_len" if key == "n_ctx" else key] = int(m.group(1))
    fa = first(r"\bflash_attn\s*=\s*(\w+)", text)
    if fa is not None:
        out["flash_attn"] = fa.group(1).lower() in ("1", "true", "enabled")
    kv = first(r"type_k = '(\w+)'", text)
    if kv is not None:
        out["kv_cache_dtype"] = kv.group(1)
    offloaded = first(r"offloaded (\d+)/(\d+) layers to GPU", text)
    if offloaded is not None:
        out["n_gpu_layers"] = int(offloaded.group(1))
    ftype = first(r"(?:file type|model ftype)\s*=\s*(.+)", text)
    if ftype is not None:
        quant = file_type(ftype.group(1), text)
        if quant:
            out["quantization"] = quant
    gpus = {int(n) for n in re.findall(r"CUDA(\d+) KV buffer size", text)} or {
        int(n) for n in re.findall(r"CUDA(\d+) model buffer size", text)}
    if len(gpus) > 1:
        out["gpus"] = len(gpus)
    gpu = first(r"using device CUDA0 \(([^)\n]{1,200})\)", text) or first(r"Device 0: ([^,\n]{1,200}),", text)
    model = first(r"(?:--model|\s-m)\s+(\S+)", text)
    return out, gpu.group(1).strip() if gpu else None, model.group(1) if model else None


def parse(text: str) -> EngineLog:
    """The job and the figures of a llama.cpp start-up log (the first GPU's buffers)."""
    settings, gpu, model = _settings(text)
    figures: dict[str, Logged | None] = {
        "weights": size_figure(rf"CUDA0 (?:model )?buffer size\s*=\s*{SIZE}", text),
        "kv_buffer": size_figure(rf"CUDA0 KV buffer size\s*=\s*{SIZE}", text),
        "kv_cache_memory": size_figure(rf"KV self size\s*=\s*{SIZE}", text),
        "compute_buffer": size_figure(rf"CUDA0 compute buffer size\s*=\s*{SIZE}", text),
        "file_size": size_figure(rf"file size\s*=\s*{SIZE}", text),
    }
    build = first(r"build: (\d+)", text)
    return EngineLog(engine="llama.cpp", format="llama.cpp", version=build.group(1) if build else None, model=model,
                     gpu=gpu, settings=settings, figures=keep(figures))
