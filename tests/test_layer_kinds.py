"""Every layer kind's cache, derived by hand: KV bytes per token, the per-request state, the
transformers contiguous cache and vLLM's pages; the hybrid families' layer lists; bad layer kinds.

Sources of the rules: vLLM ``vllm/v1/kv_cache_interface.py`` (``FullAttentionSpec`` with
``head_size_v``, ``SlidingWindowSpec``, ``ChunkedLocalAttentionSpec``, ``CrossAttentionSpec``,
``MambaSpec``) and ``vllm/model_executor/layers/mamba/mamba_utils.py`` (``MambaStateShapeCalculator``:
conv states keep ``kernel - 1`` columns), vLLM main as stored (commit 001cabc1 / 02d71083);
transformers 5.24 ``cache_utils.py`` (``LinearAttentionLayer`` keeps ``conv_kernel_size`` columns,
``chunked_attention`` is a ``DynamicSlidingWindowLayer`` of ``attention_chunk_size``).
"""

from __future__ import annotations

import json
import os

import pytest
from inprocess import run_memest

from memest.devices import get_device
from memest.errors import ConfigError
from memest.estimate import estimate
from memest.estimate.serving.kv import (
    KVLayer,
    bytes_per_token,
    contiguous_cache_bytes,
    kv_layer,
    kv_layers,
    paged_layout,
    state_bytes_per_sequence,
)
from memest.sources import spec_from_config
from memest.sources.config import HFConfig
from memest.sources.families._layers import gated_deltanet_state, mamba1_state, mamba2_state, short_conv_state
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, StateSpec
from memest.workload import Engine, ServingConfig

MLP = MLPSpec(gated=True, intermediate_size=128)


def _layer(**attention) -> LayerSpec:
    return LayerSpec(attention=AttentionSpec(**attention), mlp=MLP)


def _state_layer(kind: str, state: StateSpec) -> LayerSpec:
    return _layer(kind=kind, num_heads=0, num_kv_heads=0, head_dim=0, state=state)


# ---- attention kinds ------------------------------------------------------------------------------


def test_k_and_v_head_dims_that_differ() -> None:
    # MiMo-V2-Flash style: K head dim 192, V head dim 128, 4 KV heads, bf16: 4 x (192 + 128) x 2 = 2,560 B/token
    layer = _layer(num_heads=64, num_kv_heads=4, head_dim=192, v_head_dim=128)
    assert kv_layer(layer, 1, 2) == KVLayer("full", 2_560)
    # tp 8 > 4 KV heads: one head per rank, replicated: 1 x 320 x 2 = 640
    assert kv_layer(layer, 8, 2).bytes_per_token == 640


def test_k_equals_v_is_cached_once() -> None:
    # Gemma 4 global layers (attention_k_eq_v): 4 KV heads x 512 x 2 B = 4,096 B/token, not 8,192
    shared = _layer(num_heads=32, num_kv_heads=4, head_dim=512, kv_shared=True)
    assert kv_layer(shared, 1, 2).bytes_per_token == 4 * 512 * 2 == 4_096
    assert kv_layer(_layer(num_heads=32, num_kv_heads=4, head_dim=512), 1, 2).bytes_per_token == 8_192


def test_full_and_sliding_layers_with_their_own_kv_heads() -> None:
    # full layers 4 KV heads x (192 + 128) x 2 = 2,560 B; sliding layers 8 KV heads: 5,120 B, window 128
    full = _layer(num_heads=64, num_kv_heads=4, head_dim=192, v_head_dim=128)
    sliding = _layer(num_heads=64, num_kv_heads=8, head_dim=192, v_head_dim=128, sliding_window=128)
    layers = kv_layers([(full, 1), (sliding, 5)], 1, 2)
    assert layers == [(KVLayer("full", 2_560), 1), (KVLayer("sliding", 5_120, window=128), 5)]
    assert bytes_per_token(layers) == 2_560 + 5 * 5_120  # windows ignored: 28,160
    # a contiguous cache of 2 sequences x 1,000 tokens: full 2,560 x 1,000 x 2, sliding 5 x 5,120 x 128 x 2
    assert contiguous_cache_bytes(layers, 2, 1_000) == 5_120_000 + 6_553_600


def test_chunked_local_attention() -> None:
    # Llama 4 attention_chunk_size 8192: 8 KV heads x 2 x 128 x 2 B = 4,096 B/token
    chunked = kv_layer(_layer(num_heads=40, num_kv_heads=8, head_dim=128, chunk_size=8192), 1, 2)
    assert chunked == KVLayer("chunked", 4_096, window=8192)
    # transformers keeps at most the chunk (a sliding window of attention_chunk_size): 8,192 of 20,000 tokens
    assert contiguous_cache_bytes([(chunked, 1)], 1, 20_000) == 8_192 * 4_096
    # vLLM ChunkedLocalAttentionSpec: cdiv(min(8192 + 2048, 32768), 16) = 640 pages of 16 x 4,096 B per request
    layout = paged_layout([(chunked, 1)], 16)
    assert layout.blocks_per_request(32_768, 2_048) == 640
    assert layout.request_bytes(32_768, 2_048) == 640 * 16 * 4_096


def test_cross_attention_caches_the_image_tokens_per_request() -> None:
    # mllama (Llama-3.2-11B-Vision): one image = 4 tiles x ((560 / 14)^2 + 1) = 6,404 tokens; 8 KV heads x 128
    tokens = 4 * ((560 // 14) ** 2 + 1)
    cross = kv_layer(_layer(kind="cross", num_heads=32, num_kv_heads=8, head_dim=128, encoder_tokens=tokens), 1, 2)
    assert cross == KVLayer("cross", 8 * 256 * 2, encoder_tokens=6_404)
    layers = [(cross, 8)]
    assert bytes_per_token(layers) == 0  # nothing per generated token
    assert state_bytes_per_sequence(layers) == 8 * 6_404 * 4_096 == 209_846_272
    # transformers: the same per sequence whatever its length
    assert contiguous_cache_bytes(layers, 2, 10) == contiguous_cache_bytes(layers, 2, 5_000) == 2 * 209_846_272
    # vLLM CrossAttentionSpec: cdiv(6404, 16) = 401 pages per request and layer
    assert paged_layout(layers, 16).blocks_per_request(100_000, 2_048) == 401


# ---- state layers (vLLM: conv kernel - 1 columns; transformers: kernel columns) -------------------


def test_mamba1_state() -> None:
    # Jamba: d_in 8192, d_state 16, d_conv 4; vLLM conv 8192 x 3 + SSM 8192 x 16 = 155,648 elements x 2 B
    layer = _state_layer("mamba", mamba1_state(8192, 16, 4))
    assert kv_layer(layer, 1, 2) == KVLayer("state", 0, state_bytes=311_296)
    # transformers (HybridMambaAttentionDynamicCache): 8192 x 4 + 8192 x 16 = 163,840 elements x 2 B
    assert kv_layer(layer, 1, 2, transformers=True).state_bytes == 327_680
    # tp 2: both halves: (4096 x 3 + 4096 x 16) x 2 = 155,648
    assert kv_layer(layer, 2, 2).state_bytes == 155_648


def test_mamba2_state_of_nemotron_nano_9b_v2() -> None:
    # I = 128 heads x 80 = 10,240; conv over I + 2 x 8 groups x 128 = 12,288 channels x 3 = 36,864 elements x 2 B
    # = 73,728 B; SSM 128 x 80 x 128 = 1,310,720 elements x 4 B (float32 mamba_ssm_cache_dtype) = 5,242,880 B
    state = mamba2_state(10_240, 8, 128, 128, 80, 4, ssm_dtype="float32")
    layer = _state_layer("mamba", state)
    assert kv_layer(layer, 1, 2).state_bytes == 73_728 + 5_242_880 == 5_316_608
    # tp 2: conv 12,288 / 2 x 3 x 2 = 36,864; SSM 64 x 80 x 128 x 4 = 2,621,440
    assert kv_layer(layer, 2, 2).state_bytes == 36_864 + 2_621_440
    # the conv state stays in the model dtype under an fp8 KV cache (vLLM mamba_cache_dtype auto)
    assert kv_layer(layer, 1, 1, state_e=2).state_bytes == 5_316_608


def test_mamba2_groups_grow_to_the_tp_degree() -> None:
    # n_groups 1 < tp 2: vLLM extends the groups to 2 (extra_groups_for_head_shards); I 256, N 16, K 4:
    # conv (256 + 2 x 2 x 16) / 2 = 160 channels x 3 = 480; SSM 8 heads x 32 x 16 / 2 = 2,048: 2,528 x 2 B
    layer = _state_layer("mamba", mamba2_state(256, 1, 16, 8, 32, 4))
    assert kv_layer(layer, 2, 2).state_bytes == 2 * (480 + 2_048)


def test_gated_deltanet_state_of_qwen35_27b() -> None:
    # 16 key heads, 48 value heads, dims 128, conv 4: conv 2 x 16 x 128 + 48 x 128 = 10,240 channels x 3
    # = 30,720 elements x 2 B = 61,440 B; recurrent 48 x 128 x 128 = 786,432 x 4 B (mamba_ssm_dtype float32)
    layer = _state_layer("linear", gated_deltanet_state(16, 48, 128, 128, 4, ssm_dtype="float32"))
    assert kv_layer(layer, 1, 2).state_bytes == 61_440 + 3_145_728 == 3_207_168


def test_short_conv_state_of_lfm2() -> None:
    # LFM2 (LFM2_350M below): hidden 1024, conv_L_cache 3: vLLM 1024 x 2 x 2 B = 4,096 B; transformers 1024 x 3 x 2 = 6,144 B
    layer = _state_layer("conv", short_conv_state(1024, 3))
    assert kv_layer(layer, 1, 2) == KVLayer("state", 0, state_bytes=4_096)
    assert kv_layer(layer, 1, 2, transformers=True).state_bytes == 6_144


def test_rwkv_token_shift_and_time_mix_state() -> None:
    # RWKV-6 Finch-7B: h 4096, 64 heads x 64. Token shifts 2 x 4096, one column in vLLM and transformers alike:
    # 8,192 x 2 B = 16,384 B; time-mix state 64 x 64 x 64 = 262,144 x 4 B (float32) = 1,048,576 B
    layer = _state_layer("linear", StateSpec(shift_channels=2 * 4096, ssm_elements=64 * 64 * 64, ssm_dtype="float32"))
    assert kv_layer(layer, 1, 2) == KVLayer("state", 0, state_bytes=16_384 + 1_048_576)
    assert kv_layer(layer, 1, 2, transformers=True).state_bytes == 16_384 + 1_048_576
    # tp 2 halves both: 4,096 x 2 B + 131,072 x 4 B
    assert kv_layer(layer, 2, 2).state_bytes == 8_192 + 524_288
    # the shifts follow the state dtype (fp8 KV cache: still the model's 2 B), the time-mix state stays float32
    assert kv_layer(layer, 1, 1, state_e=2).state_bytes == 16_384 + 1_048_576


def test_a_state_kind_needs_its_state() -> None:
    with pytest.raises(ValueError, match="state is required"):
        AttentionSpec(kind="mamba", num_heads=0, num_kv_heads=0, head_dim=0)


# ---- the hybrid families, end to end (analytic, no torch) -----------------------------------------

# nvidia/NVIDIA-Nemotron-Nano-9B-v2 config.json values (hidden 4480, intermediate 15680, 40 heads / 8 KV /
# head_dim 128, vocab 131072, mamba 128 heads x 80, n_groups 8, ssm_state_size 128, conv_kernel 4); the model
# card: 56 layers, 27 Mamba-2, 25 MLP, 4 attention
NANO_9B_V2 = {
    "model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "hidden_size": 4480,
    "intermediate_size": 15680, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 131072, "hybrid_override_pattern": "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-",
    "ssm_state_size": 128, "conv_kernel": 4, "n_groups": 8, "mamba_num_heads": 128, "mamba_head_dim": 80,
    "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
}


def _spec(raw: dict, name: str = "test"):
    return spec_from_config(HFConfig(json.loads(json.dumps(raw)), name=name, source="test"))


def test_nemotron_h_layers_and_kv() -> None:
    spec = _spec(NANO_9B_V2)
    kinds = [layer.attention.kind for layer in spec.layers]
    assert (kinds.count("mamba"), kinds.count("none"), kinds.count("gqa")) == (27, 25, 4)
    assert [n for n, k in enumerate(kinds) if k == "gqa"] == [14, 21, 30, 39]
    layers = kv_layers(spec.layer_kinds(), 1, 2, state_e=2)
    # 4 attention layers x 8 KV heads x (128 + 128) x 2 B = 16,384 B/token (~16 KiB/token, as NVIDIA's
    # video-search-and-summarization PR #1649 sizes it)
    assert bytes_per_token(layers) == 16_384
    # 27 Mamba-2 states of 5,316,608 B (test_mamba2_state_of_nemotron_nano_9b_v2)
    assert state_bytes_per_sequence(layers) == 27 * 5_316_608 == 143_548_416


def test_nemotron_h_vllm_serves_requests() -> None:
    # the defect: every block counted as Mamba gave 0 B/token and "max_num_seqs allows 0 requests"
    est = estimate(_spec(NANO_9B_V2, "nvidia/NVIDIA-Nemotron-Nano-9B-v2"),
                   ServingConfig(max_model_len=32_768), get_device("H100"))
    assert est.serving.kv_cache_bytes_per_token == 16_384
    assert est.serving.state_bytes_per_sequence == 143_548_416  # a term of its own, never 0
    assert est.serving.largest_concurrency > 0 and est.serving.kv_cache_blocks > 0
    # vLLM pages: attention block 16 x cdiv(5,316,608, 16 x 4,096) = 16 x 82 = 1,312 tokens, page 1,312 x 4,096 =
    # 5,373,952 B; one request's state: 27 Mamba layers x 1 padded page = 145,096,704 B
    terms = {t.name: t.bytes for t in est.per_device.terms}
    assert terms["kv_cache.state"] == 27 * 5_373_952
    # attention: 4 layers x cdiv(32768, 1312) = 25 pages x 5,373,952 B
    assert terms["kv_cache"] == 4 * 25 * 5_373_952


def test_pure_mamba_serves_with_its_state() -> None:
    # Mamba-2 only: nothing per token, 2 layers x (conv (128 + 2 x 1 x 16) x 3 + SSM 4 x 32 x 16) x 2 B per sequence
    raw = {"model_type": "mamba2", "architectures": ["Mamba2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
           "num_heads": 4, "head_dim": 32, "n_groups": 1, "state_size": 16, "vocab_size": 97}
    est = estimate(_spec(raw), ServingConfig(max_model_len=1_024), get_device("H100"))
    assert est.serving.kv_cache_bytes_per_token == 0
    assert est.serving.state_bytes_per_sequence == 2 * (160 * 3 + 2_048) * 2
    assert est.serving.largest_concurrency > 0


# the LFM2 text config of LiquidAI/LFM2.5-VL-450M as public ports quote it: hidden 1024, 16 layers, 16 heads / 8 KV,
# conv_L_cache 3, attention at full_attn_idxs [2, 5, 8, 10, 12, 14]
LFM2_350M = {
    "model_type": "lfm2", "architectures": ["Lfm2ForCausalLM"], "hidden_size": 1024, "num_hidden_layers": 16,
    "num_attention_heads": 16, "num_key_value_heads": 8, "vocab_size": 65536, "intermediate_size": 4608,
    "conv_L_cache": 3, "full_attn_idxs": [2, 5, 8, 10, 12, 14], "max_position_embeddings": 128000,
}


def test_lfm2_conv_layers_hold_a_conv_state_not_kv() -> None:
    spec = _spec(LFM2_350M)
    assert [n for n, layer in enumerate(spec.layers) if layer.attention.kind == "gqa"] == [2, 5, 8, 10, 12, 14]
    layers = kv_layers(spec.layer_kinds(), 1, 2)
    # 6 attention layers x 8 KV heads x (64 + 64) x 2 B = 12,288 B/token, not 16 layers' 32,768 (2.7x)
    assert bytes_per_token(layers) == 12_288
    # 10 conv layers x 1024 channels x (3 - 1) x 2 B = 40,960 B per sequence in vLLM
    assert state_bytes_per_sequence(layers) == 40_960
    assert state_bytes_per_sequence(kv_layers(spec.layer_kinds(), 1, 2, transformers=True)) == 10 * 1024 * 3 * 2


def test_hf_generate_counts_the_conv_states() -> None:
    # transformers generate on LFM2: the cache is 12,288 B/token x tokens + 61,440 B of conv states per sequence
    spec = _spec(LFM2_350M)
    est = estimate(spec, ServingConfig(engine=Engine.HF, max_model_len=1_000, batch_size=1), get_device("H100"))
    kv = next(t.bytes for t in est.per_device.terms if t.name.startswith("kv_cache"))
    assert kv >= 12_288 * 900 + 61_440  # at least the prompt's positions and the states


# Qwen3NextConfig's class defaults (transformers documents them against Qwen/Qwen3-Next-80B-A3B-Instruct):
# 48 layers, every 4th full attention with 16 heads / 2 KV heads of 256, Gated DeltaNet 16 key / 32 value heads
# of 128, conv 4
QWEN3_NEXT_80B = {
    "model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], "hidden_size": 2048,
    "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
}


def test_qwen3_next_full_and_linear_layers() -> None:
    spec = _spec(QWEN3_NEXT_80B)
    kinds = [layer.attention.kind for layer in spec.layers]
    assert kinds == ["linear", "linear", "linear", "gqa"] * 12
    layers = kv_layers(spec.layer_kinds(), 1, 2)
    # 12 full layers x 2 KV heads x (256 + 256) x 2 B = 24,576 B/token
    assert bytes_per_token(layers) == 24_576
    # 36 GDN layers: conv (2 x 16 x 128 + 32 x 128 = 8,192) x 3 = 24,576 elements, recurrent 32 x 128 x 128 =
    # 524,288; (24,576 + 524,288) x 2 B = 1,097,728 B each
    assert state_bytes_per_sequence(layers) == 36 * 1_097_728


def test_granite_4_h_layers() -> None:
    # layer_types in the legacy spelling; hidden 1536: mamba d_in 3072 = 48 heads x 64, 1 group, state 128, conv 4
    raw = {"model_type": "granitemoehybrid", "architectures": ["GraniteMoeHybridForCausalLM"], "hidden_size": 1536,
           "num_hidden_layers": 8, "num_attention_heads": 12, "num_key_value_heads": 4, "vocab_size": 100352,
           "layer_types": ["mamba"] * 5 + ["attention"] + ["mamba"] * 2, "mamba_n_heads": 48, "mamba_d_head": 64,
           "mamba_n_groups": 1, "mamba_d_state": 128, "mamba_d_conv": 4, "num_local_experts": 0,
           "shared_intermediate_size": 4096}
    layers = kv_layers(_spec(raw).layer_kinds(), 1, 2)
    # 1 attention layer x 4 KV heads x (128 + 128) x 2 B = 2,048 B/token
    assert bytes_per_token(layers) == 2_048
    # 7 Mamba-2 layers: conv (3072 + 2 x 1 x 128) x 3 = 9,984 elements, SSM 48 x 64 x 128 = 393,216; x 2 B
    assert state_bytes_per_sequence(layers) == 7 * (9_984 + 393_216) * 2


def test_falcon_h1_layers_cache_kv_and_a_state() -> None:
    # Falcon-H1 style: 24 layers, each attention (8 heads / 2 KV x 128) and Mamba-2 (d_ssm 3072 = 48 heads x 64,
    # 1 group, state 256, conv 4)
    raw = {"model_type": "falcon_h1", "architectures": ["FalconH1ForCausalLM"], "hidden_size": 2048,
           "num_hidden_layers": 24, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
           "vocab_size": 65537, "intermediate_size": 4608, "mamba_d_ssm": 3072, "mamba_n_heads": 48,
           "mamba_d_head": 64, "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_conv": 4}
    layers = kv_layers(_spec(raw).layer_kinds(), 1, 2)
    # per token: 24 x 2 KV heads x (128 + 128) x 2 B = 24,576 B
    assert bytes_per_token(layers) == 24_576
    # per sequence: conv (3072 + 2 x 256) x 3 = 10,752, SSM 48 x 64 x 256 = 786,432: 797,184 x 2 B = 1,594,368 per layer
    assert state_bytes_per_sequence(layers) == 24 * 1_594_368
    # vLLM: 24 attention + 24 Mamba specs, 2 groups; block 16 x cdiv(1,594,368, 16 x 1,024) = 16 x 98 = 1,568 tokens
    layout = paged_layout(layers, 16)
    assert len(layout.groups) == 2 and layout.min_block_size == 1_568


# ---- the meta fallback classifies the same layers (Nemotron-H: every block is a "mixer") ----------


@pytest.mark.parametrize("raw", [
    {**NANO_9B_V2, "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
     "head_dim": 16, "mamba_num_heads": 8, "mamba_head_dim": 10, "n_groups": 2, "ssm_state_size": 8,
     "hybrid_override_pattern": NANO_9B_V2["hybrid_override_pattern"][:16], "vocab_size": 97},
    {**LFM2_350M, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 97,
     "intermediate_size": 192},
    {**QWEN3_NEXT_80B, "hidden_size": 64, "num_hidden_layers": 8, "num_attention_heads": 4, "head_dim": 16,
     "vocab_size": 97, "intermediate_size": 96, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
      "linear_key_head_dim": 8, "linear_value_head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2,
     "moe_intermediate_size": 24, "shared_expert_intermediate_size": 40},
    {"model_type": "granitemoehybrid", "architectures": ["GraniteMoeHybridForCausalLM"], "hidden_size": 64,
     "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 97,
     "layer_types": ["mamba", "attention", "mamba", "mamba"], "mamba_n_heads": 8, "mamba_n_groups": 2,
     "mamba_d_state": 8, "num_local_experts": 4, "intermediate_size": 24, "shared_intermediate_size": 40},
    {"model_type": "falcon_h1", "architectures": ["FalconH1ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 97, "intermediate_size": 96,
     "mamba_d_ssm": 96, "mamba_n_heads": 6, "mamba_d_head": 16, "mamba_n_groups": 1, "mamba_d_state": 8},
], ids=["nemotron_h", "lfm2", "qwen3_next", "granitemoehybrid", "falcon_h1"])
def test_meta_fallback_agrees_on_kinds_and_states(raw: dict) -> None:
    pytest.importorskip("transformers")
    from memest.sources import meta

    analytic = _spec(raw)
    from_meta = meta.spec_from_meta(HFConfig(json.loads(json.dumps(raw)), name="test", source="test"),
                                    trust_remote_code=False)
    assert [layer.attention.kind for layer in from_meta.layers] == [layer.attention.kind for layer in analytic.layers]
    assert [layer.attention.state for layer in from_meta.layers] == [layer.attention.state for layer in analytic.layers]


# ---- vLLM's hybrid manager against a published start-up log ---------------------------------------


def test_qwen35_27b_vllm_log() -> None:
    """vllm-project/vllm issue #40691 (vLLM 0.19.0, ``vllm serve Qwen3.5-27B --max-model-len 32768
    --max-num-seqs 16 --max-num-batched-token 16384``): 'GPU KV cache size: 290,864 tokens',
    'Maximum concurrency for 32,768 tokens per request: 33.04x'.

    Qwen3.5-27B (text config: 64 layers, every 4th full attention with 4 KV heads x 256, the others Gated
    DeltaNet with 16 / 48 heads of 128, conv 4, ``mamba_ssm_dtype`` float32):
    - full attention: 4 x (256 + 256) x 2 B = 4,096 B/token; GDN state 3,207,168 B (float32 SSM);
    - attention block = 16 x cdiv(3,207,168, 16 x 4,096) = 16 x 49 = 784 tokens (page 3,211,264 B);
    - 16 attention + 48 GDN layers: group size 16, 1 + 3 = 4 groups;
    - a request: cdiv(32768, 784) = 42 attention pages + 3 state pages = 45;
    - the log's 33.04x is num_blocks / 45 with num_blocks = 1,487 (1,486 / 45 = 33.02);
    - 'GPU KV cache size' = 1,487 // 4 groups x 784 = 371 x 784 = 290,864 tokens, as logged.
    """
    full = _layer(num_heads=24, num_kv_heads=4, head_dim=256)
    gdn = _state_layer("linear", gated_deltanet_state(16, 48, 128, 128, 4, ssm_dtype="float32"))
    layout = paged_layout(kv_layers([(gdn, 48), (full, 16)], 1, 2, state_e=2), 16)
    assert layout.min_block_size == 784 and len(layout.groups) == 4
    assert layout.blocks_per_request(32_768, 16_384) == 45
    assert round(layout.max_concurrency(1_487, 32_768, 16_384), 2) == 33.04
    assert layout.tokens(1_487) == 290_864  # within 2%: exactly
    # the pool behind it: 1,487 blocks x 16 layers x 3,211,264 B = 71.2 GiB
    assert layout.block_bytes == 16 * 784 * 4_096


# ---- bad input: a layer kind memest does not know -------------------------------------------------


def test_unknown_layer_type_names_key_and_value() -> None:
    with pytest.raises(ConfigError, match=r"layer_types\[3\] = 'foo' is not a layer type of model_type 'lfm2'"):
        _spec({**LFM2_350M, "num_hidden_layers": 4, "layer_types": ["conv", "conv", "full_attention", "foo"]})


def test_unknown_pattern_symbol_names_key_and_symbol() -> None:
    with pytest.raises(ConfigError, match=r"hybrid_override_pattern\[2\] = 'X' is not a layer symbol"):
        _spec({**NANO_9B_V2, "hybrid_override_pattern": "M-X*"})


def test_unknown_layer_type_on_the_meta_path() -> None:
    from memest.sources import meta

    raw = {"model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "layer_types": ["linear_attention", "bogus"]}
    with pytest.raises(ConfigError, match=r"layer_types\[1\] = 'bogus'"):  # checked before transformers is imported
        meta.spec_from_meta(HFConfig(raw, name="test", source="test"), trust_remote_code=False)


@pytest.mark.parametrize(("raw", "message"), [
    ({**LFM2_350M, "num_hidden_layers": 4, "layer_types": ["conv", "conv", "full_attention", "foo"]},
     "layer_types[3] = 'foo'"),
    ({**NANO_9B_V2, "hybrid_override_pattern": "M-X*"}, "hybrid_override_pattern[2] = 'X'"),
    ({"model_type": "deepseek_v4", "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
      "head_dim": 16, "q_lora_rank": 16, "o_groups": 2, "o_lora_rank": 8, "compress_ratios": [0, 4, 64]},
     "compress_ratios[2] = 64"),
], ids=["layer_types", "pattern", "compress_ratios"])
def test_bad_layer_kinds_exit_2_on_the_cli(tmp_path, raw: dict, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"HF_HUB_OFFLINE": "1", "MEMEST_DEBUG": ""}
    out = run_memest("hf", str(path), "--serve", env=env)  # in-process (tests/inprocess.py)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr


def test_mllama_cross_attention_layers_on_the_meta_path() -> None:
    pytest.importorskip("transformers")
    from memest.sources import meta

    # a shrunken Llama-3.2-Vision: 5 text layers, layer 3 a cross-attention layer; one image = 4 tiles x
    # ((56 / 14)^2 + 1) = 68 tokens
    raw = {"model_type": "mllama", "architectures": ["MllamaForConditionalGeneration"],
           "text_config": {"model_type": "mllama_text_model", "hidden_size": 64, "num_hidden_layers": 5,
                           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
                           "vocab_size": 128300, "cross_attention_layers": [3]},
           "vision_config": {"model_type": "mllama_vision_model", "hidden_size": 32, "num_hidden_layers": 2,
                             "num_global_layers": 1, "attention_heads": 4, "intermediate_size": 64, "image_size": 56,
                             "patch_size": 14, "max_num_tiles": 4, "vision_output_dim": 64,
                             "intermediate_layers_indices": [0]}}
    spec = meta.spec_from_meta(HFConfig(raw, name="test", source="test"), trust_remote_code=False)
    assert [layer.attention.kind for layer in spec.layers] == ["gqa", "gqa", "gqa", "cross", "gqa"]
    layers = kv_layers(spec.layer_kinds(), 1, 2)
    # per token: 4 self-attention layers x 2 KV heads x (16 + 16) x 2 B = 512 B (the cross layer adds nothing);
    # per request: 68 image tokens x 128 B = 8,704 B
    assert bytes_per_token(layers) == 512
    assert state_bytes_per_sequence(layers) == 8_704


def _meta_spec(raw: dict):
    pytest.importorskip("transformers")
    from memest.sources import meta

    return meta.spec_from_meta(HFConfig(json.loads(json.dumps(raw)), name="test", source="test"),
                               trust_remote_code=False)


def test_mimo_v2_flash_per_layer_heads_and_dims_on_the_meta_path() -> None:
    # MiMoV2FlashAttention: K head dim 192 -> 24 here, V 128 -> 16; sliding layers double the KV heads (2 -> 4);
    # layers 0 and 5 full (MiMoV2FlashConfig: the first and every 6th)
    spec = _meta_spec({"model_type": "mimo_v2_flash", "architectures": ["MiMoV2FlashForCausalLM"], "hidden_size": 64,
                       "num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 24,
                       "v_head_dim": 16, "vocab_size": 97, "intermediate_size": 96, "moe_intermediate_size": 16,
                       "n_routed_experts": 4, "num_experts_per_tok": 2, "sliding_window": 32})
    layers = kv_layers(spec.layer_kinds(), 1, 2)
    # full: 2 KV heads x (24 + 16) x 2 B = 160 B/token; sliding: 4 x 40 x 2 = 320 B/token, window 32
    assert sorted(layers, key=lambda item: item[0].kind) == [(KVLayer("full", 160), 2),
                                                            (KVLayer("sliding", 320, window=32), 4)]


def test_gemma4_k_eq_v_and_shared_kv_layers_on_the_meta_path() -> None:
    # Gemma4TextConfig: full layers get global_head_dim (32 here) and num_global_key_value_heads (1) with
    # attention_k_eq_v (no v_proj: K serves as V); the last num_kv_shared_layers (2) reuse earlier layers' caches
    types = ["sliding_attention", "sliding_attention", "full_attention"] * 2
    spec = _meta_spec({"model_type": "gemma4_text", "architectures": ["Gemma4ForCausalLM"], "hidden_size": 64,
                       "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                       "global_head_dim": 32, "num_global_key_value_heads": 1, "attention_k_eq_v": True,
                       "num_kv_shared_layers": 2, "vocab_size": 97, "intermediate_size": 96, "sliding_window": 32,
                       "vocab_size_per_layer_input": 97, "hidden_size_per_layer_input": 8, "layer_types": types})
    assert [layer.attention.kv_reused for layer in spec.layers] == [False] * 4 + [True] * 2
    layers = kv_layers(spec.layer_kinds(), 1, 2)
    # sliding layers 0, 1, 3: 2 KV heads x (16 + 16) x 2 B = 128 B/token; full layer 2: 1 head x 32 (K = V) x 2 = 64
    assert sorted(layers, key=lambda item: item[0].kind) == [(KVLayer("full", 64), 1),
                                                            (KVLayer("sliding", 128, window=32), 3)]


def test_mla_with_a_sparse_attention_indexer() -> None:
    # DeepSeek-V3.2: the MLA latent 512 + 64 = 576 x 2 B = 1,152 B/token, and the indexer's keys: vLLM
    # DeepseekV32IndexerCache, 128 fp8 values + 128 / 128 fp32 scales x 4 B = 132 B/token (uint8, any KV dtype)
    layer = _layer(kind="mla", num_heads=128, num_kv_heads=128, head_dim=192, v_head_dim=128, kv_lora_rank=512,
                   qk_rope_head_dim=64, index_head_dim=128)
    from memest.estimate.serving.kv import kv_caches

    assert kv_caches(layer, 1, 2) == (KVLayer("mla", 1_152), KVLayer("mla", 132))
    assert kv_caches(layer, 1, 1)[1].bytes_per_token == 132  # fp8 KV: the indexer is unchanged
    # transformers DynamicIndexedLayer: the keys at the cache dtype, 128 x 2 B
    assert kv_caches(layer, 1, 2, transformers=True)[1] == KVLayer("full", 256)
    # vLLM: both specs are full attention of different widths: one group, a page of 61 x (1,152 + 132) x 16 B
    layout = paged_layout(kv_layers([(layer, 61)], 1, 2), 16)
    assert layout.page_bytes == 61 * (1_152 + 132) * 16 and len(layout.groups) == 1


def test_compressed_attention_caches() -> None:
    """DeepSeek-V4 CSA layer (head_dim 512, one KV head, window 128, compress rate 4, indexer keys of 128), bf16:
    the window of K = V, 512 x 2 = 1,024 B/token; the compressor, one 1,024 B entry per 4 tokens; the indexer, one
    128 x 2 = 256 B key per 4 tokens. transformers also holds the open window's kv + gate (2 x 512 wide each for the
    overlapping CSA compressor: 4 x 512 x 2 = 4,096 B/token; indexer 4 x 128 x 2 = 1,024) and the overlap state
    (4 slots x 512 x (2 B kv + 4 B fp32 gate) = 12,288; indexer 4 x 128 x 6 = 3,072). An HCA layer (rate 128) has
    no overlap: its buffer is 2 x 512 x 2 = 2,048 B/token."""
    from memest.estimate.serving.kv import kv_caches

    csa = _layer(num_heads=64, num_kv_heads=1, head_dim=512, sliding_window=128, kv_shared=True, compress_rate=4,
                 compress_overlap=True, index_head_dim=128)
    assert kv_caches(csa, 1, 2) == (KVLayer("sliding", 1_024, window=128),
                                    KVLayer("compressed", 1_024, compress_rate=4),
                                    KVLayer("compressed", 256, compress_rate=4))
    # one KV head: tensor parallelism replicates it
    assert kv_caches(csa, 8, 2) == kv_caches(csa, 1, 2)
    window, entries, keys = kv_caches(csa, 1, 2, transformers=True)
    assert (entries.pending_bytes, entries.overlap_bytes, keys.pending_bytes, keys.overlap_bytes) == (
        4 * 512 * 2, 4 * 512 * 6, 4 * 128 * 2, 4 * 128 * 6)
    # 10 tokens after a decode step: 2 entries, (10 - 1) mod 4 + 1 = 2 buffered tokens, the overlap state
    assert entries.sequence_bytes(10) == 2 * 1_024 + 2 * 4_096 + 12_288 == 22_528
    # after a prefill of 10 tokens the buffer is a view of the whole prompt's projection: 10 tokens of it
    assert entries.prefill_bytes(10) == 2 * 1_024 + 10 * 4_096 + 12_288 == 55_296
    # per generated token (windows ignored): 1,024 + 1,024 / 4 + 256 / 4 = 1,344
    assert bytes_per_token([(kv, 1) for kv in kv_caches(csa, 1, 2)]) == 1_344
    hca = _layer(num_heads=64, num_kv_heads=1, head_dim=512, sliding_window=128, kv_shared=True, compress_rate=128)
    assert kv_caches(hca, 1, 2, transformers=True)[1] == KVLayer("compressed", 1_024, compress_rate=128,
                                                                pending_bytes=2_048)
    # a plain sliding_attention layer of V4: transformers' DynamicSlidingWindowLayer keeps the tensor twice
    swa = _layer(num_heads=64, num_kv_heads=1, head_dim=512, sliding_window=128, kv_shared=True,
                 kv_copied_by_transformers=True)
    assert kv_layer(swa, 1, 2).bytes_per_token == 1_024
    assert kv_layer(swa, 1, 2, transformers=True).bytes_per_token == 2_048
