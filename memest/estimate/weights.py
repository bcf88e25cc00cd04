"""Bytes of weights as stored on one rank: plain dtypes and quantized formats.

Quantization converts the linear weights of the layers (``TensorSpec.is_linear_weight``);
embeddings, lm_head, norms, biases and routers keep the 16-bit dtype, as bitsandbytes, GPTQ,
AWQ and vLLM's fp8 leave them. Per-format layouts (bytes per weight + scales):

| scheme | layout | source |
|---|---|---|
| ``int8`` | int8 weight + fp32 scale per output row | bitsandbytes ``Int8Params`` (CB, SCB) |
| ``nf4`` | 4-bit weight + fp32 absmax per 64 weights; with double quantization an 8-bit absmax per 64 plus an fp32 scale per 256 absmaxes | bitsandbytes ``Params4bit`` / QLoRA paper §2 |
| ``gptq`` | int32-packed 4-bit weight; per group of g=128 inputs an fp16 scale and a packed 4-bit zero per output; int32 ``g_idx`` per input | AutoGPTQ / transformers ``QuantLinear`` |
| ``awq`` / ``int4`` | as gptq without ``g_idx`` | AutoAWQ ``WQLinear_GEMM`` |
| ``fp8`` | fp8 weight + fp32 scale per tensor (vLLM online), or per 128x128 block (DeepSeek-V3) | vLLM ``Fp8LinearMethod`` |
| ``mxfp4`` | 4-bit weight + 8-bit shared exponent per 32 weights | OCP MX spec; gpt-oss |
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from memest.errors import InputError
from memest.spec import ModelSpec, QuantizationSpec, TensorSpec
from memest.workload import Parallelism
from memest.estimate.sharding import shard_numel


@dataclass(frozen=True, slots=True)
class QuantScheme:
    """How one quantized weight format stores a linear weight.

    Attributes:
        name: ``int8``, ``nf4``, ``gptq``, ``awq``, ``fp8``, ``mxfp4``.
        bits: Bits per weight.
        group_size: Input features sharing a scale (None: per output row or per tensor).
        double_quant: bitsandbytes nested quantization of the absmax scales.
        block_shape: fp8 block-wise scales (rows, cols).
    """

    name: str
    bits: int
    group_size: int | None = None
    double_quant: bool = False
    block_shape: tuple[int, int] | None = None

    def tensor_bytes(self, shape: tuple[int, ...]) -> int:
        """Bytes of one weight of this shape (``(out, in)`` or ``(experts, out, in)``), scales included."""
        numel = math.prod(shape)
        out_features, in_features = shape[-2], shape[-1]
        rows = numel // in_features  # output rows, all experts together
        data = math.ceil(numel * self.bits / 8)
        if self.name == "int8":
            return data + 4 * rows
        if self.name == "nf4":
            blocks = math.ceil(numel / (self.group_size or 64))
            if self.double_quant:
                return data + blocks + 4 * math.ceil(blocks / 256)
            return data + 4 * blocks
        if self.name in ("gptq", "awq"):
            groups = math.ceil(in_features / (self.group_size or 128))
            per_group = rows * groups * (2 + 0.5)
            g_idx = 4 * in_features * (numel // (out_features * in_features)) if self.name == "gptq" else 0
            return data + math.ceil(per_group) + g_idx
        if self.name == "fp8":
            if self.block_shape:
                br, bc = self.block_shape
                blocks = (numel // (out_features * in_features)) * math.ceil(out_features / br) * math.ceil(in_features / bc)
                return data + 4 * blocks
            return data + 4 * (numel // (out_features * in_features))
        if self.name == "mxfp4":
            return data + math.ceil(numel / (self.group_size or 32))
        raise InputError(f"unknown quantization scheme {self.name!r}")


SCHEMES: dict[str, QuantScheme] = {
    "int8": QuantScheme("int8", 8),
    "nf4": QuantScheme("nf4", 4, group_size=64, double_quant=True),
    "int4": QuantScheme("awq", 4, group_size=128),
    "awq": QuantScheme("awq", 4, group_size=128),
    "gptq": QuantScheme("gptq", 4, group_size=128),
    "fp8": QuantScheme("fp8", 8),
}
"""The ``--quantization`` choices. ``int4`` means AWQ-style 4-bit with groups of 128, the format
vLLM serves most 4-bit checkpoints in; ``nf4`` is bitsandbytes with double quantization (QLoRA's
default)."""


def scheme_of(q: QuantizationSpec) -> QuantScheme:
    """The storage scheme of a checkpoint's quantization_config.

    Raises:
        InputError: a quant_method memest does not model.
    """
    if q.method == "bitsandbytes":
        return QuantScheme("nf4", 4, group_size=q.group_size or 64, double_quant=q.double_quant) if q.bits == 4 else SCHEMES["int8"]
    if q.method in ("gptq", "awq"):
        return QuantScheme(q.method, q.bits, group_size=q.group_size)
    if q.method == "fp8":
        return QuantScheme("fp8", 8, block_shape=q.block_shape)
    if q.method == "mxfp4":
        return QuantScheme("mxfp4", 4, group_size=q.group_size or 32)
    raise InputError(
        f"quantization method {q.method!r} in the config is not modelled; pass --quantization to choose one "
        f"({', '.join(sorted(SCHEMES))})"
    )


def _skipped(tensor: TensorSpec, skip: tuple[str, ...]) -> bool:
    module = tensor.module
    for pattern in skip:
        p = pattern.replace("model.layers.*.", "").replace("model.", "")
        if p and (module == p or module.startswith(p + ".") or module.endswith("." + p) or p in module.split(".")):
            return True
    return False


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
        local = shard_numel(t, par, num_kv_heads)
        if scheme is not None and t.is_linear_weight and not _skipped(t, skip):
            ratio = local / t.numel
            shape = (*t.shape[:-2], max(1, round(t.shape[-2] * ratio)), t.shape[-1]) if ratio < 1 else t.shape
            total += scheme.tensor_bytes(shape) * count
        else:
            total += local * dtype_bytes * count
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
