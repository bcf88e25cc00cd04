"""Qwen vision-language checkpoints: qwen2_5_vl (Qwen2.5-VL), qwen3_vl and qwen3_vl_moe (Qwen3-VL).

The language model under ``model.language_model`` is counted by the text family's adapter: Qwen2
(:mod:`llama`) for Qwen2.5-VL, Qwen3 (:mod:`llama`) or Qwen3-MoE (:mod:`moe`) for Qwen3-VL, with
the VL text config class's defaults (``Qwen2_5_VLTextConfig``, ``Qwen3VLTextConfig``,
``Qwen3VLMoeTextConfig``). Qwen2.5-VL Hub configs are flat (the text fields at the top level, as
``Qwen2_5_VLConfig.__post_init__`` reads them); Qwen3-VL's have a ``text_config``. Qwen3-VL's
text layers never slide (``Qwen3VLMoeTextConfig`` sets ``sliding_window = None``).

The vision tower ``model.visual`` and its mergers are :attr:`Component.OTHER` tensors:

- ``models/qwen2_5_vl/modeling_qwen2_5_vl.py`` ``Qwen2_5_VisionTransformerPretrainedModel``: a
  bias-free Conv3d patch embedding ``(vh, C, t, p, p)``; ``depth`` blocks of two RMSNorms, a biased
  fused ``attn.qkv (3vh, vh)`` and ``attn.proj``, and a biased SwiGLU MLP ``intermediate_size`` wide;
  the merger: RMSNorm ``ln_q (vh)``, ``mlp.0 (vh m^2, vh m^2)`` and ``mlp.2 (out, vh m^2)``, biased.
- ``models/qwen3_vl/modeling_qwen3_vl.py`` ``Qwen3VLVisionModel`` (the same in qwen3_vl_moe): a
  biased Conv3d patch embedding; a learned ``pos_embed (num_position_embeddings, vh)``; ``depth``
  blocks of two LayerNorms, the biased ``attn.qkv`` / ``attn.proj`` and a biased two-layer MLP
  ``linear_fc1`` / ``linear_fc2``; the merger (LayerNorm over vh, ``linear_fc1 (vh m^2, vh m^2)``,
  ``linear_fc2 (out, vh m^2)``) and one more merger per ``deepstack_visual_indexes`` entry whose
  LayerNorm is over vh m^2.

The lm_head is tied per the top-level ``tie_word_embeddings`` (default false); for Qwen2.5-VL also
when the ``text_config`` says true (``Qwen2_5_VLConfig.__post_init__``, for pre-v5 saves).
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families import llama, moe
from memest.sources.families._build import OTHER, linear, norm, with_towers
from memest.spec import ModelSpec, Split, TensorSpec

# the VL text config classes' defaults (configuration_<type>.py) of the fields the text adapter reads
_TEXT_DEFAULTS: dict[str, dict[str, object]] = {
    "qwen2_5_vl": {
        "vocab_size": 152064,
        "intermediate_size": 29568,
        "num_key_value_heads": 8,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 80,
    },
    "qwen3_vl": {
        "vocab_size": 151936,
        "intermediate_size": 22016,
        "num_key_value_heads": 32,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 128000,
        "attention_bias": False,
    },
    "qwen3_vl_moe": {
        "vocab_size": 151936,
        "intermediate_size": 5632,
        "num_key_value_heads": 16,
        "hidden_act": "silu",
        "max_position_embeddings": 128000,
        "attention_bias": False,
        "decoder_sparse_step": 1,
        "moe_intermediate_size": 1408,
        "num_experts_per_tok": 4,
        "num_experts": 60,
        "mlp_only_layers": None,
    },
}
_TEXT_TYPE = {"qwen2_5_vl": "qwen2", "qwen3_vl": "qwen3", "qwen3_vl_moe": "qwen3_moe"}
# Qwen2_5_VLVisionConfig / Qwen3VLVisionConfig defaults of the fields read here
_VISION_DEFAULTS: dict[str, dict[str, object]] = {
    "qwen2_5_vl": {
        "depth": 32,
        "hidden_size": 3584,
        "intermediate_size": 3420,
        "in_channels": 3,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 3584,
    },
    "qwen3_vl": {
        "depth": 27,
        "hidden_size": 1152,
        "intermediate_size": 4304,
        "in_channels": 3,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 3584,
        "num_position_embeddings": 2304,
        "deepstack_visual_indexes": [8, 16, 24],
    },
}
_VISION_DEFAULTS["qwen3_vl_moe"] = _VISION_DEFAULTS["qwen3_vl"]


def _text_config(cfg: HFConfig) -> HFConfig:
    """The language model's config, with the VL text class's defaults and the text family's type."""
    model_type = cfg.model_type
    sub = cfg.raw.get("text_config")
    if isinstance(sub, dict):
        raw = dict(sub)
    else:  # a flat Qwen2.5-VL config: every field but the vision tower's is the text model's
        raw = {k: v for k, v in cfg.raw.items() if k not in ("vision_config", "quantization_config")}
    if model_type != "qwen2_5_vl":
        raw["use_sliding_window"] = False
    raw["model_type"] = _TEXT_TYPE[model_type]
    return HFConfig(raw, name=cfg.name, source=cfg.source).with_defaults(_TEXT_DEFAULTS[model_type])


def _blocks(v: HFConfig, prefix: str, *, qwen3: bool) -> list[TensorSpec]:
    """The vision blocks (see the module docstring)."""
    vh, vi = v.int("hidden_size"), v.int("intermediate_size")
    tensors: list[TensorSpec] = []
    for n in range(v.int("depth")):
        p = f"{prefix}blocks.{n}."
        mlp = (
            [*linear(f"{p}mlp.linear_fc1", vh, vi, OTHER, Split.COL, bias=True),
             *linear(f"{p}mlp.linear_fc2", vi, vh, OTHER, Split.ROW, bias=True)]
            if qwen3 else
            [*linear(f"{p}mlp.gate_proj", vh, vi, OTHER, Split.COL, bias=True),
             *linear(f"{p}mlp.up_proj", vh, vi, OTHER, Split.COL, bias=True),
             *linear(f"{p}mlp.down_proj", vi, vh, OTHER, Split.ROW, bias=True)]
        )
        tensors += [
            *norm(f"{p}norm1", vh, bias=qwen3, component=OTHER),
            *norm(f"{p}norm2", vh, bias=qwen3, component=OTHER),
            *linear(f"{p}attn.qkv", vh, 3 * vh, OTHER, Split.COL, bias=True),
            *linear(f"{p}attn.proj", vh, vh, OTHER, Split.ROW, bias=True),
            *mlp,
        ]
    return tensors


def vision_tensors(cfg: HFConfig, *, prefix: str = "model.visual.") -> list[TensorSpec]:
    """Every parameter of the vision tower and its mergers."""
    raw = cfg.raw.get("vision_config")
    v = HFConfig(raw if isinstance(raw, dict) else {}, name=cfg.name, source=cfg.source)
    v = v.with_defaults(_VISION_DEFAULTS[cfg.model_type])
    qwen3 = cfg.model_type != "qwen2_5_vl"
    vh, out = v.int("hidden_size"), v.int("out_hidden_size")
    merged = vh * v.int("spatial_merge_size") ** 2
    patch, t, c = v.int("patch_size"), v.int("temporal_patch_size"), v.int("in_channels")
    tensors = [TensorSpec(f"{prefix}patch_embed.proj.weight", (vh, c, t, patch, patch), OTHER)]
    if not qwen3:
        return [
            *tensors,
            *_blocks(v, prefix, qwen3=False),
            *norm(f"{prefix}merger.ln_q", vh, component=OTHER),
            *linear(f"{prefix}merger.mlp.0", merged, merged, OTHER, Split.NONE, bias=True),
            *linear(f"{prefix}merger.mlp.2", merged, out, OTHER, Split.NONE, bias=True),
        ]

    def merger(p: str, norm_size: int) -> list[TensorSpec]:
        return [
            *norm(f"{p}norm", norm_size, bias=True, component=OTHER),
            *linear(f"{p}linear_fc1", merged, merged, OTHER, Split.NONE, bias=True),
            *linear(f"{p}linear_fc2", merged, out, OTHER, Split.NONE, bias=True),
        ]

    deepstack = v.get("deepstack_visual_indexes")
    return [
        *tensors,
        TensorSpec(f"{prefix}patch_embed.proj.bias", (vh,), OTHER),
        TensorSpec(f"{prefix}pos_embed.weight", (v.int("num_position_embeddings"), vh), OTHER),
        *_blocks(v, prefix, qwen3=True),
        *merger(f"{prefix}merger.", vh),
        *(t for n in range(len(deepstack)) for t in merger(f"{prefix}deepstack_merger_list.{n}.", merged)),
    ]


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a qwen2_5_vl / qwen3_vl / qwen3_vl_moe config."""
    text_cfg = _text_config(cfg)
    text = (moe if cfg.model_type == "qwen3_vl_moe" else llama).build(text_cfg)
    tied = bool(cfg.get("tie_word_embeddings", default=False))
    if cfg.model_type == "qwen2_5_vl" and isinstance(cfg.raw.get("text_config"), dict):
        tied = tied or bool(cfg.raw["text_config"].get("tie_word_embeddings", False))
    return with_towers(
        cfg,
        text,
        towers=vision_tensors(cfg),
        tied=tied,
        notes=("the vision tower and its mergers are counted in 'embedding' (component other)",),
    )
