"""memest's second opinion: the real model code run on PyTorch's meta device, every storage counted.

:func:`trace` builds the transformers model of a config on the meta device (no memory, no
compute) and runs the job's step as a script would — forward, backward and optimizer step for
training, prefill and decode for serving — while :class:`~memest.trace._tracker.StorageTracker`
records every storage allocated and freed. The result is the step's exact peak, what was live at
that moment by kind (weights, gradients, optimizer states, activations, logits, KV cache,
workspace = temporaries), and the timeline. To behave like the GPU run:

- attention goes through the fused kernels' meta implementations (:mod:`._attention`), so the
  trace keeps what FlashAttention keeps, not the s x s scores of the math fallback;
- ``amp`` autocast is emulated with CUDA's op lists (:mod:`._autocast`);
- activation checkpointing is the model's own ``activation_checkpointing_enable``;
- allocations are replayed through the CUDA caching allocator (:mod:`.allocator`) for the
  allocated (512-byte blocks) and reserved figures;
- ZeRO-2/3 and FSDP2 sharding run FSDP2 at world size N on a fake process group
  (:mod:`._distributed`), rank 0 traced.

:func:`compare` lines a trace up against the analytic estimate, kind by kind.

This package imports torch, transformers and peft only inside :func:`trace`; importing it (and
``memest.trace.result``, ``memest.trace.allocator``, ``memest.trace.compare``) stays light.
"""

from __future__ import annotations

from collections.abc import Callable

from memest.devices import DEFAULT_DEVICE, Device, get_device
from memest.errors import InputError, MissingDependencyError
from memest.sources.config import HFConfig
from memest.trace.compare import Comparison, compare
from memest.trace.result import RankTrace, TensorGroup, TimelinePoint, TraceResult
from memest.workload import Workload

__all__ = ["Comparison", "RankTrace", "TensorGroup", "TimelinePoint", "TraceResult", "compare", "trace"]

TARGETS = ("cuda", "cpu")


def trace(
    model: HFConfig | str,
    workload: Workload,
    device: Device | None = None,
    *,
    target: str = "cuda",
    trust_remote_code: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
    decode_steps: int = 2,
    rank: int = 0,
) -> TraceResult:
    """Run ``workload``'s step with the real model code on the meta device and count every storage.

    Args:
        model: The model's config (an :class:`HFConfig`) or a reference :func:`memest.sources.load_config`
            resolves (catalog name, Hub id, path).
        workload: A TrainingConfig (full or LoRA) or ServingConfig (transformers generate).
        device: The accelerator, for its cuBLAS workspace (default: memest's default device).
        target: ``cuda`` (fused-attention choices, caching-allocator replay) or ``cpu`` (the CPU
            kernels' choices, tensor bytes; to compare with a real CPU run).
        trust_remote_code: Allow a model_type transformers lacks to run the repository's code.
        progress: Called as ``progress(what, done, total)`` after each decoder-layer pass.
        decode_steps: Serving: decode steps after the prefill.
        rank: Sharded training: the rank of the FSDP2 group to trace (0 holds the largest shards).

    Returns:
        The trace: per-rank peak allocated and reserved, live bytes by kind at the peak, the
        largest tensor groups then, and the timeline.

    Raises:
        InputError: a setting the trace cannot simulate (QLoRA, offload, tp/pp/cp/ep, quantized
            serving, 8-bit optimizers, ...), or an invalid workload.
        UnsupportedArchitectureError: transformers cannot build the model.
        MissingDependencyError: torch or transformers (or peft, for LoRA) is not installed.
    """
    from memest.sources import load_config, spec_from_config
    from memest.workload import validate

    if target not in TARGETS:
        raise InputError(f"trace target {target!r} is not one of {', '.join(TARGETS)}")
    if decode_steps < 1:
        raise InputError(f"decode_steps is {decode_steps}; it must be at least 1")
    cfg = load_config(model) if isinstance(model, str) else model
    spec = spec_from_config(cfg, trust_remote_code=trust_remote_code)
    validate(spec, workload)
    try:
        from memest.trace import _run
    except ImportError as exc:
        raise MissingDependencyError(
            f"memest trace needs torch and transformers ({exc}); install with: pip install torch transformers"
        ) from exc
    return _run.run(cfg, spec, workload, device or get_device(DEFAULT_DEVICE), target=target,
                    trust_remote_code=trust_remote_code, progress=progress, decode_steps=decode_steps, rank=rank)
