"""TII Falcon-H1: falcon_h1 (attention and Mamba-2 side by side in every layer).

Follows transformers ``models/falcon_h1/modeling_falcon_h1.py`` and ``FalconH1Config``. Every
``FalconH1DecoderLayer`` runs ``self_attn`` and ``mamba`` on the same normed input
(``input_layernorm``) and adds both, then a SwiGLU ``feed_forward`` after ``pre_ff_layernorm``:

- attention (``FalconH1Attention``): Q/K/V/O projections (biases with ``attention_bias``), head_dim
  the config's or h / a, rotary;
- Mamba-2 (``FalconH1Mixer``): :func:`memest.sources.families._layers.mamba2_mixer` under
  ``mamba.`` with d_in = ``mamba_d_ssm`` (else ``mamba_expand`` x h), ``mamba_n_heads`` heads of
  ``mamba_d_head`` (``auto``: d_in / heads), ``mamba_n_groups``, ``mamba_d_state``, ``mamba_d_conv``;
  in_proj bias ``mamba_proj_bias``, out_proj bias ``projectors_bias``, the gated norm only with
  ``mamba_rms_norm``;
- ``feed_forward``: gate / up (i, h), down (h, i), biases with ``mlp_bias``.

Each layer therefore caches K/V per token *and* a Mamba-2 state per sequence (its
:class:`~memest.spec.AttentionSpec` carries both; vLLM gives each layer a ``FullAttentionSpec``
and a ``MambaSpec``). The model: ``model.embed_tokens``, ``model.final_layernorm``, ``lm_head``
(untied by default).
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import gated_mlp, gqa_projections, lm_head, model_spec, norm, token_embedding
from memest.sources.families._layers import mamba2_mixer, mamba2_state
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec

# FalconH1Config defaults (models/falcon_h1/configuration_falcon_h1.py) of the fields read here
_DEFAULTS: dict[str, object] = {
    "vocab_size": 128000,
    "tie_word_embeddings": False,
    "intermediate_size": 14336,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "mamba_d_ssm": 1024,
    "mamba_n_heads": 128,
    "mamba_d_head": "auto",
    "mamba_n_groups": 1,
    "mamba_d_state": 256,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "mamba_rms_norm": False,
    "projectors_bias": False,
    "attention_bias": False,
    "mlp_bias": False,
}


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a falcon_h1 config."""
    cfg = cfg.with_defaults(_DEFAULTS)
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    k = cfg.int("num_key_value_heads", default=a)
    d = cfg.int("head_dim", default=h // a)
    vocab = cfg.int("vocab_size")
    num_layers = cfg.int("num_hidden_layers")
    i = cfg.int("intermediate_size")
    d_in = cfg.int("mamba_d_ssm", default=None) or cfg.int("mamba_expand") * h
    heads, groups = cfg.int("mamba_n_heads"), cfg.int("mamba_n_groups")
    head_dim = d_in // heads if cfg.get("mamba_d_head") == "auto" else cfg.int("mamba_d_head")
    n, kernel = cfg.int("mamba_d_state"), cfg.int("mamba_d_conv")
    attention = AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d,
                              state=mamba2_state(d_in, groups, n, heads, head_dim, kernel))
    bias = cfg.bool("attention_bias")
    layer = LayerSpec(
        attention=attention,
        mlp=MLPSpec(gated=True, intermediate_size=i, activation=cfg.str("hidden_act")),
        norm="rms",
        parallel_residual=True,
        tensors=(
            *gqa_projections(h, a, k, d, qkv_bias=bias, o_bias=bias),
            *mamba2_mixer(h, d_in, groups, n, heads, kernel, bias=cfg.bool("mamba_proj_bias"),
                          conv_bias=cfg.bool("mamba_conv_bias"), prefix="mamba.",
                          gated_norm=cfg.bool("mamba_rms_norm"), out_bias=cfg.bool("projectors_bias")),
            *gated_mlp(h, i, prefix="feed_forward", bias=cfg.bool("mlp_bias")),
            *norm("input_layernorm", h), *norm("pre_ff_layernorm", h),
        ),
    )
    tied = cfg.bool("tie_word_embeddings")
    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[layer] * num_layers,
        embedding=[token_embedding("model.embed_tokens.weight", vocab, h)],
        head=[*norm("model.final_layernorm", h), *([] if tied else lm_head(vocab, h))],
        tie_word_embeddings=tied,
        max_position_embeddings=cfg.int("max_position_embeddings"),
    )
