"""``memest check``: engine start-up logs read (memest.logs), compared with memest's estimate of the
same job (memest.check), and the command (memest/cli/check.py).

The log is the measurement: each parser test's expected values are copied from the log text itself
(a GiB figure is that number times 2^30, a MiB figure times 2^20). The logs are real: the vLLM excerpts
in tests/data/logs/ (sources in its README.md, and per test below), the SGLang and llama.cpp ones the
`log_excerpt` fields of benchmarks/data/engines.json, read through memest.validation. The end-to-end
comparisons hold memest's figures to the tolerances the validation tests use for the same cases.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("MEMEST_OFFLINE", "1")  # the models a log names resolve offline or not at all

import test_validation_engines as engines_tests
import test_validation_llamacpp as llamacpp_tests
import test_validation_serving as serving_tests

from memest.check import Row, check_log, gguf_file_type, largest_gap
from memest.devices import GiB, MiB
from memest.errors import InputError
from memest.logs import read_bytes, read_log
from memest.result import Kind
from memest.validation import cases, engines

LOGS = Path(__file__).resolve().parent / "data" / "logs"

V1_LOG = LOGS / "vllm019_llama31_8b_h100_16384.log"
"""llm-d-incubation/llm-d-planner accuracy/results/v0.19.0/logs/meta-llama-llama-3-1-8b--h100-80gb--tp1pp1dp1--16384.log
@ d3121e059da88662db39a926a3ead964be97359b (vLLM 0.19.0, H100 80GB)."""
V065_LOG = LOGS / "vllm065dev_llama3_8b_tp1.log"
"""vllm-project/vllm PR #10511, youkaichao's comment of 2024-12-14 (the tp 1 block)."""
V065_TP2_LOG = LOGS / "vllm065dev_llama3_8b_tp2.log"
"""The same comment's ``-tp 2`` block."""
SGLANG_ARGS_LOG = LOGS / "sglang_lmcache2400_qwen3_14b_server_args.log"
"""LMCache/LMCache issue #2400 (sammshen, 2026-01-14): an SGLang server_args line."""
V064_LOG = LOGS / "vllm064_llama31_8b_rtx3090_20k.log"
"""vllm-project/vllm issue #10517, kaspersiminski's comment of 2024-12-02 (the 20k block, RTX 3090)."""
V07_LOG = LOGS / "vllm07_llama32_11b_vision_h100.log"
"""vllm-project/vllm PR #12126, youkaichao's description of 2025-01-16."""
SGLANG_TOKENS_LINE = "KV Cache is allocated. #tokens: 367404, K size: 8.23 GB, V size: 8.23 GB"
"""vllm-project/vllm issue #21348 (MMuzzammil1, 2025-07-22): SGLang's newer allocation line, quoted alone."""


def gib(x: float) -> int:
    return round(x * GiB)


def mib(x: float) -> int:
    return round(x * MiB)


def _excerpt(case_id: str) -> str:
    case = next(c for c in json.loads(engines.CASES.read_text()) if c["id"] == case_id)
    ex = case["log_excerpt"]
    return ex if isinstance(ex, str) else "\n".join(ex)


def _case(case_id: str) -> dict:
    return next(c for c in json.loads(engines.CASES.read_text()) if c["id"] == case_id)


def _values(log) -> dict:
    return {k: f.value for k, f in log.figures.items()}


# ---- the parsers, on real logs ----


def test_vllm_v1_log() -> None:
    log = read_log(V1_LOG.read_text())
    assert (log.engine, log.format, log.version, log.model) == ("vllm", "vLLM V1", "0.19.0",
                                                                  "meta-llama/Llama-3.1-8B-Instruct")
    assert log.device_total_bytes == gib(79.19)  # 'total_memory=79.19GiB'
    assert _values(log) == {
        "weights": gib(14.99),  # 'Model loading took 14.99 GiB memory'
        "activation_peak": gib(1.89), "non_torch": gib(0.25), "non_kv": gib(17.12),  # 'Memory profiling takes ...'
        "requested": gib(75.23),  # 'Requested memory: 0.950000 (util), 75.23 GiB'
        "kv_cache_memory": gib(58.11),  # 'Available KV cache memory: 58.11 GiB'
        "kv_cache_tokens": 476_016,  # 'GPU KV cache size: 476,016 tokens'
        "max_concurrency": 29.05,  # 'Maximum concurrency for 16,384 tokens per request: 29.05x'
    }
    assert log.settings == {"tp": 1, "pp": 1, "max_model_len": 16384, "dtype": "bf16", "kv_cache_dtype": "auto",
                            "gpu_memory_utilization": 0.95, "max_num_batched_tokens": 8192, "max_num_seqs": 1024}


def test_vllm_v1_log_is_the_validation_case() -> None:
    """The same launch at max_model_len 8192 is vllm019_llama31_8b_tp1: the log's figures are that case's."""
    m = cases.cases_by_id()["vllm019_llama31_8b_tp1"]["measured"]
    got = _values(read_log(V1_LOG.read_text()))
    assert got["weights"] == gib(m["weights_GiB"]) and got["kv_cache_memory"] == gib(m["available_kv_cache_GiB"])
    assert got["activation_peak"] == gib(m["torch_activation_peak_increase_GiB"])
    assert got["kv_cache_tokens"] == m["kv_cache_tokens"]


def test_vllm_065_profile_table() -> None:
    log = read_log(V065_LOG.read_text())
    assert (log.format, log.model, log.version) == ("vLLM V0", "meta-llama/Meta-Llama-3-8B", None)  # 'vllm serve ...'
    assert log.device_total_bytes == gib(79.22) and log.settings == {"gpu_memory_utilization": 0.90}
    assert _values(log) == {"weights": gib(14.96), "non_torch": gib(1.79), "activation_peak": gib(1.26),
                            "requested": gib(71.29), "kv_cache_memory": gib(53.29)}


def test_vllm_serve_command_line() -> None:
    log = read_log(V065_TP2_LOG.read_text())  # '$ vllm serve meta-llama/Meta-Llama-3-8B -tp 2'
    assert (log.model, log.settings) == ("meta-llama/Meta-Llama-3-8B", {"tp": 2, "gpu_memory_utilization": 0.90})
    assert _values(log) == {"weights": gib(7.48), "non_torch": gib(3.58), "activation_peak": gib(1.26),
                            "requested": gib(71.29)}


def test_vllm_064_profile_line() -> None:
    log = read_log(V064_LOG.read_text())
    assert log.model is None and log.device_total_bytes == gib(23.58)
    assert log.settings == {"gpu_memory_utilization": 0.90, "max_model_len": 20000}
    # 'Loading model weights took 14.9888 GB' (vLLM's GB is bytes / 2^30), non_torch_memory=0.35GiB, kv_cache_size=3.81GiB;
    # 0.6.4's peak_torch_memory=17.06GiB is torch's allocated peak with the weights loaded (vllm/worker/worker.py
    # determine_num_available_blocks), so the activation peak is 17.06 - 14.9888 = 2.0712 GiB
    assert _values(log) == {"weights": gib(14.9888), "non_torch": gib(0.35), "kv_cache_memory": gib(3.81),
                            "kv_cache_blocks": 1952, "max_concurrency": 1.56,
                            "activation_peak": gib(17.06) - gib(14.9888)}
    assert log.figures["activation_peak"].line.startswith("Memory profiling results: total_gpu_memory=23.58GiB")


def test_vllm_064_peak_needs_the_weights_line() -> None:
    """Without the weights line the torch peak cannot be split: no activation peak is made up."""
    text = "\n".join(line for line in V064_LOG.read_text().splitlines() if "Loading model weights" not in line)
    assert "activation_peak" not in read_log(text).figures


def test_vllm_064_activation_peak_is_compared() -> None:
    c = check_log(read_log(V064_LOG.read_text()), model="meta-llama/Llama-3.1-8B-Instruct", gpu="RTX-3090")
    assert "activation_peak" in {r.figure for r in c.rows} and "activation_peak" not in c.not_logged


def test_vllm_064_log_gets_064_arithmetic() -> None:
    """0.6.4's one-line profile selects memest's 0.6.4 arithmetic; 0.6.5's profile table keeps 0.6."""
    c = check_log(read_log(V064_LOG.read_text()), model="meta-llama/Llama-3.1-8B-Instruct", gpu="RTX-3090")
    assert c.engine_version == "0.6.4"
    assert check_log(read_log(V065_LOG.read_text()), gpu="H100").engine_version == "0.6"
    # a banner naming 0.6.4 (or a 0.6.4 post release) keeps it; the one-line profile sets it under a 0.6 banner
    for banner in ("0.6.4", "0.6.4.post1"):
        text = f"INFO 12-02 10:00:00 api_server.py:585] vLLM API server version {banner}\n" + V064_LOG.read_text()
        log = read_log(text)
        assert log.version == banner
        assert check_log(log, model="meta-llama/Llama-3.1-8B-Instruct", gpu="RTX-3090").engine_version == "0.6.4"
    text = "INFO 12-13 19:54:00 api_server.py:585] vLLM API server version 0.6.5\n" + V065_LOG.read_text()
    assert check_log(read_log(text), gpu="H100").engine_version == "0.6"


def test_vllm_064_figures_by_hand() -> None:
    """vllm-project/vllm issue #10517's RTX 3090 log, every figure derived by hand.

    vLLM 0.6.4 (vllm/worker/worker.py ``determine_num_available_blocks``): KV = total x 0.90 - peak_memory,
    peak_memory = torch's allocated peak of the profile run (weights included) + non_torch, non_torch =
    (total - free) - torch allocated after ``empty_cache()``. The log: 23.58 x 0.90 - 17.06 - 0.35 = 3.81 GiB.
    """
    c = check_log(read_log(V064_LOG.read_text()), model="meta-llama/Llama-3.1-8B-Instruct", gpu="RTX-3090")
    rows = {r.figure: r for r in c.rows}
    # Profile run: max_model_len 20000 < 32k, so no chunked prefill: max_num_batched_tokens T = max(20000, 2048)
    # = 20000 tokens in max_num_seqs = 256 dummy sequences. Llama-3.1-8B: h = 4096, I = 14336, vocab 128256, bf16.
    # Forward peak at a layer's SiluAndMul: 3 h-sized tensors (the previous layer's output held by the model's
    # loop, the attention output, the residual) + gate_up 2 I + silu_and_mul's output I, per token:
    forward = (3 * 4096 + 3 * 14336) * 20000 * 2
    assert forward == 2_211_840_000
    # Sampler (smaller, so not the peak): final hidden 20000 x 4096 x 2 B + 256 rows x 128256 x (2 + 36) B
    assert 20000 * 4096 * 2 + 256 * 128256 * (2 + 36) == 1_411_514_368 < forward
    cublas = 4096 * 1024 * 2 + 16 * 1024 * 8  # Ampere: cuBLAS workspace 8.125 MiB
    activation = forward + cublas
    assert rows["activation_peak"].predicted == activation == 2_220_359_680  # 2.0679 GiB
    # logged: peak_torch_memory 17.06 GiB - 'Loading model weights took 14.9888 GB' = 2.0712 GiB: -0.16%
    assert rows["activation_peak"].measured == gib(17.06) - gib(14.9888)
    assert abs(rows["activation_peak"].error) <= serving_tests.ACTIVATION_TOLERANCE
    assert abs(rows["activation_peak"].error) < 0.003
    # non_torch: memest's CUDA context for Ampere, 0.51 GiB (an H100 measurement), no NCCL at tp=1; the log's
    # 0.35 GiB (358 MiB) is this RTX 3090's context: the known gap the check's notes name (+45.7%)
    context = round(0.51 * GiB)
    assert rows["non_torch"].predicted == context
    assert any(n.startswith("vLLM 0.6.4 measures non_torch_memory device-wide") for n in c.notes)
    # KV: floor(23.58 GiB x 0.90) - weights (memest's load, compared above) - activation - context
    weights = rows["weights"].predicted
    kv = int(gib(23.58) * 0.90) - weights - activation - context
    assert rows["kv_cache_memory"].predicted == kv
    # block: 16 tokens x 32 layers x (K + V) x 8 KV heads x 128 x 2 B = 2 MiB
    assert rows["kv_cache_blocks"].predicted == kv // (16 * 32 * 2 * 8 * 128 * 2)
    # the KV gap is the context gap alone: memest's KV is short by (0.51 - 0.35) GiB, within the log's
    # 0.01 GiB print rounding of kv_cache_size, non_torch_memory and peak_torch_memory
    gap = rows["kv_cache_memory"].measured - rows["kv_cache_memory"].predicted
    assert abs(gap - (context - rows["non_torch"].measured)) <= gib(0.015)


def test_vllm_064_non_torch_counts_nccl() -> None:
    """0.6.4's non-torch memory is measured device-wide: at tp=2 NCCL's buffers are in it besides the context."""
    from memest.devices import get_device
    from memest.estimate import runtime
    from memest.estimate.serving.vllm import budget

    h100 = get_device("H100")
    assert budget.non_torch_bytes("0.6.4", 1, last=True, pp=1, device=h100) == round(0.51 * GiB)
    assert budget.non_torch_bytes("0.6.4", 2, last=True, pp=1, device=h100) == round(0.51 * GiB) + 1 * GiB
    assert runtime.NCCL_BYTES == 1 * GiB
    assert budget.non_torch_bytes("0.6", 2, last=True, pp=1, device=h100) == round(3.58 * GiB)  # 0.6.5's, unchanged


def test_vllm_07_profile_line() -> None:
    log = read_log(V07_LOG.read_text())
    assert log.device_total_bytes == gib(79.22) and log.settings == {"gpu_memory_utilization": 0.90}
    assert _values(log) == {"weights": gib(19.86), "non_torch": gib(0.16), "activation_peak": gib(36.63),
                            "kv_cache_memory": gib(14.65), "requested": gib(71.29), "kv_cache_blocks": 6001}


def test_sglang_log() -> None:
    log = read_log(_excerpt("sglang042_llama31_8b_h100_default"))
    assert (log.engine, log.model, log.settings) == ("sglang", None, {})  # the excerpt has no server_args line
    assert _values(log) == {
        "weights": gib(78.81) - gib(63.72),  # 'Load weight begin. avail mem=78.81 GB' - '... end ... avail mem=63.72 GB'
        "k_size": gib(27.13), "v_size": gib(27.13),  # 'K size: 27.13 GB, V size: 27.13 GB' (GB = 2^30 B)
        "kv_cache_tokens": 444_500, "context_len": 131_072,  # 'max_total_num_tokens=444500, ..., context_len=131072'
    }


def test_sglang_server_args_and_mem_usage() -> None:
    """sglang0444_gemma3_4b_it_h200_default (sglang PR #4826): server_args, 'mem usage=8.13 GB', '#tokens: 834615'."""
    log = read_log(_excerpt("sglang0444_gemma3_4b_it_h200_default"))
    assert log.model == "google/gemma-3-4b-it"
    assert log.settings == {"kv_cache_dtype": "auto", "mem_fraction_static": 0.88, "chunked_prefill_size": 8192,
                            "page_size": 1, "tp": 1}
    assert _values(log) == {"weights": gib(8.13), "k_size": gib(54.12), "v_size": gib(54.12),
                            "kv_cache_tokens": 834_615}


def test_sglang_server_args_line() -> None:
    from memest.logs import sglang

    log = sglang.parse(SGLANG_ARGS_LOG.read_text())
    assert log.model == "Qwen/Qwen3-14B"
    assert log.settings == {"kv_cache_dtype": "auto", "mem_fraction_static": 0.835, "chunked_prefill_size": 8192}
    with pytest.raises(InputError, match=r"\(SGLang\) prints none of its memory figures"):
        read_log(SGLANG_ARGS_LOG.read_text(), "sglang.log")  # the excerpt stops before the weights load


def test_sglang_tokens_line() -> None:
    assert _values(read_log(SGLANG_TOKENS_LINE)) == {"k_size": gib(8.23), "v_size": gib(8.23),
                                                      "kv_cache_tokens": 367_404}


def test_llamacpp_log() -> None:
    log = read_log(_excerpt("llamacpp_b4715_pythia28b_q4_k_v100"))
    assert (log.engine, log.version, log.gpu) == ("llama.cpp", "4715", "Tesla V100-PCIE-16GB")
    assert log.model == "../models-mnt/pythia/2.8B/ggml-model-q4_k.gguf"  # '--model ...': a file, not a model id
    assert log.settings == {"max_model_len": 2048, "n_batch": 2048, "n_ubatch": 512, "flash_attn": False,
                            "kv_cache_dtype": "f16", "n_gpu_layers": 33,  # 'offloaded 33/33 layers to GPU'
                            "quantization": "q4_k_m"}  # 'file type = Q4_K - Medium'
    assert _values(log) == {"weights": mib(1632.95), "kv_buffer": mib(640.00), "kv_cache_memory": mib(640.00),
                            "compute_buffer": mib(162.00), "file_size": gib(1.66)}


def test_llamacpp_two_gpus_and_quantized_kv() -> None:
    """llama.cpp issue #11200's excerpt: the first GPU's buffers, two GPUs, a q8_0 KV cache."""
    log = read_log(_excerpt("llamacpp_b4462_qwen25coder32b_q8_0_kvq8_fa_2x3090ti"))
    assert log.settings == {"kv_cache_dtype": "q8_0", "gpus": 2}
    assert _values(log) == {"kv_buffer": mib(2788.00), "kv_cache_memory": mib(4352.00), "compute_buffer": mib(233.00)}


@pytest.mark.parametrize(("case_id", "file_type"), [
    ("llamacpp_b4715_pythia28b_f16_v100", "f16"),  # 'file type = all F32 (guessed)', 130 f16 tensors
    ("llamacpp_b4715_pythia28b_q2_k_v100", "q2_k"),  # 'Q2_K - Medium' is llama.cpp's name of Q2_K
    ("llamacpp_b4715_pythia28b_q3_k_v100", "q3_k_m"),
    ("llamacpp_b4715_pythia28b_q8_0_v100", "q8_0"),
])
def test_llamacpp_file_types(case_id: str, file_type: str) -> None:
    assert gguf_file_type(read_log(_excerpt(case_id)).settings["quantization"]) == file_type


# ---- the comparison ----

V1_TOLERANCE_KEYS = {"weights": "weights_GiB", "activation_peak": "torch_activation_peak_increase_GiB",
                     "non_torch": "non_torch_forward_increase_GiB", "requested": "instance_budget_GiB",
                     "kv_cache_memory": "available_kv_cache_GiB", "kv_cache_tokens": "kv_cache_tokens",
                     "kv_cache_blocks": "kv_cache_blocks", "max_concurrency": "max_concurrency_x_at_max_model_len",
                     "non_kv": "available_kv_cache_GiB"}
"""Each vLLM figure -> the key of tests/test_validation_serving.py's tolerance for it (non_kv, which that
test does not compare, is held to the KV pool's: the pool is the budget less it)."""


@pytest.mark.parametrize("gpu", [None, "H100"], ids=["device-from-log", "gpu-given"])
def test_vllm_v1_end_to_end(gpu: str | None) -> None:
    c = check_log(read_log(V1_LOG.read_text()), gpu=gpu)
    assert c.model == "meta-llama/Llama-3.1-8B-Instruct" and c.engine_version == "0.19"
    assert {r.figure for r in c.rows} == set(read_log(V1_LOG.read_text()).figures)
    for r in c.rows:
        tolerance = serving_tests.TOLERANCES[V1_TOLERANCE_KEYS[r.figure]]
        assert abs(r.error) <= tolerance, f"{r.figure}: memest {r.predicted} vs logged {r.measured} ({r.error:+.2%})"
    assert c.not_logged == ("kv_cache_blocks",)  # the log prints tokens, not blocks: compared without it


def test_vllm_065_end_to_end() -> None:
    c = check_log(read_log(V065_LOG.read_text()))
    assert c.engine_version == "0.6"  # the V0 worker's profile table
    keys = {"weights": "weights_GiB", "activation_peak": "activation_peak_GiB", "non_torch": "non_torch_memory_GiB",
            "requested": "instance_budget_GiB", "kv_cache_memory": "available_kv_cache_GiB"}
    assert {r.figure for r in c.rows} == set(keys)
    for r in c.rows:
        assert abs(r.error) <= serving_tests.TOLERANCES[keys[r.figure]], (r.figure, r.error)
    assert set(c.not_logged) == {"non_kv", "kv_cache_tokens", "kv_cache_blocks", "max_concurrency"}


def test_vllm_065_tp2_end_to_end() -> None:
    c = check_log(read_log(V065_TP2_LOG.read_text()), gpu="H100")
    keys = {"weights": "tp2_weights_per_gpu_GiB", "activation_peak": "tp2_activation_peak_GiB",
            "non_torch": "tp2_non_torch_per_gpu_GiB", "requested": "instance_budget_GiB"}
    assert {r.figure for r in c.rows} == set(keys)
    for r in c.rows:
        assert abs(r.error) <= serving_tests.TOLERANCES[keys[r.figure]], (r.figure, r.error)


def test_sglang_end_to_end() -> None:
    """sglang042_llama31_8b_h100_default: the excerpt names neither model nor version, so both are given."""
    c = check_log(read_log(_excerpt("sglang042_llama31_8b_h100_default")), model="meta-llama/Llama-3.1-8B-Instruct",
                  gpu="H100", engine_version="0.4")
    keys = {"weights": "weights_GiB (load begin - load end)", "k_size": "K_size_GB", "v_size": "V_size_GB",
            "kv_cache_tokens": "max_total_num_tokens", "context_len": "context_len"}
    assert {r.figure for r in c.rows} == set(keys)
    for r in c.rows:
        assert abs(r.error) <= engines_tests._tolerance(keys[r.figure]), (r.figure, r.error)


PYTHIA = [c["id"] for c in json.loads(engines.CASES.read_text()) if c["id"].startswith("llamacpp_b4715_pythia")]


@pytest.mark.parametrize("case_id", PYTHIA)
def test_llamacpp_end_to_end(case_id: str) -> None:
    """The ggml-org CI logs of pythia-2.8b (the log names a GGUF file, so the model is given)."""
    log = read_log(_excerpt(case_id))
    c = check_log(log, model="EleutherAI/pythia-2.8b")
    assert c.device.name == "V100-16GB"  # 'Device 0: Tesla V100-PCIE-16GB'
    keys = {"weights": "CUDA0_model_buffer_MiB", "kv_buffer": "CUDA0_KV_buffer_MiB", "kv_cache_memory": "KV_self_MiB",
            "compute_buffer": "CUDA0_compute_buffer_MiB", "file_size": "file_size_GiB"}
    measured = dict(_case(case_id)["measured"])
    measured.setdefault("KV_self_MiB", measured["K_f16_MiB"] + measured["V_f16_MiB"])  # 'KV self size = K + V'
    assert {r.figure for r in c.rows} == set(keys)
    for r in c.rows:
        unit = GiB if keys[r.figure].endswith("GiB") else MiB
        assert r.measured == round(measured[keys[r.figure]] * unit)  # the parser read the case's figure
        assert abs(r.error) <= llamacpp_tests._tolerance(keys[r.figure]), (r.figure, r.error)


def _row(figure: str, term: Kind | None, predicted: int, measured: int) -> Row:
    return Row(figure, term, predicted, measured, "bytes", "")


def test_largest_gap_names_the_term() -> None:
    # weights 1 GiB over, activations 0.1 GiB under: weights; vLLM's KV pool (2 GiB off) is the budget's
    # remainder, so it is not the term that explains the gap
    rows = (_row("weights", Kind.WEIGHTS, 16 * GiB, 15 * GiB), _row("activation_peak", Kind.ACTIVATIONS, GiB, GiB + GiB // 10),
            _row("kv_cache_memory", Kind.KV_CACHE, 50 * GiB, 52 * GiB))
    assert largest_gap("vllm", rows).figure == "weights"
    # llama.cpp's KV buffer is its own term: a 2 GiB gap there is the largest
    assert largest_gap("llama.cpp", rows).figure == "kv_cache_memory"
    assert largest_gap("vllm", ()) is None


def test_a_log_missing_figures_compares_the_rest() -> None:
    text = "\n".join(line for line in V1_LOG.read_text().splitlines()
                     if "Available KV cache memory" not in line and "Maximum concurrency" not in line)
    c = check_log(read_log(text))
    assert {r.figure for r in c.rows} == {"weights", "activation_peak", "non_torch", "requested", "non_kv",
                                          "kv_cache_tokens"}
    assert set(c.not_logged) == {"kv_cache_memory", "kv_cache_blocks", "max_concurrency"}


# ---- bad input (library) ----


def test_unknown_format_names_the_formats() -> None:
    with pytest.raises(InputError, match=r"formats read: TensorRT-LLM, SGLang, llama.cpp / Ollama, torchtitan, "
                                         r"torchtune, HF Trainer memory metrics, vLLM"):
        read_log("2026-01-01 12:00:00 INFO server started on port 8000\n", "app.log")


def test_empty_and_binary_files() -> None:
    with pytest.raises(InputError, match="^x.log: the log is empty"):
        read_bytes(b"  \n", "x.log")
    with pytest.raises(InputError, match="^x.bin: the log is a binary file"):
        read_bytes(b"\x7fELF\x00\x00\x01", "x.bin")


def test_a_model_not_resolvable_offline() -> None:
    text = V1_LOG.read_text().replace("meta-llama/Llama-3.1-8B-Instruct", "acme/not-a-model-7b")
    with pytest.raises(InputError, match=r"'acme/not-a-model-7b' is not in memest's offline catalog; pass it with model"):
        check_log(read_log(text))


def test_a_logged_model_outside_the_catalog() -> None:
    """gemma-3-4b-it is not in the offline catalog (tests/test_validation_engines.py marks its case so)."""
    with pytest.raises(InputError, match=r"'google/gemma-3-4b-it' is not in memest's offline catalog; pass it with model"):
        check_log(read_log(_excerpt("sglang0444_gemma3_4b_it_h200_default")))


def test_a_path_resolves_by_its_last_components() -> None:
    text = V1_LOG.read_text().replace("'meta-llama/Llama-3.1-8B-Instruct'", "'/models/meta-llama/Llama-3.1-8B-Instruct'")
    assert check_log(read_log(text)).model == "meta-llama/Llama-3.1-8B-Instruct"


# ---- the command ----


def _cli(*args: str):
    from inprocess import run_memest

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"HF_HUB_OFFLINE": "1", "MEMEST_DEBUG": ""}
    return run_memest("check", *args, env=env)


def test_cli_table_and_json() -> None:
    out = _cli(str(V1_LOG), str(V065_LOG))
    assert out.returncode == 0, out.stderr
    assert "58.11 GiB" in out.stdout and "53.29 GiB" in out.stdout and "Largest gap: " in out.stdout
    data = json.loads(_cli(str(V1_LOG), "--json").stdout)
    assert len(data) == 1 and data[0]["engine"] == "vllm"
    tokens = next(f for f in data[0]["figures"] if f["figure"] == "kv_cache_tokens")
    assert tokens["logged"] == 476_016 and tokens["line"].endswith("GPU KV cache size: 476,016 tokens")
    pool = next(f for f in data[0]["figures"] if f["figure"] == "kv_cache_memory")
    assert pool["logged"] == gib(58.11) and isinstance(pool["memest"], int)  # integer bytes


def test_cli_reads_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(V065_LOG.read_bytes())))
    out = _cli("-", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)[0]["model"] == "meta-llama/Meta-Llama-3-8B"


@pytest.mark.parametrize(("content", "fragment"), [
    (b"hello\nworld\n", "is not a start-up or training log memest reads (formats read: TensorRT-LLM, SGLang, "
                       "llama.cpp / Ollama, torchtitan, torchtune, HF Trainer memory metrics, vLLM"),
    (b"", "is empty"),
    (b"\x00\x01\x02binary", "is a binary file"),
    (V064_LOG.read_bytes(), "log does not name its model; pass it with --model"),
    (V1_LOG.read_bytes().replace(b"meta-llama/Llama-3.1-8B-Instruct", b"acme/not-a-model-7b"),
     "'acme/not-a-model-7b' is not in memest's offline catalog; pass it with --model"),
])
def test_cli_bad_logs(tmp_path: Path, content: bytes, fragment: str) -> None:
    path = tmp_path / "engine.log"
    path.write_bytes(content)
    out = _cli(str(path))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], out.stderr


def test_cli_missing_file_and_a_folder(tmp_path: Path) -> None:
    out = _cli(str(tmp_path / "nope.log"))
    assert out.returncode == 2 and out.stderr.strip() == (f"Error: {tmp_path / 'nope.log'}: does not exist; pass the "
                                                          "path of an engine's start-up log, or '-' for stdin")
    out = _cli(str(tmp_path))
    assert out.returncode == 2 and out.stderr.startswith(f"Error: {tmp_path}: is a directory;"), out.stderr


def test_cli_model_given_for_a_log_without_one() -> None:
    out = _cli(str(V064_LOG), "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "RTX-3090", "--json")
    assert out.returncode == 0, out.stderr
    assert {f["figure"] for f in json.loads(out.stdout)[0]["figures"]} == {
        "weights", "activation_peak", "non_torch", "kv_cache_memory", "kv_cache_blocks", "max_concurrency"}


def test_cli_one_bad_log_hides_no_other(tmp_path: Path) -> None:
    """Each good log is compared, each bad one named in one line on stderr (in the order given), exit 2."""
    missing = tmp_path / "nope.log"
    out = _cli(str(V064_LOG), str(V1_LOG), str(missing), "--gpu", "H100")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    words = " ".join(out.stdout.split())  # the title wraps where the log's path length puts it
    assert "vLLM V1 0.19.0 log" in words and "58.11 GiB" in words  # the good log's table
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 2, out.stderr
    assert lines[0].startswith(f"Error: {V064_LOG}: the vLLM V0 log does not name its model; pass it with --model")
    assert lines[1].startswith(f"Error: {missing}: does not exist")
    out = _cli(str(V1_LOG), str(V064_LOG), "--json")
    assert out.returncode == 2
    data = json.loads(out.stdout)  # the good ones' items and an errors list
    assert list(data) == ["checks", "errors"] and [c["log"] for c in data["checks"]] == [str(V1_LOG)]
    assert data["checks"][0] == json.loads(_cli(str(V1_LOG), "--json").stdout)[0]
    assert [e["log"] for e in data["errors"]] == [str(V064_LOG)] and "pass it with --model" in data["errors"][0]["error"]


def test_check_logs_tries_every_log() -> None:
    """The library raises once every log was tried, keeping the ones it could check."""
    from memest import LogsFailed, check_logs

    with pytest.raises(LogsFailed) as info:
        check_logs({"a.log": V064_LOG.read_text(), "b.log": V1_LOG.read_text(), "c.log": ""})
    assert str(info.value).startswith("a.log: the vLLM V0 log does not name its model") and \
        str(info.value).endswith("(and 1 more log failed)")
    assert [c.log for c in info.value.checks] == ["b.log"]
    assert [(n, str(e)) for n, e in info.value.errors][1][1].startswith("c.log: the log is empty")


# ---- a model or device given, and the log's own ----


def test_a_different_model_given_is_refused_naming_both() -> None:
    """The log names Llama-3.1-8B-Instruct, which memest resolves: a 70B given for it is an error, not a
    +777% weights row."""
    with pytest.raises(InputError, match=r"^vllm.log: the log names the model 'meta-llama/Llama-3.1-8B-Instruct' but "
                                         r"model names 'meta-llama/Llama-3.1-70B'; model is for a log naming no model"):
        check_log(read_log(V1_LOG.read_text()), name="vllm.log", model="meta-llama/Llama-3.1-70B", gpu="H100")
    out = _cli(str(V1_LOG), "--gpu", "H100", "--model", "meta-llama/Llama-3.1-70B")
    assert out.returncode == 2 and out.stdout == "", out.stdout
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "but --model names 'meta-llama/Llama-3.1-70B'; --model is for a log" in lines[0]


def test_the_same_model_given_is_accepted() -> None:
    """The base model has the instruct fine-tune's shapes: given for the log, it is the log's model."""
    c = check_log(read_log(V1_LOG.read_text()), model="meta-llama/Llama-3.1-8B")
    assert c.model == "meta-llama/Llama-3.1-8B-Instruct"


def test_a_different_gpu_given_is_refused_naming_both() -> None:
    """The llama.cpp log names 'Tesla V100-PCIE-16GB': an H100 given for it alone is an error."""
    log = read_log(_excerpt("llamacpp_b4715_pythia28b_q4_k_v100"))
    with pytest.raises(InputError, match=r"^s.log: the log names its accelerator 'Tesla V100-PCIE-16GB' "
                                         r"\(memest's V100-16GB\) but gpu names 'H100'"):
        check_log(log, name="s.log", model="EleutherAI/pythia-2.8b", gpu="H100")
    assert check_log(log, model="EleutherAI/pythia-2.8b", gpu="V100-16GB").device.name == "V100-16GB"


def test_model_and_gpu_apply_to_the_logs_naming_none(tmp_path: Path) -> None:
    """vLLM 0.19 names its model but no device; llama.cpp a GGUF file and its device: --model goes to the
    llama.cpp log, --gpu to the vLLM one, and each log keeps what it names (said in its notes)."""
    server = tmp_path / "server.log"
    server.write_text(_excerpt("llamacpp_b4715_pythia28b_q4_k_v100"))
    out = _cli(str(V1_LOG), str(server), "--model", "EleutherAI/pythia-2.8b", "--gpu", "H100", "--json")
    assert out.returncode == 0, out.stderr
    vllm, llama = json.loads(out.stdout)
    assert (vllm["model"], vllm["device"]) == ("meta-llama/Llama-3.1-8B-Instruct", "H100-80GB")
    assert (llama["model"], llama["device"]) == ("EleutherAI/pythia-2.8b", "V100-16GB")
    assert vllm["notes"][0].startswith("model: the log's own (meta-llama/Llama-3.1-8B-Instruct); the model given "
                                       "(EleutherAI/pythia-2.8b) is for the logs naming none")
    assert llama["notes"][0].startswith("device: the log's own (Tesla V100-PCIE-16GB); the accelerator given (H100)")


def test_title_of_a_log_naming_no_device() -> None:
    from rich.console import Console

    from memest.report.check import render_check

    console = Console(width=200, record=True)
    console.print(render_check(check_log(read_log(V1_LOG.read_text()))))
    # 'total_memory=79.19GiB' and no device name: a custom device of that memory
    text = " ".join(console.export_text().split())  # the title wraps at the table's width
    assert "meta-llama/Llama-3.1-8B-Instruct on the logged device (79.19 GiB), memest's" in text


def test_cli_a_job_memest_refuses(tmp_path: Path) -> None:
    """llama.cpp issue #11200's excerpt shows a q8_0 V cache but not its flash_attn line: memest refuses the job
    (llama.cpp quantizes V only with flash attention), in one line."""
    path = tmp_path / "server.log"
    path.write_text(_excerpt("llamacpp_b4462_qwen25coder32b_q8_0_kvq8_fa_2x3090ti"))
    out = _cli(str(path), "--model", "Qwen/Qwen2.5-32B", "--gpu", "RTX-3090")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "the job the log describes is not one memest estimates" in lines[0]


def test_every_figure_has_a_term_entry() -> None:
    """Each figure a parser may report (memest.logs.FIGURES) is mapped to the estimate's term it measures."""
    from memest.check import TERMS
    from memest.logs import FIGURES

    assert set(TERMS) == set(FIGURES)


# ---- a setting given against the log's own value; the largest gap among derived figures ----


def test_a_setting_contradicting_the_log_is_refused() -> None:
    """The V1 log states max_seq_len=16384 (its 'Initializing a V1 LLM engine' line): max_model_len=8192 would
    estimate another job against this one's figures, so it is refused naming both; the log's own value given
    again is no contradiction."""
    log = read_log(V1_LOG.read_text())
    assert log.settings["max_model_len"] == 16384
    with pytest.raises(InputError) as exc:
        check_log(log, gpu="H100", settings={"max_model_len": 8192})
    message = str(exc.value)
    assert "max_model_len=16384" in message and "8192" in message and "\n" not in message
    assert exc.value.field == "max_model_len"
    assert check_log(log, gpu="H100", settings={"max_model_len": 16384}).model == "meta-llama/Llama-3.1-8B-Instruct"


def test_llamacpp_layers_given_against_the_logged_offload() -> None:
    """'offloaded 33/33 layers to GPU': pythia-2.8b's 32 blocks and its output layer, all on the GPU. -ngl 10
    contradicts that; -ngl 99 is llama.cpp's 'every layer', the same 33 the log states."""
    log = read_log(_excerpt(PYTHIA[0]))
    assert log.settings["n_gpu_layers"] == 33
    with pytest.raises(InputError, match=r"n_gpu_layers=33.* 10\b"):
        check_log(log, model="EleutherAI/pythia-2.8b", settings={"n_gpu_layers": 10})
    assert check_log(log, model="EleutherAI/pythia-2.8b", settings={"n_gpu_layers": 99}).rows


def test_cli_refuses_a_contradicting_setting_in_one_line() -> None:
    out = _cli(str(V1_LOG), "--gpu", "H100", "--setting", "max-model-len=8192")
    assert out.returncode == 2 and out.stdout == "", out.stdout
    line = out.stderr.strip()
    assert "\n" not in line and "max_model_len=16384" in line and "--setting max-model-len" in line, line


def test_largest_gap_counts_what_the_terms_cannot_explain() -> None:
    # the reported table: weights 0.13 MiB under, the KV pool 617 MiB under, no other term printed: the
    # weights explain 0.13 MiB of the pool's 617 MiB, so the remaining 616.87 MiB is the largest gap
    rows = (_row("weights", Kind.WEIGHTS, 15 * GiB - 136_315, 15 * GiB),  # 0.13 MiB = 136,315 bytes
            _row("kv_cache_memory", Kind.KV_CACHE, 55 * GiB - 617 * MiB, 55 * GiB))
    assert largest_gap("vllm", rows).figure == "kv_cache_memory"
    # weights 1 GiB over and activations 1 GiB over: the pool 2 GiB under is their sum (2 - 2 = 0 left)
    rows = (_row("weights", Kind.WEIGHTS, 16 * GiB, 15 * GiB), _row("activation_peak", Kind.ACTIVATIONS, 2 * GiB, GiB),
            _row("kv_cache_memory", Kind.KV_CACHE, 50 * GiB, 52 * GiB))
    assert largest_gap("vllm", rows).figure == "weights"


def test_info_level_v1_log_names_the_kv_pool() -> None:
    """The V1 log's INFO lines only (a log at vLLM's default level prints no profile of activations or
    non-torch memory): its weights are within 0.1% while the pool is off by more than that (its budget is the
    device's total memory, which these lines do not print), so the KV cache is the term named."""
    lines = [line for line in V1_LOG.read_text().splitlines() if " INFO " in line]
    c = check_log(read_log("\n".join(lines)), gpu="H100")
    rows = {r.figure: r for r in c.rows}
    assert {"weights", "kv_cache_memory"} <= set(rows) and "activation_peak" not in rows
    weights, pool = rows["weights"], rows["kv_cache_memory"]
    assert abs(pool.predicted - pool.measured) > abs(weights.predicted - weights.measured)
    assert c.largest_gap is pool


def test_a_setting_the_log_leaves_open_takes_the_value_given() -> None:
    """torchtitan prints 'Applied selective activation checkpointing' for 'op' and for every N-th layer: memest's
    'op' is a pick (said in the notes), so a recompute given replaces it; the micro batch the log states
    ('local batch size 1'... of the debug log) is not open."""
    log = read_log((LOGS / "torchtitan_debugmodel_h200_fsdp8.log").read_text())
    assert log.settings["recompute"] == "selective_op" and log.assumed == ("recompute",)
    assert check_log(log, settings={"recompute": "full"}).rows
    with pytest.raises(InputError, match=rf"micro_batch_size={log.settings['micro_batch_size']}"):
        check_log(log, settings={"micro_batch_size": log.settings["micro_batch_size"] + 1})
