"""`memest hf` when a serving job does not fit: the capacity query, the recommendation and the hints agree.

- vLLM splits layers unevenly, so serving plans use any pipeline degree up to num_layers (DeepSeek-V3's 61
  layers are prime);
- the "fewest devices" query judges each layout by the verdict's own rule, and the recommendation finds a
  fit wherever that query did;
- a job that breaks only the device-capacity rule may lower ``--gpu-memory-utilization`` (free, lossless);
- a higher ``--gpu-memory-utilization`` is suggested only when some higher value fits;
- user values that are large (a micro-batch of 10^9) are handled without O(n) loops.

Expected values are derived by hand in comments or checked by brute force, not taken from memest's output.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memest.cli import app
from memest.devices import get_device
from memest.errors import InputError
from memest.estimate import estimate
from memest.estimate.serving.vllm.engine import vllm_ranks
from memest.planning.costs import Cost, PriceTable
from memest.planning.fit import verdict
from memest.planning.maxfit import largest_utilization
from memest.planning.recommend import _own_setup_cost, assess, recommend
from memest.planning.search import MAX_PP_QUERY, DeviceChoice, Space, plan, smallest_parallelism
from memest.report import serving_lines
from memest.sources import load_model
from memest.workload import Parallelism, ServingConfig, TrainingConfig, divisors, validate

HEADROOM = 0.10
H100 = get_device("H100")
T4 = get_device("T4")
GiB = 1 << 30


def _fits(spec, w, device) -> bool:
    return verdict(estimate(spec, w, device), device, w.parallelism.world_size, HEADROOM).fits


# ---- serving plans: any pp up to num_layers ----


def test_the_serving_estimate_splits_stages_as_vllm_does():
    # DeepSeek-V3: 61 layers over 4 stages; vLLM gives the remainder 1 to partitions[-2]: 15, 15, 16, 15
    spec = load_model("deepseek-ai/DeepSeek-V3")
    ranks = vllm_ranks(spec, ServingConfig(parallelism=Parallelism(tp=8, pp=4)), H100)
    assert [r.stage.num_layers for r in ranks] == [15, 15, 16, 15]


def test_deepseek_v3_serving_plan_on_h100_uses_two_uneven_stages():
    # 61 layers is prime: with pp dividing the layers only pp 1 or 61 would be tried. The fp8 checkpoint is
    # 671e9 params ~ 625 GiB, over 8 x 79.19 = 633 GiB with the unquantized parts, the KV pool and the runtime,
    # so 8 H100s cannot serve it (checked below by the verdict) while 16 can. At 16 devices the layouts are
    # tp 8 x pp 2 (communication 3 + 2 x 1 = 5), tp 4 x pp 4 (2 + 4 = 6), tp 2 x pp 8 (1 + 6 = 7) and
    # tp 1 x pp 16 (8): tp 8 x pp 2 is the cheapest, if it fits.
    spec = load_model("deepseek-ai/DeepSeek-V3")
    asked = ServingConfig()
    assert not _fits(spec, asked.replace(parallelism=Parallelism(tp=8)), H100)
    assert _fits(spec, asked.replace(parallelism=Parallelism(tp=8, pp=2)), H100)
    result = plan(spec, asked, Space(devices=(DeviceChoice(H100, 1024),), allow_quantization=True), headroom=HEADROOM,
                  max_queries=False)
    assert result.best is not None
    par = result.best.setup.workload.parallelism
    assert (result.best.setup.count, par.tp, par.pp) == (16, 8, 2)


def test_training_plans_keep_even_stages():
    # Training stays Megatron-style: pp divides num_layers. DeepSeek-V2-Lite has 27 layers = 3^3, so every
    # pp the planner picks is 1, 3, 9 or 27.
    spec = load_model("deepseek-ai/DeepSeek-V2-Lite")
    asked = TrainingConfig(micro_batch_size=1, seq_len=2048)
    devices = tuple(DeviceChoice(get_device(d), 64) for d in ("L4", "T4", "A10G"))
    result = plan(spec, asked, Space(devices=devices, allow_offload=False), headroom=HEADROOM, max_queries=False)
    assert result.fits
    for f in result.fits:
        assert spec.num_layers % f.setup.workload.parallelism.pp == 0


# ---- the fewest-devices query uses the verdict's rule ----


FEWEST_CASES = [
    pytest.param("meta-llama/Llama-3.1-70B", ServingConfig(max_model_len=32768, batch_size=16), "T4", id="70b-T4"),
    pytest.param("meta-llama/Llama-3.1-70B", ServingConfig(max_model_len=8192, batch_size=4), "H100", id="70b-H100"),
    pytest.param("deepseek-ai/DeepSeek-V3", ServingConfig(), "H100", id="dsv3-H100"),
    pytest.param("meta-llama/Llama-3.1-405B", ServingConfig(max_model_len=131072, batch_size=8), "L4", id="405b-L4"),
    pytest.param("meta-llama/Llama-2-70b-hf", ServingConfig(), "H100", id="llama2-70b-H100"),
    pytest.param("Qwen/Qwen2-7B", ServingConfig(max_model_len=32768, batch_size=8), "RTX-4090", id="qwen2-7b-4090"),
]


@pytest.mark.parametrize(("model", "asked", "device"), FEWEST_CASES)
def test_fewest_devices_is_the_smallest_layout_the_verdict_accepts(model, asked, device):
    # brute force over the layouts the query documents: tp a power of two dividing a node, pp a power of
    # two up to MAX_PP_QUERY (and the layers); each judged by memest.planning.fit.verdict
    spec, device = load_model(model), get_device(device)
    fitting = []
    for tp in (t for t in (1, 2, 4, 8, 16, 32, 64) if device.per_node % t == 0):
        for pp in (p for p in (1, 2, 4, 8, 16) if p <= min(MAX_PP_QUERY, spec.num_layers)):
            w = asked.replace(parallelism=Parallelism(tp=tp, pp=pp))
            try:
                validate(spec, w)
            except InputError:
                continue
            if _fits(spec, w, device):
                fitting.append(tp * pp)
    par = smallest_parallelism(spec, asked, device, headroom=HEADROOM)
    if not fitting:
        assert par is None
    else:
        assert par is not None and par.world_size == min(fitting)
        assert _fits(spec, asked.replace(parallelism=par), device)


def test_fewest_devices_never_names_a_setup_the_verdict_rejects():
    # The reported case: 70B, 16 x 32k tokens on 32 T4s at tp 8 x pp 4 holds 15.50 GiB of a 14.75 GiB T4
    # (rule 3), so the fewest-devices answer cannot be that very layout.
    spec = load_model("meta-llama/Llama-3.1-70B")
    asked = ServingConfig(max_model_len=32768, batch_size=16, parallelism=Parallelism(tp=8, pp=4))
    assert not _fits(spec, asked, T4)
    par = smallest_parallelism(spec, asked, T4, headroom=HEADROOM)
    assert par is None or (par.tp, par.pp) != (8, 4)


# ---- the recommendation finds what the capacity line found ----


COVER_CASES = [
    # DeepSeek-V3 on 8 H100s: the capacity line finds tp 8 x pp 2 (16 devices)
    pytest.param("deepseek-ai/DeepSeek-V3", ServingConfig(parallelism=Parallelism(tp=8)), "H100", id="dsv3-8xH100"),
    # 405B with 8 x 128k tokens on one L4: the capacity line needs 128 L4s, past the 1 x 2^6 = 64 searched before
    pytest.param("meta-llama/Llama-3.1-405B", ServingConfig(max_model_len=131072, batch_size=8), "L4", id="405b-L4"),
    pytest.param("meta-llama/Llama-2-70b-hf", ServingConfig(), "H100", id="llama2-70b-1xH100"),
]


@pytest.mark.parametrize(("model", "asked", "device"), COVER_CASES)
def test_the_recommendation_finds_a_fit_wherever_the_capacity_line_did(model, asked, device):
    spec, device = load_model(model), get_device(device)
    a = assess(spec, asked, device)
    assert not a.verdict.fits and a.fewest is not None and a.recommendation is not None
    lossless = a.recommendation.lossless
    assert lossless is not None
    # the planner ranks money first: the lossless fit uses no more devices than the capacity line's layout
    assert lossless.devices <= a.fewest.world_size
    assert _fits(spec, lossless.workload, device) and lossless.verdict.fits
    assert a.recommendation.cheapest is not None and a.recommendation.cheapest.verdict.fits


def test_deepseek_v3_on_8_h100s_cli():
    out = CliRunner().invoke(app, ["hf", "deepseek-ai/DeepSeek-V3", "--serve", "--gpu", "H100", "--gpus", "8"])
    text = " ".join(out.output.split())
    assert "fewest devices for 1 x 163,840 tokens: tp 8 x pp 2 (16 x H100-80GB)" in text
    assert "No setup within the search fits" not in text
    assert "Cheapest fit: --gpus 16 --pp 2" in text


# ---- a lower gpu_memory_utilization when only the device's capacity is exceeded ----


def test_largest_lower_utilization_by_hand():
    # 70B on 32 T4s, tp 8 x pp 4, 16 x 32,768 tokens. vLLM 0.19 holds ceil(C x u) + what sits outside its
    # budget: the CUDA graphs, the CUDA context and the NCCL communicators (fit.py rule 3).
    spec = load_model("meta-llama/Llama-3.1-70B")
    asked = ServingConfig(max_model_len=32768, batch_size=16, parallelism=Parallelism(tp=8, pp=4))
    est = estimate(spec, asked, T4)
    terms = {t.name: t.bytes for t in est.per_device.terms}
    outside = terms["runtime.cuda_graphs"] + terms["runtime.cuda_context"] + terms["runtime.nccl"]
    capacity = T4.memory_bytes  # 14.75 GiB = 15,837,691,904 B
    # rule 3 at 0.90: ceil(0.9 C) + outside = 14,253,922,714 + 2,389,075,565 > C (over by ~0.75 GiB)
    assert math.ceil(0.9 * capacity) + outside > capacity
    # largest u on the 0.01 grid with ceil(C u) + outside <= C: (C - outside) / C = 13,448,616,339 / C = 0.849..
    best = math.floor((capacity - outside) / capacity * 100) / 100
    assert best == 0.84
    # and the KV pool still holds the batch at 0.84: ceil(0.84 C) = 13,303,661,200 minus the non-KV 7.39e9 B
    # leaves 5.91e9 B, 17 requests of 32,768 x 10,240 B/token (tp 8: 8 KV heads x 128 x 2 x 2 B x 20 layers
    # / 8 = 10,240) = 335,544,320 B each, >= 16
    assert largest_utilization(spec, asked, T4, headroom=HEADROOM) == best
    rec = recommend(spec, asked, T4, HEADROOM)
    assert rec.cheapest is not None and rec.cheapest is rec.lossless
    assert rec.cheapest.flags == "--gpu-memory-utilization 0.84"
    assert rec.cheapest.devices == 32 and rec.cheapest.lossless and rec.cheapest.verdict.fits


def test_the_utilization_candidate_is_costed_like_a_planner_setup():
    # tp 8 x pp 4 on 32 T4s at $0.40: money 32 x 0.40 = 12.80; communication log2(8) x 1 + log2(4) x 2 = 7;
    # no disruption; changes: tp, pp and the utilization = 3
    w = ServingConfig(parallelism=Parallelism(tp=8, pp=4))
    assert _own_setup_cost(w, 32 * 0.40) == Cost(12.80, 7.0, 0.0, 3)
    # with an fp8 KV cache asked: + 2 disruption (costs table) and one more change
    assert _own_setup_cost(w.replace(kv_cache_dtype="fp8"), 12.80) == Cost(12.80, 7.0, 2.0, 4)


def test_the_utilization_candidate_ranks_with_the_planners_setups():
    # The planner searches counts from the one asked: when a same-price layout with less communication fits
    # at the utilization asked, it wins; the utilization candidate wins when nothing cheaper fits.
    spec = load_model("meta-llama/Llama-3.1-70B")
    asked = ServingConfig(max_model_len=32768, batch_size=16, parallelism=Parallelism(tp=8, pp=4))
    rec = recommend(spec, asked, T4, HEADROOM)
    price = PriceTable.catalog().price(T4)
    found = plan(spec, asked, Space(devices=(DeviceChoice(T4, 32 << 6, 32),), lossless_only=True), headroom=HEADROOM,
                 max_queries=False)
    own = _own_setup_cost(rec.lossless.workload, 32 * price)
    assert found.best is None or own < found.best.setup.cost


@pytest.mark.parametrize(("model", "asked", "device"), [
    pytest.param("meta-llama/Llama-3.1-70B", ServingConfig(max_model_len=32768, batch_size=16,
                                                           parallelism=Parallelism(tp=8, pp=4)), "T4", id="70b-T4"),
    pytest.param("meta-llama/Llama-3.1-70B", ServingConfig(max_model_len=8192, gpu_memory_utilization=0.85,
                                                           parallelism=Parallelism(tp=2)), "H100", id="70b-tp2-H100"),
    pytest.param("meta-llama/Llama-2-70b-hf", ServingConfig(), "H100", id="llama2-70b-1xH100"),
    pytest.param("meta-llama/Llama-3.1-8B", ServingConfig(max_model_len=131072, batch_size=2), "L4", id="8b-L4-128k"),
    pytest.param("Qwen/Qwen2.5-0.5B", ServingConfig(max_model_len=32768, batch_size=64), "T4", id="qwen-0.5b-T4"),
])
def test_largest_utilization_matches_a_scan_of_every_value(model, asked, device):
    spec, device = load_model(model), get_device(device)
    fitting = [k for k in range(1, 101) if _fits(spec, asked.replace(gpu_memory_utilization=k / 100), device)]
    expected = max(fitting) / 100 if fitting else None
    assert largest_utilization(spec, asked, device, headroom=HEADROOM) == expected
    below = [k for k in fitting if k / 100 < asked.gpu_memory_utilization]
    assert largest_utilization(spec, asked, device, headroom=HEADROOM, below=asked.gpu_memory_utilization) == (
        max(below) / 100 if below else None)


def test_t4_case_cli():
    out = CliRunner().invoke(app, ["hf", "meta-llama/Llama-3.1-70B", "--serve", "--max-model-len", "32768",
                                   "--batch-size", "16", "--gpu", "T4", "--gpus", "32", "--tp", "8", "--pp", "4"])
    text = " ".join(out.output.split())
    assert "DOES NOT FIT" in text and "lower --gpu-memory-utilization (0.84 fits)" in text
    assert "fewest devices for 16 x 32,768 tokens: tp 8 x pp 4" not in text
    assert "Cheapest fit: --gpu-memory-utilization 0.84" in text
    again = CliRunner().invoke(app, ["hf", "meta-llama/Llama-3.1-70B", "--serve", "--max-model-len", "32768",
                                     "--batch-size", "16", "--gpu", "T4", "--gpus", "32", "--tp", "8", "--pp", "4",
                                     "--gpu-memory-utilization", "0.84"])
    assert "FITS" in again.output and "DOES NOT FIT" not in again.output


# ---- a higher gpu_memory_utilization only when one fits ----


def test_no_higher_utilization_when_the_weights_cannot_fit():
    # Llama-2-70B in bf16 on one H100: 68.98e9 params x 2 B = 137.96e9 B = 128.5 GiB of weights alone, more
    # than the whole 79.19 GiB device: no gpu_memory_utilization up to 1.0 starts vLLM
    spec = load_model("meta-llama/Llama-2-70b-hf")
    assert spec.num_params * 2 > H100.memory_bytes
    a = assess(spec, ServingConfig(), H100, device_given=False)
    assert a.utilization is None
    text = " ".join(line for line, _ in serving_lines(a))
    assert "vLLM would refuse to start" in text and "higher --gpu-memory-utilization" not in text


def test_a_higher_utilization_is_suggested_with_the_value_that_fits():
    # 70B at tp 2 on H100s, 8k tokens: 70.55e9 x 2 B / 2 = 65.7 GiB of weights per device; at 0.85 the
    # budget 0.85 x 79.19 = 67.3 GiB leaves nothing for KV once the activation peak and non-torch memory are
    # counted, while 0.95 (75.2 GiB) leaves several GiB (tests/test_serving_engine.py)
    spec = load_model("meta-llama/Llama-3.1-70B")
    asked = ServingConfig(max_model_len=8192, gpu_memory_utilization=0.85, parallelism=Parallelism(tp=2))
    a = assess(spec, asked, H100)
    assert a.estimate.serving.engine_error == "no_memory"
    assert a.utilization is not None and a.utilization > 0.85
    assert _fits(spec, asked.replace(gpu_memory_utilization=a.utilization), H100)
    text = " ".join(line for line, _ in serving_lines(a))
    assert f"a higher --gpu-memory-utilization ({a.utilization:.2f} fits)" in text


# ---- no O(n) loops over user values ----


def test_divisors_by_hand_and_against_a_scan():
    assert divisors(1) == [1]
    assert divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]  # a square: 6 once
    assert divisors(97) == [1, 97]  # a prime
    for n in range(1, 400):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    # 10^9 = 2^9 x 5^9: (9 + 1) x (9 + 1) = 100 divisors, found in sqrt(10^9) ~ 31,623 steps
    big = divisors(10**9)
    assert len(big) == 100 and big[0] == 1 and big[-1] == 10**9 and big == sorted(big)


def test_a_huge_micro_batch_is_recommended_on_without_hanging():
    spec = load_model("meta-llama/Llama-2-7b-hf")
    start = time.monotonic()
    a = assess(spec, TrainingConfig(micro_batch_size=10**9), H100)
    assert time.monotonic() - start < 60
    assert not a.verdict.fits and a.recommendation is not None
    cheapest = a.recommendation.cheapest
    if cheapest is not None:  # the per-replica batch is held: micro-batch x accumulation = 10^9
        assert cheapest.workload.micro_batch_size * cheapest.workload.grad_accum_steps == 10**9


def test_a_huge_default_tp_error_is_quick():
    # --gpus 1000000007 (a prime) serves with tp 1000000007 by default, which does not divide 32 heads; the
    # suggested tp comes from the divisors of 1000000007 (1 and itself, found in ~31,623 steps, where a scan
    # of every number up to it took about a minute): only 1 divides the heads
    start = time.monotonic()
    out = CliRunner().invoke(app, ["hf", "meta-llama/Llama-2-7b-hf", "--serve", "--gpus", "1000000007"])
    assert time.monotonic() - start < 10
    assert out.exit_code != 0 and "--tp 1 --dp 1000000007" in str(out.exception)


DS_Z3_OFFLOAD = """{
  "bf16": {"enabled": "auto"},
  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"},
                        "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                        "stage3_param_persistence_threshold": "auto"},
  "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"
}"""



def test_lora_above_full_says_the_terms_that_grow_not_activations(tmp_path):
    # Fresh-user report F12: LLaMA-Factory LoRA under DeepSpeed ZeRO-3 with parameter and optimizer offload and
    # full recompute on 8 A100s. LoRA's device used is a hair above --train's, but not for activations (each layer's
    # input copies live only inside the recomputed layer): DeepSpeed's reduce bucket, reduce_bucket_size "auto" =
    # hidden_size² = 4,096² = 16,777,216 elements, holds the fp32 adapters' gradients at 4 B (64 MiB) where a full
    # fine-tune's bf16 ones take 2 B (32 MiB): +33,554,432 B; ZeRO-3's persistent parameters (<= 10 x 4,096 = 40,960
    # elements: each r=8 adapter matrix, 8 x 4,096 = 32,768) add the adapters whole on every rank in fp32.
    from memest.api import estimate_values
    from memest.workload import Method, resolve

    # LLaMA-Factory's own example (lora_rank 8, lora_target all, cutoff_len 2048, batch 1 x 2), its DeepSpeed file
    # replaced by the offloading one above
    (tmp_path / "examples" / "deepspeed").mkdir(parents=True)
    (tmp_path / "examples" / "deepspeed" / "ds_z3_config.json").write_text(DS_Z3_OFFLOAD)
    example = Path(__file__).resolve().parent / "data" / "configs" / "llamafactory" / "examples" / "train_lora"
    (tmp_path / "lf.yaml").write_text((example / "llama3_lora_sft_ds3.yaml").read_text())
    a = estimate_values(None, resolve.complete({"config": (str(tmp_path / "lf.yaml"),), "gpus": 8,
                                                "gpu": "A100-80GB"})).result
    lora = a.estimate.per_device
    full = estimate(a.spec, a.workload.replace(method=Method.FULL), a.verdict.device).per_device

    def named(rank, name):
        return sum(t.bytes for t in rank.terms if t.name == name)

    def kind(rank, k):
        return sum(t.bytes for t in rank.terms if t.kind is k)

    from memest.result import Kind

    assert lora.device_used_bytes > full.device_used_bytes
    assert named(lora, "workspace.reduce_bucket") - named(full, "workspace.reduce_bucket") == 16_777_216 * 2
    assert kind(lora, Kind.ACTIVATIONS) <= kind(full, Kind.ACTIVATIONS)
    said = [n for n in a.notes if "than full fine-tuning" in n]
    assert len(said) == 1 and "outgrow" not in said[0] and "not for its activations" in said[0], said
    assert "workspace.reduce_bucket" in said[0] and "weights.persistent" in said[0]
