"""What a setup costs: money per hour, then communication, then disruption — as data.

:class:`Cost` orders the setups that fit (usd_per_hour, communication, disruption, changes);
:class:`PriceTable` prices devices from the catalog and the user's prices
(:func:`parse_cost_flags`, :func:`read_cost_file`); :data:`PER_DOUBLING` and :data:`PENALTIES`
hold the weights. The order, the weights and why each is what it is: DESIGN.md, "Costs".
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from memest.devices import DEVICES, Device, get_device
from memest.errors import InputError


class Cost(NamedTuple):
    """A setup's cost; tuples compare in field order (see the module docstring).

    Attributes:
        usd_per_hour: Devices x price per device-hour.
        communication: Sum of communication penalties.
        disruption: Sum of disruption penalties.
        changes: Settings that differ from the plain default.
    """

    usd_per_hour: float
    communication: float
    disruption: float
    changes: int


@dataclass(frozen=True, slots=True)
class Penalty:
    """What one setting costs besides money.

    Attributes:
        communication: Communication units (see the module table).
        disruption: Disruption units.
        lossless: False when it changes the model's numerics or the training method.
        why: One line for the table and the JSON.
    """

    communication: float = 0.0
    disruption: float = 0.0
    lossless: bool = True
    why: str = ""


NO_PENALTY = Penalty()

PER_DOUBLING: dict[str, Penalty] = {
    "tp": Penalty(communication=1, why="tensor parallel: activations all-reduced per layer within a node"),
    "pp": Penalty(communication=2, why="pipeline parallel: bubble and point-to-point across nodes"),
    "ep": Penalty(communication=1, why="expert parallel: all-to-all per MoE layer"),
    "micro_batch": Penalty(disruption=1, why="smaller micro-batch, more accumulation steps"),
}
"""Penalties paid once per doubling of a degree (log2 of it), or per halving of the micro-batch."""

PENALTIES: dict[str, dict[Any, Penalty]] = {
    "zero_stage": {
        1: Penalty(why="ZeRO-1: optimizer states sharded"),
        2: Penalty(why="ZeRO-2: + gradients sharded"),
        3: Penalty(communication=1, why="ZeRO-3 / FSDP: + parameters sharded, re-gathered every step"),
    },
    "sequence_parallel": {True: Penalty(why="sequence parallel: norms and dropout split over tp")},
    "recompute": {
        "selective": Penalty(disruption=1, why="selective recompute of the attention core"),
        "full": Penalty(disruption=4, why="full recompute: one extra forward per step"),
    },
    "optimizer": {"adamw8bit": Penalty(disruption=3, lossless=False, why="8-bit AdamW states")},
    "loss": {
        "chunked": Penalty(disruption=1, why="chunked cross-entropy: one chunk's logits upcast at a time"),
        "fused": Penalty(disruption=1, why="fused linear cross-entropy (Liger): the logits never materialized"),
    },
    "offload": {
        "optimizer": Penalty(disruption=6, why="optimizer states and step on the CPU"),
        "params": Penalty(disruption=10, why="parameters and optimizer on the CPU"),
    },
    "method": {
        "lora": Penalty(disruption=20, lossless=False, why="LoRA adapters instead of a full fine-tune"),
        "qlora": Penalty(disruption=30, lossless=False, why="QLoRA: adapters on an NF4 base"),
    },
    "kv_cache_dtype": {"fp8": Penalty(disruption=2, lossless=False, why="fp8 KV cache")},
    "quantization": {
        "fp8": Penalty(disruption=3, lossless=False, why="fp8 weights"),
        "int8": Penalty(disruption=5, lossless=False, why="int8 weights"),
        "int4": Penalty(disruption=8, lossless=False, why="4-bit weights"),
        # GGUF file types (llama.cpp / Ollama), in the order of the perplexity increase llama-quantize lists
        # for them at Llama-3-8B (tools/quantize/quantize.cpp QUANT_OPTIONS: Q8_0 +0.0026, Q6_K +0.0217,
        # Q5_K_M +0.0569, Q4_K_M +0.1754, IQ4_XS 4.25 bpw, Q3_K_M +0.6569, Q2_K +3.5199), the 8-bit and
        # 4-bit types at int8's and int4's weights
        "q8_0": Penalty(disruption=5, lossless=False, why="Q8_0 GGUF weights"),
        "q6_k": Penalty(disruption=6, lossless=False, why="Q6_K GGUF weights"),
        "q5_k_m": Penalty(disruption=7, lossless=False, why="Q5_K_M GGUF weights"),
        "q4_k_m": Penalty(disruption=8, lossless=False, why="Q4_K_M GGUF weights"),
        "iq4_xs": Penalty(disruption=9, lossless=False, why="IQ4_XS GGUF weights"),
        "q3_k_m": Penalty(disruption=12, lossless=False, why="Q3_K_M GGUF weights"),
        "q2_k": Penalty(disruption=16, lossless=False, why="Q2_K GGUF weights"),
    },
}
"""Penalties of a setting's value, by setting name and value; values not listed cost nothing."""

LAYERS_IN_HOST_RAM = Penalty(disruption=10, why="llama.cpp / Ollama layers left in host RAM run on the CPU: "
                                                "lossless, slower")
"""A llama.cpp / Ollama job with fewer layers on its GPUs than it has (``n_gpu_layers``): the weights that
leave the device, as the training offload of the parameters (``PENALTIES["offload"]["params"]``)."""


def penalty(setting: str, value: Any) -> Penalty:
    """The penalty of one setting's value (:data:`NO_PENALTY` for unlisted values).

    Enum values are looked up by their ``.value`` (``Recompute.FULL`` as ``"full"``).
    """
    key = getattr(value, "value", value)
    return PENALTIES.get(setting, {}).get(key, NO_PENALTY)


def doubling_penalty(setting: str, factor: int) -> tuple[float, float]:
    """(communication, disruption) of ``factor`` = a degree, or the micro-batch reduction ratio.

    Each doubling pays :data:`PER_DOUBLING`; a factor that is not a power of two pays log2 of it.
    """
    if factor <= 1:
        return 0.0, 0.0
    p = PER_DOUBLING[setting]
    n = math.log2(factor)
    return p.communication * n, p.disruption * n


@dataclass(frozen=True, slots=True)
class PriceTable:
    """Price per device-hour in USD, by canonical device name.

    Attributes:
        usd_per_hour: Name -> price. Built from the catalog, then the user's overrides.
    """

    usd_per_hour: Mapping[str, float]

    def price(self, device: Device) -> float:
        """USD per hour of one ``device``: ``math.inf`` when it has none (see the module docstring)."""
        usd = self.usd_per_hour.get(device.name, device.hourly_usd)
        return math.inf if usd is None else usd

    @classmethod
    def catalog(cls) -> PriceTable:
        """The catalog's typical on-demand prices (``Device.hourly_usd``; unpriced devices left out)."""
        return cls({d.name: d.hourly_usd for d in DEVICES if d.hourly_usd is not None})

    def with_overrides(self, overrides: Mapping[str, float], custom: Iterable[Device] = ()) -> PriceTable:
        """A copy with some prices replaced; names may be any alias, or the label of one of the
        ``custom`` devices (``my-card`` for ``my-card:24GB``).

        Raises:
            UnknownDeviceError: a name is neither in the catalog, nor a custom device's label, nor a custom size.
            InputError: a price is negative or not finite.
        """
        table = dict(self.usd_per_hour)
        for name, usd in overrides.items():
            if not math.isfinite(usd) or usd < 0:
                raise InputError(f"price {usd!r} for {name!r} must be a non-negative number of USD per device-hour")
            table[get_device(name, custom).name] = float(usd)
        return PriceTable(table)


def parse_cost_flags(values: Iterable[str]) -> dict[str, float]:
    """``--cost NAME=USD`` values as a name -> price mapping.

    Raises:
        InputError: a value is not ``NAME=USD`` with a number after the ``=``.
    """
    out: dict[str, float] = {}
    for item in values:
        name, sep, usd = item.partition("=")
        if not sep or not name.strip():
            raise InputError(f"{{cost}} {item!r} must be NAME=USD, e.g. {{cost}} H100=2.49", field="cost")
        try:
            out[name.strip()] = float(usd)
        except ValueError:
            raise InputError(f"{{cost}} {item!r}: {usd!r} is not a number of USD per device-hour",
                             field="cost") from None
    return out


MAX_COST_FILE_BYTES = 2**20
"""Largest ``--costs`` file read (1 MiB holds prices for every device many times over)."""


def read_cost_file(path: str | Path) -> dict[str, float]:
    """A ``--costs FILE``: a JSON object of device name -> USD per device-hour.

    Raises:
        InputError: the file is missing, not JSON, or not an object of numbers.
    """
    p = Path(path).expanduser()
    example = 'pass a JSON object like {"H100": 2.49}'
    if p.exists() and not p.is_file():
        raise InputError(f"{{costs}} {str(path)!r} is {'a directory' if p.is_dir() else 'not a regular file'}; {example}",
                         field="costs")
    try:
        with p.open("rb") as fh:
            data = fh.read(MAX_COST_FILE_BYTES + 1)
        raw = json.loads(data.decode("utf-8"))
    except FileNotFoundError:
        raise InputError(f"{{costs}} {str(path)!r}: no such file; {example}", field="costs") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{{costs}} {str(path)!r} is not valid JSON ({exc.msg} at line {exc.lineno})",
                         field="costs") from None
    except UnicodeDecodeError:
        raise InputError(f"{{costs}} {str(path)!r} is not UTF-8 text (a binary file?); {example}",
                         field="costs") from None
    except (OSError, RecursionError, ValueError) as exc:
        raise InputError(f"{{costs}} {str(path)!r} cannot be read ({type(exc).__name__}); {example}",
                         field="costs") from None
    if not isinstance(raw, dict) or not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                                            and v >= 0 for v in raw.values()):
        raise InputError(f"{{costs}} {str(path)!r} must hold a JSON object of device name -> USD per hour, e.g. {{\"H100\": 2.49}}",
                         field="costs")
    return {str(k): float(v) for k, v in raw.items()}
