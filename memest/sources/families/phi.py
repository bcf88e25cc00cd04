"""Microsoft Phi decoders: phi (phi-1, phi-1.5, phi-2), phi3, phimoe (Phi-3.5-MoE).

Follows transformers:

- ``models/phi/modeling_phi.py``: one LayerNorm per layer feeding attention and MLP in parallel
  (parallel residual); biased Q/K/V and output ``dense``; optional per-head LayerNorms
  ``q_layernorm``/``k_layernorm`` over h/a (``qk_layernorm``); GELU MLP ``fc1``/``fc2`` with
  biases; final LayerNorm ``model.final_layernorm``; the lm_head always has a bias (kept even
  when its weight is tied).
- ``models/phi3/modeling_phi3.py``: llama-like RMSNorm layers with fused ``qkv_proj``
  ``((a + 2k) d, h)`` and fused ``gate_up_proj (2i, h)``; ``sliding_window`` on every layer.
- ``models/phimoe/modeling_phimoe.py``: LayerNorms with biases, Q/K/V/O biases per
  ``attention_bias``, every MLP an MoE block (router ``mlp.router (E, h)``, fused experts), lm_head
  bias per ``lm_head_bias``. The Hub's remote-code class is ``PhiMoEForCausalLM``; transformers'
  native one is ``PhimoeForCausalLM`` (same parameters).
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import (
    ATTN,
    MLP,
    expert_stack,
    gqa_projections,
    head_dim_of,
    linear,
    lm_head,
    model_spec,
    norm,
    plain_mlp,
    router,
    token_embedding,
)
from memest.spec import AttentionSpec, Component, LayerSpec, MLPSpec, ModelSpec, Split, TensorSpec

# transformers config-class defaults (configuration_<type>.py) of the fields read here
_DEFAULTS: dict[str, dict[str, object]] = {
    "phi": {
        "vocab_size": 51200,
        "intermediate_size": 8192,
        "hidden_act": "gelu_new",
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "qk_layernorm": False,
    },
    "phi3": {
        "vocab_size": 32064,
        "intermediate_size": 8192,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "sliding_window": None,
    },
    "phimoe": {
        "vocab_size": 32064,
        "intermediate_size": 6400,
        "num_key_value_heads": 8,
        "hidden_act": "silu",
        "max_position_embeddings": 4096 * 32,
        "tie_word_embeddings": False,
        "sliding_window": None,
        "num_experts_per_tok": 2,
        "num_local_experts": 16,
        "attention_bias": False,
        "lm_head_bias": False,
    },
}


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a phi / phi3 / phimoe config."""
    model_type = cfg.model_type
    cfg = cfg.with_defaults(_DEFAULTS[model_type])
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    k = cfg.int("num_key_value_heads", default=a)
    d = head_dim_of(cfg, h, a)
    i = cfg.int("intermediate_size")
    vocab = cfg.int("vocab_size")
    num_layers = cfg.int("num_hidden_layers")
    activation = cfg.str("hidden_act")
    window = None if model_type == "phi" else cfg.int("sliding_window", default=None)
    # phi (partial rotary) and phi3 (Phi3's apply_rotary_pos_emb) concatenate the rotated and passed parts
    rope = "rotate" if model_type == "phimoe" else "concat"
    qk_norm = "head" if model_type == "phi" and cfg.bool("qk_layernorm") else "none"
    attention = AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d, sliding_window=window, rope=rope,
                              qk_norm=qk_norm)
    tied = cfg.bool("tie_word_embeddings")

    if model_type == "phi":
        qk = h // a  # PhiAttention sizes q/k_layernorm by hidden_size // num_attention_heads
        tensors: tuple[TensorSpec, ...] = (
            *gqa_projections(h, a, k, d, names=("q_proj", "k_proj", "v_proj", "dense"), qkv_bias=True, o_bias=True),
            *(
                norm("self_attn.q_layernorm", qk, bias=True) + norm("self_attn.k_layernorm", qk, bias=True)
                if cfg.bool("qk_layernorm")
                else []
            ),
            *plain_mlp(h, i),
            *norm("input_layernorm", h, bias=True),
        )
        layer = LayerSpec(
            attention=attention,
            mlp=MLPSpec(gated=False, intermediate_size=i, activation=activation),
            norm="layer",
            parallel_residual=True,
            tensors=tensors,
        )
        final = norm("model.final_layernorm", h, bias=True)
        out = [
            *([] if tied else [TensorSpec("lm_head.weight", (vocab, h), Component.LM_HEAD, Split.VOCAB)]),
            TensorSpec("lm_head.bias", (vocab,), Component.LM_HEAD, Split.VOCAB),
        ]
    elif model_type == "phi3":
        tensors = (
            *linear("self_attn.qkv_proj", h, (a + 2 * k) * d, ATTN, Split.COL),
            *linear("self_attn.o_proj", a * d, h, ATTN, Split.ROW),
            *linear("mlp.gate_up_proj", h, 2 * i, MLP, Split.COL),
            *linear("mlp.down_proj", i, h, MLP, Split.ROW),
            *norm("input_layernorm", h),
            *norm("post_attention_layernorm", h),
        )
        layer = LayerSpec(
            attention=attention,
            mlp=MLPSpec(gated=True, intermediate_size=i, activation=activation),
            norm="rms",
            tensors=tensors,
        )
        final = norm("model.norm", h)
        out = [] if tied else lm_head(vocab, h)
    else:  # phimoe
        num_experts = cfg.int("num_local_experts")
        bias = cfg.bool("attention_bias")
        tensors = (
            *gqa_projections(h, a, k, d, qkv_bias=bias, o_bias=bias),
            *router("mlp.router", h, num_experts),
            *expert_stack(h, i, num_experts),
            *norm("input_layernorm", h, bias=True),
            *norm("post_attention_layernorm", h, bias=True),
        )
        mlp = MLPSpec(
            gated=True,
            intermediate_size=i,
            activation=activation,
            num_experts=num_experts,
            num_experts_per_tok=cfg.int("num_experts_per_tok"),
        )
        layer = LayerSpec(attention=attention, mlp=mlp, norm="layer", tensors=tensors)
        final = norm("model.norm", h, bias=True)
        head_bias = cfg.bool("lm_head_bias")
        if tied:
            out = [TensorSpec("lm_head.bias", (vocab,), Component.LM_HEAD, Split.VOCAB)] if head_bias else []
        else:
            out = lm_head(vocab, h, bias=head_bias)

    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[layer] * num_layers,
        embedding=[token_embedding("model.embed_tokens.weight", vocab, h)],
        head=[*final, *out],
        tie_word_embeddings=tied,
        max_position_embeddings=cfg.int("max_position_embeddings"),
    )
