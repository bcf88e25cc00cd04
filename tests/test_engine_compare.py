"""``memest plan MODEL --serve --engine any``: the serving engines compared per device type at the same
settings (:mod:`memest.planning.engines`), in the CLI and the API.

Llama-3.1-8B at max_model_len 8,192 with 16 sequences asked: every layer is full attention, so a pool of T
tokens holds floor(T / 8,192) sequences of 8,192 tokens (vLLM's block of 16 divides 8,192: no partial
block); llama.cpp's pool is the n_ctx it is asked for, max_model_len x batch_size = 8,192 x 16 = 131,072
cells.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import memest
from memest.cli import app
from memest.devices import get_device
from memest.planning.engines import COMPARED, compare_engines
from memest.planning.search import DeviceChoice
from memest.sources import load_model
from memest.workload import Engine, ServingConfig

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def h100_and_mac():
    spec = load_model(MODEL)
    s = ServingConfig(max_model_len=8192, batch_size=16)
    return compare_engines(spec, s, (DeviceChoice(get_device("H100"), 8), DeviceChoice(get_device("M2-Max-96GB"), 1)))


def test_rows_follow_each_engines_pool(h100_and_mac):
    h100 = h100_and_mac.devices[0]
    assert [r.engine for r in h100.rows] == list(COMPARED) and h100.count == 1  # 16 x 8k fits one H100
    rows = {r.engine: r for r in h100.rows}
    for e in (Engine.VLLM, Engine.SGLANG, Engine.TRTLLM):
        assert rows[e].verdict == "fits" and rows[e].concurrent_sequences == rows[e].kv_cache_tokens // 8192
    assert rows[Engine.LLAMACPP].kv_cache_tokens == 8192 * 16 == 131_072
    # the named engine holds the most of those that start
    assert h100.best is max((r for r in h100.rows if r.starts), key=lambda r: r.concurrent_sequences).engine


def test_engines_that_do_not_run_on_apple_are_skipped_with_the_reason(h100_and_mac):
    mac = h100_and_mac.devices[1]
    for r in mac.rows[:3]:
        assert r.skipped == f"{r.engine.value} does not run on M2-Max-96GB (apple)" and r.verdict is None
    assert mac.rows[3].engine is Engine.LLAMACPP and mac.rows[3].skipped is None
    # llama.cpp alone runs, and it fits: the f16 GGUF is 8.03e9 x 2 B = 14.96 GiB, 16 x 8,192 tokens of KV at
    # 128 KiB/token (2 x 32 layers x 8 kv heads x 128 x 2 B) = 16 GiB, under the Metal working set of 3/4 x 96 GiB
    assert mac.rows[3].verdict == "fits" and mac.best is Engine.LLAMACPP


def test_a_gguf_type_is_llamacpp_only():
    """q4_k_m is a GGUF file type: the tensor-parallel engines refuse it (their own error is the reason)."""
    spec = load_model(MODEL)
    c = compare_engines(spec, ServingConfig(max_model_len=4096, quantization="q4_k_m"),
                        (DeviceChoice(get_device("RTX-4090"), 1),))
    rows = c.devices[0].rows
    assert all(r.skipped and "q4_k_m" in r.skipped for r in rows[:3])
    assert rows[3].skipped is None and c.devices[0].best is Engine.LLAMACPP


def test_cli_json_is_the_api_answer():
    args = ["plan", MODEL, "--serve", "--engine", "any", "--gpu", "H100", "--max-model-len", "8192",
            "--batch-size", "16", "--json"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    api = memest.plan_memory(MODEL, mode="serve", engine="any", gpu="H100", max_model_len=8192, batch_size=16)
    assert doc["engine_comparison"] == api.to_dict()["engine_comparison"]
    entry = doc["engine_comparison"][0]
    assert entry["device"] == "H100-80GB" and [e["engine"] for e in entry["engines"]] == [e.value for e in COMPARED]
    assert entry["best"] in {e["engine"] for e in entry["engines"]}


def test_table_names_the_best(monkeypatch):
    out = CliRunner().invoke(app, ["plan", MODEL, "--serve", "--engine", "any", "--gpu", "M2-Max-96GB",
                                   "--max-model-len", "8192"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "llama.cpp holds the most" in out.output and "trtllm does not run on M2-Max-96GB (apple)" in out.output


@pytest.mark.parametrize(("argv", "words"), [
    (["plan", MODEL, "--serve", "--engine", "bogus", "--gpu", "L4"], ("'bogus'", "any")),
    (["plan", MODEL, "--train", "--engine", "any", "--gpu", "L4"], ("--engine",)),
])
def test_bad_engine_is_one_line_exit_2(argv, words, monkeypatch, capsys):
    from memest.cli import main

    monkeypatch.setattr("sys.argv", ["memest", *argv])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and all(w in err for w in words), err


def test_api_refuses_any_for_training():
    with pytest.raises(memest.InputError, match="serving"):
        memest.plan_memory(MODEL, mode="train", engine="any", gpu="H100")


def test_a_gguf_file_is_compared_under_llamacpp_alone():
    spec = load_model(MODEL)
    header = (("token_embd.weight", "q4_k", (128256, 4096)),)  # any header: the others never read it
    c = compare_engines(spec, ServingConfig(engine=Engine.LLAMACPP, max_model_len=4096, gguf_tensors=header),
                        (DeviceChoice(get_device("H100"), 1),))
    rows = c.devices[0].rows
    assert all(r.skipped and r.skipped.startswith("a GGUF file is served by llama.cpp") for r in rows[:3])
    assert rows[3].engine is Engine.LLAMACPP


# --top / --cost: setups across engines, ranked as plan ranks them (price, devices, sequences held)

H100_USD, L4_USD = 3.0, 0.8  # memest/devices.py catalog: H100-80GB hourly_usd 3.0, L4 0.8


@pytest.fixture(scope="module")
def h100_and_l4():
    spec = load_model(MODEL)
    s = ServingConfig(max_model_len=8192, batch_size=16)
    return spec, s, compare_engines(spec, s, (DeviceChoice(get_device("H100"), 8), DeviceChoice(get_device("L4"), 8)),
                                    top=20)


def test_setups_are_ranked_by_price_then_devices(h100_and_l4):
    # every setup costs its devices x the type's price; 16 x 8k fits one H100 ($3.00/h) but no single L4
    # (23,034 MiB: 16 x 8,192 x 128 KiB = 16 GiB of KV beside 14.96 GiB of weights), so the L4 setups are 2 L4 =
    # $1.60/h (cheaper than one H100, first) or 4 L4 = $3.20/h (dearer, after the H100s)
    _, _, c = h100_and_l4
    ranked = c.ranked
    for x in ranked:
        assert x.row.verdict == "fits"
        assert x.usd_per_hour == pytest.approx(x.count * (H100_USD if x.device.name == "H100-80GB" else L4_USD))
    prices = [x.usd_per_hour for x in ranked]
    assert prices == sorted(prices) and ranked[0].device.name == "L4" and ranked[0].count == 2
    assert {x.count for x in ranked if x.device.name == "H100-80GB"} == {1}
    first_h100 = next(i for i, x in enumerate(ranked) if x.device.name == "H100-80GB")
    assert all(x.usd_per_hour == pytest.approx(2 * L4_USD) for x in ranked[:first_h100])
    for a, b in zip(ranked, ranked[1:]):  # equal price and devices: more sequences first
        if (a.usd_per_hour, a.count) == (b.usd_per_hour, b.count):
            assert a.row.concurrent_sequences >= b.row.concurrent_sequences
    # each setup is its engine's own fewest devices: one per engine and type at most
    assert len({(x.device.name, x.engine) for x in ranked}) == len(ranked)


def test_cost_changes_the_ranking(h100_and_l4):
    # at $5/h an L4, 2 L4 = $10/h: every H100 setup ($3/h) now comes first
    from memest.planning.costs import PriceTable

    spec, s, _ = h100_and_l4
    c = compare_engines(spec, s, (DeviceChoice(get_device("H100"), 8), DeviceChoice(get_device("L4"), 8)), top=2,
                        prices=PriceTable.catalog().with_overrides({"L4": 5.0}))
    assert [x.device.name for x in c.ranked] == ["H100-80GB", "H100-80GB"]
    assert [x.usd_per_hour for x in c.ranked] == [3.0, 3.0]


def test_cli_top_and_cost():
    base = ["plan", MODEL, "--serve", "--engine", "any", "--gpus-available", "8xH100,8xL4", "--max-model-len", "8192",
            "--batch-size", "16"]
    out = CliRunner().invoke(app, [*base, "--top", "3", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert len(doc["setups"]) == 3 and doc["setups"][0]["device"] == "L4" and doc["setups"][0]["usd_per_hour"] == 1.6
    out = CliRunner().invoke(app, [*base, "--top", "2", "--cost", "L4=5"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "Best 2 setups over every engine" in out.output and "1. 1 x H100-80GB" in out.output
    assert "2. 1 x H100-80GB" in out.output and "3. " not in out.output


# Hand-made RWKV configs (the shapes of RWKV/rwkv-4-169m-pile and RWKV/v6-Finch-1B6-HF, as tests/test_current_families.py
# builds them): vLLM, SGLang and TensorRT-LLM serve no RWKV; llama.cpp converts RWKV-6 / RWKV-7, not RWKV-4
# (memest.workload.config.ENGINES_SERVING, with its sources).
RWKV4 = {"model_type": "rwkv", "architectures": ["RwkvForCausalLM"], "hidden_size": 768, "num_hidden_layers": 12,
         "vocab_size": 50277, "context_length": 1024}
RWKV6 = {"model_type": "rwkv6", "architectures": ["Rwkv6ForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 24,
         "head_size": 64, "vocab_size": 65536, "intermediate_size": None,
         "auto_map": {"AutoModelForCausalLM": "modeling_rwkv6.Rwkv6ForCausalLM"}}


# a hand-made T5 (t5-small's shape): vLLM serves no encoder-decoder but Whisper, SGLang has no T5
T5_TINY = {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "d_model": 512, "d_kv": 64,
           "d_ff": 2048, "num_layers": 6, "num_heads": 8, "vocab_size": 32128, "feed_forward_proj": "relu"}


def _rwkv_spec(raw: dict):
    from memest.sources import spec_from_config
    from memest.sources.config import HFConfig

    return spec_from_config(HFConfig(json.loads(json.dumps(raw)), name="rwkv-test", source="test"))


@pytest.mark.parametrize(("raw", "engine", "serving"), [
    (RWKV6, "vllm", "hf, llama.cpp, ollama; use --engine llama.cpp"),
    (RWKV6, "sglang", "hf, llama.cpp, ollama; use --engine llama.cpp"),
    (RWKV6, "trtllm", "hf, llama.cpp, ollama; use --engine llama.cpp"),
    (RWKV4, "vllm", "hf; use --engine hf"),
    (RWKV4, "llama.cpp", "hf; use --engine hf"),
    (T5_TINY, "vllm", "hf, trtllm, llama.cpp, ollama; use --engine trtllm"),
    (T5_TINY, "sglang", "hf, trtllm, llama.cpp, ollama; use --engine trtllm"),
])
def test_an_engine_that_does_not_serve_the_family_is_one_line_exit_2(raw, engine, serving, tmp_path, monkeypatch,
                                                                     capsys):
    from memest.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    monkeypatch.setattr("sys.argv", ["memest", "hf", str(path), "--serve", "--engine", engine])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1, err
    assert f"{engine} does not serve model_type {raw['model_type']!r}" in err and err.endswith(serving), err


def test_rwkv6_serves_under_llamacpp_and_hf():
    from memest.estimate import estimate
    from memest.workload import validate

    spec = _rwkv_spec(RWKV6)
    for engine in (Engine.LLAMACPP, Engine.HF):
        s = ServingConfig(engine=engine, max_model_len=2048)
        validate(spec, s)
        assert estimate(spec, s, get_device("H100")).ranks


def test_the_comparison_skips_engines_that_do_not_serve_the_family():
    """RWKV-6 on an H100: vLLM, SGLang, TensorRT-LLM skipped with the reason, llama.cpp estimated and named."""
    c = compare_engines(_rwkv_spec(RWKV6), ServingConfig(max_model_len=2048), (DeviceChoice(get_device("H100"), 8),))
    rows = {r.engine: r for r in c.devices[0].rows}
    for e in (Engine.VLLM, Engine.SGLANG, Engine.TRTLLM):
        assert rows[e].skipped is not None and rows[e].skipped.startswith(f"{e.value} does not serve model_type 'rwkv6'")
    assert rows[Engine.LLAMACPP].skipped is None and rows[Engine.LLAMACPP].verdict == "fits"
    assert c.devices[0].best is Engine.LLAMACPP
    # RWKV-4: no compared engine serves it; every row is skipped, none errors
    c4 = compare_engines(_rwkv_spec(RWKV4), ServingConfig(max_model_len=1024), (DeviceChoice(get_device("H100"), 8),))
    assert all(r.skipped and "does not serve model_type 'rwkv'" in r.skipped for r in c4.devices[0].rows)
    assert c4.devices[0].best is None


@pytest.mark.parametrize(("raw", "fix"), [
    # a Llama (every engine serves it): vLLM splits it by tensor parallelism
    ({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 1000},
     "use --engine vllm for --tp/--pp"),
    # RWKV-6: of the engines that serve it (hf, llama.cpp, ollama) only llama.cpp splits it, by layers
    (RWKV6, "use --engine llama.cpp, which splits the layers over the devices of --gpus"),
    # RWKV-4: only transformers serves it, on one device
    (RWKV4, "serve it on one device (--gpus 1, no --tp / --pp)"),
])
def test_engine_hf_on_several_devices_names_an_engine_that_serves_the_family(raw, fix, tmp_path, monkeypatch, capsys):
    from memest.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    monkeypatch.setattr("sys.argv", ["memest", "hf", str(path), "--serve", "--engine", "hf", "--gpus", "2",
                                     "--gpu", "RTX-4090"])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1, err
    assert "--engine hf models one device" in err and err.endswith(fix), err
