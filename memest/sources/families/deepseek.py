"""DeepSeek decoders with multi-head latent attention (MLA): deepseek_v2, deepseek_v3, kimi_k2.

Follows transformers ``models/deepseek_v2/modeling_deepseek_v2.py`` and
``models/deepseek_v3/modeling_deepseek_v3.py``:

- Attention (MLA): queries through ``q_proj (a*(dn+dr), h)``, or, with ``q_lora_rank`` r_q, the
  low-rank pair ``q_a_proj (r_q, h)`` + RMSNorm ``q_a_layernorm`` + ``q_b_proj (a*(dn+dr), r_q)``;
  keys and values through ``kv_a_proj_with_mqa (r_kv + dr, h)`` (the cached latent plus the
  shared RoPE key) + RMSNorm ``kv_a_layernorm (r_kv)`` + ``kv_b_proj (a*(dn+dv), r_kv)``; output
  ``o_proj (h, a*dv)``. ``attention_bias`` adds biases to q_a_proj, kv_a_proj_with_mqa and o_proj.
  (dn = qk_nope_head_dim, dr = qk_rope_head_dim, dv = v_head_dim, r_kv = kv_lora_rank.)
- The first ``first_k_dense_replace`` layers have a dense SwiGLU MLP ``intermediate_size`` wide;
  the others an MoE block: router ``mlp.gate (E, h)`` (fp32 in transformers), E routed experts
  ``moe_intermediate_size`` wide and ``n_shared_experts`` shared experts fused into one SwiGLU
  ``mlp.shared_experts`` of width ``moe_intermediate_size * n_shared_experts``. transformers
  ignores ``moe_layer_freq``.

``kimi_k2`` (Moonshot AI's Kimi K2) is DeepSeek-V3's architecture under another model_type, which
transformers does not register: its config names ``DeepseekV3ForCausalLM`` and the remote code
``configuration_deepseek.DeepseekV3Config`` / ``modeling_deepseek.py`` of the model repository
(moonshotai/Kimi-K2-Instruct), a copy of DeepSeek-V3's; it is counted as transformers' deepseek_v3
class counts that config (the remote code keeps one module per expert: the same parameters), and
omitted fields take DeepseekV3Config's defaults.

The router's ``e_score_correction_bias`` (DeepSeek-V3) is a buffer, not a parameter; the
multi-token-prediction layers a V3 checkpoint stores (``num_nextn_predict_layers``) are not
instantiated by transformers; neither is counted, and the spec's notes say so.
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import (
    ATTN,
    expert_stack,
    gated_mlp,
    intern,
    linear,
    lm_head,
    model_spec,
    norm,
    router,
    token_embedding,
)
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec, Split, TensorSpec

_COMMON: dict[str, object] = {
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "attention_bias": False,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
}
# transformers config-class defaults (configuration_<type>.py) of the fields read here
_DEFAULTS: dict[str, dict[str, object]] = {
    "deepseek_v2": {
        **_COMMON,
        "vocab_size": 102400,
        "intermediate_size": 11008,
        "max_position_embeddings": 2048,
        "mlp_bias": False,
        "first_k_dense_replace": 0,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "num_experts_per_tok": None,
        "moe_intermediate_size": 1407,
    },
    "deepseek_v3": {
        **_COMMON,
        "vocab_size": 129280,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "n_shared_experts": 1,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "max_position_embeddings": 4096,
        "mlp_bias": False,
    },
}
_DEFAULTS["kimi_k2"] = _DEFAULTS["deepseek_v3"]
_ALIASES: dict[str, dict[str, str]] = {
    "deepseek_v2": {"num_experts": "n_routed_experts"},
    "deepseek_v3": {"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers"},
}
_ALIASES["kimi_k2"] = _ALIASES["deepseek_v3"]


def mla_tensors(
    h: int, a: int, *, q_lora_rank: int | None, kv_lora_rank: int, nope: int, rope: int, v: int, bias: bool
) -> list[TensorSpec]:
    """The MLA projections and norms of one layer (see the module docstring for shapes)."""
    qk = nope + rope
    if q_lora_rank is None:
        q = linear("self_attn.q_proj", h, a * qk, ATTN, Split.COL)
    else:
        q = [
            *linear("self_attn.q_a_proj", h, q_lora_rank, ATTN, Split.NONE, bias=bias),
            *norm("self_attn.q_a_layernorm", q_lora_rank),
            *linear("self_attn.q_b_proj", q_lora_rank, a * qk, ATTN, Split.COL),
        ]
    return [
        *q,
        *linear("self_attn.kv_a_proj_with_mqa", h, kv_lora_rank + rope, ATTN, Split.NONE, bias=bias),
        *norm("self_attn.kv_a_layernorm", kv_lora_rank),
        *linear("self_attn.kv_b_proj", kv_lora_rank, a * (nope + v), ATTN, Split.COL),
        *linear("self_attn.o_proj", a * v, h, ATTN, Split.ROW, bias=bias),
    ]


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a deepseek_v2 / deepseek_v3 / kimi_k2 config."""
    model_type = cfg.model_type
    cfg = cfg.with_defaults(_DEFAULTS[model_type], aliases=_ALIASES[model_type])
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    vocab = cfg.int("vocab_size")
    num_layers = cfg.int("num_hidden_layers")
    q_lora_rank = cfg.int("q_lora_rank", default=None)
    kv_lora_rank = cfg.int("kv_lora_rank")
    nope = cfg.int("qk_nope_head_dim", minimum=0)
    rope = cfg.int("qk_rope_head_dim")
    v = cfg.int("v_head_dim")
    activation = cfg.str("hidden_act")
    mlp_bias = cfg.bool("mlp_bias") if model_type == "deepseek_v2" else False
    first_moe = cfg.int("first_k_dense_replace", default=0, minimum=0)
    num_experts = cfg.int("n_routed_experts")
    shared = cfg.int("n_shared_experts", default=0, minimum=0)
    moe_i = cfg.int("moe_intermediate_size")
    dense_i = cfg.int("intermediate_size")

    attention = AttentionSpec(
        kind="mla",
        num_heads=a,
        num_kv_heads=a,
        head_dim=nope + rope,
        v_head_dim=v,
        q_lora_rank=q_lora_rank,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=rope,
        rope="concat",
    )
    attention_tensors = mla_tensors(
        h,
        a,
        q_lora_rank=q_lora_rank,
        kv_lora_rank=kv_lora_rank,
        nope=nope,
        rope=rope,
        v=v,
        bias=cfg.bool("attention_bias"),
    )
    norms = [*norm("input_layernorm", h), *norm("post_attention_layernorm", h)]
    kinds: dict[object, LayerSpec] = {}

    def dense() -> LayerSpec:
        return LayerSpec(
            attention=attention,
            mlp=MLPSpec(gated=True, intermediate_size=dense_i, activation=activation),
            tensors=(*attention_tensors, *gated_mlp(h, dense_i, bias=mlp_bias), *norms),
        )

    def moe() -> LayerSpec:
        mlp = MLPSpec(
            gated=True,
            intermediate_size=moe_i,
            activation=activation,
            num_experts=num_experts,
            num_experts_per_tok=cfg.int("num_experts_per_tok"),
            num_shared_experts=shared,
            shared_intermediate_size=moe_i * shared,
        )
        tensors = (
            *attention_tensors,
            *expert_stack(h, moe_i, num_experts),
            *router("mlp.gate", h, num_experts),
            *gated_mlp(h, moe_i * shared, prefix="mlp.shared_experts", bias=mlp_bias),
            *norms,
        )
        return LayerSpec(attention=attention, mlp=mlp, tensors=tensors)

    layers = [intern(kinds, "dense", dense) if n < first_moe else intern(kinds, "moe", moe) for n in range(num_layers)]

    notes: list[str] = []
    mtp = cfg.int("num_nextn_predict_layers", default=0, minimum=0)
    if mtp:
        notes.append(
            f"the checkpoint also stores {mtp} multi-token-prediction layer(s) (num_nextn_predict_layers) that "
            "transformers does not instantiate; they are not counted (DeepSeek-V3/R1: 671B counted, 685B stored)"
        )
    if cfg.int("moe_layer_freq", default=1) != 1:
        notes.append(
            "moe_layer_freq is ignored, as transformers ignores it: every layer from first_k_dense_replace on is MoE"
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
