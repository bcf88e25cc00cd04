"""Liquid LFM2-VL: lfm2_vl (an LFM2 language model, a SigLIP2 NaFlex vision tower and a projector).

Follows transformers ``models/lfm2_vl/modeling_lfm2_vl.py`` (5.24) ``Lfm2VlForConditionalGeneration``:

- ``model.language_model``: the LFM2 model of ``text_config`` (counted by :mod:`lfm2`: short-convolution
  and attention layers), ``lm_head`` at the top level, tied to the embedding per the top-level
  ``tie_word_embeddings`` (``Lfm2VlConfig``: default true, ``tie_embedding`` read as it);
- ``model.vision_tower``: ``Siglip2VisionModel`` (``models/siglip2/modeling_siglip2.py``), see
  :func:`siglip2_vision_tensors`;
- ``model.multi_modal_projector`` (``Lfm2VlMultiModalProjector``): the pixel-unshuffled features
  (vh x f^2 wide, f = ``downsample_factor``) through an optional LayerNorm
  (``projector_use_layernorm``), ``linear_1 (p, vh f^2)`` and ``linear_2 (h, p)``, p =
  ``projector_hidden_size``, biased per ``projector_bias``.

Tower and projector tensors are :attr:`Component.OTHER`, in ``embedding`` (they run before the first
text layer). The text layers, and so the KV cache and the conv state per sequence, are LFM2's.
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families import lfm2
from memest.sources.families._build import OTHER, linear, norm, with_towers
from memest.sources.families.gemma import siglip_encoder_tensors
from memest.spec import ModelSpec, Split, TensorSpec

# Lfm2VlConfig defaults (models/lfm2_vl/configuration_lfm2_vl.py) of the fields read here
_DEFAULTS: dict[str, object] = {
    "projector_hidden_size": 2560,
    "projector_bias": True,
    "projector_use_layernorm": True,
    "downsample_factor": 2,
    "tie_word_embeddings": True,
}
_ALIASES = {"tie_embedding": "tie_word_embeddings"}
# Siglip2VisionConfig defaults (models/siglip2/configuration_siglip2.py)
SIGLIP2_DEFAULTS: dict[str, object] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_channels": 3,
    "patch_size": 16,
    "vision_use_head": True,
    "num_patches": 256,
}


def siglip2_vision_tensors(vision: HFConfig, *, prefix: str) -> list[TensorSpec]:
    """Every parameter of a ``Siglip2VisionModel`` (transformers ``models/siglip2/modeling_siglip2.py``).

    ``Siglip2VisionEmbeddings``: a Linear patch embedding ``(vh, C p^2)`` with bias (NaFlex patches
    come flattened) and a learned position table ``(num_patches, vh)``; ``num_hidden_layers``
    pre-norm layers (LayerNorms, biased Q/K/V/out vh x vh, fc1/fc2 MLP); ``post_layernorm``; with
    ``vision_use_head`` the attention-pooling head (``probe``, ``nn.MultiheadAttention``'s packed
    in-projection, its out_proj, a LayerNorm and an MLP). All :attr:`Component.OTHER`.
    """
    vision = vision.with_defaults(SIGLIP2_DEFAULTS)
    vh = vision.int("hidden_size")
    patch = vision.int("patch_size")
    tensors = [
        *linear(f"{prefix}embeddings.patch_embedding", vision.int("num_channels") * patch * patch, vh, OTHER,
                Split.NONE, bias=True),
        TensorSpec(f"{prefix}embeddings.position_embedding.weight", (vision.int("num_patches"), vh), OTHER),
    ]
    return tensors + siglip_encoder_tensors(vision, prefix=prefix)


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of an lfm2_vl config."""
    cfg = cfg.with_defaults(_DEFAULTS, aliases=_ALIASES)
    text_raw = cfg.raw.get("text_config") or {}
    text = lfm2.build(HFConfig({**text_raw, "model_type": "lfm2"}, name=cfg.name, source=cfg.source))
    vision = cfg.sub("vision_config", required=False)
    vh = vision.with_defaults(SIGLIP2_DEFAULTS).int("hidden_size")
    f = cfg.int("downsample_factor")
    width, hidden, bias = vh * f * f, cfg.int("projector_hidden_size"), cfg.bool("projector_bias")
    p = "model.multi_modal_projector."
    projector = [
        *(norm(f"{p}layer_norm", width, bias=True, component=OTHER) if cfg.bool("projector_use_layernorm") else []),
        *linear(f"{p}linear_1", width, hidden, OTHER, Split.NONE, bias=bias),
        *linear(f"{p}linear_2", hidden, text.hidden_size, OTHER, Split.NONE, bias=bias),
    ]
    return with_towers(
        cfg,
        text,
        towers=[*siglip2_vision_tensors(vision, prefix="model.vision_tower."), *projector],
        tied=cfg.bool("tie_word_embeddings"),
        notes=("the SigLIP2 vision tower and multimodal projector are counted in 'embedding' (component other)",),
    )


__all__ = ["build", "siglip2_vision_tensors"]
