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


def test_data_parallel_replicas_each_hold_their_share() -> None:
    """``--batch-size`` counts the job's sequences; each of the dp replicas is its own engine with its own
    pool of K = 49 sequences (``_held_by_hand``: the replica's pool is the one-replica pool, the device and
    the per-device weights being the same) and serves ceil(N / dp) of them. At N = 100: dp 1 holds 49,
    dp 2 holds 2 x 49 = 98 of 100 (each asked ceil(100 / 2) = 50 > 49: queues), dp 3 holds 3 x 49 = 147
    (each asked ceil(100 / 3) = 34 <= 49: fits)."""
    from memest.workload import Parallelism

    spec = load_model(MODEL)
    k = _held_by_hand(estimate(spec, _job(1), L4).serving.kv_budget_bytes)
    assert k == 49  # the case below rests on it: 2 x 49 < 100 <= 3 x 49
    for dp, held, kind in ((1, 49, "queues"), (2, 98, "queues"), (3, 147, "fits")):
        est = estimate(spec, _job(100).replace(parallelism=Parallelism(dp=dp)), L4)
        v = verdict(est, L4, dp, 0.10)
        assert (v.held_sequences, v.asked_sequences, v.kind) == (held, 100, kind), dp
    # the shortfall of dp 2 is one replica's: 50 requests x 32,768 x 12,288 B less its KV budget
    est = estimate(spec, _job(100).replace(parallelism=Parallelism(dp=2)), L4)
    assert verdict(est, L4, 2, 0.10).shortfall_bytes == 50 * LEN * 12_288 - est.serving.kv_budget_bytes


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_cli_replicas_raise_the_sequences_held(dp: int) -> None:
    """Llama-3.1-8B on L4s at 32,768 tokens: one request's KV is 32,768 x (32 layers x 2 x 8 KV heads x 128 x 2 B =
    131,072 B) = 4 GiB; vLLM's budget 0.90 x 22.49 GiB = 20.24 GiB less 14.96 GiB of weights leaves under 5.3 GiB,
    so each replica holds 1 request and dp replicas hold dp of the 8 asked, 8 / dp asked of each."""
    args = ["hf", "meta-llama/Llama-3.1-8B", "--serve", "--gpu", "L4", "--gpus", str(dp), "--dp", str(dp),
            "--batch-size", "8", "--max-model-len", str(LEN)]
    doc = json.loads(run_memest(*args, "--json").stdout)
    assert doc["concurrency"] == {"held": dp, "asked": 8, "tokens": LEN} and doc["verdict"] == "queues"
    out = " ".join(run_memest(*args, env=WIDE).stdout.split())
    each = f"{dp} replicas x 1 each, {8 // dp} asked of each; " if dp > 1 else ""
    assert f"STARTS: vLLM holds {dp} of 8 concurrent sequences at 32,768 tokens ({each}the rest wait)" in out


def test_the_fix_of_a_replicated_job_keeps_its_replicas() -> None:
    """Llama-3.1-8B, 2 replicas on L4s, 8 sequences of 32,768 tokens asked at once: each replica must hold 4, whose
    KV is 4 x 4 GiB = 16 GiB, and with 14.96 GiB of weights that is more than one L4's 20.24 GiB, so each replica
    needs 2 L4s (7.48 GiB of weights and 8 GiB of KV per device): the lossless fit is 4 L4s as 2 replicas of 2,
    never one replica of 4 (the printed fix names no --dp, so the user's --dp 2 stays)."""
    from memest.workload import Parallelism

    s = ServingConfig(max_model_len=LEN, batch_size=8, parallelism=Parallelism(dp=2))
    rec = assess(load_model("meta-llama/Llama-3.1-8B"), s, L4, hold_batch=True).recommendation
    fit = rec.lossless
    assert fit.devices == 4 and fit.workload.parallelism.dp == 2 and fit.verdict.fits
    assert fit.workload.parallelism.tp * fit.workload.parallelism.pp == 2 and "--dp" not in fit.flags
