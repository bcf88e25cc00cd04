"""Run a traced job end to end: build the model, run the step under the tracker, summarise the peak."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from memest.devices import Device
from memest.errors import InputError
from memest.estimate import runtime
from memest.result import Kind
from memest.sources.config import HFConfig
from memest.spec import ModelSpec
from memest.trace import _distributed, _model, _serving, _training
from memest.trace._attention import routed_attention
from memest.trace._tracker import StorageTracker, describe
from memest.trace.result import RankTrace, TensorGroup, TimelinePoint, TraceResult
from memest.workload import Engine, Method, Precision, Recompute, ServingConfig, TrainingConfig, Workload

Progress = Callable[[str, int, int], None]

TOP_GROUPS = 12
TIMELINE_POINTS = 800


class _Ticker:
    """Counts decoder-layer passes for a progress callback."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress = progress
        self.total = total
        self.done = 0

    def __call__(self, what: str) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(what, min(self.done, self.total), self.total)


def run(cfg: HFConfig, spec: ModelSpec, workload: Workload, device: Device, *, target: str,
        trust_remote_code: bool, progress: Progress | None, decode_steps: int, rank: int = 0) -> TraceResult:
    """See :func:`memest.trace.trace`."""
    started = time.perf_counter()
    job = _Job(cfg, spec, device, target, trust_remote_code, progress, StorageTracker(cuda=target == "cuda"))
    with contextlib.ExitStack() as stack:
        stack.enter_context(_model.data_dependent_answers())
        if isinstance(workload, TrainingConfig):
            world_size = _trace_training(job, workload, stack, rank)
        elif isinstance(workload, ServingConfig):
            world_size = _trace_serving(job, workload, stack, decode_steps)
        else:
            raise TypeError(f"workload must be a TrainingConfig or ServingConfig, not {type(workload).__name__}")
        job.tracker.close()
    if spec.quantization is not None:
        job.settings.append(f"the checkpoint's {spec.quantization.method} quantization is not simulated: weights "
                            "traced unquantized")
    if job.kernels:
        job.settings.append("attention kernels: " + ", ".join(sorted(job.kernels)))
    if target == "cuda":
        job.settings.append("CUDA caching allocator replayed (512-byte blocks, 2 MiB / 20 MiB segments, best fit, split)")
    return TraceResult(
        model=spec.name,
        mode=workload.mode,
        target=target,
        world_size=world_size,
        ranks=(summarize(job.tracker, rank=rank if world_size > 1 else 0),),
        seconds=time.perf_counter() - started,
        num_ops=job.tracker.num_ops,
        settings=tuple(job.settings),
    )


@dataclass
class _Job:
    """What a traced run shares between its steps."""

    cfg: HFConfig
    spec: ModelSpec
    device: Device
    target: str
    trust_remote_code: bool
    progress: Progress | None
    tracker: StorageTracker
    settings: list[str] = field(default_factory=list)
    kernels: set[str] = field(default_factory=set)

    def build(self, dtype: torch.dtype, attn_implementation: str) -> Any:
        model, attn = _model.build(self.cfg, dtype, attn_implementation, task=self.spec.task,
                                   trust_remote_code=self.trust_remote_code)
        if attn != attn_implementation:
            self.settings.append(f"{self.cfg.model_type} has no SDPA attention in transformers: eager (s x s scores kept)")
        return model


def _trace_training(job: _Job, t: TrainingConfig, stack: contextlib.ExitStack, rank: int) -> int:
    """Build, shard (ZeRO-2/3, fsdp2) and trace one training step; returns the world size simulated."""
    _training.check_supported(t)
    par, tracker = t.parallelism, job.tracker
    sharded = par.zero_stage >= 2 or t.precision is Precision.FSDP2
    recipe = _training.sharded_recipe(t.precision) if sharded else _training.RECIPES[t.precision]
    eager = t.attn_implementation == "eager" and t.recompute is not Recompute.SELECTIVE
    model = job.build(recipe.param_dtype, "eager" if eager else "sdpa")
    if t.method is Method.LORA:
        model = _model.apply_lora(model, _model.lora_targets(job.spec, t.lora.targets), t.lora.rank, job.spec.task)
    if t.recompute is Recompute.FULL:
        _model.enable_checkpointing(model, tracker.recomputing)
    model.train()
    layers, head = _model.decoder_layers(model), _model.lm_head(model)
    world_size, input_device = 1, "meta"
    if sharded:
        world_size = par.dp * par.cp
        if not 0 <= rank < world_size:
            raise InputError(f"rank {rank} is not in the {world_size} ranks of the sharding group")
        mesh = stack.enter_context(_distributed.fake_world(world_size, rank))
        _distributed.shard(model, mesh, param_dtype=recipe.fsdp_param_dtype, reshard_after_forward=par.zero_stage != 2)
        stack.enter_context(_distributed.fake_tensors(model))
        stack.enter_context(_distributed.storage_resizes_seen(tracker))
        input_device, tracker.devices = "cpu", ("cpu",)
        job.settings.append(f"FSDP2 fully_shard per decoder layer + root at world size {world_size} (fake process "
                            f"group), reshard_after_forward={par.zero_stage != 2}, param_dtype "
                            f"{_dtype_name(recipe.fsdp_param_dtype or recipe.param_dtype)}; rank {rank} traced")
    elif par.dp * par.cp > 1:
        job.settings.append(f"dp {par.dp * par.cp} without ZeRO: one replica traced; DDP's gradient buckets "
                            "(one more gradient-sized buffer) are not simulated")
    _adopt_model(tracker, model, job.target, job.device)
    ticker = _Ticker(job.progress, min(t.grad_accum_steps, 2) * 2 * len(layers) + 1)
    stack.enter_context(routed_attention(job.target, job.kernels))
    job.settings += _training.run_step(model, t, tracker, recipe, device=input_device, tick=ticker, layers=layers,
                                       head=head)
    job.settings.insert(0, _recipe_words(t, recipe))
    return world_size


def _trace_serving(job: _Job, s: ServingConfig, stack: contextlib.ExitStack, decode_steps: int) -> int:
    """Build and trace transformers generate; returns the world size simulated (1)."""
    from memest.estimate.serving.common import weight_dtype

    _serving.check_supported(s)
    if job.spec.task != "causal_lm":
        raise InputError(f"serving {job.spec.name} ({job.spec.task}) cannot be traced: the serving trace runs "
                         "transformers generate, which needs a causal LM; drop {trace} and use the analytic estimate",
                         field="trace")
    dtype = _model.torch_dtype(weight_dtype(job.spec, s))
    model = job.build(dtype, "sdpa")
    layers, head = _model.decoder_layers(model), _model.lm_head(model)
    _adopt_model(job.tracker, model, job.target, job.device)
    max_len = s.max_model_len or job.spec.max_position_embeddings or 2048
    ticker = _Ticker(job.progress, (decode_steps + 1) * len(layers))
    stack.enter_context(routed_attention(job.target, job.kernels))
    job.settings += _serving.run_generate(model, s, max_len, job.tracker, device="meta", tick=ticker, layers=layers,
                                          head=head, decode_steps=decode_steps)
    job.settings.insert(0, f"weights in {_dtype_name(dtype)}")
    if s.engine is not Engine.HF:
        job.settings.append(f"the trace runs transformers generate; {s.engine.value}'s KV pool is a budget, not a "
                            "trace: compare its weights and activations, or use --engine hf")
    return 1


def _adopt_model(tracker: StorageTracker, model: Any, target: str, device: Device) -> None:
    """Track the parameters and buffers that exist before the step, and the cuBLAS workspace."""
    tracker.adopt((_training.local(p) for p in model.parameters()), Kind.WEIGHTS, "parameter")
    tracker.adopt((b for b in model.buffers() if b.numel()), Kind.WEIGHTS, "buffer")
    if target == "cuda":
        tracker.allocate(runtime.cublas_workspace_bytes(device), Kind.WORKSPACE, "cuBLAS workspace (device constant)")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _recipe_words(t: TrainingConfig, recipe: _training.TraceRecipe) -> str:
    words = f"precision {t.precision.value}: parameters {_dtype_name(recipe.param_dtype)}"
    if recipe.autocast:
        words += f", autocast {_dtype_name(recipe.autocast)}"
    return words + f", optimizer {t.optimizer.value}"


def summarize(tracker: StorageTracker, *, rank: int = 0, top: int = TOP_GROUPS, points: int = TIMELINE_POINTS) -> RankTrace:
    """The peak of a finished trace, what was live then, and the timeline by kind."""
    peak_event = tracker.peak_event
    by_kind: dict[Kind, int] = defaultdict(int)
    groups: dict[tuple[Kind, str], list[int]] = defaultdict(lambda: [0, 0])
    for rid, block in enumerate(tracker.block):
        if not block or tracker.alloc_event[rid] > peak_event:
            continue
        freed = tracker.free_event[rid]
        if 0 <= freed <= peak_event:
            continue
        kind = tracker.kinds[rid]
        by_kind[kind] += block
        g = groups[(kind, describe(tracker.labels[rid]))]
        g[0] += 1
        g[1] += block
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][1])[:top]
    phase = _phase_at(tracker.phase_marks, peak_event)
    allocator = tracker.allocator
    timeline, phase_peaks = _timeline(tracker, points)
    return RankTrace(
        rank=rank,
        peak_allocated_bytes=tracker.peak,
        peak_reserved_bytes=allocator.peak_reserved_bytes if allocator is not None else tracker.peak,
        peak_tensor_bytes=tracker.peak_tensor_bytes,
        by_kind={k: by_kind[k] for k in Kind if by_kind.get(k)},
        peak_phase=phase,
        peak_event=peak_event,
        num_events=len(tracker.events),
        phase_peaks=phase_peaks,
        groups=tuple(TensorGroup(kind, label, n, b) for (kind, label), (n, b) in ranked),
        timeline=timeline,
    )


def _phase_at(marks: list[tuple[int, str]], event: int) -> str:
    phase = marks[0][1]
    for start, name in marks:
        if start > event:
            break
        phase = name
    return phase


def _timeline(tracker: StorageTracker, points: int) -> tuple[tuple[TimelinePoint, ...], dict[str, int]]:
    """Allocated bytes by kind after each event, sampled to about ``points`` points (the peak kept),
    and the exact peak of each phase after the warm-up."""
    events = tracker.events
    stride = max(1, len(events) // points)
    marks = tracker.phase_marks
    current: dict[Kind, int] = defaultdict(int)
    total = 0
    out: list[TimelinePoint] = []
    phase_peaks: dict[str, int] = {}
    mark_i, phase = 0, marks[0][1]
    for i, e in enumerate(events):
        while mark_i < len(marks) and marks[mark_i][0] <= i:
            phase = marks[mark_i][1]
            mark_i += 1
            if phase != "setup" and total > phase_peaks.get(phase, -1):
                phase_peaks[phase] = total  # what the phase starts with
        rid = e if e >= 0 else ~e
        delta = tracker.block[rid] if e >= 0 else -tracker.block[rid]
        current[tracker.kinds[rid]] += delta
        total += delta
        if phase != "setup" and total > phase_peaks.get(phase, -1):
            phase_peaks[phase] = total
        if i % stride == 0 or i == tracker.peak_event or i == len(events) - 1:
            out.append(TimelinePoint(i, phase, {k: v for k, v in current.items() if v}))
    return tuple(out), phase_peaks
