"""transformers ``generate`` (``--engine hf``): full-size catalog models derived by hand, and tiny
models measured for real on the CPU.

Every expected byte count of the full-size cases is itemised from the transformers 5.24 code (the
tensors named in memest/estimate/serving/hf/prefill.py's docstring), with the arithmetic in the test. The
comment under each case gives what the trace reported for the same job (``memest.trace``: the real
model code on the meta device, prefilling p tokens; allocated bytes are 512-byte caching-allocator
blocks) — an independent check recorded when these tests were written. The trace's generate loop
passes neither an attention mask nor position ids, so it holds (1, p, ...) rotary tables and one
int64 (b, p) tensor where ``model.generate`` holds (b, p, ...) tables and four: the traced figures
differ from the hand-derived ones by exactly that (noted per case).

The tiny models run ``model.generate`` for real on the CPU under ``torch.profiler``'s memory
timeline, independently of memest's code.
"""

from __future__ import annotations

import pytest

from memest.devices import get_device
from memest.estimate import estimate
from memest.sources import load_model
from memest.workload import Engine, ServingConfig

H100 = get_device("h100")
INT64 = 8
GENERATE_INT64 = 4 * INT64  # attention mask, position ids (cumsum, masked_fill), sliced and cloned input ids


def _prefill(model: str, b: int, p: int, dtype: str = "auto"):
    """The estimate of ``b`` prompts of ``p`` tokens and 2 new tokens (the prefill sets the peak)."""
    s = ServingConfig(engine=Engine.HF, batch_size=b, prompt_len=p, max_new_tokens=2, dtype=dtype)
    return estimate(load_model(model), s, H100).per_device


def test_llama_pattern_with_a_sliding_window_reached() -> None:
    # Mistral-7B-v0.1: h 4096, i 14336, 32 layers, 8 KV heads x 128, window 4096; bf16; b 1, p 6000, T 6000
    rank = _prefill("mistralai/Mistral-7B-v0.1", 1, 6000)
    T, h, i, c = 6000, 4096, 14336, 2
    model = (T * h * c  # inputs_embeds
             + GENERATE_INT64 * T  # generate's int64 inputs
             + 2 * T * 128 * c  # rotary cos and sin, (b, p, d)
             + 6000 * 6000)  # p >= window: the sliding causal mask is materialised, (1, 1, p, p) bool
    mlp = 3 * T * h * c + 3 * T * i * c  # layer input, residual, norm output; act(gate), up, product
    assert rank.term("activations").bytes == model + mlp == 751_968_000
    # every prompt token is cached, the window notwithstanding: DynamicSlidingWindowLayer keeps a view
    # of the prefill's full K/V: 32 layers x 6000 tokens x (K + V: 2 x 8 x 128 x 2 B)
    assert rank.term("kv_cache").bytes == 32 * 6000 * 2 * 8 * 128 * c == 786_432_000
    # trace: activations 751,872,512 (bitwise_and (1, 1, 6000, 6000) bool among them; 3 int64 inputs
    # fewer), KV 789,004,288


def test_gpt2_gelu_tanh_in_python_and_position_table() -> None:
    # GPT-2: h 768, i 4h = 3072, 12 layers, 12 heads x 64, gelu_new; served in bf16; b 1, p 100
    rank = _prefill("openai-community/gpt2", 1, 100)
    T, h, i, c = 100, 768, 3072, 2
    model = T * h * c + GENERATE_INT64 * T + T * h * c  # inputs_embeds, int64 inputs, wpe at (b, p) positions
    held = 4 * T * h * c  # GPT2Block: layer input, attn_output, residual, ln_2 output
    act = 4 * T * i * c  # c_fc output, 0.5 * x, pow(x, 3), 0.044715 * pow (NewGELUActivation)
    assert rank.term("activations").bytes == model + held + act == 3_382_400
    assert rank.term("kv_cache").bytes == 12 * 100 * 2 * 768 * c
    # trace: activations 3,381,248 (3 x 800 B of int64 inputs fewer), KV 3,686,400


def test_gemma2_eager_attention_scores() -> None:
    # gemma-2-2b: h 2304, i 9216, 26 layers, 8 heads, 4 KV heads x 256, sliding and full layers,
    # no SDPA in transformers (eager); fp32 checkpoint loaded with --dtype bf16; b 1, p 1000
    spec = load_model("google/gemma-2-2b")
    assert not spec.sdpa_supported
    rank = _prefill("google/gemma-2-2b", 1, 1000, dtype="bf16")
    T, h, a, d, c = 1000, 2304, 8, 256, 2
    model = (T * h * c + GENERATE_INT64 * T + 2 * T * d * c  # inputs_embeds, int64 inputs, rotary
             + 2 * 1 * 1000 * 1000 * c)  # eager masks for the sliding and the full layers, (b, 1, p, p)
    held = 2 * T * h * c  # layer input and input_layernorm output
    qkv = (a * d + 2 * a * d) * T * c  # q after rotary, K and V repeated to 8 heads (repeat_kv)
    scores = 1 * a * 1000 * 1000 * (c + 4 + 4)  # masked scores; softmax's fp32 copy and fp32 result
    assert rank.term("activations").bytes == model + held + qkv + scores == 111_168_000
    assert rank.term("activations").formula == "attention of layer 26"
    assert rank.term("kv_cache").bytes == 26 * 1000 * 2 * 4 * 256 * c
    # trace: softmax's fp32 copy and result 32,000,000 each, masked scores 16,000,000, repeated K/V
    # 2 x 4,096,000; activations 111,858,688 and KV 109,836,800 in allocator blocks (tensors to 0.1 %)


def test_mixtral_grouped_experts() -> None:
    # Mixtral-8x7B: h 4096, expert i 14336, top-2 of 8, fp32 routing weights; bf16; b 1, p 100
    rank = _prefill("mistralai/Mixtral-8x7B-v0.1", 1, 100)
    T, h, i, c, topk = 100, 4096, 14336, 2, 2
    S = T * topk  # (token, expert) rows
    model = T * h * c + GENERATE_INT64 * T + 2 * T * 128 * c
    held = 3 * T * h * c
    rows = S * h * c + S * 2 * i * c + 2 * S * i * c  # gathered inputs; gate_up; act(gate) and its product
    index = (T * 8 * c  # router logits over the 8 experts
             + T * topk * (INT64 + 4)  # top-k ids and fp32 weights
             + S * (INT64 + INT64 + 4 + 4))  # sorted expert ids, permutation, histc's int32 input, sorted weights
    assert rank.term("activations").bytes == model + held + rows + index == 27_916_000
    # trace: activations 27,918,336 (_grouped_mm (200, 28672), silu and mul (200, 14336), ...)


def test_falcon_caches_kv_broadcast_to_all_heads() -> None:
    # Falcon-40B (new_decoder_architecture): h 8192, 128 heads, 8 KV heads x 64, 60 layers, ffn 4h
    spec = load_model("tiiuae/falcon-40b")
    assert spec.reference_layer.attention.kv_broadcast
    hf = ServingConfig(engine=Engine.HF, batch_size=1, prompt_len=100, max_new_tokens=2)
    est = estimate(spec, hf, H100)
    # transformers caches K and V broadcast to all 128 heads; vLLM caches the 8 KV heads
    assert est.serving.kv_cache_bytes_per_token == 60 * 2 * 128 * 64 * 2 == 1_966_080
    vllm = estimate(spec, ServingConfig(max_model_len=2048), H100).serving
    assert vllm.kv_cache_bytes_per_token == 60 * 2 * 8 * 64 * 2
    rank = est.per_device
    assert rank.term("kv_cache").bytes == 100 * 1_966_080
    T, h, c = 100, 8192, 2
    model = T * h * c + GENERATE_INT64 * T + 2 * T * 64 * c + 100 * 100  # + the (1, 1, p, p) bool mask
    held = 4 * T * h * c  # layer input, ln_attn and ln_mlp outputs, attention output
    assert rank.term("activations").bytes == model + held + 2 * T * 4 * h * c == 21_338_000  # fc, gelu
    # trace: KV 196,608,000 (120 tensors), activations 21,541,888 in allocator blocks


def test_gpt_bigcode_mask_buffer_in_transformers_5() -> None:
    # GPTBigCodeModel.__init__ registers tril(ones(n_positions, n_positions), bool): octocoder 8192
    rank = _prefill("bigcode/octocoder", 1, 100)
    assert rank.term("weights.buffers").bytes == 8192 * 8192
    # trace: a 67,108,864-byte buffer among the weights


def test_last_decode_step_sets_the_peak_of_long_generations() -> None:
    # Llama-3.2-1B: 16 layers, 8 KV heads x 64; b 1, prompt 10, 5000 new tokens: the last step feeds
    # token 5009 with 5009 cached, and DynamicLayer.update's torch.cat holds one layer's old and new K, V
    spec = load_model("meta-llama/Llama-3.2-1B")
    s = ServingConfig(engine=Engine.HF, batch_size=1, prompt_len=10, max_new_tokens=5000)
    rank = estimate(spec, s, H100).per_device
    per_layer = 2 * 8 * 64 * 2
    assert rank.term("kv_cache").bytes == 5009 * 16 * per_layer
    assert rank.term("activations").bytes == 5009 * per_layer


@pytest.mark.parametrize(("model", "sdpa"), [("bigscience/bloom-560m", False), ("google/gemma-2-9b", False),
                                             ("openai/gpt-oss-20b", False), ("google/gemma-2b", True),
                                             ("google/gemma-3-27b-it", True), ("meta-llama/Llama-3.1-8B", True)])
def test_sdpa_supported_family_fact(model: str, sdpa: bool) -> None:
    # transformers 5.24 raises for attn_implementation="sdpa" on bloom, gemma2 and gpt_oss only
    assert load_model(model).sdpa_supported is sdpa


REAL_GENERATE_TOLERANCE = 0.01
"""Analytic peak within 1% of ``model.generate``'s measured peak on the CPU."""


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2", "opt", "olmo2", "falcon", "phi", "bloom"])
def test_tiny_models_against_a_real_generate_on_the_cpu(family: str) -> None:
    # GPT-NeoX is left out: its CPU attention kernel copies the strided q/k/v slices of the fused
    # projection internally (a CPU-kernel workspace the CUDA kernels do not have); MoE families run
    # grouped_mm's CPU fallback; Jamba the reference scan (findings §8)
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import sys
    from pathlib import Path

    import numpy as np
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    sys.path.insert(0, str(Path(__file__).parent))
    from trace_models import tiny_config

    from memest.calibration.compare import local_device
    from memest.sources import spec_from_config

    cfg = tiny_config(family)
    raw = dict(cfg.raw)
    config = AutoConfig.for_model(raw.pop("model_type"), **raw)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    b, p, n = 2, 254, 2
    ids = torch.zeros((b, p), dtype=torch.long)
    gen = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=None)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gen)
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    measured = int(np.asarray(sizes).sum(axis=1).max())  # parameters included, as in the estimate

    job = ServingConfig(engine=Engine.HF, dtype="bf16", batch_size=b, prompt_len=p, max_new_tokens=n)
    predicted = estimate(spec_from_config(cfg), job, local_device("cpu", "cpu", 64 << 30)).per_device.allocated_bytes
    assert abs(predicted - measured) <= REAL_GENERATE_TOLERANCE * measured, f"{predicted:,} vs {measured:,} B"
