"""Does it fit, and what is the cheapest setup that does — answered by search over the estimator.

The fit rule lives in :mod:`memest.planning.fit` (re-exported here): per-device *device used* at most
``(1 - headroom)`` x capacity; for vLLM, the engine starts with its gpu_memory_utilization, its KV
pool holds the batch, and its footprint is within capacity.

The planner
===========

:func:`plan` enumerates setups, estimates them and returns, for each device type, the cheapest
setup that fits, all ranked by :class:`memest.planning.costs.Cost`: **money** (devices x the per-device
price), then **communication** (tensor parallel within a node; pipeline and data parallel across
nodes; ZeRO-3's re-gathers), then **disruption** (recompute, accumulation, 8-bit optimizer,
offload; LoRA/QLoRA only when the method may change; quantized weights and an fp8 KV cache for
serving only when quantization is allowed), then the fewest changed settings. The weights are
data, in :mod:`memest.planning.costs` (its docstring has the table).

Search space
------------

- **device type**: the ones the user lists (``--gpu``, ``--gpus-available``), else the catalog;
- **device count** N: powers of two and whole nodes (multiples of ``per_node``), up to a maximum;
- **layout** N = tp x pp x cp x dp (serving: N = tp x pp x the user's dp replicas, each an engine holding
  ``ceil(batch_size / dp)`` of the sequences: ``ServingConfig.replica_batch_size``); a training job stays in its
  stack (:mod:`memest.workload.stacks`): tp and pp are searched only where the stack runs them
  (Megatron-LM, NeMo, torchtitan) or with ``allow_stack_change`` (such a setup runs under
  Megatron-LM, and its printed command says ``--stack megatron``; the settings the job's stack filled
  take Megatron-LM's defaults, :func:`memest.workload.stacks.restack`, as that command resolves them);

  - tp divides ``per_node`` (tensor parallelism stays within a node) and passes
    :func:`memest.workload.validate` (tp divides the heads; the KV-head rules);
  - training: pp divides ``num_layers``. Megatron-LM asserts ``num_layers %
    pipeline_model_parallel_size == 0`` (``megatron/core/transformer/transformer_block.py``,
    ``get_num_layers_to_build``) unless first/last stage sizes are given; even stages are what
    people run, and an uneven split only adds layers to the first stage, which already holds the
    embedding and needs the most memory;
  - serving: any pp up to ``num_layers``. vLLM splits layers unevenly, the remainder going to the
    stages before the last (``get_pp_indices``; :func:`memest.estimate.sharding.vllm_stages`), so a
    model with a prime number of layers (DeepSeek-V3: 61) still runs on 2, 4, ... stages;
  - cp and ep are the user's (a layout they do not divide is skipped). Expert parallelism is not
    searched: the estimator divides routed experts by ep and then by tp, and ZeRO by all of
    dp x cp, which undercounts experts (replicated over dp / ep, not dp) and vLLM's expert
    parallelism (which replaces tp for the experts); searching ep would exploit that;

- **settings**, each from the user's value towards less memory (never the other way):
  ``zero_stage`` (also on one data-parallel replica: ZeRO shards nothing there, but the engine it selects
  still changes what a device holds: DeepSpeed with ``bf16`` enabled casts the model to bf16 at any world
  size (``deepspeed/runtime/engine.py`` ``_configure_distributed_model``: ``elif self.bfloat16_enabled():
  self.module.bfloat16()``), where the HF Trainer without it keeps fp32 weights under autocast, and
  ZeRO-Offload moves the optimizer to host RAM on a single GPU, as transformers' DeepSpeed guide deploys it
  with ``deepspeed --num_gpus=1``), ``sequence_parallel`` (when tp > 1), ``recompute``,
  ``micro_batch_size`` (with ``allow_batch_reshape``: divisors of the one asked, with
  ``grad_accum_steps`` raised to hold the global batch: ``--global-batch-size`` when given, else the
  per-replica batch micro_batch_size x grad_accum_steps), ``optimizer`` (with
  ``allow_optimizer_change``: adamw, adamw_fused -> adamw8bit), ``offload``,
  ``method`` (full -> lora -> qlora, with ``allow_method_change``; only those the setup's stack runs,
  :attr:`memest.workload.StackDefaults.methods`), ``loss`` (default -> chunked ->
  fused, the ones the job's stack switches on, with ``allow_loss_change``); serving: ``quantization``
  (fp8 on fp8 devices, int8, int4) and ``kv_cache_dtype`` fp8 (with ``allow_quantization``).

Search order and pruning
------------------------

A setup fits when the device fits (:mod:`memest.planning.fit`) and, with offload, the host RAM it needs
per server (``Estimate.host_bytes``) is within ``Space.host_memory_bytes``.

Per device type, counts are visited in increasing order and the visit stops once a count's money
exceeds the best fit found (so a zero price searches every count; an unpriced device, whose price
is ``inf``, stops at its first count that fits). Within a count, setups are
estimated in cost order and the first that fits is that count's best: nothing cheaper is skipped.

To avoid estimating every setup of a layout that cannot fit, each layout is first probed with its
*floor setups*, and skipped when none of them fits. Each setting's values are ordered from most to
least memory; its *floor values* are the most-saving value plus every value from which one more
step towards saving may *raise* memory (:data:`FLOOR_VALUES`: all ZeRO stages, since ZeRO-3 adds a
gather buffer and other frameworks change buffers with the stage; selective recompute, since full
recompute rebuilds a whole layer; every method, since QLoRA upcasts the weights it does not quantize
to fp32 and LoRA keeps an fp32 copy of each adapted projection's input, replicated on every
tensor-parallel rank; a micro-batch with no accumulation, since accumulating keeps gradients alive through the next
forward; every quantization format). The floor setups are the combinations of floor values; one
the estimator rejects (offload without ZeRO, say) is replaced by the most-saving valid setups below
it, found by stepping settings down one value at a time, never onto a floor value.

This is exact when every step from a non-floor value towards saving does not raise memory
(``tests/test_plan_search.py`` checks those steps on the catalog, and compares the planner with a
brute-force search over small spaces); ``prune=False`` turns pruning off.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import shlex
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from memest.devices import Device
from memest.errors import InputError
from memest.estimate import estimate
from memest.estimate.serving import estimate_serving
from memest.planning.costs import NO_PENALTY, Cost, PriceTable, doubling_penalty, penalty
from memest.planning.fit import Verdict, verdict
from memest.planning.maxfit import Largest, limits
from memest.result import Estimate
from memest.spec import ModelSpec
from memest.workload import (
    STACKS,
    Engine,
    Loss,
    Method,
    Offload,
    Optimizer,
    Parallelism,
    Recompute,
    ServingConfig,
    Stack,
    TrainingConfig,
    Workload,
    capability_refusal,
    divisors,
    refusal,
    tp_head_problem,
    validate,
)
from memest.workload.resolve import FSDP_ZERO_STAGE
from memest.workload.settings import cli_flag, settings, value_of
from memest.workload.stacks import restack, supports

__all__ = [
    "DeviceChoice", "Fit", "Plan", "Setup", "Space", "Verdict", "device_counts", "hf_command", "plan", "setup_flags", "smallest_parallelism", "verdict",
    "widenings",
]

MAX_DEVICE_DOUBLINGS = 6
"""``memest hf`` recommendations try up to 2^6 = 64 times the devices asked for."""

DEFAULT_MAX_DEVICES = 1024
"""Devices per type the planner tries when the user gives no maximum."""

DEFAULT_HOST_MEMORY_BYTES = 1024 << 30
"""Host RAM per server that offloaded states may use, unless the user says otherwise: 1 TiB, about
what 8-GPU cloud servers carry (1.1 TiB on AWS p4d, 2 TiB on p5)."""

FLOOR_VALUES: dict[str, frozenset[Any] | None] = {
    "zero_stage": None,
    "quantization": None,
    "recompute": frozenset({"selective"}),
    "method": None,
}
"""Floor values besides each setting's most-saving one (None: every value). A step towards saving
*from* one of these may raise memory: ZeRO-3's gather buffer of two unsharded layers can exceed
what it saves when dp is small and layers are few, and the framework a ZeRO stage selects changes
the gradient buffers; full recompute rebuilds one whole layer in backward, more than selective keeps
for a one-layer pipeline stage; QLoRA upcasts the weights it does not quantize (embeddings) to fp32,
and LoRA's fp32 copies of each adapted projection's input (PEFT ``_cast_input_dtype``) are replicated on
every tensor-parallel rank without sequence parallelism, where a full fine-tune's activations are split:
at tp 8 they outweigh the states LoRA saves (Llama-2-7B, mbs 4, seq 2048: +2.8 GB per device);
int8 keeps a scale per row where fp8 keeps one per tensor. The micro-batch knob adds its value with
no accumulation (see :func:`_batch_knob`)."""

RECOMPUTE_ORDER = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
OFFLOAD_ORDER = (Offload.NONE, Offload.OPTIMIZER, Offload.PARAMS)
METHOD_ORDER = (Method.FULL, Method.LORA, Method.QLORA)
LOSS_ORDER = (Loss.DEFAULT, Loss.CHUNKED, Loss.FUSED)
"""Losses from most to least logits memory (:func:`memest.estimate.training.activation_terms._logits`)."""
QUANTIZATION_ORDER = ("none", "fp8", "int8", "int4")
ADAM_32BIT = tuple(o for o in Optimizer if o.value in ("adamw", "adamw_fused"))
"""Optimizers the planner may swap for 8-bit AdamW (same algorithm, 8-bit states)."""
_PAR_FIELDS = ("zero_stage", "sequence_parallel")


# ---- what the planner may change, and what it found ----


@dataclass(frozen=True, slots=True)
class DeviceChoice:
    """A device type the planner may use.

    Attributes:
        device: The accelerator.
        max_count: Most devices of this type (``--gpus-available 8xH100`` gives 8).
        min_count: Fewest devices (``memest hf`` recommendations start at the count asked).
    """

    device: Device
    max_count: int = DEFAULT_MAX_DEVICES
    min_count: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Space:
    """What the planner may change.

    Attributes:
        devices: Device types with their count limits.
        prices: USD per device-hour.
        allow_method_change: Training: LoRA / QLoRA instead of the method asked.
        allow_quantization: Serving: quantized weights and an fp8 KV cache.
        allow_offload: Training: CPU offload of optimizer states / parameters. Off by default:
            the ranking has no throughput model, and offloading slows a step several-fold, so a
            plan that offloads is cheaper per hour only on paper.
        lossless_only: Only settings that change neither numerics nor method (no 8-bit
            optimizer, no method change, no quantization).
        global_batch_size: Training: sequences per optimizer step to hold (micro_batch_size x
            grad_accum_steps x dp); None holds the per-replica batch instead.
        allow_stack_change: Training: layouts the job's stack cannot run (tensor / pipeline parallelism
            under a stack without it, :attr:`memest.workload.StackDefaults.model_parallel`), run by
            Megatron-LM.
        allow_optimizer_change: Training: 8-bit AdamW in place of the 32-bit AdamW asked (``memest plan``
            and :func:`memest.plan_memory` turn it off unless asked).
        allow_batch_reshape: Training: a smaller micro-batch with more accumulation steps (off in
            ``memest plan`` unless asked, as above).
        allow_loss_change: Training: a chunked or fused cross-entropy the job's stack switches on by a
            setting of its own (:attr:`memest.workload.StackDefaults.losses`); ``memest hf`` turns it on
            when the logits are a large part of the job (:func:`memest.planning.recommend.logits_dominate`).
        host_memory_bytes: Host RAM per server for offloaded states (``Estimate.host_bytes``); a
            setup that needs more does not fit. None: not checked.
    """

    devices: tuple[DeviceChoice, ...]
    prices: PriceTable = field(default_factory=PriceTable.catalog)
    allow_method_change: bool = False
    allow_quantization: bool = False
    allow_offload: bool = False
    lossless_only: bool = False
    global_batch_size: int | None = None
    allow_stack_change: bool = False
    allow_optimizer_change: bool = True
    allow_batch_reshape: bool = True
    allow_loss_change: bool = False
    host_memory_bytes: int | None = DEFAULT_HOST_MEMORY_BYTES


@dataclass(frozen=True, slots=True)
class Setup:
    """One point of the search space.

    Attributes:
        device: The accelerator.
        count: Devices in the job.
        workload: The workload as it would run (parallelism and settings filled in).
        cost: Its rank key.
        notes: Why it costs what it costs, one line per penalty paid.
        lossless: True when it changes neither numerics nor method.
    """

    device: Device
    count: int
    workload: Workload
    cost: Cost
    notes: tuple[str, ...]
    lossless: bool


@dataclass(frozen=True, slots=True)
class Fit:
    """A setup that fits, with its estimate and the max queries on it.

    Attributes:
        setup: The setup.
        estimate: Its per-device estimate.
        verdict: Its fit verdict (peak per device, margin).
        limits: Largest micro-batch / seq_len (training) or batch_size / max_model_len (serving)
            that still fit this setup, the other settings held.
    """

    setup: Setup
    estimate: Estimate
    verdict: Verdict
    limits: tuple[Largest, ...] = ()


@dataclass(frozen=True, slots=True)
class Plan:
    """The planner's answer.

    Attributes:
        spec: The model.
        workload: The workload asked for (the search's starting point).
        space: What the search could change.
        headroom: Share of memory kept free.
        fits: The cheapest fitting setups of each device type (``top`` of each), cheapest first.
        no_fit: Device types on which nothing fits within their count limit.
        not_run: Device types the job's engine or training framework does not run on
            (:func:`memest.workload.refusal`); not searched.
        evaluated: Estimates computed.
        setups: Setups decided at the counts visited: estimated, skipped by pruning, or ruled out
            because a cheaper one fitted.
    """

    spec: ModelSpec
    workload: Workload
    space: Space
    headroom: float
    fits: tuple[Fit, ...]
    no_fit: tuple[DeviceChoice, ...]
    evaluated: int
    setups: int
    not_run: tuple[DeviceChoice, ...] = ()
    widenings: tuple[str, ...] = ()
    """When nothing fits: the :class:`Space` switches that, turned on, find a fit (:func:`widenings`)."""
    top: int = 1
    """Fits kept per device type (:func:`plan`'s ``top``): :attr:`fits` holds at most this many of each."""

    @property
    def best(self) -> Fit | None:
        """The cheapest fit overall."""
        return self.fits[0] if self.fits else None


# ---- the search ----


@dataclass(frozen=True, slots=True)
class _Knob:
    """One setting's values, least saving first, with their cost parts."""

    name: str
    values: tuple[Any, ...]
    communication: tuple[float, ...]
    disruption: tuple[float, ...]
    changed: tuple[int, ...]
    lossless: tuple[bool, ...]
    why: tuple[str, ...]
    floor: tuple[int, ...]


def _knob(name: str, values: Iterable[Any]) -> _Knob:
    vals = tuple(dict.fromkeys(values))
    pens = [penalty(name, v) for v in vals]
    extras = FLOOR_VALUES.get(name, frozenset())
    floor = sorted({len(vals) - 1} | {i for i, v in enumerate(vals) if extras is None or getattr(v, "value", v) in extras})
    return _Knob(name, vals, tuple(p.communication for p in pens), tuple(p.disruption for p in pens),
                 tuple(int(p is not NO_PENALTY) for p in pens), tuple(p.lossless for p in pens),
                 tuple(p.why for p in pens), tuple(floor))


def _batch_knob(asked: int, options: list[tuple[int, int]]) -> _Knob:
    """Micro-batch / accumulation pairs, largest micro-batch first; penalty per halving.

    Floor values: the smallest micro-batch, and the pair without accumulation (one micro-batch per
    step lets plain PyTorch free the gradients before the forward; accumulating keeps them alive
    through the next micro-batch's forward, so the first halving can raise memory).
    """
    parts = [doubling_penalty("micro_batch", asked // b) for b, _ in options]
    why = tuple("" if b == asked else f"micro_batch_size {b} x grad_accum_steps {g}" for b, g in options)
    floor = sorted({len(options) - 1} | {i for i, (_, g) in enumerate(options) if g == 1})
    return _Knob("batch", tuple(options), tuple(c for c, _ in parts), tuple(d for _, d in parts),
                 tuple(int(b != asked) for b, _ in options), (True,) * len(options), why, tuple(floor))


@dataclass(slots=True)
class _Layout:
    """Parallel degrees for one count, with the settings that may vary on them."""

    par: Parallelism
    knobs: tuple[_Knob, ...]
    communication: float
    changes: int
    why: tuple[str, ...]
    valid: dict[tuple[int, ...], bool] = field(default_factory=dict)
    workloads: dict[tuple[int, ...], Workload] = field(default_factory=dict)
    results: dict[tuple[int, ...], tuple[Workload, Estimate, int] | None] = field(default_factory=dict)
    parallelisms: dict[tuple[Any, ...], Parallelism] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return math.prod(len(k.values) for k in self.knobs)


def _onwards(order: tuple[Any, ...], asked: Any) -> list[Any]:
    """The values of ``order`` from the one asked on (towards less memory); a value the order does
    not know stays as asked."""
    return list(order[order.index(asked):]) if asked in order else [asked]


def stack_losses(w: Workload) -> dict[Loss, str]:
    """The losses a training job's stack switches on by a setting of its own, each with that setting
    (:attr:`memest.workload.StackDefaults.losses`); none for a job with no stack, or serving."""
    stack = getattr(w, "stack", None)
    return dict(STACKS[stack].losses) if stack is not None else {}


def _runs_model_parallel(w: Workload) -> bool:
    """Whether a training job's stack runs tensor / pipeline parallelism (a job with no stack: any)."""
    stack = getattr(w, "stack", None)
    return stack is None or STACKS[stack].model_parallel


def most_devices(device: Device, max_count: int) -> int:
    """``max_count``, or fewer where one job uses at most :attr:`~memest.devices.Device.max_devices`."""
    return max_count if device.max_devices is None else min(max_count, device.max_devices)


def device_counts(device: Device, max_count: int, min_count: int = 1) -> list[int]:
    """Counts the planner tries: powers of two and whole nodes (multiples of per_node) in
    [min_count, max_count], plus min_count itself, ascending; none above the device's
    :attr:`~memest.devices.Device.max_devices` (one Apple Mac)."""
    max_count = most_devices(device, max_count)
    counts = {min_count} if min_count <= max_count else set()
    n = 1
    while n <= max_count:
        counts.add(n)
        n *= 2
    k = 1
    while device.per_node * k <= max_count:
        counts.add(device.per_node * k)
        k *= 2
    return sorted(c for c in counts if c >= min_count)


class _Search:
    """One planning run: the layouts and settings of each count, and the estimates made."""

    def __init__(self, spec: ModelSpec, workload: Workload, space: Space, headroom: float, prune: bool) -> None:
        self.spec = spec
        self.base = workload
        self.base_fields = {f.name: getattr(workload, f.name) for f in dataclasses.fields(workload)}
        self.space = space
        self.headroom = headroom
        self.prune = prune
        self.training = isinstance(workload, TrainingConfig)
        self.evaluated = 0
        self.setups = 0

    # -- layouts --

    def layouts(self, device: Device, n: int) -> list[_Layout]:
        """Every valid layout of ``n`` devices with its settings."""
        out = []
        for par in self._parallelisms(device, n):
            if not self._valid_layout(par):
                continue
            knobs = self._training_knobs(par) if self.training else self._serving_knobs(device)
            if knobs is None:
                continue
            comm = 0.0
            why = []
            for name in ("tp", "pp", "ep"):
                degree = getattr(par, name)
                comm += doubling_penalty(name, degree)[0]
                if degree > 1:
                    why.append(f"{name} {degree}")
            out.append(_Layout(par, knobs, comm, len(why), tuple(why)))
        return out

    def _valid_layout(self, par: Parallelism) -> bool:
        """Whether the job passes :func:`memest.workload.validate` at layout ``par``: as asked, else (training) at
        ZeRO stage 3 with the settings its stack filled taken at this layout (:func:`restack`), which the
        ``zero_stage`` knob and the setups' restacking reach: a stack that fixes them on several devices
        (litgpt's FSDP1 with Block checkpointing) refuses the asked ZeRO stage 0 and recompute there."""
        tries = [self.base.replace(parallelism=par)]
        if self.training and par.zero_stage < 3:
            w = self.base.replace(parallelism=dataclasses.replace(par, zero_stage=3))
            tries.append(restack(w, self._stack(par)))  # type: ignore[arg-type]
        for w in tries:
            try:
                validate(self.spec, w)
                return True
            except InputError:
                continue
        return False

    def _parallelisms(self, device: Device, n: int) -> Iterator[Parallelism]:
        user = self.base.parallelism
        cp = user.cp if self.training else 1  # serving: the user's dp replicas of tp x pp
        model_parallel = not self.training or self.space.allow_stack_change or _runs_model_parallel(self.base)
        for tp in divisors(device.per_node) if model_parallel else [user.tp]:
            if n % (tp * cp):
                continue
            rest = n // (tp * cp)
            for pp in divisors(rest) if model_parallel else [user.pp]:
                if rest % pp:
                    continue
                if self.training and self.spec.num_layers % pp:
                    continue  # training: even stages; serving: vLLM splits any pp <= num_layers
                dp = rest // pp if self.training else user.dp  # serving: the user's replicas, each tp x pp
                if not self.training and pp * tp * dp != n:
                    continue
                yield dataclasses.replace(user, tp=tp, pp=pp, dp=dp, cp=cp)

    # -- settings --

    def _training_knobs(self, par: Parallelism) -> tuple[_Knob, ...] | None:
        w = self.base
        assert isinstance(w, TrainingConfig)
        lossy = not self.space.lossless_only
        zero = list(range(par.zero_stage, 4))  # on one replica too: see the module docstring
        sp = [par.sequence_parallel] + ([True] if par.tp > 1 else [])  # settings only move towards less memory
        g = self.space.global_batch_size
        if g is None:
            per_replica = w.micro_batch_size * w.grad_accum_steps
        elif g % par.dp:
            return None
        else:
            per_replica = g // par.dp
        sizes = reversed(divisors(w.micro_batch_size)) if self.space.allow_batch_reshape else [w.micro_batch_size]
        batch = [(b, per_replica // b) for b in sizes if per_replica % b == 0]
        if not batch:
            return None  # the micro-batch asked cannot hold the batch on this many replicas
        recompute = _onwards(RECOMPUTE_ORDER, w.recompute)
        eight_bit = lossy and self.space.allow_optimizer_change and w.optimizer in ADAM_32BIT
        optimizer = [w.optimizer] + ([Optimizer.ADAMW8BIT] if eight_bit else [])
        offload = _onwards(OFFLOAD_ORDER, w.offload) if self.space.allow_offload else [w.offload]
        method = _onwards(METHOD_ORDER, w.method) if lossy and self.space.allow_method_change else [w.method]
        stack = self._stack(par)
        if stack is not None:  # never a method the layout's stack does not run (StackDefaults.methods)
            method = [m for m in method if supports(stack, m)]
            if not method:
                return None
        offered = stack_losses(w) if self.space.allow_loss_change else {}
        loss = [v for v in _onwards(LOSS_ORDER, w.loss) if v == w.loss or v in offered]
        return (_knob("zero_stage", zero), _knob("sequence_parallel", sp), _knob("recompute", recompute),
                _batch_knob(w.micro_batch_size, batch), _knob("optimizer", optimizer), _knob("offload", offload),
                _knob("method", method), _knob("loss", loss))

    def _serving_knobs(self, device: Device) -> tuple[_Knob, ...]:
        w = self.base
        assert isinstance(w, ServingConfig)
        allowed = self.space.allow_quantization and not self.space.lossless_only
        quant: list[str] = [w.quantization]
        if allowed and w.quantization == "none" and self.spec.quantization is None:
            quant = [q for q in QUANTIZATION_ORDER if (q != "fp8" or device.fp8)
                     and capability_refusal(w.replace(quantization=q), device) is None]
        kv = [w.kv_cache_dtype] + (["fp8"] if allowed and w.kv_cache_dtype in ("auto", "fp16", "bf16") else [])
        return _knob("quantization", quant), _knob("kv_cache_dtype", kv)

    def valid(self, layout: _Layout, cfg: tuple[int, ...]) -> bool:
        """True when :func:`memest.workload.validate` accepts the setup (memoised per layout)."""
        ok = layout.valid.get(cfg)
        if ok is None:
            try:
                validate(self.spec, self.workload(layout, cfg))
                ok = True
            except InputError:
                ok = False
            layout.valid[cfg] = ok
        return ok

    def floor_setups(self, layout: _Layout) -> set[tuple[int, ...]]:
        """The layout's floor setups (see the module docstring). A rejected combination of floor
        values gives way to the valid setups found by stepping settings down one value at a time
        (never onto a floor value), keeping those no other found setup dominates."""
        floors = [set(k.floor) for k in layout.knobs]
        out: set[tuple[int, ...]] = set()
        for combo in itertools.product(*floors):
            queue, seen, found = [combo], {combo}, []
            while queue:
                cfg = queue.pop(0)
                if self.valid(layout, cfg):
                    found.append(cfg)
                    continue
                for j, i in enumerate(cfg):
                    if i > 0 and i - 1 not in floors[j]:
                        lower = cfg[:j] + (i - 1,) + cfg[j + 1:]
                        if lower not in seen:
                            seen.add(lower)
                            queue.append(lower)
            out.update(c for c in found
                       if not any(d != c and all(x >= y for x, y in zip(d, c)) for d in found))
        return out

    # -- evaluation --

    def cost(self, usd: float, layout: _Layout, cfg: tuple[int, ...]) -> Cost:
        comm, dis, changes = layout.communication, 0.0, layout.changes
        for knob, i in zip(layout.knobs, cfg):
            comm += knob.communication[i]
            dis += knob.disruption[i]
            changes += knob.changed[i]
        return Cost(usd, comm, dis, changes)

    def workload(self, layout: _Layout, cfg: tuple[int, ...]) -> Workload:
        """The workload of a setup (memoised per layout; built with the constructor, which is
        several times faster than ``dataclasses.replace``)."""
        w = layout.workloads.get(cfg)
        if w is not None:
            return w
        fields: dict[str, Any] = dict(self.base_fields)
        par: dict[str, Any] = {}
        for knob, i in zip(layout.knobs, cfg):
            value = knob.values[i]
            if knob.name in _PAR_FIELDS:
                par[knob.name] = value
            elif knob.name == "batch":
                fields["micro_batch_size"], fields["grad_accum_steps"] = value
            else:
                fields[knob.name] = value
        key = tuple(par.values())
        parallelism = layout.parallelisms.get(key)
        if parallelism is None:
            parallelism = layout.parallelisms[key] = dataclasses.replace(layout.par, **par)
        fields["parallelism"] = parallelism
        stack = self._stack(parallelism)
        if self.training:
            fields["stack"] = stack
        w = type(self.base)(**fields)
        if self.training and w.stack_filled:  # type: ignore[union-attr]
            # the settings the stack filled and no knob changed: what the stack (a new one, or the same at
            # this layout: DeepSpeed's bf16 under a Trainer's ZeRO stage) does by default, as the printed
            # command resolves them (memest.workload.stacks.apply)
            left = frozenset(n for n in w.stack_filled if fields[n if n != "lora_targets" else "lora"]  # type: ignore[union-attr]
                             == self.base_fields[n if n != "lora_targets" else "lora"])
            w = restack(w, stack, refill=left)  # type: ignore[arg-type]
        layout.workloads[cfg] = w
        return w

    def _stack(self, par: Parallelism) -> Stack | None:
        """The stack a training setup of layout ``par`` runs: the job's, or Megatron-LM for tensor / pipeline
        parallelism the job's stack does not run (only with allow_stack_change, see :meth:`_parallelisms`)."""
        stack = getattr(self.base, "stack", None)
        if self.training and (par.tp > 1 or par.pp > 1) and not _runs_model_parallel(self.base):
            return Stack.MEGATRON
        return stack

    def evaluate(self, device: Device, layout: _Layout, cfg: tuple[int, ...]) -> tuple[Workload, Estimate, int] | None:
        """Estimate one setup (memoised per layout): (workload, estimate, per-device device-used
        bytes), or None when the estimator rejects the setup."""
        if cfg in layout.results:
            return layout.results[cfg]
        if layout.valid.get(cfg) is False:
            return None
        w = self.workload(layout, cfg)
        try:
            est = estimate(self.spec, w, device)
        except InputError:
            result = None
            layout.valid[cfg] = False
        else:
            self.evaluated += 1
            result = (w, est, est.per_device.device_used_bytes)
        layout.results[cfg] = result
        return result

    def fits(self, device: Device, layout: _Layout, cfg: tuple[int, ...], *, host: bool = True) -> bool:
        """True when the setup fits the device and, with ``host``, its offloaded states fit the
        host RAM. Pruning checks the device alone: offloading more raises host RAM, so only the
        device figure falls along the saving order."""
        result = self.evaluate(device, layout, cfg)
        if result is None or not verdict(result[1], device, 0, self.headroom).fits:
            return False
        limit = self.space.host_memory_bytes
        return not host or limit is None or result[1].host_bytes <= limit

    def best_for(self, choice: DeviceChoice, top: int = 1) -> list[Fit]:
        """The ``top`` cheapest fitting setups on one device type, cheapest first (none when nothing
        fits). Counts and setups are visited in cost order, so the search stops once the next one
        costs at least the ``top``-th fit found."""
        device = choice.device
        price = self.space.prices.price(device)
        best: list[tuple[Cost, int, _Layout, tuple[int, ...], int]] = []

        def bar() -> Cost | None:
            return best[top - 1][0] if len(best) >= top else None

        for n in device_counts(device, choice.max_count, choice.min_count):
            usd = n * price
            limit = bar()
            if limit is not None and (usd > limit.usd_per_hour or math.isinf(usd)):
                break  # an unpriced device: more of it cannot cost less (memest.planning.costs)
            ranked = []
            for layout in self.layouts(device, n):
                self.setups += layout.size
                if self.prune and not any(self.fits(device, layout, c, host=False) for c in self.floor_setups(layout)):
                    continue
                for cfg in itertools.product(*(range(len(k.values)) for k in layout.knobs)):
                    ranked.append((self.cost(usd, layout, cfg), len(ranked), layout, cfg))
            ranked.sort(key=lambda r: (r[0], r[1]))
            for cost, _, layout, cfg in ranked:
                limit = bar()
                if limit is not None and cost >= limit:
                    break
                if self.fits(device, layout, cfg):
                    best.append((cost, len(best), layout, cfg, n))
                    best.sort(key=lambda b: (b[0], b[1]))
                    del best[top:]
        return [self._fit(device, layout, cfg, n, cost) for cost, _, layout, cfg, n in best]

    def _fit(self, device: Device, layout: _Layout, cfg: tuple[int, ...], n: int, cost: Cost) -> Fit:
        result = layout.results[cfg]
        assert result is not None
        w, est, _ = result
        v = verdict(est, device, n, self.headroom)
        notes = layout.why + tuple(k.why[i] for k, i in zip(layout.knobs, cfg) if k.why[i])
        lossless = all(k.lossless[i] for k, i in zip(layout.knobs, cfg))
        return Fit(Setup(device, n, w, cost, notes, lossless), est, v)


def plan(spec: ModelSpec, workload: Workload, space: Space, *, headroom: float = 0.10, max_queries: bool = True,
         prune: bool = True, top: int = 1) -> Plan:
    """The ``top`` cheapest fitting setups of each device type in ``space``, ranked by cost.

    Args:
        spec: The model.
        workload: The job asked for; its settings are the search's starting point (see the module
            docstring for what may change).
        space: Device types, prices and what may change.
        headroom: Share of each device's memory to keep free.
        max_queries: Also find the largest micro-batch / seq_len (serving: batch_size /
            max_model_len) that fits each answer.
        prune: Skip layouts whose floor setups do not fit (exact under the documented
            monotonicity; False estimates every setup cheaper than the answer).
        top: Fits per device type (so the ``top`` best overall are among them).

    Raises:
        InputError: no device type, a non-positive count or global batch, or a workload that is
            invalid whatever the parallelism (a non-positive seq_len, ...).
    """
    if not space.devices:
        raise InputError("no device type to plan for; pass {gpu} NAME or {gpus_available} SPEC", field="gpus_available")
    for choice in space.devices:
        if choice.max_count < 1 or choice.min_count < 1:
            raise InputError(f"device count limits for {choice.device.name} must be at least 1 "
                             f"(got {choice.min_count}..{choice.max_count})")
    if space.global_batch_size is not None and space.global_batch_size < 1:
        raise InputError(f"{{global_batch_size}} is {space.global_batch_size}; it must be a positive integer",
                         field="global_batch_size")
    if space.host_memory_bytes is not None and space.host_memory_bytes < 0:
        raise InputError(f"host_memory_bytes is {space.host_memory_bytes}; it must not be negative")
    _valid_at_some_layout(spec, workload)
    search = _Search(spec, workload, space, headroom, prune)
    found: list[Fit] = []
    no_fit: list[DeviceChoice] = []
    not_run: list[DeviceChoice] = []
    for choice in space.devices:
        if refusal(workload, choice.device) is not None:
            not_run.append(choice)
            continue
        fits = search.best_for(choice, top)
        if not fits:
            no_fit.append(choice)
        found += fits
    found.sort(key=lambda f: f.setup.cost)
    if max_queries:
        found = [dataclasses.replace(f, limits=limits(spec, f.setup.workload, f.setup.device, headroom=headroom))
                 for f in found]
    return Plan(spec, workload, space, headroom, tuple(found), tuple(no_fit), search.evaluated, search.setups,
                tuple(not_run), top=top)


def _valid_at_some_layout(spec: ModelSpec, workload: Workload) -> None:
    """Refuse a workload that no layout the search tries can make valid (a non-positive seq_len, ...); a setting
    that needs a sharded layout (``offload``, ``float8_all_gather``: ZeRO / FSDP) is checked at one that shards.

    The search's own layouts are each validated and skipped when invalid; this check runs once, on one device
    with the job's ``cp``: at the job's ZeRO stage, else at stage 3 (FSDP FULL_SHARD, the stage every sharding
    rule accepts; :func:`memest.workload.validate`), else unsharded (a stack that runs no sharding on one device:
    litgpt's strategy ``"auto"``, :attr:`memest.workload.stacks.StackDefaults.one_unsharded`).

    Raises:
        InputError: the workload is invalid at both (the error at the job's own stage).
    """
    if not isinstance(workload, TrainingConfig):
        validate(spec, workload.replace(parallelism=Parallelism()))
        return
    first: InputError | None = None
    for zero_stage in dict.fromkeys((workload.parallelism.zero_stage, 3, 0)):
        try:
            validate(spec, workload.replace(parallelism=Parallelism(cp=workload.parallelism.cp, zero_stage=zero_stage)))
            return
        except InputError as exc:
            first = first or exc
    assert first is not None
    raise first


def widenings(p: Plan) -> Plan:
    """``p`` with :attr:`Plan.widenings` filled when nothing fits, each found by one more search run only then:
    ``host_memory_bytes`` when a training job that may offload fits with more host RAM than the space gives; else
    ``allow_stack_change`` when a training job's stack runs no tensor / pipeline parallelism, the search did not
    allow another stack, and allowing it finds a fit. The other switches widen what a job may change and are named
    by the report without a search."""
    w = p.workload
    if p.fits or not isinstance(w, TrainingConfig):
        return p
    if p.space.allow_offload and p.space.host_memory_bytes is not None:  # the host RAM given may be what rules out
        unlimited = plan(p.spec, w, dataclasses.replace(p.space, host_memory_bytes=None), headroom=p.headroom,
                         max_queries=False)
        if unlimited.fits:
            return dataclasses.replace(p, widenings=("host_memory_bytes",))
    if p.space.allow_stack_change or _runs_model_parallel(w):
        return p
    wider = plan(p.spec, w, dataclasses.replace(p.space, allow_stack_change=True), headroom=p.headroom,
                 max_queries=False)
    return dataclasses.replace(p, widenings=("allow_stack_change",)) if wider.fits else p


# ---- flags ----


def _flag_items(w: Workload, count: int) -> dict[str, str]:
    """The planner-controlled settings of a workload (each :class:`~memest.workload.settings.Setting`
    with ``planned`` for its mode) as ``memest hf`` flags (flag -> value; a switch is ``on`` or empty)."""
    training = isinstance(w, TrainingConfig)
    items = {cli_flag("gpus"): str(count)}
    for name, s in sorted(settings().items(), key=lambda item: item[1].group != "parallelism"):  # the layout first
        if s.planned not in ("all", "training" if training else "serving"):
            continue
        value = value_of(w, s)
        if isinstance(value, bool):
            items[cli_flag(name)] = "on" if value else ""
        else:
            items[cli_flag(name)] = str(value.value if isinstance(value, Enum) else value)
    if training:
        items[cli_flag("finetune")] = "" if w.method is Method.FULL else w.method.value
    return items


def _render(items: dict[str, str]) -> list[str]:
    return [flag if value == "on" else f"{flag} {value}" for flag, value in items.items() if value]


def setup_flags(workload: Workload, count: int, asked: Workload, device: Device | None = None) -> str:
    """The ``memest hf`` flags that turn the job asked for into a setup: the device, the count
    and parallel degrees always, and every planner setting whose value differs from ``asked``
    (the user's other flags stay as they were; on another stack, the values asked are compared as that
    stack fills them, :func:`memest.workload.stacks.restack`)."""
    base = _flag_items(restacked(asked, workload), asked.parallelism.world_size)
    items = _flag_items(workload, count)
    keep = {"--gpus", "--dp", "--tp", "--pp", cli_flag("stack")}  # a printed fix names its stack
    parts = [f"--gpu {shlex.quote(device.ref)}"] if device is not None else []
    for flag, value in items.items():
        if flag in keep or value != base[flag]:
            parts += _render({flag: value})
    return " ".join(parts)


def restacked(asked: Workload, setup: Workload) -> Workload:
    """The job asked on a setup's stack (the settings its own stack filled taken from the setup's), so that
    only the planner's own changes differ; ``asked`` itself on the same stack, or serving."""
    stack = getattr(setup, "stack", None)
    if not isinstance(asked, TrainingConfig) or stack is None or stack is asked.stack:
        return asked
    return restack(asked, stack)


def hf_command(model: str, given: Mapping[str, str], setup: str) -> str:
    """The ``memest hf`` command line that estimates a planned setup: the model as the user named
    it, the user's own workload flags (``given``: flag -> value, empty for a switch) less those the
    setup sets, then the setup's flags (:func:`setup_flags`)."""
    setup_names = {token for token in setup.split() if token.startswith("--")}
    if "--finetune" in setup_names:  # the setup changes the method: its --finetune replaces --train
        setup_names.add("--train")
        tokens = setup.split()
        method = tokens[tokens.index("--finetune") + 1]
        # and the user's settings of the method left (full training's optimizer_in_bwd) go with it
        setup_names |= {cli_flag(name) for name, st in settings().items() if st.methods and method not in st.methods}
    zero, fsdp = cli_flag("zero_stage"), cli_flag("fsdp")
    if zero in setup_names and fsdp in given:  # the user's FSDP strategy at the setup's stage, not both settings
        tokens = setup.split()
        i = tokens.index(zero)
        strategy = {stage: s.value for s, stage in reversed(FSDP_ZERO_STAGE.items())}.get(int(tokens[i + 1]))
        if strategy is not None:
            given = {**given, fsdp: strategy}
            setup = " ".join(tokens[:i] + tokens[i + 2:])
    parts = ["memest", "hf", shlex.quote(model)]
    for flag, value in given.items():
        if flag not in setup_names and flag not in _SEARCHED:
            parts += [flag, shlex.quote(value)] if value else [flag]
    return " ".join([*parts, setup] if setup else parts)


SEARCHED = {"gpus": 1, "dp": None, "tp": None, "pp": 1, "sequence_parallel": False}
"""Settings :func:`plan` chooses itself, with the values it starts from (sequence parallelism is
turned on wherever a layout has tp > 1)."""

_SEARCHED = frozenset({cli_flag("gpu"), *map(cli_flag, SEARCHED)})
"""Flags the planner chooses: a setup's own values replace the user's."""


MAX_PP_QUERY = 16
""":func:`smallest_parallelism` tries pipeline degrees up to this."""


def _parallel_candidates(spec: ModelSpec, device: Device) -> list[Parallelism]:
    tps = [t for t in (1, 2, 4, 8, 16, 32, 64) if device.per_node % t == 0 and tp_head_problem(spec, t) is None]
    pps = [p for p in (1, 2, 4, 8, 16) if p <= min(spec.num_layers, MAX_PP_QUERY)]
    out = [Parallelism(tp=t, pp=p) for t in tps for p in pps]
    return sorted(out, key=lambda par: (par.tp * par.pp, par.pp))


def smallest_parallelism(spec: ModelSpec, s: ServingConfig, device: Device, *, headroom: float) -> Parallelism | None:
    """The fewest devices (tp first, then pp) on which the job fits by the verdict's own rule
    (:func:`memest.planning.fit.verdict`: for vLLM, it starts, its pool holds ``batch_size`` requests of
    max_model_len, and it stays within the device's capacity).

    Tries each power-of-two layout with tp dividing a node that the model's heads allow (the
    planner's rules, with the other degrees asked kept; one replica), up to :data:`MAX_PP_QUERY`
    pipeline stages (vLLM splits layers unevenly, so any pp up to num_layers runs); transformers
    generate runs on one device only. None when none fits.
    """
    for candidate in _parallel_candidates(spec, device):
        if s.engine is Engine.HF and (candidate.pp > 1 or candidate.tp > 1):
            continue
        if candidate.world_size > most_devices(device, candidate.world_size):
            continue
        par = dataclasses.replace(s.parallelism, tp=candidate.tp, pp=candidate.pp, dp=1, cp=1, zero_stage=0)
        trial = s.replace(parallelism=par)
        try:
            validate(spec, trial)
            est = estimate_serving(spec, trial, device)
        except InputError:
            continue
        if verdict(est, device, par.world_size, headroom).fits:
            return par
    return None
