"""Building blocks the family adapters share: linear layers, norms, attention and MLP tensors.

Each helper returns TensorSpecs named as the transformers module names them, so an adapter reads
like the model's ``__init__``. Shapes follow ``nn.Linear``: weight ``(out_features, in_features)``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any

from memest.dtypes import KNOWN, canonical
from memest.errors import ConfigError, InputError
from memest.sources.config import HFConfig
from memest.sources.quantization import (
    block_shape,
    compressed_tensors_spec,
    group_size,
    modelopt_spec,
    module_list,
    quant_bits,
)
from memest.spec import (
    AttentionSpec,
    BufferSpec,
    Component,
    LayerSpec,
    ModelSpec,
    QuantizationSpec,
    Split,
    TaskKind,
    TensorSpec,
)

ATTN = Component.ATTENTION
MLP = Component.MLP
NORM = Component.NORM
OTHER = Component.OTHER


def linear(
    name: str,
    in_features: int,
    out_features: int,
    component: Component,
    split: Split,
    *,
    bias: bool = False,
) -> list[TensorSpec]:
    """An ``nn.Linear(in_features, out_features, bias)``: its weight and optional bias.

    A column-parallel layer's bias is split with it; a row-parallel layer's bias is added after
    the all-reduce, so every TP rank keeps all of it (Megatron-LM ``RowParallelLinear``).
    """
    tensors = [TensorSpec(f"{name}.weight", (out_features, in_features), component, split)]
    if bias:
        bias_split = split if split in (Split.COL, Split.KV, Split.VOCAB) else Split.NONE
        tensors.append(TensorSpec(f"{name}.bias", (out_features,), component, bias_split))
    return tensors


def conv1d(
    name: str,
    in_features: int,
    out_features: int,
    component: Component,
    split: Split,
    *,
    bias: bool = True,
) -> list[TensorSpec]:
    """A GPT-2 ``Conv1D(out_features, in_features)`` (transformers ``pytorch_utils.Conv1D``).

    Unlike ``nn.Linear`` it stores its weight transposed, ``(in_features, out_features)``; the
    shape here is the stored one, so names and shapes match the checkpoint.
    """
    tensors = [TensorSpec(f"{name}.weight", (in_features, out_features), component, split)]
    if bias:
        bias_split = split if split in (Split.COL, Split.KV, Split.VOCAB) else Split.NONE
        tensors.append(TensorSpec(f"{name}.bias", (out_features,), component, bias_split))
    return tensors


def norm(name: str, size: int, *, bias: bool = False, component: Component = NORM) -> list[TensorSpec]:
    """A LayerNorm (``bias=True``) or RMSNorm (``bias=False``) over ``size`` features."""
    tensors = [TensorSpec(f"{name}.weight", (size,), component)]
    if bias:
        tensors.append(TensorSpec(f"{name}.bias", (size,), component))
    return tensors


def gqa_projections(
    hidden_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    *,
    prefix: str = "self_attn",
    names: tuple[str, str, str, str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
    qkv_bias: bool = False,
    o_bias: bool = False,
) -> list[TensorSpec]:
    """Separate Q, K, V and output projections of (grouped-query) attention."""
    q, k, v, o = (f"{prefix}.{n}" for n in names)
    return [
        *linear(q, hidden_size, num_heads * head_dim, ATTN, Split.COL, bias=qkv_bias),
        *linear(k, hidden_size, num_kv_heads * head_dim, ATTN, Split.KV, bias=qkv_bias),
        *linear(v, hidden_size, num_kv_heads * head_dim, ATTN, Split.KV, bias=qkv_bias),
        *linear(o, num_heads * head_dim, hidden_size, ATTN, Split.ROW, bias=o_bias),
    ]


def gated_mlp(
    hidden_size: int,
    intermediate_size: int,
    *,
    prefix: str = "mlp",
    names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
    bias: bool = False,
    component: Component = MLP,
) -> list[TensorSpec]:
    """A GLU feed-forward (SwiGLU, GeGLU): gate and up projections i wide, then down."""
    gate, up, down = (f"{prefix}.{n}" for n in names)
    return [
        *linear(gate, hidden_size, intermediate_size, component, Split.COL, bias=bias),
        *linear(up, hidden_size, intermediate_size, component, Split.COL, bias=bias),
        *linear(down, intermediate_size, hidden_size, component, Split.ROW, bias=bias),
    ]


def plain_mlp(
    hidden_size: int,
    intermediate_size: int,
    *,
    prefix: str = "mlp",
    names: tuple[str, str] = ("fc1", "fc2"),
    bias: bool = True,
) -> list[TensorSpec]:
    """A two-layer feed-forward (GPT-2, NeoX, OPT, BERT): up to i, activation, down to h."""
    up, down = (f"{prefix}.{n}" for n in names)
    return [
        *linear(up, hidden_size, intermediate_size, MLP, Split.COL, bias=bias),
        *linear(down, intermediate_size, hidden_size, MLP, Split.ROW, bias=bias),
    ]


def expert_stack(
    hidden_size: int,
    intermediate_size: int,
    num_experts: int,
    *,
    prefix: str = "mlp.experts",
    transposed: bool = False,
    bias: bool = False,
) -> list[TensorSpec]:
    """Routed GLU experts stored as two 3-D tensors, as transformers >= 5 fuses them.

    ``gate_up_proj`` holds each expert's gate and up projections (2i outputs) and ``down_proj``
    its down projection: ``(E, 2i, h)`` and ``(E, h, i)`` (``nn.Linear`` layout, e.g. transformers
    ``models/mixtral/modeling_mixtral.py`` ``MixtralExperts``), or ``(E, h, 2i)`` and ``(E, i, h)``
    with ``transposed`` (``models/gpt_oss/modeling_gpt_oss.py`` ``GptOssExperts``), which also has
    per-expert biases ``gate_up_proj_bias (E, 2i)`` and ``down_proj_bias (E, h)``.
    Tensor parallelism splits gate_up by columns and down by rows inside every expert.
    """
    e, h, i = num_experts, hidden_size, intermediate_size
    gate_up = (e, h, 2 * i) if transposed else (e, 2 * i, h)
    down = (e, i, h) if transposed else (e, h, i)
    tensors = [
        TensorSpec(f"{prefix}.gate_up_proj", gate_up, Component.EXPERTS, Split.COL),
        TensorSpec(f"{prefix}.down_proj", down, Component.EXPERTS, Split.ROW),
    ]
    if bias:
        tensors.insert(1, TensorSpec(f"{prefix}.gate_up_proj_bias", (e, 2 * i), Component.EXPERTS, Split.COL))
        tensors.append(TensorSpec(f"{prefix}.down_proj_bias", (e, h), Component.EXPERTS, Split.NONE))
    return tensors


def router(name: str, hidden_size: int, num_experts: int, *, bias: bool = False) -> list[TensorSpec]:
    """The MoE gate scoring ``num_experts`` experts: weight ``(E, h)``, replicated on TP ranks."""
    return linear(name, hidden_size, num_experts, Component.ROUTER, Split.NONE, bias=bias)


def intern(kinds: dict[Hashable, LayerSpec], key: Hashable, make: Callable[[], LayerSpec]) -> LayerSpec:
    """The one LayerSpec object for ``key``, built by ``make`` the first time.

    Adapters build one object per distinct kind of layer and repeat it, so that estimators that
    group layers by identity stay fast.
    """
    layer = kinds.get(key)
    if layer is None:
        layer = kinds[key] = make()
    return layer


def num_labels_of(cfg: HFConfig) -> int:
    """Classes of a classification head: ``len(id2label)`` when given, else ``num_labels``, else 2.

    As transformers ``PreTrainedConfig.__post_init__`` resolves them.
    """
    id2label = cfg.get("id2label", default=None)
    if isinstance(id2label, dict) and id2label:
        return len(id2label)
    return cfg.int("num_labels", default=2)


def token_embedding(name: str, vocab_size: int, hidden_size: int) -> TensorSpec:
    """A vocab-parallel token embedding ``(V, h)``."""
    return TensorSpec(name, (vocab_size, hidden_size), Component.EMBEDDING, Split.VOCAB)


def lm_head(vocab_size: int, hidden_size: int, *, name: str = "lm_head", bias: bool = False) -> list[TensorSpec]:
    """An untied output projection ``(V, h)``, vocab-parallel."""
    return linear(name, hidden_size, vocab_size, Component.LM_HEAD, Split.VOCAB, bias=bias)


def head_dim_of(cfg: HFConfig, hidden_size: int, num_heads: int) -> int:
    """``head_dim`` from the config when it gives one, else ``hidden_size / num_heads`` (exact)."""
    if cfg.has("head_dim"):
        return cfg.int("head_dim")
    return cfg.divide("hidden_size", hidden_size, "num_attention_heads", num_heads)


def layer_windows(cfg: HFConfig, num_layers: int, window: int | None) -> list[int | None]:
    """Each layer's sliding window (None = full attention).

    Uses ``layer_types`` when the config lists them (``sliding_attention`` / ``full_attention``),
    else applies ``window`` to every layer. A ``sliding_attention`` layer without a window attends
    fully, as in transformers (whose attention modules then get ``sliding_window=None``).

    Raises:
        ConfigError: ``layer_types`` has the wrong length or an unknown entry.
    """
    from memest.sources.families._layers import listed_kinds

    if cfg.get("layer_types", default=None) is None:
        return [window] * num_layers
    kinds = listed_kinds(cfg, "layer_types", num_layers, {"full_attention": "full", "sliding_attention": "sliding"})
    return [window if kind == "sliding" else None for kind in kinds]


def quantization_of(cfg: HFConfig) -> QuantizationSpec | None:
    """The checkpoint's ``quantization_config``, parsed and checked (None when unquantized).

    A multimodal checkpoint may state it in its ``text_config`` only (moonshotai/Kimi-K2.5), as it may
    its dtype (:func:`torch_dtype_of`). Source of the field names: transformers
    ``utils/quantization_config.py`` (BitsAndBytesConfig, GPTQConfig, AwqConfig, FineGrainedFP8Config,
    Mxfp4Config, CompressedTensorsConfig).

    Raises:
        ConfigError: a field is malformed (bits not in 1..16, a group size of 0, a block shape that
            is not two positive integers, a module list that is not a list of strings).
    """
    q = cfg.get("quantization_config", default=None)
    if q is None:
        q = cfg.text.get("quantization_config", default=None)
    if q is None:
        return None
    if not isinstance(q, dict):
        raise ConfigError(f"{cfg.what}: 'quantization_config' is {q!r}; it must be an object or absent")
    what = f"{cfg.what}: quantization_config"
    method = str(q.get("quant_method", "")).lower()
    skip = module_list(q.get("modules_to_not_convert", q.get("llm_int8_skip_modules")),
                       f"{what}.modules_to_not_convert")
    if method == "bitsandbytes":
        four = bool(q.get("load_in_4bit"))
        return QuantizationSpec(
            method="bitsandbytes",
            bits=4 if four else 8,
            group_size=64 if four else None,
            double_quant=bool(q.get("bnb_4bit_use_double_quant")),
            skip_modules=skip,
            compute_dtype=str(q["bnb_4bit_compute_dtype"]) if four and q.get("bnb_4bit_compute_dtype") else None,
        )
    if method == "compressed-tensors":
        return compressed_tensors_spec(q, what)
    if method.startswith("modelopt"):
        return modelopt_spec(q, what)
    if method in ("gptq", "awq"):
        bits_key = "bits" if "bits" in q or "w_bit" not in q else "w_bit"
        group_key = "group_size" if "group_size" in q or "q_group_size" not in q else "q_group_size"
        return QuantizationSpec(
            method=method,
            bits=quant_bits(q.get(bits_key, 4), f"{what}.{bits_key}"),
            group_size=group_size(q.get(group_key, 128), f"{what}.{group_key}"),
            skip_modules=skip,
        )
    if method == "fp8":
        return QuantizationSpec(
            method="fp8", bits=8, block_shape=block_shape(q.get("weight_block_size"), f"{what}.weight_block_size"),
            skip_modules=skip,
        )
    if method == "mxfp4":
        return QuantizationSpec(method="mxfp4", bits=4, group_size=32, skip_modules=skip)
    return QuantizationSpec(method=method or "unknown", bits=quant_bits(q.get("bits", 8), f"{what}.bits"),
                            skip_modules=skip)


def torch_dtype_of(cfg: HFConfig) -> str | None:
    """The checkpoint dtype the config states (``torch_dtype``, or ``dtype`` in transformers 5).

    Raises:
        ConfigError: it states a dtype memest does not know (``float99``).
    """
    value = cfg.get("torch_dtype", "dtype", default=None)
    if value is None:
        value = cfg.text.get("torch_dtype", "dtype", default=None)
    if value is None:
        return None
    try:
        canonical(str(value))
    except InputError:
        raise ConfigError(f"config.json torch_dtype {value!r} is not a dtype memest knows; "
                          f"set it to one of {', '.join(KNOWN)}") from None
    return str(value)


HIDDEN_DROPOUT_KEYS = ("hidden_dropout_prob", "hidden_dropout", "resid_pdrop", "dropout_rate", "dropout")
"""Config keys of the residual-branch dropout, by family: BERT, Falcon/BLOOM, GPT-2/GPT-J, T5, OPT."""
ATTENTION_DROPOUT_KEYS = ("attention_probs_dropout_prob", "attention_dropout", "attn_pdrop")
"""Config keys of the attention-probability dropout: BERT, Llama-style/OPT/Falcon, GPT-2."""


def dropout_of(cfg: HFConfig, keys: tuple[str, ...]) -> float:
    """The first dropout probability the config gives under ``keys`` (0.0 when none)."""
    value = cfg.get(*keys, default=0.0)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def model_spec(
    cfg: HFConfig,
    *,
    hidden_size: int,
    vocab_size: int,
    layers: list[LayerSpec],
    embedding: list[TensorSpec],
    head: list[TensorSpec],
    tie_word_embeddings: bool,
    max_position_embeddings: int | None,
    task: TaskKind = "causal_lm",
    notes: tuple[str, ...] = (),
    buffers: tuple[BufferSpec, ...] = (),
    final_logit_softcapping: bool = False,
    sdpa_supported: bool = True,
) -> ModelSpec:
    """Assemble a ModelSpec with the identity fields every adapter fills the same way."""
    return ModelSpec(
        name=cfg.name,
        model_type=cfg.model_type,
        architecture=cfg.architecture,
        hidden_size=hidden_size,
        vocab_size=vocab_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        layers=tuple(layers),
        embedding=tuple(embedding),
        head=tuple(head),
        task=task,
        torch_dtype=torch_dtype_of(cfg),
        quantization=quantization_of(cfg),
        source=cfg.source,
        notes=notes,
        hidden_dropout=dropout_of(cfg, HIDDEN_DROPOUT_KEYS),
        attention_dropout=dropout_of(cfg, ATTENTION_DROPOUT_KEYS),
        buffers=buffers,
        final_logit_softcapping=final_logit_softcapping,
        sdpa_supported=sdpa_supported,
    )


def decoder_spec(
    cfg: HFConfig,
    *,
    hidden_size: int,
    vocab_size: int,
    layers: list[LayerSpec],
    max_position_embeddings: int | None,
    **identity: Any,
) -> ModelSpec:
    """A transformers decoder in its usual layout: ``model.embed_tokens`` (vocab_size x hidden_size), the layers,
    ``model.norm`` and an ``lm_head`` of its own unless the config ties it to the embedding
    (``tie_word_embeddings``, ``PreTrainedModel.tie_weights``). ``identity``: the other keywords of
    :func:`model_spec` (notes, sdpa_supported, ...)."""
    tied = cfg.bool("tie_word_embeddings")
    return model_spec(
        cfg,
        hidden_size=hidden_size,
        vocab_size=vocab_size,
        layers=layers,
        embedding=[token_embedding("model.embed_tokens.weight", vocab_size, hidden_size)],
        head=[*norm("model.norm", hidden_size), *([] if tied else lm_head(vocab_size, hidden_size))],
        tie_word_embeddings=tied,
        max_position_embeddings=max_position_embeddings,
        **identity,
    )


def text_config_of(cfg: HFConfig, text_model_type: str, defaults: Mapping[str, Any]) -> tuple[HFConfig, HFConfig, str]:
    """``(top, text, prefix)`` of a checkpoint published both as its text model alone (``model_type``
    ``text_model_type``: the text config is the file, its tensors under ``model.``) and as the multimodal model
    (``text_config`` under ``model.language_model.``, the towers beside it, the lm_head tied unless the top level
    says otherwise): Gemma 3n and Gemma 4 (``Gemma3n/Gemma4ForConditionalGeneration``). ``top`` is the config whose
    identity and ``tie_word_embeddings`` the spec takes, ``text`` the text config with the text class's
    ``defaults``; ``top is text`` for the text model alone."""
    if cfg.model_type == text_model_type:
        text = cfg.with_defaults(defaults)
        return text, text, "model."
    top = cfg.with_defaults({"tie_word_embeddings": True})
    return top, cfg.sub("text_config", required=False).with_defaults(defaults), "model.language_model."


def softcapped_text_spec(top: HFConfig, text: HFConfig, *, layers: list[LayerSpec], embedding: list[TensorSpec],
                         head: list[TensorSpec], notes: tuple[str, ...]) -> ModelSpec:
    """The spec of a :func:`text_config_of` checkpoint: the text model's sizes and positions, its own lm_head
    unless ``top`` ties it, and whether the text config caps the final logits (``final_logit_softcapping``)."""
    vocab, h = text.int("vocab_size"), text.int("hidden_size")
    tied = top.bool("tie_word_embeddings")
    return model_spec(
        top,
        hidden_size=h,
        vocab_size=vocab,
        layers=layers,
        embedding=embedding,
        head=[*head, *([] if tied else lm_head(vocab, h))],
        tie_word_embeddings=tied,
        max_position_embeddings=text.int("max_position_embeddings"),
        final_logit_softcapping=text.get("final_logit_softcapping", default=None) is not None,
        notes=notes,
    )


def with_towers(
    cfg: HFConfig,
    text: ModelSpec,
    *,
    towers: list[TensorSpec],
    tied: bool,
    text_prefix: str = "model.language_model.",
    notes: tuple[str, ...] = (),
) -> ModelSpec:
    """A multimodal checkpoint: the text model ``text`` (built by its family's adapter from
    ``text_config``) moved under ``text_prefix``, with the vision (or audio) tower and projector
    tensors ``towers`` in ``embedding`` (they run before the first text layer) and the lm_head at
    the top level, tied to the embedding per the top-level config's ``tie_word_embeddings``.

    transformers' ``...ForConditionalGeneration`` classes keep the language model under
    ``model.language_model`` and ``lm_head`` outside it (e.g. ``models/mistral3/modeling_mistral3.py``).
    """

    def moved(tensors: tuple[TensorSpec, ...]) -> list[TensorSpec]:
        return [
            t if t.component is Component.LM_HEAD else
            TensorSpec(text_prefix + t.name.removeprefix("model."), t.shape, t.component, t.split)
            for t in tensors
        ]

    head = [t for t in moved(text.head) if t.component is not Component.LM_HEAD]
    return model_spec(
        cfg,
        hidden_size=text.hidden_size,
        vocab_size=text.vocab_size,
        layers=list(text.layers),
        embedding=[*towers, *moved(text.embedding)],
        head=[*head, *([] if tied else lm_head(text.vocab_size, text.hidden_size))],
        tie_word_embeddings=tied,
        max_position_embeddings=text.max_position_embeddings,
        notes=(*text.notes, *notes),
        final_logit_softcapping=text.final_logit_softcapping,
        sdpa_supported=text.sdpa_supported,
    )


__all__ = [
    "ATTN",
    "MLP",
    "NORM",
    "OTHER",
    "AttentionSpec",
    "conv1d",
    "expert_stack",
    "gated_mlp",
    "gqa_projections",
    "head_dim_of",
    "intern",
    "layer_windows",
    "linear",
    "lm_head",
    "model_spec",
    "norm",
    "num_labels_of",
    "plain_mlp",
    "quantization_of",
    "router",
    "token_embedding",
    "torch_dtype_of",
    "with_towers",
]
