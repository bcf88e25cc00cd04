"""The fit rule for vLLM (memest/planning/fit.py): vLLM starts with its gpu_memory_utilization, its KV pool
holds batch_size requests of max_model_len, and what it holds on the device stays within capacity;
--headroom is not applied to vLLM and the output says so. Training and transformers generate keep
the headroom rule.

The vLLM expectations come from case vllm019_llama31_8b_tp1 of benchmarks/data/validation_cases.json
(vLLM 0.19 on one H100, 79.19 GiB visible, gpu_memory_utilization 0.95, max_model_len 8192): it
logged a requested budget of 75.23 GiB, 0.51 GiB of initial non-torch memory (the CUDA context,
outside the budget), 0.91 GiB of CUDA graphs (captured after the KV cache, outside the budget) and a
maximum concurrency of 58.11x at 8192 tokens.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from memest.cli import app
from memest.devices import get_device
from memest.estimate import estimate
from memest.planning.fit import usable_bytes, verdict
from memest.sources import load_model
from memest.workload import Engine, ServingConfig, TrainingConfig

GiB = 1 << 30
H100 = get_device("h100")  # 79.19 GiB, the case's visible memory
LOG_ROUNDING = 0.015
"""vLLM logs GiB with two decimals; a sum of three logged figures is known to +-0.015 GiB."""

CASE = ServingConfig(max_model_len=8192, gpu_memory_utilization=0.95, max_num_batched_tokens=8192, max_num_seqs=1024,
                     engine_version="0.19")
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _verdict(job: ServingConfig, headroom: float = 0.10):
    return verdict(estimate(load_model(MODEL), job, H100), H100, 1, headroom)


def test_vllm_footprint_is_its_budget_plus_what_sits_outside() -> None:
    v = _verdict(CASE.replace(batch_size=1))
    # measured: 75.23 (requested) + 0.51 (initial non-torch) + 0.91 (CUDA graphs) = 76.65 GiB
    assert v.needed_bytes / GiB == pytest.approx(75.23 + 0.51 + 0.91, abs=LOG_ROUNDING)
    assert not v.headroom_applied and v.usable_bytes == H100.memory_bytes
    assert v.fits and v.blocker is None


@pytest.mark.parametrize(("batch_size", "fits"), [(58, True), (59, False)], ids=["58-requests", "59-requests"])
def test_vllm_pool_must_hold_the_batch(batch_size: int, fits: bool) -> None:
    # maximum concurrency 58.11x at 8192 tokens: 58 requests of max_model_len fit at once, 59 do not
    v = _verdict(CASE.replace(batch_size=batch_size))
    assert v.fits is fits
    assert v.blocker == (None if fits else "concurrency")
    assert v.needed_bytes <= v.usable_bytes  # the memory fits either way; the pool decides
    # vLLM starts either way: with 59 it holds 58 at once and the 59th waits
    assert (v.kind, v.held_sequences, v.asked_sequences) == ("fits" if fits else "queues", 58, batch_size)


def test_vllm_over_capacity_when_the_budget_leaves_no_room_outside_it() -> None:
    # 0.99 x 79.19 = 78.40 GiB requested, plus 0.51 + 0.91 GiB outside = 79.82 GiB > 79.19 GiB
    v = _verdict(CASE.replace(gpu_memory_utilization=0.99))
    assert v.blocker is None and not v.fits
    assert v.needed_bytes / GiB == pytest.approx(0.99 * 79.19 + 0.51 + 0.91, abs=LOG_ROUNDING)


def test_vllm_that_would_not_start_does_not_fit() -> None:
    # Llama-3.1-70B: 70.6 B params x 2 B = 131.5 GiB of weights > 0.95 x 79.19 GiB on one device
    est = estimate(load_model("meta-llama/Llama-3.1-70B"), CASE, H100)
    v = verdict(est, H100, 1, 0.10)
    assert v.blocker == "no_memory" and not v.fits


@pytest.mark.parametrize("headroom", [0.0, 0.10, 0.50], ids=["0", "10pct", "50pct"])
def test_headroom_is_not_applied_to_vllm(headroom: float) -> None:
    v = _verdict(CASE.replace(batch_size=1), headroom)
    assert v.fits and v.usable_bytes == H100.memory_bytes and v.headroom == headroom


def test_headroom_still_applies_to_transformers_generate_and_training() -> None:
    spec = load_model(MODEL)
    for job in (ServingConfig(engine=Engine.HF, max_model_len=8192), TrainingConfig(micro_batch_size=1, seq_len=1024)):
        v = verdict(estimate(spec, job, H100), H100, 1, 0.25)
        assert v.headroom_applied and v.usable_bytes == usable_bytes(H100, 0.25) == int(0.75 * H100.memory_bytes)
        assert v.needed_bytes == estimate(spec, job, H100).per_device.device_used_bytes


def test_cli_says_headroom_is_not_applied_to_vllm() -> None:
    args = ["hf", MODEL, "--serve", "--gpu", "H100", "--max-model-len", "8192", "--gpu-memory-utilization", "0.95"]
    out = CliRunner().invoke(app, [*args, "--batch-size", "59", "--json"])
    doc = json.loads(out.stdout)
    assert doc["fits"] is False and doc["fit_blocker"] == "concurrency" and doc["headroom_applied"] is False
    assert doc["verdict"] == "queues" and doc["concurrency"] == {"held": 58, "asked": 59, "tokens": 8192}
    assert doc["usable_bytes"] == H100.memory_bytes
    text = CliRunner().invoke(app, [*args, "--batch-size", "58"], env={"COLUMNS": "400"}).output
    assert "FITS" in text and "--headroom 10% not applied" in text


def test_encoder_only_model_needs_no_kv_pool():
    # BERT keeps no KV cache: vLLM needs no pool for it, so 0.41 GiB of weights fit an H100 and the
    # scheduler's max_num_seqs (1024 on >= 70 GiB devices) bounds the requests, not the pool.
    from memest.devices import get_device
    from memest.estimate import estimate
    from memest.planning.fit import verdict
    from memest.sources import load_model
    from memest.workload import ServingConfig

    spec = load_model("google-bert/bert-base-uncased")
    device = get_device("H100-80GB")
    est = estimate(spec, ServingConfig(batch_size=64), device)
    assert est.serving.kv_cache_bytes_per_token == 0
    assert est.serving.largest_concurrency == 1024
    assert verdict(est, device, 1, 0.10).fits
    assert "weights.rope_cache" not in {t.name for t in est.terms}  # learned positions: no rotary cache


@pytest.mark.parametrize(("gpu", "max_model_len", "batch_size", "blocker"), [
    ("H100-80GB", 131_072, 1, "max_model_len"),
    ("H200-141GB", 32_768, 64, "concurrency"),
])
def test_margin_is_negative_when_vllm_would_not_serve(gpu, max_model_len, batch_size, blocker):
    # Llama-3.1-70B at tp 2: KV per token per device 2 x 80 layers x (8 KV heads / 2) x 128 x 2 B = 163,840 B;
    # the margin is minus what the pool lacks: batch_size x max_model_len x 163,840 - the KV budget
    from memest.workload import Parallelism

    s = ServingConfig(max_model_len=max_model_len, batch_size=batch_size, parallelism=Parallelism(tp=2))
    est = estimate(load_model("meta-llama/Llama-3.1-70B"), s, get_device(gpu))
    v = verdict(est, get_device(gpu), 2, 0.1)
    assert v.blocker == blocker and not v.fits
    assert v.needed_bytes < v.usable_bytes  # what the started engine would hold fits; the job does not
    assert v.margin_bytes == est.serving.kv_budget_bytes - batch_size * max_model_len * 163_840 < 0
