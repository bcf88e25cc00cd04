"""Tiny configs made from real catalog configs, for the trace tests (same family, fewer layers and width).

Each keeps its source's model_type, architecture, activation, biases, tying, rope settings and
head ratio (num_heads / num_kv_heads); only the sizes shrink, so a step traces in well under a
second while every tensor kind (weights, activations, logits, KV cache) stays a visible share.
"""

from __future__ import annotations

from memest.sources import catalog
from memest.sources.config import HFConfig

TINY_SIZES = {"num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 704, "vocab_size": 1024}
"""The sizes every tiny config gets (heads are set per family to keep the source's ratio)."""

TINY_SOURCES = {
    # family: (catalog id, num_attention_heads, num_key_value_heads) - ratios of the source
    "llama": ("meta-llama/Llama-3.1-8B", 8, 2),  # 32 / 8
    "mistral": ("mistralai/Mistral-7B-v0.1", 8, 2),  # 32 / 8, sliding_window 4096 kept
    "qwen2": ("Qwen/Qwen2.5-0.5B", 7, 1),  # 14 / 2, tied embeddings, q/k/v biases
}


def tiny_config(family: str) -> HFConfig:
    """The tiny config of ``family`` (a key of :data:`TINY_SOURCES`)."""
    source, heads, kv_heads = TINY_SOURCES[family]
    raw = catalog.load(catalog.resolve(source))
    raw.update(TINY_SIZES, num_attention_heads=heads, num_key_value_heads=kv_heads)
    raw["head_dim"] = 32
    return HFConfig(raw, name=f"tiny-{family}", source=f"derived from {source}")
