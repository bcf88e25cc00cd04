"""Mistral 3 multimodal checkpoints: mistral3 (Mistral Small 3.1 / 3.2, Ministral 3, Magistral).

Follows transformers ``models/mistral3/modeling_mistral3.py`` ``Mistral3ForConditionalGeneration``:
the language model of ``text_config`` (mistral or ministral3, counted by :mod:`llama`) under
``model.language_model``; the lm_head, tied to the embedding per the top-level
``tie_word_embeddings`` (default true); a Pixtral vision tower (``models/pixtral/modeling_pixtral.py``
``PixtralVisionModel``: a bias-free ``patch_conv`` Conv2d(C, vh, p, p), RMSNorm ``ln_pre``, then
``num_hidden_layers`` pre-norm layers of bias-free vh x vh attention projections and a SwiGLU
``feed_forward``; rotary positions, no parameter) and ``Mistral3MultiModalProjector`` (RMSNorm over
vh, a bias-free ``patch_merger.merging_layer (vh, vh * m^2)``, then ``linear_1 (h, vh * n)`` and
``linear_2 (h, h)``, biased per ``multimodal_projector_bias``; n = the number of
``vision_feature_layer`` entries). Tower and projector tensors are :attr:`Component.OTHER`.
"""

from __future__ import annotations

from memest.errors import ConfigError
from memest.sources.config import HFConfig
from memest.sources.families import llama
from memest.sources.families._build import OTHER, linear, norm, with_towers
from memest.spec import ModelSpec, Split, TensorSpec

_DEFAULTS: dict[str, object] = {
    "vision_feature_layer": -1,
    "multimodal_projector_bias": False,
    "spatial_merge_size": 2,
    "tie_word_embeddings": True,
}
# Mistral3Config.sub_configs_defaults: the vision tower of a config without vision_config
_VISION_INIT: dict[str, object] = {
    "intermediate_size": 4096,
    "hidden_size": 1024,
    "patch_size": 14,
    "image_size": 1540,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
}
# PixtralVisionConfig defaults (models/pixtral/configuration_pixtral.py) of the fields read here
_PIXTRAL_DEFAULTS: dict[str, object] = {
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 24,
    "num_channels": 3,
    "patch_size": 16,
}
_TEXT_TYPES = {"mistral", "ministral3"}


def pixtral_vision_tensors(vision: HFConfig, *, prefix: str) -> list[TensorSpec]:
    """Every parameter of a ``PixtralVisionModel`` (see the module docstring)."""
    vh = vision.int("hidden_size")
    vi = vision.int("intermediate_size")
    patch = vision.int("patch_size")
    tensors = [
        TensorSpec(f"{prefix}patch_conv.weight", (vh, vision.int("num_channels"), patch, patch), OTHER),
        *norm(f"{prefix}ln_pre", vh, component=OTHER),
    ]
    for n in range(vision.int("num_hidden_layers")):
        p = f"{prefix}transformer.layers.{n}."
        tensors += [
            *norm(f"{p}attention_norm", vh, component=OTHER),
            *(t for name in ("q_proj", "k_proj", "v_proj") for t in linear(f"{p}attention.{name}", vh, vh, OTHER, Split.COL)),
            *linear(f"{p}attention.o_proj", vh, vh, OTHER, Split.ROW),
            *norm(f"{p}ffn_norm", vh, component=OTHER),
            *linear(f"{p}feed_forward.gate_proj", vh, vi, OTHER, Split.COL),
            *linear(f"{p}feed_forward.up_proj", vh, vi, OTHER, Split.COL),
            *linear(f"{p}feed_forward.down_proj", vi, vh, OTHER, Split.ROW),
        ]
    return tensors


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a mistral3 config."""
    cfg = cfg.with_defaults(_DEFAULTS)
    text_cfg = cfg.sub("text_config")
    text_type = text_cfg.raw.get("model_type", "mistral")
    if text_type not in _TEXT_TYPES:
        raise ConfigError(f"{cfg.what}: text_config.model_type is {text_type!r}; "
                          f"a mistral3 checkpoint's language model is one of {sorted(_TEXT_TYPES)}")
    text = llama.build(HFConfig({**text_cfg.raw, "model_type": text_type}, name=cfg.name, source=cfg.source))
    raw_vision = cfg.raw.get("vision_config")
    vision = HFConfig(raw_vision if raw_vision is not None else _VISION_INIT, name=cfg.name, source=cfg.source)
    vision = vision.with_defaults(_PIXTRAL_DEFAULTS)
    vh, h = vision.int("hidden_size"), text.hidden_size
    merge = cfg.int("spatial_merge_size")
    layers = cfg.get("vision_feature_layer")
    feature_layers = len(layers) if isinstance(layers, list) else 1
    bias = cfg.bool("multimodal_projector_bias")
    p = "model.multi_modal_projector."
    projector = [
        *norm(f"{p}norm", vh, component=OTHER),
        *linear(f"{p}patch_merger.merging_layer", vh * merge * merge, vh, OTHER, Split.NONE),
        *linear(f"{p}linear_1", vh * feature_layers, h, OTHER, Split.NONE, bias=bias),
        *linear(f"{p}linear_2", h, h, OTHER, Split.NONE, bias=bias),
    ]
    return with_towers(
        cfg,
        text,
        towers=[*pixtral_vision_tensors(vision, prefix="model.vision_tower."), *projector],
        tied=cfg.bool("tie_word_embeddings"),
        notes=("the Pixtral vision tower and multimodal projector are counted in 'embedding' (component other)",),
    )
