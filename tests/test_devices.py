"""The accelerator catalog: every required device, aliases, capacities in bytes, custom sizes."""

import json
import os

import pytest
from inprocess import run_memest

from memest.devices import DEVICES, GiB, MiB, _key, get_device, metal_working_set_bytes
from memest.errors import UnknownDeviceError
from memest.estimate import runtime
from memest.planning.costs import PriceTable

REQUIRED = ["A100-40GB", "A100-80GB", "H100-80GB", "H100-NVL-94GB", "H200-141GB", "B200", "GB200", "L4", "L40S",
            "A10G", "T4", "V100-16GB", "V100-32GB", "RTX-3090", "RTX-4090", "RTX-5090", "MI250X", "MI300X", "MI325X",
            "Gaudi2", "Gaudi3", "TPU v4", "v5e", "v5p", "v6e"]

# Issue 15: the names people write for the new entries, and the entry each must resolve to.
NEW = [
    ("A40", "A40"), ("RTX A6000", "RTX-A6000"), ("a6000", "RTX-A6000"), ("RTX 6000 Ada", "RTX-6000-Ada"),
    ("RTX PRO 6000 Blackwell", "RTX-PRO-6000"), ("L40", "L40"), ("H20", "H20"), ("H800", "H800"),
    ("A800", "A800"), ("A800-80GB", "A800"), ("B300", "B300"), ("GB300", "GB300"), ("MI210", "MI210"),
    ("AMD Instinct MI300A", "MI300A"), ("MI355X", "MI355X"), ("RTX 2080 Ti", "RTX-2080-Ti"), ("3060", "RTX-3060"),
    ("RTX 3060 12GB", "RTX-3060"), ("3080", "RTX-3080"), ("RTX 3080 12GB", "RTX-3080-12GB"),
    ("RTX 4060 Ti 8GB", "RTX-4060-Ti-8GB"), ("4060ti-16gb", "RTX-4060-Ti-16GB"), ("4070 Ti", "RTX-4070-Ti"),
    ("GeForce RTX 4080", "RTX-4080"), ("5070 Ti", "RTX-5070-Ti"), ("RTX 5080", "RTX-5080"),
    ("Jetson AGX Orin 64GB", "Jetson-AGX-Orin-64GB"), ("jetson-orin-32gb", "Jetson-AGX-Orin-32GB"),
    ("TPU v3", "TPU-v3"), ("v7", "TPU-v7"), ("Ironwood", "TPU-v7"), ("Trainium2", "Trainium2"), ("trn2", "Trainium2"),
    ("Inferentia2", "Inferentia2"), ("Intel Arc A770", "Arc-A770"), ("B580", "Arc-B580"),
    ("Intel Data Center GPU Max 1550", "Max-1550"), ("Max 1100", "Max-1100"),
    ("M1-Pro-16GB", "M1-Pro-16GB"), ("M1 Max 64GB", "M1-Max-64GB"), ("M1-Ultra-128GB", "M1-Ultra-128GB"),
    ("M2-Pro-32GB", "M2-Pro-32GB"), ("m2 max 96gb", "M2-Max-96GB"), ("M2-Ultra-192GB", "M2-Ultra-192GB"),
    ("M3-Pro-18GB", "M3-Pro-18GB"), ("m3-max-64gb", "M3-Max-64GB"), ("Apple M3 Ultra 512GB", "M3-Ultra-512GB"),
    ("M4-Pro-48GB", "M4-Pro-48GB"), ("M4-Max-128GB", "M4-Max-128GB"),
]


@pytest.mark.parametrize("name", REQUIRED)
def test_required_devices_resolve(name):
    device = get_device(name)
    assert device.memory_bytes > 8 * GiB


@pytest.mark.parametrize(("alias", "canonical"), NEW)
def test_new_devices_and_aliases_resolve(alias, canonical):
    device = get_device(alias)
    assert device.name == canonical
    assert device.capacity_basis in ("measured", "nominal", "working set")
    assert device.source and device.source != "vendor datasheet (nominal)"  # each new entry names its source


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
    # RTX 6000 Ada: 'total capacity of 44.43 GiB' (DINGYANB/MTVCrafter#21); RTX 2080 Ti: '10.76 GiB total
    # capacity' (JDAI-CV/image-captioning#11); RTX 3060 12GB: '11.76 GiB total capacity' (TencentARC/PhotoMaker#47).
    assert get_device("RTX 6000 Ada").memory_bytes == round(44.43 * 2**30)
    assert get_device("2080 Ti").memory_bytes == round(10.76 * 2**30)
    assert get_device("3060").memory_bytes == round(11.76 * 2**30)
    # RTX 4060 Ti 16GB 'total capacity of 15.55 GiB' (boson-ai/higgs-audio#48); 4070 Ti '11.73 GiB total capacity'
    # (OpenLMLab/LOMO#17); RTX 4080 '15.99 GiB total capacity' (aigc-apps/sd-webui-EasyPhoto#281); RTX 3080 10GB
    # '10.00 GiB total capacity' (victordibia/peacasso#3).
    assert get_device("4060ti-16gb").memory_bytes == round(15.55 * 2**30)
    assert get_device("4070 Ti").memory_bytes == round(11.73 * 2**30)
    assert get_device("RTX 4080").memory_bytes == round(15.99 * 2**30)
    assert get_device("RTX 3080").memory_bytes == 10 * 2**30
    # nvidia-smi totals: A40 46068 MiB (chatdoc-com/OCRFlux#64), H20 97871 MiB (NVIDIA/nvtrust#128).
    assert get_device("A40").memory_bytes == 46068 * 2**20
    assert get_device("H20").memory_bytes == 97871 * 2**20
    assert all(get_device(n).measured for n in ("RTX 6000 Ada", "2080 Ti", "3060", "4060ti-16gb", "4070 Ti", "4080",
                                                 "3080", "A40", "H20"))


def test_former_aliases_are_own_entries_with_their_siblings_memory():
    # H800 / A800 / L40 were aliases of H100-80GB / A100-80GB / L40S; now their own entries with the same
    # memory (the sibling's reading, so not measured on the card itself; the source says so).
    for own, sibling in (("H800", "H100-80GB"), ("A800", "A100-80GB"), ("L40", "L40S")):
        device = get_device(own)
        assert device.name == own and device.memory_bytes == get_device(sibling).memory_bytes
        assert not device.measured and f"no {own} reading" in device.source


def test_names_are_unique():
    names = [d.name for d in DEVICES]
    assert len(names) == len(set(names))


def test_no_two_devices_share_a_lookup_key():
    owner: dict[str, str] = {}
    for d in DEVICES:
        for n in (d.name, *d.aliases):
            assert owner.setdefault(_key(n), d.name) == d.name, (n, owner[_key(n)], d.name)


def test_unknown_device_names_close_matches():
    with pytest.raises(UnknownDeviceError, match=r"unknown device 'H10'.*H100"):
        get_device("H10")


# ---- Apple Silicon: Metal's recommendedMaxWorkingSetSize -------------------------------------------

@pytest.mark.parametrize(("ram_gib", "logged"), [
    (16, "10922.67"),  # M1 16GB 'recommendedMaxWorkingSetSize = 10922.67 MiB' (github ise-uiuc/magicoder#19)
    (32, "21845.34"),  # M2 Max 32GB '= 21845.34 MB' (github ollama/ollama#434; M1 Max 32GB: ggml-org/llama.cpp#2011)
    (64, "49152.00"),  # M1 Max 64GB '= 49152.00 MiB' (github ggml-org/llama.cpp#1870)
    (96, "73728.00"),  # M2 Max 96GB '= 73728,00 MB' (github ggml-org/llama.cpp#3213)
])
def test_metal_working_set_reproduces_logged_readings(ram_gib, logged):
    # ggml prints the bytes / 2^20. 2/3 x 16 GiB = 11,453,246,122.7 B, up to whole 16 KiB pages: 699,051 x 16,384
    # = 11,453,251,584 B = 10922.67 MiB; 2/3 x 32 GiB -> 1,398,102 pages = 22,906,503,168 B = 21845.34 MiB (an
    # exact 2/3 would print 21845.33); 3/4 x 64 GiB = 48 GiB = 49152.00 MiB; 3/4 x 96 GiB = 72 GiB = 73728.00 MiB.
    assert f"{metal_working_set_bytes(ram_gib * GiB) / 2**20:.2f}" == logged


def test_apple_devices_use_the_working_set_and_no_cuda_runtime():
    mac = get_device("M2-Max-96GB")
    assert mac.memory_bytes == 73728 * MiB  # 3/4 x 96 GiB, the llama.cpp#3213 reading
    assert get_device("M1-Max-32GB").memory_bytes == 1_398_102 * 16_384  # the 21845.34 MiB reading
    assert (mac.vendor, mac.arch, mac.kind, mac.capacity_basis, mac.per_node) == ("apple", "apple", "unified",
                                                                               "working set", 1)
    # Metal has no CUDA context and no cuBLAS workspace.
    assert runtime.cuda_context_bytes(mac) == 0 and runtime.cublas_workspace_bytes(mac) == 0


# ---- custom sizes ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "name", "nbytes"), [
    ("48GB", "48GB", 48_000_000_000),  # 48 x 10^9
    ("47.5GiB", "47.5GiB", 51_002_736_640),  # 47.5 x 2^30 = 47.5 x 1,073,741,824
    ("my-card:48GB", "my-card", 48_000_000_000),
    ("my card : 47.5 gib", "my card", 51_002_736_640),  # case-insensitive, spaces allowed
    ("48 gb", "48gb", 48_000_000_000),
    ("512MiB", "512MiB", 536_870_912),  # 512 x 2^20
    ("24000MB", "24000MB", 24_000_000_000),  # 24000 x 10^6
    ("1.5TB", "1.5TB", 1_500_000_000_000),  # 1.5 x 10^12
    ("0.5TiB", "0.5TiB", 549_755_813_888),  # 2^40 / 2
    ("47.3GiB", "47.3GiB", 50_787_988_275),  # 47 x 2^30 = 50,465,865,728 + 0.3 x 2^30 = 322,122,547.2 -> nearest byte
])
def test_custom_sizes_in_bytes(text, name, nbytes):
    device = get_device(text)
    assert (device.name, device.memory_bytes) == (name, nbytes)
    assert (device.vendor, device.arch, device.per_node, device.hourly_usd) == ("custom", "custom", 8, None)
    assert device.capacity_basis == "user" and "given by the user" in device.source
    assert get_device(device.ref) == device  # the name printed in commands resolves back


def test_custom_device_gets_the_documented_generic_runtime_defaults():
    # runtime.CUDA_CONTEXT_BYTES: an arch it does not list gets the 0.51 GiB measured on CUDA 12; cuBLAS: the
    # pre-Hopper 4096 KiB x 2 + 16 KiB x 8.
    device = get_device("48GB")
    assert runtime.cuda_context_bytes(device) == round(0.51 * GiB)
    assert runtime.cublas_workspace_bytes(device) == 4096 * 1024 * 2 + 16 * 1024 * 8


def _main(monkeypatch, capsys, *args):
    """(exit code, stdout, stderr) of ``memest ARGS`` through main(), in-process (tests/inprocess.py)."""
    env = {k: v for k, v in os.environ.items() if k != "MEMEST_DEBUG"} | {"HF_HUB_OFFLINE": "1"}
    out = run_memest(*args, env=env)
    return out.returncode, out.stdout, out.stderr


@pytest.mark.parametrize("size", ["48XB", "0GB", "-4GB", "nanGB", "1e30GB", "infGiB", "0.0001MB", "my-card:48XB",
                                  ":48GB", "H100:48GB"])
@pytest.mark.parametrize("command", ["hf", "plan"])
def test_bad_custom_sizes_are_one_line_exit_2(monkeypatch, capsys, size, command):
    code, _, err = _main(monkeypatch, capsys, command, "meta-llama/Llama-2-7b-hf", "--serve", "--gpu", size)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("Error: "), err
    assert repr(size) in lines[0]
    if not size.startswith("H100"):
        assert "48GB, 47.5GiB, my-card:48GB" in lines[0] and "GiB, TB, TiB" in lines[0]


def test_bad_custom_size_in_gpus_available(monkeypatch, capsys):
    code, _, err = _main(monkeypatch, capsys, "plan", "meta-llama/Llama-2-7b-hf", "--serve", "--gpus-available",
                         "8xH100,4x0GB")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "'0GB'" in err


# ---- end to end --------------------------------------------------------------------------------------

def test_hf_serve_on_a_custom_size(monkeypatch, capsys):
    code, out, _ = _main(monkeypatch, capsys, "hf", "meta-llama/Llama-2-7b-hf", "--serve", "--gpu", "48GB", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["device"]["name"] == "48GB" and doc["device"]["memory_bytes"] == 48 * 10**9
    assert doc["device"]["measured_capacity"] is False
    # 6.74e9 params x 2 B = 12.55 GiB of weights on a 44.7 GiB device: fits.
    assert doc["fits"] is True


def test_plan_on_a_custom_size(monkeypatch, capsys):
    code, out, _ = _main(monkeypatch, capsys, "plan", "meta-llama/Llama-2-7b-hf", "--serve", "--gpu", "my-card:48GB",
                         "--json")
    assert code == 0
    doc = json.loads(out)
    best = doc["fits"][0]
    assert (best["device"], best["count"], best["usd_per_hour"]) == ("my-card", 1, None)  # no price: JSON null
    assert doc["prices_usd_per_hour"] == {"my-card": None}
    assert "--gpu my-card:48GB" in best["command"]


def test_unpriced_devices_rank_after_priced_ones_until_given_a_price(monkeypatch, capsys):
    args = ("plan", "meta-llama/Llama-2-7b-hf", "--serve", "--gpus-available", "8x48GB,8xL40S", "--json")
    _, out, _ = _main(monkeypatch, capsys, *args)
    assert [f["device"] for f in json.loads(out)["fits"]] == ["L40S", "48GB"]  # not free-and-best
    _, out, _ = _main(monkeypatch, capsys, *args, "--cost", "48GB=0.2")
    fits = json.loads(out)["fits"]
    assert [(f["device"], f["usd_per_hour"]) for f in fits] == [("48GB", 0.2), ("L40S", 1.5)]


def test_price_table_gives_unpriced_devices_infinity():
    prices = PriceTable.catalog()
    assert prices.price(get_device("48GB")) == float("inf")
    assert prices.price(get_device("M4-Max-128GB")) == float("inf")
    assert prices.with_overrides({"48GB": 0.5}).price(get_device("48GB")) == 0.5


def test_gpus_lists_each_capacity_basis_and_source(monkeypatch, capsys):
    code, out, _ = _main(monkeypatch, capsys, "gpus", "--json")
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)}
    assert len(rows) == len(DEVICES)
    assert rows["H100-80GB"]["capacity_basis"] == "measured" and "79.19 GiB" in rows["H100-80GB"]["source"]
    assert rows["B300"]["capacity_basis"] == "nominal"
    assert rows["M3-Max-64GB"]["capacity_basis"] == "working set" and rows["M3-Max-64GB"]["hourly_usd"] is None
    assert all(r["source"] for r in rows.values())


_ENV = {k: v for k, v in os.environ.items() if k not in ("MEMEST_DEBUG", "COLUMNS")} | {"HF_HUB_OFFLINE": "1"}


def test_serving_engines_run_only_on_their_vendors():
    # vLLM has no Apple Metal back end (CUDA, ROCm, XPU/Gaudi, TPU, Neuron); transformers generate runs there (MPS)
    out = run_memest("hf", "meta-llama/Llama-2-7b-hf", "--serve", "--gpu", "M4-Max-128GB", env=_ENV)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "--engine vllm does not run on M4-Max-128GB" in out.stderr
    assert run_memest("hf", "meta-llama/Llama-2-7b-hf", "--serve", "--engine", "hf", "--gpu", "M4-Max-128GB",
                      env=_ENV).returncode == 0
    # without --gpu the devices that fit are listed for the engine: no Mac for vLLM, Macs for hf
    listed = run_memest("hf", "meta-llama/Llama-2-7b-hf", "--serve", "--json", env=_ENV)
    fits_on = json.loads(listed.stdout)["fits_on"]
    assert "H100-80GB" in fits_on and not any(name.startswith("M4-") for name in fits_on)
    hf = json.loads(run_memest("hf", "meta-llama/Llama-2-7b-hf", "--serve", "--engine", "hf", "--json",
                               env=_ENV).stdout)["fits_on"]
    assert "M4-Max-128GB" in hf
