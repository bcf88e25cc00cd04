"""Zhipu GLM-4 decoders: glm4 (GLM-4-0414), glm4_moe (GLM-4.5, GLM-4.6, GLM-4.7).

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
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import (
    MLP,
    expert_stack,
    gated_mlp,
    gqa_projections,
    head_dim_of,
    intern,
    linear,
    lm_head,
    model_spec,
    norm,
    router,
    token_embedding,
)
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec, Split

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
_ALIASES: dict[str, dict[str, str]] = {
    "glm4": {},
    "glm4_moe": {"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers"},
}


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a glm4 / glm4_moe config."""
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

    tied = cfg.bool("tie_word_embeddings")
    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=layers,
        embedding=[token_embedding("model.embed_tokens.weight", vocab, h)],
        head=[*norm("model.norm", h), *([] if tied else lm_head(vocab, h))],
        tie_word_embeddings=tied,
        max_position_embeddings=cfg.int("max_position_embeddings"),
        notes=tuple(notes),
    )
