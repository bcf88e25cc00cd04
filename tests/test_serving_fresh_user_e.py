"""Serving defects a new user met: engines started on devices whose compute capability they refuse, Apple Macs
counted as many GPUs, llama.cpp given tensor/pipeline degrees it never reads, llama.cpp's concurrency taken
from the n_ctx it could grow to rather than its fixed slots, and llama.cpp's report lines worded for training."""

from __future__ import annotations

import os

import pytest

from memest.devices import DEVICES, get_device
from memest.planning.engines import compare_engines
from memest.planning.search import DeviceChoice, device_counts
from memest.sources import load_model
from memest.workload import Engine, ServingConfig
from tests.inprocess import run_memest

WIDE = {**os.environ, "COLUMNS": "400"}
LLAMA = "meta-llama/Llama-3.1-8B"


# -- compute capability (one rule: memest.workload.refusal) -------------------------------------------------
# Sources: vLLM vllm/platforms/cuda.py check_if_supports_dtype ("Bfloat16 is only supported on GPUs with
# compute capability of at least 8.0"); vllm/model_executor/layers/quantization/awq.py get_min_capability 75;
# fp8.py Fp8Config.get_min_capability 80; TensorRT-LLM support-matrix.md: Ampere SM80/86 runs FP32, FP16, BF16,
# INT8, INT4 (no FP8). Volta is compute capability 7.0, Turing 7.5, Ampere 8.0 (NVIDIA's CUDA GPUs table).
@pytest.mark.parametrize(("flags", "words"), [
    (["--gpu", "V100-32GB", "--dtype", "bf16"], ["V100-32GB", "volta", "7.0", "8.0", "--dtype"]),
    (["--gpu", "V100-32GB", "--quantization", "awq"], ["V100-32GB", "volta", "7.0", "Turing", "7.5"]),
    (["--gpu", "T4", "--quantization", "fp8"], ["T4", "turing", "7.5", "8.0"]),
    (["--engine", "trtllm", "--quantization", "fp8", "--gpu", "A100-80GB"],
     ["A100-80GB", "ampere", "Ada", "support-matrix.md"]),
])
def test_an_engine_is_refused_below_the_compute_capability_its_source_asks(flags, words) -> None:
    out = run_memest("hf", LLAMA, "--serve", *flags, env=WIDE)
    assert out.returncode == 2, out.stdout
    line = out.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    for word in words:
        assert word in line, (word, line)


@pytest.mark.parametrize(("flags"), [
    ["--gpu", "V100-32GB", "--dtype", "fp16"],          # fp16 runs on Volta
    ["--gpu", "T4", "--quantization", "awq"],           # 7.5 >= 7.5
    ["--gpu", "A100-80GB", "--quantization", "fp8"],    # vLLM: 8.0 >= 8.0 (Marlin weight-only)
    ["--engine", "trtllm", "--quantization", "fp8", "--gpu", "H100"],  # Hopper: FP8
])
def test_the_same_settings_on_a_capable_device_are_not_refused(flags) -> None:
    assert run_memest("hf", LLAMA, "--serve", *flags, env=WIDE).returncode == 0


def test_the_planner_proposes_no_quantization_a_device_cannot_run() -> None:
    # a V100 can run gptq / bitsandbytes under vLLM, not awq (7.5) or fp8 (8.0); the planner skips those
    # candidates instead of raising
    from memest.workload import refusal

    spec = load_model(LLAMA)
    v100 = get_device("V100-32GB")
    assert refusal(ServingConfig(quantization="awq"), v100) is not None
    assert refusal(ServingConfig(quantization="gptq"), v100) is None
    out = run_memest("plan", LLAMA, "--serve", "--quantization", "fp8", "--gpus-available", "T4,H100", env=WIDE)
    assert out.returncode == 0, out.stderr
    skipped = next(line for line in out.stdout.splitlines() if "does not run on" in line)
    assert "T4" in skipped and "H100" not in skipped
    assert "1 × H100-80GB" in out.stdout
    comparison = compare_engines(spec, ServingConfig(max_model_len=4096, quantization="fp8"),
                                 (DeviceChoice(get_device("T4"), max_count=8),))
    vllm_row = next(r for r in comparison.devices[0].rows if r.engine is Engine.VLLM)
    assert vllm_row.skipped and "compute capability 7.5" in vllm_row.skipped


# -- Apple: one GPU per machine ---------------------------------------------------------------------------
def test_an_apple_mac_is_one_device_per_job() -> None:
    out = run_memest("hf", LLAMA, "--serve", "--engine", "llama.cpp", "--gpu", "M3-Pro-36GB", "--gpus", "16",
                     env=WIDE)
    assert out.returncode == 2 and "M3-Pro-36GB" in out.stderr and "--gpus 1" in out.stderr
    assert "\n" not in out.stderr.strip()
    for mac in (d for d in DEVICES if d.vendor == "apple"):
        assert device_counts(mac, 64) == [1]
    out = run_memest("plan", LLAMA, "--serve", "--engine", "any", "--top", "3", "--max-model-len", "32768",
                     "--batch-size", "8", env=WIDE)
    assert out.returncode == 0
    macs = [d.name for d in DEVICES if d.vendor == "apple"]
    # no "16 x M3-Pro-36GB", "2 x M4-Max-64GB": each Mac appears as "1 x" only
    assert not [m for m in macs for n in (2, 4, 8, 16) if f"{n} x {m}" in out.stdout]
    assert "1 x M3-Ultra-512GB" in out.stdout


# -- llama.cpp never reads a tensor / pipeline degree --------------------------------------------------------
@pytest.mark.parametrize("flag", ["--tp", "--pp"])
def test_llamacpp_refuses_tp_and_pp(flag) -> None:
    out = run_memest("hf", LLAMA, "--serve", "--engine", "llama.cpp", flag, "2", "--gpus", "2", env=WIDE)
    assert out.returncode == 2
    assert flag in out.stderr and "--gpus 2" in out.stderr and "--tensor-split" in out.stderr
    assert run_memest("hf", LLAMA, "--serve", "--engine", "llama.cpp", "--gpus", "2", env=WIDE).returncode == 0


# -- llama.cpp's concurrency is its slots ----------------------------------------------------------------
def test_llamacpp_holds_its_slots_not_the_n_ctx_it_could_grow_to() -> None:
    # llama-server -c 262144 -np 8: n_ctx = 32,768 x 8 = 262,144 cells, split over 8 slots of 32,768 cells, one
    # sequence each: 8 sequences of 32,768 tokens at once on any device it starts on, however much memory is left
    spec = load_model(LLAMA)
    s = ServingConfig(max_model_len=32768, batch_size=8)
    comparison = compare_engines(spec, s, tuple(DeviceChoice(get_device(g), max_count=8)
                                                for g in ("A100-80GB", "H100-96GB", "H200", "B200")))
    for dev in comparison.devices:
        row = next(r for r in dev.rows if r.engine is Engine.LLAMACPP)
        assert row.kv_cache_tokens == 262144
        assert row.concurrent_sequences == (8 if row.verdict == "fits" else 0), (dev.device.name, row)
    assert any(next(r for r in d.rows if r.engine is Engine.LLAMACPP).verdict == "fits" for d in comparison.devices)


# -- llama.cpp's report lines --------------------------------------------------------------------------------
def test_llamacpp_report_words() -> None:
    args = ("hf", LLAMA, "--serve", "--engine", "llama.cpp", "--max-model-len", "32768", "--batch-size", "8")
    fits = run_memest(*args, "--gpu", "A100-80GB", env=WIDE)
    assert fits.returncode == 0 and "FITS" in fits.stdout
    assert "GGUF quants" not in fits.stdout  # F16 fits with 33/33 layers: no smaller type to suggest
    assert "offloaded states" not in fits.stdout
    assert "host RAM for what llama.cpp keeps on the CPU" in fits.stdout
    short = run_memest(*args, "--gpu", "A10G", env=WIDE)
    assert "GGUF quants" in short.stdout  # F16 does not fit on 24 GB: the quant search answers


# -- ModelOpt checkpoints (quant_method modelopt) --------------------------------------------------------------
# Layouts: vLLM vllm/model_executor/layers/quantization/modelopt.py ModelOptQuantConfigBase.from_config (commit
# 00155cde): hf_quant_config.json {"quantization": {"quant_algo", "kv_cache_quant_algo", "exclude_modules"}}, or
# config.json's flat quant_algo with "ignore".
def test_modelopt_quantization_configs_are_read() -> None:
    from memest.errors import ConfigError, InputError
    from memest.estimate.weights import scheme_of
    from memest.sources.quantization import modelopt_spec

    fp8 = modelopt_spec({"quant_method": "modelopt", "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8",
                                                                      "exclude_modules": ["lm_head"]}})
    assert (fp8.method, fp8.bits, fp8.strategy, fp8.skip_modules) == ("modelopt", 8, "tensor", ("lm_head",))
    nvfp4 = modelopt_spec({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                           "ignore": ["lm_head", "model.layers.0.mlp.gate"]})
    assert (nvfp4.bits, nvfp4.group_size, nvfp4.strategy) == (4, 16, "group")
    assert nvfp4.skip_modules == ("lm_head", "model.layers.0.mlp.gate")
    # NVFP4 bytes: a 4096 x 4096 matrix is 4096 x 4096 / 2 = 8,388,608 B of 4-bit values plus one 1-byte E4M3
    # scale per 16 inputs: 4096 x 256 = 1,048,576 B; 9,437,184 B in all
    assert scheme_of(nvfp4).tensor_bytes((4096, 4096)) == 9_437_184
    # FP8 per tensor: 1 B a weight plus one fp32 scale
    assert scheme_of(fp8).tensor_bytes((4096, 4096)) == 4096 * 4096 + 4
    with pytest.raises(ConfigError, match="quant_algo"):
        modelopt_spec({"quant_method": "modelopt", "quantization": {}})
    with pytest.raises(InputError, match="MIXED_PRECISION"):
        scheme_of(modelopt_spec({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}))


def test_nemotron_super_fp8_is_served_in_fp8() -> None:
    # the catalog keeps the release's hf_quant_config.json (quant_algo FP8) beside a config.json whose source left
    # quantization_config out; before, the weights were sized in bfloat16 (112.77 GiB per device at tp 2)
    import dataclasses

    from memest.estimate import estimate
    from memest.workload import Parallelism

    spec = load_model("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8")
    assert spec.quantization is not None and (spec.quantization.method, spec.quantization.bits) == ("modelopt", 8)
    s = ServingConfig(max_model_len=4096, parallelism=Parallelism(tp=2))
    h100 = get_device("H100")

    def weights(model) -> int:
        return next(t.bytes for t in estimate(model, s, h100).terms if t.name == "weights")

    fp8, bf16 = weights(spec), weights(dataclasses.replace(spec, quantization=None))
    # the routed experts alone: 40 MoE layers x 512 experts x (up + down, relu2) x 1024 (moe_latent_size) x 2688 =
    # 112,742,891,520 weights, 2 B -> 1 B each, half of them on each of the 2 ranks
    experts = 40 * 512 * 2 * 1024 * 2688
    assert experts == 112_742_891_520
    assert bf16 - fp8 >= experts // 2
    assert fp8 < 60 * 2**30 < 112 * 2**30 < bf16
