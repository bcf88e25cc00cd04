"""ggml tensor types: elements per block and bytes per block.

From ``ggml/src/ggml.c`` ``type_traits`` (``blck_size``, ``type_size`` = ``sizeof(block_...)``) and
the block structs of ``ggml/src/ggml-common.h`` (llama.cpp b4715; unchanged since). A row of ``n``
elements of type ``t`` takes ``n / blck_size x type_size`` bytes (``ggml_row_size``); ``n`` must be a
multiple of the block size.
"""

from __future__ import annotations

from dataclasses import dataclass

from memest.errors import InputError


@dataclass(frozen=True, slots=True)
class GGMLType:
    """One ggml type.

    Attributes:
        name: ggml's name (``q4_K``), as ``ggml_type_name`` prints it.
        block: Elements per block (``blck_size``).
        block_bytes: Bytes per block (``type_size``).
        gguf_id: The ``ggml_type`` enum value stored in a GGUF tensor info.
    """

    name: str
    block: int
    block_bytes: int
    gguf_id: int

    @property
    def bytes_per_element(self) -> float:
        """block_bytes / block (Q8_0: 34 / 32 = 1.0625)."""
        return self.block_bytes / self.block

    @property
    def quantized(self) -> bool:
        """True for block-quantized types (``ggml_is_quantized``: block > 1)."""
        return self.block > 1

    def row_bytes(self, n: int) -> int:
        """Bytes of ``n`` elements (``ggml_row_size``).

        Raises:
            InputError: n is not a multiple of the block size.
        """
        if n % self.block:
            raise InputError(f"a row of {n} elements cannot be stored as {self.name} (blocks of {self.block})")
        return n // self.block * self.block_bytes


_TYPES = (
    # name, block, bytes, ggml_type id; struct layout in ggml-common.h
    GGMLType("f32", 1, 4, 0),
    GGMLType("f16", 1, 2, 1),
    GGMLType("q4_0", 32, 18, 2),      # half d + 16 B of nibbles
    GGMLType("q4_1", 32, 20, 3),      # half d, m + 16 B
    GGMLType("q5_0", 32, 22, 6),      # half d + 4 B high bits + 16 B
    GGMLType("q5_1", 32, 24, 7),      # half d, m + 4 + 16
    GGMLType("q8_0", 32, 34, 8),      # half d + 32 int8
    GGMLType("q8_1", 32, 36, 9),      # half d, s + 32 int8
    GGMLType("q2_K", 256, 84, 10),    # 16 B scales + 64 B quants + half d, dmin
    GGMLType("q3_K", 256, 110, 11),   # 32 B hmask + 64 B quants + 12 B scales + half d
    GGMLType("q4_K", 256, 144, 12),   # half d, dmin + 12 B scales + 128 B quants
    GGMLType("q5_K", 256, 176, 13),   # half d, dmin + 12 B scales + 32 B high bits + 128 B
    GGMLType("q6_K", 256, 210, 14),   # 128 B low + 64 B high + 16 B scales + half d
    GGMLType("q8_K", 256, 292, 15),   # float d + 256 int8 + 16 int16 sums
    GGMLType("iq2_xxs", 256, 66, 16),
    GGMLType("iq2_xs", 256, 74, 17),
    GGMLType("iq3_xxs", 256, 98, 18),
    GGMLType("iq1_s", 256, 50, 19),
    GGMLType("iq4_nl", 32, 18, 20),   # half d + 16 B
    GGMLType("iq3_s", 256, 110, 21),
    GGMLType("iq2_s", 256, 82, 22),
    GGMLType("iq4_xs", 256, 136, 23),  # half d + uint16 scales_h + 4 B scales_l + 128 B
    GGMLType("bf16", 1, 2, 30),
    GGMLType("tq1_0", 256, 54, 34),
    GGMLType("tq2_0", 256, 66, 35),
    GGMLType("iq1_m", 256, 56, 29),
)

TYPES: dict[str, GGMLType] = {t.name.lower(): t for t in _TYPES}
"""The ggml types by lower-case name."""
BY_ID: dict[int, GGMLType] = {t.gguf_id: t for t in _TYPES}
"""The ggml types by their ``ggml_type`` id."""


def ggml_type(name: str) -> GGMLType:
    """The type named ``name`` (any case).

    Raises:
        InputError: unknown name.
    """
    try:
        return TYPES[name.lower()]
    except KeyError:
        raise InputError(f"unknown ggml type {name!r}; known: {', '.join(t.name for t in _TYPES)}") from None


def tensor_bytes(t: GGMLType, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of ``shape`` (transformers order: rows last-but-one, row length last) at
    type ``t``: rows x ``row_bytes(row length)``."""
    rows = 1
    for n in shape[:-1]:
        rows *= n
    return rows * t.row_bytes(shape[-1])
