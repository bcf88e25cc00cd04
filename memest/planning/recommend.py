"""``memest hf``'s answer: the verdict, the cheapest change to the user's own setup that fits, the
devices that fit, the rules of thumb beside the estimate (DESIGN.md, "Planning")."""

from __future__ import annotations

import math
from dataclasses import dataclass

from memest.devices import DEVICES, Device, Fleet
from memest.errors import InputError
from memest.estimate import estimate
from memest.estimate.serving.llamacpp import fit as llamacpp_fit
from memest.planning.costs import LAYERS_IN_HOST_RAM, NO_PENALTY, Cost, Penalty, PriceTable, doubling_penalty, penalty
from memest.planning.fit import Verdict, device_verdicts, verdict
from memest.planning.maxfit import largest_utilization
from memest.planning.search import (
    _PAR_FIELDS,
    MAX_DEVICE_DOUBLINGS,
    DeviceChoice,
    Fit,
    Plan,
    Space,
    _flag_items,
    _render,
    plan,
    restacked,
    smallest_parallelism,
    stack_losses,
)
from memest.result import Estimate, Kind, Term
from memest.spec import ModelSpec
from memest.workload import (
    STACKS,
    Engine,
    KbitPrep,
    Method,
    Parallelism,
    ServingConfig,
    TrainingConfig,
    Workload,
    refusal,
    workload_notes,
)
from memest.workload.settings import cli_flag
from memest.workload.stacks import sharding_words

# ---- memest hf: the cheapest change to the user's own setup ----


@dataclass(frozen=True, slots=True)
class Change:
    """One step away from the user's setup.

    Attributes:
        flags: The CLI flags that apply it (``--recompute full``).
        cost: Communication + disruption units of the new value (USD per hour for ``--gpus``).
        lossless: True when it changes neither numerics nor method.
        how: How the job's stack applies it, in the stack's words (a loss: its switch); "" when the
            flag says it all.
    """

    flags: str
    cost: float
    lossless: bool
    how: str = ""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A fitting setup, as changes to the user's."""

    changes: tuple[Change, ...]
    workload: Workload
    devices: int
    estimate: Estimate
    verdict: Verdict

    @property
    def cost(self) -> float:
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
    """The search's answer for ``memest hf``.

    Attributes:
        cheapest: The lowest-cost fitting setup.
        lossless: The lowest-cost fitting setup that changes neither numerics nor method (may be
            the same as cheapest, or None when none was found).
        evaluated: How many setups the planner estimated.
    """

    cheapest: Candidate | None
    lossless: Candidate | None
    evaluated: int
    on_device: Candidate | None = None
    """llama.cpp / Ollama, when the cheapest fit leaves layers in host RAM (``n_gpu_layers``): the cheapest
    fit found with every layer on the devices (a file of fewer bits, more devices), else None."""


def _leaves_layers(c: Candidate) -> bool:
    """True when a candidate fit keeps fewer layers on the devices than the job asked (``n_gpu_layers``)."""
    return any(ch.flags.startswith(cli_flag("n_gpu_layers") + " ") for ch in c.changes)


_FLAG_SETTING = {"--zero-stage": "zero_stage", "--sequence-parallel": "sequence_parallel", "--recompute": "recompute",
                 "--optimizer": "optimizer", "--offload": "offload", "--finetune": "method",
                 "--quantization": "quantization", "--kv-cache-dtype": "kv_cache_dtype", "--loss": "loss"}
_PARALLEL_FLAGS = ("--gpus", "--dp", "--tp", "--pp", "--ep")


def _changes(asked: Workload, fit: Fit, price: float) -> tuple[Change, ...]:
    """A fit as changes to the workload asked (one Change per flag group that differs)."""
    old = _flag_items(restacked(asked, fit.setup.workload), asked.parallelism.world_size)
    new = _flag_items(fit.setup.workload, fit.setup.count)
    stack = cli_flag("stack")
    out = [Change(f"{stack} {new[stack]}", 0.0, True)] if new.get(stack, "None") != "None" else []
    par_diff = [f for f in _PARALLEL_FLAGS if f in new and new[f] != old[f]]
    if par_diff:
        more = fit.setup.count - asked.parallelism.world_size
        added = more * price if more else 0.0  # 0 x an unpriced device's inf would be nan
        comm = sum(doubling_penalty(n, getattr(fit.setup.workload.parallelism, n))[0] for n in ("tp", "pp", "ep"))
        w = fit.setup.workload
        layout = w.layout_words() if isinstance(w, ServingConfig) else None
        # llama.cpp / Ollama split layers, not heads: the count says it (tp defaults to the GPUs), the
        # engine's words say how, and no --tp is printed
        shown = [f for f in _PARALLEL_FLAGS if f in new and (f in par_diff or f == "--gpus")
                 and not (layout and f == cli_flag("tp"))]
        out.append(Change(" ".join(_render({f: new[f] for f in shown})), round(added + comm, 6), True, layout or ""))
    if new.get("--micro-batch-size") != old.get("--micro-batch-size") or new.get("--grad-accum-steps") != old.get("--grad-accum-steps"):
        ratio = asked.micro_batch_size // fit.setup.workload.micro_batch_size  # type: ignore[union-attr]
        out.append(Change(f"--micro-batch-size {new['--micro-batch-size']} --grad-accum-steps {new['--grad-accum-steps']}",
                          doubling_penalty("micro_batch", ratio)[1], True))
    for flag, setting in _FLAG_SETTING.items():
        if flag in new and new[flag] != old[flag]:
            value = getattr(fit.setup.workload.parallelism if setting in _PAR_FIELDS else fit.setup.workload, setting)
            p = penalty(setting, value)
            switch = stack_losses(fit.setup.workload).get(value, "") if setting == "loss" else ""
            if setting == "zero_stage" and isinstance(fit.setup.workload, TrainingConfig):
                switch = sharding_words(fit.setup.workload)  # the backend the stage runs under
            how = f"{STACKS[fit.setup.workload.stack].label}: {switch}" if switch else ""  # type: ignore[union-attr,index]
            out.append(Change(" ".join(_render({flag: new[flag]})), p.communication + p.disruption, p.lossless, how))
    return tuple(out)


LOGITS_SHARE = 0.25
"""The share of a training job's device-used memory from which its logits count as a large part of it
(:func:`logits_dominate`)."""


def logits_dominate(est: Estimate) -> bool:
    """True when the logits and loss (:attr:`memest.result.Kind.LOGITS`) are the largest term of the
    rank that needs the most, or at least :data:`LOGITS_SHARE` of its device-used memory: then a
    chunked or fused cross-entropy is a fix worth offering (DESIGN.md, "Formulas worth knowing", logits and loss: at
    V = 128k-256k the logits can exceed every layer's activations)."""
    rank = est.per_device
    logits = sum(t.bytes for t in rank.terms if t.kind is Kind.LOGITS)
    largest = max((t.bytes for t in rank.terms), default=0)
    return logits > 0 and (logits >= largest or logits >= LOGITS_SHARE * rank.device_used_bytes)


def recommend(spec: ModelSpec, workload: Workload, device: Device, headroom: float, *,
              fewest: Parallelism | None = None, allow_stack_change: bool = False) -> Recommendation:
    """The cheapest fitting setup on ``device`` (from the count asked up to 64 times it), and the
    cheapest lossless one, found by :func:`plan`.

    A lossless fit that costs no more per hour than the cheapest fit is the cheapest fit: a change
    of method or numerics is never recommended to save only communication or disruption.

    For a vLLM job that fails only because the process would hold more than the device has (rule 3
    of :mod:`memest.planning.fit`), the user's own setup with the largest lower ``--gpu-memory-utilization``
    that fits (:func:`memest.planning.maxfit.largest_utilization`) is a candidate too, costed like the
    planner's setups (:func:`_own_setup_cost`; the setting itself is free, one change) and ranked
    with them by :class:`memest.planning.costs.Cost`; it is lossless (the weights and numerics are the same;
    only the KV pool shrinks, and the job still fits). For llama.cpp / Ollama the fixes on the user's own
    devices are fewer layers on the GPUs (the rest in host RAM: lossless, slower) and a GGUF file of fewer bits
    (lossy) (:func:`own_device_fixes`); when the cheapest fit leaves layers in host RAM, the cheapest fit with
    every layer on the devices is given too (:attr:`Recommendation.on_device`). A planned setup on more GPUs
    says how llama.cpp splits them (:meth:`memest.workload.ServingConfig.layout_words`), not a tp degree.

    Every fix stays in the job's stack (a fix names it) unless ``allow_stack_change``; micro-batch
    reshaping and the 8-bit optimizer are candidates (the cheapest fit may change numerics). When the
    logits dominate the job (:func:`logits_dominate`), a chunked or fused cross-entropy its stack
    switches on (:func:`memest.planning.search.stack_losses`: Liger for the HF Trainer, trl, axolotl and
    LLaMA-Factory, torchtune's chunked loss) is a candidate too, lossless (the same loss, computed a
    chunk at a time) and costed as a small disruption (:data:`memest.planning.costs.PENALTIES`).

    Args:
        allow_stack_change: Also layouts the job's stack cannot run (:attr:`Space.allow_stack_change`).
        fewest: The layout of the fewest-devices query
            (:func:`smallest_parallelism`); the counts searched are widened to
            include its device count, so the recommendation finds a fit wherever that query found one.
    """
    count = workload.parallelism.world_size
    low, high = count, count << MAX_DEVICE_DOUBLINGS
    if fewest is not None:
        low, high = min(low, fewest.world_size), max(high, fewest.world_size)
    choice = DeviceChoice(device, max_count=high, min_count=low)
    price = PriceTable.catalog().price(device)
    loss = isinstance(workload, TrainingConfig) and logits_dominate(estimate(spec, workload, device))
    any_change = plan(spec, workload, Space(devices=(choice,), allow_method_change=True, allow_quantization=True,
                                            allow_stack_change=allow_stack_change, allow_loss_change=loss),
                      headroom=headroom, max_queries=False)
    lossless = plan(spec, workload, Space(devices=(choice,), lossless_only=True, allow_stack_change=allow_stack_change,
                                          allow_loss_change=loss),
                    headroom=headroom, max_queries=False)

    def candidate(p: Plan) -> tuple[Cost, Candidate] | None:
        fit = p.best
        if fit is None:
            return None
        return fit.setup.cost, Candidate(_changes(workload, fit, price), fit.setup.workload, fit.setup.count,
                                         fit.estimate, fit.verdict)

    extra = own_device_fixes(spec, workload, device, headroom, count * price)
    return _ranked(candidate(any_change), candidate(lossless), extra, any_change.evaluated + lossless.evaluated)


def _ranked(found_cheapest: tuple[Cost, Candidate] | None, found_lossless: tuple[Cost, Candidate] | None,
            extra: list[tuple[Cost, Candidate]], evaluated: int) -> Recommendation:
    """The recommendation from the planner's cheapest and lossless fits and the fixes on the user's own
    devices (:func:`own_device_fixes`), each ranked by its :class:`~memest.planning.costs.Cost` (a planner
    setup wins a tie); a lossless fit that costs no more per hour than the cheapest fit is the cheapest."""
    planned = [f for f in (found_cheapest, found_lossless) if f is not None]
    for found in extra:
        if found[1].lossless and (found_lossless is None or found[0] < found_lossless[0]):
            found_lossless = found
        if found_cheapest is None or found[0] < found_cheapest[0]:
            found_cheapest = found
    on_device = min((f for f in (*planned, *extra) if not _leaves_layers(f[1])),
                    key=lambda f: f[0], default=None)
    cheapest = found_cheapest[1] if found_cheapest else None
    lossless_fit = found_lossless[1] if found_lossless else None
    if found_lossless is not None and (found_cheapest is None or
                                       found_lossless[0].usd_per_hour <= found_cheapest[0].usd_per_hour):
        cheapest = lossless_fit
    slower = cheapest is not None and _leaves_layers(cheapest)
    return Recommendation(cheapest, lossless_fit, evaluated + len(extra),
                          on_device[1] if slower and on_device is not None else None)


def own_device_fixes(spec: ModelSpec, workload: Workload, device: Device | Fleet, headroom: float,
                     usd_per_hour: float) -> list[tuple[Cost, Candidate]]:
    """The fixes that keep the user's devices (``usd_per_hour``: all of them), each with its cost
    (:func:`_own_setup_cost`): vLLM's largest lower ``--gpu-memory-utilization`` that fits
    (:func:`_lower_utilization`); for llama.cpp / Ollama the most layers that fit on the GPUs with the rest
    in host RAM (``n_gpu_layers``: lossless, slower, :data:`~memest.planning.costs.LAYERS_IN_HOST_RAM`) and the
    best GGUF file type of fewer bits that fits with the job's layers (lossy;
    :func:`memest.estimate.serving.llamacpp.fit.lower_quants`)."""
    lower = _lower_utilization(spec, workload, device, headroom, usd_per_hour)
    out = [lower] if lower is not None else []
    if isinstance(workload, ServingConfig) and workload.engine in (Engine.LLAMACPP, Engine.OLLAMA):
        out += _gguf_fixes(spec, workload, device, headroom, usd_per_hour)
    return out


def _gguf_fixes(spec: ModelSpec, workload: ServingConfig, device: Device | Fleet, headroom: float,
                usd_per_hour: float) -> list[tuple[Cost, Candidate]]:
    """:func:`own_device_fixes` for llama.cpp / Ollama: fewer layers on the GPUs, a file of fewer bits."""
    count = workload.parallelism.world_size
    layers = spec.num_layers + 1
    on_gpu = layers if workload.n_gpu_layers is None else min(workload.n_gpu_layers, layers)
    out = []

    def fix(w: ServingConfig, change: Change, extra: Penalty = NO_PENALTY) -> tuple[Cost, Candidate]:
        est = estimate(spec, w, device)
        return _own_setup_cost(w, usd_per_hour, extra), Candidate((change,), w, count, est,
                                                                   verdict(est, device, count, headroom))

    most = llamacpp_fit.most_gpu_layers(spec, workload, device, headroom)
    if 0 <= most < on_gpu:
        ram = layers - most
        out.append(fix(workload.replace(n_gpu_layers=most),
                       Change(f"{cli_flag('n_gpu_layers')} {most}", LAYERS_IN_HOST_RAM.disruption, True,
                              f"{ram} of {layers} layers in host RAM: lossless, but llama.cpp runs them on the CPU, "
                              "slower"), LAYERS_IN_HOST_RAM))
    for q in llamacpp_fit.lower_quants(workload):
        trial = workload.replace(quantization=q, gguf_tensors=())
        if llamacpp_fit.fits(spec, trial, device, headroom):
            p = penalty("quantization", q)
            out.append(fix(trial, Change(f"{cli_flag('quantization')} {q}", p.disruption, p.lossless,
                                         f"a {q.upper()} GGUF file: lossy")))
            break
    return out


def _own_setup_cost(workload: ServingConfig, usd_per_hour: float, extra: Penalty = NO_PENALTY) -> Cost:
    """The planner's cost of the user's own serving setup with one more change (a lower
    ``--gpu-memory-utilization``, which costs nothing else; another file type, whose penalty is its
    quantization's; fewer GPU layers, ``extra``): the layout's communication, the disruption of the
    quantization and KV-cache dtype, ``extra``'s, and the changes each of them counts."""
    par = workload.parallelism
    comm = sum(doubling_penalty(name, getattr(par, name))[0] for name in ("tp", "pp", "ep"))
    parts = [penalty("quantization", workload.quantization), penalty("kv_cache_dtype", workload.kv_cache_dtype)]
    changes = sum(getattr(par, name) > 1 for name in ("tp", "pp", "ep")) + sum(p is not NO_PENALTY for p in parts)
    return Cost(usd_per_hour, comm + extra.communication, sum(p.disruption for p in parts) + extra.disruption,
                changes + 1)


def _lower_utilization(spec: ModelSpec, workload: Workload, device: Device | Fleet, headroom: float,
                       usd_per_hour: float) -> tuple[Cost, Candidate] | None:
    """The user's vLLM setup with the largest lower gpu_memory_utilization that fits, when the only
    rule it breaks is the device's capacity (rule 3 of :mod:`memest.planning.fit`); else None.
    ``usd_per_hour`` is the price of all the job's devices; on a :class:`~memest.devices.Fleet` every card
    must fit (the verdict of the least margin)."""
    if not isinstance(workload, ServingConfig):
        return None
    count = workload.parallelism.world_size
    est = estimate(spec, workload, device)
    v = verdict(est, device, count, headroom)
    if v.fits or v.headroom_applied or v.blocker is not None:
        return None
    util = largest_utilization(spec, workload, device, headroom=headroom, below=workload.gpu_memory_utilization)
    if util is None:
        return None
    w = workload.replace(gpu_memory_utilization=util)
    est = estimate(spec, w, device)
    change = Change(f"--gpu-memory-utilization {util:.2f}", 0.0, True)
    return _own_setup_cost(w, usd_per_hour), Candidate((change,), w, count, est, verdict(est, device, count, headroom))


def fitting_devices(spec: ModelSpec, workload: Workload, count: int, headroom: float) -> list[Device]:
    """Catalog devices on which ``workload`` fits with ``count`` devices, smallest memory first (only
    devices its engine or training framework runs on: :func:`memest.workload.refusal`)."""
    out = []
    for device in sorted(DEVICES, key=lambda d: d.memory_bytes):
        if refusal(workload, device) is not None:
            continue
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
    """The popular shortcuts, per device, for comparison with the estimate.

    Each is split the way the job splits weights: over tp x pp, and over the data-parallel ranks too
    only when ZeRO-3 / FSDP shards the parameters. The 16 B/param of mixed-precision Adam (2 B weights,
    2 B gradients, K = 12 B of fp32 master and states) is split as the ZeRO paper's stages split it
    (Rajbhandari et al. 2020, figure 1, N data-parallel ranks): 2 + 2 + 12 / N at stage 1, 2 + 14 / N at
    stage 2, 16 / N at stage 3.
    """
    p = spec.num_params
    par = workload.parallelism
    shards = par.tp * par.pp
    if isinstance(workload, TrainingConfig):
        n = par.dp * par.cp
        if par.zero_stage >= 3:
            shards *= n
        if workload.method is Method.FULL:
            name = "16 B/param (mixed-precision Adam model states, no activations"
            kept = {1: 4, 2: 2}.get(par.zero_stage)  # B/param each rank keeps whole at ZeRO-1 / 2
            sixteen = (RuleOfThumb(name + ")", 16 * p // shards) if kept is None else
                       RuleOfThumb(f"{name}; ZeRO-{par.zero_stage}: {kept} + {16 - kept}/N)",
                                   -(-(kept * n + 16 - kept) * p // (n * shards))))
            return [
                sixteen,
                RuleOfThumb("params x 2 B x 6 ('training overhead')", 12 * p // shards),
            ]
        base, what = (2.0, "16-bit") if workload.method is Method.LORA else (0.5, "4-bit")
        return [
            RuleOfThumb(f"params x {base:g} B (the frozen {what} base only)", math.ceil(base * p / shards)),
            RuleOfThumb(f"params x {base:g} B x 1.2 ('20% overhead')", math.ceil(1.2 * base * p / shards)),
        ]
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
        recommendation: The search's answer when it does not fit (None when it fits, or when it starts
            and only queues and all its sequences at once were not asked for: :func:`assess`).
        fits_on: Catalog devices that fit at the same count (only without ``--gpu``).
        rules: Rules of thumb for comparison.
        notes: What the user should know about the workload that the estimate does not show
            (:func:`memest.workload.workload_notes`: a sequence beyond the trained length).
        fewest: Serving: the fewest devices' layout on which the job fits by the same rule
            (:func:`smallest_parallelism`); None when none fits, or training.
        utilization: vLLM jobs that do not fit: the largest ``--gpu-memory-utilization`` at which
            they would (:func:`memest.planning.maxfit.largest_utilization`); None when none would, or the
            job fits.
    """

    spec: ModelSpec
    workload: Workload
    estimate: Estimate
    verdict: Verdict
    device_given: bool
    recommendation: Recommendation | None
    fits_on: tuple[Device, ...]
    rules: tuple[RuleOfThumb, ...]
    notes: tuple[str, ...] = ()
    fewest: Parallelism | None = None
    utilization: float | None = None
    gguf_options: tuple[llamacpp_fit.Option, ...] = ()
    """llama.cpp / Ollama: each GGUF quant's best placement on the device
    (:func:`memest.estimate.serving.llamacpp.fit.search`)."""
    fleet: Fleet | None = None
    """The unlike devices of the job, when it runs on a :class:`~memest.devices.Fleet` (``verdict`` is then
    the device with the least margin)."""
    device_verdicts: tuple[Verdict, ...] = ()
    """On a fleet: each device's verdict (:func:`memest.planning.fit.device_verdicts`)."""


def assess(spec: ModelSpec, workload: Workload, device: Device | Fleet, *, headroom: float = 0.10,
           device_given: bool = True, search: bool = True, allow_stack_change: bool = False,
           hold_batch: bool = False) -> Assessment:
    """Estimate ``workload``, judge the fit on ``device`` and, when it does not fit, search for the
    cheapest setup that does (within the job's stack unless ``allow_stack_change``).

    A serving job that starts and only queues (:attr:`Verdict.kind` ``queues``: the pool holds K of
    its N sequences of max_model_len at once, the rest wait) runs as it is: no fix is searched for it
    unless ``hold_batch``, the user's demand that all N be held at once (the CLI's ``--check``). An
    engine's scheduler admits what its pool holds and queues the rest, which is how these engines are
    meant to run (vLLM's default max_num_seqs, 256 or 1024, is far above what most pools hold at the
    model's full length); what holding all N would take is in the serving summary either way (the
    fewest devices, the longest max_model_len and the gpu_memory_utilization at which they fit).

    Raises:
        InputError: the workload is invalid for the model.
    """
    if isinstance(device, Fleet) and not device.mixed:
        device = device.devices[0]
    if isinstance(device, Fleet):
        return _assess_fleet(spec, workload, device, headroom=headroom, search=search, hold_batch=hold_batch)
    est = estimate(spec, workload, device)
    count = workload.parallelism.world_size
    v = verdict(est, device, count, headroom)
    serving = isinstance(workload, ServingConfig)
    fewest = smallest_parallelism(spec, workload, device, headroom=headroom) if serving else None
    utilization = largest_utilization(spec, workload, device, headroom=headroom) if serving and not v.fits else None
    wanted = not v.fits and (v.kind == "does_not_fit" or hold_batch)
    rec = (recommend(spec, workload, device, headroom, fewest=fewest, allow_stack_change=allow_stack_change)
           if search and wanted else None)
    fits_on = tuple(fitting_devices(spec, workload, count, headroom)) if not device_given else ()
    gguf = (tuple(llamacpp_fit.search(spec, workload, device, headroom)) if search and serving
            and workload.engine in (Engine.LLAMACPP, Engine.OLLAMA) else ())
    return Assessment(spec, workload, est, v, device_given, rec, fits_on, tuple(rules_of_thumb(spec, workload)),
                      workload_notes(spec, workload) + method_notes(spec, workload, device, est), fewest, utilization,
                      gguf)


def _assess_fleet(spec: ModelSpec, workload: Workload, fleet: Fleet, *, headroom: float, search: bool,
                  hold_batch: bool) -> Assessment:
    """:func:`assess` on unlike devices: the estimate and the verdict of each device (the worst decides).
    The searches that change the devices (fewest devices, other catalog devices, the planner's layouts)
    are over alike devices and are not run; the ones that keep the user's cards are: vLLM's largest
    ``--gpu-memory-utilization`` at which every card fits (:func:`largest_utilization`, also the
    recommendation when it is lower than the one asked: :func:`fleet_recommendation`) and llama.cpp /
    Ollama's GGUF search, each device within its own memory."""
    est = estimate(spec, workload, fleet)
    each = device_verdicts(est, fleet, headroom)
    v = min(each, key=lambda x: x.margin_bytes)
    serving = isinstance(workload, ServingConfig)
    utilization = largest_utilization(spec, workload, fleet, headroom=headroom) if serving and not v.fits else None
    wanted = not v.fits and (v.kind == "does_not_fit" or hold_batch)
    rec = fleet_recommendation(spec, workload, fleet, headroom) if search and wanted else None
    gguf = (tuple(llamacpp_fit.search(spec, workload, fleet, headroom)) if search and serving
            and workload.engine in (Engine.LLAMACPP, Engine.OLLAMA) else ())
    return Assessment(spec, workload, est, v, True, rec, (), tuple(rules_of_thumb(spec, workload)),
                      workload_notes(spec, workload), utilization=utilization, gguf_options=gguf, fleet=fleet,
                      device_verdicts=each)


def fleet_recommendation(spec: ModelSpec, workload: Workload, fleet: Fleet, headroom: float) -> Recommendation | None:
    """The fixes on the user's own unlike cards (:func:`own_device_fixes`: vLLM's largest lower
    ``--gpu-memory-utilization`` at which every card fits; llama.cpp / Ollama's fewer GPU layers or a file of
    fewer bits, each card within its own memory), ranked as :func:`recommend` ranks them; None when there is
    none (the planner's other changes search alike devices only)."""
    prices = PriceTable.catalog()
    extra = own_device_fixes(spec, workload, fleet, headroom, sum(prices.price(d) for d in fleet.devices))
    return _ranked(None, None, extra, 0) if extra else None


_GROWS = {
    "workspace.reduce_bucket": ("DeepSpeed's reduce bucket holds gradients at their dtype: the fp32 adapters' 4 B "
                                "per element where a full fine-tune's are 16-bit"),
    "weights.persistent": ("ZeRO-3 keeps parameters under stage3_param_persistence_threshold whole on every rank, "
                           "LoRA's small adapters among them in fp32"),
}
"""Why a term is larger under LoRA than under full fine-tuning, for :func:`method_notes`
(:mod:`memest.estimate.training.deepspeed`: ``states``, the persistent parameters)."""


def _term_growth(lora: tuple[Term, ...], full: tuple[Term, ...]) -> dict[tuple[str, Kind], int]:
    """Bytes each term (name, kind) gains from full fine-tuning to LoRA (negative: it shrinks)."""
    out: dict[tuple[str, Kind], int] = {}
    for sign, terms in ((1, lora), (-1, full)):
        for t in terms:
            out[t.name, t.kind] = out.get((t.name, t.kind), 0) + sign * t.bytes
    return out


def method_notes(spec: ModelSpec, workload: Workload, device: Device, est: Estimate) -> tuple[str, ...]:
    """Why a LoRA / QLoRA job needs more than full fine-tuning of the same job, when it does.

    PEFT keeps the adapters in fp32 and each adapted linear keeps its own copy of its input for the
    adapter's gradient (``x.to(lora_A.weight.dtype)``), where full fine-tuning's linears share one 16-bit
    input: at long sequences these activations outgrow the gradients and optimizer states the frozen base
    saves (``benchmarks/trace_findings.md`` section 3 lists the copies). Said so only when the activations grow
    the most (by the terms of the two estimates); otherwise the note names the terms that grow (:data:`_GROWS`:
    DeepSpeed's reduce bucket and ZeRO-3's persistent parameters at the fp32 adapters' 4 B). The meta-device trace of
    transformers + PEFT agrees: Llama-3.1-8B, all-linear, micro-batch 4, seq_len 8192 traces at 351.16 GiB
    peak allocated with LoRA and 348.84 GiB with full fine-tuning (``memest hf ... --trace``).
    """
    if not isinstance(workload, TrainingConfig) or workload.method is Method.FULL:
        return ()
    try:
        full = estimate(spec, workload.replace(method=Method.FULL), device)
    except InputError:
        return ()
    if full.per_device.device_used_bytes >= est.per_device.device_used_bytes:
        return ()
    name = "QLoRA" if workload.method is Method.QLORA else "LoRA"
    growth = _term_growth(est.per_device.terms, full.per_device.terms)
    activations = sum(g for (_, kind), g in growth.items() if kind is Kind.ACTIVATIONS)
    others = {n: g for (n, kind), g in growth.items() if kind not in (Kind.ACTIVATIONS, Kind.ALLOCATOR) and g > 0}
    if activations <= 0 or activations < max(others.values(), default=0):
        # the activations are not what grows (ZeRO-3 with full recompute, say): name the terms that do
        grown = sorted(others, key=lambda n: -others[n])
        why = [f"{n} ({_GROWS.get(n, 'larger under ' + name)})" for n in grown]
        more = est.per_device.device_used_bytes / full.per_device.device_used_bytes - 1
        return (f"{name} needs {more:.2%} more device memory than full fine-tuning of the same job here, not for its "
                "activations: " + "; ".join(why),)
    fp32_stream = workload.method is Method.QLORA and workload.prepare_kbit_training is not KbitPrep.NONE
    stream = " and the k-bit preparation keeps the residual stream fp32" if fp32_stream else ""
    qlora = workload.method is Method.QLORA
    traced = "" if qlora else " (the meta-device trace of transformers + PEFT agrees)"  # QLoRA is not traced
    return (f"{name} needs more memory than full fine-tuning of the same job here: each "
            "adapted linear keeps its own copy of its input for the adapter's gradient (PEFT casts it to the fp32 "
            f"adapters' dtype, autocast to the compute dtype){stream}, where full fine-tuning's linears share one "
            "16-bit input; at this length those activations outgrow the gradients and optimizer states the "
            f"frozen base saves{traced}",)
