"""Shanghai AI Lab InternLM 2 / 2.5 decoders: internlm2 (a config-only family: transformers does not
ship it).

Follows the ``modeling_internlm2.py`` / ``configuration_internlm2.py`` that ship in the model's Hub
repositories (e.g. internlm/internlm2_5-7b-chat; read in a copy vendored by NanSang2000/S1mpleAgent
@ 0143463e4bc3708426dc7125751d76a3be063334 : modeling_internlm2.py, and the config class in sglang's
copy from OpenGVLab/InternVL): llama's layout under other names, with Q, K and V fused:
``model.tok_embeddings (V, h)``; per layer ``attention_norm`` / ``ffn_norm`` (RMSNorm),
``attention.wqkv ((a + 2k) d, h)`` and ``attention.wo (h, a d)``, both biased per ``bias`` (default
true), head_dim = h / a; SwiGLU ``feed_forward.w1`` (gate) / ``w3`` (up) / ``w2`` (down), unbiased;
final ``model.norm``; ``output (V, h)``, tied only with ``tie_word_embeddings`` (default false).
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import (
    ATTN,
    gated_mlp,
    linear,
    lm_head,
    model_spec,
    norm,
    token_embedding,
)
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec, Split

# InternLM2Config defaults (the Hub repo's configuration_internlm2.py) of the fields read here
_DEFAULTS: dict[str, object] = {
    "vocab_size": 103168,
    "intermediate_size": 11008,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "bias": True,
}


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of an internlm2 config."""
    cfg = cfg.with_defaults(_DEFAULTS)
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    k = cfg.int("num_key_value_heads", default=a)
    d = cfg.divide("hidden_size", h, "num_attention_heads", a)  # InternLM2Attention: head_dim = h / a
    i = cfg.int("intermediate_size")
    vocab = cfg.int("vocab_size")
    bias = cfg.bool("bias")
    layer = LayerSpec(
        attention=AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d),
        mlp=MLPSpec(gated=True, intermediate_size=i, activation=cfg.str("hidden_act")),
        tensors=(
            *norm("attention_norm", h),
            *linear("attention.wqkv", h, (a + 2 * k) * d, ATTN, Split.COL, bias=bias),
            *linear("attention.wo", a * d, h, ATTN, Split.ROW, bias=bias),
            *norm("ffn_norm", h),
            *gated_mlp(h, i, prefix="feed_forward", names=("w1", "w3", "w2")),
        ),
    )
    tied = cfg.bool("tie_word_embeddings")
    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[layer] * cfg.int("num_hidden_layers"),
        embedding=[token_embedding("model.tok_embeddings.weight", vocab, h)],
        head=[*norm("model.norm", h), *([] if tied else lm_head(vocab, h, name="output"))],
        tie_word_embeddings=tied,
        max_position_embeddings=cfg.int("max_position_embeddings"),
    )
