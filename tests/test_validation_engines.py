"""Every SGLang and TensorRT-LLM case of benchmarks/data/engines.json against memest, figure by figure,
and the engines' token arithmetic worked by hand.

Expected values are the logged figures (case ids cite them); the predictions come from
benchmarks/engine_cases.py, which also writes benchmarks/engine_cases.md. A case or figure that
memest cannot reproduce (model not in the offline catalog, a patched build, settings the log does
not show; the reasons are in engine_cases.EXPECTED_FAILURES) is a strict xfail.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("MEMEST_OFFLINE", "1")  # no Hub in tests

from memest.devices import GiB, MiB, get_device
from memest.errors import InputError
from memest.estimate import estimate
from memest.estimate.serving import largest_concurrency, largest_max_model_len
from memest.estimate.serving.sglang import budget as sg
from memest.estimate.serving.sglang.engine import sglang_ranks
from memest.estimate.serving.trtllm import budget as tb
from memest.planning.fit import verdict
from memest.sources import load_model
from memest.validation import engines as cases_module
from memest.workload import Engine, ServingConfig, validate

WEIGHTS_TOLERANCE = 0.01
"""Weights within 1% (the issue's goal)."""
KV_TOLERANCE = 0.02
"""KV tokens, blocks, K/V sizes and memory sizes (free memory, budgets) within 2% (the issue's goal)."""
EXACT = 0.0
"""Counts the engine derives by rule (its default fraction, request cap, context length, bytes per token)."""

TOLERANCES = {
    "weights_GiB (load begin - load end)": WEIGHTS_TOLERANCE, "weights_mem_usage_GB": WEIGHTS_TOLERANCE,
    "model_weights_GB": WEIGHTS_TOLERANCE,
    "mem_fraction_static (server_args)": EXACT, "max_running_requests_effective": EXACT, "context_len": EXACT,
    "kv_size_per_token_B": EXACT,
}


def _tolerance(figure: str) -> float:
    return TOLERANCES.get(figure, KV_TOLERANCE)


def _params() -> list:
    out = []
    for case in cases_module.load_cases():
        whole = cases_module.EXPECTED_FAILURES.get((case["id"], None))
        if whole:
            out.append(pytest.param(case, None, id=case["id"], marks=pytest.mark.xfail(strict=True, reason=whole)))
            continue
        for row in cases_module.comparisons(case):
            why = cases_module.expected_failure(case["id"], row.figure)
            marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
            out.append(pytest.param(case, row, id=f"{case['id']}-{row.figure}", marks=marks))
    return out


@pytest.mark.parametrize(("case", "row"), _params())
def test_engine_case(case: dict, row) -> None:
    if row is None:  # a whole case expected to miss: it must still fail to reproduce
        rows = cases_module.comparisons(case)
        assert all(abs(r.error) <= _tolerance(r.figure) for r in rows)
        return
    tolerance = _tolerance(row.figure)
    assert abs(row.error) <= tolerance, (
        f"{row.case} {row.figure}: predicted {row.predicted:.4f} vs logged {row.measured} "
        f"({row.error:+.2%}, tolerance {tolerance:.0%})")


def test_every_case_is_handled() -> None:
    ids = {c["id"] for c in cases_module.load_cases()}
    assert ids == set(cases_module.HANDLERS)
    assert len([i for i in ids if i.startswith("sglang")]) == 9 and len([i for i in ids if i.startswith("trtllm")]) == 4


# ---- SGLang's arithmetic by hand ----

LLAMA8B = "meta-llama/Llama-3.1-8B-Instruct"


def test_sglang_pool_tokens_by_hand() -> None:
    # rest = 0.88 x 78.81 GiB - 15.09 GiB = 54.2628 GiB (case sglang042_llama31_8b_h100_default's figures);
    # cell = 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 131,072 B;
    # tokens = floor(54.2628 x 2^30 / 131072) = floor(54.2628 x 8192) = 444,520 (logged 444,500: the
    # log rounds the free memory to 0.01 GiB).
    total, weights = round(78.81 * GiB), round(15.09 * GiB)
    p = sg.pool(total, 0.88, weights, 131072, page_size=1)
    assert p.tokens == (total * 88 // 100 - weights) // 131072
    assert abs(p.tokens - 444_520) <= 2
    assert p.kv_bytes == (p.tokens + 1) * 131072  # slot 0 padding


def test_sglang_page_size_and_cap() -> None:
    # 1,000,000 B left, 1,000 B per token: 1,000 tokens; pages of 64 -> 15 x 64 = 960; --max-total-tokens 500 -> 448
    p = sg.pool(10_000_000, 0.5, 4_000_000, 1000, page_size=64)
    assert p.rest == 1_000_000 and p.tokens == 960
    assert sg.pool(10_000_000, 0.5, 4_000_000, 1000, page_size=64, max_total_tokens=500).tokens == 448
    assert sg.pool(10_000_000, 0.4, 4_000_001, 1000, page_size=1).tokens == 0  # weights exceed the static share


def test_sglang_request_cap_and_table() -> None:
    # max_num_reqs = min(max(int(444412 / 131072 x 512), 2048), 4096) = min(max(1735, 2048), 4096) = 2048;
    # running = min(444412 // 2, 2048 + 1) = 2049 (case sglang042_llama31_8b_h100_default logs 2049);
    # table = 2049 x (131072 + 4) x 4 B = 1,074,298,896 B.
    assert sg.max_num_reqs(444_412, 131_072, None) == 2048
    assert sg.running_requests(444_412, 131_072, None) == 2049
    assert sg.req_to_token_bytes(444_412, 131_072, None) == 2049 * 131_076 * 4
    # Llama-2 at 4,096 context: int(87088 / 4096 x 512) = 10886 -> capped at 4096 -> 4097 (logged 4097)
    assert sg.running_requests(87_088, 4096, None) == 4097
    # --max-running-requests 200: table 201 rows, the scheduler runs min(200, 201) = 200 (case sglang045: 200)
    assert sg.running_requests(20_480, 8192, 200) == 200


def test_sglang_default_mem_fraction() -> None:
    h100 = get_device("H100-80GB")  # 79.19 GiB = 81,090.56 MiB
    # 0.4: by tp alone
    assert [sg.default_mem_fraction_static("0.4", h100, tp, 1, None) for tp in (1, 2, 4, 8, 16)] == \
        [0.88, 0.87, 0.85, 0.81, 0.79]
    # 0.5 on an H100 at tp 1: chunked 8192, cuda_graph_max_bs 256; reserved = 512 + 8192 x 1.5 + 256 x 2 + 1/8 x 1024
    # = 13,440 MiB (> the 10,240 floor); round((81090.56 - 13440) / 81090.56, 3) = round(0.83426, 3) = 0.834
    assert sg.default_mem_fraction_static("0.5", h100, 1, 1, None) == 0.834
    # tp 8: cuda_graph_max_bs 512; reserved = 512 + 12288 + 1024 + 1024 = 14,848 -> round(0.81690, 3) = 0.817
    assert sg.default_mem_fraction_static("0.5", h100, 8, 1, None) == 0.817
    # a 24 GiB card: chunked 2048, bs 24; reserved = 512 + 3072 + 48 + 128 = 3,760 MiB (no floor below 60 GiB)
    # -> round((24576 - 3760) / 24576, 3) = round(0.84701, 3) = 0.847
    card = get_device("24GiB")
    assert card.memory_bytes == 24 * 1024 * MiB
    assert sg.default_mem_fraction_static("0.5", card, 1, 1, None) == 0.847


def test_sglang_multimodal_factor() -> None:
    # 0.4 multiplies the fraction of a multimodal model by 0.95: 0.88 -> 0.836
    # (gemma-3 is Gemma3ForConditionalGeneration)
    assert sg.mem_fraction_static("0.4", None, 0.88, "Gemma3ForConditionalGeneration") == pytest.approx(0.836)
    assert sg.mem_fraction_static("0.4", 0.7, 0.88, "LlamaForCausalLM") == 0.7
    assert sg.mem_fraction_static("0.5", None, 0.834, "Gemma3ForConditionalGeneration") == 0.834  # not modelled in 0.5
    spec = load_model("google/gemma-3-27b-it")
    s = ServingConfig(engine=Engine.SGLANG, engine_version="0.4")
    assert sglang_ranks(spec, s, get_device("H200"))[0].pool.mem_fraction_static == pytest.approx(0.836)


def test_sglang_capacity_answers() -> None:
    # Llama-3.1-8B on an H100 at 0.88 (0.4): the pool holds T tokens; 8,192-token requests: T // 8192,
    # the longest length for 32 requests: T // 32 (page 1).
    spec = load_model(LLAMA8B)
    h100 = get_device("H100-80GB")
    s = ServingConfig(engine=Engine.SGLANG, engine_version="0.4", max_model_len=8192, batch_size=32)
    tokens = sglang_ranks(spec, s, h100)[0].pool.tokens
    assert largest_concurrency(spec, s, h100, 8192) == tokens // 8192
    assert largest_max_model_len(spec, s, h100, 32) == tokens // 32
    est = estimate(spec, s, h100)
    assert est.serving is not None and est.serving.kv_cache_tokens == tokens
    assert verdict(est, h100, 1, 0.1).fits
    # 60 requests of 8,192 tokens need 491,520 > ~444k tokens: the pool is the blocker
    crowded = verdict(estimate(spec, s.replace(batch_size=60), h100), h100, 1, 0.1)
    assert not crowded.fits and crowded.blocker == "concurrency"
    # the weights (15 GiB) above 0.15 x 78.7 GiB = 11.8 GiB: SGLang would not start
    starved = verdict(estimate(spec, s.replace(mem_fraction_static=0.15), h100), h100, 1, 0.1)
    assert not starved.fits and starved.blocker == "no_memory"


# ---- TensorRT-LLM's arithmetic by hand ----


def test_trtllm_blocks_by_hand() -> None:
    # case trtllm_019: 0.9 x 17.83 GiB = 16.047 GiB; 16.047 x 2^30 / 65,536 B = 262,912.x tokens;
    # // 32 = 8,216 blocks -> 262,912 tokens (logged 8,219 / 263,008: 17.83 is rounded to 0.01 GiB)
    p = tb.Pool(round(17.83 * GiB), 0.9, 65536, 32)
    assert p.available == int(round(17.83 * GiB) * 0.9)
    assert p.blocks == p.available // 65536 // 32 == 8216
    assert p.tokens == 8216 * 32 and p.allocated == 8216 * 32 * 65536
    assert p.blocks_per_request(2048) == 64 and p.blocks_per_request(2049) == 65
    assert tb.Pool(-5, 0.9, 65536, 32).blocks == 0  # non-KV memory beyond the device


def test_trtllm_capacity_answers() -> None:
    spec = load_model(LLAMA8B)
    h100 = get_device("H100-80GB")
    s = ServingConfig(engine=Engine.TRTLLM, max_model_len=4096, batch_size=16, max_batch_size=64)
    est = estimate(spec, s, h100)
    assert est.serving is not None
    blocks = est.serving.kv_cache_blocks
    # 4,096 tokens = 128 blocks of 32: blocks // 128 requests, at most max_batch_size 64
    assert largest_concurrency(spec, s, h100, 4096) == min(blocks // 128, 64)
    assert largest_max_model_len(spec, s, h100, 16) == min(blocks // 16 * 32, 131072)
    assert verdict(est, h100, 1, 0.1).fits


# ---- bad input ----


@pytest.mark.parametrize(("changes", "fragment"), [
    ({"mem_fraction_static": 1.2}, "mem_fraction_static is 1.2"),
    ({"kv_cache_free_gpu_mem_fraction": 0.0}, "kv_cache_free_gpu_mem_fraction is 0.0"),
    ({"tokens_per_block": 48}, "tokens_per_block 48 is not a power of two"),
    ({"page_size": 0}, "page_size is 0"),
    ({"max_batch_size": 8, "batch_size": 16}, "batch_size 16 is more than max_batch_size 8"),
    ({"max_running_requests": 4, "batch_size": 5}, "batch_size 5 is more than max_running_requests 4"),
    ({"engine_version": "0.3"}, "engine_version '0.3' is not a sglang version"),
])
def test_bad_engine_settings(changes: dict, fragment: str) -> None:
    # the library names settings by keyword (the CLI renders them as flags: test_cli_refuses below)
    spec = load_model(LLAMA8B)
    s = ServingConfig(engine=Engine.SGLANG).replace(**changes)
    with pytest.raises(InputError, match=fragment.replace("(", r"\(")):
        validate(spec, s)


def _cli(*args: str):
    from inprocess import run_memest

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"HF_HUB_OFFLINE": "1", "MEMEST_DEBUG": ""}
    return run_memest("hf", LLAMA8B, *args, env=env)


@pytest.mark.parametrize(("args", "fragment"), [
    (("--engine", "sglang", "--mem-fraction-static", "1.5"), "--mem-fraction-static is 1.5; it must be in (0, 1)"),
    (("--engine", "trtllm", "--tokens-per-block", "48"), "--tokens-per-block 48 is not a power of two"),
    (("--engine", "trtllm", "--mem-fraction-static", "0.8"), "--mem-fraction-static is a --engine sglang flag"),
])
def test_cli_refuses_bad_engine_settings(args, fragment) -> None:
    out = _cli(*args)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], out.stderr


def test_cli_reports_the_engine_arithmetic() -> None:
    import json

    out = _cli("--engine", "sglang", "--engine-version", "0.4", "--gpu", "H100", "--max-model-len", "8192", "--json")
    assert out.returncode == 0, out.stderr
    serving = json.loads(out.stdout)["serving"]
    # 0.88 x (79.19 - 0.51 context) GiB - 14.99 GiB weights = 54.25 GiB -> ~444k tokens of 131,072 B
    # (sglang042_llama31_8b_h100_default logs 444,500)
    assert serving["engine"] == "sglang" and abs(serving["kv_cache_tokens"] - 444_500) / 444_500 < KV_TOLERANCE
