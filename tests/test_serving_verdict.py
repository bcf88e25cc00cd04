"""Serving verdicts that say what happens (memest/planning/fit.py ``Verdict.kind``, memest/report/estimate.py):
an up-front engine that would start but whose KV pool holds K < N sequences of max_model_len "STARTS: holds K of N
concurrent sequences at L tokens (the rest wait)", exit 0 and no fix; ``--check`` demands all N at once (exit 3, the
fix shown); "DOES NOT FIT" only when the engine would refuse to start.

The small case: Qwen2.5-0.5B (24 layers, 2 KV heads, head_dim 64; memest/catalog/Qwen/Qwen2.5-0.5B/config.json)
under vLLM 0.19 on an L4 at max_model_len 32,768. K is derived by hand from the KV memory vLLM has left (the
budget is the input; the pool, K and the verdict are what is checked):

    KV bytes per token = 2 (K, V) x 24 layers x 2 heads x 64 x 2 B = 12,288 B
    page of one layer  = 16 tokens x 2 x 2 x 64 x 2 B = 8,192 B
    num_blocks         = available // 8,192 // 24 layers          (vLLM get_num_blocks)
    blocks per request = 32,768 / 16 = 2,048
    K                  = num_blocks // 2,048
"""

from __future__ import annotations

import json
import os

import pytest

from memest.devices import get_device
from memest.estimate import estimate
from memest.planning.fit import verdict
from memest.planning.recommend import assess
from memest.sources import load_model
from memest.workload import Engine, ServingConfig
from tests.inprocess import run_memest

L4 = get_device("L4")
MODEL = "Qwen/Qwen2.5-0.5B"
LEN = 32_768
WIDE = {**os.environ, "COLUMNS": "400"}  # one line per verdict
ARGS = ["hf", MODEL, "--serve", "--gpu", "L4", "--max-model-len", str(LEN), "--engine-version", "0.19"]


def _held_by_hand(available: int) -> int:
    num_blocks = available // 8_192 // 24
    return num_blocks // (LEN // 16)


def _job(batch_size: int, engine: Engine = Engine.VLLM) -> ServingConfig:
    return ServingConfig(max_model_len=LEN, batch_size=batch_size, engine=engine,
                         engine_version="0.19" if engine is Engine.VLLM else None)


def test_pool_holds_k_sequences_derived_by_hand() -> None:
    est = estimate(load_model(MODEL), _job(64), L4)
    s = est.serving
    assert s.kv_cache_bytes_per_token == 2 * 24 * 2 * 64 * 2 == 12_288
    k = _held_by_hand(s.kv_budget_bytes)
    assert s.kv_cache_blocks == s.kv_budget_bytes // 8_192 // 24
    v = verdict(est, L4, 1, 0.10)
    assert (v.held_sequences, v.asked_sequences, v.sequence_tokens) == (k, 64, LEN)
    assert 1 <= k < 64  # the case is what it is meant to be: starts, holds some, not all


def test_fewer_than_k_fit_and_more_queue() -> None:
    spec = load_model(MODEL)
    k = _held_by_hand(estimate(spec, _job(1), L4).serving.kv_budget_bytes)
    at_k = verdict(estimate(spec, _job(k), L4), L4, 1, 0.10)
    over = verdict(estimate(spec, _job(k + 1), L4), L4, 1, 0.10)
    assert at_k.kind == "fits" and at_k.fits and at_k.starts
    assert over.kind == "queues" and over.starts and not over.fits  # fits as asked means all N at once
    assert over.held_sequences == k and over.asked_sequences == k + 1


def test_sglang_queues_too() -> None:
    # SGLang's pool is in tokens (page_size 1): K = max_total_num_tokens // 32,768
    est = estimate(load_model(MODEL), _job(64, Engine.SGLANG), L4)
    v = verdict(est, L4, 1, 0.10)
    assert v.kind == "queues" and v.held_sequences == est.serving.kv_cache_tokens // LEN


def test_engine_that_would_not_start_does_not_fit() -> None:
    # Llama-3.1-70B: about 70.6 B params x 2 B = 131 GiB of weights, more than an L4's 22.5 GiB: no KV pool at all
    est = estimate(load_model("meta-llama/Llama-3.1-70B"), ServingConfig(max_model_len=8192), L4)
    v = verdict(est, L4, 1, 0.10)
    assert v.blocker == "no_memory" and v.kind == "does_not_fit" and not v.starts


def test_queued_job_gets_no_fix_unless_all_are_asked_for() -> None:
    spec = load_model(MODEL)
    assert assess(spec, _job(64), L4).recommendation is None
    rec = assess(spec, _job(64), L4, hold_batch=True).recommendation
    assert rec is not None and rec.cheapest is not None
    assert rec.cheapest.estimate.serving.largest_concurrency >= 64


def test_cli_words_exit_codes_and_json() -> None:
    k = _held_by_hand(estimate(load_model(MODEL), _job(1), L4).serving.kv_budget_bytes)
    plain = run_memest(*[*ARGS, "--batch-size", "64"], env=WIDE)
    assert plain.returncode == 0, plain.stderr
    assert f"STARTS: vLLM holds {k} of 64 concurrent sequences at 32,768 tokens (the rest wait)" in plain.stdout
    assert "DOES NOT FIT" not in plain.stdout and "Cheapest fit" not in plain.stdout
    checked = run_memest(*[*ARGS, "--batch-size", "64", "--check"], env=WIDE)
    assert checked.returncode == 3
    assert "Cheapest fit holding all 64 at once" in checked.stdout
    doc = json.loads(run_memest(*[*ARGS, "--batch-size", "64", "--json"]).stdout)
    assert doc["verdict"] == "queues" and doc["fits"] is False and doc["recommendation"] is None
    assert doc["concurrency"] == {"held": k, "asked": 64, "tokens": LEN}
    fits = run_memest(*[*ARGS, "--batch-size", str(k), "--check", "--json"])
    assert fits.returncode == 0 and json.loads(fits.stdout)["verdict"] == "fits"


@pytest.mark.parametrize("check", [False, True], ids=["plain", "check"])
def test_refused_start_still_says_does_not_fit(check: bool) -> None:
    # Llama-3.1-8B at 131,072 tokens on an L4: one request needs 131,072 x 131,072 B = 16 GiB of KV
    # (32 layers x 8 KV heads x 128 x 2 x 2 B per token), more than the L4's budget leaves after 15 GiB of weights
    out = run_memest(*["hf", "meta-llama/Llama-3.1-8B", "--serve", "--gpu", "L4", "--max-model-len", "131072",
                      *(["--check"] if check else [])], env=WIDE)
    assert out.returncode == (3 if check else 0)
    assert "DOES NOT FIT: vLLM would refuse to start" in out.stdout


def test_sweep_says_which_batches_queue() -> None:
    # the pool does not depend on the batch: K (derived above) held at once, K + 1 starts and queues one
    k = _held_by_hand(estimate(load_model(MODEL), _job(1), L4).serving.kv_budget_bytes)
    out = run_memest("sweep", MODEL, "--serve", "--gpu", "L4", "--max-model-len", str(LEN), "--engine-version", "0.19",
                     "--batch-size", f"{k},{k + 1}", env=WIDE)
    assert out.returncode == 0, out.stderr
    fits_row = next(line for line in out.stdout.splitlines() if line.strip("│ ").startswith("fits"))
    assert "yes" in fits_row and "queues" in fits_row and "NO" not in fits_row
    assert f"Largest --batch-size held at once: {k}; with {k + 1} the engine starts" in out.stdout
