"""The fit rule: whether a job fits a device (:func:`verdict`, a :class:`Verdict`). One rule, used
by ``memest hf``, the planner (:mod:`memest.planning.search`), the max queries
(:mod:`memest.planning.maxfit`) and sweeps (:mod:`memest.planning.sweep`): the device-used figure
within ``(1 - headroom)`` of the device for training, transformers and llama.cpp / Ollama; start,
hold the batch and stay within the device for the engines that take their memory up front
(:data:`UPFRONT_ENGINES`, headroom not applied). The rule engine by engine: DESIGN.md, "The fit
rule".

For those engines the verdict also says what happens (:attr:`Verdict.kind`): ``does_not_fit`` only
when the engine would not start or not serve one request of max_model_len; ``queues`` when it starts
but its pool holds fewer than ``batch_size`` sequences of max_model_len at once, so the rest wait.
vLLM refuses to start exactly in the first case: ``_check_enough_kv_cache_memory`` in
``vllm/v1/core/kv_cache_utils.py`` (the V1 engine memest models as 0.19; read at vLLM commit 001cabc1)
raises "No available memory for the cache blocks" when nothing is left for the KV cache after the
weights and the profiled activations, and "To serve at least one request with the models's max seq
len (L), (X GiB KV cache is needed, which is larger than the available KV cache memory (Y GiB)"
when one request of max_model_len does not fit the pool. Nothing checks the pool against
``max_num_seqs``: ``Scheduler.schedule`` (``vllm/v1/core/sched/scheduler.py``) leaves a waiting
request in the queue while ``allocate_slots`` has no blocks for it. A queued job is not a fit of
the job as asked (:attr:`Verdict.fits` is False: the planner still searches for a setup that holds
every sequence), but it runs (:attr:`Verdict.starts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from memest.devices import Device, Fleet, usable_bytes
from memest.result import Estimate

VerdictKind = Literal["fits", "queues", "does_not_fit"]
"""What happens to the job (:attr:`Verdict.kind`): it fits as asked; it starts and the sequences the
pool cannot hold wait (up-front engines only); it does not fit (for those engines: the engine would
not start, or would not serve one request of max_model_len)."""

Blocker = Literal["no_memory", "max_model_len", "concurrency"]
"""Why the engine would not serve the job although its memory fits: nothing left for KV blocks, one
request of max_model_len does not fit the pool, or the pool holds fewer than batch_size requests."""

UPFRONT_ENGINES = frozenset({"vllm", "sglang", "trtllm"})
"""Engines that size their KV pool at start-up from a share of the device (rule above)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether an estimate fits a device.

    Attributes:
        device: The accelerator.
        count: Devices in the job.
        headroom: Share of memory kept free (``--headroom``).
        needed_bytes: Per-device device-used estimate (the rank that needs the most), less the paged
            optimizer states the driver evicts when the device fills (:attr:`RankEstimate.required_bytes`);
            for the engines of :data:`UPFRONT_ENGINES`, what the started engine holds.
        high_bytes: Upper edge of its band.
        headroom_applied: False for :data:`UPFRONT_ENGINES`, whose fraction sets their share instead.
        blocker: For those engines, why it would not serve the job although its memory fits; None otherwise.
        shortfall_bytes: With a blocker, the KV memory per device the engine lacks to serve the job:
            ``no_memory`` non-KV + one request's KV - the budget; ``max_model_len`` one request's KV
            - the KV budget; ``concurrency`` one replica's share of the requests' KV - the KV budget.
        held_sequences: Up-front engines: sequences of max_model_len the pools of all the job's
            data-parallel replicas hold at once, K (``ServingSummary.held_sequences``: replicas x each
            pool's); 0 otherwise.
        asked_sequences: Up-front engines: the sequences the job sends at once over all its replicas, N
            (``batch_size``); 0 otherwise.
        sequence_tokens: Up-front engines: tokens per sequence, L (max_model_len); 0 otherwise.
    """

    device: Device
    count: int
    headroom: float
    needed_bytes: int
    high_bytes: int
    headroom_applied: bool = True
    blocker: Blocker | None = None
    shortfall_bytes: int = 0
    held_sequences: int = 0
    asked_sequences: int = 0
    sequence_tokens: int = 0

    @property
    def usable_bytes(self) -> int:
        """Memory the job may use: capacity x (1 - headroom), or the whole capacity for vLLM."""
        return usable_bytes(self.device, self.headroom if self.headroom_applied else 0.0)

    @property
    def fits(self) -> bool:
        """True when the estimate is within the usable memory (and, for vLLM, it serves the job)."""
        return self.needed_bytes <= self.usable_bytes and self.blocker is None

    @property
    def kind(self) -> VerdictKind:
        """What happens (:data:`VerdictKind`): ``queues`` when the only rule broken is the pool's
        room for batch_size sequences (the engine starts and stays within the device)."""
        if self.fits:
            return "fits"
        if self.blocker == "concurrency" and self.needed_bytes <= self.usable_bytes:
            return "queues"
        return "does_not_fit"

    @property
    def starts(self) -> bool:
        """True when the job runs: it fits, or it starts and queues what its pool cannot hold."""
        return self.kind != "does_not_fit"

    @property
    def fits_with_band(self) -> bool:
        """True when even the band's upper edge fits the device's full capacity."""
        return self.high_bytes <= self.device.memory_bytes and self.blocker is None

    @property
    def margin_bytes(self) -> int:
        """Usable minus needed; for a vLLM job with a blocker, at most minus its shortfall, so the
        margin is negative exactly when the job does not fit."""
        margin = self.usable_bytes - self.needed_bytes
        return min(margin, -self.shortfall_bytes) if self.blocker else margin

    @property
    def free_bytes(self) -> int:
        """Capacity minus needed: what is left on the device (negative when over capacity)."""
        return self.device.memory_bytes - self.needed_bytes


def device_verdicts(est: Estimate, fleet: Fleet, headroom: float) -> tuple[Verdict, ...]:
    """One verdict per device of a fleet: for llama.cpp / Ollama (one rank per device, in order) each rank's
    device-used figure against its own device; for the engines that run at the card with the smallest pool
    (their estimate is that card's, ``extra["fleet_binding"]``: :func:`memest.estimate.serving.estimate_serving`)
    that card's verdict."""
    s = est.serving
    count = len(fleet)
    if not fleet.mixed or (s is not None and s.engine in UPFRONT_ENGINES) or len(est.ranks) != count:
        binding = next((d for d in fleet.devices if d.name == est.extra.get("fleet_binding")), fleet.smallest)
        return (verdict(est, binding, count, headroom),)
    return tuple(Verdict(d, count, headroom, r.required_bytes, r.required_high_bytes)
                 for d, r in zip(fleet.devices, est.ranks))


def verdict(est: Estimate, device: Device | Fleet, count: int, headroom: float) -> Verdict:
    """The fit verdict of an estimate on ``count`` x ``device`` (see the module docstring); on a
    :class:`~memest.devices.Fleet`, the verdict of the device with the least margin
    (:func:`device_verdicts`): the job fits when every device does."""
    if isinstance(device, Fleet):
        return min(device_verdicts(est, device, headroom), key=lambda v: v.margin_bytes)
    s = est.serving
    if s is not None and s.engine in UPFRONT_ENGINES:
        blocker: Blocker | None = None
        shortfall = 0
        if s.engine_error == "no_memory":
            blocker, shortfall = "no_memory", s.non_kv_bytes + s.request_kv_bytes - s.requested_bytes
        elif s.engine_error == "max_model_len":
            blocker, shortfall = "max_model_len", s.request_kv_bytes - s.kv_budget_bytes
        elif s.held_sequences < s.batch_size:  # each replica's pool short of its share
            blocker, shortfall = "concurrency", s.replica_batch_size * s.request_kv_bytes - s.kv_budget_bytes
        return Verdict(device, count, headroom, s.device_bytes, s.device_bytes, headroom_applied=False,
                       blocker=blocker, shortfall_bytes=max(1, shortfall) if blocker else 0,
                       held_sequences=s.held_sequences, asked_sequences=s.batch_size,
                       sequence_tokens=s.max_model_len)
    rank = est.per_device
    return Verdict(device, count, headroom, rank.required_bytes, rank.required_high_bytes)
