"""Families added for the models users run now: parameter counts and caches derived by hand.

Every catalog config is also counted against transformers on the meta device (tests/test_params.py);
the figures here are the arithmetic behind them and the per-token / per-request caches:

- DeepSeek-V3.2 (``deepseek_v32``) and GLM-5 (``glm_moe_dsa``): MLA plus the DSA lightning indexer.
  vLLM's indexer cache: ``Indexer.__init__`` in ``vllm/model_executor/models/deepseek_v2.py``
  (vllm-project/vllm @ 002d6073aa034d4f5545d45021b0e56d1f3c3593) makes a ``DeepseekV32IndexerCache``
  of ``head_dim = index_head_dim + index_head_dim // quant_block_size * 4`` (quant_block_size 128),
  dtype uint8, whose ``get_kv_cache_spec`` is an ``MLAAttentionSpec`` of one KV head: fp8 keys and
  one fp32 scale per 128, 128 + 4 = 132 B per token and layer whatever ``--kv-cache-dtype`` is.
- Llama 4: the rotary layers attend within ``attention_chunk_size`` chunks (vLLM
  ``ChunkedLocalAttentionSpec``), the NoPE layers fully.
"""

from __future__ import annotations

import json

from memest.estimate.serving.kv import (
    KVLayer,
    bytes_per_token,
    contiguous_cache_bytes,
    kv_layers,
    paged_layout,
)
from memest.sources import load_model, spec_from_config
from memest.sources.config import HFConfig


def _spec(raw: dict):
    return spec_from_config(HFConfig(json.loads(json.dumps(raw)), name="test", source="test"))


# ---- DeepSeek Sparse Attention ----------------------------------------------------------------------


def test_deepseek_v32_is_deepseek_v3_plus_an_indexer_per_layer() -> None:
    """DeepSeek-V3.2's config is DeepSeek-V3's geometry (h 7168, 61 layers, q_lora_rank 1536) plus
    index_n_heads 64 x index_head_dim 128. Each layer's indexer: wq_b 1536 x (64 x 128) = 12,582,912,
    wk 7168 x 128 = 917,504, k_norm LayerNorm 2 x 128 = 256, weights_proj 7168 x 64 = 458,752:
    13,959,424 per layer, 851,524,864 for 61 layers."""
    v3 = load_model("deepseek-ai/DeepSeek-V3")
    v32 = load_model("deepseek-ai/DeepSeek-V3.2")
    per_layer = 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64
    assert per_layer == 13_959_424
    assert v32.num_params - v3.num_params == 61 * per_layer == 851_524_864
    # DeepSeek's "671B" (the MTP layer the checkpoint also stores is not instantiated: the 685B of the repo)
    assert v32.num_params == 671_877_929_216
    assert all(layer.attention.index_head_dim == 128 for layer in v32.layers)
    assert any("lightning indexer" in note for note in v32.notes)


def test_deepseek_v32_kv_per_token() -> None:
    """Per layer and token on one rank: the MLA latent (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 B
    = 1,152 B, and the indexer's 132 B (fp8 + scale, any KV dtype): 61 x 1,284 = 78,324 B/token.
    With an fp8 KV cache the latent is 576 B and the indexer still 132: 61 x 708 = 43,188."""
    spec = load_model("deepseek-ai/DeepSeek-V3.2")
    layers = kv_layers(spec.layer_kinds(), 1, 2)
    assert sorted(layers, key=lambda item: item[0].bytes_per_token) == [(KVLayer("mla", 132), 61),
                                                                       (KVLayer("mla", 1_152), 61)]
    assert bytes_per_token(layers) == 61 * 1_284 == 78_324
    assert bytes_per_token(kv_layers(spec.layer_kinds(), 1, 1)) == 61 * 708 == 43_188
    # MLA is not split by tensor parallelism (one latent per token): tp 8 caches the same per rank
    assert bytes_per_token(kv_layers(spec.layer_kinds(), 8, 2)) == 78_324


def test_glm5_total_and_kv() -> None:
    """GLM-5 (zai-org/GLM-5): 744B parameters in Z.ai's announcement ("744B parameters (40B active)");
    78 layers of MLA (512 + 64) with an indexer of 32 heads x 128 in every layer:
    78 x (576 x 2 + 132) = 78 x 1,284 = 100,152 B/token in bf16."""
    spec = load_model("zai-org/GLM-5")
    assert round(spec.num_params / 1e9) == 744
    assert bytes_per_token(kv_layers(spec.layer_kinds(), 1, 2)) == 78 * 1_284 == 100_152


def test_glm_moe_dsa_shared_indexer_layers_cache_no_indexer_keys() -> None:
    """GLM-5.2 style index_topk_freq 4 / index_skip_topk_offset 3 (GlmMoeDsaConfig: layer n runs its
    indexer iff max(n - 2, 0) % 4 == 0): of 8 layers, 0, 1, 2 and 6 do; 3, 4, 5, 7 reuse the top-k.
    Per token (bf16, kv_lora_rank 16 + rope 4 = 20 x 2 = 40 B; index_head_dim 128 -> 132 B):
    8 x 40 + 4 x 132 = 848."""
    raw = {"model_type": "glm_moe_dsa", "hidden_size": 64, "num_hidden_layers": 8, "num_attention_heads": 4,
           "vocab_size": 97, "intermediate_size": 96, "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
           "qk_rope_head_dim": 4, "v_head_dim": 8, "index_n_heads": 2, "index_head_dim": 128, "index_topk_freq": 4,
           "index_skip_topk_offset": 3, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}
    spec = _spec(raw)
    assert [layer.attention.index_head_dim for layer in spec.layers] == [128, 128, 128, 0, 0, 0, 128, 0]
    assert bytes_per_token(kv_layers(spec.layer_kinds(), 1, 2)) == 8 * 40 + 4 * 132 == 848
    # the explicit list wins over the schedule
    listed = _spec({**raw, "indexer_types": ["full"] + ["shared"] * 7})
    assert [layer.attention.index_head_dim for layer in listed.layers] == [128] + [0] * 7


# ---- Llama 4 chunked local attention ---------------------------------------------------------------


def test_llama4_scout_chunked_layers_hold_one_chunk() -> None:
    """Scout: 48 layers, every fourth NoPE (full), the other 36 chunked at 8192; 8 KV heads x 128.
    Per layer and token: 8 x (128 + 128) x 2 B = 4,096 B; 48 x 4,096 = 196,608 B/token before windows.

    vLLM (block 16, max_model_len 131,072, max_num_batched_tokens 8,192), one request:
    chunked layers cdiv(min(8192 + 8192, 131072), 16) = 1,024 pages, full layers 131072 / 16 = 8,192;
    (36 x 1,024 + 12 x 8,192) pages x 16 x 4,096 B = 135,168 x 65,536 = 8,858,370,048 B (8.25 GiB),
    against 48 x 8,192 x 65,536 = 25,769,803,776 B when every layer is counted as full attention.
    Groups: 12 layers each (min(36, 12)), three chunked and one full.
    """
    spec = load_model("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    layers = kv_layers(spec.layer_kinds(), 1, 2)
    assert sorted(layers, key=lambda item: item[0].kind) == [(KVLayer("chunked", 4_096, window=8_192), 36),
                                                            (KVLayer("full", 4_096), 12)]
    assert bytes_per_token(layers) == 196_608
    layout = paged_layout(layers, 16)
    assert [(g.kind, g.num_layers) for g in layout.groups] == [("chunked", 12)] * 3 + [("full", 12)]
    assert layout.request_bytes(131_072, 8_192) == (36 * 1_024 + 12 * 8_192) * 16 * 4_096 == 8_858_370_048
    # transformers (DynamicSlidingWindowLayer of the chunk): one sequence of 20,000 tokens keeps
    # 36 x 8,192 + 12 x 20,000 positions x 4,096 B
    assert contiguous_cache_bytes(layers, 1, 20_000) == (36 * 8_192 + 12 * 20_000) * 4_096


def test_llama4_without_a_chunk_size_attends_fully() -> None:
    raw = {"model_type": "llama4_text", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 97, "intermediate_size": 32,
           "intermediate_size_mlp": 96, "num_local_experts": 2, "attention_chunk_size": None}
    spec = _spec(raw)
    assert [layer.attention.chunk_size for layer in spec.layers] == [None] * 4
    assert not spec.notes
    chunked = _spec({**raw, "attention_chunk_size": 64})
    assert [layer.attention.chunk_size for layer in chunked.layers] == [64, 64, 64, None]
