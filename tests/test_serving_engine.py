"""vLLM's budget arithmetic, engine defaults, start-up errors, inverse queries; HF generate; CLI."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from memest.cli import app
from memest.devices import get_device
from memest.errors import InputError
from memest.estimate import estimate
from memest.estimate.serving import largest_concurrency, largest_max_model_len
from memest.estimate.serving.vllm import budget as vllm_budget
from memest.estimate.serving.vllm.engine import vllm_ranks
from memest.planning.search import smallest_parallelism
from memest.sources import load_model
from memest.workload import Engine, Parallelism, ServingConfig

GiB = 1 << 30
H100 = get_device("H100-80GB")


def test_budget_v019_is_ceil_of_utilization_minus_non_kv() -> None:
    # request_memory(): ceil(total x util); available = requested - weights - peak - non_torch
    b = vllm_budget.budget("0.19", H100, 0.95, weights=10 * GiB, activation=2 * GiB, non_torch=GiB // 4)
    requested = math.ceil(H100.memory_bytes * 0.95)
    assert b.requested == requested
    assert b.available == requested - 10 * GiB - 2 * GiB - GiB // 4


@pytest.mark.parametrize(
    ("device", "version", "expected"),
    [("H100-80GB", "0.19", (8192, 1024)), ("A100-80GB", "0.19", (2048, 256)), ("L4", "0.19", (2048, 256)),
     ("H100-80GB", "0.6", (8192, 256)), ("H100-80GB", "0.2", (8192, 256))],
    ids=["h100-v019", "a100-v019", "l4-v019", "v06", "v02"],
)
def test_engine_defaults(device: str, version: str, expected: tuple[int, int]) -> None:
    # vLLM 0.19 EngineArgs.get_batch_defaults for `vllm serve`; V0: max(max_model_len, 2048) / 256
    s = vllm_budget.engine_settings(version, get_device(device), 8192, None, None,
                                    spec=load_model("meta-llama/Llama-3.1-8B-Instruct"))
    assert (s.max_num_batched_tokens, s.max_num_seqs) == expected


@pytest.mark.parametrize(
    ("version", "max_model_len", "given", "expected"),
    [("0.6", 65536, None, 512), ("0.6.4", 65536, None, 512), ("0.6", 32768, None, 32768),
     ("0.6", 32769, None, 512), ("0.6", 65536, 4096, 4096), ("0.2", 65536, None, 65536),
     ("0.6", 8192, None, 8192)],
    ids=["v06-64k", "v064-64k", "v06-32k-boundary", "v06-32k-plus-one", "v06-user-wins", "v02-no-chunking",
         "v06-8k"],
)
def test_v0_chunked_prefill_batch(version: str, max_model_len: int, given: int | None, expected: int) -> None:
    # vllm/engine/arg_utils.py create_engine_config at v0.6.4-v0.6.6: chunked prefill on by default when
    # max_model_len > 32768 (a text-only model, CUDA, no sliding window); vllm/config.py SchedulerConfig: then
    # max_num_batched_tokens = 512, else max(max_model_len, 2048); a --max-num-batched-tokens given is kept
    spec = load_model("meta-llama/Llama-3.1-8B-Instruct")
    s = vllm_budget.engine_settings(version, H100, max_model_len, given, None, spec=spec)
    assert (s.max_num_batched_tokens, s.max_num_seqs) == (expected, 256)


def test_v0_chunked_prefill_exceptions() -> None:
    # create_engine_config leaves chunked prefill off (so T = max(max_model_len, 2048)) for a multimodal model,
    # a model with a sliding window, a device that is not CUDA-like, and (0.6.5+, memest's 0.6) embedding models
    llama = load_model("meta-llama/Llama-3.1-8B-Instruct")
    vl = load_model("Qwen/Qwen2.5-VL-7B-Instruct")  # vision tower: multimodal
    gemma2 = load_model("google/gemma-2-9b")  # sliding_window 4096 on alternate layers
    assert vllm_budget.v0_chunked_prefill("0.6", llama, H100, 65536)
    assert not vllm_budget.v0_chunked_prefill("0.6", vl, H100, 65536)
    assert not vllm_budget.v0_chunked_prefill("0.6", gemma2, H100, 65536)
    assert not vllm_budget.v0_chunked_prefill("0.6", llama, get_device("TPU-v5e"), 65536)
    assert vllm_budget.v0_chunked_prefill("0.6.4", llama, get_device("MI300X"), 65536)  # ROCm is device_type cuda
    assert not vllm_budget.v0_chunked_prefill("0.19", llama, H100, 65536)  # V1 is not asked
    assert vllm_budget.engine_settings("0.6", H100, 65536, None, None, spec=vl).max_num_batched_tokens == 65536
    # a multimodal model's batch is at least _MULTIMODAL_MODEL_MAX_NUM_BATCHED_TOKENS = 5120 (V0)
    assert vllm_budget.engine_settings("0.6", H100, 4096, None, None, spec=vl).max_num_batched_tokens == 5120
    assert vllm_budget.engine_settings("0.6", H100, 4096, None, None, spec=llama).max_num_batched_tokens == 4096
    assert vllm_budget.engine_settings("0.6", H100, 4096, 3000, None, spec=vl).max_num_batched_tokens == 3000


def test_v06_long_context_pool_by_hand() -> None:
    """Llama-3.1-8B, max_model_len 65,536, one H100 80GB, vLLM 0.6 (V0, util 0.9): chunked prefill is on, so the
    profile run holds 512 tokens in 256 sequences of 2 (model_runner.profile_run), not 65,536."""
    spec = load_model("meta-llama/Llama-3.1-8B-Instruct")
    s = ServingConfig(engine_version="0.6", max_model_len=65536, gpu_memory_utilization=0.9)
    (r,) = vllm_ranks(spec, s, H100)
    h, I, V, T, N = 4096, 14336, 128256, 512, 256
    # forward: V0 eager layer at SiluAndMul, 3 h + (2 I gate_up + I) per token, bf16
    forward = (3 * h + 3 * I) * T * 2
    assert forward == 56_623_104 == r.peak.forward  # 54 MiB (it was 7.25 GB with T = 65,536)
    # sampler: final hidden T x h x 2 B + N rows x V x (2 B logits + 36 B of sampler buffers): now the larger
    sampler = T * h * 2 + N * V * (2 + 36)
    assert sampler == 1_251_868_672 == r.peak.sampler
    activation = sampler + 32 * (1 << 20)  # + the 32 MiB Hopper cuBLAS workspace
    assert r.peak.total == activation == 1_285_423_104  # 1.197 GiB
    # KV pool = floor(79.19 GiB x 0.9) - weights - activation - 1.79 GiB non-torch (0.6, tp 1)
    non_torch = round(1.79 * GiB)
    available = math.floor(round(79.19 * GiB) * 0.9) - r.budget.weights - activation - non_torch
    assert r.budget.available == available
    # 2 MiB blocks of 16 tokens (32 layers x K + V x 8 heads x 128 x 2 B per token = 128 KiB)
    assert r.num_blocks == available // (16 * 32 * 2 * 8 * 128 * 2)


def test_sampler_peak_by_hand() -> None:
    # Llama-3.1-8B, bf16, T = 8192, N = 1024 on an H100 (132 SMs): hidden T*h*2 + 2*N*h*2 + N*V*2
    # + 3*N*V*4 + 132*V*4, plus the 32 MiB cuBLAS workspace
    spec = load_model("meta-llama/Llama-3.1-8B-Instruct")
    h, V, T, N = 4096, 128256, 8192, 1024
    sampler = T * h * 2 + 2 * N * h * 2 + N * V * 2 + 3 * N * V * 4 + 132 * V * 4
    peak = vllm_budget.profile_peak(spec, spec.layer_kinds(), last=True, tp=1, c=2,
                                    settings=vllm_budget.EngineSettings(T, N), max_model_len=8192, block_size=16,
                                    version="0.19", device=H100)
    assert peak.sampler == sampler
    assert peak.total == sampler + 32 * (1 << 20)


def test_one_request_that_does_not_fit_reports_vllms_error() -> None:
    # Llama-3.1-70B at tp 2 on H100s leaves ~1.5 GiB for KV; one 131072-token request needs
    # 131072 x 163840 B = 20 GiB per rank
    spec = load_model("meta-llama/Llama-3.1-70B")
    s = ServingConfig(max_model_len=131072, parallelism=Parallelism(tp=2))
    summary = estimate(spec, s, H100).serving
    assert summary.engine_error == "max_model_len"
    assert summary.request_kv_bytes == 131072 // 16 * 16 * 2 * 4 * 128 * 2 * 80
    # the estimated maximum model length fits the available memory and one more token would not
    per_token = 2 * 4 * 128 * 2 * 80
    largest = summary.largest_max_model_len_one_request
    assert -(-largest // 16) * 16 * per_token <= summary.kv_budget_bytes < -(-(largest + 16) // 16) * 16 * per_token


def test_no_memory_when_weights_exceed_the_budget() -> None:
    spec = load_model("meta-llama/Llama-3.1-70B")
    summary = estimate(spec, ServingConfig(max_model_len=8192), H100).serving
    assert summary.engine_error == "no_memory"
    assert summary.kv_cache_blocks == 0 and summary.largest_concurrency == 0


def test_inverse_queries_match_the_pool() -> None:
    spec = load_model("meta-llama/Llama-3.1-8B-Instruct")
    s = ServingConfig(max_model_len=8192)
    ranks = vllm_ranks(spec, s, H100)
    blocks = ranks[0].num_blocks
    # uniform layout: C requests of L tokens need C x cdiv(L, 16) blocks
    assert largest_concurrency(spec, s, H100, 8192) == blocks // 512
    assert largest_max_model_len(spec, s, H100, 10) == min(blocks // 10 * 16, 131072)
    assert largest_max_model_len(spec, s, H100, 1) == 131072  # capped at max_position_embeddings
    with pytest.raises(InputError, match="concurrency 0"):
        largest_max_model_len(spec, s, H100, 0)


def test_smallest_parallelism_for_70b() -> None:
    # 70B bf16 = 131.5 GiB of weights: tp 2 leaves (0.95 x 79.19 - 65.8 - 1.9 - 2.07) GiB ~ 5.5 GiB,
    # enough for one 8192-token request (1.25 GiB at 163840 B/token/rank)
    spec = load_model("meta-llama/Llama-3.1-70B")
    par = smallest_parallelism(spec, ServingConfig(max_model_len=8192, gpu_memory_utilization=0.95), H100, headroom=0.1)
    assert (par.tp, par.pp) == (2, 1)


def test_hf_generate_peak_by_hand() -> None:
    # Llama-3.2-1B, bf16, transformers 5, b = 2, prompt 100 + 50 new tokens
    spec = load_model("meta-llama/Llama-3.2-1B")
    s = ServingConfig(engine=Engine.HF, batch_size=2, prompt_len=100, max_new_tokens=50)
    est = estimate(spec, s, H100)
    per_token = 2 * 8 * 64 * 2 * 16  # K and V, 8 KV heads x 64, 2 bytes, 16 layers
    rank = est.per_device
    # each parameter its own caching-allocator block: the tied embedding (128256 x 2048 x 2 B = 501 MiB)
    # gets a 502 MiB segment whose 1 MiB remainder is not split off; every other tensor is a multiple
    # of 512 B below 10 MiB or of 2 MiB above (the trace's parameters: 2,472,677,376 B)
    assert rank.term("weights").bytes == spec.num_params * 2 + (1 << 20)
    # prefill, MLP of the last layer, T = 200 tokens, h = 2048, i = 8192 (LlamaModel / LlamaDecoderLayer):
    # inputs_embeds 200 x h x 2, generate's int64 attention mask, position ids and input ids (4 x 8 x 200),
    # rotary cos and sin at (b, p) positions 2 x 200 x 64 x 2, layer input + residual + norm output
    # 3 x 200 x h x 2, act(gate) + up + product 3 x 200 x i x 2 = 13.2 MB (the trace, whose loop passes
    # (1, p) positions and one int64 input: 13,135,872 B in 512-B blocks); last decode step: 2 x 149
    # tokens + one layer's torch.cat copy = 10.4 MB, less than the prefill's 19.7 MB
    prefill_kv = 2 * 100 * per_token
    layer = 200 * 2048 * 2 + 4 * 8 * 200 + 2 * 200 * 64 * 2 + 3 * 200 * 2048 * 2 + 3 * 200 * 8192 * 2
    decode = 2 * 149 * per_token + 2 * 149 * per_token // 16
    assert prefill_kv + layer > decode
    assert rank.term("kv_cache").bytes == prefill_kv
    assert rank.term("activations").bytes == layer == 13_164_800


def test_engine_version_checked() -> None:
    spec = load_model("meta-llama/Llama-3.1-8B-Instruct")
    with pytest.raises(InputError, match=r"^engine_version '0\.5'.*0\.19"):
        estimate(spec, ServingConfig(engine_version="0.5"), H100)
    with pytest.raises(InputError, match="^block_size 24"):
        estimate(spec, ServingConfig(block_size=24), H100)
    with pytest.raises(InputError, match="max_position_embeddings"):
        estimate(spec, ServingConfig(max_model_len=200_000), H100)


runner = CliRunner()


def test_cli_json_keeps_serving_keys_and_prints_capacity() -> None:
    result = runner.invoke(app, ["hf", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "8192", "--gpu", "H100",
                                 "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    for key in ("kv_cache_bytes_per_token", "kv_cache_tokens", "max_concurrency"):
        assert key in doc["serving"]
    assert doc["serving"]["kv_cache_bytes_per_token"] == 131072
    table = runner.invoke(app, ["hf", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "8192", "--gpu", "H100",
                                "--engine-version", "0.6"])
    assert table.exit_code == 0, table.output
    assert "vLLM 0.6" in table.output and "Capacity:" in table.output


def test_cli_bad_engine_version_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    from memest.cli import main

    monkeypatch.setattr("sys.argv", ["memest", "hf", "meta-llama/Llama-3.1-8B-Instruct", "--engine", "hf",
                                     "--engine-version", "0.19"])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2


def test_mla_keeps_a_dequantized_kv_b_proj_for_quantized_checkpoints():
    # DeepSeek-V3 (fp8 blocks) at tp 8: W_UK_T / W_UV come from kv_b_proj dequantized to bf16:
    # kv_lora_rank 512 x (128 heads / 8) x (qk_nope 128 + v 128) x 2 B = 4,194,304 B per layer (2 MiB
    # multiple: no rounding) x 61 layers = 255,852,544 B
    from memest.devices import get_device
    from memest.estimate import estimate
    from memest.sources import load_model
    from memest.workload import Parallelism, ServingConfig

    s = ServingConfig(max_model_len=8192, parallelism=Parallelism(tp=8))
    rank = estimate(load_model("deepseek-ai/DeepSeek-V3"), s, get_device("H200-141GB")).per_device
    assert rank.term("weights.mla_dequantized").bytes == 61 * 512 * 16 * 256 * 2 == 255_852_544
    # an unquantized MLA checkpoint (DeepSeek-V2-Lite, bf16): the views share the weight, nothing added
    lite = estimate(load_model("deepseek-ai/DeepSeek-V2-Lite"), ServingConfig(max_model_len=8192), get_device("H100"))
    assert "weights.mla_dequantized" not in {t.name for t in lite.per_device.terms}
