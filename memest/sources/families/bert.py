"""BERT encoders: bert.

Follows transformers ``models/bert/modeling_bert.py``. Embeddings: word ``(V, h)``, learned
absolute positions ``(max_position_embeddings, h)``, token types ``(type_vocab_size, h)`` and a
LayerNorm. Post-norm encoder layers (``stack="encoder"``, bidirectional): biased
``attention.self.query/key/value`` and ``attention.output.dense`` + LayerNorm, GELU MLP
``intermediate.dense``/``output.dense`` + LayerNorm. The head depends on the class named first in
``architectures``:

- ``BertForMaskedLM`` (task ``masked_lm``) and ``BertLMHeadModel``: no pooler; the MLM head
  ``cls.predictions.transform`` (dense + LayerNorm) and the output bias ``cls.predictions.bias``;
  the decoder weight (and its bias) are tied to the word embedding (and that bias) unless
  ``tie_word_embeddings`` is false;
- ``BertForPreTraining``: pooler + MLM head + next-sentence ``cls.seq_relationship (2, h)``;
- ``BertModel``: pooler ``pooler.dense (h, h)`` only;
- ``BertForSequenceClassification`` / ``...MultipleChoice`` / ``...NextSentencePrediction``:
  pooler + a classifier of num_labels / 1 / 2 rows;
- ``BertForTokenClassification`` / ``...QuestionAnswering``: no pooler; ``classifier`` /
  ``qa_outputs`` of num_labels rows.

With ``is_decoder`` the layers are causal; ``add_cross_attention`` adds ``crossattention`` blocks.
"""

from __future__ import annotations

from memest.errors import ConfigError
from memest.sources.config import HFConfig
from memest.sources.families._build import (
    ATTN,
    MLP,
    OTHER,
    linear,
    model_spec,
    norm,
    num_labels_of,
    token_embedding,
)
from memest.spec import AttentionSpec, Component, LayerSpec, MLPSpec, ModelSpec, Split, TaskKind, TensorSpec

# BertConfig defaults (models/bert/configuration_bert.py) of the fields read here
_DEFAULTS: dict[str, object] = {
    "vocab_size": 30522,
    "intermediate_size": 3072,
    "hidden_act": "gelu",
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "is_decoder": False,
    "add_cross_attention": False,
    "tie_word_embeddings": True,
}
# class -> (attribute prefix of BertModel, pooler, head kind)
_CLASSES: dict[str, tuple[str, bool, str]] = {
    "BertModel": ("", True, "none"),
    "BertForMaskedLM": ("bert.", False, "mlm"),
    "BertLMHeadModel": ("bert.", False, "mlm"),
    "BertForPreTraining": ("bert.", True, "pretraining"),
    "BertForNextSentencePrediction": ("bert.", True, "nsp"),
    "BertForSequenceClassification": ("bert.", True, "classifier"),
    "BertForMultipleChoice": ("bert.", True, "choice"),
    "BertForTokenClassification": ("bert.", False, "classifier"),
    "BertForQuestionAnswering": ("bert.", False, "qa"),
}


def _attention_block(prefix: str, h: int, a: int, d: int) -> list[TensorSpec]:
    return [
        *linear(f"{prefix}.self.query", h, a * d, ATTN, Split.COL, bias=True),
        *linear(f"{prefix}.self.key", h, a * d, ATTN, Split.KV, bias=True),
        *linear(f"{prefix}.self.value", h, a * d, ATTN, Split.KV, bias=True),
        *linear(f"{prefix}.output.dense", a * d, h, ATTN, Split.ROW, bias=True),
        *norm(f"{prefix}.output.LayerNorm", h, bias=True),
    ]


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a bert config, for the class named first in ``architectures``.

    Raises:
        ConfigError: the class is not one of the BERT classes transformers defines.
    """
    cfg = cfg.with_defaults(_DEFAULTS)
    arch = cfg.architecture or "BertModel"
    if arch not in _CLASSES:
        raise ConfigError(
            f"{cfg.what}: architecture {arch!r} is not a BERT class memest models; "
            f"use one of {', '.join(sorted(_CLASSES))}"
        )
    prefix, pooler, head_kind = _CLASSES[arch]
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    d = cfg.divide("hidden_size", h, "num_attention_heads", a)
    i = cfg.int("intermediate_size")
    vocab = cfg.int("vocab_size")
    positions = cfg.int("max_position_embeddings")
    decoder = cfg.bool("is_decoder")
    cross = cfg.bool("add_cross_attention")
    if cross and not decoder:
        raise ConfigError(f"{cfg.what}: 'add_cross_attention' needs 'is_decoder' true (BertLayer)")

    tensors = (
        *_attention_block("attention", h, a, d),
        *(_attention_block("crossattention", h, a, d) if cross else []),
        *linear("intermediate.dense", h, i, MLP, Split.COL, bias=True),
        *linear("output.dense", i, h, MLP, Split.ROW, bias=True),
        *norm("output.LayerNorm", h, bias=True),
    )
    layer = LayerSpec(
        attention=AttentionSpec(num_heads=a, num_kv_heads=a, head_dim=d, causal=decoder, cross_attention=cross),
        mlp=MLPSpec(gated=False, intermediate_size=i, activation=cfg.str("hidden_act")),
        norm="layer",
        tensors=tensors,
        stack="decoder" if decoder else "encoder",
    )
    embedding = [
        token_embedding(f"{prefix}embeddings.word_embeddings.weight", vocab, h),
        TensorSpec(f"{prefix}embeddings.position_embeddings.weight", (positions, h), Component.EMBEDDING),
        TensorSpec(
            f"{prefix}embeddings.token_type_embeddings.weight", (cfg.int("type_vocab_size"), h), Component.EMBEDDING
        ),
        *norm(f"{prefix}embeddings.LayerNorm", h, bias=True),
    ]
    tied = cfg.bool("tie_word_embeddings")
    head: list[TensorSpec] = []
    if pooler:
        head += linear(f"{prefix}pooler.dense", h, h, OTHER, Split.NONE, bias=True)
    task: TaskKind = "classification"
    if head_kind in ("mlm", "pretraining"):
        task = "causal_lm" if arch == "BertLMHeadModel" else "masked_lm"
        head += [
            *linear("cls.predictions.transform.dense", h, h, Component.LM_HEAD, Split.NONE, bias=True),
            *norm("cls.predictions.transform.LayerNorm", h, bias=True),
            TensorSpec("cls.predictions.bias", (vocab,), Component.LM_HEAD, Split.VOCAB),
        ]
        if not tied:
            head += linear("cls.predictions.decoder", h, vocab, Component.LM_HEAD, Split.VOCAB, bias=True)
    if head_kind in ("pretraining", "nsp"):
        head += linear("cls.seq_relationship", h, 2, OTHER, Split.NONE, bias=True)
    elif head_kind == "classifier":
        head += linear("classifier", h, num_labels_of(cfg), OTHER, Split.NONE, bias=True)
    elif head_kind == "choice":
        head += linear("classifier", h, 1, OTHER, Split.NONE, bias=True)
    elif head_kind == "qa":
        head += linear("qa_outputs", h, num_labels_of(cfg), OTHER, Split.NONE, bias=True)
    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[layer] * cfg.int("num_hidden_layers"),
        embedding=embedding,
        head=head,
        tie_word_embeddings=tied and head_kind in ("mlm", "pretraining"),
        max_position_embeddings=positions,
        task=task,
    )
