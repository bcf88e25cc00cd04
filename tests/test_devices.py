"""The accelerator catalog: every required device, aliases, capacities in bytes."""

import pytest

from memest.devices import DEVICES, GiB, MiB, get_device
from memest.errors import UnknownDeviceError

REQUIRED = ["A100-40GB", "A100-80GB", "H100-80GB", "H100-NVL-94GB", "H200-141GB", "B200", "GB200", "L4", "L40S",
            "A10G", "T4", "V100-16GB", "V100-32GB", "RTX-3090", "RTX-4090", "RTX-5090", "MI250X", "MI300X", "MI325X",
            "Gaudi2", "Gaudi3", "TPU v4", "v5e", "v5p", "v6e"]


@pytest.mark.parametrize("name", REQUIRED)
def test_required_devices_resolve(name):
    device = get_device(name)
    assert device.memory_bytes > 8 * GiB


@pytest.mark.parametrize(("alias", "canonical"), [
    ("h100", "H100-80GB"), ("H100 80GB HBM3", "H100-80GB"), ("a100-sxm4-80gb", "A100-80GB"),
    ("tpu_v5e", "TPU-v5e"), ("TPU V4", "TPU-v4"), ("NVIDIA A10G", "A10G"), ("rtx4090", "RTX-4090"),
])
def test_aliases_ignore_case_and_separators(alias, canonical):
    assert get_device(alias).name == canonical


def test_measured_capacities_match_their_sources():
    # H100 80GB: vLLM logs total_gpu_memory 79.19 GiB; V100 16GB: NVML total 16160 MiB.
    assert get_device("H100-80GB").memory_bytes == round(79.19 * 2**30)
    assert get_device("V100-16GB").memory_bytes == 16160 * 2**20 == 16160 * MiB


def test_names_are_unique():
    names = [d.name for d in DEVICES]
    assert len(names) == len(set(names))


def test_unknown_device_names_close_matches():
    with pytest.raises(UnknownDeviceError, match=r"unknown device 'H10'.*H100"):
        get_device("H10")
