"""vLLM's start-up log: the V1 engine (0.8 and later) and the V0 worker (0.6 / 0.7).

Lines read (the worker's memory profile, the KV-cache manager, the engine's config):

- weights: ``Model loading took 14.99 GiB memory`` (V1), ``Loading model weights took 14.9888 GB``,
  ``model weights take 14.96GiB`` (0.6.5-0.7) or the V1 profile's ``weights memory: 14.99GiB``;
- ``Memory profiling takes ... Total non KV cache memory: X; torch peak memory increase: X;
  non-torch forward increase memory: X`` (V1), or the V0 profile (``non_torch_memory``, ``PyTorch
  activation peak memory``, ``the rest of the memory reserved for KV Cache is X``, ``kv_cache_size=X``);
- the activation peak of 0.6.4's ``Memory profiling results: ... peak_torch_memory=X`` (weights included:
  :data:`PEAK_TORCH`) less the weights line;
- ``Available KV cache memory: X GiB``, ``GPU KV cache size: N tokens``, ``# GPU blocks: N``,
  ``Maximum concurrency for L tokens per request: Nx``;
- the engine line ``Initializing a V1 LLM engine (v0.19.0) with config: model=..., dtype=...,
  max_seq_len=..., tensor_parallel_size=..., quantization=..., kv_cache_dtype=...`` and
  ``non-default args: {...}``.

vLLM's 'GB' is bytes / 2^30 (:mod:`memest.logs._text`).
"""

from __future__ import annotations

import ast
import re
from typing import Any

from memest.logs._text import GAP, NUMBER, count_figure, first, keep, line_of, nbytes, number, size_figure
from memest.logs.record import EngineLog, Logged

FIGURE_LINES = ("Model loading took", "Available KV cache memory", "GPU KV cache size")
"""The lines of figures named when a log has none of them."""

MARKERS = (r"\bvLLM\b", r"LLM engine \(v", r"GPU KV cache size:", r"# (?:GPU|CUDA) blocks:", r"Memory profiling",
           r"Available KV cache memory", r"vllm serve ", r"model_runner\.py", r"gpu_worker\.py")
"""Text only vLLM's logs hold; the log is vLLM's when one is found."""

SIZE = rf"{NUMBER}\s*(GiB|GB)"

PATTERNS: dict[str, tuple[str, ...]] = {
    "weights": (rf"Model loading took {SIZE}", rf"Loading model weights took {SIZE}", rf"model weights take:?\s+{SIZE}",
                rf"weights memory: {SIZE}"),
    "activation_peak": (rf"torch peak memory increase: {SIZE}", rf"PyTorch activation peak memory(?: takes)?\s+{SIZE}"),
    "non_torch": (rf"non-torch forward increase memory: {SIZE}", rf"non_torch_memory takes {SIZE}",
                  rf"non_torch_memory\s+{SIZE}", rf"Memory profiling results:{GAP}non_torch_memory={SIZE}"),
    "requested": (rf"Requested memory: [0-9.]+ \(util\), {SIZE}", rf"the current vLLM instance can use [^=\n]{{0,500}}=\s*{SIZE}",
                  rf"the current vLLM instance can use\s+{SIZE}"),
    "non_kv": (rf"Total non KV cache memory: {SIZE}",),
    "kv_cache_memory": (rf"Available KV cache memory: {SIZE}", rf"available_kv_cache_memory\s+{SIZE}",
                        rf"the rest of the memory reserved for KV Cache is {SIZE}", rf"kv_cache_size={SIZE}"),
}
"""Each size figure's line formats, newest first; the first that matches is read."""

COUNTS: dict[str, tuple[str, str]] = {
    "kv_cache_tokens": (rf"GPU KV cache size: {NUMBER} tokens", "tokens"),
    "kv_cache_blocks": (rf"(?:(?:#\s*)?(?:GPU|CUDA) blocks: |num_gpu_blocks is: ){NUMBER}", "blocks"),
}

PEAK_TORCH = rf"Memory profiling results:{GAP}peak_torch_memory={SIZE}"
"""vLLM 0.6.4's profile line (``Memory profiling results: total_gpu_memory=23.58GiB initial_memory_usage=15.34GiB
peak_torch_memory=17.06GiB ...``). Its ``peak_torch_memory`` is torch's ``allocated_bytes.all.peak`` over the
profile run, counted from ``reset_peak_memory_stats()`` with the weights already loaded, so weights plus the
activation peak (vllm/worker/worker.py ``determine_num_available_blocks`` of the 0.6.4 line, which logs it as
``(peak_memory - non_torch_allocations)``, ``peak_memory`` being that allocator peak plus the non-torch bytes);
0.6.5 prints the activation peak itself (``PyTorch activation peak memory``)."""

CONCURRENCY = rf"Maximum concurrency for {NUMBER} tokens per request: {NUMBER}x"
ENGINE_LINE = r"Initializing an? (?:V1 )?LLM engine \(v([^)\s]+)\) with config: (.*)"
TOTAL = (rf"total_memory={SIZE}", rf"total_gpu_memory\s*(?:[(=]\s*)?{SIZE}")
UTILIZATION = (r"Requested memory: ([0-9.]+) \(util\)", r"gpu_memory_utilization\s*(?:[(=]\s*)?([0-9.]+)")

SERVE_FLAGS: dict[str, str] = {
    "tensor-parallel-size": "tp", "tp": "tp", "pipeline-parallel-size": "pp", "pp": "pp",
    "max-model-len": "max_model_len", "gpu-memory-utilization": "gpu_memory_utilization",
    "max-num-seqs": "max_num_seqs", "max-num-batched-tokens": "max_num_batched_tokens", "block-size": "block_size",
    "kv-cache-dtype": "kv_cache_dtype", "dtype": "dtype", "quantization": "quantization", "q": "quantization",
}
"""``vllm serve`` flags (dashes or underscores) -> memest's setting names, read from a command line in the log."""

DTYPES = {"torch.bfloat16": "bf16", "bfloat16": "bf16", "torch.float16": "fp16", "float16": "fp16", "half": "fp16",
          "torch.float32": "fp32", "float32": "fp32", "float": "fp32"}
"""vLLM's dtype as printed -> memest's ``dtype``."""


def detect(text: str) -> bool:
    """True when ``text`` is a vLLM log."""
    return any(re.search(m, text) for m in MARKERS)


def _serve_flags(text: str) -> tuple[str | None, dict[str, Any]]:
    """The model and the flags of a ``vllm serve MODEL ...`` command line in the log."""
    m = first(r"vllm serve (\S+)([^\n]*)", text)
    if m is None:
        return None, {}
    out: dict[str, Any] = {}
    for flag, value in re.findall(r"(?:^|\s)--?([a-z][\w-]*)[ =]([^\s-][^\s]*)", m.group(2)):
        name = SERVE_FLAGS.get(flag.replace("_", "-"))
        if name is not None:
            out[name] = int(value) if value.isdigit() else number(value) if re.fullmatch(r"[0-9.]+", value) else value
    return m.group(1), out


def _quantization(name: str) -> str:
    """vLLM's quantization method as memest names it (``awq_marlin`` -> ``awq``)."""
    return name.removesuffix("_marlin")


def _config_value(config: str, key: str) -> str | None:
    m = re.search(rf"(?:^|[ ,]){key}=('([^']*)'|[^,]+)", config)
    if m is None:
        return None
    return m.group(2) if m.group(2) is not None else m.group(1).strip()


def _non_default_args(text: str) -> dict[str, Any]:
    """The ``non-default args: {...}`` dict (empty when absent or not a plain literal)."""
    lead = "non-default args: {"
    at = text.find(lead)
    while at >= 0:  # the first such line holding its closing brace (found by str methods: linear on any text)
        end = text.find("\n", at)
        line = text[at + len(lead) - 1:end if end >= 0 else len(text)]
        if "}" in line:
            break
        at = text.find(lead, end) if end >= 0 else -1
    if at < 0:
        return {}
    try:
        value = ast.literal_eval(line[:line.rindex("}") + 1])
    except (ValueError, SyntaxError, RecursionError, MemoryError):
        return {}
    return value if isinstance(value, dict) else {}


def _settings(text: str) -> tuple[dict[str, Any], str | None, str | None]:
    """The job's settings, the version and the model the log names."""
    out: dict[str, Any] = {}
    version = model = None
    m = first(ENGINE_LINE, text)
    if m is not None:
        version, config = m.group(1), m.group(2)
        model = _config_value(config, "model")
        for key, setting in (("tensor_parallel_size", "tp"), ("pipeline_parallel_size", "pp"),
                             ("max_seq_len", "max_model_len")):
            value = _config_value(config, key)
            if value is not None and value.isdigit():
                out[setting] = int(value)
        dtype = _config_value(config, "dtype")
        if dtype in DTYPES:
            out["dtype"] = DTYPES[dtype]
        quant = _config_value(config, "quantization")
        if quant not in (None, "None"):
            out["quantization"] = _quantization(quant)
        kv = _config_value(config, "kv_cache_dtype")
        if kv is not None:
            out["kv_cache_dtype"] = kv
        if _config_value(config, "enforce_eager") == "True":
            out["enforce_eager"] = True
    args = _non_default_args(text)
    model = model or args.get("model") or args.get("model_tag")
    for key, setting in (("tensor_parallel_size", "tp"), ("pipeline_parallel_size", "pp"),
                         ("max_model_len", "max_model_len"), ("gpu_memory_utilization", "gpu_memory_utilization"),
                         ("max_num_batched_tokens", "max_num_batched_tokens"), ("max_num_seqs", "max_num_seqs"),
                         ("block_size", "block_size"), ("kv_cache_dtype", "kv_cache_dtype")):
        if key in args and setting not in out and isinstance(args[key], int | float | str):
            out[setting] = args[key]
    served, flags = _serve_flags(text)
    model = model or served
    for name, value in flags.items():
        out.setdefault(name, DTYPES.get(value, value) if name == "dtype" else value)
    if version is None:
        banner = first(r"\bversion (\d+\.\d+[.\w+-]*)", text)
        version = banner.group(1) if banner else None
    if "gpu_memory_utilization" not in out:
        for pattern in UTILIZATION:
            u = first(pattern, text)
            if u is not None:
                out["gpu_memory_utilization"] = number(u.group(1))
                break
    if "max_num_batched_tokens" not in out:
        b = first(r"max_num_batched_tokens(?:=| to )(\d+)", text)
        if b is not None:
            out["max_num_batched_tokens"] = int(b.group(1))
    if "max_num_seqs" not in out:
        s = first(r"max_num_seqs(?:=| to )(\d+)", text)
        if s is not None:
            out["max_num_seqs"] = int(s.group(1))
    return out, version, model


def parse(text: str) -> EngineLog:
    """The job and the figures of a vLLM start-up log (the first rank's lines where several ranks log)."""
    settings, version, model = _settings(text)
    figures: dict[str, Logged | None] = {}
    for key, patterns in PATTERNS.items():
        figures[key] = next((f for f in (size_figure(p, text) for p in patterns) if f is not None), None)
    for key, (pattern, unit) in COUNTS.items():
        figures[key] = count_figure(pattern, text, unit)
    peak = size_figure(PEAK_TORCH, text)
    if figures["activation_peak"] is None and peak is not None and figures["weights"] is not None:
        # 0.6.4: the activation peak is the torch peak less the weights (PEAK_TORCH), both as the log prints them
        figures["activation_peak"] = Logged(peak.value - figures["weights"].value, "bytes", peak.line)
    c = first(CONCURRENCY, text)
    if c is not None:
        figures["max_concurrency"] = Logged(number(c.group(2)), "x", line_of(text, c))
        settings.setdefault("max_model_len", int(number(c.group(1))))
    total = next((m for m in (first(p, text) for p in TOTAL) if m is not None), None)
    v1 = bool(first(r"V1 LLM engine|Available KV cache memory|Total non KV cache memory|GPU KV cache size", text))
    return EngineLog(
        engine="vllm", format="vLLM V1" if v1 else "vLLM V0", version=version, model=model,
        device_total_bytes=nbytes(total.group(1), total.group(2)) if total else None,
        settings=settings, figures=keep(figures))


def is_064_profile(log: EngineLog) -> bool:
    """True when a figure of ``log`` comes from 0.6.4's one-line profile (:data:`PEAK_TORCH`): that
    version's non-torch memory is measured device-wide (``memest.estimate.serving.vllm.budget.V064``)."""
    return any(re.search(PEAK_TORCH, f.line) for f in log.figures.values() if f.line)
