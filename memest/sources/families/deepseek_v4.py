"""DeepSeek-V4 (``deepseek_v4``: DeepSeek-V4-Flash / -Pro): shared-KV multi-query attention over a
sliding window plus compressed entries, hash-routed and top-k MoE, manifold-constrained
hyper-connections.

Follows transformers 5.24 ``models/deepseek_v4/modeling_deepseek_v4.py`` and
``configuration_deepseek_v4.py`` (``DeepseekV4Config``). With h = ``hidden_size``, a =
``num_attention_heads``, d = ``head_dim``, r_q = ``q_lora_rank``, g = ``o_groups``, r_o =
``o_lora_rank``, n = ``hc_mult``, E = ``n_routed_experts``, i = ``moe_intermediate_size``:

- Attention (``DeepseekV4Attention``; not MLA: one KV head, the same tensor read as K and V):
  ``q_a_proj (r_q, h)``, RMSNorm ``q_a_norm (r_q)``, ``q_b_proj (a*d, r_q)``, ``kv_proj (d, h)``,
  RMSNorm ``kv_norm (d)``, the grouped output projection ``o_a_proj (g*r_o, a*d/g)``
  (``DeepseekV4GroupedLinear``: g blocks) and ``o_b_proj (h, g*r_o)``, and one fp32 sink per head
  ``sinks (a)``. ``num_key_value_heads`` is not read: there is always one KV head.
- Each layer's ``layer_types`` entry (``sliding_attention``, ``compressed_sparse_attention`` = CSA,
  ``heavily_compressed_attention`` = HCA; or the per-layer ``compress_ratios`` 0 / 4 / 128 older
  configs ship, as ``DeepseekV4Config.__post_init__`` folds them; default: two HCA then CSA / HCA
  alternating) adds a compressor at ``compress_rates[type]`` (m; CSA 4, HCA 128):
  HCA ``compressor.kv_proj (d, h)``, ``gate_proj (d, h)``, fp32 ``position_bias (m, d)``,
  ``kv_norm (d)``; CSA the same at 2d (``kv_proj``, ``gate_proj`` ``(2d, h)``, ``position_bias
  (m, 2d)``, ``kv_norm (d)``) plus a lightning indexer ``compressor.indexer``: its own compressor at
  d_i = ``index_head_dim`` (``kv_proj``, ``gate_proj`` ``(2 d_i, h)``, ``position_bias (m, 2 d_i)``,
  ``kv_norm (d_i)``), ``q_b_proj (n_i*d_i, r_q)`` and ``scorer.weights_proj (n_i, h)`` (n_i =
  ``index_n_heads``).
- MLP (``DeepseekV4SparseMoeBlock``, every layer): router ``mlp.gate.weight (E, h)``, experts
  ``gate_up_proj (E, 2i, h)`` / ``down_proj (E, h, i)``, one shared SwiGLU ``mlp.shared_experts`` of
  width i (``intermediate_size`` maps to ``moe_intermediate_size``: ``n_shared_experts`` is not
  read). ``mlp_layer_types`` ``hash_moe`` layers (default: the first ``num_hash_layers`` = 3) route
  by a frozen ``gate.tid2eid (V, top_k)`` int64 buffer (stored in the checkpoint, not a parameter);
  ``moe`` layers by a learned top-k with an ``e_score_correction_bias`` buffer.
- Residual streams (mHC): ``attn_hc`` and ``ffn_hc`` per layer, each ``fn ((2+n)n, n*h)``, ``base
  ((2+n)n)``, ``scale (3)``; the model's ``hc_head``: ``hc_fn (n, n*h)``, ``hc_base (n)``,
  ``hc_scale (1)``; norms ``input_layernorm``, ``post_attention_layernorm``, ``model.norm`` (h).

What each layer caches (``DeepseekV4HCACache`` / ``DeepseekV4CSACache``): a sliding window of
``sliding_window`` tokens of K = V (one d-wide tensor), the compressed entries (one of d per m
tokens, :attr:`AttentionSpec.compress_rate`) and, on CSA layers, the indexer's compressed keys (one
of d_i per m tokens); a ``sliding_attention`` layer is a plain ``DynamicSlidingWindowLayer``, which
stores its one tensor as K and as V. The bytes: :mod:`memest.estimate.serving.kv`.

Not counted, as transformers does not instantiate them: the ``num_nextn_predict_layers`` MTP layers
of the checkpoint (``_keys_to_ignore_on_load_unexpected`` drops ``mtp.*``); the spec's notes say so.
transformers keeps the hyper-connections, sinks, position biases and norms in fp32
(``_keep_in_fp32_modules_strict``); memest weighs every parameter at the load dtype.
"""

from __future__ import annotations

from memest.errors import ConfigError
from memest.sources.config import HFConfig
from memest.sources.families._build import (
    ATTN,
    MLP,
    NORM,
    OTHER,
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
from memest.sources.families._layers import listed_kinds
from memest.spec import AttentionSpec, BufferSpec, Component, LayerSpec, MLPSpec, ModelSpec, Split, TensorSpec

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
LAYER_TYPES = (SLIDING, CSA, HCA)
"""``DEEPSEEK_V4_LAYER_TYPES`` of transformers' configuration_deepseek_v4.py."""
_RATIO_TO_TYPE = {0: SLIDING, 4: CSA, 128: HCA}
"""``_COMPRESS_RATIO_TO_LAYER_TYPE``: the per-layer ``compress_ratios`` of older V4 configs."""
MLP_LAYER_TYPES = ("hash_moe", "moe")

# DeepseekV4Config class defaults of the fields read here
_DEFAULTS: dict[str, object] = {
    "vocab_size": 129280,
    "moe_intermediate_size": 2048,
    "head_dim": 512,
    "q_lora_rank": 1024,
    "num_experts_per_tok": 6,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "max_position_embeddings": 1048576,
    "hc_mult": 4,
    "sliding_window": 128,
    "o_groups": 8,
    "o_lora_rank": 1024,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "num_nextn_predict_layers": 1,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}
_DEFAULT_COMPRESS_RATES = {CSA: 4, HCA: 128}
_DEFAULT_NUM_HASH_LAYERS = 3
_ALIASES = {"num_local_experts": "n_routed_experts"}


def _layer_types(cfg: HFConfig, num_layers: int) -> list[str]:
    """Each layer's attention type as ``DeepseekV4Config.__post_init__`` resolves it: ``layer_types``,
    else the legacy per-layer ``compress_ratios`` (0 / 4 / 128; a trailing MTP entry is cut),
    else two HCA layers then CSA and HCA alternating.

    Raises:
        ConfigError: an entry that is not a V4 layer type or ratio (``layer_types[3] = 'foo'``), or
            fewer entries than layers.
    """
    known = {t: t for t in LAYER_TYPES}
    if cfg.has("layer_types"):
        types = listed_kinds(cfg, "layer_types", None, known)
        key = "layer_types"
    elif cfg.has("compress_ratios"):
        ratios = cfg.get("compress_ratios")
        if not isinstance(ratios, list):
            raise ConfigError(f"{cfg.what}: 'compress_ratios' must be a list of 0 / 4 / 128 per layer, "
                              f"got {ratios!r}")
        types = []
        for n, ratio in enumerate(ratios):
            kind = _RATIO_TO_TYPE.get(ratio) if isinstance(ratio, int) and not isinstance(ratio, bool) else None
            if kind is None:
                raise ConfigError(f"{cfg.what}: compress_ratios[{n}] = {ratio!r} is not a compress ratio "
                                  "of model_type 'deepseek_v4'; use 0 (sliding), 4 (CSA) or 128 (HCA), or give "
                                  "layer_types")
            types.append(kind)
        key = "compress_ratios"
    else:
        return [HCA] * min(num_layers, 2) + [CSA if n % 2 else HCA for n in range(max(num_layers - 2, 0))]
    if len(types) < num_layers:
        raise ConfigError(f"{cfg.what}: {key} has {len(types)} entries for {num_layers} layers; "
                          "give one per layer")
    return types[:num_layers]


def _mlp_layer_types(cfg: HFConfig, num_layers: int) -> list[str]:
    """``mlp_layer_types`` (hash_moe / moe), else the first ``num_hash_layers`` (3) hash-routed."""
    if cfg.has("mlp_layer_types"):
        types = listed_kinds(cfg, "mlp_layer_types", None, {t: t for t in MLP_LAYER_TYPES})
        if len(types) < num_layers:
            raise ConfigError(f"{cfg.what}: mlp_layer_types has {len(types)} entries for {num_layers} "
                              "layers; give one per layer")
        return types[:num_layers]
    n_hash = cfg.int("num_hash_layers", default=_DEFAULT_NUM_HASH_LAYERS, minimum=0)
    return ["hash_moe"] * min(num_layers, n_hash) + ["moe"] * max(0, num_layers - n_hash)


def compress_rates(cfg: HFConfig) -> dict[str, int]:
    """``compress_rates`` per compressed layer type (default CSA 4, HCA 128; the legacy top-level
    ``compress_rate_csa`` / ``compress_rate_hca`` override them, as ``__post_init__`` folds them).

    Raises:
        ConfigError: not a mapping, a key that is not a compressed layer type, or a rate below 1.
    """
    given = cfg.get("compress_rates", default=None)
    if given is not None and not isinstance(given, dict):
        raise ConfigError(f"{cfg.what}: 'compress_rates' must map layer types to rates, got {given!r}")
    rates = dict(_DEFAULT_COMPRESS_RATES if given is None else given)
    for key, legacy in ((CSA, "compress_rate_csa"), (HCA, "compress_rate_hca")):
        if cfg.has(legacy):
            rates[key] = cfg.int(legacy)
    for key, rate in rates.items():
        if key not in (CSA, HCA):
            raise ConfigError(f"{cfg.what}: compress_rates[{key!r}] names no compressed layer type of "
                              f"model_type 'deepseek_v4'; use {CSA!r} or {HCA!r}")
        if not isinstance(rate, int) or isinstance(rate, bool) or rate < 1:
            raise ConfigError(f"{cfg.what}: compress_rates[{key!r}] = {rate!r} must be a positive integer")
    return rates


def _compressor(prefix: str, h: int, width: int, rate: int, norm_dim: int) -> list[TensorSpec]:
    """One compressor: projections of ``width`` per token, fp32 position biases per slot of a window."""
    return [
        *linear(f"{prefix}.kv_proj", h, width, ATTN, Split.NONE),
        *linear(f"{prefix}.gate_proj", h, width, ATTN, Split.NONE),
        TensorSpec(f"{prefix}.position_bias", (rate, width), ATTN),
        *norm(f"{prefix}.kv_norm", norm_dim),
    ]


def _hyper_connection(prefix: str, h: int, n: int, component: Component) -> list[TensorSpec]:
    """``DeepseekV4HyperConnection``: pre (n) + post (n) + comb (n x n) mixing weights from the n
    streams, counted with the block it wraps (attention or MLP)."""
    mixes = (2 + n) * n
    return [
        TensorSpec(f"{prefix}.fn", (mixes, n * h), component),
        TensorSpec(f"{prefix}.base", (mixes,), component),
        TensorSpec(f"{prefix}.scale", (3,), component),
    ]


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a ``deepseek_v4`` config (see the module docstring for every tensor)."""
    cfg = cfg.with_defaults(_DEFAULTS, aliases=_ALIASES)
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    num_layers = cfg.int("num_hidden_layers")
    vocab = cfg.int("vocab_size")
    d = cfg.int("head_dim")
    q_rank = cfg.int("q_lora_rank")
    groups = cfg.int("o_groups")
    o_rank = cfg.int("o_lora_rank")
    n_hc = cfg.int("hc_mult")
    window = cfg.int("sliding_window")
    num_experts = cfg.int("n_routed_experts")
    top_k = cfg.int("num_experts_per_tok")
    # DeepseekV4Config.attribute_map sends intermediate_size to moe_intermediate_size, and the alias is set
    # after the dataclass fields, so a config giving both gets intermediate_size
    i = cfg.int("intermediate_size", "moe_intermediate_size")
    n_i = cfg.int("index_n_heads")
    d_i = cfg.int("index_head_dim")
    activation = cfg.str("hidden_act")
    if (a * d) % groups:
        raise ConfigError(f"{cfg.what}: num_attention_heads x head_dim = {a * d} is not divisible by "
                          f"o_groups = {groups}; the grouped output projection needs equal groups")
    rates = compress_rates(cfg)
    attn_types = _layer_types(cfg, num_layers)
    for kind in (CSA, HCA):
        if kind in attn_types and kind not in rates:
            raise ConfigError(f"{cfg.what}: compress_rates has no rate for {kind!r}, which layers use; give "
                              f"compress_rates[{kind!r}] (default {_DEFAULT_COMPRESS_RATES[kind]})")
    mlp_types = _mlp_layer_types(cfg, num_layers)

    attention_tensors = [
        *linear("self_attn.q_a_proj", h, q_rank, ATTN, Split.NONE),
        *norm("self_attn.q_a_norm", q_rank),
        *linear("self_attn.q_b_proj", q_rank, a * d, ATTN, Split.COL),
        *linear("self_attn.kv_proj", h, d, ATTN, Split.NONE),
        *norm("self_attn.kv_norm", d),
        *linear("self_attn.o_a_proj", a * d // groups, groups * o_rank, ATTN, Split.COL),
        *linear("self_attn.o_b_proj", groups * o_rank, h, ATTN, Split.ROW),
        TensorSpec("self_attn.sinks", (a,), ATTN, Split.COL),
    ]

    def compressor_tensors(kind: str) -> list[TensorSpec]:
        if kind == SLIDING:
            return []
        m = rates[kind]
        if kind == HCA:
            return _compressor("self_attn.compressor", h, d, m, d)
        return [
            *_compressor("self_attn.compressor", h, 2 * d, m, d),
            *_compressor("self_attn.compressor.indexer", h, 2 * d_i, m, d_i),
            *linear("self_attn.compressor.indexer.q_b_proj", q_rank, n_i * d_i, ATTN, Split.NONE),
            *linear("self_attn.compressor.indexer.scorer.weights_proj", h, n_i, ATTN, Split.NONE),
        ]

    def attention_of(kind: str) -> AttentionSpec:
        return AttentionSpec(
            num_heads=a,
            num_kv_heads=1,
            head_dim=d,
            q_lora_rank=q_rank,
            sliding_window=window,
            kv_shared=True,
            kv_copied_by_transformers=kind == SLIDING,
            compress_rate=0 if kind == SLIDING else rates[kind],
            compress_overlap=kind == CSA,
            index_head_dim=d_i if kind == CSA else 0,
            sinks=True,
        )

    mlp_tensors = [
        *router("mlp.gate", h, num_experts),
        *expert_stack(h, i, num_experts),
        *gated_mlp(h, i, prefix="mlp.shared_experts"),
    ]
    mlp = MLPSpec(gated=True, intermediate_size=i, activation=activation, num_experts=num_experts,
                  num_experts_per_tok=top_k, num_shared_experts=1, shared_intermediate_size=i)
    block_tensors = [
        *norm("input_layernorm", h),
        *norm("post_attention_layernorm", h),
        *_hyper_connection("attn_hc", h, n_hc, ATTN),
        *_hyper_connection("ffn_hc", h, n_hc, MLP),
    ]
    kinds: dict[object, LayerSpec] = {}

    def make(kind: str) -> LayerSpec:
        return LayerSpec(attention=attention_of(kind), mlp=mlp,
                         tensors=(*attention_tensors, *compressor_tensors(kind), *mlp_tensors, *block_tensors))

    layers = [intern(kinds, kind, lambda kind=kind: make(kind)) for kind in attn_types]
    buffers = tuple(BufferSpec(f"model.layers.{n}.mlp.gate.tid2eid", (vocab, top_k), itemsize=8)
                    for n, kind in enumerate(mlp_types) if kind == "hash_moe")

    counts = {kind: attn_types.count(kind) for kind in LAYER_TYPES if kind in attn_types}
    notes = [
        "DeepSeek-V4 attention: " + ", ".join(f"{n} {kind}" + (f" (1 entry / {rates[kind]} tokens)"
                                                             if kind != SLIDING else "")
                                            for kind, n in counts.items())
        + f"; every layer also keeps a {window}-token sliding window of K = V ({d} wide, one KV head)",
    ]
    if buffers:
        notes.append(f"{len(buffers)} hash-routed MoE layer(s) (mlp_layer_types hash_moe) load a frozen tid2eid table "
                     f"({vocab} x {top_k} int64 each): buffers, not parameters")
    mtp = cfg.int("num_nextn_predict_layers", minimum=0)
    if mtp:
        notes.append(f"the checkpoint also stores {mtp} multi-token-prediction layer(s) (num_nextn_predict_layers) "
                     "that transformers does not instantiate; they are not counted")

    tied = cfg.bool("tie_word_embeddings")
    head = [
        TensorSpec("model.hc_head.hc_fn", (n_hc, n_hc * h), OTHER),
        TensorSpec("model.hc_head.hc_base", (n_hc,), OTHER),
        TensorSpec("model.hc_head.hc_scale", (1,), OTHER),
        *norm("model.norm", h, component=NORM),
        *([] if tied else lm_head(vocab, h)),
    ]
    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=layers,
        embedding=[token_embedding("model.embed_tokens.weight", vocab, h)],
        head=head,
        tie_word_embeddings=tied,
        max_position_embeddings=cfg.int("max_position_embeddings"),
        notes=tuple(notes),
        buffers=buffers,
        sdpa_supported=False,  # DeepseekV4PreTrainedModel: eager only (sinks, head_dim 512)
    )
