"""NVIDIA Nemotron-H hybrids: nemotron_h (Nemotron-H, Nemotron Nano 2, Nemotron 3).

Follows transformers ``models/nemotron_h/modeling_nemotron_h.py`` and ``NemotronHConfig``. Every
block is ``norm`` (RMSNorm) then one ``mixer``, chosen per layer by ``hybrid_override_pattern``
(``M`` Mamba-2, ``*`` attention, ``-`` MLP, ``E`` MoE) or by the list ``layers_block_type`` /
``layer_types`` (``linear_attention`` = Mamba-2, ``full_attention``, ``mlp``, ``moe``); the pattern's
length is the depth (``num_hidden_layers`` is derived from it). Shapes, with I = mamba_num_heads x
mamba_head_dim, conv_dim = I + 2 n_groups ssm_state_size, H = mamba_num_heads:

- Mamba-2 (``NemotronHMamba2Mixer``): ``in_proj (I + conv_dim + H, h)`` (+ bias with
  ``use_bias``), depthwise ``conv1d (conv_dim, 1, K)`` (+ bias with ``use_conv_bias``), ``dt_bias``,
  ``A_log``, ``D`` (H each), gated RMSNorm ``norm (I)``, ``out_proj (h, I)``; it caches a
  per-sequence state (:func:`memest.sources.families._layers.mamba2_state`), whose SSM part vLLM
  keeps in ``mamba_ssm_cache_dtype`` (the config's, else float32:
  ``NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype`` in vLLM
  ``model_executor/models/config.py``);
- attention (``NemotronHAttention``): ``q_proj (a d, h)``, ``k_proj`` / ``v_proj (k d, h)``,
  ``o_proj (h, a d)``, no biases, no rotary embedding;
- MLP (``NemotronHMLP``, ``relu2``): ``up_proj (i, h)``, ``down_proj (h, i)`` (+ biases with
  ``mlp_bias``);
- MoE (``NemotronHMoE``): router ``gate.weight (E, h)`` (its ``e_score_correction_bias`` is a
  buffer), non-gated experts ``experts.up_proj (E, i_moe, l)`` and ``experts.down_proj (E, l, i_moe)``
  with l = ``moe_latent_size`` (then ``fc1_latent_proj (l, h)`` / ``fc2_latent_proj (h, l)``) or h,
  and a shared ``shared_experts`` MLP of ``moe_shared_expert_intermediate_size``.

The model: ``model.embeddings (V, h)``, ``model.norm_f``, ``lm_head (V, h)``, never tied
(``NemotronHForCausalLM._tied_weights_keys`` is empty). Multi-token-prediction layers
(``num_nextn_predict_layers``) are not instantiated by transformers and not counted.
"""

from __future__ import annotations

from memest.errors import ConfigError
from memest.sources.config import HFConfig
from memest.sources.families._build import (
    MLP,
    gqa_projections,
    intern,
    linear,
    lm_head,
    model_spec,
    norm,
    router,
    token_embedding,
)
from memest.sources.families._layers import listed_kinds, mamba2_mixer, mamba2_state, pattern_kinds
from memest.spec import AttentionSpec, Component, LayerSpec, MLPSpec, ModelSpec, Split, TensorSpec

# NemotronHConfig defaults (models/nemotron_h/configuration_nemotron_h.py) of the fields read here
_DEFAULTS: dict[str, object] = {
    "vocab_size": 131072,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 4096,
    "intermediate_size": 21504,
    "mlp_hidden_act": "relu2",
    "mlp_bias": False,
    "ssm_state_size": 128,
    "mamba_num_heads": 128,
    "mamba_head_dim": 64,
    "n_groups": 8,
    "conv_kernel": 4,
    "use_conv_bias": True,
    "use_bias": False,
    "mamba_ssm_cache_dtype": "float32",
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "moe_intermediate_size": 7688,
    "moe_shared_expert_intermediate_size": 7688,
    "moe_latent_size": None,
    "num_experts_per_tok": 2,
}
# the config's legacy names (NemotronHConfig.__post_init__)
_ALIASES = {"mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel", "mamba_conv_bias": "use_conv_bias",
            "num_local_experts": "n_routed_experts"}
PATTERN_SYMBOLS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
"""``hybrid_override_pattern`` symbols (``NemotronHConfig._pattern_to_list``)."""
BLOCK_TYPES = {"linear_attention": "mamba", "full_attention": "attention", "mlp": "mlp", "moe": "moe"}
"""``layers_block_type`` words (``NemotronHConfig.validate_layer_type``)."""


def block_kinds(cfg: HFConfig) -> list[str]:
    """Each block's mixer (``mamba``, ``attention``, ``mlp``, ``moe``), from the list when the config
    has one (it wins in transformers), else from ``hybrid_override_pattern``.

    Raises:
        ConfigError: neither is given, or an entry / symbol is unknown.
    """
    for key in ("layers_block_type", "layer_types"):
        if cfg.get(key, default=None) is not None:
            return listed_kinds(cfg, key, None, BLOCK_TYPES)
    if cfg.get("hybrid_override_pattern", default=None) is None:
        raise ConfigError(f"{cfg.what}: a nemotron_h config needs 'hybrid_override_pattern' (or "
                          "'layers_block_type'): one entry per block, M = Mamba-2, * = attention, - = MLP, E = MoE")
    return pattern_kinds(cfg, "hybrid_override_pattern", PATTERN_SYMBOLS)


def _mlp_tensors(h: int, i: int, prefix: str, *, bias: bool) -> list[TensorSpec]:
    return [*linear(f"{prefix}.up_proj", h, i, MLP, Split.COL, bias=bias),
            *linear(f"{prefix}.down_proj", i, h, MLP, Split.ROW, bias=bias)]


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a nemotron_h config."""
    cfg = cfg.with_defaults(_DEFAULTS, aliases=_ALIASES)
    kinds_of_blocks = block_kinds(cfg)
    h = cfg.int("hidden_size")
    vocab = cfg.int("vocab_size")
    activation = cfg.str("mlp_hidden_act")
    mlp_bias = cfg.bool("mlp_bias")
    no_mlp = MLPSpec(gated=False, intermediate_size=0, activation=activation)
    mixers: dict[str, tuple[AttentionSpec, MLPSpec, tuple[TensorSpec, ...]]] = {}
    if "mamba" in kinds_of_blocks:
        heads, head_dim = cfg.int("mamba_num_heads"), cfg.int("mamba_head_dim")
        groups, n, kernel = cfg.int("n_groups"), cfg.int("ssm_state_size"), cfg.int("conv_kernel")
        d_inner = heads * head_dim
        ssm_dtype = cfg.str("mamba_ssm_cache_dtype")
        state = mamba2_state(d_inner, groups, n, heads, head_dim, kernel,
                             ssm_dtype=None if ssm_dtype == "auto" else ssm_dtype)
        mixers["mamba"] = (AttentionSpec(kind="mamba", num_heads=0, num_kv_heads=0, head_dim=0, state=state), no_mlp,
                           tuple(mamba2_mixer(h, d_inner, groups, n, heads, kernel, bias=cfg.bool("use_bias"),
                                              conv_bias=cfg.bool("use_conv_bias"))))
    if "attention" in kinds_of_blocks:
        a = cfg.int("num_attention_heads")
        k = cfg.int("num_key_value_heads", default=a)
        d = cfg.int("head_dim")
        mixers["attention"] = (AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d, rope="none"), no_mlp,
                               tuple(gqa_projections(h, a, k, d, prefix="mixer")))
    if "mlp" in kinds_of_blocks:
        i = cfg.int("intermediate_size")
        mixers["mlp"] = (AttentionSpec(kind="none", num_heads=0, num_kv_heads=0, head_dim=0),
                         MLPSpec(gated=False, intermediate_size=i, activation=activation),
                         tuple(_mlp_tensors(h, i, "mixer", bias=mlp_bias)))
    if "moe" in kinds_of_blocks:
        experts, i_moe = cfg.int("n_routed_experts"), cfg.int("moe_intermediate_size")
        shared = cfg.int("moe_shared_expert_intermediate_size")
        latent = cfg.int("moe_latent_size", default=None)
        width = latent or h
        tensors = [
            *router("mixer.gate", h, experts),
            TensorSpec("mixer.experts.up_proj", (experts, i_moe, width), Component.EXPERTS, Split.COL),
            TensorSpec("mixer.experts.down_proj", (experts, width, i_moe), Component.EXPERTS, Split.ROW),
            *_mlp_tensors(h, shared, "mixer.shared_experts", bias=mlp_bias),
        ]
        if latent:
            tensors += [*linear("mixer.fc1_latent_proj", h, latent, MLP, Split.NONE, bias=mlp_bias),
                        *linear("mixer.fc2_latent_proj", latent, h, MLP, Split.NONE, bias=mlp_bias)]
        mlp = MLPSpec(gated=False, intermediate_size=i_moe, activation=activation, num_experts=experts,
                      num_experts_per_tok=cfg.int("num_experts_per_tok"),
                      num_shared_experts=cfg.int("n_shared_experts", minimum=0), shared_intermediate_size=shared)
        mixers["moe"] = (AttentionSpec(kind="none", num_heads=0, num_kv_heads=0, head_dim=0), mlp, tuple(tensors))
    block_norm = tuple(norm("norm", h))
    built: dict[object, LayerSpec] = {}

    def layer(kind: str) -> LayerSpec:
        attention, mlp, tensors = mixers[kind]
        return intern(built, kind, lambda: LayerSpec(attention=attention, mlp=mlp, norm="rms",
                                                     tensors=(*block_norm, *tensors)))

    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[layer(kind) for kind in kinds_of_blocks],
        embedding=[token_embedding("model.embeddings.weight", vocab, h)],
        head=[*norm("model.norm_f", h), *lm_head(vocab, h)],
        tie_word_embeddings=False,
        max_position_embeddings=cfg.int("max_position_embeddings"),
    )
