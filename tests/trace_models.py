"""Tiny configs made from real catalog configs, for the trace tests (same family, fewer layers and width).

Each keeps its source's model_type, architecture, activation, norms, biases, tying, rope settings,
window pattern and attention kind (a checkpoint's ``quantization_config`` is dropped: the trace runs
unquantized weights); only the sizes shrink (2 layers, width 256, 8 query heads with
the source's query/KV head ratio, head_dim 32, vocab 1024, 4 routed experts of width 128), so a
step traces in well under a second while every tensor kind (weights, activations, logits, KV
cache) stays a visible share.
"""

from __future__ import annotations

import copy
from typing import Any

from memest.sources import catalog
from memest.sources.config import HFConfig

TINY_SOURCES = {
    "llama": "meta-llama/Llama-3.1-8B",
    "mistral": "mistralai/Mistral-7B-v0.1",
    "qwen2": "Qwen/Qwen2.5-0.5B",
    "qwen3": "Qwen/Qwen3-8B",
    "mixtral": "mistralai/Mixtral-8x22B-v0.1",
    "qwen3_moe": "Qwen/Qwen3-235B-A22B",
    "gemma": "google/gemma-2b",
    "gemma2": "google/gemma-2-27b",
    "gemma3": "google/gemma-3-27b-it",
    "phi": "microsoft/phi-1_5",
    "phi3": "microsoft/Phi-3-mini-4k-instruct",
    "phimoe": "microsoft/Phi-3.5-MoE-instruct",
    "deepseek_v2": "deepseek-ai/DeepSeek-V2-Lite",
    "deepseek_v3": "deepseek-ai/DeepSeek-R1",
    "gpt_oss": "openai/gpt-oss-120b",
    "gpt2": "openai-community/gpt2",
    "gpt_bigcode": "bigcode/octocoder",
    "gpt_neox": "EleutherAI/gpt-neox-20b",
    "falcon": "tiiuae/falcon-40b",
    "bloom": "bigscience/bloom-560m",
    "opt": "facebook/opt-1.3b",
    "olmo2": "allenai/OLMo-2-0325-32B",
    "jamba": "ai21labs/Jamba-v0.1",
}
"""Decoder family -> the catalog model its tiny config is made from."""

LAYERS, HIDDEN, HEADS, HEAD_DIM, VOCAB = 2, 256, 8, 32, 1024
INTERMEDIATE, EXPERTS, EXPERT_WIDTH = 704, 4, 128

_SET = {
    ("num_hidden_layers", "n_layer", "num_layers"): LAYERS,
    ("hidden_size", "n_embd", "d_model", "word_embed_proj_dim"): HIDDEN,
    ("head_dim",): HEAD_DIM,
    ("intermediate_size", "ffn_dim"): INTERMEDIATE,
    ("moe_intermediate_size", "shared_expert_intermediate_size"): EXPERT_WIDTH,
    ("num_local_experts", "num_experts", "n_routed_experts"): EXPERTS,
    ("vocab_size",): VOCAB,
    ("kv_lora_rank",): 64,
    ("qk_rope_head_dim",): 16,
    ("qk_nope_head_dim", "v_head_dim"): 32,
    ("mamba_dt_rank",): 16,
}
_HEADS = ("num_attention_heads", "n_head", "num_heads")
_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_head_kv")
_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


def shrink(raw: dict[str, Any]) -> dict[str, Any]:
    """A copy of a config dict (its ``text_config`` for multimodal ones) at the tiny sizes."""
    raw = copy.deepcopy(raw)
    raw.pop("quantization_config", None)  # a checkpoint's storage format, not the family's architecture
    vision = raw.get("vision_config")
    if isinstance(vision, dict):  # a multimodal checkpoint's vision tower shrinks too
        vision.update(num_hidden_layers=LAYERS, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                      num_attention_heads=HEADS)
    cfg = raw["text_config"] if isinstance(raw.get("text_config"), dict) else raw
    for keys, value in _SET.items():
        for key in keys:
            if cfg.get(key) is not None:
                cfg[key] = value
    cfg["vocab_size"] = VOCAB  # also where the config leaves it to the class default
    if cfg.get("n_inner") is not None:
        cfg["n_inner"] = INTERMEDIATE
    heads = next((cfg[k] for k in _HEADS if cfg.get(k)), None)
    for key in _HEADS:
        if cfg.get(key):
            cfg[key] = HEADS
    for key in _KV_HEADS:
        if cfg.get(key) and heads:
            cfg[key] = max(1, HEADS * cfg[key] // heads)
    for key in ("num_experts_per_tok", "experts_per_token"):
        if cfg.get(key):
            cfg[key] = min(2, cfg[key])
    if cfg.get("q_lora_rank"):
        cfg["q_lora_rank"] = 96
    if cfg.get("first_k_dense_replace"):
        cfg["first_k_dense_replace"] = 1
    for key in ("n_group", "topk_group"):
        if cfg.get(key):
            cfg[key] = 1
    if isinstance(cfg.get("layer_types"), list):
        cfg["layer_types"] = cfg["layer_types"][:LAYERS]
    if "attn_layer_period" in cfg:  # jamba: layer 0 mamba + dense MLP, layer 1 attention + experts
        cfg.update(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1)
    for target in (cfg, raw):
        for key in _TOKENS:
            value = target.get(key)
            if isinstance(value, int) and value >= VOCAB:
                target[key] = 1
            elif isinstance(value, list):
                target[key] = [v if v < VOCAB else 1 for v in value]
    return raw


def tiny_config(family: str) -> HFConfig:
    """The tiny config of ``family`` (a key of :data:`TINY_SOURCES`)."""
    source = TINY_SOURCES[family]
    return HFConfig(shrink(catalog.load(catalog.resolve(source))), name=f"tiny-{family}",
                    source=f"derived from {source}")
