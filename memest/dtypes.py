"""Bytes per element of the dtypes memest knows, and the names users write for them."""

from __future__ import annotations

from memest.errors import InputError

_BYTES: dict[str, float] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8": 1,
    "int8": 1,
    "int4": 0.5,
}

_ALIASES = {
    "fp32": "float32",
    "float": "float32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp8": "float8",
    "fp8_e4m3": "float8",
    "fp8_e5m2": "float8",
    "float8_e4m3fn": "float8",
    "e4m3": "float8",
}


KNOWN = ("float32", "float16", "bfloat16", "float8", "int8", "int4")
"""The canonical names, as a config states a dtype."""


def canonical(dtype: str) -> str:
    """The canonical name of a dtype (``bf16`` -> ``bfloat16``, ``torch.float16`` -> ``float16``).

    Raises:
        InputError: the name is not a dtype memest knows.
    """
    name = dtype.strip().lower().removeprefix("torch.")
    name = _ALIASES.get(name, name)
    if name not in _BYTES:
        raise InputError(f"unknown dtype {dtype!r}; use one of fp32, fp16, bf16, fp8, int8, int4")
    return name


def nbytes(dtype: str) -> float:
    """Bytes per element (0.5 for int4).

    Raises:
        InputError: unknown dtype.
    """
    return _BYTES[canonical(dtype)]
