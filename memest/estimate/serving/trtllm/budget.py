"""TensorRT-LLM's KV-cache sizing at start-up.

Both backends give the paged KV cache a fraction of the memory that is free once the weights, the
activations and the runtime buffers are in place:

``1.1`` (PyTorch backend, ``trtllm-serve`` / LLM API; ``tensorrt_llm/_torch/pyexecutor/_util.py``
``KvCacheCreator._cal_max_tokens``)::

    available  = (total - peak + first_pass_kv) x free_gpu_memory_fraction
    max_tokens = available // kv_size_per_token

  ``peak`` is measured during a profiling forward of ``max_num_tokens`` tokens with a first, small
  KV pool (``first_pass_kv``) in place, so ``total - peak + first_pass_kv`` is the memory free
  outside the KV cache; ``free_gpu_memory_fraction`` defaults to 0.9
  (``get_fraction_from_executor_config``).

``0.19`` (TensorRT engine on the C++ runtime; ``KVCacheManager::calculateMaxNumBlocks``): the
same fraction of the free memory reported after the engine, its execution context, the runtime
buffers and the decoder are allocated ('Memory usage when calculating max tokens in paged kv
cache: total ..., available ...').

The pool is whole blocks of ``tokens_per_block`` tokens: ``blocks = max_tokens // tokens_per_block``
and the logged 'max tokens' is ``blocks x tokens_per_block``. ``kv_size_per_token`` counts every
attention layer full (gpt-oss logs 73,728 B = 36 layers x 8 KV heads x 64 x 2 x 2 B although half
its layers are sliding): :func:`memest.estimate.serving.kv.kv_bytes_per_token`.

What the non-KV memory holds beyond the weights and the CUDA context (activations of
``max_num_tokens`` tokens, runtime and decoder buffers per ``max_batch_size`` request) is not
derived from the model code: :data:`ACTIVATION_H_PER_TOKEN` and :data:`BUFFER_BYTES_PER_SLOT_LOGIT`
are fitted, one to each C++-runtime log.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TRTLLM_VERSIONS = ("1.1", "0.19")
"""The versions modelled (``--engine-version``); the first is the default (same as
:data:`memest.workload.ENGINE_VERSIONS`)."""

DEFAULT_MAX_BATCH_SIZE = 2048
DEFAULT_MAX_NUM_TOKENS = 8192
"""``BuildConfig`` / ``TorchLlmArgs`` defaults (``tensorrt_llm/builder.py``, ``tensorrt_llm/llmapi/llm_args.py``)."""

ACTIVATION_H_PER_TOKEN = 14.5
"""Activations of the ``max_num_tokens`` forward, in h-sized elements per token (x c bytes). Fitted
to trtllm_0120_llama2_7b_fp8_kvfp8_h100_trtllm_bench, the only log that prints them: 'Allocated
928.77 MiB for execution context memory' at 8,192 tokens, h 4,096, 2 B -> 928.77 MiB / (8192 x 4096
x 2 B) = 14.51. Not divided by tp (the log is tp 1)."""

BUFFER_BYTES_PER_SLOT_LOGIT = 20.1
"""Runtime and decoder buffers per (``max_batch_size`` request slot x vocabulary entry). Fitted to
trtllm_019_llama31_8b_fp8_kvfp8_rtx5090_triton: total 31.84 - available 17.83 - memest's FP8
weights 8.46 - context 0.51 - activations 0.11 = 4.93 GiB over 2,048 x 128,256 = 20.1 B. The 0.12
build of trtllm_0120 logs 5.49 GiB of runtime and decoder buffers for 4,096 x 32,000 (45 B): its
decoder was larger, so memest over-predicts that case's free memory (benchmarks/engine_cases.md)."""


def activation_bytes(max_num_tokens: int, hidden: int, c: float) -> int:
    """Activations of the ``max_num_tokens`` forward (:data:`ACTIVATION_H_PER_TOKEN`)."""
    return math.ceil(ACTIVATION_H_PER_TOKEN * max_num_tokens * hidden * c)


def buffer_bytes(max_batch_size: int, vocab: int) -> int:
    """Runtime and decoder buffers (:data:`BUFFER_BYTES_PER_SLOT_LOGIT`)."""
    return math.ceil(BUFFER_BYTES_PER_SLOT_LOGIT * max_batch_size * vocab)


@dataclass(frozen=True, slots=True)
class Pool:
    """TensorRT-LLM's KV arithmetic on one rank.

    Attributes:
        free: Memory free outside the KV cache ('available' of the C++ runtime; total - peak +
            first-pass KV of the PyTorch backend); negative when the non-KV memory exceeds the device.
        fraction: ``free_gpu_memory_fraction``.
        bytes_per_token: ``kv_size_per_token``.
        tokens_per_block: Tokens per block.
    """

    free: int
    fraction: float
    bytes_per_token: int
    tokens_per_block: int

    @property
    def available(self) -> int:
        """Bytes given to the KV cache: fraction x free (0 when nothing is free)."""
        return max(0, math.floor(self.free * self.fraction))

    @property
    def blocks(self) -> int:
        """Blocks in the primary pool."""
        if self.bytes_per_token <= 0:
            return 0
        return self.available // self.bytes_per_token // self.tokens_per_block

    @property
    def tokens(self) -> int:
        """The logged 'max tokens in paged KV cache'."""
        return self.blocks * self.tokens_per_block

    @property
    def allocated(self) -> int:
        """The logged 'Allocated X GiB for max tokens in paged KV cache'."""
        return self.tokens * self.bytes_per_token

    def blocks_per_request(self, length: int) -> int:
        """Blocks one sequence of ``length`` tokens takes."""
        return -(-length // self.tokens_per_block)
