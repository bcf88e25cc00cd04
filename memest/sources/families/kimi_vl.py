"""Moonshot AI Kimi K2.5 / K2.6 multimodal checkpoints: kimi_k25.

Follows transformers ``models/kimi_k25/modeling_kimi_k25.py`` ``Kimi_K25ForConditionalGeneration``:
the text model of ``text_config`` (``kimi_k2``, i.e. DeepSeek-V3's architecture, counted by
:mod:`deepseek`) under ``model.language_model``; the lm_head tied per the top-level
``tie_word_embeddings`` (``Kimi_K25Config`` default: true); the MoonViT vision tower
``model.vision_tower`` (``Kimi_K25VisionModel``: a biased Conv2d ``patch_embed.proj (vh, 3, p, p)``, a
learned ``patch_embed.pos_emb.position_embeddings (H, W, vh)``, ``num_hidden_layers`` pre-norm layers of
LayerNorms, biased ``attn.q_proj`` / ``k_proj`` / ``v_proj`` / ``proj`` (vh x vh) and a biased
``mlp.fc1`` / ``fc2``, then ``final_layernorm``) and ``model.mm_projector`` (LayerNorm ``pre_norm`` over
``projection_hidden_size``, biased ``in_proj (vh m^2, vh m^2)`` and ``out_proj (h, vh m^2)``), all
:attr:`Component.OTHER`. ``Kimi_K25VisionConfig`` reads ``hidden_size`` / ``num_hidden_layers`` /
``pos_emb_height`` ...; the Hub configs' ``vt_*`` / ``init_pos_emb_*`` keys are not its fields, so the
tower is the class default (the same sizes as Kimi-K2.5's), as transformers builds it.
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families import deepseek
from memest.sources.families._build import OTHER, linear, norm, with_towers
from memest.spec import ModelSpec, Split, TensorSpec

_DEFAULTS: dict[str, object] = {"projection_hidden_size": 1152, "tie_word_embeddings": True}
# Kimi_K25VisionConfig defaults (models/kimi_k25/configuration_kimi_k25.py)
_VISION_DEFAULTS: dict[str, object] = {
    "patch_size": 14,
    "pos_emb_height": 64,
    "pos_emb_width": 64,
    "num_hidden_layers": 27,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "merge_kernel_size": [2, 2],
}


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a kimi_k25 config."""
    cfg = cfg.with_defaults(_DEFAULTS)
    text_raw = dict(cfg.sub("text_config").raw)
    if text_raw.get("model_type", "kimi_k2") not in ("kimi_k2", "deepseek_v3"):
        text_raw["model_type"] = "deepseek_v3"
    text_raw.setdefault("model_type", "deepseek_v3")
    text = deepseek.build(HFConfig(text_raw, name=cfg.name, source=cfg.source))
    raw_vision = cfg.raw.get("vision_config")
    known = {k: v for k, v in (raw_vision or {}).items() if k in _VISION_DEFAULTS}  # the class's own fields
    v = HFConfig(known, name=cfg.name, source=cfg.source).with_defaults(_VISION_DEFAULTS)
    vh, vi, patch = v.int("hidden_size"), v.int("intermediate_size"), v.int("patch_size")
    kernel = v.get("merge_kernel_size")
    merged = vh * int(kernel[0]) * int(kernel[1])
    p = "model.vision_tower."
    towers = [
        TensorSpec(f"{p}patch_embed.proj.weight", (vh, 3, patch, patch), OTHER),
        TensorSpec(f"{p}patch_embed.proj.bias", (vh,), OTHER),
        TensorSpec(f"{p}patch_embed.pos_emb.position_embeddings", (v.int("pos_emb_height"), v.int("pos_emb_width"), vh),
                   OTHER),
    ]
    for n in range(v.int("num_hidden_layers")):
        q = f"{p}layers.{n}."
        towers += [
            *norm(f"{q}norm1", vh, bias=True, component=OTHER),
            *norm(f"{q}norm2", vh, bias=True, component=OTHER),
            *(t for name in ("q_proj", "k_proj", "v_proj") for t in linear(f"{q}attn.{name}", vh, vh, OTHER, Split.COL, bias=True)),
            *linear(f"{q}attn.proj", vh, vh, OTHER, Split.ROW, bias=True),
            *linear(f"{q}mlp.fc1", vh, vi, OTHER, Split.COL, bias=True),
            *linear(f"{q}mlp.fc2", vi, vh, OTHER, Split.ROW, bias=True),
        ]
    towers += norm(f"{p}final_layernorm", vh, bias=True, component=OTHER)
    m = "model.mm_projector."
    towers += [
        *norm(f"{m}pre_norm", cfg.int("projection_hidden_size"), bias=True, component=OTHER),
        *linear(f"{m}in_proj", merged, merged, OTHER, Split.NONE, bias=True),
        *linear(f"{m}out_proj", merged, text.hidden_size, OTHER, Split.NONE, bias=True),
    ]
    return with_towers(cfg, text, towers=towers, tied=cfg.bool("tie_word_embeddings"),
                       notes=("the MoonViT vision tower and projector are counted in 'embedding' (component other)",))
