"""Bytes of weights as stored on one rank: plain dtypes and quantized formats.

Quantization converts the linear weights of the layers (``TensorSpec.is_linear_weight``);
embeddings, lm_head, norms, biases and routers keep the 16-bit dtype, as bitsandbytes, GPTQ,
AWQ, compressed-tensors and vLLM's fp8 leave them (plus the modules the config skips). A
quantized ``(out, in)`` weight stores ``ceil(out x in x bits / 8)`` bytes of data plus scales
(and zero points) at the format's granularity:

| scheme | bits | scales | zero points / extra | source |
|---|---|---|---|---|
| ``int8`` | 8 | fp32 per output row (``SCB``) | | bitsandbytes ``Int8Params`` (LLM.int8) |
| ``nf4`` / ``fp4`` | 4 | fp32 absmax per 64 weights of the flattened tensor; with double quantization an 8-bit absmax per 64 and an fp32 scale per 256 absmaxes | | bitsandbytes ``Params4bit`` / ``QuantState`` |
| ``gptq`` | b | fp16 per (group of g inputs, output) | b-bit packed ``qzeros`` per scale; int32 ``g_idx`` per input | AutoGPTQ ``QuantLinear``; vLLM ``GPTQLinearMethod`` |
| ``awq`` / ``int4`` | b | fp16 per (group, output) | b-bit packed ``qzeros`` per scale | AutoAWQ ``WQLinear_GEMM``; vLLM ``AWQLinearMethod`` |
| ``fp8`` | 8 | fp32 per tensor (vLLM online ``--quantization fp8``) or per 128x128 block (DeepSeek-V3 ``weight_block_size``) | | vLLM ``Fp8LinearMethod`` |
| ``mxfp4`` | 4 | one 8-bit shared exponent (E8M0) per 32 inputs | | OCP MX spec; gpt-oss ``*_blocks`` / ``*_scales`` |
| compressed-tensors | b | per ``strategy``: fp32 per tensor / channel / 128x128 block (W8A8), model-dtype per group (WNA16) | packed zero points when asymmetric | vLLM ``CompressedTensorsW8A8Fp8`` / ``W8A8Int8`` / ``WNA16`` |
| modelopt (NVIDIA ModelOpt) | 8 / 4 | ``FP8``: fp32 per tensor (``FP8_PER_CHANNEL_PER_TOKEN``: per channel); ``NVFP4``: one fp8 (E4M3) per 16 inputs (its fp32 global scale per tensor left out) | | vLLM ``ModelOptFp8Config`` / ``ModelOptNvFp4Config`` (``modelopt.py``, commit 00155cde) |

Mixed-precision checkpoints are counted exactly with ``--exact-weights``: the safetensors headers
give the parameters per stored dtype (:func:`checkpoint_scale`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from memest.errors import InputError
from memest.estimate.sharding import shard_numel
from memest.spec import ModelSpec, QuantizationSpec, TensorSpec
from memest.workload import Parallelism

Granularity = str
"""``tensor``, ``channel`` (per output row), ``group`` (per output row and group of inputs),
``block`` (2-D blocks), ``flat`` (blocks of the flattened tensor, bitsandbytes 4-bit)."""


@dataclass(frozen=True, slots=True)
class QuantScheme:
    """How one quantized weight format stores a linear weight.

    Attributes:
        name: ``int8``, ``nf4``, ``fp4``, ``gptq``, ``awq``, ``fp8``, ``mxfp4``, ``compressed-tensors``.
        bits: Bits per weight.
        group_size: Weights per scale for ``group`` (inputs) and ``flat`` (flattened) granularity.
        double_quant: bitsandbytes nested quantization of the absmax scales.
        block_shape: Rows x columns per scale for ``block`` granularity.
        granularity: What one scale covers (see :data:`Granularity`).
        scale_bytes: Bytes per scale.
        zero_bits: Bits of zero point per scale (0: symmetric).
        g_idx: True when an int32 group index is stored per input feature (GPTQ act-order).
        compute_dtype: bitsandbytes 4-bit compute dtype (None: the served dtype).
        nested_scale_bytes: Bytes of one scale of the 256-absmax blocks under double quantization
            (bitsandbytes: fp32; torchao ``NF4Tensor``: its ``quantization_factor`` in the weight's dtype).
    """

    name: str
    bits: int
    group_size: int | None = None
    double_quant: bool = False
    block_shape: tuple[int, int] | None = None
    granularity: Granularity = "channel"
    scale_bytes: float = 4
    zero_bits: int = 0
    g_idx: bool = False
    compute_dtype: str | None = None
    nested_scale_bytes: int = 4

    def num_scales(self, shape: tuple[int, ...]) -> int:
        """Scales of one weight of this shape (``(out, in)`` or ``(experts, out, in)``)."""
        out_features, in_features = shape[-2], shape[-1]
        mats = math.prod(shape[:-2])
        if self.granularity == "tensor":
            return mats
        if self.granularity == "channel":
            return mats * out_features
        if self.granularity == "group":
            g = self.group_size if self.group_size and self.group_size > 0 else in_features
            return mats * out_features * math.ceil(in_features / g)
        if self.granularity == "block":
            br, bc = self.block_shape or (128, 128)
            return mats * math.ceil(out_features / br) * math.ceil(in_features / bc)
        if self.granularity == "flat":
            return math.ceil(math.prod(shape) / (self.group_size or 64))
        raise InputError(f"unknown scale granularity {self.granularity!r}")

    def data_bytes(self, shape: tuple[int, ...]) -> int:
        """Bytes of one weight's packed values alone (no scales)."""
        return math.ceil(math.prod(shape) * self.bits / 8)

    def tensor_bytes(self, shape: tuple[int, ...]) -> int:
        """Bytes of one weight of this shape, scales and zero points included."""
        data = self.data_bytes(shape)
        scales = self.num_scales(shape)
        if self.double_quant:
            scale_bytes = scales + self.nested_scale_bytes * math.ceil(scales / 256)
        else:
            scale_bytes = math.ceil(scales * self.scale_bytes)
        zeros = math.ceil(scales * self.zero_bits / 8)
        g_idx = 4 * shape[-1] * math.prod(shape[:-2]) if self.g_idx else 0
        return data + scale_bytes + zeros + g_idx


SCHEMES: dict[str, QuantScheme] = {
    "int8": QuantScheme("int8", 8, granularity="channel", scale_bytes=4),
    "nf4": QuantScheme("nf4", 4, group_size=64, double_quant=True, granularity="flat"),
    "fp4": QuantScheme("fp4", 4, group_size=64, granularity="flat", compute_dtype="float32"),
    "int4": QuantScheme("awq", 4, group_size=128, granularity="group", scale_bytes=2, zero_bits=4),
    "awq": QuantScheme("awq", 4, group_size=128, granularity="group", scale_bytes=2, zero_bits=4),
    "gptq": QuantScheme("gptq", 4, group_size=128, granularity="group", scale_bytes=2, zero_bits=4, g_idx=True),
    "fp8": QuantScheme("fp8", 8, granularity="tensor", scale_bytes=4),
    "mxfp4": QuantScheme("mxfp4", 4, group_size=32, granularity="group", scale_bytes=1),
}
"""The ``--quantization`` choices. ``int8`` is bitsandbytes LLM.int8 (``load_in_8bit``); ``nf4`` is
bitsandbytes NF4 with double quantization (QLoRA's recipe); ``fp4`` is ``load_in_4bit=True`` with
transformers' defaults (FP4, no double quantization, fp32 compute dtype); ``int4`` means AWQ-style
4-bit with groups of 128, the format vLLM serves most 4-bit checkpoints in; ``fp8`` is vLLM's
online dynamic fp8 (per-tensor scales)."""


def scheme_of(q: QuantizationSpec) -> QuantScheme:
    """The storage scheme of a checkpoint's quantization_config.

    Raises:
        InputError: a quant_method memest does not model.
    """
    if q.method == "bitsandbytes":
        if q.bits == 4:
            return QuantScheme("nf4", 4, group_size=q.group_size or 64, double_quant=q.double_quant,
                               granularity="flat", compute_dtype=q.compute_dtype)
        return SCHEMES["int8"]
    if q.method in ("gptq", "awq"):
        group = q.group_size if q.group_size and q.group_size > 0 else None
        return QuantScheme(q.method, q.bits, group_size=group, granularity="group" if group else "channel",
                           scale_bytes=2, zero_bits=q.bits, g_idx=q.method == "gptq")
    if q.method == "fp8":
        if q.block_shape:
            return QuantScheme("fp8", 8, block_shape=q.block_shape, granularity="block", scale_bytes=4)
        return SCHEMES["fp8"]
    if q.method == "mxfp4":
        return QuantScheme("mxfp4", 4, group_size=q.group_size or 32, granularity="group", scale_bytes=1)
    if q.method == "compressed-tensors":
        strategy = q.strategy or "channel"
        if q.bits >= 8:  # W8A8 fp8 / int8: fp32 scales (vLLM CompressedTensorsW8A8*)
            return QuantScheme("compressed-tensors", q.bits, group_size=q.group_size, block_shape=q.block_shape,
                               granularity=strategy, scale_bytes=4)
        return QuantScheme("compressed-tensors", q.bits, group_size=q.group_size, block_shape=q.block_shape,
                           granularity=strategy, scale_bytes=2)
    if q.method == "modelopt" and q.strategy in ("tensor", "channel"):  # FP8: fp32 scales per tensor / channel
        return QuantScheme("modelopt", 8, granularity=q.strategy, scale_bytes=4)
    if q.method == "modelopt" and q.strategy == "group":  # NVFP4: one fp8 (E4M3) scale per group of 16
        return QuantScheme("modelopt", 4, group_size=q.group_size or 16, granularity="group", scale_bytes=1)
    if q.method == "modelopt":
        raise InputError(f"ModelOpt quant_algo {q.strategy.upper() if q.strategy else '?'} in the config is not "
                         f"modelled; pass {{quantization}} to choose one ({', '.join(sorted(SCHEMES))})",
                         field="quantization")
    raise InputError(
        f"quantization method {q.method!r} in the config is not modelled; pass {{quantization}} to choose one "
        f"({', '.join(sorted(SCHEMES))})", field="quantization"
    )


def _skipped(tensor: TensorSpec, skip: tuple[str, ...]) -> bool:
    module = tensor.module
    for pattern in skip:
        p = pattern.replace("model.layers.*.", "").replace("model.", "").strip(".*")
        if p and (module == p or module.startswith(p + ".") or module.endswith("." + p) or p in module.split(".")):
            return True
    return False


def is_quantized(t: TensorSpec, scheme: QuantScheme | None, skip: tuple[str, ...]) -> bool:
    """True when ``scheme`` stores ``t`` quantized: a linear weight of a module the config does not skip."""
    return scheme is not None and t.is_linear_weight and not _skipped(t, skip)


def tensor_bytes(t: TensorSpec, par: Parallelism, num_kv_heads: int, *, dtype_bytes: float,
                 scheme: QuantScheme | None = None, skip: tuple[str, ...] = ()) -> float:
    """Bytes one rank stores for one tensor (its TP/EP shard, quantized when it is a linear weight
    the scheme converts)."""
    if is_quantized(t, scheme, skip):
        assert scheme is not None
        return scheme.tensor_bytes(_local_shape(t, par, num_kv_heads))
    return shard_numel(t, par, num_kv_heads) * dtype_bytes


def _local_shape(t: TensorSpec, par: Parallelism, num_kv_heads: int) -> tuple[int, ...]:
    """The shape of one rank's TP/EP shard of a linear weight (its output rows split)."""
    ratio = shard_numel(t, par, num_kv_heads) / t.numel
    return (*t.shape[:-2], max(1, round(t.shape[-2] * ratio)), t.shape[-1]) if ratio < 1 else t.shape


def scale_bytes(t: TensorSpec, par: Parallelism, num_kv_heads: int, scheme: QuantScheme,
                skip: tuple[str, ...] = ()) -> int:
    """Bytes of one tensor's scales (and zero points, group index) on one rank: what :func:`tensor_bytes` counts
    beyond the packed values; 0 for a tensor the scheme leaves unquantized."""
    if not is_quantized(t, scheme, skip):
        return 0
    shape = _local_shape(t, par, num_kv_heads)
    return scheme.tensor_bytes(shape) - scheme.data_bytes(shape)


def weight_bytes(
    tensors: Iterable[tuple[TensorSpec, int]],
    par: Parallelism,
    num_kv_heads: int,
    *,
    dtype_bytes: float,
    scheme: QuantScheme | None = None,
    skip: tuple[str, ...] = (),
) -> int:
    """Bytes one rank stores for ``tensors`` (each with its multiplicity).

    Args:
        tensors: Full tensors and how many times each occurs on the rank.
        par: Parallel degrees (tp / ep shard the tensors).
        num_kv_heads: k, for KV-projection sharding.
        dtype_bytes: Bytes per element of unquantized tensors.
        scheme: The format of quantized linear weights (None: all at dtype_bytes).
        skip: Module-name patterns left unquantized.
    """
    total = 0.0
    for t, count in tensors:
        total += tensor_bytes(t, par, num_kv_heads, dtype_bytes=dtype_bytes, scheme=scheme, skip=skip) * count
    return math.ceil(total)


def serving_weight_layout(spec: ModelSpec, quantization: str) -> tuple[QuantScheme | None, tuple[str, ...]]:
    """The quantization scheme and skipped modules for serving ``spec`` with ``--quantization``.

    ``none`` keeps the checkpoint's own quantization_config (if any).
    """
    if quantization != "none":
        return SCHEMES[quantization], ()
    if spec.quantization is not None:
        return scheme_of(spec.quantization), spec.quantization.skip_modules
    return None, ()


SAFETENSORS_DTYPE_BYTES: dict[str, float] = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1, "F4": 0.5,
}
"""Bytes per element of the safetensors dtype names (the header's ``dtype`` field)."""
_FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")


def checkpoint_bytes(params: Iterable[tuple[str, int]], dtype_bytes: float) -> int:
    """Bytes a checkpoint occupies once loaded for serving: floating-point parameters converted to the
    served dtype, integer and fp8 parameters (packed quantized weights, scales) as stored.

    Args:
        params: (safetensors dtype, parameter count) pairs from the headers.
        dtype_bytes: Bytes per element of the served dtype.

    Raises:
        InputError: a dtype name safetensors does not define.
    """
    total = 0.0
    for dtype, count in params:
        if dtype not in SAFETENSORS_DTYPE_BYTES:
            raise InputError(f"unknown safetensors dtype {dtype!r} in the checkpoint headers")
        total += count * (dtype_bytes if dtype in _FLOAT_DTYPES else SAFETENSORS_DTYPE_BYTES[dtype])
    return math.ceil(total)


def checkpoint_scale(spec: ModelSpec, params: Iterable[tuple[str, int]], dtype_bytes: float,
                     scheme: QuantScheme | None, skip: tuple[str, ...]) -> float:
    """Exact checkpoint bytes / analytic bytes of the whole model, to scale per-rank analytic weights.

    The headers give the whole checkpoint's bytes exactly (what the analytic layout may miss:
    mixed-precision layers, extra buffers, multi-token-prediction layers); the analytic layout
    still says how they split across ranks.
    """
    params = list(params)
    if all(dtype in _FLOAT_DTYPES for dtype, _ in params):
        scheme, skip = None, ()  # an unquantized checkpoint: compare like with like, quantize after
    analytic = weight_bytes(spec.tensors(), Parallelism(), spec.num_kv_heads, dtype_bytes=dtype_bytes,
                            scheme=scheme, skip=skip)
    exact = checkpoint_bytes(params, dtype_bytes)
    return exact / analytic if analytic else 1.0
