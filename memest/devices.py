"""The accelerator catalog: memory capacity per device, in bytes, and custom sizes.

``memory_bytes`` is the memory a program can use on one device, and :attr:`Device.capacity_basis`
says where it comes from:

- ``measured``: what CUDA reports as total (``torch.cuda.mem_get_info()[1]``, the "total capacity" of
  PyTorch's out-of-memory message, an NVML or vLLM total) in a published reading; the source cites it;
- ``nominal``: the vendor's capacity (the usable total is typically 0.5-2% lower on HBM parts, ~7% on
  GDDR6 cards with ECC on; NVIDIA and AMD "80GB"-style labels are close to GiB: nvidia-smi shows
  81559 MiB on an "H100 80GB"), or a sibling card's reading where the memory is the same (H800, A800,
  L40: the source says so);
- ``working set``: Apple Silicon, whose GPU may use Metal's ``recommendedMaxWorkingSetSize`` of the
  unified RAM (:func:`metal_working_set_bytes`);
- ``user``: a custom size (:func:`custom_device`).

A device here is what one process sees: one GCD of an MI250X, one stack of a Max 1550, one chip of a
TPU (one core of a v3). Names are written as vendors write them; lookup ignores case, spaces, dashes and
underscores, and accepts aliases (``h100``, ``H100-SXM``, ``v5e``, ``m3-max-64gb``).

``hourly_usd`` is a typical on-demand cloud price per device-hour where a cloud rents the device; the
consumer cards' (RTX 2080 Ti to 5090, Arc) and the newest parts' (B300, GB300, H20, H800, A800, L40,
RTX PRO 6000, Trainium2 / Inferentia2 as their instance price / chips) are rough figures. Devices nobody
rents by the hour here (Apple, Jetson, MI210, MI300A, MI355X, TPU v7, Max 1550 / 1100) and custom sizes
have none (``None``): :class:`memest.planning.costs.PriceTable` ranks them after every priced device unless a
price is given.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from memest.errors import UnknownDeviceError

GiB = 1 << 30
"""The one binary gigabyte of memest: the library uses it to write constants as fractions of a GiB
(``round(0.51 * GiB)``); :mod:`memest.report` alone turns bytes into GiB for people."""
MiB = 1 << 20

CONSUMER_PER_MACHINE = 8
"""Consumer cards (RTX, Arc) in one machine: they have no NVLink (``per_node`` 1) but are sold and rented
in 2-, 4- and 8-GPU boxes (workstations; cloud 4x / 8x RTX 4090 nodes) whose GPUs share the host RAM."""
GB = 10**9
"""A decimal gigabyte, for device names ("80GB")."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """One accelerator model.

    Attributes:
        name: Canonical name (``H100-80GB``).
        memory_bytes: Usable memory per device in bytes (see the module docstring).
        vendor: ``nvidia``, ``amd``, ``intel``, ``google``, ``aws``, ``apple``, or ``custom``.
        kind: ``gpu``, ``tpu``, ``npu`` (AWS Neuron), or ``unified`` (memory shared with the CPU and OS:
            Apple Silicon, Jetson, MI300A).
        arch: Architecture family; selects runtime constants (CUDA context, cuBLAS workspace). An arch
            :mod:`memest.estimate.runtime` does not list (``custom``, ``cdna4``, ``neuron``, ``xe-*``) gets its
            generic defaults.
        bf16: Whether the device computes in bfloat16 natively.
        fp8: Whether it has fp8 tensor cores (weights / KV cache in fp8 run natively).
        per_node: Devices joined by NVLink / ICI in one server, the domain tensor parallelism stays inside
            (1 for consumer cards: PCIe only, so the planner gives each card its own layers, never a shard).
        per_machine: Devices one machine holds, sharing its host RAM (offloaded states are counted per
            machine, :attr:`devices_per_machine`); None: ``per_node``. Consumer cards run
            :data:`CONSUMER_PER_MACHINE` to a box (2/4/8-GPU workstations, cloud 4x / 8x RTX 4090 nodes).
        max_devices: The most devices one job can use, or None for no limit: 1 for an Apple Mac (one GPU
            per machine, its unified memory; llama.cpp's RPC backend across Macs is another program).
        hourly_usd: A typical on-demand cloud price per device-hour, for ranking setups; None when there
            is none (see the module docstring); override it in ``memest plan``.
        measured: True when memory_bytes is a published reading of the usable total.
        source: Where memory_bytes comes from.
        aliases: Other names users write.
        runtime_constants: The user's calibrated runtime constants, if applied.
        runtime_source: Where they come from.
    """

    name: str
    memory_bytes: int
    vendor: str
    kind: str = "gpu"
    arch: str
    bf16: bool = True
    fp8: bool = False
    per_node: int = 8
    per_machine: int | None = None
    max_devices: int | None = None
    hourly_usd: float | None = None
    measured: bool = False
    source: str = "vendor datasheet (nominal)"
    aliases: tuple[str, ...] = ()
    runtime_constants: tuple[tuple[str, int | float], ...] = ()
    """Runtime constants measured by the user's own calibration records (``use_calibration``), by the names of
    :mod:`memest.estimate.runtime` (``cuda_context_bytes``, ``allocator_slack``): they replace its values."""
    runtime_source: str = ""
    """Where :attr:`runtime_constants` come from (the records folder and how many records), for the assumptions."""

    @property
    def devices_per_machine(self) -> int:
        """Devices that share one machine's host RAM (:attr:`per_machine`, else :attr:`per_node`)."""
        return self.per_machine if self.per_machine is not None else self.per_node

    @property
    def capacity_basis(self) -> str:
        """Where ``memory_bytes`` comes from: ``measured``, ``nominal``, ``working set`` (Apple's Metal
        limit) or ``user`` (a custom size)."""
        if self.vendor == CUSTOM:
            return "user"
        if self.vendor == "apple":
            return "working set"
        return "measured" if self.measured else "nominal"

    @property
    def compute_capability(self) -> int | None:
        """The CUDA compute capability of an NVIDIA device's architecture, as ``major * 10 + minor`` (the
        lowest of the arch: ``ampere`` 80, although an A10G or RTX 3090 is 86), or None off NVIDIA.
        Source: NVIDIA's CUDA GPUs table (developer.nvidia.com/cuda-gpus): Volta 7.0, Turing 7.5, Ampere
        8.0 / 8.6, Ada 8.9, Hopper 9.0, Blackwell 10.0 / 12.0."""
        return COMPUTE_CAPABILITY.get(self.arch) if self.vendor == "nvidia" else None

    @property
    def ref(self) -> str:
        """A name :func:`get_device` resolves back to this device: the canonical name, or a custom
        device's size as the user wrote it (``my-card:48GB``)."""
        return self.aliases[0] if self.vendor == CUSTOM and self.aliases else self.name


CUSTOM = "custom"

COMPUTE_CAPABILITY: dict[str, int] = {"volta": 70, "turing": 75, "ampere": 80, "ada": 89, "hopper": 90,
                                      "blackwell": 100}
"""The lowest CUDA compute capability of each NVIDIA arch (:attr:`Device.compute_capability`)."""
"""Vendor and arch of a device given by its size."""

_LISTED: tuple[Device, ...] = (
    Device(name="A100-40GB", memory_bytes=round(39.50 * GiB), vendor="nvidia", arch="ampere", hourly_usd=1.3,
           measured=True, source="PyTorch OOM message 'total capacity of 39.50 GiB' (github TianheWu/CoSeR#10)",
           aliases=("A100-SXM4-40GB", "A100-PCIE-40GB", "A100 40GB")),
    Device(name="A100-80GB", memory_bytes=round(79.14 * GiB), vendor="nvidia", arch="ampere", hourly_usd=1.8,
           measured=True, source="PyTorch OOM message 'total capacity of 79.14 GiB' (github lianqi1008/Control-GIC#6)",
           aliases=("A100", "A100-SXM4-80GB", "A100-PCIE-80GB", "A100 80GB")),
    Device(name="H100-80GB", memory_bytes=round(79.19 * GiB), vendor="nvidia", arch="hopper", fp8=True, hourly_usd=3.0,
           measured=True, source="vLLM 0.19 start-up log 'total_gpu_memory 79.19 GiB' (validation case vllm019_llama31_8b_tp1)",
           aliases=("H100", "H100-SXM", "H100-SXM5-80GB", "H100 80GB HBM3", "H100-PCIE")),
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
           aliases=("L40S-48GB",)),
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
    Device(name="RTX-3090", memory_bytes=round(23.69 * GiB), vendor="nvidia", arch="ampere", per_node=1, per_machine=CONSUMER_PER_MACHINE, hourly_usd=0.3,
           measured=True, source="PyTorch OOM message '23.69 GiB total capacity' on RTX 3090 (torch total_memory)",
           aliases=("3090", "RTX3090", "GeForce-RTX-3090")),
    Device(name="RTX-4090", memory_bytes=round(23.68 * GiB), vendor="nvidia", arch="ada", fp8=True, per_node=1, per_machine=CONSUMER_PER_MACHINE, hourly_usd=0.5,
           measured=True, source="PyTorch OOM message '23.68 GiB total capacity' (github zai-org/CogVideo#36)",
           aliases=("4090", "RTX4090", "GeForce-RTX-4090")),
    Device(name="RTX-5090", memory_bytes=32 * GiB, vendor="nvidia", arch="blackwell", fp8=True, per_node=1, per_machine=CONSUMER_PER_MACHINE, hourly_usd=0.8,
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
    # -- added with issue 15: data-center and workstation cards ---------------------------------
    Device(name="A40", memory_bytes=46068 * MiB, vendor="nvidia", arch="ampere", hourly_usd=0.4, measured=True,
           source="nvidia-smi total 46068 MiB on an A40 (github chatdoc-com/OCRFlux#64); the CUDA total is lower (an L40S "
           "shows the same 46068 MiB and reads 44.42 GiB in PyTorch)",
           aliases=("A40-48GB",)),
    Device(name="RTX-A6000", memory_bytes=48 * GiB, vendor="nvidia", arch="ampere", hourly_usd=0.5,
           source="NVIDIA RTX A6000 datasheet: 48 GB GDDR6 (nominal)", aliases=("A6000", "RTXA6000", "RTX A6000 48GB")),
    Device(name="RTX-6000-Ada", memory_bytes=round(44.43 * GiB), vendor="nvidia", arch="ada", fp8=True, hourly_usd=0.8,
           measured=True, source="PyTorch OOM message 'total capacity of 44.43 GiB', nvidia-smi 46068 MiB, "
           "RTX 6000 Ada Generation (github DINGYANB/MTVCrafter#21)",
           aliases=("RTX6000Ada", "RTX-6000-Ada-Generation", "6000Ada")),
    Device(name="RTX-PRO-6000", memory_bytes=96 * GiB, vendor="nvidia", arch="blackwell", fp8=True, hourly_usd=1.8,
           source="NVIDIA RTX PRO 6000 Blackwell datasheet: 96 GB GDDR7 with ECC (nominal)",
           aliases=("RTX-PRO-6000-Blackwell", "RTX PRO 6000 Blackwell Workstation Edition",
                    "RTX PRO 6000 Blackwell Server Edition", "RTXPRO6000")),
    Device(name="L40", memory_bytes=round(44.42 * GiB), vendor="nvidia", arch="ada", fp8=True, hourly_usd=1.0,
           source="the L40S's reading (PyTorch total 44.42 GiB, github stepfun-ai/Step-Video-T2V#8): the L40 has the same "
           "48 GB GDDR6 with ECC; no L40 reading", aliases=("L40-48GB",)),
    Device(name="H20", memory_bytes=97871 * MiB, vendor="nvidia", arch="hopper", fp8=True, hourly_usd=1.5, measured=True,
           source="nvidia-smi total 97871 MiB on 8 x H20 (github NVIDIA/nvtrust#128); the CUDA total is ~0.5 GiB lower "
           "(an H100 shows 81559 MiB in nvidia-smi, 79.19 GiB in vLLM)", aliases=("H20-96GB",)),
    Device(name="H800", memory_bytes=round(79.19 * GiB), vendor="nvidia", arch="hopper", fp8=True, hourly_usd=2.0,
           source="the H100-80GB's reading (vLLM 0.19 'total_gpu_memory 79.19 GiB'): the H800 is an H100 SXM with the "
           "same 80 GB HBM3 and cut NVLink; no H800 reading", aliases=("H800-80GB", "H800-SXM", "H800 80GB HBM3")),
    Device(name="A800", memory_bytes=round(79.14 * GiB), vendor="nvidia", arch="ampere", hourly_usd=1.5,
           source="the A100-80GB's reading (PyTorch total 79.14 GiB, github lianqi1008/Control-GIC#6): the A800 is an "
           "A100 80GB with cut NVLink and shows the same 81920 MiB in nvidia-smi (github dexmal/dexbotic#41); no A800 "
           "reading of the CUDA total", aliases=("A800-80GB", "A800-SXM4-80GB", "A800 80GB")),
    Device(name="B300", memory_bytes=288 * GiB, vendor="nvidia", arch="blackwell", fp8=True, hourly_usd=7.0,
           source="NVIDIA HGX B300 datasheet: 2.3 TB HBM3e over 8 GPUs, 288 GB per GPU (nominal)",
           aliases=("B300-288GB", "HGX-B300", "DGX-B300", "B300-SXM")),
    Device(name="GB300", memory_bytes=288 * GiB, vendor="nvidia", arch="blackwell", fp8=True, per_node=72, hourly_usd=8.0,
           source="NVIDIA GB300 NVL72 datasheet: up to 20.7 TB HBM3e over 72 GPUs, 288 GB per GPU (nominal)",
           aliases=("GB300-NVL72", "B300-NVL72")),
    Device(name="MI210", memory_bytes=64 * GiB, vendor="amd", arch="cdna2",
           source="AMD Instinct MI210 datasheet: 64 GB HBM2e (nominal)", aliases=("MI210-64GB",)),
    Device(name="MI300A", memory_bytes=128 * GiB, vendor="amd", kind="unified", arch="cdna3", fp8=True, per_node=4,
           source="AMD Instinct MI300A datasheet: 128 GB HBM3 shared by its CPU and GPU (nominal; the host OS and "
           "CPU processes use part of it)", aliases=("MI300A-128GB",)),
    Device(name="MI355X", memory_bytes=288 * GiB, vendor="amd", arch="cdna4", fp8=True,
           source="AMD Instinct MI355X datasheet: 288 GB HBM3E (nominal)", aliases=("MI355X-288GB", "MI355")),
    # -- consumer cards (no NVLink: per_node 1; up to 8 a machine; prices are rough rental figures) ----
    Device(name="RTX-2080-Ti", memory_bytes=round(10.76 * GiB), vendor="nvidia", arch="turing", bf16=False, per_node=1, per_machine=CONSUMER_PER_MACHINE,
           hourly_usd=0.15, measured=True,
           source="PyTorch OOM message '10.76 GiB total capacity' on a 2080 Ti (github JDAI-CV/image-captioning#11)",
           aliases=("2080Ti", "RTX2080Ti", "GeForce-RTX-2080-Ti")),
    Device(name="RTX-3060", memory_bytes=round(11.76 * GiB), vendor="nvidia", arch="ampere", per_node=1, per_machine=CONSUMER_PER_MACHINE, hourly_usd=0.1,
           measured=True, source="PyTorch OOM message '11.76 GiB total capacity' on an RTX 3060 12GB "
           "(github TencentARC/PhotoMaker#47)", aliases=("3060", "RTX3060", "RTX-3060-12GB", "GeForce-RTX-3060")),
    Device(name="RTX-3080", memory_bytes=10 * GiB, vendor="nvidia", arch="ampere", per_node=1, per_machine=CONSUMER_PER_MACHINE, hourly_usd=0.15,
           measured=True, source="PyTorch OOM message '10.00 GiB total capacity' on an RTX 3080 10GB (github "
           "victordibia/peacasso#3; a Windows reading: Linux reports a few hundred MiB less)",
           aliases=("3080", "RTX3080", "RTX-3080-10GB", "GeForce-RTX-3080")),
    Device(name="RTX-3080-12GB", memory_bytes=12 * GiB, vendor="nvidia", arch="ampere", per_node=1, per_machine=CONSUMER_PER_MACHINE, hourly_usd=0.15,
           source="NVIDIA GeForce RTX 3080 12GB spec: 12 GB GDDR6X (nominal)", aliases=("3080-12GB", "RTX3080-12GB")),
    Device(name="RTX-4060-Ti-8GB", memory_bytes=8 * GiB, vendor="nvidia", arch="ada", fp8=True, per_node=1, per_machine=CONSUMER_PER_MACHINE, hourly_usd=0.1,
           source="NVIDIA GeForce RTX 4060 Ti spec: 8 GB GDDR6 (nominal)", aliases=("4060Ti-8GB", "RTX4060Ti-8GB")),
    Device(name="RTX-4060-Ti-16GB", memory_bytes=round(15.55 * GiB), vendor="nvidia", arch="ada", fp8=True, per_node=1, per_machine=CONSUMER_PER_MACHINE,
           hourly_usd=0.12, measured=True, source="PyTorch OOM message 'total capacity of 15.55 GiB' on a 4060 Ti 16GB "
           "(github boson-ai/higgs-audio#48)", aliases=("4060Ti-16GB", "RTX4060Ti-16GB")),
    Device(name="RTX-4070-Ti", memory_bytes=round(11.73 * GiB), vendor="nvidia", arch="ada", fp8=True, per_node=1, per_machine=CONSUMER_PER_MACHINE,
           hourly_usd=0.2, measured=True, source="PyTorch OOM message '11.73 GiB total capacity' on a 4070 Ti "
           "(github OpenLMLab/LOMO#17)", aliases=("4070Ti", "RTX4070Ti", "GeForce-RTX-4070-Ti")),
    Device(name="RTX-4080", memory_bytes=round(15.99 * GiB), vendor="nvidia", arch="ada", fp8=True, per_node=1, per_machine=CONSUMER_PER_MACHINE,
           hourly_usd=0.3, measured=True, source="PyTorch OOM message '15.99 GiB total capacity' on an RTX 4080 "
           "(github aigc-apps/sd-webui-EasyPhoto#281)", aliases=("4080", "RTX4080", "GeForce-RTX-4080")),
    Device(name="RTX-5070-Ti", memory_bytes=16 * GiB, vendor="nvidia", arch="blackwell", fp8=True, per_node=1, per_machine=CONSUMER_PER_MACHINE, hourly_usd=0.3,
           source="NVIDIA GeForce RTX 5070 Ti spec: 16 GB GDDR7 (nominal)", aliases=("5070Ti", "RTX5070Ti", "GeForce-RTX-5070-Ti")),
    Device(name="RTX-5080", memory_bytes=16 * GiB, vendor="nvidia", arch="blackwell", fp8=True, per_node=1, per_machine=CONSUMER_PER_MACHINE, hourly_usd=0.4,
           source="NVIDIA GeForce RTX 5080 spec: 16 GB GDDR7 (nominal)", aliases=("5080", "RTX5080", "GeForce-RTX-5080")),
    # -- embedded, TPU, AWS and Intel accelerators ---------------------------------------------
    Device(name="Jetson-AGX-Orin-64GB", memory_bytes=64 * GiB, vendor="nvidia", kind="unified", arch="ampere", per_node=1,
           source="NVIDIA Jetson AGX Orin 64GB: 64 GB LPDDR5 shared by CPU and GPU (nominal; the OS and CPU "
           "processes use part of it)", aliases=("Jetson-Orin-64GB", "AGX-Orin-64GB", "Jetson-AGX-Orin", "Jetson-Orin")),
    Device(name="Jetson-AGX-Orin-32GB", memory_bytes=32 * GiB, vendor="nvidia", kind="unified", arch="ampere", per_node=1,
           source="NVIDIA Jetson AGX Orin 32GB: 32 GB LPDDR5 shared by CPU and GPU (nominal; the OS and CPU "
           "processes use part of it)", aliases=("Jetson-Orin-32GB", "AGX-Orin-32GB")),
    Device(name="TPU-v3", memory_bytes=16 * GiB, vendor="google", kind="tpu", arch="tpu", per_node=8, hourly_usd=1.0,
           source="Google Cloud TPU v3 docs: 32 GiB HBM per chip over two TensorCores; JAX sees each core, 16 GiB, "
           "as a device (v3-8: 8 devices)", aliases=("v3", "TPUv3", "TPU v3")),
    Device(name="TPU-v7", memory_bytes=192 * GiB, vendor="google", kind="tpu", arch="tpu", per_node=4,
           source="Google Cloud TPU7x (Ironwood) docs: 192 GiB HBM per chip (nominal)",
           aliases=("v7", "TPUv7", "TPU v7", "Ironwood", "TPU7x", "v7x")),
    Device(name="Trainium2", memory_bytes=96 * GiB, vendor="aws", kind="npu", arch="neuron", per_node=16, hourly_usd=2.8,
           source="AWS Trainium2 docs: 96 GiB HBM per chip; trn2.48xlarge has 16 chips (nominal)",
           aliases=("Trn2", "Trainium-2", "trn2.48xlarge")),
    Device(name="Inferentia2", memory_bytes=32 * GiB, vendor="aws", kind="npu", arch="neuron", per_node=12, hourly_usd=1.1,
           source="AWS Inferentia2 docs: 32 GiB HBM per chip; inf2.48xlarge has 12 chips (nominal)",
           aliases=("Inf2", "Inferentia-2", "inf2.48xlarge")),
    Device(name="Arc-A770", memory_bytes=16 * GiB, vendor="intel", arch="xe-hpg", per_node=1, per_machine=CONSUMER_PER_MACHINE, hourly_usd=0.15,
           source="Intel Arc A770 16GB spec: 16 GB GDDR6 (nominal)", aliases=("A770", "Arc-A770-16GB", "IntelArcA770")),
    Device(name="Arc-B580", memory_bytes=12 * GiB, vendor="intel", arch="xe2", per_node=1, per_machine=CONSUMER_PER_MACHINE, hourly_usd=0.12,
           source="Intel Arc B580 spec: 12 GB GDDR6 (nominal)", aliases=("B580", "Arc-B580-12GB", "IntelArcB580")),
    Device(name="Max-1550", memory_bytes=64 * GiB, vendor="intel", arch="xe-hpc", per_node=16,
           source="Intel Data Center GPU Max 1550 spec: 128 GB HBM2e over two stacks; Level Zero's default flat "
           "hierarchy shows each stack, 64 GB, as a device (nominal)",
           aliases=("Max1550", "GPU-Max-1550", "Data-Center-GPU-Max-1550", "Ponte-Vecchio")),
    Device(name="Max-1100", memory_bytes=48 * GiB, vendor="intel", arch="xe-hpc",
           source="Intel Data Center GPU Max 1100 spec: 48 GB HBM2e, one stack (nominal)",
           aliases=("Max1100", "GPU-Max-1100", "Data-Center-GPU-Max-1100")),
)



# -- Apple Silicon: the Metal working set of the unified RAM ----------------------------------------

METAL_PAGE_BYTES = 16 * 1024
"""Apple Silicon's VM page; the working-set readings below are whole pages."""

METAL_SHARE_ABOVE_BYTES = 36 * GiB
"""Up to this much RAM the GPU may use 2/3 of it, above it 3/4 (:func:`metal_working_set_bytes`)."""

METAL_WORKING_SET_READINGS: dict[int, tuple[str, str]] = {
    16 * GiB: ("10922.67 MiB", "M1 16GB, github ise-uiuc/magicoder#19; M1 Pro 16GB, abetlen/llama-cpp-python#687"),
    32 * GiB: ("21845.34 MB", "M1 Max 32GB, github ggml-org/llama.cpp#2011; M2 Max 32GB, ollama/ollama#434"),
    64 * GiB: ("49152.00 MiB", "M1 Max 64GB, github ggml-org/llama.cpp#1870"),
    96 * GiB: ("73728.00 MB", "M2 Max 96GB, github ggml-org/llama.cpp#3213"),
}
"""``ggml_metal_init: recommendedMaxWorkingSetSize = N MB`` as llama.cpp / Ollama print it (MB there is
2^20 bytes), by unified RAM: the readings :func:`metal_working_set_bytes` reproduces."""


def metal_working_set_bytes(ram_bytes: int) -> int:
    """Metal's ``recommendedMaxWorkingSetSize`` for a Mac with ``ram_bytes`` of unified RAM (macOS 13-15).

    2/3 of the RAM up to 36 GiB, 3/4 above, rounded up to a 16 KiB page: 2/3 x 16 GiB = 11,453,246,122.7 B
    -> 699,051 pages = 10922.67 MiB, 2/3 x 32 GiB -> 21845.34 MiB, 3/4 x 64 GiB = 49152.00 MiB and
    3/4 x 96 GiB = 73728.00 MiB, as the readings in :data:`METAL_WORKING_SET_READINGS` show. No reading
    at 36 or 48 GiB was found: the 36 GiB boundary is the commonly quoted one. The rest of the RAM is
    the OS's. macOS 26 gives more (107.52 GiB of 128 GiB on an M5 Max, github antirez/ds4#893), and
    ``sudo sysctl iogpu.wired_limit_mb=N`` raises the limit: the rule errs low there; give the figure
    your Mac reports as a custom size.
    """
    share = (2, 3) if ram_bytes <= METAL_SHARE_ABOVE_BYTES else (3, 4)
    pages = -(-ram_bytes * share[0] // (share[1] * METAL_PAGE_BYTES))
    return pages * METAL_PAGE_BYTES


APPLE_RAM_GB: dict[str, tuple[int, ...]] = {
    "M1-Pro": (16, 32), "M1-Max": (32, 64), "M1-Ultra": (64, 128),
    "M2-Pro": (16, 32), "M2-Max": (32, 64, 96), "M2-Ultra": (64, 128, 192),
    "M3-Pro": (18, 36), "M3-Max": (36, 48, 64, 96, 128), "M3-Ultra": (96, 256, 512),
    "M4-Pro": (24, 48, 64), "M4-Max": (36, 48, 64, 128),
}
"""Unified-RAM sizes Apple sells per chip (apple.com tech specs; Apple's "GB" here is GiB: a 128 GB Mac
reports hw.memsize 137438953472)."""


def _apple_device(chip: str, ram_gb: int) -> Device:
    ram = ram_gb * GiB
    share = "2/3" if ram <= METAL_SHARE_ABOVE_BYTES else "3/4"
    return Device(name=f"{chip}-{ram_gb}GB", memory_bytes=metal_working_set_bytes(ram), vendor="apple",
                  kind="unified", arch="apple", bf16=not chip.startswith("M1"), per_node=1, max_devices=1,
                  source=f"Metal working set: {share} of {ram_gb} GiB unified RAM (recommendedMaxWorkingSetSize "
                         "rule from llama.cpp / Ollama logs; see memest.devices.metal_working_set_bytes)",
                  aliases=(f"Apple-{chip}-{ram_gb}GB", f"{chip}-{ram_gb}"))


DEVICES: tuple[Device, ...] = (*_LISTED,
                               *(_apple_device(chip, gb) for chip, sizes in APPLE_RAM_GB.items() for gb in sizes))
"""Every catalog device."""

DEFAULT_DEVICE = "H100-80GB"


def _key(name: str) -> str:
    key = re.sub(r"[\s_\-]+", "", name.strip().lower())
    for prefix in ("nvidia", "amd", "instinct", "tesla", "apple", "intel"):
        key = key.removeprefix(prefix)
    return key


_INDEX: dict[str, Device] = {}
for _d in DEVICES:
    for _n in (_d.name, *_d.aliases):
        _INDEX.setdefault(_key(_n), _d)


# -- custom sizes ------------------------------------------------------------------------------------

SIZE_UNITS: dict[str, int] = {"mb": 10**6, "mib": MiB, "gb": GB, "gib": GiB, "tb": 10**12, "tib": 1 << 40}
"""Units of a custom size (case-insensitive): GB = 10^9 bytes, GiB = 2^30."""

MIN_CUSTOM_BYTES = MiB
"""The smallest custom size accepted (anything below is a typo)."""

MAX_CUSTOM_BYTES = 4 << 40
"""The largest custom size accepted: 4 TiB, eight times the largest memory any one device here has
(a 512 GB Mac)."""

_SIZE = re.compile(r"^\s*(?:(?P<label>[^:]*?)\s*:)?\s*(?P<number>[-+]?(?:\d+\.?\d*|\.\d+|nan|inf(?:inity)?)"
                   r"(?:e[-+]?\d+)?)\s*(?P<unit>[a-z]+)\s*$", re.IGNORECASE)
_FORMS = "write a size as NUMBER UNIT (48GB, 47.5GiB, my-card:48GB; units MB, MiB, GB, GiB, TB, TiB)"


def custom_device(text: str) -> Device | None:
    """The device a custom size names (``48GB``, ``47.5 GiB``, ``my-card:48GB``), or None when ``text``
    does not look like a size.

    The size is rounded to the nearest byte. The device is named as written (or by the label before the
    colon), has vendor and arch ``custom`` (so the runtime's generic defaults apply: a 0.51 GiB CUDA
    context, the pre-Hopper cuBLAS workspace), no price, 8 per node, bf16 but not fp8.

    Raises:
        UnknownDeviceError: it looks like a size but is not one (unknown unit, not a positive finite
            number, outside 1 MiB .. 4 TiB, an empty label or one naming a catalog device).
    """
    m = _SIZE.match(text)
    if m is None:
        if ":" not in text:
            return None
        raise UnknownDeviceError(f"device {text!r} is not LABEL:SIZE; {_FORMS}")
    label, number, unit = m.group("label"), m.group("number"), m.group("unit").lower()
    if unit not in SIZE_UNITS:
        if label is None:
            return None  # a name like '1080ti': get_device reports it unknown, with the size forms
        raise UnknownDeviceError(f"device {text!r}: {m.group('unit')!r} is not a unit; {_FORMS}")
    value = float(number)
    if not math.isfinite(value) or value <= 0:
        raise UnknownDeviceError(f"device size {text!r} must be a positive number of {m.group('unit')}; {_FORMS}")
    nbytes = round(value * SIZE_UNITS[unit])
    if not MIN_CUSTOM_BYTES <= nbytes <= MAX_CUSTOM_BYTES:
        side = "less than 1 MiB" if nbytes < MIN_CUSTOM_BYTES else "more than 4 TiB, beyond any device"
        raise UnknownDeviceError(f"device size {text!r} is {side}; a custom size is 1 MiB .. 4 TiB; {_FORMS}")
    if label is not None and not label.strip():
        raise UnknownDeviceError(f"device {text!r} has an empty label before the colon; {_FORMS}")
    if label is not None and _key(label) in _INDEX:
        raise UnknownDeviceError(f"device {text!r}: the label {label.strip()!r} is a catalog device "
                                 f"({_INDEX[_key(label)].name}); pick another label for a custom size")
    size = f"{number}{m.group('unit')}"
    written = size if label is None else f"{label.strip()}:{size}"
    return Device(name=size if label is None else label.strip(), memory_bytes=nbytes,
                  vendor=CUSTOM, arch=CUSTOM, per_node=8, measured=False,
                  source=f"custom size given by the user: {number} {m.group('unit')} = {nbytes:,} B; runtime "
                         "constants are the generic defaults",
                  aliases=(written,))


def get_device(name: str, among: Iterable[Device] = ()) -> Device:
    """The device a name refers to (case, spaces and dashes ignored), one of the custom devices
    ``among`` by its label (``my-card`` for ``my-card:24GB``), or a custom size (:func:`custom_device`).

    Raises:
        UnknownDeviceError: no device or alias matches and it is not a size; the message lists close
            names. A malformed size names the accepted forms.
    """
    device = _INDEX.get(_key(name))
    if device is not None:
        return device
    labelled = next((d for d in among if _key(name) in {_key(d.name), *map(_key, d.aliases)}), None)
    if labelled is not None:
        return labelled
    custom = custom_device(name)
    if custom is not None:
        return custom
    bare = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*", name)
    if bare is not None:  # a number without its unit: the size it most likely means
        number = bare.group(1)
        raise UnknownDeviceError(f"device {name!r} is a number without a unit; did you mean {number + 'GB'!r} or "
                                 f"{number + 'GiB'!r}? ({_FORMS})")
    import difflib

    close = difflib.get_close_matches(_key(name), list(_INDEX), n=3, cutoff=0.5)
    names = sorted({_INDEX[c].name for c in close})
    hint = f"; did you mean {', '.join(repr(n) for n in names)}?" if names else ""
    raise UnknownDeviceError(f"unknown device {name!r}{hint} (list them with 'memest gpus'; or {_FORMS})")


def usable_bytes(device: Device, headroom: float) -> int:
    """Memory a job may use on ``device``: floor(capacity x (1 - headroom)), in bytes (the fit rule of
    :mod:`memest.planning.fit`)."""
    return math.floor(device.memory_bytes * (1 - headroom))


# -- mixed fleets --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fleet:
    """The devices of one job when they are not all alike (``--gpu RTX-4090,RTX-3090``), in device order:
    the first is CUDA0, the first device llama.cpp places layers on.

    The one description of a device list: engines that split over unlike cards read each device
    (llama.cpp / Ollama's layer split), tensor-parallel engines the smallest (:attr:`smallest`).

    Attributes:
        devices: One entry per device, as listed (at least two).
    """

    devices: tuple[Device, ...]

    @property
    def name(self) -> str:
        """The list as :func:`get_devices` reads it back (``RTX-4090,RTX-3090,48GB``)."""
        return ",".join(d.ref for d in self.devices)

    @property
    def mixed(self) -> bool:
        """True when the devices are not all the same."""
        return len(set(self.devices)) > 1

    @property
    def smallest(self) -> Device:
        """The device with the least memory (the first of equals)."""
        return min(self.devices, key=lambda d: d.memory_bytes)

    def __len__(self) -> int:
        return len(self.devices)


def get_devices(text: str, among: Iterable[Device] = ()) -> Device | Fleet:
    """The device ``text`` names, or the :class:`Fleet` a comma-separated list names
    (``RTX-4090,RTX-3090,48GB``; each item as :func:`get_device` reads it).

    Raises:
        UnknownDeviceError: an empty item or an item that is no device; the message names the list.
    """
    if "," not in text:
        return get_device(text, among)
    items = [item.strip() for item in text.split(",")]
    if len(items) < 2 or not all(items):
        raise UnknownDeviceError(f"device list {text!r} has an empty item; write device names or sizes separated by "
                                 "commas, e.g. RTX-4090,RTX-3090,48GB")
    out = []
    for item in items:
        try:
            out.append(get_device(item, among))
        except UnknownDeviceError as exc:
            raise UnknownDeviceError(f"device list {text!r}: {exc}") from None
    return Fleet(tuple(out))
