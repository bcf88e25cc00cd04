"""What an estimate is made of: Terms that add up, per rank, to the three figures.

- **peak allocated** = the sum of every term except ``allocator`` and ``runtime`` kinds
  (what ``torch.cuda.max_memory_allocated()`` reports);
- **peak reserved** = peak allocated + the ``allocator`` terms (the caching allocator's slack);
- **device used** = peak reserved + the ``runtime`` terms (CUDA context, NCCL, CUDA graphs: what
  nvidia-smi shows). Out-of-memory happens when this exceeds the device's capacity.

Bytes are ints everywhere; only :mod:`memest.report` turns them into GiB.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Kind(str, Enum):
    """The kind of memory a term counts."""

    WEIGHTS = "weights"
    """Parameters as stored for compute (and frozen bases of LoRA/QLoRA)."""
    GRADIENTS = "gradients"
    """Gradient buffers."""
    OPTIMIZER_STATES = "optimizer_states"
    """Optimizer moments and fp32 master weights."""
    ACTIVATIONS = "activations"
    """Tensors saved for backward (training) or live during a forward (serving)."""
    LOGITS = "logits"
    """Vocabulary logits, their fp32 upcast and their gradient."""
    KV_CACHE = "kv_cache"
    """Keys and values (or latents / recurrent states) cached for decoding."""
    WORKSPACE = "workspace"
    """Transient buffers: cuBLAS workspace, gather/reduce buffers, optimizer-step temporaries."""
    ALLOCATOR = "allocator"
    """Caching-allocator slack: reserved minus allocated."""
    RUNTIME = "runtime"
    """Memory outside PyTorch's allocator: CUDA context, NCCL buffers, CUDA graphs."""


ALLOCATED_KINDS = frozenset(Kind) - {Kind.ALLOCATOR, Kind.RUNTIME}

NEGLIGIBLE_SHARE = 0.01
"""A compared part (one kind, one term) whose reference figure is under this share of the peak it belongs to gets
no relative error: a percentage of next to nothing says nothing of the estimate, its difference does (``memest
calibrate`` / ``memest.track`` rows, :mod:`memest.calibration.compare`; the ``--trace`` table)."""

PAGED_STATES = "runtime.paged_optimizer_states"
"""The term of bitsandbytes' paged optimizer states resident on the device (CUDA managed memory, outside the
allocator: :mod:`memest.estimate.training.optimizers`). The driver evicts such pages to host RAM when the
device fills, so they are in device used but never the reason for an out-of-memory (:attr:`RankEstimate.required_bytes`)."""

UNCERTAINTY: dict[Kind, float] = {
    Kind.WEIGHTS: 0.01,
    Kind.GRADIENTS: 0.02,
    Kind.OPTIMIZER_STATES: 0.02,
    Kind.ACTIVATIONS: 0.15,
    Kind.LOGITS: 0.10,
    Kind.KV_CACHE: 0.02,
    Kind.WORKSPACE: 0.50,
    Kind.ALLOCATOR: 1.00,
    Kind.RUNTIME: 0.50,
}
"""Relative uncertainty of each kind, giving an estimate's band: weights, gradients, optimizer
states and KV cache are counted exactly from the architecture (the band covers framework
padding); activations depend on kernels and framework versions; allocator slack and runtime
memory vary with the driver, library versions and the allocation pattern."""



def plural(n: int, word: str) -> str:
    """``n`` (with thousands separators) and ``word``, plural unless ``n`` is 1: ``1 request``, ``2 requests``."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"

@dataclass(frozen=True, slots=True)
class Term:
    """One named amount of memory.

    Attributes:
        name: Stable dotted id (``weights``, ``optimizer_states.master``, ``activations.layers``).
        kind: Its :class:`Kind`.
        bytes: Bytes per device.
        formula: How it was computed, in the symbols of ``memest.estimate`` (for ``--explain``).
    """

    name: str
    kind: Kind
    bytes: int
    formula: str = ""


@dataclass(frozen=True, slots=True)
class RankEstimate:
    """The terms of one rank (or of every rank, when all ranks are alike).

    Attributes:
        label: Which ranks these are (``all ranks``, ``pp stage 0 (first)``).
        terms: Its terms, in display order.
        count: How many of the job's devices look like this (a pipeline stage is held by tp x cp x dp of them).
    """

    label: str
    terms: tuple[Term, ...]
    count: int = 1

    @property
    def allocated_bytes(self) -> int:
        """Peak allocated: every term but allocator slack and runtime memory."""
        return sum(t.bytes for t in self.terms if t.kind in ALLOCATED_KINDS)

    @property
    def reserved_bytes(self) -> int:
        """Peak reserved: allocated plus allocator slack."""
        return self.allocated_bytes + sum(t.bytes for t in self.terms if t.kind is Kind.ALLOCATOR)

    @property
    def device_used_bytes(self) -> int:
        """Device used (nvidia-smi): reserved plus runtime memory."""
        return self.reserved_bytes + sum(t.bytes for t in self.terms if t.kind is Kind.RUNTIME)

    @property
    def required_bytes(self) -> int:
        """What must fit the device: device used less the paged states the driver would evict
        (:data:`PAGED_STATES`)."""
        return self.device_used_bytes - sum(t.bytes for t in self.terms if t.name == PAGED_STATES)

    @property
    def required_high_bytes(self) -> int:
        """The band's upper edge less the evictable paged states' share of it."""
        return self.high_bytes - sum(round(t.bytes * (1 + UNCERTAINTY[t.kind])) for t in self.terms
                                     if t.name == PAGED_STATES)

    @property
    def low_bytes(self) -> int:
        """Lower edge of the band around device used (each term less its kind's uncertainty)."""
        return sum(round(t.bytes * (1 - UNCERTAINTY[t.kind])) for t in self.terms)

    @property
    def high_bytes(self) -> int:
        """Upper edge of the band around device used."""
        return sum(round(t.bytes * (1 + UNCERTAINTY[t.kind])) for t in self.terms)

    def by_kind(self) -> dict[Kind, int]:
        """Bytes per kind, in the enum's order, zero rows omitted."""
        out = dict.fromkeys(Kind, 0)
        for t in self.terms:
            out[t.kind] += t.bytes
        return {k: v for k, v in out.items() if v}

    def term(self, name: str) -> Term:
        """The term with this name.

        Raises:
            KeyError: no such term.
        """
        for t in self.terms:
            if t.name == name:
                return t
        raise KeyError(name)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingSummary:
    """What a serving estimate adds: the KV-cache arithmetic and the engine's budget.

    Attributes:
        kv_cache_bytes_per_token: KV-cache bytes one token takes on one device.
        state_bytes_per_sequence: Cache bytes one sequence holds on one device whatever its length:
            the states of Mamba / linear-attention / short-conv layers and cross-attention layers'
            encoder K/V (0 for attention-only models).
        max_model_len: Tokens per sequence used for the estimate.
        kv_cache_tokens: Tokens the engine's KV pool holds per device (vLLM's 'GPU KV cache size',
            SGLang's max_total_num_tokens, TensorRT-LLM's 'max tokens in paged KV cache').
        kv_cache_blocks: Paged blocks in that pool.
        max_concurrency: kv_cache_tokens / max_model_len (vLLM's 'Maximum concurrency').
        kv_budget_bytes: Bytes the engine leaves for the KV pool (vLLM's 'Available KV cache memory').
        engine: ``vllm``, ``sglang``, ``trtllm`` or ``hf``.
        engine_version: The engine version whose arithmetic was modelled.
        requested_bytes: vLLM: gpu_memory_utilization x capacity; SGLang: mem_fraction_static x the
            free memory before the weights; TensorRT-LLM: non-KV memory + the KV budget; hf: the
            device's capacity.
        non_kv_bytes: vLLM's 'Total non KV cache memory' (weights + activation peak + non-torch);
            SGLang: the weights; TensorRT-LLM: weights + activations and buffers + context.
        activation_peak_bytes: The profiled (vLLM) or generate (hf) activation peak.
        non_torch_bytes: Non-torch memory the budget subtracts.
        request_kv_bytes: KV bytes one request of max_model_len needs on the limiting rank.
        engine_error: Why the engine would refuse to start: ``no_memory`` (nothing left for KV),
            ``max_model_len`` (one request of max_model_len does not fit), or None.
        largest_max_model_len: The longest max_model_len at which the job's batch_size requests fit
            at once (0: none).
        largest_max_model_len_one_request: vLLM's 'estimated maximum model length' for one request.
        largest_concurrency: Requests of max_model_len tokens that fit at once in one replica's pool
            (the floor of max_concurrency for vLLM).
        batch_size: Requests the job serves at once, over all its replicas (``--batch-size``).
        replicas: Data-parallel replicas, each an engine with its own pool (``parallelism.dp``); each
            serves ``ceil(batch_size / replicas)`` of the requests (``ServingConfig.replica_batch_size``).
        device_bytes: vLLM: what the started engine holds on one device (nvidia-smi): the budget
            gpu_memory_utilization x capacity plus what sits outside it (CUDA graphs; for 0.19
            also the CUDA context and NCCL communicators). 0 for hf.
    """

    kv_cache_bytes_per_token: int
    max_model_len: int
    kv_cache_tokens: int
    kv_cache_blocks: int
    max_concurrency: float
    kv_budget_bytes: int
    engine: str = "vllm"
    engine_version: str = ""
    requested_bytes: int = 0
    non_kv_bytes: int = 0
    activation_peak_bytes: int = 0
    non_torch_bytes: int = 0
    request_kv_bytes: int = 0
    engine_error: str | None = None
    largest_max_model_len: int = 0
    largest_max_model_len_one_request: int = 0
    largest_concurrency: int = 0
    batch_size: int = 0
    device_bytes: int = 0
    state_bytes_per_sequence: int = 0
    replicas: int = 1

    @property
    def held_sequences(self) -> int:
        """Requests of max_model_len held at once over all replicas: replicas x largest_concurrency."""
        return self.replicas * self.largest_concurrency

    @property
    def replica_batch_size(self) -> int:
        """Requests the busiest replica serves at once: ``ceil(batch_size / replicas)``."""
        return -(-self.batch_size // self.replicas)


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """A per-device memory estimate.

    Attributes:
        ranks: One entry per distinct kind of rank (pipeline stages differ).
        assumptions: What the estimate took for granted, in words.
        serving: The KV-cache summary of a serving estimate.
        host_bytes: Host RAM per node the job needs for offloaded states and activations, and for the paged
            optimizer states the driver evicts from a full device (0 without either).
        extra: Numbers specific to one estimator, for JSON (ints and strings only).
    """

    ranks: tuple[RankEstimate, ...]
    assumptions: tuple[str, ...] = ()
    serving: ServingSummary | None = None
    host_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def per_device(self) -> RankEstimate:
        """The rank that needs the most device memory (what must fit)."""
        return max(self.ranks, key=lambda r: r.device_used_bytes)

    @property
    def terms(self) -> tuple[Term, ...]:
        """The terms of :attr:`per_device`."""
        return self.per_device.terms


def plain(value: Any) -> Any:
    """A value as JSON-ready data: dataclasses as dicts of their fields, enums as their values,
    tuples as lists (bytes stay ints)."""
    if isinstance(value, Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def rank_dict(rank: RankEstimate) -> dict[str, Any]:
    """One rank's figures and terms as plain data (the ``ranks`` entries of ``--json``)."""
    return {
        "label": rank.label,
        "count": rank.count,
        "allocated_bytes": rank.allocated_bytes,
        "reserved_bytes": rank.reserved_bytes,
        "device_used_bytes": rank.device_used_bytes,
        "low_bytes": rank.low_bytes,
        "high_bytes": rank.high_bytes,
        "terms": [{"name": t.name, "kind": t.kind.value, "bytes": t.bytes, "formula": t.formula} for t in rank.terms],
    }


def estimate_dict(est: Estimate) -> dict[str, Any]:
    """The ranks of an estimate as plain data (calibration records, benchmarks)."""
    return {"ranks": [rank_dict(r) for r in est.ranks], "assumptions": list(est.assumptions),
            "serving": plain(est.serving) if est.serving else None, "host_bytes": est.host_bytes}
