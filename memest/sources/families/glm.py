"""Zhipu GLM-4 decoders: glm4 (GLM-4-0414), glm4_moe (GLM-4.5, GLM-4.6, GLM-4.7) and the
vision-language glm4v_moe (GLM-4.5V).

Follows transformers:

- ``models/glm4/modeling_glm4.py``: four RMSNorms per layer (``input_layernorm``,
  ``post_self_attn_layernorm`` on the attention output, ``post_attention_layernorm``,
  ``post_mlp_layernorm`` on the MLP output); Q/K/V biased per ``attention_bias`` (default true),
  ``o_proj`` never; ``head_dim`` (default 128); partial rotary; the MLP's gate and up projections
  fused in one ``mlp.gate_up_proj (2i, h)``, then ``mlp.down_proj``; untied lm_head.
- ``models/glm4_moe/modeling_glm4_moe.py``: llama-like pre-norm layers (two RMSNorms); Q/K/V
  biased per ``attention_bias`` (default false), ``o_proj`` never, RMSNorm ``q_norm``/``k_norm``
  over head_dim with ``use_qk_norm``; the first ``first_k_dense_replace`` layers have a SwiGLU MLP
  ``intermediate_size`` wide, the others DeepSeek-V3's MoE block (router ``mlp.gate (E, h)``,
  fused routed experts ``moe_intermediate_size`` wide, ``n_shared_experts`` shared experts fused in
  ``mlp.shared_experts``). The router's ``e_score_correction_bias`` is a buffer, and the
  multi-token-prediction layers a checkpoint stores (``num_nextn_predict_layers``) are not
  instantiated; neither is counted, and the notes say so.
- ``models/glm4v_moe/modeling_glm4v_moe.py`` ``Glm4vMoeForConditionalGeneration``: the glm4_moe text
  model (without q/k norms, ``Glm4vMoeTextConfig`` defaults) under ``model.language_model``; the lm_head
  tied per the top-level ``tie_word_embeddings`` or the text_config's (default false); the vision tower
  ``model.visual`` (:attr:`Component.OTHER`): learned ``embeddings.position_embedding ((S/p)^2, vh)``, a
  biased Conv3d ``patch_embed.proj (vh, C, t, p, p)``, ``depth`` blocks of two RMSNorms, ``attn.qkv
  (3vh, vh)`` biased per the vision ``attention_bias``, an unbiased ``attn.proj`` and an unbiased SwiGLU
  MLP ``out_hidden_size`` wide; RMSNorms ``post_conv_layernorm`` / ``post_layernorm``; a biased Conv2d
  ``downsample (out, vh, m, m)``; the merger: unbiased ``proj (out, out)``, LayerNorm
  ``post_projection_norm (out)`` and an unbiased SwiGLU ``intermediate_size`` wide.
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import (
    MLP,
    OTHER,
    decoder_spec,
    expert_stack,
    gated_mlp,
    gqa_projections,
    head_dim_of,
    intern,
    linear,
    norm,
    router,
    with_towers,
)
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec, Split, TensorSpec

# Glm4Config / Glm4MoeConfig defaults (models/glm4*/configuration_glm4*.py) of the fields read here
_DEFAULTS: dict[str, dict[str, object]] = {
    "glm4": {
        "vocab_size": 151552,
        "intermediate_size": 13696,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "attention_bias": True,
    },
    "glm4_moe": {
        "vocab_size": 151552,
        "intermediate_size": 10944,
        "num_key_value_heads": 8,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "moe_intermediate_size": 1408,
        "num_experts_per_tok": 8,
        "n_shared_experts": 1,
        "n_routed_experts": 128,
        "first_k_dense_replace": 1,
        "use_qk_norm": False,
        "num_nextn_predict_layers": 1,
    },
}
# Glm4vMoeTextConfig / Glm4vMoeVisionConfig defaults (models/glm4v_moe/configuration_glm4v_moe.py)
_GLM4V_TEXT_DEFAULTS: dict[str, object] = {
    "vocab_size": 151424,
    "intermediate_size": 10944,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "max_position_embeddings": 65536,
    "attention_bias": True,
    "moe_intermediate_size": 1408,
    "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "n_routed_experts": 128,
    "first_k_dense_replace": 1,
    "num_nextn_predict_layers": 0,  # the class has no such field: a note only when the config states it
}
_GLM4V_VISION_DEFAULTS: dict[str, object] = {
    "depth": 24,
    "hidden_size": 1536,
    "attention_bias": False,
    "in_channels": 3,
    "image_size": 336,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 4096,
    "intermediate_size": 13696,
}
_ALIASES: dict[str, dict[str, str]] = {
    "glm4": {},
    "glm4_moe": {"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers"},
}


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a glm4 / glm4_moe / glm4v_moe config."""
    if cfg.model_type == "glm4v_moe":
        return _build_glm4v_moe(cfg)
    model_type = cfg.model_type
    cfg = cfg.with_defaults(_DEFAULTS[model_type], aliases=_ALIASES[model_type])
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    k = cfg.int("num_key_value_heads", default=a)
    d = head_dim_of(cfg, h, a)
    i = cfg.int("intermediate_size")
    vocab = cfg.int("vocab_size")
    num_layers = cfg.int("num_hidden_layers")
    activation = cfg.str("hidden_act")
    qk_norm = model_type == "glm4_moe" and cfg.bool("use_qk_norm")
    attention = AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d, rope="concat",
                              qk_norm="head" if qk_norm else "none")
    attention_tensors = (
        *gqa_projections(h, a, k, d, qkv_bias=cfg.bool("attention_bias")),
        *(norm("self_attn.q_norm", d) + norm("self_attn.k_norm", d) if qk_norm else []),
    )
    dense_mlp = MLPSpec(gated=True, intermediate_size=i, activation=activation)
    notes: list[str] = []

    if model_type == "glm4":
        layer = LayerSpec(
            attention=attention,
            mlp=dense_mlp,
            norm_position="sandwich",
            tensors=(
                *norm("input_layernorm", h),
                *attention_tensors,
                *norm("post_self_attn_layernorm", h),
                *norm("post_attention_layernorm", h),
                *linear("mlp.gate_up_proj", h, 2 * i, MLP, Split.COL),
                *linear("mlp.down_proj", i, h, MLP, Split.ROW),
                *norm("post_mlp_layernorm", h),
            ),
        )
        layers = [layer] * num_layers
    else:
        num_experts = cfg.int("n_routed_experts")
        moe_i = cfg.int("moe_intermediate_size")
        shared = cfg.int("n_shared_experts", minimum=0)
        first_moe = cfg.int("first_k_dense_replace", minimum=0)
        norms = (*norm("input_layernorm", h), *norm("post_attention_layernorm", h))
        moe_mlp = MLPSpec(
            gated=True,
            intermediate_size=moe_i,
            activation=activation,
            num_experts=num_experts,
            num_experts_per_tok=cfg.int("num_experts_per_tok"),
            num_shared_experts=shared,
            shared_intermediate_size=moe_i * shared,
        )
        kinds: dict[object, LayerSpec] = {}

        def dense() -> LayerSpec:
            return LayerSpec(attention=attention, mlp=dense_mlp,
                             tensors=(*attention_tensors, *gated_mlp(h, i), *norms))

        def moe() -> LayerSpec:
            tensors = (
                *attention_tensors,
                *expert_stack(h, moe_i, num_experts),
                *router("mlp.gate", h, num_experts),
                *gated_mlp(h, moe_i * shared, prefix="mlp.shared_experts"),
                *norms,
            )
            return LayerSpec(attention=attention, mlp=moe_mlp, tensors=tensors)

        layers = [intern(kinds, "dense", dense) if n < first_moe else intern(kinds, "moe", moe)
                  for n in range(num_layers)]
        mtp = cfg.int("num_nextn_predict_layers", minimum=0)
        if mtp:
            notes.append(
                f"the checkpoint also stores {mtp} multi-token-prediction layer(s) (num_nextn_predict_layers) that "
                "transformers does not instantiate; they are not counted"
            )

    return decoder_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=layers,
        max_position_embeddings=cfg.int("max_position_embeddings"),
        notes=tuple(notes),
    )


def _build_glm4v_moe(cfg: HFConfig) -> ModelSpec:
    """Glm4vMoeForConditionalGeneration: the glm4_moe text model plus the vision tower (module docstring)."""
    text_raw = dict(cfg.sub("text_config").raw)
    text_raw.update(model_type="glm4_moe", use_qk_norm=False)
    text = build(HFConfig(text_raw, name=cfg.name, source=cfg.source).with_defaults(_GLM4V_TEXT_DEFAULTS))
    raw_vision = cfg.raw.get("vision_config")
    v = HFConfig(raw_vision if isinstance(raw_vision, dict) else {}, name=cfg.name, source=cfg.source)
    v = v.with_defaults(_GLM4V_VISION_DEFAULTS)
    vh, out, ctx = v.int("hidden_size"), v.int("out_hidden_size"), v.int("intermediate_size")
    patch, merge = v.int("patch_size"), v.int("spatial_merge_size")
    p = "model.visual."
    towers = [
        TensorSpec(f"{p}embeddings.position_embedding.weight", ((v.int("image_size") // patch) ** 2, vh), OTHER),
        TensorSpec(f"{p}patch_embed.proj.weight", (vh, v.int("in_channels"), v.int("temporal_patch_size"), patch, patch),
                   OTHER),
        TensorSpec(f"{p}patch_embed.proj.bias", (vh,), OTHER),
    ]
    for n in range(v.int("depth")):
        q = f"{p}blocks.{n}."
        towers += [
            *norm(f"{q}norm1", vh, component=OTHER),
            *norm(f"{q}norm2", vh, component=OTHER),
            *linear(f"{q}attn.qkv", vh, 3 * vh, OTHER, Split.COL, bias=v.bool("attention_bias")),
            *linear(f"{q}attn.proj", vh, vh, OTHER, Split.ROW),
            *gated_mlp(vh, out, prefix=f"{q}mlp", component=OTHER),
        ]
    towers += [
        *norm(f"{p}post_conv_layernorm", vh, component=OTHER),
        TensorSpec(f"{p}downsample.weight", (out, vh, merge, merge), OTHER),
        TensorSpec(f"{p}downsample.bias", (out,), OTHER),
        *norm(f"{p}post_layernorm", vh, component=OTHER),
        *linear(f"{p}merger.proj", out, out, OTHER, Split.NONE),
        *norm(f"{p}merger.post_projection_norm", out, bias=True, component=OTHER),
        *gated_mlp(out, ctx, prefix=f"{p}merger", component=OTHER),
    ]
    tied = bool(cfg.get("tie_word_embeddings", default=False)) or bool(text_raw.get("tie_word_embeddings", False))
    return with_towers(cfg, text, towers=towers, tied=tied,
                       notes=("the vision tower and its merger are counted in 'embedding' (component other)",))
