"""Meta OPT decoders: opt.

Follows transformers ``models/opt/modeling_opt.py``: learned absolute positions
``embed_positions`` with ``max_position_embeddings + 2`` rows (OPT offsets position ids by 2);
multi-head attention ``q/k/v/out_proj`` and ReLU MLP ``fc1``/``fc2``, biased per ``enable_bias``;
LayerNorms ``self_attn_layer_norm``/``final_layer_norm`` per layer (no parameters without
``layer_norm_elementwise_affine``); a final ``model.decoder.final_layer_norm`` only for pre-norm
models (``do_layer_norm_before``, OPT-350m is post-norm) unless ``_remove_final_layer_norm``; when
``word_embed_proj_dim`` differs from hidden_size, the embedding and lm_head are that narrow and
``project_in (h, e)``/``project_out (e, h)`` convert. lm_head tied by default.
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import ATTN, MLP, linear, lm_head, model_spec, norm, token_embedding
from memest.spec import AttentionSpec, Component, LayerSpec, MLPSpec, ModelSpec, Split, TensorSpec

# OPTConfig defaults (models/opt/configuration_opt.py) of the fields read here
_DEFAULTS: dict[str, object] = {
    "vocab_size": 50272,
    "ffn_dim": 3072,
    "max_position_embeddings": 2048,
    "do_layer_norm_before": True,
    "_remove_final_layer_norm": False,
    "word_embed_proj_dim": None,
    "activation_function": "relu",
    "enable_bias": True,
    "layer_norm_elementwise_affine": True,
    "tie_word_embeddings": True,
    "dropout": 0.1,
    "attention_dropout": 0.0,
}


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of an opt config."""
    cfg = cfg.with_defaults(_DEFAULTS)
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    d = cfg.divide("hidden_size", h, "num_attention_heads", a)
    ffn = cfg.int("ffn_dim")
    vocab = cfg.int("vocab_size")
    positions = cfg.int("max_position_embeddings")
    e = cfg.int("word_embed_proj_dim", default=h)
    bias = cfg.bool("enable_bias")
    affine = cfg.bool("layer_norm_elementwise_affine")

    def layer_norm(name: str) -> list[TensorSpec]:
        return norm(name, h, bias=True) if affine else []

    tensors = (
        *linear("self_attn.q_proj", h, h, ATTN, Split.COL, bias=bias),
        *linear("self_attn.k_proj", h, h, ATTN, Split.KV, bias=bias),
        *linear("self_attn.v_proj", h, h, ATTN, Split.KV, bias=bias),
        *linear("self_attn.out_proj", h, h, ATTN, Split.ROW, bias=bias),
        *layer_norm("self_attn_layer_norm"),
        *linear("fc1", h, ffn, MLP, Split.COL, bias=bias),
        *linear("fc2", ffn, h, MLP, Split.ROW, bias=bias),
        *layer_norm("final_layer_norm"),
    )
    layer = LayerSpec(
        attention=AttentionSpec(num_heads=a, num_kv_heads=a, head_dim=d, rope="none"),
        mlp=MLPSpec(gated=False, intermediate_size=ffn, activation=cfg.str("activation_function")),
        norm="layer",
        tensors=tensors,
    )
    embedding = [
        token_embedding("model.decoder.embed_tokens.weight", vocab, e),
        TensorSpec("model.decoder.embed_positions.weight", (positions + 2, h), Component.EMBEDDING),
    ]
    head: list[TensorSpec] = []
    if cfg.bool("do_layer_norm_before") and not cfg.bool("_remove_final_layer_norm"):
        head += layer_norm("model.decoder.final_layer_norm")
    if e != h:
        embedding += linear("model.decoder.project_in", e, h, Component.EMBEDDING, Split.NONE)
        head += linear("model.decoder.project_out", h, e, Component.LM_HEAD, Split.NONE)
    tied = cfg.bool("tie_word_embeddings")
    if not tied:
        head += lm_head(vocab, e)
    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[layer] * cfg.int("num_hidden_layers"),
        embedding=embedding,
        head=head,
        tie_word_embeddings=tied,
        max_position_embeddings=positions,
    )
