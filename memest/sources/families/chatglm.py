"""Zhipu ChatGLM decoders of the Hub repos' remote code: chatglm (ChatGLM2-6B, ChatGLM3-6B,
GLM-4-9B / GLM-4-9B-Chat), a config-only family: transformers does not ship it.

Follows the ``modeling_chatglm.py`` / ``configuration_chatglm.py`` of the model repositories
(THUDM/chatglm3-6b; read in THUDM's own copy, THUDM/language_filter_chatglm3 @
fc4c6766f9fc1023794afd66e894924992ab1c75 : modeling_chatglm.py): ``transformer.embedding.word_embeddings
(padded_vocab_size, h)``; per layer (``transformer.encoder.layers.<n>``) ``input_layernorm`` and
``post_attention_layernorm`` (RMSNorm, or LayerNorm with bias when ``rmsnorm`` is false), the fused
``self_attention.query_key_value (a d + 2 g d, h)`` (d = ``kv_channels``; g = ``multi_query_group_num``
KV heads with ``multi_query_attention``, else a), biased with ``add_bias_linear`` or ``add_qkv_bias``,
``self_attention.dense (h, a d)`` and the SwiGLU ``mlp.dense_h_to_4h (2 f, h)`` / ``mlp.dense_4h_to_h
(h, f)`` biased with ``add_bias_linear`` (f = ``ffn_hidden_size``); ``transformer.encoder.final_layernorm``
with ``post_layer_norm``; the untied ``transformer.output_layer (padded_vocab_size, h)``. Rotary
embeddings over half of each head (``rotary_pos_emb`` holds only a buffer). The P-tuning prefix encoder
(``pre_seq_len``) is not modelled: such a config is refused.
"""

from __future__ import annotations

from memest.errors import ConfigError
from memest.sources.config import HFConfig
from memest.sources.families._build import (
    ATTN,
    MLP,
    linear,
    lm_head,
    model_spec,
    norm,
    token_embedding,
)
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec, Split

# ChatGLMConfig defaults (the Hub repos' configuration_chatglm.py) of the fields read here
_DEFAULTS: dict[str, object] = {
    "num_layers": 28,
    "padded_vocab_size": 65024,
    "ffn_hidden_size": 13696,
    "kv_channels": 128,
    "seq_length": 2048,
    "rmsnorm": True,
    "post_layer_norm": True,
    "add_bias_linear": False,
    "add_qkv_bias": False,
    "multi_query_attention": False,
    "multi_query_group_num": 1,
}
_ALIASES = {"num_hidden_layers": "num_layers"}  # ChatGLMConfig.attribute_map (GLM-4 repos)


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a chatglm config."""
    if not cfg.has("padded_vocab_size") and cfg.has("position_encoding_2d"):
        raise ConfigError(f"{cfg.what} is the first ChatGLM-6B (2-D positions, vocab_size); memest "
                          "counts ChatGLM2 / ChatGLM3 / GLM-4 configs (padded_vocab_size)")
    if cfg.has("pre_seq_len"):
        raise ConfigError(f"{cfg.what} sets 'pre_seq_len' (a P-tuning prefix encoder), which memest "
                          "does not count; drop it to size the base model")
    cfg = cfg.with_defaults(_DEFAULTS, aliases=_ALIASES)
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    d = cfg.int("kv_channels")
    k = cfg.int("multi_query_group_num") if cfg.bool("multi_query_attention") else a
    f = cfg.int("ffn_hidden_size")
    vocab = cfg.int("padded_vocab_size")
    bias = cfg.bool("add_bias_linear")
    qkv_bias = bias or cfg.bool("add_qkv_bias")
    layer_norm = not cfg.bool("rmsnorm")
    layer = LayerSpec(
        attention=AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d, rope="concat"),
        mlp=MLPSpec(gated=True, intermediate_size=f, activation="silu"),
        norm="layer" if layer_norm else "rms",
        tensors=(
            *norm("input_layernorm", h, bias=layer_norm),
            *linear("self_attention.query_key_value", h, (a + 2 * k) * d, ATTN, Split.COL, bias=qkv_bias),
            *linear("self_attention.dense", a * d, h, ATTN, Split.ROW, bias=bias),
            *norm("post_attention_layernorm", h, bias=layer_norm),
            *linear("mlp.dense_h_to_4h", h, 2 * f, MLP, Split.COL, bias=bias),
            *linear("mlp.dense_4h_to_h", f, h, MLP, Split.ROW, bias=bias),
        ),
    )
    final = norm("transformer.encoder.final_layernorm", h, bias=layer_norm) if cfg.bool("post_layer_norm") else []
    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[layer] * cfg.int("num_layers"),
        embedding=[token_embedding("transformer.embedding.word_embeddings.weight", vocab, h)],
        head=[*final, *lm_head(vocab, h, name="transformer.output_layer")],
        tie_word_embeddings=False,
        max_position_embeddings=cfg.int("seq_length"),
    )
