"""The command line as a user meets it: output, JSON keys, exit codes, one-line errors."""

import json
import os
import subprocess
import sys

import pytest
from inprocess import run_memest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "MEMEST_DEBUG": ""}


def run(*args: str) -> subprocess.CompletedProcess:
    return run_memest(*args, env=ENV)


def run_subprocess(*args: str) -> subprocess.CompletedProcess:
    """A real ``python -m memest``: start-up, the console entry point and the process's exit code."""
    return subprocess.run([sys.executable, "-m", "memest", *args], capture_output=True, text=True, env=ENV, timeout=120)


def test_serve_table_prints_verdict_and_recommendation():
    out = run("hf", "meta-llama/Llama-2-70b-hf", "--serve")
    assert out.returncode == 0, out.stderr
    assert "DOES NOT FIT" in out.stdout
    assert "Cheapest fit" in out.stdout
    assert "Fits (1 device" in out.stdout  # no --gpu: every catalog device that fits is listed


def test_json_has_the_documented_keys():
    out = run("hf", "meta-llama/Llama-2-70b-hf", "--serve", "--json", "--gpu", "H100-80GB", "--max-model-len", "4096")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    for key in ("num_params", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size"):
        assert key in doc["model"]
    assert doc["model"]["num_params"] == 68_976_648_192
    per = doc["per_device"]
    assert per["low_bytes"] <= per["allocated_bytes"] <= per["reserved_bytes"] <= per["device_used_bytes"] <= per["high_bytes"]
    assert {"name", "kind", "bytes"} <= set(doc["terms"][0])
    # terms other than allocator/runtime add up to peak allocated; all of them to device used
    allocated = sum(t["bytes"] for t in doc["terms"] if t["kind"] not in ("allocator", "runtime"))
    assert allocated == per["allocated_bytes"]
    assert sum(t["bytes"] for t in doc["terms"]) == per["device_used_bytes"]
    assert doc["device"] == {"name": "H100-80GB", "memory_bytes": round(79.19 * 2**30), "count": 1, "measured_capacity": True}
    assert doc["fits"] is False
    assert doc["recommendation"]["cheapest"]["flags"]
    serving = doc["serving"]
    assert serving["kv_cache_bytes_per_token"] == 2 * 80 * 8 * 128 * 2
    assert {"kv_cache_tokens", "max_concurrency"} <= set(serving)


def test_check_exit_code_when_it_does_not_fit():
    assert run_subprocess("hf", "meta-llama/Llama-2-70b-hf", "--serve", "--check", "--gpu", "A100-80GB").returncode == 3
    assert run_subprocess("hf", "meta-llama/Llama-2-7b-hf", "--serve", "--check", "--gpu", "A100-80GB", "--max-model-len", "4096").returncode == 0


@pytest.mark.parametrize(("args", "message"), [
    (("hf", "not-a-model"), "unknown model 'not-a-model'"),
    (("hf", "meta-llama/Llama-2-7b-hf", "--gpu", "H1000"), "unknown device 'H1000'"),
    (("hf", "meta-llama/Llama-2-7b-hf", "--tp", "3", "--gpus", "3"), "--tp 3 does not divide num_heads (32)"),
    (("hf", "meta-llama/Llama-2-7b-hf", "--train", "--pp", "64", "--gpus", "64"), "--pp 64 is more than the 32 layers"),
    (("hf", "meta-llama/Llama-2-7b-hf", "--train", "--tp", "2", "--gpus", "3"), "--gpus 3 is not divisible by tp x pp x cp = 2"),
    # no --gpus: the one default device cannot hold tp 2 x pp 2 (a NeMo factory's tp / pp without its nodes, too)
    (("hf", "meta-llama/Llama-2-7b-hf", "--train", "--stack", "megatron", "--tp", "2", "--pp", "2"),
     "tp x pp x cp = 4 spreads the job over 4 devices, and --gpus is 1; add --gpus 4"),
    (("hf", "meta-llama/Llama-2-7b-hf", "--train", "--micro-batch-size", "0"), "--micro-batch-size is 0"),
    (("hf", "meta-llama/Llama-2-7b-hf", "--train", "--seq-len", "-5"), "--seq-len is -5"),
    (("hf", "meta-llama/Llama-2-7b-hf", "--serve", "--max-model-len", "0"), "--max-model-len is 0"),
    (("hf", "meta-llama/Llama-2-7b-hf", "--serve", "--batch-size", "0"), "--batch-size is 0"),
    (("hf", "meta-llama/Llama-2-7b-hf", "--gpus", "0"), "--gpus is 0"),
    (("hf", "meta-llama/Llama-2-7b-hf", "--train", "--serve"), "choose one of --train, --finetune, --serve"),
    (("hf", "meta-llama/Llama-2-7b-hf", "--headroom", "1.5"), "--headroom 1.5"),
    (("hf", "meta-llama/Llama-2-7b-hf", "--serve", "--quantization", "int3"), "--quantization 'int3'"),
])
def test_bad_input_is_one_line_exit_2_no_traceback(args, message):
    out = run(*args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_malformed_config_file(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{oops")
    out = run("hf", str(bad))
    assert out.returncode == 2 and "not valid JSON" in out.stderr and "Traceback" not in out.stderr


def test_usage_errors_exit_2():
    assert run_subprocess("hf", "gpt2", "--no-such-flag").returncode == 2


def test_models_and_gpus_list():
    models = run("models", "--json")
    assert models.returncode == 0, models.stderr
    names = {m["name"] for m in json.loads(models.stdout)}
    assert {"meta-llama/Llama-2-70b-hf", "mistralai/Mixtral-8x7B-v0.1"} <= names
    gpus = json.loads(run("gpus", "--json").stdout)
    assert any(g["name"] == "H100-80GB" for g in gpus)


def test_python_dash_m_and_console_script_agree():
    assert run_subprocess("--help").returncode == 0
