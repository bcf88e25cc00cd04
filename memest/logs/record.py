"""What an engine's start-up log (or a trainer's log) says: the job it ran and the memory figures it printed.

A parser (:mod:`memest.logs.vllm`, :mod:`.sglang`, :mod:`.trtllm`, :mod:`.llamacpp`; for training
:mod:`.torchtitan`, :mod:`.torchtune`, :mod:`.hf_trainer`) fills an :class:`EngineLog` from the text;
nothing here knows a format's lines. Bytes are ints (the log's GiB / MiB
figures times 2^30 / 2^20, rounded); counts are ints; ratios are floats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Logged:
    """One figure the engine printed.

    Attributes:
        value: Bytes (int), a count (int) or a ratio (float, ``x``).
        unit: ``bytes``, ``bytes/token``, ``tokens``, ``blocks``, ``requests`` or ``x``.
        line: The log line it was read from (stripped), so a reader can find it.
    """

    value: int | float
    unit: str
    line: str


@dataclass(frozen=True)
class EngineLog:
    """A start-up log, read.

    Attributes:
        engine: The engine as memest names it (``vllm``, ``sglang``, ``trtllm``, ``llama.cpp``), or for a
            training log the stack (``torchtitan``, ``torchtune``, ``hf-trainer``: :class:`memest.workload.Stack`).
        format: The log format read, for messages (``vLLM V1``, ``vLLM 0.6 worker``, ``SGLang``, ``llama.cpp``,
            ``torchtitan``).
        version: The engine version the log prints (``0.19.0``), or None.
        model: The model the log names (Hub id or path as printed), or None.
        gpu: The accelerator name the log prints, or None.
        device_total_bytes: The device's total memory as the log prints it, or None.
        settings: The job's settings the log shows, keyed by memest's setting names
            (:mod:`memest.workload.config`: ``tp``, ``max_model_len``, ``gpu_memory_utilization``, ...).
        figures: The memory figures, keyed by the names in :data:`FIGURES`.
        training: True for a training log (the job is estimated with memest's training path).
        model_config: A config.json-style dict of the model the log prints the shapes of (torchtitan's
            ``Building llama3 8B with TransformerModelArgs(...)``), for a model no catalog names; or None.
        missing: Settings the job needs that the log does not print, by memest's setting names (the
            check refuses, naming them, until they are given).
        notes: What the parser assumed where the log is silent, in words.
        assumed: Settings in ``settings`` the log leaves open, whose value is memest's pick (said in
            ``notes``): a value the caller gives for one replaces the pick; for every other setting of
            ``settings`` the log states the value, and a different one given is refused
            (:func:`memest.check.refuse_contradictions`).
    """

    engine: str
    format: str
    version: str | None = None
    model: str | None = None
    gpu: str | None = None
    device_total_bytes: int | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Logged] = field(default_factory=dict)
    training: bool = False
    model_config: dict[str, Any] | None = None
    missing: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    assumed: tuple[str, ...] = ()


FIGURES: dict[str, str] = {
    "weights": "model weights on one device (vLLM 'Model loading took', SGLang's load delta, llama.cpp's model buffer)",
    "activation_peak": "vLLM's profiled activation peak ('torch peak memory increase')",
    "non_torch": "vLLM's non-torch memory (CUDA context, NCCL) in the budget",
    "requested": "vLLM's budget: gpu_memory_utilization x total memory",
    "non_kv": "vLLM's 'Total non KV cache memory'",
    "kv_cache_memory": "memory for the KV pool (vLLM 'Available KV cache memory', llama.cpp 'KV self size')",
    "kv_cache_tokens": "tokens the KV pool holds (vLLM 'GPU KV cache size', SGLang max_total_num_tokens)",
    "kv_cache_blocks": "paged blocks of the KV pool (vLLM '# GPU blocks')",
    "max_concurrency": "requests of max_model_len tokens the pool holds (vLLM 'Maximum concurrency')",
    "k_size": "SGLang's K buffers",
    "v_size": "SGLang's V buffers",
    "context_len": "SGLang's context length",
    "kv_buffer": "llama.cpp's KV buffer on the first GPU",
    "compute_buffer": "llama.cpp's compute buffer on the first GPU",
    "file_size": "the GGUF file's size",
    "free_memory": "TensorRT-LLM's free memory the KV pool is sized from (C++ runtime 'available')",
    "kv_budget": "TensorRT-LLM's fraction x free memory ('available KV cache memory when calculating max tokens')",
    "runtime_buffers": "TensorRT-LLM's runtime and decoder buffers ('Allocated X GB GPU memory for runtime buffers / decoder')",
    "kv_bytes_per_token": "TensorRT-LLM's 'kv size is N' (bytes per token of the pool)",
    "peak_reserved": "training: the step's peak reserved memory (torchtitan 'memory:', torchtune peak_memory_reserved)",
    "peak_allocated": "training: the step's peak allocated memory (torchtune peak_memory_alloc; HF Trainer "
                      "before_init_mem_gpu + init / train alloc and peaked deltas)",
    "peak_active": "training: torchtune's peak_memory_active (active_bytes.all.peak)",
    "init_allocated": "training: allocated once the model is on the device (torchtune 'Memory stats after model "
                      "init', HF init_mem_gpu_alloc_delta)",
    "init_reserved": "training: reserved once the model is on the device (torchtitan 'memory usage for model', "
                     "torchtune's model-init peak reserved)",
    "train_states": "training: HF train_mem_gpu_alloc_delta (what training left allocated: optimizer states, "
                    "gradients kept)",
}
"""Every figure a parser may report, and what it is."""
