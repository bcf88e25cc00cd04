"""The accelerator catalog: memory capacity per device, in bytes.

``memory_bytes`` is the memory a program can use on one device: what CUDA reports as total
(``torch.cuda.mem_get_info()[1]``, the "total capacity" of PyTorch's out-of-memory message) where a
published reading exists (``measured=True``, the source says where), else the vendor's nominal
capacity (``measured=False``; the usable total is typically 0.5-2% lower; NVIDIA and AMD "80GB"-style labels are close to GiB:
nvidia-smi shows 81559 MiB on an "H100 80GB"). A device here is what
one process sees: one GCD of an MI250X, one chip of a TPU.

Names are written as vendors write them; lookup ignores case, spaces, dashes and underscores, and
accepts aliases (``h100``, ``H100-SXM``, ``v5e``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memest.errors import UnknownDeviceError

GiB = 1 << 30
"""The one binary gigabyte of memest: the library uses it to write constants as fractions of a GiB
(``round(0.51 * GiB)``); :mod:`memest.report` alone turns bytes into GiB for people."""
MiB = 1 << 20
GB = 10**9
"""A decimal gigabyte, for device names ("80GB")."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """One accelerator model.

    Attributes:
        name: Canonical name (``H100-80GB``).
        memory_bytes: Usable memory per device in bytes (see the module docstring).
        vendor: ``nvidia``, ``amd``, ``intel``, ``google``.
        kind: ``gpu`` or ``tpu``.
        arch: Architecture family; selects runtime constants (CUDA context, cuBLAS workspace).
        bf16: Whether the device computes in bfloat16 natively.
        fp8: Whether it has fp8 tensor cores (weights / KV cache in fp8 run natively).
        per_node: Devices in one server (NVLink / ICI domain) — tensor parallelism stays inside it.
        hourly_usd: A typical on-demand cloud price per device-hour, for ranking setups; override
            it in ``memest plan``.
        measured: True when memory_bytes is a published reading of the usable total.
        source: Where memory_bytes comes from.
        aliases: Other names users write.
    """

    name: str
    memory_bytes: int
    vendor: str
    kind: str = "gpu"
    arch: str
    bf16: bool = True
    fp8: bool = False
    per_node: int = 8
    hourly_usd: float
    measured: bool = False
    source: str = "vendor datasheet (nominal)"
    aliases: tuple[str, ...] = ()


DEVICES: tuple[Device, ...] = (
    Device(name="A100-40GB", memory_bytes=round(39.50 * GiB), vendor="nvidia", arch="ampere", hourly_usd=1.3,
           measured=True, source="PyTorch OOM message 'total capacity of 39.50 GiB' (github TianheWu/CoSeR#10)",
           aliases=("A100-SXM4-40GB", "A100-PCIE-40GB", "A100 40GB")),
    Device(name="A100-80GB", memory_bytes=round(79.14 * GiB), vendor="nvidia", arch="ampere", hourly_usd=1.8,
           measured=True, source="PyTorch OOM message 'total capacity of 79.14 GiB' (github lianqi1008/Control-GIC#6)",
           aliases=("A100", "A100-SXM4-80GB", "A100-PCIE-80GB", "A100 80GB", "A800", "A800-80GB")),
    Device(name="H100-80GB", memory_bytes=round(79.19 * GiB), vendor="nvidia", arch="hopper", fp8=True, hourly_usd=3.0,
           measured=True, source="vLLM 0.19 start-up log 'total_gpu_memory 79.19 GiB' (validation case vllm019_llama31_8b_tp1)",
           aliases=("H100", "H100-SXM", "H100-SXM5-80GB", "H100 80GB HBM3", "H100-PCIE", "H800")),
    Device(name="H100-96GB", memory_bytes=95 * GiB, vendor="nvidia", arch="hopper", fp8=True, hourly_usd=3.2,
           measured=True, source="torchtitan benchmark 'H100 SXM 96GB HBM2e (95 GiB)' (validation case torchtitan_llama31_8b_fsdp8_h100)",
           aliases=("H100-SXM-96GB",)),
    Device(name="H100-NVL-94GB", memory_bytes=94 * GiB, vendor="nvidia", arch="hopper", fp8=True, hourly_usd=3.0,
           aliases=("H100-NVL", "H100 NVL")),
    Device(name="H200-141GB", memory_bytes=round(139.81 * GiB), vendor="nvidia", arch="hopper", fp8=True, hourly_usd=3.8,
           measured=True, source="PyTorch OOM message 'a total capacity of 139.81 GiB' on H200 (torch total_memory)",
           aliases=("H200", "H200-SXM", "H200-NVL", "GH200")),
    Device(name="B200", memory_bytes=180 * GiB, vendor="nvidia", arch="blackwell", fp8=True, hourly_usd=6.0,
           source="NVIDIA HGX B200 datasheet: 180 GB per GPU", aliases=("B200-180GB", "HGX-B200", "DGX-B200")),
    Device(name="GB200", memory_bytes=186 * GiB, vendor="nvidia", arch="blackwell", fp8=True, per_node=72, hourly_usd=7.0,
           source="NVIDIA GB200 NVL72 datasheet: 13.4 TB HBM3e over 72 GPUs", aliases=("GB200-NVL72", "B200-NVL72")),
    Device(name="L4", memory_bytes=23034 * MiB, vendor="nvidia", arch="ada", fp8=True, hourly_usd=0.8,
           source="nvidia-smi total 23,034 MiB (github modal-labs/modal-client#2797); the CUDA total is a few hundred MiB lower",
           aliases=("L4-24GB",)),
    Device(name="L40S", memory_bytes=round(44.42 * GiB), vendor="nvidia", arch="ada", fp8=True, hourly_usd=1.5,
           measured=True, source="PyTorch OOM message 'total capacity of 44.42 GiB' on 8 x L40S (github stepfun-ai/Step-Video-T2V#8)",
           aliases=("L40S-48GB", "L40")),
    Device(name="A10G", memory_bytes=23028 * MiB, vendor="nvidia", arch="ampere", hourly_usd=1.0,
           source="nvidia-smi total 23,028 MiB (github modal-labs/modal-client#2797); the CUDA total is a few hundred MiB lower",
           aliases=("A10G-24GB", "A10", "A10-24GB")),
    Device(name="T4", memory_bytes=round(14.75 * GiB), vendor="nvidia", arch="turing", bf16=False, hourly_usd=0.4,
           measured=True, source="PyTorch OOM message 'total capacity of 14.75 GiB' (github hpcaitech/Open-Sora#697)",
           aliases=("T4-16GB", "Tesla-T4")),
    Device(name="V100-16GB", memory_bytes=16160 * MiB, vendor="nvidia", arch="volta", bf16=False, hourly_usd=0.9,
           measured=True, source="NVML total 16160 MiB, Tesla V100-SXM2 16GB (validation case hf_bert_large_vanilla_bs4)",
           aliases=("V100", "V100-SXM2-16GB", "Tesla-V100-SXM2-16GB")),
    Device(name="V100-32GB", memory_bytes=round(31.75 * GiB), vendor="nvidia", arch="volta", bf16=False, hourly_usd=1.2,
           measured=True, source="PyTorch OOM message '31.75 GiB total capacity' on V100-32GB (torch total_memory)",
           aliases=("V100-SXM2-32GB", "V100S")),
    Device(name="RTX-3090", memory_bytes=round(23.69 * GiB), vendor="nvidia", arch="ampere", per_node=1, hourly_usd=0.3,
           measured=True, source="PyTorch OOM message '23.69 GiB total capacity' on RTX 3090 (torch total_memory)",
           aliases=("3090", "RTX3090", "GeForce-RTX-3090")),
    Device(name="RTX-4090", memory_bytes=round(23.68 * GiB), vendor="nvidia", arch="ada", fp8=True, per_node=1, hourly_usd=0.5,
           measured=True, source="PyTorch OOM message '23.68 GiB total capacity' (github zai-org/CogVideo#36)",
           aliases=("4090", "RTX4090", "GeForce-RTX-4090")),
    Device(name="RTX-5090", memory_bytes=32 * GiB, vendor="nvidia", arch="blackwell", fp8=True, per_node=1, hourly_usd=0.8,
           aliases=("5090", "RTX5090", "GeForce-RTX-5090")),
    Device(name="MI250X", memory_bytes=64 * GiB, vendor="amd", arch="cdna2", hourly_usd=1.5,
           source="AMD datasheet: 128 GB HBM2e over two GCDs; one GCD (one device to ROCm) has 64 GB",
           aliases=("MI250X-GCD", "MI250")),
    Device(name="MI300X", memory_bytes=192 * GiB, vendor="amd", arch="cdna3", fp8=True, hourly_usd=3.0, aliases=("MI300X-192GB",)),
    Device(name="MI325X", memory_bytes=256 * GiB, vendor="amd", arch="cdna3", fp8=True, hourly_usd=4.0, aliases=("MI325X-256GB",)),
    Device(name="Gaudi2", memory_bytes=96 * GiB, vendor="intel", arch="gaudi", fp8=True, hourly_usd=1.5, aliases=("HL-225", "Gaudi-2")),
    Device(name="Gaudi3", memory_bytes=128 * GiB, vendor="intel", arch="gaudi", fp8=True, hourly_usd=2.5, aliases=("HL-325", "Gaudi-3")),
    Device(name="TPU-v4", memory_bytes=32 * GiB, vendor="google", kind="tpu", arch="tpu", per_node=4, hourly_usd=3.2,
           source="Google Cloud TPU v4 docs: 32 GiB HBM per chip", aliases=("v4", "TPUv4", "TPU v4")),
    Device(name="TPU-v5e", memory_bytes=16 * GiB, vendor="google", kind="tpu", arch="tpu", per_node=8, hourly_usd=1.2,
           source="Google Cloud TPU v5e docs: 16 GiB HBM per chip", aliases=("v5e", "v5litepod", "TPUv5e", "TPU v5e")),
    Device(name="TPU-v5p", memory_bytes=95 * GiB, vendor="google", kind="tpu", arch="tpu", per_node=4, hourly_usd=4.2,
           source="Google Cloud TPU v5p docs: 95 GiB HBM per chip", aliases=("v5p", "TPUv5p", "TPU v5p")),
    Device(name="TPU-v6e", memory_bytes=32 * GiB, vendor="google", kind="tpu", arch="tpu", per_node=8, hourly_usd=2.7,
           source="Google Cloud TPU v6e (Trillium) docs: 32 GiB HBM per chip", aliases=("v6e", "Trillium", "TPUv6e", "TPU v6e")),
)

DEFAULT_DEVICE = "H100-80GB"


def _key(name: str) -> str:
    key = re.sub(r"[\s_\-]+", "", name.strip().lower())
    return key.removeprefix("nvidia").removeprefix("amd").removeprefix("instinct").removeprefix("tesla")


_INDEX: dict[str, Device] = {}
for _d in DEVICES:
    for _n in (_d.name, *_d.aliases):
        _INDEX.setdefault(_key(_n), _d)


def get_device(name: str) -> Device:
    """The device a name refers to (case, spaces and dashes ignored).

    Raises:
        UnknownDeviceError: no device or alias matches; the message lists close names.
    """
    device = _INDEX.get(_key(name))
    if device is None:
        import difflib

        close = difflib.get_close_matches(_key(name), list(_INDEX), n=3, cutoff=0.5)
        names = sorted({_INDEX[c].name for c in close})
        hint = f"; did you mean {', '.join(repr(n) for n in names)}?" if names else ""
        raise UnknownDeviceError(f"unknown device {name!r}{hint} (list them with 'memest gpus')")
    return device
