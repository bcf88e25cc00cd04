"""`memest plan` and `memest sweep` as a user meets them: tables, JSON, flags that reproduce, errors."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from inprocess import run_memest
from typer.testing import CliRunner

from memest.cli import app

CONFIGS = Path(__file__).resolve().parent / "data" / "configs"
from memest.errors import InputError

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "MEMEST_DEBUG": ""}
GiB = 1 << 30


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def run(*args: str) -> subprocess.CompletedProcess:
    return run_memest(*args, env=ENV)  # through main(), in-process (tests/inprocess.py)


SERVE = ("meta-llama/Llama-2-70b-hf", "--serve", "--max-model-len", "4096", "--batch-size", "4")
TRAIN = ("meta-llama/Llama-2-7b-hf", "--train", "--micro-batch-size", "4", "--seq-len", "4096")


def test_plan_json_lists_fits_cheapest_first_with_peak_and_headroom():
    out = invoke("plan", *SERVE, "--gpus-available", "8xH100,8xA100-80GB,8xL40S", "--json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["mode"] == "serve" and doc["ranking"] == ["usd_per_hour", "communication", "disruption", "changes"]
    fits = doc["fits"]
    assert [f["rank"] for f in fits] == list(range(1, len(fits) + 1))
    keys = [(f["cost"]["usd_per_hour"], f["cost"]["communication"], f["cost"]["disruption"], f["cost"]["changes"])
            for f in fits]
    assert keys == sorted(keys)
    for f in fits:
        # vLLM (memest.planning.fit): what the engine holds (needed_bytes) against the whole device, --headroom not applied;
        # device_used_bytes is the job's own memory, as in `memest hf --json` (below the budget the engine holds)
        assert f["device_used_bytes"] < f["needed_bytes"] <= f["usable_bytes"] == f["memory_bytes"]
        assert f["free_bytes"] == f["memory_bytes"] - f["needed_bytes"]
        assert set(f["largest"]) == {"batch_size", "max_model_len"}
        assert f["largest"]["batch_size"]["value"] >= 4  # the asked batch fits, so the largest is at least it
    assert doc["prices_usd_per_hour"] == {"H100-80GB": 3.0, "A100-80GB": 1.8, "L40S": 1.5}


@pytest.mark.parametrize("job", [SERVE, TRAIN], ids=["serve", "train"])
def test_the_printed_flags_reproduce_a_fit_with_memest_hf(job):
    doc = json.loads(invoke("plan", *job, "--gpus-available", "8xL4,4xA100-80GB", "--json").stdout)
    assert doc["fits"]
    for f in doc["fits"]:
        hf = invoke("hf", *job, *shlex.split(f["flags"]), "--json")
        assert hf.exit_code == 0, hf.output
        again = json.loads(hf.stdout)
        assert again["fits"] is True
        assert again["needed_bytes"] == f["needed_bytes"]
        assert again["per_device"]["device_used_bytes"] == f["device_used_bytes"]  # one meaning per key
        assert again["device"]["count"] == f["count"]


def test_plan_table():
    out = invoke("plan", *TRAIN, "--gpu", "A100-80GB")
    assert out.exit_code == 0, out.output
    for text in ("A100-80GB", "$/h", "peak GiB/device", "free GiB", "largest that fits", "Cheapest: memest hf"):
        assert text in out.stdout
    assert "1 device type searched" in out.stdout


def test_plan_markdown_has_a_flags_column():
    out = invoke("plan", *SERVE, "--gpus-available", "8xH100", "--markdown")
    assert out.exit_code == 0, out.output
    assert "| # | devices | $/h |" in out.stdout and "`--gpu H100-80GB --gpus" in out.stdout


def test_cost_overrides_on_the_command_line_and_in_a_file(tmp_path):
    first = lambda out: json.loads(out.stdout)["fits"][0]["device"]
    base = ("plan", *SERVE, "--gpus-available", "8xH100,8xL40S", "--json")
    # catalog prices: 2 x H100 at tp 2 (2 x 3.0 $/h) ties with 4 x L40S at tp 4 (4 x 1.5 $/h); tp 2
    # communicates less. vLLM's 0.9 x 79.19 GiB budget leaves 3.65 GiB of KV on each H100, 5 requests.
    assert first(invoke(*base)) == "H100-80GB"
    assert first(invoke(*base, "--cost", "H100=4.0")) == "L40S"  # 8.0 $/h against 6.0
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"l40s": 0.5}))
    doc = json.loads(invoke(*base, "--costs", str(prices)).stdout)
    assert doc["fits"][0]["device"] == "L40S" and doc["prices_usd_per_hour"]["L40S"] == 0.5


def test_method_change_and_quantization_are_opt_in():
    plain = json.loads(invoke("plan", *TRAIN, "--gpu", "L4", "--max-gpus", "8", "--json").stdout)
    assert all(f["workload"]["method"] == "full" for f in plain["fits"])
    allowed = json.loads(invoke("plan", *TRAIN, "--gpu", "L4", "--max-gpus", "8", "--allow-method-change",
                                "--allow-batch-reshape", "--json").stdout)  # reshaping was on by default before
    assert allowed["fits"][0]["workload"]["method"] in ("lora", "qlora")
    # vLLM on an L4 (24 GiB) at tp > 1 holds 0.9 x 24 + 2.42 GiB (CUDA graphs, context, NCCL outside its
    # budget) > 24 GiB: the job asks for a smaller gpu_memory_utilization
    served = json.loads(invoke("plan", *SERVE, "--gpu-memory-utilization", "0.85", "--gpu", "L4", "--max-gpus", "8",
                               "--allow-quantization", "--json").stdout)
    assert served["fits"][0]["workload"]["quantization"] != "none"


def test_global_batch_size_flag_is_held():
    doc = json.loads(invoke("plan", *TRAIN, "--gpus-available", "16xH100", "--global-batch-size", "32", "--json").stdout)
    w = doc["fits"][0]["workload"]
    assert w["micro_batch_size"] * w["grad_accum_steps"] * w["parallelism"]["dp"] == 32


def test_searched_flags_are_noted_as_ignored():
    out = invoke("plan", *SERVE, "--gpu", "H100", "--gpus", "4", "--tp", "2")
    assert out.exit_code == 0
    assert "plan searches --gpus, --tp; the values given are ignored" in out.stderr


@pytest.mark.parametrize(("args", "message"), [
    (("--gpu", "H100", "--gpus-available", "8xH100"), "pass either --gpu NAME or --gpus-available SPEC"),
    (("--gpus-available", "8xH100,4xh100"), "--gpus-available lists H100-80GB twice"),
    (("--gpus-available", "0xH100"), "the count must be at least 1"),
    (("--max-gpus", "0",), "--max-gpus is 0"),
    (("--cost", "H100"), "--cost 'H100' must be NAME=USD"),
])
def test_plan_input_errors(args, message):
    out = invoke("plan", *SERVE, *args)
    assert isinstance(out.exception, InputError) and message in str(out.exception)


def test_hybrid_sharding_needs_its_group_size_when_the_count_is_searched():
    out = invoke("plan", *TRAIN, "--fsdp", "hybrid_shard", "--gpu", "H100")
    message = "plan with --fsdp hybrid_shard needs --dp-shard N"
    assert isinstance(out.exception, InputError) and message in str(out.exception)


def test_plan_errors_exit_2_with_one_line():
    out = run("plan", *SERVE, "--gpus-available", "8xH1000")
    assert out.returncode == 2
    assert out.stderr.startswith("Error: unknown device 'H1000'") and out.stderr.count("\n") == 1


def test_sweep_infers_training_from_seq_len_and_reports_the_boundary():
    out = invoke("sweep", "meta-llama/Llama-2-7b-hf", "--seq-len", "1k..128k", "--gpu", "H100", "--gpus", "8",
                 "--zero-stage", "3", "--recompute", "full", "--json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["setting"] == "seq_len" and [p["value"] for p in doc["points"]] == [1024 << i for i in range(8)]
    fits = [p["fits"] for p in doc["points"]]
    largest = doc["largest"]["value"]
    assert fits == [p["value"] <= largest for p in doc["points"]]
    for p in doc["points"]:
        allocated = sum(t["bytes"] for t in p["terms"] if t["kind"] not in ("allocator", "runtime"))
        assert allocated == p["allocated_bytes"] and sum(t["bytes"] for t in p["terms"]) == p["device_used_bytes"]


def test_sweep_table_has_a_column_per_point_and_a_row_per_term():
    out = invoke("sweep", "meta-llama/Llama-2-70b-hf", "--batch-size", "1,8,64", "--max-model-len", "4096",
                 "--gpu", "H100", "--gpus", "4")
    assert out.exit_code == 0, out.output
    header = next(line for line in out.stdout.splitlines() if "term" in line and "kind" in line)
    for label in ("1", "8", "64"):
        assert f" {label} " in header
    for row in ("weights", "kv_cache", "device used", "fits"):
        assert row in out.stdout
    assert "Largest --batch-size held at once:" in out.stdout  # vLLM queues the rest


def test_sweep_plot_file(tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "seq.png"
    out = invoke("sweep", "meta-llama/Llama-3.2-1B", "--seq-len", "1k..64k", "--gpu", "L4", "--plot", str(target))
    assert out.exit_code == 0, out.output
    assert target.read_bytes().startswith(b"\x89PNG")
    assert f"Plot written to {target}" in out.stderr


@pytest.mark.parametrize(("args", "message"), [
    ((), "give one setting a range, e.g. --seq-len 1k..128k"),
    (("--seq-len", "1k..4k", "--micro-batch-size", "1..4"), "sweep one setting at a time"),
    (("--serve", "--seq-len", "1k..4k"), "--seq-len is a training flag (tokens per training sequence); for serving use "
                                         "--max-model-len"),
    (("--seq-len", "4k..1k"), "the range ends below its start"),
])
def test_sweep_input_errors(args, message):
    out = invoke("sweep", "meta-llama/Llama-2-7b-hf", *args)
    assert isinstance(out.exception, InputError) and message in str(out.exception)


def test_plan_and_sweep_import_no_plotting_or_heavy_module():
    code = (
        "import sys, io, contextlib\n"
        "from typer.testing import CliRunner\n"
        "from memest.cli import app\n"
        "r = CliRunner()\n"
        "r.invoke(app, ['plan', 'meta-llama/Llama-2-7b-hf', '--gpu', 'H100'])\n"
        "r.invoke(app, ['sweep', 'meta-llama/Llama-2-7b-hf', '--seq-len', '1k..4k'])\n"
        "print(' '.join(m for m in ('matplotlib', 'torch', 'transformers', 'huggingface_hub') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""




def test_plan_prints_the_config_files_reading_notes(tmp_path):
    # Fresh-user report F6: a LLaMA-Factory YAML naming a DeepSpeed file that is not there. `memest hf` says so
    # (its settings are not read); `memest plan` printed no note at all. Now the table, Markdown and JSON carry the
    # same notes as `hf` does (the model's and the config reader's).
    config = tmp_path / "lf_ds3.yaml"  # LLaMA-Factory's own example, without the DeepSpeed file it names
    config.write_text((CONFIGS / "llamafactory" / "examples" / "train_lora" / "llama3_lora_sft_ds3.yaml").read_text())
    missing = "deepspeed names examples/deepspeed/ds_z3_config.json, not found"
    hf = run("hf", "--config", str(config), "--gpu", "A100-80GB", "--gpus", "8")
    assert missing in " ".join(hf.stdout.split()), hf.stdout
    for fmt in ((), ("--markdown",)):
        out = run("plan", "--config", str(config), "--gpus-available", "8xA100-80GB", *fmt)
        assert out.returncode == 0, out.stderr
        assert missing in " ".join(out.stdout.split()), out.stdout
    doc = json.loads(run("plan", "--config", str(config), "--gpus-available", "8xA100-80GB", "--json").stdout)
    assert any(missing in note for note in doc["notes"])


def test_more_setups_are_called_setups_and_counted_as_kept():
    # Fresh-user report F11: the search keeps the --top cheapest setups of each device type, so with --top 1 on two
    # device types it keeps 2 setups, one per type (Qwen2.5-0.5B full training, 0.49e9 params x 16 B = 7.4 GiB of
    # states, fits one A10G or one L4); the row beyond the one shown is a setup, not a device type.
    out = run("plan", "Qwen/Qwen2.5-0.5B", "--train", "--gpus-available", "4xA10G,2xL4", "--top", "1")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "device types fit" not in text
    assert "1 more setup found to fit (the search keeps the 1 cheapest setup of each device type" in text


def test_no_more_devices_suggested_where_one_is_the_most_a_job_uses():
    # F11: a Mac runs one job on one GPU (max_devices 1), so `2xM4-Max-128GB` searches one; Llama-3.1-70B full
    # training (70.6e9 params x 16 B of states = 1,051 GiB) fits no Mac, and more Macs would not help.
    out = run("plan", "meta-llama/Llama-3.1-70B", "--train", "--gpus-available", "2xM4-Max-128GB")
    text = " ".join(out.stdout.split())
    assert "Nothing fits within the search" in text and "--max-gpus" not in text
    assert "a job uses one Mac at most" in text and "M4-Max-128GB (up to 1)" in text
    # beside a device type that can grow, more devices are still suggested
    both = " ".join(run("plan", "meta-llama/Llama-3.1-70B", "--train", "--gpus-available", "2xM4-Max-128GB,2xL4").stdout.split())
    assert "allow more devices (--max-gpus, --gpus-available)" in both
