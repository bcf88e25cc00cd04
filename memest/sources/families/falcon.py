"""TII Falcon decoders: falcon (Falcon-7B/40B/180B, RW models).

Follows transformers ``models/falcon/modeling_falcon.py``. One fused
``self_attention.query_key_value`` whose width depends on the variant:

- ``new_decoder_architecture`` (40B, 180B): grouped-query, ``(a + 2 k) d`` with k = num_kv_heads;
  two LayerNorms ``ln_attn``/``ln_mlp`` (``num_ln_in_parallel_attn``, default 2) feeding
  attention and MLP in parallel; ``_split_heads`` broadcasts K and V to all a heads, so
  transformers' cache holds a heads (``kv_broadcast``);
- legacy ``multi_query`` (7B): one K/V head, ``h + 2d``;
- legacy multi-head: ``3h``;

legacy layers with ``parallel_attn`` have one ``input_layernorm`` shared by attention and MLP;
without it, ``input_layernorm`` + ``post_attention_layernorm`` in sequence. ``bias`` adds biases
to every linear layer; LayerNorms always have them. MLP ``dense_h_to_4h``/``dense_4h_to_h`` is
``ffn_hidden_size`` (default 4h) wide. ALiBi or rotary positions: no position parameters. lm_head
tied by default. Legacy RefinedWeb keys (``n_head``, ``n_layer``, ``n_embed``) are read as their
current names.
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import ATTN, MLP, linear, lm_head, model_spec, norm, token_embedding
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec, Split

# FalconConfig defaults (models/falcon/configuration_falcon.py) of the fields read here
_DEFAULTS: dict[str, object] = {
    "vocab_size": 65024,
    "num_ln_in_parallel_attn": None,
    "num_kv_heads": None,
    "new_decoder_architecture": False,
    "multi_query": True,
    "parallel_attn": True,
    "bias": False,
    "max_position_embeddings": 2048,
    "ffn_hidden_size": None,
    "activation": "gelu",
    "tie_word_embeddings": True,
    "alibi": False,
}
_LEGACY = {"n_head": "num_attention_heads", "n_layer": "num_hidden_layers"}


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a falcon config."""
    cfg = cfg.with_defaults(_DEFAULTS, aliases=_LEGACY)
    h = cfg.int("n_embed", "hidden_size")
    a = cfg.int("num_attention_heads")
    d = h // a  # FalconConfig.head_dim
    vocab = cfg.int("vocab_size")
    new_arch = cfg.bool("new_decoder_architecture")
    multi_query = cfg.bool("multi_query")
    parallel = cfg.bool("parallel_attn")
    bias = cfg.bool("bias")
    ffn = cfg.int("ffn_hidden_size", default=4 * h)
    if new_arch:
        k = cfg.int("num_kv_heads", default=a)
        qkv = (a + 2 * k) * d
    elif multi_query:
        k, qkv = 1, h + 2 * d
    else:
        k, qkv = cfg.int("num_kv_heads", default=a), 3 * h
    num_ln = cfg.int("num_ln_in_parallel_attn", default=2 if new_arch else 1)
    if not parallel:
        norms = [*norm("input_layernorm", h, bias=True), *norm("post_attention_layernorm", h, bias=True)]
    elif num_ln == 2:
        norms = [*norm("ln_attn", h, bias=True), *norm("ln_mlp", h, bias=True)]
    else:
        norms = norm("input_layernorm", h, bias=True)
    tensors = (
        *linear("self_attention.query_key_value", h, qkv, ATTN, Split.COL, bias=bias),
        *linear("self_attention.dense", h, h, ATTN, Split.ROW, bias=bias),
        *linear("mlp.dense_h_to_4h", h, ffn, MLP, Split.COL, bias=bias),
        *linear("mlp.dense_4h_to_h", ffn, h, MLP, Split.ROW, bias=bias),
        *norms,
    )
    layer = LayerSpec(
        attention=AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d, kv_broadcast=new_arch,
                                rope="none" if cfg.bool("alibi") else "rotate"),
        mlp=MLPSpec(gated=False, intermediate_size=ffn, activation=cfg.str("activation")),
        norm="layer",
        parallel_residual=new_arch or parallel,
        parallel_norms=2 if parallel and num_ln == 2 else 1,
        tensors=tensors,
    )
    tied = cfg.bool("tie_word_embeddings")
    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[layer] * cfg.int("num_hidden_layers"),
        embedding=[token_embedding("transformer.word_embeddings.weight", vocab, h)],
        head=[*norm("transformer.ln_f", h, bias=True), *([] if tied else lm_head(vocab, h))],
        tie_word_embeddings=tied,
        max_position_embeddings=cfg.int("max_position_embeddings"),
    )
