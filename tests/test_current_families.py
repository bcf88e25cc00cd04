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

import pytest

from memest.errors import ConfigError, InputError
from memest.estimate.serving.kv import (
    KVLayer,
    approximate_gcd,
    bytes_per_token,
    contiguous_cache_bytes,
    deepseek_v4_pages,
    kv_layers,
    paged_layout,
    vllm_layout,
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


# ---- config-only families: MiMo and Nemotron-NAS (DeciLM) -------------------------------------------


def test_mimo_7b_is_qwen2_plus_its_mtp_layer() -> None:
    """MiMo-7B-Base: h 4096, 36 layers, 32 heads / 8 KV heads of 128, i 11008, vocab 151680, untied, one
    MTP layer (model card: "7B"). A Qwen2 layer: Q 4096 x 4096 + 4096 bias, K and V 4096 x 1024 + 1024 each,
    O 4096 x 4096, MLP 3 x 4096 x 11008, two norms: 177,223,680. The MTP layer adds to one such layer three
    norms and input_proj 8192 x 4096: 177,223,680 + 3 x 4096 + 33,554,432 = 210,790,400.
    Total: 36 x 177,223,680 + 2 x 151680 x 4096 + 4096 + 210,790,400 = 7,833,409,536."""
    layer = (4096 * 4096 + 4096) + 2 * (4096 * 1024 + 1024) + 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096
    assert layer == 177_223_680
    mtp = layer + 3 * 4096 + 8192 * 4096
    assert mtp == 210_790_400
    spec = load_model("XiaomiMiMo/MiMo-7B-Base")
    assert spec.num_params == 36 * layer + 2 * 151_680 * 4_096 + 4_096 + mtp == 7_833_409_536
    assert spec.model_type == "mimo" and len(spec.layers) == 36
    # KV only in the 36 decoder layers: 36 x 8 x (128 + 128) x 2 B = 147,456 B/token
    assert bytes_per_token(kv_layers(spec.layer_kinds(), 1, 2)) == 36 * 8 * 256 * 2 == 147_456
    assert any("multi-token-prediction" in note for note in spec.notes)


def test_nemotron_super_49b_blocks() -> None:
    """Llama-3.3-Nemotron-Super-49B-v1 (h 8192, 64 heads of 128, vocab 128256, untied): of its 80 blocks,
    49 have attention (n_heads_in_group 8: 8 KV heads), 31 none (no_op: no input_layernorm either);
    every block has an FFN, ffn_mult -> int(2 x mult x 8192 / 3) rounded up to 256:
    5.25 -> 28672 (49 blocks), 1.3125 -> 7168 (10), 1.0 -> 5461 -> 5632 (8), 0.5 -> 2730 -> 2816 (6),
    2.625 -> 14336 (6), 3.28125 -> 17920 (1).
    Attention block: norm 8192 + Q, O 2 x 8192^2 + K, V 2 x 8192 x 1024 = 151,003,136.
    FFN block: norm 8192 + 3 x 8192 x i. NVIDIA's name: "49B"."""
    spec = load_model("nvidia/Llama-3_3-Nemotron-Super-49B-v1")
    attention = 8192 + 2 * 8192 * 8192 + 2 * 8192 * 1024
    assert attention == 151_003_136
    widths = {28672: 49, 7168: 10, 5632: 8, 2816: 6, 14336: 6, 17920: 1}
    ffn = sum((8192 + 3 * 8192 * i) * n for i, n in widths.items())
    total = 49 * attention + ffn + 2 * 128_256 * 8_192 + 8_192
    assert spec.num_params == total == 49_867_145_216
    assert abs(total - 49e9) / 49e9 < 0.02
    assert sorted({layer.mlp.intermediate_size for layer in spec.layers}) == sorted(widths)
    kinds = [layer.attention.kind for layer in spec.layers]
    assert kinds.count("gqa") == 49 and kinds.count("none") == 31
    # KV: 49 layers x 8 KV heads x (128 + 128) x 2 B = 200,704 B/token (a Llama-3.3-70B caches 80 x 4,096)
    assert bytes_per_token(kv_layers(spec.layer_kinds(), 1, 2)) == 49 * 8 * 256 * 2 == 200_704


def test_nemotron_nas_linear_blocks_and_bad_blocks() -> None:
    from memest.errors import ConfigError

    full = {"attention": {"n_heads_in_group": 2, "no_op": False}, "ffn": {"ffn_mult": 1.5, "no_op": False}}
    linear = {"attention": {"replace_with_linear": True}, "ffn": {"replace_with_linear": True}}
    noop = {"attention": {"no_op": True}, "ffn": {"no_op": True}}
    raw = {"model_type": "nemotron-nas", "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
           "vocab_size": 97, "block_configs": [full, linear, noop]}
    spec = _spec(raw)
    # full: norm 64 + Q, O 2 x 64^2 + K, V 2 x 64 x 32 + FFN norm 64 + 3 x 64 x 256 (int(2 x 1.5 x 64 / 3) = 64 -> 256)
    # linear: 2 x (norm 64 + 64 x 64); no-op: nothing; embedding + lm_head 2 x 97 x 64, final norm 64
    full_params = 64 + 2 * 64 * 64 + 2 * 64 * 32 + 64 + 3 * 64 * 256
    assert spec.num_params == full_params + 2 * (64 + 64 * 64) + 2 * 97 * 64 + 64
    assert [layer.attention.kind for layer in spec.layers] == ["gqa", "none", "none"]
    with pytest.raises(ConfigError, match=r"block_configs\[0\].attention.window_length = 128"):
        _spec({**raw, "block_configs": [{**full, "attention": {"n_heads_in_group": 2, "window_length": 128}},
                                        linear, noop]})
    with pytest.raises(ConfigError, match=r"'block_configs' must list 3 blocks"):
        _spec({**raw, "block_configs": [full]})
    with pytest.raises(ConfigError, match=r"n_heads_in_group = 3"):
        _spec({**raw, "block_configs": [{**full, "attention": {"n_heads_in_group": 3}}, linear, noop]})


# ---- the catalog models added with these families, against their published totals ------------------


@pytest.mark.parametrize(("model_id", "published", "tolerance"), [
    # Qwen3 model cards ("Number of Parameters": 0.6B, 1.7B, 32.8B; Qwen3-Coder: "480B total, 35B activated")
    ("Qwen/Qwen3-0.6B", 0.6e9, 0.01),
    ("Qwen/Qwen3-1.7B", 1.7e9, 0.02),
    ("Qwen/Qwen3-32B", 32.8e9, 0.002),
    ("Qwen/Qwen3-Coder-480B-A35B-Instruct", 480e9, 0.001),
    # NVIDIA model cards: Nemotron 3 Nano "31.6B total parameters"; Nemotron 3 Super "120B"; Nemotron-H "56B"
    ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", 31.6e9, 0.002),
    ("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8", 120e9, 0.01),
    ("nvidia/Nemotron-H-56B-Base-8K", 56e9, 0.01),
    # Z.ai: GLM-5 and GLM-5.1 "744B parameters"
    ("zai-org/GLM-5.1", 744e9, 0.001),
], ids=["qwen3-0.6b", "qwen3-1.7b", "qwen3-32b", "qwen3-coder-480b", "nemotron3-nano", "nemotron3-super",
        "nemotron-h-56b", "glm-5.1"])
def test_new_catalog_models_match_published_totals(model_id: str, published: float, tolerance: float) -> None:
    assert abs(load_model(model_id).num_params - published) <= tolerance * published


def test_qwen3_small_models_non_embedding_counts() -> None:
    """The Qwen3 cards also give the count without the (tied) embedding: 0.6B -> 0.44B (151936 x 1024),
    1.7B -> 1.4B (151936 x 2048), 32B -> 31.2B (untied: 2 x 151936 x 5120)."""
    for model_id, rows, published in (("Qwen/Qwen3-0.6B", 151_936 * 1_024, 0.44e9),
                                      ("Qwen/Qwen3-1.7B", 151_936 * 2_048, 1.4e9),
                                      ("Qwen/Qwen3-32B", 2 * 151_936 * 5_120, 31.2e9)):
        assert abs(load_model(model_id).num_params - rows - published) <= 0.01 * published, model_id


def test_minimax_m25_has_m27s_architecture() -> None:
    """MiniMax-M2.5 and M2.7 configs name the same geometry (62 layers, h 3072, 256 experts): the count
    checked against M2.7's published total in tests/test_params.py holds for M2.5."""
    assert load_model("MiniMaxAI/MiniMax-M2.5").num_params == load_model("MiniMaxAI/MiniMax-M2.7").num_params


def test_glm52_drops_the_indexers_of_its_shared_layers() -> None:
    """GLM-5.2 = GLM-5's geometry with 57 of 78 layers 'shared' (indexer_types). GLM-5's indexer per layer:
    wq_b 2048 x (32 x 128) = 8,388,608, wk 6144 x 128 = 786,432, k_norm 256, weights_proj 6144 x 32 =
    196,608: 9,371,904; 57 x 9,371,904 = 534,198,528 fewer parameters, and 57 x 132 B/token less cache."""
    glm5, glm52 = load_model("zai-org/GLM-5"), load_model("zai-org/GLM-5.2")
    per_layer = 2048 * 32 * 128 + 6144 * 128 + 256 + 6144 * 32
    assert per_layer == 9_371_904
    assert glm5.num_params - glm52.num_params == 57 * per_layer == 534_198_528
    assert (bytes_per_token(kv_layers(glm5.layer_kinds(), 1, 2))
            - bytes_per_token(kv_layers(glm52.layer_kinds(), 1, 2))) == 57 * 132


# ---- towers: Voxtral's audio encoder, LFM2-VL's SigLIP2 --------------------------------------------


def test_voxtral_mini_counts_its_audio_tower() -> None:
    """Voxtral-Mini-3B-2507. Audio encoder (Whisper large-v3's: d 1280, 32 layers, ffn 5120, 128 mels,
    1500 positions): per layer Q/V/out 3 x (1280^2 + 1280) + K 1280^2 = 6,557,440, two LayerNorms 5,120,
    fc1 1280 x 5120 + 5120 = 6,558,720, fc2 5120 x 1280 + 1280 = 6,554,880: 19,676,160; x 32 = 629,637,120;
    conv1 1280 x 128 x 3 + 1280 = 492,800, conv2 1280 x 1280 x 3 + 1280 = 4,916,480, positions
    1500 x 1280 = 1,920,000, final LayerNorm 2,560: 636,968,960. Projector 5120 x 3072 + 3072^2 =
    25,165,824. Text (Llama, h 3072, 30 layers, 32 heads / 8 KV of 128, i 8192, V 131072, untied):
    per layer 2 x 3072 x 4096 + 2 x 3072 x 1024 + 3 x 3072 x 8192 + 2 x 3072 = 106,960,896;
    30 x that + 2 x 131072 x 3072 + 3072 = 4,014,136,320. Total 4,676,271,104: 14.2% is the tower and
    projector. Mistral's card: "~9.5 GB of GPU RAM in bf16" (4.68e9 x 2 B = 9.35 GB of weights)."""
    tower = 32 * (3 * (1280**2 + 1280) + 1280**2 + 5120 + 1280 * 5120 + 5120 + 5120 * 1280 + 1280)
    tower += 1280 * 128 * 3 + 1280 + 1280 * 1280 * 3 + 1280 + 1500 * 1280 + 2560
    assert tower == 636_968_960
    projector = 5120 * 3072 + 3072**2
    text = 30 * (2 * 3072 * 4096 + 2 * 3072 * 1024 + 3 * 3072 * 8192 + 2 * 3072) + 2 * 131_072 * 3_072 + 3_072
    assert text == 4_014_136_320
    spec = load_model("mistralai/Voxtral-Mini-3B-2507")
    assert spec.num_params == tower + projector + text == 4_676_271_104
    from memest.spec import Component
    assert spec.params_by_component()[Component.OTHER] == tower + projector
    # the encoder caches nothing; the text model 30 x 8 x (128 + 128) x 2 B = 122,880 B/token
    assert bytes_per_token(kv_layers(spec.layer_kinds(), 1, 2)) == 30 * 8 * 256 * 2 == 122_880


def test_lfm2_vl_is_lfm2_plus_siglip2_and_projector() -> None:
    """A shrunk LFM2-VL: LFM2 text h 64, 4 layers (conv, attention, conv, conv), 4 heads / 2 KV of 16,
    block_ff_dim 192 -> int(2 x 192 / 3) = 128 -> 256 (multiple of 256), V 97, tied; SigLIP2 vh 32, 2 layers,
    i 48, patch 4 over 3 channels, 64 positions, no pooling head; projector f 2: LayerNorm 2 x 128,
    linear_1 128 x 40 + 40, linear_2 40 x 64 + 64.

    SigLIP2: patch Linear 48 x 32 + 32 = 1,568, positions 64 x 32 = 2,048; a layer 4 x (32^2 + 32) +
    2 LayerNorms 128 + fc1 32 x 48 + 48 + fc2 48 x 32 + 32 = 4,224 + 128 + 1,584 + 1,568 = 7,504; post LayerNorm 64:
    1,568 + 2,048 + 2 x 7,504 + 64 = 18,688. Projector 256 + 5,160 + 2,624 = 8,040.
    LFM2: feed-forward 3 x 64 x 256 + 2 norms 128 = 49,280 per layer; a conv layer adds in_proj
    192 x 64, conv (64, 1, 3), out_proj 64 x 64: 16,576; the attention layer Q, O 2 x 64^2, K, V 2 x 64 x 32,
    q/k norms 2 x 16: 12,320. Embedding 97 x 64 = 6,208, final norm 64.

    Caches (bf16, vLLM): the attention layer 2 x 16 x 2 x 2 B = 128 B/token; each conv layer a state of
    64 channels x (3 - 1) columns x 2 B = 256 B per sequence, 3 x 256 = 768."""
    raw = {"model_type": "lfm2_vl", "architectures": ["Lfm2VlForConditionalGeneration"], "projector_hidden_size": 40,
           "text_config": {"model_type": "lfm2", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                           "num_key_value_heads": 2, "vocab_size": 97, "block_ff_dim": 192,
                           "layer_types": ["conv", "full_attention", "conv", "conv"]},
           "vision_config": {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                             "num_attention_heads": 4, "patch_size": 4, "num_patches": 64, "vision_use_head": False}}
    spec = _spec(raw)
    vision = 1_568 + 2_048 + 2 * 7_504 + 64
    assert vision == 18_688
    projector = 2 * 128 + (128 * 40 + 40) + (40 * 64 + 64)
    ff = 3 * 64 * 256 + 128
    conv = 192 * 64 + 64 * 3 + 64 * 64
    attention = 2 * 64 * 64 + 2 * 64 * 32 + 2 * 16
    assert spec.num_params == vision + projector + 4 * ff + 3 * conv + attention + 97 * 64 + 64
    from memest.estimate.serving.kv import state_bytes_per_sequence
    layers = kv_layers(spec.layer_kinds(), 1, 2)
    assert bytes_per_token(layers) == 2 * 16 * 2 * 2 == 128
    assert state_bytes_per_sequence(layers) == 3 * 64 * 2 * 2 == 768


def test_lfm2_vl_unknown_layer_type_names_the_key() -> None:
    from memest.errors import ConfigError

    raw = {"model_type": "lfm2_vl", "text_config": {"hidden_size": 64, "num_hidden_layers": 2,
                                                    "num_attention_heads": 4, "num_key_value_heads": 2,
                                                    "layer_types": ["conv", "foo"]}}
    with pytest.raises(ConfigError, match=r"layer_types\[1\] = 'foo'"):
        _spec(raw)


# ---- Gemma 4: global layers with K = V, KV sharing, per-layer embeddings --------------------------


def test_gemma4_31b_count_by_hand() -> None:
    """gemma-4-31B-it: h 5376, 60 layers (5 sliding then 1 full), 32 query heads; sliding layers 16 KV heads of 256,
    full layers attention_k_eq_v with 4 global KV heads of 512 (no v_proj); i 21504; V 262144, tied.
    Sliding layer: Q, O 2 x 5376 x 8192 + K, V 2 x 5376 x 4096 = 132,120,576, q/k norms 512, MLP 3 x 5376 x 21504 =
    346,816,512, four norms 21,504: 478,959,104. Full layer: Q, O 2 x 5376 x 16384 + K 5376 x 2048 = 187,170,816,
    norms 1,024 + 346,816,512 + 21,504 = 534,009,856. Text: 50 x 478,959,104 + 10 x 534,009,856 + 262144 x 5376
    + 5376 = 30,697,345,280. Vision (27 layers, vh 1152 = 16 heads x 72, i 4304): a layer 4 x 1152^2 + 144 +
    3 x 1152 x 4304 + 4 x 1152 = 20,187,792; x 27 = 545,070,384; positions 2 x 10240 x 1152 = 23,592,960, patch
    projection 1152 x 768 = 884,736, embed_vision 5376 x 1152 = 6,193,152: 575,741,232. Total 31,273,086,512."""
    sliding = 2 * 5376 * 8192 + 2 * 5376 * 4096 + 512 + 3 * 5376 * 21504 + 4 * 5376
    full = 2 * 5376 * 16384 + 5376 * 2048 + 1024 + 3 * 5376 * 21504 + 4 * 5376
    assert (sliding, full) == (478_959_104, 534_009_856)
    text = 50 * sliding + 10 * full + 262_144 * 5_376 + 5_376
    vision = 27 * (4 * 1152**2 + 144 + 3 * 1152 * 4304 + 4 * 1152) + 2 * 10240 * 1152 + 1152 * 768 + 5376 * 1152
    assert (text, vision) == (30_697_345_280, 575_741_232)
    spec = load_model("google/gemma-4-31B-it")
    assert spec.num_params == text + vision == 31_273_086_512
    # KV per token (bf16): sliding 16 x (256 + 256) x 2 = 16,384; full 4 x 512 x 2 = 4,096 (K serves as V: once)
    layers = kv_layers(spec.layer_kinds(), 1, 2)
    assert sorted(layers, key=lambda item: item[0].kind) == [(KVLayer("full", 4_096), 10),
                                                            (KVLayer("sliding", 16_384, window=1_024), 50)]
    assert bytes_per_token(layers) == 50 * 16_384 + 10 * 4_096 == 860_160


def test_gemma4_26b_a4b_moe_and_kv() -> None:
    """gemma-4-26B-A4B: 30 layers (25 sliding: 8 KV heads x 256; 5 full: 2 global KV heads x 512, K = V),
    each a dense GeGLU of 2112 beside 128 experts of 704 (top 8). Per layer the experts hold
    128 x 3 x 2816 x 704 = 761,266,176. KV per token (bf16): 25 x 8 x 512 x 2 + 5 x 2 x 512 x 2 = 215,040."""
    spec = load_model("google/gemma-4-26B-A4B")
    layer = spec.layers[0]
    assert (layer.mlp.num_experts, layer.mlp.num_experts_per_tok, layer.mlp.intermediate_size,
            layer.mlp.shared_intermediate_size) == (128, 8, 704, 2112)
    experts = sum(t.numel for t in layer.tensors if t.name.startswith("experts."))
    assert experts == 128 * 3 * 2816 * 704 == 761_266_176
    assert bytes_per_token(kv_layers(spec.layer_kinds(), 1, 2)) == 25 * 8 * 512 * 2 + 5 * 2 * 512 * 2 == 215_040
    assert [layer.attention.kv_shared for layer in spec.layers[:6]] == [False] * 5 + [True]


def test_gemma4_kv_sharing_and_per_layer_embeddings() -> None:
    """A shrunk Gemma 4 "E" model: h 64, 4 layers (sliding, full, sliding, full), 4 heads; sliding 2 KV heads x 16,
    full 1 KV head x 32 with K = V; the last 2 layers (num_kv_shared_layers 2) reuse the cache of layers 0 and 1
    (no K/V projections, no k_norm) and, with use_double_wide_mlp, have MLPs 2 x 96 wide; per-layer inputs of 8.

    Layers: 0: Q, O 2 x 64 x 64 + K, V 2 x 64 x 32 + q/k norms 32 = 12,320; 1: Q, O 2 x 64 x 128 + K 64 x 32 +
    norms 64 = 18,496; 2: Q, O 8,192 + q_norm 16 = 8,208; 3: 16,384 + 32 = 16,416; MLP 3 x 64 x 96 = 18,432
    (layers 2, 3: 36,864); four norms 256; per-layer gate and projection 2 x 64 x 8 + norm 64 = 1,088.
    Model: embed 97 x 64 = 6,208, embed_tokens_per_layer 50 x (4 x 8) = 1,600, per_layer_model_projection
    64 x 32 = 2,048, its norm 8, final norm 64.
    KV (bf16): layers 0 and 1 only: 2 x 32 x 2 + 32 x 2 = 128 + 64 = 192 B/token."""
    raw = {"model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32, "intermediate_size": 96, "vocab_size": 97,
           "vocab_size_per_layer_input": 50, "hidden_size_per_layer_input": 8, "num_kv_shared_layers": 2,
           "use_double_wide_mlp": True, "attention_k_eq_v": True, "num_global_key_value_heads": 1,
           "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]}
    spec = _spec(raw)
    common = 256 + 1_088
    layers = [12_320 + 18_432, 18_496 + 18_432, 8_208 + 36_864, 16_416 + 36_864]
    assert spec.num_params == sum(x + common for x in layers) + 6_208 + 1_600 + 2_048 + 8 + 64
    assert [layer.attention.kv_reused for layer in spec.layers] == [False, False, True, True]
    assert bytes_per_token(kv_layers(spec.layer_kinds(), 1, 2)) == 2 * 32 * 2 + 32 * 2 == 192
    from memest.errors import ConfigError

    with pytest.raises(ConfigError, match=r"layer_types\[1\] = 'chunked_attention'"):
        _spec({**raw, "layer_types": ["sliding_attention", "chunked_attention", "sliding_attention",
                                      "full_attention"]})
    with pytest.raises(ConfigError, match="num_kv_shared_layers 3"):  # layers 1-3 reuse; layer 0 caches no full layer
        _spec({**raw, "num_kv_shared_layers": 3})


# ---- RWKV: a recurrent state per sequence, no KV cache ---------------------------------------------


def test_rwkv4_169m_state_and_count() -> None:
    """RWKV/rwkv-4-169m-pile: h 768, 12 blocks, vocab 50277, untied, i = 4 h = 3072 (RwkvFeedForward).
    A block: ln1, ln2 4 x 768; time mix key/value/receptance/output 4 x 768^2 = 2,359,296, time_decay /
    time_first 2 x 768, three time_mix 3 x 768; channel mix key 768 x 3072 + value 3072 x 768 + receptance 768^2 =
    5,308,416, two time_mix 2 x 768. Per block 3,072 + 2,359,296 + 1,536 + 2,304 + 5,308,416 + 1,536 = 7,676,160. Model: 12 x 7,676,160 + pre_ln 1,536 +
    embeddings and head 2 x 50277 x 768 = 77,225,472 + ln_out 1,536 = 169,342,464 (the "169m").

    State per sequence (transformers RwkvModel.forward: five (b, h, L) tensors, the two token shifts at the
    model dtype, numerator / denominator / max float32): per block 2 x 768 x 2 B + 3 x 768 x 4 B = 3,072 + 9,216
    = 12,288 B; 12 blocks 147,456 B; nothing per token."""
    from memest.estimate.serving.kv import state_bytes_per_sequence

    raw = {"model_type": "rwkv", "architectures": ["RwkvForCausalLM"], "hidden_size": 768, "num_hidden_layers": 12,
           "vocab_size": 50277, "context_length": 1024}
    spec = _spec(raw)
    block = 3_072 + 4 * 768**2 + 1_536 + 2_304 + (2 * 768 * 3072 + 768**2) + 1_536
    assert block == 7_676_160
    assert spec.num_params == 12 * block + 1_536 + 2 * 50_277 * 768 + 1_536 == 169_342_464
    assert [layer.attention.kind for layer in spec.layers] == ["linear"] * 12
    for transformers in (False, True):  # token shifts: one column in either engine
        layers = kv_layers(spec.layer_kinds(), 1, 2, transformers=transformers)
        assert bytes_per_token(layers) == 0
        assert state_bytes_per_sequence(layers) == 12 * (2 * 768 * 2 + 3 * 768 * 4) == 147_456


def test_rwkv6_finch_1b6_count_and_state() -> None:
    """RWKV/v6-Finch-1B6-HF (model_type rwkv6, remote code): h 2048, 24 blocks, head_size 64 -> 32 heads,
    vocab 65536, untied; Rwkv6Config sets intermediate_size None, so i = int(3.5 x 2048) // 32 x 32 = 7168.
    Time mix (TIME_MIX_EXTRA_DIM 32, TIME_DECAY_EXTRA_DIM 64 below h 4096): receptance / key / value / gate /
    output 5 x 2048^2 = 20,971,520; ln_x 2 x 2048; time_maa_x/w/k/v/r/g 6 x 2048; time_maa_w1 2048 x 160 and
    time_maa_w2 5 x 32 x 2048 (327,680 each); time_decay 2048; time_decay_w1 2048 x 64 and _w2 64 x 2048
    (131,072 each); time_faaaa 32 x 64: 21,909,504. Channel mix: time_maa_k/r 2 x 2048, key and value
    2 x 2048 x 7168 = 29,360,128, receptance 2048^2: 33,558,528. ln1 + ln2 4 x 2048.
    Block 55,476,224; 24 blocks 1,331,429,376 + pre_ln 4,096 + embeddings and head 2 x 65536 x 2048 +
    ln_out 4,096 = 1,599,873,024 ("1B6").

    State per sequence (state_attn_x / state_ffn_x (b, h, L) at the model dtype, state_attn_kv (b, H, S, S, L)
    float32): per block 2 x 2048 x 2 B + 32 x 64 x 64 x 4 B = 8,192 + 524,288 = 532,480 B; 24 blocks
    12,779,520 B."""
    from memest.estimate.serving.kv import state_bytes_per_sequence

    raw = {"model_type": "rwkv6", "architectures": ["Rwkv6ForCausalLM"], "hidden_size": 2048,
           "num_hidden_layers": 24, "head_size": 64, "vocab_size": 65536, "intermediate_size": None,
           "auto_map": {"AutoModelForCausalLM": "modeling_rwkv6.Rwkv6ForCausalLM"}}
    time_mix = (5 * 2048**2 + 2 * 2048 + 6 * 2048 + 2 * 2048 * 160 + 2048 + 2 * 2048 * 64 + 32 * 64)
    assert time_mix == 21_909_504
    channel_mix = 2 * 2048 + 2 * 2048 * 7168 + 2048**2
    assert channel_mix == 33_558_528
    block = time_mix + channel_mix + 4 * 2048
    spec = _spec(raw)
    assert spec.num_params == 24 * block + 4_096 + 2 * 65_536 * 2_048 + 4_096 == 1_599_873_024
    assert abs(spec.num_params - 1.6e9) / 1.6e9 < 0.001
    layers = kv_layers(spec.layer_kinds(), 1, 2)
    assert bytes_per_token(layers) == 0
    assert state_bytes_per_sequence(layers) == 24 * (2 * 2048 * 2 + 32 * 64 * 64 * 4) == 12_779_520
    # fp8 KV-cache setting or not, the time-mix state stays float32; the token shifts follow the state dtype
    assert state_bytes_per_sequence(kv_layers(spec.layer_kinds(), 1, 1, state_e=1)) == 24 * (2 * 2048 + 524_288)
    # the 7B (h 4096) takes the wider LoRA dims 64 / 128: time_maa_w1 4096 x 320 + w2 5 x 64 x 4096
    wide = _spec({**raw, "hidden_size": 4096, "num_hidden_layers": 1})
    names = {t.name: t.shape for t in wide.layers[0].tensors}
    assert names["attention.time_maa_w1"] == (4096, 320) and names["attention.time_decay_w2"] == (128, 4096)


def test_rwkv5_world_heads_from_num_attention_heads() -> None:
    """rwkv5 (RWKV/rwkv-5-world-*): the config's num_attention_heads is the head *size* (RwkvSelfAttention:
    H = h // num_attention_heads). A shrunk one: h 64, head size 16 -> 4 heads, 2 blocks, vocab 97, i given 96.
    Time mix: receptance / key / value / gate / output 5 x 64^2 = 20,480, ln_x 128, time_decay and time_faaaa
    2 x 4 x 16 = 128, four time_mix 4 x 64 = 256: 20,992. Channel mix: 2 x 64 + 2 x 64 x 96 + 64^2 = 16,512.
    Norms 256 per block, pre_ln 128. Model: 2 x (20,992 + 16,512 + 256) + 128 + 2 x 97 x 64 + 128 = 88,192.
    State (bf16): per block 2 x 64 x 2 B + 4 x 16 x 16 x 4 B = 256 + 4,096; 2 blocks 8,704 B."""
    from memest.errors import ConfigError
    from memest.estimate.serving.kv import state_bytes_per_sequence

    raw = {"model_type": "rwkv5", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 16,
           "vocab_size": 97, "intermediate_size": 96}
    spec = _spec(raw)
    assert spec.num_params == 2 * (20_992 + 16_512 + 256) + 128 + 2 * 97 * 64 + 128 == 88_192
    assert state_bytes_per_sequence(kv_layers(spec.layer_kinds(), 1, 2)) == 2 * (256 + 4_096) == 8_704
    with pytest.raises(ConfigError, match=r"num_attention_heads \(24\) is the head size of model_type 'rwkv5'"):
        _spec({**raw, "num_attention_heads": 24})


# ---- Gemma 3n: PLE, AltUp, LAuReL, KV sharing, USM audio and MobileNet-v5 vision towers ------------

GEMMA3N_E4B = {"model_type": "gemma3n", "architectures": ["Gemma3nForConditionalGeneration"],
               "text_config": {"model_type": "gemma3n_text", "hidden_size": 2048, "num_hidden_layers": 35,
                               "num_attention_heads": 8, "intermediate_size": [16384] * 35}}
"""The E4B geometry: Gemma3nTextConfig's defaults (documented as google/gemma-3n-E4B), towers at their defaults."""


def test_gemma3n_e4b_count_by_hand() -> None:
    """E4B text: h 2048, 35 layers (every 5th full), 8 heads / 2 KV heads of 256, i 16384, V 262400, PLE 262144 x
    (35 x 256), AltUp 4, LAuReL 64; the last 15 layers reuse the KV of layers 18 (sliding) and 19 (full) and have
    no k_proj / v_proj / k_norm.
    Per layer: four norms 8,192; AltUp correct_output_scale 2,048 + correction 4 x 4 + prediction 16 x 4 + router
    4 x 2048 + router_norm 2,048 = 12,368; LAuReL 2 x 2048 x 64 + 2,048 = 264,192; per-layer gate / projection
    2 x 2048 x 256 + norm 2,048 = 1,050,624: 1,335,376. Attention Q, O 2 x 2048^2 + q_norm 256 = 8,388,864, plus
    K, V 2 x 2048 x 512 + k_norm 256 = 2,097,408 where the layer caches. MLP 3 x 2048 x 16384 = 100,663,296.
    Layers: 20 x 112,484,944 + 15 x 110,387,536. Model: embed 262400 x 2048 = 537,395,200, PLE table
    262144 x 8960 = 2,348,810,240, per_layer_model_projection 2048 x 8960 = 18,350,080, its norm 256, AltUp
    (un)embedding projections 6 x 2048^2 = 25,165,824, final norm 2,048: text 6,835,235,568.
    Ollama lists gemma3n:e4b at 6.87B (ollama/ollama PR #11286, comment of 2025-07-12): its GGUF keeps the 15
    shared layers' unused K/V (15 x 2,097,408 = 31,461,120): 6,866,696,688.

    Audio (USM conformer, D 1536, 12 blocks, 8 heads, kernel 5): subsampling convs 128 x 9 + 128 + 32 x 128 x 9 + 32
    and input_proj 1536 x (32 x 32) (128 mel bins -> 64 -> 32) = 1,611,040; a block: two feed-forwards
    2 x (2 x 1536 + 8 x 1536^2) = 37,754,880, attention 5 x 1536^2 + 2 x 1536 + 192 = 11,799,744, light conv
    3 x 1536^2 + 2 x 1536 + 1536 x 5 = 7,088,640, norm 1,536: 56,644,800; total 681,348,640.
    Embedders: vision 128 x 2048 + 2 x 2048 + 2048^2 = 4,460,544; audio 128 x 1536 + 2 x 1536 + 1536 x 2048 =
    3,345,408. MobileNet-v5-300M (timm): 294,126,912. Total 7,818,517,072 = transformers 5.24's
    Gemma3nForConditionalGeneration on the meta device (with timm 1.0.31 for the vision tower)."""
    common = 8_192 + 12_368 + 264_192 + 1_050_624
    assert common == 1_335_376
    cached = 8_388_864 + 2_097_408 + 100_663_296 + common
    shared = 8_388_864 + 100_663_296 + common
    text = (20 * cached + 15 * shared + 262_400 * 2_048 + 262_144 * 8_960 + 2_048 * 8_960 + 256 + 6 * 2_048**2
            + 2_048)
    assert text == 6_835_235_568
    assert round((text + 15 * 2_097_408) / 1e9, 2) == 6.87
    block = 2 * (2 * 1536 + 8 * 1536**2) + (5 * 1536**2 + 2 * 1536 + 192) + (3 * 1536**2 + 2 * 1536 + 1536 * 5) + 1536
    audio = 128 * 9 + 128 + 32 * 128 * 9 + 32 + 1536 * 1024 + 12 * block
    assert (block, audio) == (56_644_800, 681_348_640)
    embedders = (128 * 2048 + 2 * 2048 + 2048**2) + (128 * 1536 + 2 * 1536 + 1536 * 2048)
    spec = _spec(GEMMA3N_E4B)
    assert spec.num_params == text + audio + embedders + 294_126_912 == 7_818_517_072
    # the catalog's E4B (-it and its base alias) is this geometry
    assert load_model("google/gemma-3n-E4B-it").num_params == load_model("google/gemma-3n-E4B").num_params \
        == 7_818_517_072
    from memest.spec import Component
    assert spec.params_by_component()[Component.OTHER] >= audio + embedders + 294_126_912
    assert [layer.attention.kv_reused for layer in spec.layers] == [False] * 20 + [True] * 15
    assert any("AltUp" in note for note in spec.notes)


def test_gemma3n_e4b_kv_cache_skips_the_shared_layers() -> None:
    """Only the 20 layers before the KV-shared tail cache (transformers kv_sharing_modes "reuse"; vLLM
    vllm/model_executor/models/gemma3n.py @ 034f08e65e596139d8da7fe53c8a892209b64ba3 passes the shared layers a
    kv_sharing_target_layer_name, so they get no KV-cache spec). Of layers 0-19, 4, 9, 14 and 19 are full, 16 sliding
    (window 512). Per layer and token: 2 KV heads x (256 + 256) x 2 B = 2,048 B.
    Per token before windows: 20 x 2,048 = 40,960 B (35 x 2,048 = 71,680 if the shared layers cached);
    transformers, one sequence of 4,096 tokens: (4 x 4,096 + 16 x 512) x 2,048 = 50,331,648 B."""
    spec = _spec(GEMMA3N_E4B)
    layers = kv_layers(spec.layer_kinds(), 1, 2)
    assert sorted(layers, key=lambda item: item[0].kind) == [(KVLayer("full", 2_048), 4),
                                                            (KVLayer("sliding", 2_048, window=512), 16)]
    assert bytes_per_token(layers) == 20 * 2_048 == 40_960
    assert contiguous_cache_bytes(layers, 1, 4_096) == (4 * 4_096 + 16 * 512) * 2_048 == 50_331_648


def test_gemma3n_e2b_geometry() -> None:
    """E2B (google/gemma-3n-E2B-it: 30 layers, i 8192, 10 KV-shared layers, the rest as E4B). Text per layer:
    common 1,335,376 + attention 8,388,864 (+ 2,097,408 with K/V) + MLP 3 x 2048 x 8192 = 50,331,648;
    20 x 62,153,296 + 10 x 60,055,888 + 537,395,200 + 262144 x 7680 + 2048 x 7680 + 256 + 25,165,824 + 2,048 =
    4,435,182,688. With the 10 shared layers' K/V that a GGUF keeps (20,974,080): 4.46B, the
    count Ollama lists for gemma3n:e2b (ollama/ollama PR #11286). KV: 20 layers x 2,048 B = 40,960 B/token."""
    raw = {**GEMMA3N_E4B, "text_config": {**GEMMA3N_E4B["text_config"], "num_hidden_layers": 30,
                                          "intermediate_size": [8192] * 30, "num_kv_shared_layers": 10}}
    spec = _spec(raw)
    text = spec.num_params - 681_348_640 - 4_460_544 - 3_345_408 - 294_126_912
    expected = (20 * (1_335_376 + 8_388_864 + 2_097_408 + 50_331_648) + 10 * (1_335_376 + 8_388_864 + 50_331_648)
                + 537_395_200 + 262_144 * 7_680 + 2_048 * 7_680 + 256 + 25_165_824 + 2_048)
    assert text == expected == 4_435_182_688
    assert round((text + 10 * 2_097_408) / 1e9, 2) == 4.46
    assert bytes_per_token(kv_layers(spec.layer_kinds(), 1, 2)) == 40_960
    # the catalog's E2B: the same text model and towers
    assert load_model("google/gemma-3n-E2B-it").num_params == spec.num_params == text + 983_281_504


@pytest.mark.slow
def test_gemma3n_audio_tower_matches_transformers_on_meta() -> None:
    """The audio tower tensor by tensor against transformers' Gemma3nAudioEncoder (it needs no timm), at the default
    config and at a shrunk one with other kernels and strides (input_proj's width follows the convolutions)."""
    pytest.importorskip("transformers")
    import torch
    from transformers import Gemma3nAudioConfig
    from transformers.models.gemma3n.modeling_gemma3n import Gemma3nAudioEncoder

    from memest.sources.families.gemma3n import _AUDIO_DEFAULTS, audio_tensors

    for raw in ({}, {"hidden_size": 64, "conf_num_attention_heads": 4, "conf_num_hidden_layers": 2,
                     "input_feat_size": 40, "sscp_conv_channel_size": [8, 4],
                     "sscp_conv_kernel_size": [[3, 5], [3, 3]], "sscp_conv_stride_size": [[2, 3], [2, 2]]}):
        with torch.device("meta"):
            model = Gemma3nAudioEncoder(Gemma3nAudioConfig(**raw))
        theirs = {name: tuple(p.shape) for name, p in model.named_parameters()}
        audio = HFConfig(raw, name="t", source="t").with_defaults(_AUDIO_DEFAULTS)
        ours = {t.name: t.shape for t in audio_tensors(audio, prefix="")}
        assert ours == theirs


def test_gemma3n_bad_configs_name_the_key() -> None:
    from memest.errors import ConfigError

    text = {"model_type": "gemma3n_text", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 97, "intermediate_size": 96,
            "num_kv_shared_layers": 2}
    with pytest.raises(ConfigError, match=r"layer_types\[2\] = 'chunked_attention' is not a layer type"):
        _spec({**text, "layer_types": ["sliding_attention", "full_attention", "chunked_attention", "full_attention"]})
    with pytest.raises(ConfigError, match=r"intermediate_size lists 3 widths for 4 layers"):
        _spec({**text, "intermediate_size": [96, 96, 96]})
    with pytest.raises(ConfigError, match=r"'intermediate_size\[1\]'"):
        _spec({**text, "intermediate_size": [96, "x", 96, 96]})
    with pytest.raises(ConfigError, match=r"vision_config.architecture = 'mobilenetv9' is a timm model"):
        _spec({**GEMMA3N_E4B, "vision_config": {"architecture": "mobilenetv9"}})


def test_rwkv7_count_and_state() -> None:
    """rwkv7 (flash-linear-attention RWKV7Config defaults for the low-rank widths: decay 64, gate 128, a 64, v 16;
    head_dim 64) at h 2048, 24 blocks, V 65536, untied; i = 4 x 2048 = 8192.
    Time mix of block n > 0: x_r/w/k/v/a/g 6 x 2048, k_k / k_a 2 x 2048, r_k 32 x 64, r/k/v/o 4 x 2048^2 =
    16,777,216, w_lora and a_lora 2 x (2048 x 64 x 2 + 2048) = 528,384, v_lora 2048 x 16 x 2 + 2048 = 67,584,
    g_lora 2048 x 128 x 2 = 524,288 (no bias), g_norm 2 x 2048: 17,920,000. Channel mix: x_k 2048 + key and value
    2 x 2048 x 8192 = 33,556,480. attn_norm + ffn_norm 4 x 2048. Block 51,484,672; block 0 has no v_lora and a
    pre_norm: 51,421,184. Total 23 x 51,484,672 + 51,421,184 + 2 x 65536 x 2048 + 4,096 = 1,504,008,192.
    State per sequence (bf16): token shifts 2 x 2048 x 2 B + recurrent 32 x 64 x 64 x 4 B (float32) = 532,480 B per
    block; 24 blocks 12,779,520 B."""
    from memest.errors import ConfigError
    from memest.estimate.serving.kv import state_bytes_per_sequence

    block = (6 * 2048 + 2 * 2048 + 32 * 64 + 4 * 2048**2 + 2 * (2048 * 64 * 2 + 2048) + (2048 * 16 * 2 + 2048)
             + 2048 * 128 * 2 + 2 * 2048) + (2048 + 2 * 2048 * 8192) + 4 * 2048
    assert block == 51_484_672
    first = block - (2048 * 16 * 2 + 2048) + 2 * 2048
    raw = {"model_type": "rwkv7", "architectures": ["RWKV7ForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 24,
           "vocab_size": 65536}
    spec = _spec(raw)
    assert spec.num_params == 23 * block + first + 2 * 65_536 * 2_048 + 4_096 == 1_504_008_192
    layers = kv_layers(spec.layer_kinds(), 1, 2)
    assert bytes_per_token(layers) == 0
    assert state_bytes_per_sequence(layers) == 24 * (2 * 2048 * 2 + 32 * 64 * 64 * 4) == 12_779_520
    with pytest.raises(ConfigError, match=r"'attn' = .* makes some rwkv7 layers softmax attention"):
        _spec({**raw, "attn": {"layers": [1], "num_heads": 32}})


# ---- DeepSeek-V4: compressed attention ----------------------------------------------------------------

# DeepSeek-V4-Flash's geometry: DeepseekV4Config's defaults (transformers 5.24 configuration_deepseek_v4.py, whose
# docstring names deepseek-ai/DeepSeek-V4-Flash-Base) with Flash's layer schedule as its config.json ships it: the
# legacy per-layer compress_ratios, two sliding layers, then CSA (4) and HCA (128) alternating, plus an MTP entry.
V4_FLASH = {"model_type": "deepseek_v4", "architectures": ["DeepseekV4ForCausalLM"], "hidden_size": 4096,
            "num_hidden_layers": 43, "num_attention_heads": 64,
            "compress_ratios": [0, 0] + [4 if n % 2 == 0 else 128 for n in range(41)] + [0]}


def test_deepseek_v4_flash_count_by_hand() -> None:
    """h 4096, a 64, d 512, q_lora_rank 1024, o_groups 8 x o_lora_rank 1024, hc_mult 4, 256 experts of 2048,
    index 64 heads x 128, vocab 129,280. Per layer:
    attention  q_a 4096x1024 + q_a_norm 1024 + q_b 1024x(64x512) + kv_proj 4096x512 + kv_norm 512
               + o_a (8x1024)x(32768/8) + o_b 8192x4096 + sinks 64                              = 106,956,352
    MoE        gate 256x4096 + gate_up 256x4096x4096 + down 256x4096x2048 + shared 3x4096x2048 = 6,468,665,344
    block      2 norms 2x4096 + 2 mHC x (fn 24x16384 + base 24 + scale 3)                       =     794,678
    HCA        kv_proj + gate_proj 2x4096x512 + position_bias 128x512 + kv_norm 512              =   4,260,352
    CSA        compressor 2x4096x1024 + 4x1024 + 512, indexer compressor 2x4096x256 + 4x256 + 128,
               indexer q_b 1024x(64x128) + weights_proj 4096x64                                 =  19,142,272
    head       hc_head 4x16384 + 4 + 1, norm 4096, lm_head 129280x4096                          = 529,600,517
    embedding  129280x4096                                                                      = 529,530,880
    Total 43 x (106,956,352 + 6,468,665,344 + 794,678) + 21 x 19,142,272 + 20 x 4,260,352 + 529,600,517
    + 529,530,880 = 284,332,230,231: the model card's "284B total parameters" (deepseek-ai/DeepSeek-V4-Flash,
    as https://featherless.ai/models/deepseek-ai/DeepSeek-V4-Flash quotes it: "284 billion total parameter (13
    billion activated)"); the MTP layer is not instantiated by transformers and not counted."""
    attn = 4096 * 1024 + 1024 + 1024 * 64 * 512 + 4096 * 512 + 512 + 8192 * 4096 + 8192 * 4096 + 64
    moe = 256 * 4096 + 256 * 4096 * 4096 + 256 * 4096 * 2048 + 3 * 4096 * 2048
    block = 2 * 4096 + 2 * (24 * 16384 + 24 + 3)
    hca = 2 * 4096 * 512 + 128 * 512 + 512
    csa = 2 * 4096 * 1024 + 4 * 1024 + 512 + 2 * 4096 * 256 + 4 * 256 + 128 + 1024 * 64 * 128 + 4096 * 64
    head = 4 * 16384 + 4 + 1 + 4096 + 129280 * 4096
    assert (attn, moe, block, hca, csa, head) == (106_956_352, 6_468_665_344, 794_678, 4_260_352, 19_142_272,
                                                  529_600_517)
    spec = _spec(V4_FLASH)
    assert spec.num_params == 43 * (attn + moe + block) + 21 * csa + 20 * hca + head + 129280 * 4096 \
        == 284_332_230_231
    assert round(spec.num_params / 1e9) == 284
    kinds = [(layer.attention.compress_rate, layer.attention.index_head_dim) for layer in spec.layers]
    assert kinds[:4] == [(0, 0), (0, 0), (4, 128), (128, 0)] and kinds.count((4, 128)) == 21
    assert all(layer.attention.num_kv_heads == 1 and layer.attention.kv_shared for layer in spec.layers)
    # the three hash-routed layers' tid2eid tables: 129280 x 6 int64
    assert [b.nbytes for b in spec.buffers] == [129280 * 6 * 8] * 3


@pytest.mark.parametrize(("tokens", "expected"), [
    # L = 1: every window is open. sliding_attention layers (DynamicSlidingWindowLayer: K and V stored apart)
    # 2 x 1 x (512 + 512) x 2 B = 4,096; the CSA/HCA caches' K = V 41 x 1 x 512 x 2 = 41,984; the buffered kv +
    # gate of (1 - 1) mod m + 1 = 1 token: CSA compressor 21 x (2x512 + 2x512) x 2 = 86,016, its indexer
    # 21 x (2x128 + 2x128) x 2 = 21,504, HCA 20 x (512 + 512) x 2 = 40,960.
    (1, 4_096 + 41_984 + 86_016 + 21_504 + 40_960),
    # L = 128 (the window; 32 CSA windows, 1 HCA window closed): windows full, 2 x 128 x 2,048 + 41 x 128 x 1,024
    # = 5,898,240. The buffer keeps the last step's window: 127 mod 4 + 1 = 4 tokens (CSA), 127 mod 128 + 1 = 128
    # (HCA). CSA 21 x (32 entries x 1,024 + 4 x 4,096 + overlap 4 x 512 x (2 + 4 fp32 gate)) = 21 x 61,440
    # = 1,290,240; indexer 21 x (32 x 256 + 4 x 1,024 + 4 x 128 x 6) = 21 x 15,360 = 322,560;
    # HCA 20 x (1 x 1,024 + 128 x 2,048) = 20 x 263,168 = 5,263,360.
    (128, 5_898_240 + 1_290_240 + 322_560 + 5_263_360),
    # L = 4096: CSA 21 x (1,024 x 1,024 + 16,384 + 12,288) = 22,622,208; indexer 21 x (1,024 x 256 + 4,096
    # + 3,072) = 5,655,552; HCA 20 x (32 x 1,024 + 262,144) = 5,898,240.
    (4096, 5_898_240 + 22_622_208 + 5_655_552 + 5_898_240),
    # L = 131072: CSA 21 x (32,768 x 1,024 + 28,672) = 705,245,184; indexer 21 x (32,768 x 256 + 7,168)
    # = 176,311,296; HCA 20 x (1,024 x 1,024 + 262,144) = 26,214,400.
    (131072, 5_898_240 + 705_245_184 + 176_311_296 + 26_214_400),
])
def test_deepseek_v4_transformers_cache_by_hand(tokens: int, expected: int) -> None:
    """DeepSeek-V4-Flash in bf16, one sequence, as transformers 5.24's DeepseekV4HCACache / DeepseekV4CSACache hold
    it after a decode step to L tokens: the sliding window of K = V (min(L, 128) tokens x 512: the storage of the
    step's concatenation, of which the cache keeps a view of the last 127), one compressed entry of 512 (CSA, HCA)
    or 128 (the CSA indexer) per closed window of 4 / 128 tokens, the buffer (a view of the last step's
    concatenation of the buffered tokens and the new one: kv and gate of (L - 1) mod m + 1 tokens), and a CSA
    cache's overlap state (the last window's first series: kv at 2 B, gate at 4 B after the fp32 position_bias,
    which from_pretrained keeps in fp32). The slow test below measures these storages on a shrunk model."""
    layers = kv_layers(_spec(V4_FLASH).layer_kinds(), 1, 2, transformers=True)
    assert contiguous_cache_bytes(layers, 1, tokens) == expected
    assert contiguous_cache_bytes(layers, 3, tokens) == 3 * expected


def test_deepseek_v4_vllm_pages_by_hand() -> None:
    """vLLM's DeepSeek-V4 caches (fp8_ds_mla; vllm deepseek_v4_attention.py, sparse_swa.py, deepseek_compressor.py),
    every page rounded up to 576 B: SWA 64 tokens x 584 = 37,376 -> 65 x 576 = 37,440; C4 entries 256 // 4 = 64 x 584
    -> 37,440; C128 entries 256 // 128 = 2 x 584 = 1,168 -> 3 x 576 = 1,728; CSA indexer 64 x (128 + 128 / 128 x 4)
    = 8,448 -> 15 x 576 = 8,640; C4 compressor state 4 slots x 2 x 2 x 512 x 4 B = 32,768 -> 57 x 576 = 32,832,
    C128 state 8 x 2 x 1 x 512 x 4 = 32,768 -> 32,832, the CSA indexer's state 4 x 2 x 2 x 128 x 4 = 8,192 -> 8,640."""
    spec = _spec(V4_FLASH)
    by_rate = {layer.attention.compress_rate: deepseek_v4_pages(layer) for layer in spec.layers}
    assert by_rate[0] == {"swa": ((64, 128), 65 * 576)}
    assert by_rate[4] == {"swa": ((64, 128), 65 * 576), "kv": (None, 65 * 576), "indexer": (None, 15 * 576),
                          "state": ((4, 8), 57 * 576), "indexer_state": ((4, 8), 15 * 576)}
    assert by_rate[128] == {"swa": ((64, 128), 65 * 576), "kv": (None, 3 * 576), "state": ((8, 128), 57 * 576)}
    with pytest.raises(InputError, match="rates 4 and 128"):
        deepseek_v4_pages(_spec({**V4_FLASH, "compress_rates": {"compressed_sparse_attention": 8,
                                                    "heavily_compressed_attention": 128}}).layers[2])


# V4-Flash (2 sliding, 21 CSA, 20 HCA layers) under vLLM's grouping (kv_cache_utils get_kv_cache_groups, the V4
# case). Full group: 21 C4 kv (37,440) + 21 indexer (8,640) + 20 C128 kv (1,728), tuples = most layers sharing a
# page = 21, tuple bytes 37,440 + 8,640 + 1,728 = 47,808. Sliding buckets by (block, window): SWA (64, 128) 43
# layers, C4 states (4, 8) 21 x 32,832 + 21 x 8,640 -> 21 tuples, C128 states (8, 128) 20. _approximate_gcd over
# [21, 43, 21, 20] from 21: pad(21) = 0 + 20 + 0 + 1 = 21, pad(22) = 1 + 1 + 1 + 2 = 5, pad(23) = 2 + 3 + 2 + 3 = 10,
# pad(24) = 3 + 5 + 3 + 4 = 15, larger d pad more -> d = 22. SWA splits into ceil(43 / 22) = 2 groups (22, 21
# tuples), the others stay one; states padded to the next full page (32,832 -> 37,440). Block = 47,808 x 22
# (the most tuples of a group) = 1,051,776 B. max_num_batched_tokens 8,192:
#   L 4,096:   full ceil(4,096 / 256) = 16; SWA 2 x (ceil(min(127 + 8,192, 4,096) / 64) + 1) = 2 x 65 = 130;
#              C4 states ceil(4,096 / 4) + 1 = 1,025; C128 states ceil(4,096 / 8) + 1 = 513 -> 1,684 blocks
#   L 131,072: full 512; SWA 2 x (ceil(8,319 / 64) + 1) = 2 x 131 = 262; C4 states ceil(8,199 / 4) + 1 = 2,051;
#              C128 states ceil(8,319 / 8) + 1 = 1,041 -> 3,866 blocks
@pytest.mark.parametrize(("tokens", "blocks"), [(4096, 16 + 130 + 1025 + 513), (131072, 512 + 262 + 2051 + 1041)])
def test_deepseek_v4_vllm_pool_by_hand(tokens: int, blocks: int) -> None:
    """One request of L tokens in vLLM's DeepSeek-V4 pool (V4-Flash geometry; arithmetic above)."""
    layout = vllm_layout(_spec(V4_FLASH), _spec(V4_FLASH).layer_kinds(), 1, 2, 2, 16)
    assert layout.page_bytes == 22 * (37_440 + 8_640 + 1_728) == 1_051_776
    assert [(g.kind, g.block_size, g.window, g.num_layers) for g in layout.groups] == [
        ("mla", 256, None, 62), ("sliding", 64, 128, 22), ("sliding", 64, 128, 21), ("sliding", 4, 8, 42),
        ("sliding", 8, 128, 20)]
    assert layout.blocks_per_request(tokens, 8192) == blocks
    assert layout.request_bytes(tokens, 8192) == blocks * 1_051_776
    assert layout.num_blocks(10 * 1_051_776 + 5) == 10
    assert {1684: 1_771_190_784, 3866: 4_066_166_016}[blocks] == blocks * 1_051_776
    # one more block of the full group per 256 tokens: ceil(1,051,776 / 256) = ceil(4,108.5) = 4,109 B/token; a pool
    # of 2 requests' blocks holds concurrency 2.0, logged as 2 x L tokens
    assert layout.bytes_per_token() == 4_109
    assert layout.pool_tokens(2 * blocks, tokens, 8192) == 2 * tokens


def test_vllm_approximate_gcd() -> None:
    """vLLM _approximate_gcd: [11, 21, 11, 10] from 11 -> pad(11) = 0 + 1 + 0 + 1 = 2 (the docstring example of
    _get_kv_cache_groups_uniform_groups); [2, 3] from 2 -> pad(2) = 1 = pad(3), the larger wins."""
    assert approximate_gcd([11, 21, 11, 10], 11) == 11
    assert approximate_gcd([2, 3], 2) == 3


def test_deepseek_v4_compress_rates_missing_a_used_type_names_it() -> None:
    with pytest.raises(ConfigError, match=r"compress_rates has no rate for 'heavily_compressed_attention'"):
        _spec({**V4_FLASH, "compress_rates": {"compressed_sparse_attention": 8}})


def test_deepseek_v4_bad_layer_types_name_the_key() -> None:
    from memest.errors import ConfigError

    tiny = {"model_type": "deepseek_v4", "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
            "head_dim": 16, "q_lora_rank": 16, "o_groups": 2, "o_lora_rank": 8, "vocab_size": 97}
    with pytest.raises(ConfigError, match=r"layer_types\[1\] = 'foo' is not a layer type"):
        _spec({**tiny, "layer_types": ["sliding_attention", "foo", "sliding_attention"]})
    with pytest.raises(ConfigError, match=r"compress_ratios\[2\] = 8 is not a compress ratio"):
        _spec({**tiny, "compress_ratios": [0, 4, 8]})
    with pytest.raises(ConfigError, match=r"compress_rates\['windowed_attention'\] names no compressed layer type"):
        _spec({**tiny, "compress_rates": {"windowed_attention": 4}})
    with pytest.raises(ConfigError, match=r"mlp_layer_types\[0\] = 'dense' is not a layer type"):
        _spec({**tiny, "mlp_layer_types": ["dense", "moe", "moe"]})
    with pytest.raises(ConfigError, match=r"'layer_types' must list 3 entries"):
        _spec({**tiny, "layer_types": ["sliding_attention", "sliding_attention"]})


V4_SMALL = {"model_type": "deepseek_v4", "architectures": ["DeepseekV4ForCausalLM"], "vocab_size": 97,
            "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "head_dim": 32, "q_lora_rank": 24,
            "o_groups": 2, "o_lora_rank": 12, "hc_mult": 2, "sliding_window": 8, "index_n_heads": 2,
            "index_head_dim": 8, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
            "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                            "compressed_sparse_attention"],
            "compress_rates": {"compressed_sparse_attention": 2, "heavily_compressed_attention": 8}}


@pytest.mark.slow
@pytest.mark.parametrize("tokens", [1, 2, 5, 8, 9, 13, 16, 30])
def test_deepseek_v4_cache_matches_transformers_storage(tokens: int) -> None:
    """Run a shrunk DeepSeek-V4 (every layer type, compress rates 2 and 8, window 8) in bf16 on the CPU: a prefill of
    tokens - 1 positions, then one decode step; sum the storage bytes every cache layer holds (keys, values,
    compressed_kv, buffer_kv, buffer_gate, overlap_kv, overlap_gate; a storage shared by several views once).
    Measured after the prefill, it must equal the prefill's cache (``layer_cache_bytes``: sliding layers hold a
    view of the whole prompt's K/V, compressed caches :meth:`KVLayer.prefill_bytes`); after the decode step,
    :func:`contiguous_cache_bytes`."""
    pytest.importorskip("transformers")
    import torch
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
    from transformers.cache_utils import DynamicCache

    from memest.estimate.serving.hf.prefill import layer_cache_bytes

    raw = {k: v for k, v in V4_SMALL.items() if k not in ("model_type", "architectures")}
    config = DeepseekV4Config(**raw)
    torch.manual_seed(0)
    model = DeepseekV4ForCausalLM._from_config(config, dtype=torch.bfloat16).eval()  # keeps the fp32 modules

    def held(cache) -> int:
        storages = {}
        for layer in cache.layers:
            tensors = [layer.keys, layer.values]
            for name in ("compressed_kv", "buffer_kv", "buffer_gate", "overlap_kv", "overlap_gate"):
                tensors += list(getattr(layer, name, {}).values())
            for t in tensors:
                if t is not None:
                    storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return sum(storages.values())

    spec = _spec(V4_SMALL)
    layers = kv_layers(spec.layer_kinds(), 1, 2, transformers=True)
    cache = DynamicCache(config=config)
    with torch.no_grad():
        if tokens > 1:
            model(input_ids=torch.randint(0, 97, (1, tokens - 1)), cache=cache, use_cache=True)
            assert held(cache) == sum(layer_cache_bytes(layer, 1, tokens - 1, 2) for layer in spec.layers)
        model(input_ids=torch.randint(0, 97, (1, 1)), cache=cache, use_cache=True)
    assert held(cache) == contiguous_cache_bytes(layers, 1, tokens)


def test_qwen3_next_80b_count_by_hand() -> None:
    """Qwen3-Next-80B-A3B-Instruct (catalog config: alibaba/InferSim hf_configs/qwen3-next-80B-A3B_config.json):
    h 2048, 48 layers, every 4th (3, 7, ..., 47) gated full attention, Gated DeltaNet elsewhere; V 151936 untied.
    Full attention: q_proj doubled for the output gate 2048 x (2 x 16 x 256) = 16,777,216, k/v 2 x 2048 x 512 =
    2,097,152, o_proj 4096 x 2048 = 8,388,608, q/k norms 2 x 256: 27,263,488. Gated DeltaNet (key dim 16 x 128 =
    2048, value dim 32 x 128 = 4096): in_proj_qkvz 2048 x (2 x 2048 + 2 x 4096) = 25,165,824, in_proj_ba 2048 x 64
    = 131,072, conv1d (2 x 2048 + 4096) x 4 = 32,768, dt_bias + A_log 2 x 32, gated norm 128, out_proj 4096 x 2048
    = 8,388,608: 33,718,464. MoE every layer: router 2048 x 512 = 1,048,576, experts 512 x 3 x 2048 x 512 =
    1,610,612,736, shared expert 3 x 2048 x 512 = 3,145,728, shared gate 2048: 1,614,809,088; two norms 4,096.
    Total 48 x 1,614,813,184 + 12 x 27,263,488 + 36 x 33,718,464 + 2 x 151936 x 2048 + 2048 = 79,674,391,296.
    Published (index id 71576727175): the release's shard index total_size / 2 = 81,324,862,720, which adds its mtp.*
    module (transformers drops it on load): fc 2 x 2048 x 2048 = 8,388,608 + one full-attention layer 27,263,488 +
    one MoE 1,614,809,088 + layer norms 4,096 + pre-fc norms and final norm 3 x 2048 = 1,650,471,424."""
    full = 2048 * 2 * 16 * 256 + 2 * 2048 * 512 + 4096 * 2048 + 2 * 256
    delta = 2048 * (2 * 2048 + 2 * 4096) + 2048 * 64 + (2 * 2048 + 4096) * 4 + 2 * 32 + 128 + 4096 * 2048
    moe = 2048 * 512 + 512 * 3 * 2048 * 512 + 3 * 2048 * 512 + 2048
    assert (full, delta, moe) == (27_263_488, 33_718_464, 1_614_809_088)
    total = 48 * (moe + 2 * 2048) + 12 * full + 36 * delta + 2 * 151_936 * 2048 + 2048
    mtp = 2 * 2048 * 2048 + full + moe + 2 * 2048 + 3 * 2048
    assert total + mtp == 81_324_862_720  # the published shard-index count
    for name in ("Qwen/Qwen3-Next-80B-A3B-Instruct", "Qwen/Qwen3-Next-80B-A3B-Thinking"):
        spec = load_model(name)
        assert spec.num_params == total == 79_674_391_296
        assert spec.model_type == "qwen3_next"
    # 12 full-attention layers hold a KV cache (bf16): 2 KV heads x (256 + 256) x 2 B = 2,048 B per token each
    assert bytes_per_token(kv_layers(spec.layer_kinds(), 1, 2)) == 12 * 2_048
