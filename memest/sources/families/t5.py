"""T5 encoder-decoders: t5 (T5 v1.0, v1.1 / LM-adapted, T0, Flan-T5) and mt5 (mT5, mT0).

Follows transformers ``models/t5/modeling_t5.py``. A shared embedding ``shared (V, d_model)``
feeds an encoder stack (``num_layers`` blocks, bidirectional, ``stack="encoder"``) and a decoder
stack (``num_decoder_layers`` blocks, default num_layers, causal with cross-attention). Each block
is pre-norm with weight-only RMS LayerNorms: self-attention ``q/k/v (a*d_kv, d_model)`` and
``o (d_model, a*d_kv)`` without biases; decoder blocks add ``EncDecAttention`` of the same
shapes; the feed-forward is ``wi (d_ff, d_model)`` + ``wo``, or gated ``wi_0`` + ``wi_1`` + ``wo``
when ``feed_forward_proj`` starts with ``gated-`` (v1.1). Only block 0 of each stack has the
``relative_attention_bias (num_buckets, a)`` table, so it is a LayerSpec of its own. Each stack
ends with ``final_layer_norm``.

The lm_head is tied to ``shared`` unless ``tie_word_embeddings`` is false (v1.1 and T0
checkpoints store their own lm_head). transformers >= 5 builds every ``T5ForConditionalGeneration``
with the lm_head tied and unties it in ``from_pretrained`` when the checkpoint stores a distinct
one; this adapter counts the checkpoint as loaded.

mt5 is the same network (transformers ``models/mt5/modeling_mt5.py`` copies T5's modules) with
``MT5Config``'s own defaults (``models/mt5/configuration_mt5.py``: vocab_size 250112, d_ff 1024,
feed_forward_proj ``gated-gelu``; tie_word_embeddings forced true at construction, "official weights have False
serialized", which from_pretrained unties as for T5) and the ``MT5*`` class names.
"""

from __future__ import annotations

from memest.errors import ConfigError
from memest.sources.config import HFConfig
from memest.sources.families._build import ATTN, MLP, intern, linear, lm_head, model_spec, norm, token_embedding
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec, Split, TaskKind, TensorSpec

# T5Config defaults (models/t5/configuration_t5.py) and its attribute_map
_DEFAULTS: dict[str, object] = {
    "vocab_size": 32128,
    "d_kv": 64,
    "d_ff": 2048,
    "num_decoder_layers": None,
    "relative_attention_num_buckets": 32,
    "feed_forward_proj": "relu",
    "tie_word_embeddings": True,
}
_ALIASES = {
    "hidden_size": "d_model",
    "num_attention_heads": "num_heads",
    "num_hidden_layers": "num_layers",
    "head_dim": "d_kv",
}
# MT5Config defaults (models/mt5/configuration_mt5.py)
_MT5_DEFAULTS: dict[str, object] = {
    **_DEFAULTS,
    "vocab_size": 250112,
    "d_ff": 1024,
    "feed_forward_proj": "gated-gelu",
}
_CLASSES = ("T5ForConditionalGeneration", "T5Model", "T5EncoderModel")


def _attention(prefix: str, dm: int, a: int, dkv: int) -> list[TensorSpec]:
    return [
        *linear(f"{prefix}.q", dm, a * dkv, ATTN, Split.COL),
        *linear(f"{prefix}.k", dm, a * dkv, ATTN, Split.KV),
        *linear(f"{prefix}.v", dm, a * dkv, ATTN, Split.KV),
        *linear(f"{prefix}.o", a * dkv, dm, ATTN, Split.ROW),
    ]


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a t5 config (``T5ForConditionalGeneration``, ``T5Model`` or ``T5EncoderModel``), or of an
    mt5 config (the same classes as ``MT5*``).

    Raises:
        ConfigError: another class is named, or ``feed_forward_proj`` is malformed.
    """
    mt5 = cfg.model_type == "mt5"
    cfg = cfg.with_defaults(_MT5_DEFAULTS if mt5 else _DEFAULTS, aliases=_ALIASES)
    named = cfg.architecture or ("MT5ForConditionalGeneration" if mt5 else "T5ForConditionalGeneration")
    classes = tuple("M" + c for c in _CLASSES) if mt5 else _CLASSES
    if named not in classes:
        raise ConfigError(
            f"{cfg.what}: architecture {named!r} is not modelled; use one of {', '.join(classes)}"
        )
    arch = named.removeprefix("M") if mt5 else named
    dm = cfg.int("d_model")
    dkv = cfg.int("d_kv")
    dff = cfg.int("d_ff")
    a = cfg.int("num_heads")
    vocab = cfg.int("vocab_size")
    buckets = cfg.int("relative_attention_num_buckets")
    proj = cfg.str("feed_forward_proj")
    parts = proj.split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise ConfigError(f"{cfg.what}: 'feed_forward_proj' is {proj!r}; expected 'ACT' or 'gated-ACT'")
    gated = parts[0] == "gated"
    activation = "gelu_new" if proj == "gated-gelu" else parts[-1]
    num_encoder = cfg.int("num_layers")
    num_decoder = cfg.int("num_decoder_layers", default=num_encoder, minimum=0)

    if gated:
        ff = [
            *linear("DenseReluDense.wi_0", dm, dff, MLP, Split.COL),
            *linear("DenseReluDense.wi_1", dm, dff, MLP, Split.COL),
            *linear("DenseReluDense.wo", dff, dm, MLP, Split.ROW),
        ]
    else:
        ff = [
            *linear("DenseReluDense.wi", dm, dff, MLP, Split.COL),
            *linear("DenseReluDense.wo", dff, dm, MLP, Split.ROW),
        ]
    mlp = MLPSpec(gated=gated, intermediate_size=dff, activation=activation)
    rel_bias = [TensorSpec("layer.0.SelfAttention.relative_attention_bias.weight", (buckets, a), ATTN)]
    kinds: dict[object, LayerSpec] = {}

    def block(decoder: bool, first: bool) -> LayerSpec:
        def make() -> LayerSpec:
            ff_index = 2 if decoder else 1
            tensors = [
                *_attention("layer.0.SelfAttention", dm, a, dkv),
                *(rel_bias if first else []),
                *norm("layer.0.layer_norm", dm),
                *(
                    _attention("layer.1.EncDecAttention", dm, a, dkv) + norm("layer.1.layer_norm", dm)
                    if decoder
                    else []
                ),
                *(TensorSpec(f"layer.{ff_index}.{t.name}", t.shape, t.component, t.split) for t in ff),
                *norm(f"layer.{ff_index}.layer_norm", dm),
            ]
            return LayerSpec(
                attention=AttentionSpec(
                    num_heads=a, num_kv_heads=a, head_dim=dkv, causal=decoder, cross_attention=decoder
                ),
                mlp=mlp,
                norm="rms",
                tensors=tuple(tensors),
                stack="decoder" if decoder else "encoder",
            )

        return intern(kinds, (decoder, first), make)

    layers = [block(False, n == 0) for n in range(num_encoder)]
    head = norm("encoder.final_layer_norm", dm)
    tied = cfg.bool("tie_word_embeddings")
    task: TaskKind = "classification"
    notes: tuple[str, ...] = ()
    if arch != "T5EncoderModel":
        task = "seq2seq"
        layers += [block(True, n == 0) for n in range(num_decoder)]
        head += norm("decoder.final_layer_norm", dm)
        if arch == "T5ForConditionalGeneration" and not tied:
            head += lm_head(vocab, dm)
            notes = (
                (
                    "tie_word_embeddings is false: the lm_head is counted apart from 'shared', as the checkpoint "
                    "stores it and from_pretrained loads it (transformers >= 5 ties it when building the class "
                    "from the config alone)"
                ),
            )
    return model_spec(
        cfg,
        hidden_size=dm,
        vocab_size=vocab,
        layers=layers,
        embedding=[token_embedding("shared.weight", vocab, dm)],
        head=head,
        tie_word_embeddings=tied and arch == "T5ForConditionalGeneration",
        max_position_embeddings=cfg.int("n_positions", default=None),
        task=task,
        notes=notes,
    )


__all__ = ["build"]
