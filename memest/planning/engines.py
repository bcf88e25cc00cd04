"""Serving engines compared on each device type (``memest plan MODEL --serve --engine any``).

For each device type the job's settings (model, max_model_len, batch_size, dtype, quantization, KV
dtype) are estimated under every engine of :data:`COMPARED`, on the same devices (max_model_len, when
not given, is the model's for every engine, vLLM's default, not llama.cpp's own 4,096): the fewest of that
type on which any of them fits (:func:`memest.planning.search.smallest_parallelism`, each engine's own
fit rule, at most the type's ``max_count``), or one device when none fits. Each engine then holds some
number of concurrent sequences of max_model_len (:func:`memest.estimate.serving.largest_concurrency`:
vLLM's 'Maximum concurrency' floored, SGLang's and TensorRT-LLM's pool over the request's tokens,
llama.cpp's longest context over max_model_len); the engine holding the most, among those that start
(:attr:`memest.planning.fit.Verdict.starts`), is named for the type (the first of :data:`COMPARED` on a
tie).

Setups across engines (``--top N``, ``--cost``): each engine that fits on a type, on its own fewest devices of
it (:func:`memest.planning.search.smallest_parallelism`), is one setup; the setups of every type are ranked
as ``memest plan`` ranks its fits, by price first (devices x USD per device-hour,
:class:`memest.planning.costs.PriceTable`: the catalog's, with the user's overrides; an unpriced device is
``inf``), then by fewer devices, then by more concurrent sequences held, then in :data:`COMPARED` order;
:attr:`EngineComparison.top` of them are the answer's.

Which engines are compared: vLLM, SGLang and TensorRT-LLM always; llama.cpp when the weights are ones a
GGUF file holds: no quantization (the f16 GGUF ``convert_hf_to_gguf.py`` writes, the same 2 bytes per
weight as the 16-bit checkpoint) or a GGUF type (``q4_k_m``, ...), or a ``.gguf`` file (``gguf``: then llama.cpp
alone, from the file's header; the others are skipped). An engine that does not run on the
device's vendor (:func:`memest.workload.runs_on`: TensorRT-LLM only on NVIDIA, none of vLLM / SGLang /
TensorRT-LLM on Apple) or refuses the settings (a GGUF type under vLLM, an AWQ checkpoint under llama.cpp:
the engine's own one-line error) is skipped, with the reason. Ollama is llama.cpp with its own defaults,
and transformers ``generate`` has no pool: neither is compared.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from memest.devices import Device
from memest.errors import InputError
from memest.estimate import estimate
from memest.estimate.serving import largest_concurrency
from memest.estimate.serving.common import max_model_len_of
from memest.planning.costs import PriceTable
from memest.planning.fit import VerdictKind, verdict
from memest.planning.search import DeviceChoice, smallest_parallelism
from memest.spec import ModelSpec
from memest.workload import Engine, Parallelism, ServingConfig, refusal, validate

COMPARED = (Engine.VLLM, Engine.SGLANG, Engine.TRTLLM, Engine.LLAMACPP)
"""The engines compared, in the order ties are broken."""


@dataclass(frozen=True, slots=True)
class EngineRow:
    """One engine on one device type.

    Attributes:
        engine: The engine.
        kv_cache_tokens: Tokens its KV pool holds per device (llama.cpp: n_ctx, the cells asked); 0 when skipped.
        concurrent_sequences: Sequences of max_model_len it holds at once; 0 when skipped or nothing fits.
        verdict: ``fits``, ``queues`` or ``does_not_fit`` (:data:`memest.planning.fit.VerdictKind`); None when skipped.
        needed_bytes: What it holds per device (the verdict's figure); 0 when skipped.
        skipped: Why it was not estimated (the engine does not run there, or refuses the settings); None otherwise.
    """

    engine: Engine
    kv_cache_tokens: int = 0
    concurrent_sequences: int = 0
    verdict: VerdictKind | None = None
    needed_bytes: int = 0
    skipped: str | None = None

    @property
    def starts(self) -> bool:
        """True when the engine runs the job (it fits, or starts and queues)."""
        return self.verdict is not None and self.verdict != "does_not_fit"


@dataclass(frozen=True, slots=True)
class EngineSetup:
    """One engine on the fewest devices of one type on which it fits: a setup, as ``memest plan`` ranks them.

    Attributes:
        device: The device type.
        count: Devices (the engine's own fewest).
        parallelism: Their layout (tp x pp).
        row: The engine's row on them (its verdict ``fits``).
        usd_per_hour: count x the device's price (``math.inf`` when it has none).
    """

    device: Device
    count: int
    parallelism: Parallelism
    row: EngineRow
    usd_per_hour: float

    @property
    def engine(self) -> Engine:
        """The engine."""
        return self.row.engine


def rank_key(setup: EngineSetup, order: int = 0) -> tuple[float, int, int, int, int]:
    """How setups are ranked (module docstring): price, devices, sequences held (more first), the device
    type's ``order`` among those given, the engine's place in :data:`COMPARED`."""
    return (setup.usd_per_hour, setup.count, -setup.row.concurrent_sequences, order, COMPARED.index(setup.engine))


@dataclass(frozen=True, slots=True)
class DeviceComparison:
    """Every compared engine on one device type.

    Attributes:
        device: The device type.
        count: Devices each engine was estimated on (the fewest on which any fits; 1 when none does).
        parallelism: Their layout (tp x pp).
        rows: One per engine of :data:`COMPARED`, in that order.
        best: The engine that holds the most concurrent sequences among those that start; None when none starts.
        setups: Each engine that fits, on its own fewest devices of the type (:class:`EngineSetup`), ranked.
    """

    device: Device
    count: int
    parallelism: Parallelism
    rows: tuple[EngineRow, ...]
    best: Engine | None
    setups: tuple[EngineSetup, ...] = ()


@dataclass(frozen=True, slots=True)
class EngineComparison:
    """``memest plan --engine any``: the engines compared per device type.

    Attributes:
        workload: The job (its engine is the default's; each row replaces it).
        max_model_len: Tokens per sequence compared.
        headroom: Share of memory kept free for the engines that do not size a pool up front (llama.cpp).
        devices: One per device type, in the order given.
        top: How many of the ranked setups are the answer (``--top``).
        prices: The prices the setups are ranked by.
    """

    workload: ServingConfig
    max_model_len: int
    headroom: float
    devices: tuple[DeviceComparison, ...]
    top: int = 1
    prices: PriceTable = field(default_factory=PriceTable.catalog)

    @property
    def ranked(self) -> tuple[EngineSetup, ...]:
        """The ``top`` best setups over every device type and engine (module docstring)."""
        every = [(rank_key(x, i), x) for i, d in enumerate(self.devices) for x in d.setups]
        return tuple(x for _, x in sorted(every, key=lambda item: item[0]))[:self.top]


def _trial(s: ServingConfig, engine: Engine) -> ServingConfig:
    """The job under ``engine`` at the version memest models by default (a version names one engine's)."""
    return s.replace(engine=engine, engine_version=None)


def _skip_reason(spec: ModelSpec, s: ServingConfig, device: Device) -> str | None:
    """Why ``s`` (one engine) is not compared on ``device``, or None."""
    why = refusal(s, device)
    if why is not None:
        return why
    if s.engine is Engine.LLAMACPP and (spec.quantization is not None):
        return f"{spec.name} is stored quantized ({spec.quantization}), which no GGUF type reproduces"
    if s.gguf_tensors and s.engine is not Engine.LLAMACPP:
        return f"a GGUF file is served by llama.cpp here ({s.engine.value}'s own weights are not a GGUF file's)"
    return None


def _row(spec: ModelSpec, s: ServingConfig, device: Device, par: Parallelism, headroom: float,
         max_len: int) -> EngineRow:
    trial = s.replace(parallelism=par)
    try:
        validate(spec, trial)
        est = estimate(spec, trial, device)
        v = verdict(est, device, par.world_size, headroom)
        held = largest_concurrency(spec, trial, device, max_len)
    except InputError as exc:
        return EngineRow(s.engine, skipped=str(exc))
    tokens = est.serving.kv_cache_tokens if est.serving is not None else 0
    return EngineRow(s.engine, tokens, held if v.starts else 0, v.kind, v.needed_bytes)


def compare_device(spec: ModelSpec, s: ServingConfig, choice: DeviceChoice, headroom: float,
                   prices: PriceTable | None = None) -> DeviceComparison:
    """Every engine of :data:`COMPARED` on ``choice``'s device type, and each one's own fewest devices that
    fit, priced by ``prices`` (default: the catalog's) (module docstring)."""
    device = choice.device
    trials, skipped = [], {}
    for engine in COMPARED:
        trial = _trial(s, engine)
        reason = _skip_reason(spec, trial, device)
        if reason is None:
            try:
                validate(spec, trial)
            except InputError as exc:
                reason = str(exc)
        if reason is None:
            trials.append(trial)
        else:
            skipped[engine] = reason
    layouts: dict[Engine, Parallelism] = {}
    for trial in trials:
        own = smallest_parallelism(spec, trial, device, headroom=headroom)
        if own is not None and own.world_size <= choice.max_count:
            layouts[trial.engine] = own
    one = dataclasses.replace(s.parallelism, tp=1, pp=1, dp=1, cp=1, zero_stage=0)
    par = min(layouts.values(), key=lambda p: (p.world_size, p.pp), default=one)
    max_len = max_model_len_of(spec, s)
    rows = tuple(EngineRow(e, skipped=skipped[e]) if e in skipped else
                 _row(spec, next(t for t in trials if t.engine is e), device, par, headroom, max_len) for e in COMPARED)
    starting = [r for r in rows if r.starts]
    best = max(starting, key=lambda r: (r.concurrent_sequences, -COMPARED.index(r.engine))).engine if starting else None
    price = (prices or PriceTable.catalog()).price(device)
    setups = []
    for engine, own in layouts.items():
        row = next(r for r in rows if r.engine is engine) if own == par else \
            _row(spec, next(t for t in trials if t.engine is engine), device, own, headroom, max_len)
        if row.verdict == "fits":
            usd = own.world_size * price if math.isfinite(price) else math.inf
            setups.append(EngineSetup(device, own.world_size, own, row, usd))
    setups.sort(key=rank_key)
    return DeviceComparison(device, par.world_size, par, rows, best, tuple(setups))


def compare_engines(spec: ModelSpec, s: ServingConfig, choices: tuple[DeviceChoice, ...], *,
                    headroom: float = 0.10, prices: PriceTable | None = None, top: int = 1) -> EngineComparison:
    """The engines of :data:`COMPARED` on each device type of ``choices``, and the ``top`` best setups over
    them all ranked by ``prices`` (default: the catalog's) (module docstring).

    Raises:
        InputError: ``top`` below 1; never for one engine's settings (that engine is skipped with the reason).
    """
    if top < 1:
        raise InputError(f"top is {top}; it must be at least 1 (the best setups to return)")
    prices = prices or PriceTable.catalog()
    s = s.replace(max_model_len=max_model_len_of(spec, s))  # one length for all (llama.cpp's own default is 4096)
    return EngineComparison(s, s.max_model_len, headroom,
                            tuple(compare_device(spec, s, c, headroom, prices) for c in choices), top, prices)
