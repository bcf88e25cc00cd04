"""Gemma decoders: gemma, gemma2, gemma3 (multimodal) and gemma3_text.

Llama-like layers with a config-given ``head_dim`` (256 by default, not h/a), GeGLU MLP and the
lm_head tied to the embedding by default. Follows transformers:

- ``models/gemma/modeling_gemma.py``: input and post-attention RMSNorms; full attention.
- ``models/gemma2/modeling_gemma2.py``: four RMSNorms per layer (``pre_feedforward_layernorm`` and
  ``post_feedforward_layernorm`` added); ``layer_types`` alternate sliding / full attention,
  layer 0 sliding (``Gemma2Config.__post_init__``).
- ``models/gemma3/modeling_gemma3.py``: as gemma2 plus RMSNorm ``q_norm``/``k_norm`` over
  head_dim; five sliding layers then one full layer (``sliding_window_pattern`` = 6).
  ``Gemma3ForConditionalGeneration`` adds a SigLIP vision tower (``models/siglip/modeling_siglip.py``
  ``SiglipVisionModel``) and ``Gemma3MultiModalProjector``; their tensors are listed in
  ``embedding`` with :attr:`Component.OTHER` (they run before the first text layer).
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import (
    OTHER,
    gated_mlp,
    gqa_projections,
    intern,
    layer_windows,
    linear,
    lm_head,
    model_spec,
    norm,
    token_embedding,
)
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec, Split, TensorSpec

_TEXT_DEFAULTS: dict[str, object] = {
    "vocab_size": 256000,
    "num_key_value_heads": 16,
    "head_dim": 256,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "use_bidirectional_attention": None,
}
# transformers config-class defaults (configuration_<type>.py) of the fields read here
_DEFAULTS: dict[str, dict[str, object]] = {
    "gemma": {
        **_TEXT_DEFAULTS,
        "intermediate_size": 24576,
        "hidden_act": "gelu_pytorch_tanh",
    },
    "gemma2": {
        **_TEXT_DEFAULTS,
        "intermediate_size": 9216,
        "num_key_value_heads": 4,
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": 4096,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    },
    "gemma3_text": {
        **_TEXT_DEFAULTS,
        "vocab_size": 262208,
        "intermediate_size": 9216,
        "num_key_value_heads": 4,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "use_bidirectional_attention": False,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
    },
}
_GEMMA3_DEFAULTS: dict[str, object] = {"tie_word_embeddings": True}
# SiglipVisionConfig defaults (models/siglip/configuration_siglip.py)
_SIGLIP_DEFAULTS: dict[str, object] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 16,
    "vision_use_head": True,
}


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a gemma / gemma2 / gemma3 / gemma3_text config."""
    model_type = cfg.model_type
    if model_type == "gemma3":
        return _build_gemma3(cfg)
    cfg = cfg.with_defaults(_DEFAULTS[model_type])
    layers, embedding, norm_tensors, vocab, h = _text_model(cfg, model_type, prefix="model.")
    tied = cfg.bool("tie_word_embeddings")
    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=layers,
        embedding=embedding,
        head=[*norm_tensors, *([] if tied else lm_head(vocab, h))],
        tie_word_embeddings=tied,
        max_position_embeddings=cfg.int("max_position_embeddings"),
        final_logit_softcapping=_softcapped(cfg, "final_logit_softcapping"),
        sdpa_supported=model_type != "gemma2",  # Gemma2Attention: logit soft-capping, eager only
    )


def _softcapped(cfg: HFConfig, key: str) -> bool:
    """True when the config sets a soft-capping value under ``key`` (gemma has none)."""
    return cfg.get(key, default=None) is not None


def _text_model(
    cfg: HFConfig, model_type: str, *, prefix: str
) -> tuple[list[LayerSpec], list[TensorSpec], list[TensorSpec], int, int]:
    """Layers, token embedding, final norm, vocab and width of a gemma text model."""
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    k = cfg.int("num_key_value_heads", default=a)
    d = cfg.int("head_dim")
    i = cfg.int("intermediate_size")
    vocab = cfg.int("vocab_size")
    num_layers = cfg.int("num_hidden_layers")
    bias = cfg.bool("attention_bias")
    bidirectional = bool(cfg.get("use_bidirectional_attention", default=False))

    if model_type == "gemma":
        windows: list[int | None] = [None] * num_layers
        activation = cfg.str("hidden_act")
    else:
        activation = cfg.str("hidden_activation")
        window = cfg.int("sliding_window", default=None)
        if model_type == "gemma3_text" and bidirectional and window is not None:
            window = window // 2 + 1  # Gemma3TextConfig.__post_init__ (exclusive bounds)
        if cfg.has("layer_types"):
            windows = layer_windows(cfg, num_layers, window)
        else:
            pattern = 2 if model_type == "gemma2" else cfg.int("sliding_window_pattern")
            windows = [window if (n + 1) % pattern else None for n in range(num_layers)]

    four_norms = model_type != "gemma"
    tensors = (
        *norm("input_layernorm", h),
        *gqa_projections(h, a, k, d, qkv_bias=bias, o_bias=bias),
        *(norm("self_attn.q_norm", d) + norm("self_attn.k_norm", d) if model_type == "gemma3_text" else []),
        *norm("post_attention_layernorm", h),
        *(norm("pre_feedforward_layernorm", h) + norm("post_feedforward_layernorm", h) if four_norms else []),
        *gated_mlp(h, i),
    )
    mlp = MLPSpec(gated=True, intermediate_size=i, activation=activation)
    kinds: dict[object, LayerSpec] = {}

    def layer(window: int | None) -> LayerSpec:
        return intern(
            kinds,
            window,
            lambda: LayerSpec(
                attention=AttentionSpec(
                    num_heads=a, num_kv_heads=k, head_dim=d, sliding_window=window, causal=not bidirectional,
                    qk_norm="head" if model_type == "gemma3_text" else "none",
                    logit_softcapping=_softcapped(cfg, "attn_logit_softcapping"),
                ),
                mlp=mlp,
                norm="rms_fp32",
                norm_position="sandwich" if four_norms else "pre",
                tensors=tensors,
            ),
        )

    embedding = [token_embedding(f"{prefix}embed_tokens.weight", vocab, h)]
    return [layer(w) for w in windows], embedding, norm(f"{prefix}norm", h), vocab, h


def _build_gemma3(cfg: HFConfig) -> ModelSpec:
    """Gemma3ForConditionalGeneration: SigLIP tower + projector + gemma3 text model."""
    cfg = cfg.with_defaults(_GEMMA3_DEFAULTS)
    text = cfg.sub("text_config", required=False)
    text = text.with_defaults(_DEFAULTS["gemma3_text"])
    vision = cfg.sub("vision_config", required=False)
    vision = vision.with_defaults(_SIGLIP_DEFAULTS)

    layers, embed, norm_tensors, vocab, h = _text_model(text, "gemma3_text", prefix="model.language_model.")
    vision_tensors = siglip_vision_tensors(vision, prefix="model.vision_tower.")
    vh = vision.int("hidden_size")
    projector = [
        TensorSpec("model.multi_modal_projector.mm_input_projection_weight", (vh, h), OTHER),
        *norm("model.multi_modal_projector.mm_soft_emb_norm", vh, component=OTHER),
    ]
    tied = cfg.bool("tie_word_embeddings")
    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=layers,
        embedding=[*vision_tensors, *projector, *embed],
        head=[*norm_tensors, *([] if tied else lm_head(vocab, h))],
        tie_word_embeddings=tied,
        max_position_embeddings=text.int("max_position_embeddings"),
        final_logit_softcapping=_softcapped(text, "final_logit_softcapping"),
        notes=("the SigLIP vision tower and multimodal projector are counted in 'embedding' (component other)",),
    )


def siglip_vision_tensors(vision: HFConfig, *, prefix: str) -> list[TensorSpec]:
    """Every parameter of a ``SiglipVisionModel`` (transformers ``models/siglip/modeling_siglip.py``).

    Patch embedding ``Conv2d(C, vh, p, p)``, learned position embedding ``((S/p)^2, vh)``,
    ``num_hidden_layers`` pre-norm encoder layers (LayerNorms, biased Q/K/V/out projections,
    fc1/fc2 MLP), the post LayerNorm and, with ``vision_use_head``, the attention-pooling head.
    All are :attr:`Component.OTHER`.
    """
    vh = vision.int("hidden_size")
    channels = vision.int("num_channels")
    patch = vision.int("patch_size")
    image = vision.int("image_size")
    tensors = [
        TensorSpec(f"{prefix}embeddings.patch_embedding.weight", (vh, channels, patch, patch), OTHER),
        TensorSpec(f"{prefix}embeddings.patch_embedding.bias", (vh,), OTHER),
        TensorSpec(f"{prefix}embeddings.position_embedding.weight", ((image // patch) ** 2, vh), OTHER),
    ]
    return tensors + siglip_encoder_tensors(vision, prefix=prefix)


def siglip_encoder_tensors(vision: HFConfig, *, prefix: str) -> list[TensorSpec]:
    """A SigLIP / SigLIP2 vision tower's parameters after its embeddings (``modeling_siglip.py`` and
    ``modeling_siglip2.py`` share them): ``num_hidden_layers`` pre-norm encoder layers (LayerNorms, biased
    Q/K/V/out vh x vh, fc1/fc2 MLP), ``post_layernorm`` and, with ``vision_use_head``, the attention-pooling
    head (``probe``, ``nn.MultiheadAttention``'s packed in-projection, its out_proj, a LayerNorm and an MLP).
    All :attr:`Component.OTHER`.
    """
    vh = vision.int("hidden_size")
    vi = vision.int("intermediate_size")
    tensors: list[TensorSpec] = []
    for n in range(vision.int("num_hidden_layers")):
        p = f"{prefix}encoder.layers.{n}."
        tensors += [
            *norm(f"{p}layer_norm1", vh, bias=True, component=OTHER),
            *linear(f"{p}self_attn.q_proj", vh, vh, OTHER, Split.COL, bias=True),
            *linear(f"{p}self_attn.k_proj", vh, vh, OTHER, Split.COL, bias=True),
            *linear(f"{p}self_attn.v_proj", vh, vh, OTHER, Split.COL, bias=True),
            *linear(f"{p}self_attn.out_proj", vh, vh, OTHER, Split.ROW, bias=True),
            *norm(f"{p}layer_norm2", vh, bias=True, component=OTHER),
            *linear(f"{p}mlp.fc1", vh, vi, OTHER, Split.COL, bias=True),
            *linear(f"{p}mlp.fc2", vi, vh, OTHER, Split.ROW, bias=True),
        ]
    tensors += norm(f"{prefix}post_layernorm", vh, bias=True, component=OTHER)
    if vision.bool("vision_use_head"):
        p = f"{prefix}head."
        tensors += [
            TensorSpec(f"{p}probe", (1, 1, vh), OTHER),
            TensorSpec(f"{p}attention.in_proj_weight", (3 * vh, vh), OTHER),
            TensorSpec(f"{p}attention.in_proj_bias", (3 * vh,), OTHER),
            *linear(f"{p}attention.out_proj", vh, vh, OTHER, Split.NONE, bias=True),
            *norm(f"{p}layernorm", vh, bias=True, component=OTHER),
            *linear(f"{p}mlp.fc1", vh, vi, OTHER, Split.NONE, bias=True),
            *linear(f"{p}mlp.fc2", vi, vh, OTHER, Split.NONE, bias=True),
        ]
    return tensors


__all__ = ["build", "siglip_encoder_tensors", "siglip_vision_tensors"]
