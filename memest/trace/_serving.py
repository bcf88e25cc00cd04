"""Serving as transformers ``generate`` runs it: prefill the prompt, then decode with a growing KV cache.

Follows ``transformers/generation/utils.py`` (``_sample``, greedy): a ``DynamicCache``; the
prefill is one forward of the whole prompt with ``logits_to_keep=1`` (generate sets it when the
model accepts it, so only the last position's logits are computed); each step copies the last
logits to fp32 (``.to(copy=True, dtype=torch.float32)``), takes the argmax and appends the
token; each decode forward appends one token's K and V per layer to the cache
(``DynamicLayer.update``: ``torch.cat``, so a layer's old and new cache briefly coexist).

The prompt is ``max_model_len - decode_steps`` tokens for each of ``batch_size`` sequences, so
the cache reaches ``max_model_len`` tokens at the last step. Everything runs under
``torch.no_grad()`` with the model in eval mode.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch

from memest.errors import InputError
from memest.result import Kind, plural
from memest.trace._tracker import StorageTracker
from memest.workload import ServingConfig

DECODE_STEPS = 2
"""Decode steps traced after the prefill (each repeats the previous one with one more cached token)."""


def check_supported(s: ServingConfig) -> None:
    """Raise for settings the trace does not simulate.

    Raises:
        InputError: quantized weights or KV cache, tensor or pipeline parallelism.
    """
    if s.quantization != "none":
        raise InputError(f"{{quantization}} {s.quantization} cannot be traced (quantized kernels have no meta "
                         "implementation); trace the unquantized model", field="quantization")
    if s.kv_cache_dtype != "auto":
        raise InputError(f"{{kv_cache_dtype}} {s.kv_cache_dtype} cannot be traced: transformers' cache keeps K/V in "
                         "the model dtype; trace with {kv_cache_dtype} auto", field="kv_cache_dtype")
    if s.parallelism.tp > 1 or s.parallelism.pp > 1:
        raise InputError("serving with {tp}/{pp} cannot be traced: the trace runs one device's model", field="tp")


def cache_tensors(cache: Any) -> list[torch.Tensor]:
    """The tensors a transformers Cache holds (keys, values and any per-layer state)."""
    out: list[torch.Tensor] = []
    for layer in getattr(cache, "layers", ()):
        for value in vars(layer).values():
            if isinstance(value, torch.Tensor) and value.numel():
                out.append(value)
    return out


@contextlib.contextmanager
def head_hooks(tracker: StorageTracker, layers: list[Any], head: Any, tick: Callable[[str], None]) -> Iterator[None]:
    """Mark the logits (lm_head onwards) and report each decoder layer's forward."""

    def head_pre(module: Any, args: Any) -> None:
        tracker.kind = Kind.LOGITS

    def layer_pre(module: Any, args: Any) -> None:
        tick(tracker.phase)

    handles = [head.register_forward_pre_hook(head_pre)]
    handles += [layer.register_forward_pre_hook(layer_pre) for layer in layers]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def run_generate(model: Any, s: ServingConfig, max_model_len: int, tracker: StorageTracker, *, device: str,
                 tick: Callable[[str], None], layers: list[Any], head: Any,
                 decode_steps: int = DECODE_STEPS) -> list[str]:
    """Prefill and decode under the tracker; returns notes on what was simulated.

    Raises:
        InputError: max_model_len leaves no prompt token.
    """
    from transformers import DynamicCache

    prompt = max_model_len - decode_steps
    if prompt < 1:
        raise InputError(f"{{max_model_len}} {max_model_len} is too short to trace a prompt and {decode_steps} decode steps",
                         field="max_model_len")
    model.eval()
    # transformers 5.2x renames past_key_values to cache (the old name warns until 5.40)
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with tracker, torch.no_grad(), head_hooks(tracker, layers, head, tick):
        tracker.enter_phase("prefill", Kind.ACTIVATIONS)
        cache = DynamicCache(config=model.config)
        ids = torch.zeros((s.batch_size, prompt), dtype=torch.long, device=device)
        for step in range(decode_steps + 1):
            if step:
                tracker.enter_phase("decode", Kind.ACTIVATIONS)
            out = model(input_ids=ids, **{cache_arg: cache}, use_cache=True, logits_to_keep=1)
            tracker.retag(cache_tensors(cache), Kind.KV_CACHE, "KV cache")
            tracker.kind = Kind.LOGITS
            next_logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
            del out
            ids = torch.argmax(next_logits, dim=-1)[:, None]
            del next_logits
    note = (f"transformers generate: DynamicCache, prompt {prompt} tokens x {plural(s.batch_size, 'sequence')}, "
            f"{decode_steps} decode steps to {max_model_len} tokens")
    return [note]
