"""Does it fit, and what is the cheapest change that makes it fit.

A setup fits when the per-device ``device used`` figure (what nvidia-smi would show) is at most
``(1 - headroom)`` x the device's memory.

The recommendation is found by search, never by rule: every combination of the changes below is
re-estimated, and the fitting one with the lowest cost wins. Cost is money first (each doubling of
the device count costs more than any change on the same devices), then disruption, in this
documented order (cheapest first):

| change | cost | why |
|---|---|---|
| ``--kv-cache-dtype fp8`` | 2 | halves the KV cache; small accuracy cost on most models |
| ``--zero-stage 1`` / ``2`` / ``3`` (dp > 1) | 1 / 2 / 4 | more communication (stage 3 re-gathers weights) |
| ``--recompute selective`` | 1 | recomputes the attention core only (~2% more compute) |
| halve ``--micro-batch-size``, double ``--grad-accum-steps`` | 3 each | same global batch, lower throughput |
| ``--recompute full`` | 5 | one extra forward per step (~33% more compute) |
| ``--optimizer adamw8bit`` | 6 | 8-bit optimizer states; usually matches AdamW |
| ``--quantization int8`` | 5 | weights at 1 B/param; small quality cost |
| ``--quantization int4`` | 8 | weights at ~0.5 B/param; measurable quality cost |
| ``--offload optimizer`` | 10 | the optimizer step runs on the CPU; much slower |
| halve ``--max-model-len`` / ``--batch-size`` | 10 each | serves less than asked |
| ``--finetune lora`` | 20 | trains adapters instead of all weights |
| ``--finetune qlora`` | 30 | adapters on an NF4 base (10 from LoRA) |
| double the devices | 1000 each | money |

Besides the cheapest change, the search reports the cheapest *lossless* one: the cheapest fit that
changes only parallelism, sharding, recompute, batching or device count — never the model's
numerics or the job's method.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

from memest.devices import DEVICES, Device
from memest.errors import MemestError
from memest.estimate import estimate
from memest.result import Estimate
from memest.spec import ModelSpec
from memest.workload import (
    Method,
    Offload,
    Optimizer,
    Parallelism,
    Recompute,
    ServingConfig,
    TrainingConfig,
    Workload,
)

DEVICE_DOUBLING_COST = 1000
MAX_DEVICE_DOUBLINGS = 6


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether an estimate fits a device.

    Attributes:
        device: The accelerator.
        count: Devices in the job.
        headroom: Share of memory kept free.
        needed_bytes: Per-device device-used estimate.
        high_bytes: Upper edge of its band.
    """

    device: Device
    count: int
    headroom: float
    needed_bytes: int
    high_bytes: int

    @property
    def usable_bytes(self) -> int:
        """Memory the job may use: capacity x (1 - headroom)."""
        return math.floor(self.device.memory_bytes * (1 - self.headroom))

    @property
    def fits(self) -> bool:
        """True when the estimate is within the usable memory."""
        return self.needed_bytes <= self.usable_bytes

    @property
    def fits_with_band(self) -> bool:
        """True when even the band's upper edge fits the device's full capacity."""
        return self.high_bytes <= self.device.memory_bytes

    @property
    def margin_bytes(self) -> int:
        """Usable minus needed (negative when it does not fit)."""
        return self.usable_bytes - self.needed_bytes


def verdict(est: Estimate, device: Device, count: int, headroom: float) -> Verdict:
    """The fit verdict of an estimate on ``count`` x ``device``."""
    rank = est.per_device
    return Verdict(device, count, headroom, rank.device_used_bytes, rank.high_bytes)


@dataclass(frozen=True, slots=True)
class Change:
    """One step away from the user's setup.

    Attributes:
        flags: The CLI flags that apply it (``--recompute full``).
        cost: Its place in the cost order (see the module docstring).
        lossless: True when it changes neither numerics nor method.
    """

    flags: str
    cost: int
    lossless: bool


@dataclass(frozen=True, slots=True)
class Candidate:
    """A setup the search evaluated."""

    changes: tuple[Change, ...]
    workload: Workload
    devices: int
    estimate: Estimate
    verdict: Verdict

    @property
    def cost(self) -> int:
        """Sum of the changes' costs."""
        return sum(c.cost for c in self.changes)

    @property
    def lossless(self) -> bool:
        """True when every change is lossless."""
        return all(c.lossless for c in self.changes)

    @property
    def flags(self) -> str:
        """The changes as CLI flags."""
        return " ".join(c.flags for c in self.changes if c.flags)


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The search's answer.

    Attributes:
        cheapest: The lowest-cost fitting setup.
        lossless: The lowest-cost fitting setup that changes neither numerics nor method (may be
            the same as cheapest, or None when none was found).
        evaluated: How many setups were estimated.
    """

    cheapest: Candidate | None
    lossless: Candidate | None
    evaluated: int


Option = tuple[Change | None, dict[str, object]]


def _training_options(w: TrainingConfig) -> list[list[Option]]:
    par = w.parallelism
    dims: list[list[Option]] = []
    rec: list[Option] = [(None, {})]
    if w.recompute is Recompute.NONE:
        rec.append((Change("--recompute selective", 1, True), {"recompute": Recompute.SELECTIVE}))
    if w.recompute is not Recompute.FULL:
        rec.append((Change("--recompute full", 5, True), {"recompute": Recompute.FULL}))
    dims.append(rec)
    zero: list[Option] = [(None, {})]
    for stage, cost in ((1, 1), (2, 2), (3, 4)):
        if stage > par.zero_stage:
            zero.append((Change(f"--zero-stage {stage}", cost, True), {"zero_stage": stage}))
    dims.append(zero)
    mbs: list[Option] = [(None, {})]
    b, accum, n = w.micro_batch_size, w.grad_accum_steps, 0
    while b > 1:
        b, accum, n = b // 2, accum * 2, n + 1
        mbs.append((Change(f"--micro-batch-size {b} --grad-accum-steps {accum}", 3 * n, True),
                    {"micro_batch_size": b, "grad_accum_steps": accum}))
    dims.append(mbs)
    opt: list[Option] = [(None, {})]
    if w.optimizer is Optimizer.ADAMW:
        opt.append((Change("--optimizer adamw8bit", 6, False), {"optimizer": Optimizer.ADAMW8BIT}))
    dims.append(opt)
    off: list[Option] = [(None, {})]
    if w.offload is Offload.NONE:
        off.append((Change("--offload optimizer", 10, True), {"offload": Offload.OPTIMIZER}))
    dims.append(off)
    meth: list[Option] = [(None, {})]
    if w.method is Method.FULL:
        meth.append((Change("--finetune lora", 20, False), {"method": Method.LORA}))
        meth.append((Change("--finetune qlora", 30, False), {"method": Method.QLORA}))
    elif w.method is Method.LORA:
        meth.append((Change("--finetune qlora", 10, False), {"method": Method.QLORA}))
    dims.append(meth)
    return dims


def _serving_options(w: ServingConfig, max_len: int) -> list[list[Option]]:
    dims: list[list[Option]] = []
    kv: list[Option] = [(None, {})]
    if w.kv_cache_dtype in ("auto", "fp16", "bf16"):
        kv.append((Change("--kv-cache-dtype fp8", 2, False), {"kv_cache_dtype": "fp8"}))
    dims.append(kv)
    quant: list[Option] = [(None, {})]
    if w.quantization == "none":
        quant.append((Change("--quantization int8", 5, False), {"quantization": "int8"}))
        quant.append((Change("--quantization int4", 8, False), {"quantization": "int4"}))
    dims.append(quant)
    length: list[Option] = [(None, {})]
    n, m = 0, max_len
    while m > 2048 and n < 6:
        m, n = m // 2, n + 1
        length.append((Change(f"--max-model-len {m}", 10 * n, False), {"max_model_len": m}))
    dims.append(length)
    seqs: list[Option] = [(None, {})]
    n, bsz = 0, w.batch_size
    while bsz > 1:
        bsz, n = bsz // 2, n + 1
        seqs.append((Change(f"--batch-size {bsz}", 10 * n, False), {"batch_size": bsz}))
    dims.append(seqs)
    return dims


def _scaled_parallelism(spec: ModelSpec, w: Workload, device: Device, factor: int) -> tuple[Parallelism, str] | None:
    """The parallelism with ``factor`` times the devices, or None when it cannot grow so."""
    par = w.parallelism
    if isinstance(w, TrainingConfig):
        new = Parallelism(tp=par.tp, pp=par.pp, dp=par.dp * factor, cp=par.cp, ep=par.ep,
                          zero_stage=par.zero_stage, sequence_parallel=par.sequence_parallel)
        return new, f"--gpus {new.world_size}"
    tp, pp = par.tp, par.pp
    for _ in range(int(math.log2(factor))):
        if tp * 2 <= device.per_node and spec.num_heads % (tp * 2) == 0:
            tp *= 2
        elif pp * 2 <= spec.num_layers:
            pp *= 2
        else:
            return None
    new = Parallelism(tp=tp, pp=pp, dp=par.dp, cp=par.cp, ep=par.ep)
    flags = f"--tp {tp}" + (f" --pp {pp}" if pp != par.pp else "") + f" --gpus {new.world_size}"
    return new, flags


def candidates(spec: ModelSpec, workload: Workload, device: Device) -> Iterator[tuple[tuple[Change, ...], Workload, int]]:
    """Every setup the search considers, cheapest first (the user's own setup has cost 0)."""
    if isinstance(workload, TrainingConfig):
        dims = _training_options(workload)
    else:
        dims = _serving_options(workload, workload.max_model_len or spec.max_position_embeddings or 2048)
    combos = []
    for picks in itertools.product(*dims):
        changes = tuple(c for c, _ in picks if c is not None)
        fields: dict[str, object] = {}
        for _, f in picks:
            fields.update(f)
        combos.append((sum(c.cost for c in changes), changes, fields))
    scales = []
    for doublings in range(MAX_DEVICE_DOUBLINGS + 1):
        scaled = _scaled_parallelism(spec, workload, device, 2**doublings) if doublings else (workload.parallelism, "")
        if scaled is None:
            break
        scales.append((doublings, scaled))
    order = sorted(
        ((doublings * DEVICE_DOUBLING_COST + cost, doublings, changes, fields, scaled)
         for cost, changes, fields in combos for doublings, scaled in scales),
        key=lambda x: x[0],
    )
    for _, doublings, changes, fields, (par, flags) in order:
        par_fields = dict(fields)
        zero = par_fields.pop("zero_stage", None)
        if zero is not None:
            par = Parallelism(**{**_par_dict(par), "zero_stage": zero})
        if zero is not None and par.dp == 1:
            continue
        if par_fields.get("offload") is not None and par.zero_stage == 0:
            continue
        w = workload.replace(**par_fields, parallelism=par)
        extra = (Change(flags, DEVICE_DOUBLING_COST * doublings, True),) if doublings else ()
        yield changes + extra, w, par.world_size


def _par_dict(par: Parallelism) -> dict[str, object]:
    return {f: getattr(par, f) for f in ("tp", "pp", "dp", "cp", "ep", "zero_stage", "sequence_parallel")}


def recommend(spec: ModelSpec, workload: Workload, device: Device, headroom: float, *, limit: int = 20000) -> Recommendation:
    """The cheapest fitting setup, and the cheapest lossless one, by re-estimating candidates."""
    cheapest = lossless = None
    evaluated = 0
    for changes, w, count in candidates(spec, workload, device):
        if cheapest is not None and lossless is not None:
            break
        if evaluated >= limit:
            break
        all_lossless = all(c.lossless for c in changes)
        if cheapest is not None and not all_lossless:
            continue
        try:
            est = estimate(spec, w, device)
        except MemestError:
            continue
        evaluated += 1
        v = verdict(est, device, count, headroom)
        if not v.fits:
            continue
        cand = Candidate(changes, w, count, est, v)
        if cheapest is None:
            cheapest = cand
        if lossless is None and all_lossless:
            lossless = cand
    return Recommendation(cheapest, lossless, evaluated)


def fitting_devices(spec: ModelSpec, workload: Workload, count: int, headroom: float) -> list[Device]:
    """Catalog devices on which ``workload`` fits with ``count`` devices, smallest memory first."""
    out = []
    for device in sorted(DEVICES, key=lambda d: d.memory_bytes):
        est = estimate(spec, workload, device)
        if verdict(est, device, count, headroom).fits:
            out.append(device)
    return out


@dataclass(frozen=True, slots=True)
class RuleOfThumb:
    """A quick figure people quote, shown beside the detailed estimate.

    Attributes:
        name: The rule in words.
        bytes: Its figure for this model and workload, per device.
    """

    name: str
    bytes: int


def rules_of_thumb(spec: ModelSpec, workload: Workload) -> list[RuleOfThumb]:
    """The popular shortcuts, per device, for comparison with the estimate."""
    p = spec.num_params
    n = workload.parallelism.world_size
    if isinstance(workload, TrainingConfig):
        return [
            RuleOfThumb("16 B/param (mixed-precision Adam model states, no activations)", 16 * p // n),
            RuleOfThumb("params x 2 B x 6 ('training overhead')", 12 * p // n),
        ]
    shards = workload.parallelism.tp * workload.parallelism.pp
    return [
        RuleOfThumb("params x 2 B (16-bit weights only)", 2 * p // shards),
        RuleOfThumb("params x 2 B x 1.2 ('20% overhead')", math.ceil(2.4 * p / shards)),
    ]


@dataclass(frozen=True, slots=True)
class Assessment:
    """Everything ``memest hf`` reports: the estimate, its verdict and what to do about it.

    Attributes:
        spec: The model.
        workload: The workload as estimated.
        estimate: The per-device estimate.
        verdict: Fit on the chosen device.
        device_given: False when the device is the default (H100-80GB), in which case
            ``fits_on`` lists every catalog device that fits.
        recommendation: The search's answer when it does not fit (None when it fits).
        fits_on: Catalog devices that fit at the same count (only without ``--gpu``).
        rules: Rules of thumb for comparison.
    """

    spec: ModelSpec
    workload: Workload
    estimate: Estimate
    verdict: Verdict
    device_given: bool
    recommendation: Recommendation | None
    fits_on: tuple[Device, ...]
    rules: tuple[RuleOfThumb, ...]


def assess(spec: ModelSpec, workload: Workload, device: Device, *, headroom: float = 0.10,
           device_given: bool = True, search: bool = True) -> Assessment:
    """Estimate ``workload``, judge the fit on ``device`` and, when it does not fit, search for the
    cheapest setup that does.

    Raises:
        InputError: the workload is invalid for the model.
    """
    est = estimate(spec, workload, device)
    count = workload.parallelism.world_size
    v = verdict(est, device, count, headroom)
    rec = recommend(spec, workload, device, headroom) if search and not v.fits else None
    fits_on = tuple(fitting_devices(spec, workload, count, headroom)) if not device_given else ()
    return Assessment(spec, workload, est, v, device_given, rec, fits_on, tuple(rules_of_thumb(spec, workload)))
