"""Parsing a checkpoint's ``quantization_config`` formats that need more than a few fields.

Imports only the standard library and :mod:`memest.spec`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memest.spec import QuantizationSpec


def compressed_tensors_spec(q: Mapping[str, Any]) -> QuantizationSpec:
    """A ``quant_method: compressed-tensors`` config as a QuantizationSpec (the first config group's
    weight scheme; ``ignore`` lists the unquantized modules).

    Source of the field names: compressed-tensors ``QuantizationConfig`` / ``QuantizationArgs``
    (``config_groups.*.weights``: ``num_bits``, ``type``, ``strategy``, ``group_size``,
    ``block_structure``, ``symmetric``).
    """
    groups = q.get("config_groups") or {}
    weights: Mapping[str, Any] = {}
    for group in groups.values():
        if isinstance(group, Mapping) and isinstance(group.get("weights"), Mapping):
            weights = group["weights"]
            break
    block = weights.get("block_structure")
    return QuantizationSpec(
        method="compressed-tensors",
        bits=int(weights.get("num_bits", 8)),
        group_size=int(weights["group_size"]) if weights.get("group_size") else None,
        block_shape=(int(block[0]), int(block[1])) if isinstance(block, list | tuple) and len(block) == 2 else None,
        skip_modules=tuple(str(m).removeprefix("re:") for m in q.get("ignore") or ()),
        strategy=str(weights.get("strategy") or "channel"),
    )
