"""TensorRT-LLM's start-up log: a TensorRT engine on the C++ runtime, or the PyTorch backend.

Lines read, as TensorRT-LLM prints them (the C++ ``TLLM_LOG_INFO`` lines carry ``[TensorRT-LLM][INFO]``,
the Python ones ``[TRT-LLM] [I]``):

- the KV pool (``cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp``, both backends): ``Number of
  tokens per block: 64.``, ``Number of blocks in KV cache primary pool: 4607`` (or ``primary
  blocks=61848``), ``[MemUsageChange] Allocated 62.99 GiB for max tokens in paged KV cache (294848).``
  -- the PyTorch backend sizes the pool twice (a small one for its profiling forward first), so the
  last such line is the pool that serves;
- the C++ runtime (0.12-0.19, ``trtGptModelInflightBatching.cpp`` / ``tllmRuntime.cpp``): ``TRTGptModel
  maxBatchSize / maxSequenceLen / maxNumTokens: N``, ``Loaded engine size: 6214 MiB``, ``[MemUsageChange]
  Allocated 928.77 MiB for execution context memory.``, ``Allocated 1.14 GB GPU memory for runtime
  buffers.`` / ``... for decoder.``, ``Memory usage when calculating max tokens in paged kv cache:
  total: 79.10 GiB, available: 63.62 GiB``; ``trtllm-bench``'s summary (``Model:``, ``TensorRT-LLM
  Version:``, ``Dtype:``, ``KV Cache Dtype:``, ``Quantization:``, ``TP Size:``, ``KV Memory Percentage:``);
- the PyTorch backend (1.0-1.1, ``tensorrt_llm/_torch/pyexecutor/_util.py`` ``KvCacheCreator`` and
  ``py_executor_creator.py``): ``Use 63.32 GB for model weights.`` (0.20: ``Rank 0 uses 8.46 GB for model
  weights.``), ``Memory dynamically allocated during inference (inside torch) in memory usage profiling:
  0.85 GiB``, ``Memory used outside torch (e.g., NCCL and CUDA graphs) in memory usage profiling: 49.28
  GiB``, ``Peak memory during memory usage profiling (torch + non-torch): 113.65 GiB, available KV cache
  memory when calculating max tokens: 5.95 GiB, fraction is set 0.8999999761581421, kv size is 73728.
  device total memory 119.70 GiB, , tmp kv_mem 0.56 GiB``, ``max_seq_len=86720, max_num_requests=64,
  max_num_tokens=8192, max_batch_size=64``; ``TensorRT-LLM version: 0.20.0``.

TensorRT-LLM divides by 2^30 for its 'GiB' and also for the 'GB' of its weights and buffer lines
(``/ (1 << 30)`` in ``_util.py``; validation case notes in benchmarks/data/engines.json), so every
unit here is binary (:mod:`memest.logs._text`).
"""

from __future__ import annotations

import re
from typing import Any

from memest.logs._text import NUMBER, count_figure, first, keep, last, last_size_figure, line_of, nbytes, number
from memest.logs.record import EngineLog, Logged

FIGURE_LINES = ("for max tokens in paged KV cache", "Memory usage when calculating max tokens",
                "Peak memory during memory usage profiling")
"""The lines of figures named when a log has none of them."""

MARKERS = (r"\[TensorRT-LLM\]", r"\[TRT-LLM\]", r"for max tokens in paged KV cache", r"TensorRT-LLM Version:",
           r"Memory usage when calculating max tokens in paged kv cache", r"Peak memory during memory usage profiling",
           r"TRTGptModel max", r"trtllm-serve", r"trtllm-bench")
"""Text only TensorRT-LLM's logs hold."""

PYTORCH_MARKERS = (r"memory usage profiling", r"for model weights\.", r"PyTorch backend", r"max_num_requests=")
"""Lines only the PyTorch backend prints (the log is the C++ runtime's otherwise)."""

SIZE = rf"{NUMBER}\s*(GiB|GB|MiB|MB)"

DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "fp8": "fp8"}
"""trtllm-bench's ``Dtype`` / ``KV Cache Dtype`` -> memest's words."""


def detect(text: str) -> bool:
    """True when ``text`` is a TensorRT-LLM log."""
    return any(re.search(m, text) for m in MARKERS)


def pytorch_backend(text: str) -> bool:
    """True when the log is the PyTorch backend's (``trtllm-serve`` / LLM API on ``_torch``)."""
    return any(re.search(m, text) for m in PYTORCH_MARKERS)


def _int(pattern: str, text: str) -> int | None:
    m = last(pattern, text)
    return int(number(m.group(1))) if m else None


def _settings(text: str) -> dict[str, Any]:
    """The job's settings the log prints, by memest's names (the last value printed wins)."""
    out: dict[str, Any] = {}
    for name, patterns in (
        ("max_batch_size", (r"TRTGptModel maxBatchSize: (\d+)", r"Max Runtime Batch Size:\s+(\d+)",
                            r"\bmax_batch_size=(\d+)", r"\bmax_num_requests=(\d+)")),
        ("max_num_tokens", (r"TRTGptModel maxNumTokens: (\d+)", r"Max Runtime Tokens:\s+(\d+)", r"\bmax_num_tokens=(\d+)")),
        ("max_model_len", (r"TRTGptModel maxSequenceLen: (\d+)", r"Max Sequence Length:\s+(\d+)", r"\bmax_seq_len=(\d+)")),
        ("tokens_per_block", (r"Number of tokens per block: (\d+)", r"tokens per block=(\d+)")),
        ("tp", (r"TP Size:\s+(\d+)", r"tensor_parallel_size['\"]?[=:]\s*(\d+)")),
        ("pp", (r"PP Size:\s+(\d+)", r"pipeline_parallel_size['\"]?[=:]\s*(\d+)")),
    ):
        value = next((v for v in (_int(p, text) for p in patterns) if v is not None), None)
        if value is not None:
            out[name] = value
    fraction = last(r"fraction is set ([0-9.]+)", text) or last(r"free_gpu_memory_fraction['\"]?[=:]\s*([0-9.]+)", text)
    percentage = last(r"KV Memory Percentage:\s+([0-9.]+)%", text)
    if fraction is not None:  # a float32 printed as a double (0.8999999761581421): the value the user set
        out["kv_cache_free_gpu_mem_fraction"] = float(f"{number(fraction.group(1)):.6g}")
    elif percentage is not None:
        out["kv_cache_free_gpu_mem_fraction"] = round(number(percentage.group(1)) / 100, 6)
    kv = first(r"KV Cache Dtype:\s+(\w+)", text)
    if kv is not None and kv.group(1).lower() == "fp8":
        out["kv_cache_dtype"] = "fp8"
    quant = first(r"\bQuantization:\s+(\w+)", text)
    if quant is not None and quant.group(1).lower() not in ("none", "null"):
        out["quantization"] = quant.group(1).lower()
    dtype = first(r"^[ \t]*Dtype:\s+(\w+)", text, re.MULTILINE)
    if dtype is not None and dtype.group(1).lower() in DTYPES:
        out["dtype"] = DTYPES[dtype.group(1).lower()]
    return out


def _sum_figure(patterns: tuple[str, ...], text: str) -> Logged | None:
    """The sum of the sizes of several lines (each the first match of its pattern), None when none matches."""
    found = [m for m in (first(p, text) for p in patterns) if m is not None]
    if not found:
        return None
    return Logged(sum(nbytes(m.group(1), m.group(2)) for m in found), "bytes",
                  " / ".join(line_of(text, m) for m in found))


def parse(text: str) -> EngineLog:
    """The job and the figures of a TensorRT-LLM start-up log (rank 0's lines where several ranks log)."""
    torch_backend = pytorch_backend(text)
    settings = _settings(text)
    figures: dict[str, Logged | None] = {
        "weights": (last_size_figure(rf"(?:Use|uses) {SIZE} for model weights", text)
                    or last_size_figure(rf"Loaded engine size: {SIZE}", text)),
        "activation_peak": (last_size_figure(rf"Memory dynamically allocated during inference \(inside torch\) in memory "
                                             rf"usage profiling: {SIZE}", text)
                            or last_size_figure(rf"Allocated {SIZE} for execution context memory", text)),
        "runtime_buffers": _sum_figure((rf"Allocated {SIZE} GPU memory for runtime buffers",
                                        rf"Allocated {SIZE} GPU memory for decoder"), text),
        "non_torch": last_size_figure(rf"Memory used outside torch \(e\.g\., NCCL and CUDA graphs\) in memory usage "
                                      rf"profiling: {SIZE}", text),
        "free_memory": last_size_figure(rf"Memory usage when calculating max tokens in paged kv cache: total: [0-9.]+ "
                                        rf"GiB, available: {SIZE}", text),
        "kv_budget": last_size_figure(rf"available KV cache memory when calculating max tokens: {SIZE}", text),
        "kv_cache_memory": last_size_figure(rf"Allocated {SIZE} for max tokens in paged KV cache", text),
        "kv_cache_tokens": _last_count(r"for max tokens in paged KV cache \((\d+)\)", text, "tokens"),
        "kv_cache_blocks": (count_figure(rf"Number of blocks in KV cache primary pool: {NUMBER}", text, "blocks")
                            or _last_count(r"primary blocks=(\d+)", text, "blocks")),
    }
    per_token = last(r"kv size is (\d+)", text)
    if per_token is not None:
        figures["kv_bytes_per_token"] = Logged(int(per_token.group(1)), "bytes/token", line_of(text, per_token))
    peak = last(rf"Peak memory during memory usage profiling \(torch \+ non-torch\): {SIZE}", text)
    tmp = last(rf"tmp kv_mem {SIZE}", text)
    if peak is not None:  # the profiling peak held a first, temporary KV pool: the rest is the non-KV memory
        tmp_bytes = nbytes(tmp.group(1), tmp.group(2)) if tmp is not None else 0
        figures["non_kv"] = Logged(nbytes(peak.group(1), peak.group(2)) - tmp_bytes, "bytes", line_of(text, peak))
    total = (last(rf"device total memory {SIZE}", text)
             or last(rf"Memory usage when calculating max tokens in paged kv cache: total: {SIZE}", text))
    version = last(r"TensorRT-LLM [Vv]ersion:?\s+(\d[\w.+-]*)", text)
    model = first(r"^[ \t]*Model:\s+(\S+)", text, re.MULTILINE)
    return EngineLog(
        engine="trtllm", format="TensorRT-LLM PyTorch backend" if torch_backend else "TensorRT-LLM C++ runtime",
        version=version.group(1) if version else None, model=model.group(1) if model else None,
        device_total_bytes=nbytes(total.group(1), total.group(2)) if total else None,
        settings=settings, figures=keep(figures))


def _last_count(pattern: str, text: str, unit: str) -> Logged | None:
    m = last(pattern, text)
    return None if m is None else Logged(int(m.group(1)), unit, line_of(text, m))
