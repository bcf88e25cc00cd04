"""Parsing a checkpoint's ``quantization_config`` formats that need more than a few fields.

Imports only the standard library, :mod:`memest.spec` and :mod:`memest.sources.config`. The field checks
(bits, group size, block shape, module lists) are shared by every method's parser.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memest.errors import ConfigError
from memest.sources.config import checked_int
from memest.spec import QuantizationSpec


def compressed_tensors_spec(q: Mapping[str, Any], what: str = "quantization_config") -> QuantizationSpec:
    """A ``quant_method: compressed-tensors`` config as a QuantizationSpec (the first config group's
    weight scheme; ``ignore`` lists the unquantized modules).

    Source of the field names: compressed-tensors ``QuantizationConfig`` / ``QuantizationArgs``
    (``config_groups.*.weights``: ``num_bits``, ``type``, ``strategy``, ``group_size``,
    ``block_structure``, ``symmetric``).

    Raises:
        ConfigError: ``config_groups`` is not an object of groups, or a weight field is malformed.
    """
    groups = q.get("config_groups") or {}
    if not isinstance(groups, Mapping):
        raise ConfigError(f"{what}.config_groups is a JSON {type(groups).__name__}; it must be an object of named "
                          "groups (e.g. {\"group_0\": {\"weights\": {...}}})")
    weights: Mapping[str, Any] = {}
    for group in groups.values():
        if isinstance(group, Mapping) and isinstance(group.get("weights"), Mapping):
            weights = group["weights"]
            break
    where = f"{what}.config_groups.*.weights"
    block = weights.get("block_structure")
    size = group_size(weights.get("group_size"), f"{where}.group_size")
    return QuantizationSpec(
        method="compressed-tensors",
        bits=quant_bits(weights.get("num_bits", 8), f"{where}.num_bits"),
        group_size=size if size and size > 0 else None,
        block_shape=block_shape(block, f"{where}.block_structure") if block is not None else None,
        skip_modules=tuple(m.removeprefix("re:") for m in module_list(q.get("ignore"), f"{what}.ignore")),
        strategy=str(weights.get("strategy") or "channel"),
    )


MODELOPT_ALGOS: dict[str, tuple[int, str, int | None]] = {
    "FP8": (8, "tensor", None),
    "FP8_PER_CHANNEL_PER_TOKEN": (8, "channel", None),
    "NVFP4": (4, "group", 16),
    "W4A16_NVFP4": (4, "group", 16),
}
"""NVIDIA ModelOpt ``quant_algo`` values memest sizes: (bits, scale granularity, group). Source: vLLM
``vllm/model_executor/layers/quantization/modelopt.py`` (vllm-project/vllm commit 00155cde): ``QUANT_ALGOS``;
``FP8`` is a per-tensor weight scale, ``FP8_PER_CHANNEL_PER_TOKEN`` per output channel, NVFP4 4-bit floats
with one fp8 scale per 16 (``group_size``, default 16). Others (``FP8_PB_WO``, ``MXFP8``,
``MIXED_PRECISION``: a per-module map) are kept as their name and not sized."""


def modelopt_spec(q: Mapping[str, Any], what: str = "quantization_config") -> QuantizationSpec:
    """A ``quant_method: modelopt`` config as a QuantizationSpec, in either of the two layouts vLLM's
    ``ModelOptQuantConfigBase.from_config`` reads: ``hf_quant_config.json``'s ``{"quantization": {"quant_algo",
    "kv_cache_quant_algo", "group_size", "exclude_modules"}}``, or config.json's flat ``quant_algo`` with the
    unquantized modules under ``ignore``. The modules listed stay in the checkpoint dtype.

    Raises:
        ConfigError: no ``quant_algo``, or a malformed group size or module list.
    """
    nested = q.get("quantization")
    body: Mapping[str, Any] = nested if isinstance(nested, Mapping) else q
    where = f"{what}.quantization" if body is not q else what
    algo = str(body.get("quant_algo") or "").upper()
    if not algo:
        raise ConfigError(f"{where} names no quant_algo; a ModelOpt checkpoint states one (FP8, NVFP4, ...)")
    skip_key = "exclude_modules" if body is not q else "ignore"
    skip = module_list(body.get(skip_key), f"{where}.{skip_key}")
    bits, strategy, group = MODELOPT_ALGOS.get(algo, (8, algo.lower(), None))
    given = group_size(body.get("group_size"), f"{where}.group_size")
    return QuantizationSpec(method="modelopt", bits=bits, group_size=given if group and given else group,
                            skip_modules=skip, strategy=strategy)


def quant_bits(value: Any, what: str) -> int:
    """Bits per quantized weight: an integer in 1..16.

    Raises:
        ConfigError: anything else (``"four"``, null, -4, 0).
    """
    return checked_int(value, what, minimum=1, maximum=16)


def group_size(value: Any, what: str) -> int | None:
    """A quantization group size: a positive integer, or -1 / null for one scale per output channel.

    Raises:
        ConfigError: 0, another negative number, or not an integer.
    """
    if value is None:
        return None
    if value == -1 and not isinstance(value, bool):
        return -1
    return checked_int(value, f"{what} (or -1 for per-channel scales)")


def block_shape(value: Any, what: str) -> tuple[int, int] | None:
    """A block-wise scale's block: two positive integers (``[128, 128]``), or null.

    Raises:
        ConfigError: anything else (``[128]``, ``128``, ``[0, 0]``).
    """
    if value is None:
        return None
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise ConfigError(f"{what} is {value!r}; it must be two positive integers, e.g. [128, 128], or null")
    return checked_int(value[0], f"{what}[0]"), checked_int(value[1], f"{what}[1]")


def module_list(value: Any, what: str) -> tuple[str, ...]:
    """Module name patterns (``modules_to_not_convert``, ``ignore``): a list of strings, or null.

    Raises:
        ConfigError: not a list of strings.
    """
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(isinstance(m, str) for m in value):
        raise ConfigError(f"{what} is {value!r}; it must be a list of module names (e.g. [\"lm_head\"]) or null")
    return tuple(value)
