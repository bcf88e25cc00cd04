"""KV cache per token and vLLM's paged layout, against hand-computed numbers."""

from __future__ import annotations

import pytest

from memest.estimate.serving.kv import (
    KVLayer,
    bytes_per_token,
    contiguous_cache_bytes,
    kv_bytes_per_token,
    kv_layer,
    kv_layers,
    paged_layout,
)
from memest.sources import load_model
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, StateSpec
from memest.workload import Parallelism, ServingConfig

MLP = MLPSpec(gated=True, intermediate_size=128)


def _layer(**attention) -> LayerSpec:
    return LayerSpec(attention=AttentionSpec(**attention), mlp=MLP)


@pytest.mark.parametrize(
    ("tp", "kv_cache_dtype", "expected"),
    [
        # Llama-3.1-8B: 32 layers x 8 KV heads x head_dim 128, K and V, 2 bytes: 2*8*128*2*32
        (1, "auto", 2 * 8 * 128 * 2 * 32),
        (2, "auto", 2 * 4 * 128 * 2 * 32),
        (8, "auto", 2 * 1 * 128 * 2 * 32),
        # tp 16 > 8 KV heads: each rank keeps one (replicated) head
        (16, "auto", 2 * 1 * 128 * 2 * 32),
        (1, "fp8", 2 * 8 * 128 * 1 * 32),
    ],
    ids=["tp1", "tp2", "tp8", "tp16-replicated", "fp8"],
)
def test_llama31_8b_kv_bytes_per_token(tp: int, kv_cache_dtype: str, expected: int) -> None:
    spec = load_model("meta-llama/Llama-3.1-8B-Instruct")
    s = ServingConfig(kv_cache_dtype=kv_cache_dtype, parallelism=Parallelism(tp=tp))
    assert kv_bytes_per_token(spec, s) == expected


def test_qwen25_7b_kv_bytes_per_token() -> None:
    # case vllm019_qwen25_7b_tp1 caveat: 28 layers x 4 KV heads x 128 -> 56 KiB/token in bf16
    spec = load_model("Qwen/Qwen2.5-7B-Instruct")
    assert kv_bytes_per_token(spec, ServingConfig()) == 56 * 1024


def test_mla_latent_is_not_split_by_tp() -> None:
    # DeepSeek-V2-Lite: kv_lora_rank 512 + qk_rope_head_dim 64 = 576 values/token/layer (case
    # vllm019_deepseek_v2_lite_tp1 caveat), 2 bytes each, the same on every TP rank
    layer = _layer(kind="mla", num_heads=16, num_kv_heads=16, head_dim=192, v_head_dim=128,
                   kv_lora_rank=512, qk_rope_head_dim=64)
    assert kv_layer(layer, 1, 2).bytes_per_token == 576 * 2
    assert kv_layer(layer, 4, 2).bytes_per_token == 576 * 2
    # 27 layers
    assert bytes_per_token(kv_layers([(layer, 27)], 1, 2)) == 27 * 1152


def test_mamba_state_is_per_sequence_and_split_by_tp() -> None:
    state = StateSpec(conv_channels=100, conv_kernel=5, ssm_elements=600)
    layer = _layer(kind="mamba", num_heads=0, num_kv_heads=0, head_dim=0, state=state)
    kv = kv_layer(layer, 2, 2)
    # vLLM, tp 2: conv 100 / 2 channels x (5 - 1) columns = 200, SSM 600 / 2 = 300: 500 x 2 B
    assert kv.kind == "state" and kv.bytes_per_token == 0 and kv.state_bytes == 1000
    # transformers keeps K = 5 conv columns on one rank: 100 x 5 + 600 = 1100 elements x 2 B
    assert kv_layer(layer, 1, 2, transformers=True).state_bytes == 2200


def test_uniform_layout_blocks_tokens_concurrency() -> None:
    # 32 identical layers of 131072/32 = 4096 B/token: page = 16 x 4096 = 64 KiB per layer
    layers = [(KVLayer("full", 4096), 32)]
    layout = paged_layout(layers, 16)
    available = 58 * (1 << 30) + 12345
    blocks = available // (16 * 4096) // 32  # vLLM get_num_blocks
    assert layout.num_blocks(available) == blocks
    assert layout.tokens(blocks) == blocks * 16
    # max concurrency at 8192 tokens: blocks / cdiv(8192, 16)
    assert layout.max_concurrency(blocks, 8192, 8192) == pytest.approx(blocks / 512)
    # one request of 8193 tokens needs 513 pages in each of the 32 layers
    assert layout.request_bytes(8193, 8192) == 513 * 16 * 4096 * 32


def test_hybrid_layout_groups_sliding_and_full_layers() -> None:
    # 4 sliding (window 4096) + 2 full layers, 1024 B/token each: group_size = 2 (4 >= 1.5 x 2),
    # so 2 sliding groups + 1 full group = 3 groups; a block spans 2 layers (one per pool)
    layers = [(KVLayer("sliding", 1024, window=4096), 4), (KVLayer("full", 1024), 2)]
    layout = paged_layout(layers, 16)
    assert len(layout.groups) == 3
    page = 16 * 1024
    available = 10 * (1 << 30)
    blocks = available // page // 2
    assert layout.num_blocks(available) == blocks
    assert layout.tokens(blocks) == blocks // 3 * 16
    # per request at L = 8192, max_num_batched_tokens 8192: full 8192/16 = 512 pages; each sliding
    # group cdiv(min(4095 + 8192, 8192), 16) + 1 = 513 pages
    assert layout.blocks_per_request(8192, 8192) == 512 + 2 * 513
    # short requests: sliding groups need cdiv(L, 16) + 1 pages
    assert layout.blocks_per_request(100, 8192) == 7 + 2 * (7 + 1)


def test_mixed_width_full_layers_share_one_page() -> None:
    # UniformTypeKVCacheSpecs: full layers of 1024 and 2048 B/token -> one group, page = sum of pages
    layers = [(KVLayer("full", 1024), 3), (KVLayer("full", 2048), 1)]
    layout = paged_layout(layers, 16)
    page = 16 * (3 * 1024 + 2048)
    assert layout.num_blocks(100 * page + 5) == 100
    assert layout.request_bytes(32, 2048) == 2 * page


def test_mamba_hybrid_grows_attention_block_size() -> None:
    # attention 1024 B/token; mamba state 100,000 B: block = 16 x cdiv(100000, 16 x 1024) = 112 tokens
    layers = [(KVLayer("full", 1024), 1), (KVLayer("state", 0, state_bytes=100_000), 7)]
    layout = paged_layout(layers, 16)
    assert layout.groups[0].block_size == 112
    assert layout.page_bytes == 112 * 1024


def test_contiguous_cache_caps_sliding_layers() -> None:
    layers = [(KVLayer("full", 100), 2), (KVLayer("sliding", 100, window=10), 1)]
    # 3 sequences x 50 tokens: full 2 x 100 x 50 x 3, sliding 100 x 10 x 3
    assert contiguous_cache_bytes(layers, 3, 50) == 2 * 100 * 50 * 3 + 100 * 10 * 3
