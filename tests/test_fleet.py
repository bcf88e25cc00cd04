"""Unlike devices in one job (``--gpu RTX-4090,RTX-3060``): llama.cpp's layer split by free memory, each
device's own fit (the least room decides), the tensor-parallel engines at the smallest card, and the
refusals.

llama.cpp's rule (``llama_model::load_tensors``, ``src/llama-model.cpp``, b4715): with no ``--tensor-split``
each device's weight is its free memory (``ggml_backend_dev_memory``); the weights are summed and
normalised in float, ``splits[i] = (w_0 + ... + w_i) / sum``; layer ``il`` of the ``act = min(ngl, L + 1)``
offloaded goes to the first device with ``splits[j] > il / act`` (``std::upper_bound``).

Llama-2-7B: L = 32 blocks + the output layer (act = 33 with every layer offloaded); one cell of one
layer's f16 KV is 2 (K, V) x 32 heads x 128 x 2 B = 16,384 B, so at the default n_ctx 4,096 a layer
holds 64 MiB of KV.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from memest.cli import app
from memest.devices import Fleet, get_device, get_devices
from memest.errors import InputError, UnknownDeviceError
from memest.estimate import estimate
from memest.planning.fit import device_verdicts, verdict
from memest.sources import load_model
from memest.workload import Engine, Parallelism, ServingConfig

MODEL = "meta-llama/Llama-2-7b-hf"
MiB = 2**20
LAYER_KV = 2 * 32 * 128 * 2 * 4096  # 64 MiB per layer at n_ctx 4096, f16
CONTEXT = 319 * MiB  # llama.cpp's CUDA context (memest.estimate.serving.llamacpp.engine.CUDA_CONTEXT)


def _llama(fleet: Fleet, **kw) -> tuple:
    spec = load_model(MODEL)
    s = ServingConfig(engine=Engine.LLAMACPP, quantization="q4_k_m", parallelism=Parallelism(tp=len(fleet)), **kw)
    return spec, s, estimate(spec, s, fleet)


def _blocks(label: str) -> int:
    """Blocks of a rank label 'CUDA0 NAME (layers a-b ...)'."""
    a, b = label.split("layers ")[1].split(")")[0].split(" ")[0].split("-")
    return int(b) - int(a) + 1


def test_get_devices_reads_a_list_and_names_it_back():
    fleet = get_devices("RTX-4090, RTX-3090,48GB")
    assert isinstance(fleet, Fleet) and fleet.mixed and len(fleet) == 3
    assert fleet.name == "RTX-4090,RTX-3090,48GB" and get_devices(fleet.name) == fleet
    assert fleet.smallest.name == "RTX-4090"  # 23.68 GiB < 23.69 GiB (RTX-3090) < 48e9 B
    assert get_devices("H100") == get_device("H100")  # one name: a device, not a fleet
    assert not get_devices("RTX-4090,RTX-4090").mixed


def test_default_split_of_a_24gb_and_a_12gb_card():
    """Custom sizes have no llama.cpp context: the weights are 24e9 and 12e9. The float sum 36e9 rounds
    to 35,999,997,952 (a multiple of 4096 in float), so splits[0] = 24e9 / 35,999,997,952 -> float
    0.6666667 (0.666666686534...); layer 21: 21/33 = 0.636 < it -> card 0; layer 22: 22/33 rounds to the
    same float 0.6666667, not above -> card 1. Card 0 holds blocks 0-21 (22), card 1 blocks 22-31 (10)
    and the output layer. KV: 22 x 64 MiB = 1,408 MiB and 10 x 64 MiB = 640 MiB."""
    _, _, est = _llama(get_devices("24GB,12GB"))
    big, small = est.ranks
    assert _blocks(big.label) == 22 and "layers 0-21" in big.label
    assert "layers 22-31 + output" in small.label
    assert big.term("kv_cache").bytes == 22 * LAYER_KV == 1408 * MiB
    assert small.term("kv_cache").bytes == 10 * LAYER_KV == 640 * MiB
    assert big.term("runtime.cuda_context").bytes == small.term("runtime.cuda_context").bytes == 0


def test_default_split_of_an_rtx4090_and_an_rtx3060_counts_the_context():
    """Free memory = capacity - 319 MiB: RTX-4090 23.68 GiB = 24,248.32 MiB -> 23,929.32 MiB free; RTX-3060
    11.76 GiB = 12,042.24 MiB -> 11,723.24 MiB. splits[0] = 23,929.32 / 35,652.56 = 0.67118; x 33 =
    22.15, so blocks 0-22 (23) go to the 4090, 23-31 (9) and the output to the 3060. KV: 23 x 64 =
    1,472 MiB and 9 x 64 = 576 MiB; each card holds its own 319 MiB context."""
    _, _, est = _llama(get_devices("RTX-4090,RTX-3060"))
    a, b = est.ranks
    assert "CUDA0 RTX-4090 (layers 0-22)" == a.label and "CUDA1 RTX-3060 (layers 23-31 + output)" == b.label
    assert a.term("kv_cache").bytes == 1472 * MiB and b.term("kv_cache").bytes == 576 * MiB
    assert a.term("runtime.cuda_context").bytes == b.term("runtime.cuda_context").bytes == CONTEXT


def test_tensor_split_given_and_the_worst_device_decides():
    """-ts 1,1 over 24GB + 2GB: layer il on card 0 while il/33 < 0.5, blocks 0-16 (17); card 1 holds
    blocks 17-31 (15) + output. Card 1's lower bound: 15 blocks x 202,375,168 parameters (4 x 4096^2 +
    3 x 4096 x 11008) at no fewer than Q4_K's 4.5 bits (144 B per 256) = 1,707,540,480 B, plus 15 x 64 MiB
    KV = 1,006,632,960 B: 2.71e9 B > 0.9 x 2e9 = 1.8e9 usable. Card 0's upper bound: 17 blocks at Q6_K's
    6.5625 bits (210 B per 256) = 2.82e9 B + 17 x 64 MiB = 1.14e9 B + < 1 GiB of compute buffer, < 5e9 B
    of its 0.9 x 24e9 = 21.6e9 usable. So the job does not fit, and the 2 GB card is the reason."""
    fleet = get_devices("24GB,2GB")
    _, _, est = _llama(fleet, tensor_split=(1.0, 1.0))
    assert "layers 0-16" in est.ranks[0].label and "layers 17-31 + output" in est.ranks[1].label
    assert est.ranks[1].device_used_bytes > 15 * 202_375_168 * 9 // 16 + 15 * LAYER_KV
    v = verdict(est, fleet, 2, 0.10)
    assert not v.fits and v.device.name == "2GB"
    each = device_verdicts(est, fleet, 0.10)
    assert [x.fits for x in each] == [True, False] and est.ranks[0].device_used_bytes < 5 * 10**9
    assert est.serving is not None and est.serving.engine_error == "no_memory"


def test_vllm_runs_at_the_smallest_card():
    """vLLM takes the fewest KV blocks of any worker (get_kv_cache_configs, vllm 0.19) and its tensor
    shards are equal: on RTX-4090 + RTX-3060 every rank is the 3060's, so the estimate is that of
    2 x RTX-3060, and the fleet's verdict is the 3060's."""
    spec = load_model(MODEL)
    s = ServingConfig(engine=Engine.VLLM, parallelism=Parallelism(tp=2), max_model_len=2048)
    fleet = get_devices("RTX-4090,RTX-3060")
    est, alike = estimate(spec, s, fleet), estimate(spec, s, get_device("RTX-3060"))
    assert est.ranks == alike.ranks and est.serving == alike.serving
    # the 3060's pool is the smaller: same per-rank weights and activations, 12 GB against 24 GB
    assert alike.serving.kv_cache_tokens < estimate(spec, s, get_device("RTX-4090")).serving.kv_cache_tokens
    assert any("least room (RTX-3060)" in a for a in est.assumptions) and est.extra["fleet_binding"] == "RTX-3060"
    assert verdict(est, fleet, 2, 0.1) == verdict(alike, get_device("RTX-3060"), 2, 0.1)


def test_alike_list_is_the_count():
    """RTX-4090,RTX-4090 is --gpu RTX-4090 --gpus 2 (one estimate, no fleet in the report)."""
    run = CliRunner()
    args = ["hf", MODEL, "--serve", "--engine", "llama.cpp", "--quantization", "q4_k_m", "--json"]
    listed = json.loads(run.invoke(app, [*args, "--gpu", "RTX-4090,RTX-4090"]).stdout)
    counted = json.loads(run.invoke(app, [*args, "--gpu", "RTX-4090", "--gpus", "2"]).stdout)
    assert listed["ranks"] == counted["ranks"] and "fleet" not in listed


def test_cli_reports_each_device():
    out = CliRunner().invoke(app, ["hf", MODEL, "--serve", "--engine", "llama.cpp", "--quantization", "q4_k_m",
                                   "--gpu", "RTX-4090,RTX-3060", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert [d["name"] for d in doc["fleet"]["devices"]] == ["RTX-4090", "RTX-3060"]
    assert [v["device"] for v in doc["fleet"]["verdicts"]] == ["RTX-4090", "RTX-3060"]
    # the binding device has the least margin
    margins = {v["device"]: v["margin_bytes"] for v in doc["fleet"]["verdicts"]}
    assert doc["fleet"]["binding"] == min(margins, key=margins.get) and doc["fits"] is True


@pytest.mark.parametrize(("args", "words"), [
    (["--engine", "llama.cpp", "--gpu", "RTX-4090,RTX-9999"], ("device list", "'RTX-9999'", "did you mean")),
    (["--engine", "llama.cpp", "--gpu", "RTX-4090,RTX-3090", "--tensor-split", "1,2,3"],
     ("--tensor-split 1,2,3", "3 shares", "2 devices of --gpu RTX-4090,RTX-3090")),
    (["--engine", "llama.cpp", "--gpu", "RTX-4090,,RTX-3090"], ("empty item",)),
    (["--engine", "hf", "--gpu", "RTX-4090,RTX-3090"], ("--engine hf", "llama.cpp", "vllm")),
    (["--gpu", "RTX-4090,RTX-3090", "--gpus", "3"], ("--gpus 3", "2 devices")),
    (["--gpu", "RTX-4090,RTX-3090", "--pp", "2"], ("one tensor-parallel group",)),
])
def test_bad_lists_are_one_line_exit_2(args, words, monkeypatch, capsys):
    err = _cli_error(monkeypatch, capsys, ["hf", MODEL, "--serve", *args])
    assert all(w in err for w in words), err


def _cli_error(monkeypatch, capsys, argv: list[str]) -> str:
    """The one line memest's error boundary prints for ``argv`` (exit code 2)."""
    from memest.cli import main

    monkeypatch.setattr("sys.argv", ["memest", *argv])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("Error: "), err
    return err


def test_training_on_unlike_devices_is_refused(monkeypatch, capsys):
    err = _cli_error(monkeypatch, capsys, ["hf", MODEL, "--train", "--gpu", "RTX-4090,RTX-3090"])
    assert "training on unlike devices" in err and "llama.cpp" in err


def test_library_refuses_training_on_a_fleet():
    from memest.workload import TrainingConfig

    spec = load_model(MODEL)
    with pytest.raises(InputError, match="training on unlike devices"):
        estimate(spec, TrainingConfig(parallelism=Parallelism(dp=2)), get_devices("RTX-4090,RTX-3090"))
    with pytest.raises(UnknownDeviceError, match="device list"):
        get_devices("RTX-4090,nope")


def test_llamacpp_runs_on_three_cards_whatever_the_heads():
    """llama.cpp splits layers, not heads: 3 cards with Llama-2-7B's 32 heads run (tp 3 divides no 32)."""
    out = CliRunner().invoke(app, ["hf", MODEL, "--serve", "--engine", "llama.cpp", "--gpu", "RTX-4090,RTX-3090,48GB",
                                   "--quantization", "q4_k_m", "--json"])
    assert out.exit_code == 0, out.output
    assert len(json.loads(out.stdout)["ranks"]) == 3


def test_gpus_catalog_unaffected():
    out = CliRunner().invoke(app, ["gpus"])
    assert out.exit_code == 0 and "RTX-4090" in out.output


def test_ollama_passes_its_layer_counts_as_the_tensor_split():
    """Ollama places layers per GPU itself (estimateGPULayers, each GPU's own free memory) and hands llama.cpp
    the counts as --tensor-split (llm/memory.go tensorSplit, llm/server.go). With counts (a, b), a + b = 33
    and act = 33, llama.cpp's edge is a/33: block il < a goes to card 0, and il = a (a/33, not above the
    edge) to card 1, so card 0 holds exactly a blocks and card 1 the other b - 1 and the output layer."""
    from memest.estimate.serving.llamacpp import ollama

    spec = load_model(MODEL)
    fleet = get_devices("RTX-4090,RTX-3060")
    s = ServingConfig(engine=Engine.OLLAMA, parallelism=Parallelism(tp=2))
    counts = ollama.estimate_layers(spec, s, tuple(d.memory_bytes for d in fleet.devices)).layer_counts
    assert sum(counts) == 33
    est = estimate(spec, s, fleet)
    assert _blocks(est.ranks[0].label) == counts[0] and _blocks(est.ranks[1].label) == counts[1] - 1
    assert "+ output" in est.ranks[1].label


def test_api_takes_a_list():
    import memest

    r = memest.estimate_memory(MODEL, mode="serve", engine="llama.cpp", quantization="q4_k_m", gpu="RTX-4090,RTX-3060")
    assert r.fleet.binding in ("RTX-4090", "RTX-3060") and len(r.ranks) == 2 and r.device.count == 2
    with pytest.raises(InputError, match="training on unlike devices"):
        memest.estimate_memory(MODEL, mode="train", gpu="RTX-4090,RTX-3060")


def test_plan_and_sweep_take_one_device_type(monkeypatch, capsys):
    err = _cli_error(monkeypatch, capsys, ["plan", MODEL, "--serve", "--gpu", "RTX-4090,RTX-3060"])
    assert "--gpus-available RTX-4090,RTX-3060" in err
    err = _cli_error(monkeypatch, capsys, ["sweep", MODEL, "--serve", "--gpu", "RTX-4090,RTX-3060",
                                           "--max-model-len", "1k..4k"])
    assert "lists several devices" in err


def test_sglang_sizes_its_default_fraction_by_the_smallest_card():
    """SGLang reads gpu_mem once for every rank (ServerArgs._handle_gpu_memory_settings: get_device_memory_capacity
    -> get_nvgpu_memory_capacity, the min of nvidia-smi's memory.total over every GPU, sglang
    python/sglang/srt/utils/common.py at 004f0c7) and takes the least free memory of its ranks (an all-reduce MIN).

    Cards of 34 GiB = 34,816 MiB and 36 GiB = 36,864 MiB (custom sizes: generic runtime constants, CUDA context
    round(0.51 GiB) = 547,608,330 B, NCCL 1 GiB), tp 2. gpu_mem = 34,816 MiB (< 35 GiB: chunked_prefill_size 2048,
    cuda_graph_max_bs 24 at tp < 4): reserved = 512 + 2048 x 1.5 + 24 x 2 + 2 / 8 x 1024 = 3,888 MiB,
    mem_fraction_static = round((34,816 - 3,888) / 34,816, 3) = round(0.88833, 3) = 0.888 on both cards. (The
    36 GiB card's own default would be 0.811: reserved 512 + 4096 x 1.5 + 32 x 2 + 256 = 6,976, (36,864 - 6,976) /
    36,864 = 0.8108; at 0.811 of its free 37,033,355,510 B it would hold 30,034,051,318 B, the smaller figure.)
    The 34 GiB card has the least free: 36,507,222,016 - 547,608,330 - 1,073,741,824 = 34,885,871,862 B; static =
    floor(34,885,871,862 x 0.888) = 30,978,654,213 B. Llama-2-7B's KV per token per rank: 32 layers x 2 (K, V) x
    32 heads x 128 x 2 B / tp 2 = 262,144 B; tokens = (static - the rank's weights) // 262,144."""
    spec = load_model(MODEL)
    s = ServingConfig(engine=Engine.SGLANG, parallelism=Parallelism(tp=2), max_model_len=4096)
    est = estimate(spec, s, get_devices("34GiB,36GiB"))
    weights = next(t.bytes for t in est.ranks[0].terms if t.name == "weights")
    assert est.extra["fleet_binding"] == "34GiB"
    assert est.serving.requested_bytes == 30_978_654_213
    assert est.serving.kv_cache_tokens == (30_978_654_213 - weights) // 262_144
    assert any("mem_fraction_static 0.888 " in a for a in est.assumptions), est.assumptions


def test_vllm_on_unlike_cards_recommends_a_lower_utilization():
    """Llama-3.1-8B under vLLM at tp 2 on RTX-4090 + RTX-3090 binds at the 4090 (23.68 GiB against 23.69 GiB,
    ``memest.devices``). At gpu_memory_utilization 0.90 the process is over the card by under 60 MiB, and one
    step of 0.01 lowers vLLM's share by 0.01 x 23.68 GiB = 242.5 MiB, while the KV pool it leaves still holds
    the one request of 131,072 tokens (131,072 x [32 layers x 2 (K, V) x 8 heads / tp 2 x 128 x 2 B = 65,536 B]
    = 8 GiB per rank, of a pool of about 11.2 GiB less 0.24 GiB): 0.89 is the largest value that fits, on the fleet as on
    2 x RTX-4090 (the same binding card)."""
    from memest.planning.recommend import assess

    spec = load_model("meta-llama/Llama-3.1-8B")
    s = ServingConfig(engine=Engine.VLLM, parallelism=Parallelism(tp=2))
    fleet = get_devices("RTX-4090,RTX-3090")
    a = assess(spec, s, fleet)
    assert not a.verdict.fits and a.verdict.device.name == "RTX-4090"
    assert -a.verdict.margin_bytes < 0.01 * get_device("RTX-4090").memory_bytes  # one step covers the shortfall
    assert a.utilization == 0.89
    assert a.recommendation is not None and a.recommendation.cheapest.flags == "--gpu-memory-utilization 0.89"
    assert a.recommendation.cheapest.verdict.fits and a.recommendation.lossless is a.recommendation.cheapest
    # the CLI: the verdict gives the value, --check exits 3 with the fix printed, the JSON holds it
    run = CliRunner()
    args = ["hf", "meta-llama/Llama-3.1-8B", "--serve", "--gpu", "RTX-4090,RTX-3090"]
    out = run.invoke(app, [*args, "--check"])
    assert out.exit_code == 3
    text = " ".join(out.stdout.split())
    assert "(0.89 fits)" in text and "too small" not in text
    assert "Cheapest fit: --gpu-memory-utilization 0.89" in text and "of RTX-4090,RTX-3090" in text
    doc = json.loads(run.invoke(app, [*args, "--json"]).stdout)
    assert doc["recommendation"]["cheapest"]["workload"]["gpu_memory_utilization"] == 0.89
