"""Which GGUF quant, context and layer split fit a device under llama.cpp: the search behind the
recommendation ("Q5_K_M at 16k fits fully on the GPU; Q8_0 fits with 6 layers in RAM").

A llama.cpp job fits when every GPU's model buffer + KV + compute buffer + CUDA context is within the
usable memory (:func:`memest.devices.usable_bytes`); the layers left on the host run from RAM (slower,
reported). Memory grows with the offloaded layers and with n_ctx, so each search is a bisection over
:func:`memest.estimate.serving.llamacpp.engine.estimate_llamacpp`.
"""

from __future__ import annotations

from dataclasses import dataclass

from memest.devices import Device, Fleet, usable_bytes
from memest.errors import InputError
from memest.estimate.serving.llamacpp import engine
from memest.spec import ModelSpec
from memest.workload import ServingConfig

LADDER = ("q8_0", "q6_k", "q5_k_m", "q4_k_m", "iq4_xs", "q3_k_m", "q2_k")
"""File types tried, best quality first (the common llama.cpp / Hub GGUF choices)."""

UNQUANTIZED = ("f32", "f16", "bf16")
"""GGUF file types of 16- or 32-bit weights."""


def lower_quants(s: ServingConfig) -> tuple[str, ...]:
    """The :data:`LADDER` types of fewer bits than the job's file type
    (:func:`memest.estimate.serving.llamacpp.engine.default_file_type`): all of them from an unquantized
    file, the ones after it from a ladder type, none from another type (q4_0, q5_1, ...: not ranked here)."""
    ftype = engine.default_file_type(s)
    if ftype in UNQUANTIZED:
        return LADDER
    return LADDER[LADDER.index(ftype) + 1:] if ftype in LADDER else ()


def fits(spec: ModelSpec, s: ServingConfig, device: Device | Fleet, headroom: float) -> bool:
    """Every GPU's figure within its own usable memory (a fleet's devices each their own)."""
    try:
        est = engine.estimate_llamacpp(spec, s, device)
    except InputError:
        return False
    devs = engine.devices_of(device, len(est.ranks))
    return all(r.device_used_bytes <= usable_bytes(d, headroom) for r, d in zip(est.ranks, devs))


def most_gpu_layers(spec: ModelSpec, s: ServingConfig, device: Device | Fleet, headroom: float) -> int:
    """The most layers (of num_layers + 1) llama.cpp can offload with the job's other settings; -1
    when even 0 (everything in RAM: the GPU keeps only its compute buffer) does not fit."""
    top = spec.num_layers + 1
    if not fits(spec, s.replace(n_gpu_layers=0), device, headroom):
        return -1
    lo, hi = 0, top
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(spec, s.replace(n_gpu_layers=mid), device, headroom):
            lo = mid
        else:
            hi = mid - 1
    return lo


def largest_n_ctx(spec: ModelSpec, s: ServingConfig, device: Device | Fleet, headroom: float, limit: int) -> int:
    """The largest max_model_len (at most ``limit``; n_ctx is it x batch_size) at which the job's
    layers fit; 0 when none does."""
    if not fits(spec, s.replace(max_model_len=1), device, headroom):
        return 0
    lo, hi = 1, max(1, limit)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(spec, s.replace(max_model_len=mid), device, headroom):
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True, slots=True)
class Option:
    """One quant's best placement at the asked context.

    Attributes:
        quantization: The GGUF file type.
        n_ctx: The context asked.
        gpu_layers: Layers (of ``layers``) on the GPU; -1 when nothing fits.
        layers: num_layers + 1.
        largest_full_ctx: The longest context at which every layer fits on the GPU (0: none).
    """

    quantization: str
    n_ctx: int
    gpu_layers: int
    layers: int
    largest_full_ctx: int

    @property
    def full(self) -> bool:
        """Every layer on the GPU."""
        return self.gpu_layers == self.layers

    @property
    def host_layers(self) -> int:
        """Layers left in host RAM (0 when fully offloaded)."""
        return self.layers - max(self.gpu_layers, 0)


def search(spec: ModelSpec, s: ServingConfig, device: Device | Fleet, headroom: float,
           quants: tuple[str, ...] = LADDER) -> list[Option]:
    """For each file type of ``quants`` (best first): the most layers that fit at the job's n_ctx and
    the longest context that fits fully on the GPU (up to the model's max_position_embeddings)."""
    n_ctx = s.max_model_len or engine.DEFAULT_N_CTX
    limit = max(n_ctx, spec.max_position_embeddings or n_ctx)
    out = []
    for q in quants:
        trial = s.replace(quantization=q, gguf_tensors=(), n_gpu_layers=None)
        full_ctx = largest_n_ctx(spec, trial, device, headroom, limit)
        out.append(Option(q, n_ctx, most_gpu_layers(spec, trial, device, headroom), spec.num_layers + 1, full_ctx))
    return out


def best(options: list[Option]) -> tuple[Option | None, Option | None, Option | None]:
    """The best quant that fits fully on the GPU at the asked context; a better one (earlier in the
    ladder) that fits there with some layers in RAM; and, when none fits fully at the asked context,
    the best that fits fully at a shorter one (its ``largest_full_ctx``). Any may be None."""
    full = next((o for o in options if o.full), None)
    stop = options.index(full) if full else len(options)
    partial = next((o for o in options[:stop] if o.gpu_layers >= 0), None)
    shorter = None if full else next((o for o in options if o.largest_full_ctx >= min(o.n_ctx, 2048)), None)
    return full, partial, shorter
