"""Parsing a checkpoint's ``quantization_config`` formats that need more than a few fields.

Imports only the standard library and :mod:`memest.spec`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memest.errors import ConfigError
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
    from memest.sources.families._build import block_shape, group_size, module_list, quant_bits

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
