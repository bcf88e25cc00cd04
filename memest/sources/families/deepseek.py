"""DeepSeek decoders with multi-head latent attention (MLA): deepseek_v2, deepseek_v3, kimi_k2, and
the DeepSeek Sparse Attention (DSA) models deepseek_v32 (DeepSeek-V3.2) and glm_moe_dsa (GLM-5).

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

DSA (transformers ``models/deepseek_v32/modeling_deepseek_v32.py`` ``DeepseekV32Indexer``,
``models/glm_moe_dsa/modeling_glm_moe_dsa.py``): MLA as above (queries always low-rank) plus a
lightning indexer per layer: ``indexer.wq_b (n_i*d_i, r_q)``, ``indexer.wk (d_i, h)``, a LayerNorm
``indexer.k_norm (d_i)`` with bias and ``indexer.weights_proj (n_i, h)`` (n_i = ``index_n_heads``,
d_i = ``index_head_dim``); vLLM replicates them on every TP rank (``Indexer``: "no tensor parallel,
just replicated"). The indexer caches one key of d_i per token beside the MLA latent
(:attr:`AttentionSpec.index_head_dim`; its bytes: :mod:`memest.estimate.serving.kv`). A layer is
dense or MoE by ``mlp_layer_types`` (default: the first ``first_k_dense_replace`` dense). GLM-5's
``indexer_types`` (or ``index_topk_pattern`` / ``index_topk_freq`` + ``index_skip_topk_offset``, as
``GlmMoeDsaConfig`` derives them) mark ``shared`` layers, which reuse the previous layer's top-k
selection and have no indexer, so neither its tensors nor its key cache.

The router's ``e_score_correction_bias`` (DeepSeek-V3) is a buffer, not a parameter; the
multi-token-prediction layers a V3 checkpoint stores (``num_nextn_predict_layers``) are not
instantiated by transformers; neither is counted, and the spec's notes say so.
"""

from __future__ import annotations

from memest.errors import ConfigError
from memest.sources.config import HFConfig
from memest.sources.families._build import (
    ATTN,
    decoder_spec,
    expert_stack,
    gated_mlp,
    intern,
    linear,
    norm,
    router,
)
from memest.sources.families._layers import listed_kinds, pattern_kinds
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
_DEFAULTS["deepseek_v32"] = {  # DeepseekV32Config
    **_DEFAULTS["deepseek_v3"],
    "max_position_embeddings": 163840,
    "index_head_dim": 128,
    "index_n_heads": 64,
}
_DEFAULTS["glm_moe_dsa"] = {  # GlmMoeDsaConfig
    **_COMMON,
    "vocab_size": 154880,
    "intermediate_size": 12288,
    "moe_intermediate_size": 2048,
    "n_shared_experts": 1,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "max_position_embeddings": 202752,
    "mlp_bias": False,
    "q_lora_rank": 2048,
    "qk_nope_head_dim": 192,
    "v_head_dim": 256,
    "index_head_dim": 128,
    "index_n_heads": 32,
}
_ALIASES: dict[str, dict[str, str]] = {
    "deepseek_v2": {"num_experts": "n_routed_experts"},
    "deepseek_v3": {"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers"},
}
_ALIASES["kimi_k2"] = _ALIASES["deepseek_v3"]
_ALIASES["deepseek_v32"] = _ALIASES["glm_moe_dsa"] = {"num_local_experts": "n_routed_experts",
                                                     "num_experts": "n_routed_experts"}
DSA_TYPES = frozenset({"deepseek_v32", "glm_moe_dsa"})
"""The model_types with a DSA lightning indexer in every layer that runs one."""


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


def indexer_tensors(h: int, q_lora_rank: int, n_heads: int, head_dim: int) -> list[TensorSpec]:
    """The DSA lightning indexer of one layer (replicated on TP ranks; see the module docstring)."""
    return [
        *linear("self_attn.indexer.wq_b", q_lora_rank, n_heads * head_dim, ATTN, Split.NONE),
        *linear("self_attn.indexer.wk", h, head_dim, ATTN, Split.NONE),
        *norm("self_attn.indexer.k_norm", head_dim, bias=True),
        *linear("self_attn.indexer.weights_proj", h, n_heads, ATTN, Split.NONE),
    ]


def _indexed_layers(cfg: HFConfig, num_layers: int) -> list[bool]:
    """Which layers run their own indexer: every layer of deepseek_v32; glm_moe_dsa by
    ``indexer_types``, else as ``GlmMoeDsaConfig.__post_init__`` derives it (``index_topk_pattern``
    of F / S, else layer n is full iff ``max(n - offset + 1, 0) % freq == 0``)."""
    if cfg.model_type != "glm_moe_dsa":
        return [True] * num_layers
    if cfg.get("indexer_types", default=None) is not None:
        kinds = listed_kinds(cfg, "indexer_types", num_layers, {"full": "full", "shared": "shared"})
    elif isinstance(cfg.get("index_topk_pattern", default=None), str):
        kinds = pattern_kinds(cfg, "index_topk_pattern", {"F": "full", "S": "shared"})
    else:
        freq = max(cfg.int("index_topk_freq", default=1), 1)
        offset = cfg.int("index_skip_topk_offset", default=2, minimum=0)
        kinds = ["full" if max(n - offset + 1, 0) % freq == 0 else "shared" for n in range(num_layers)]
    if len(kinds) != num_layers:
        raise ConfigError(f"{cfg.what}: index_topk_pattern has {len(kinds)} symbols for "
                          f"{num_layers} layers; give one per layer")
    return [kind == "full" for kind in kinds]


def _moe_layers(cfg: HFConfig, num_layers: int, first_moe: int) -> list[bool]:
    """Which layers are MoE: ``mlp_layer_types`` (dense / sparse) where the family reads it, else
    every layer from ``first_k_dense_replace`` on."""
    if cfg.model_type in DSA_TYPES and cfg.get("mlp_layer_types", default=None) is not None:
        return [kind == "sparse" for kind in listed_kinds(cfg, "mlp_layer_types", num_layers,
                                                          {"dense": "dense", "sparse": "sparse"})]
    return [n >= first_moe for n in range(num_layers)]


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a deepseek_v2 / deepseek_v3 / kimi_k2 / deepseek_v32 / glm_moe_dsa config."""
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

    dsa = model_type in DSA_TYPES
    index_dim = cfg.int("index_head_dim") if dsa else 0
    indexed = _indexed_layers(cfg, num_layers)
    if dsa and q_lora_rank is None:
        raise ConfigError(f"{cfg.what}: q_lora_rank is null; model_type {model_type!r} always "
                          "compresses its queries (the indexer reads them); set q_lora_rank")

    def attention_of(with_indexer: bool) -> AttentionSpec:
        return AttentionSpec(
            kind="mla",
            num_heads=a,
            num_kv_heads=a,
            head_dim=nope + rope,
            v_head_dim=v,
            q_lora_rank=q_lora_rank,
            kv_lora_rank=kv_lora_rank,
            qk_rope_head_dim=rope,
            index_head_dim=index_dim if with_indexer else 0,
            rope="concat",
        )

    mla = mla_tensors(
        h,
        a,
        q_lora_rank=q_lora_rank,
        kv_lora_rank=kv_lora_rank,
        nope=nope,
        rope=rope,
        v=v,
        bias=cfg.bool("attention_bias"),
    )
    indexer = indexer_tensors(h, q_lora_rank, cfg.int("index_n_heads"), index_dim) if dsa and q_lora_rank else []
    norms = [*norm("input_layernorm", h), *norm("post_attention_layernorm", h)]
    kinds: dict[object, LayerSpec] = {}

    def dense(with_indexer: bool) -> LayerSpec:
        return LayerSpec(
            attention=attention_of(with_indexer),
            mlp=MLPSpec(gated=True, intermediate_size=dense_i, activation=activation),
            tensors=(*mla, *(indexer if with_indexer else ()), *gated_mlp(h, dense_i, bias=mlp_bias), *norms),
        )

    def moe(with_indexer: bool) -> LayerSpec:
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
            *mla,
            *(indexer if with_indexer else ()),
            *expert_stack(h, moe_i, num_experts),
            *router("mlp.gate", h, num_experts),
            *gated_mlp(h, moe_i * shared, prefix="mlp.shared_experts", bias=mlp_bias),
            *norms,
        )
        return LayerSpec(attention=attention_of(with_indexer), mlp=mlp, tensors=tensors)

    def layer(is_moe: bool, with_indexer: bool) -> LayerSpec:
        make = moe if is_moe else dense
        return intern(kinds, (is_moe, with_indexer), lambda: make(with_indexer))

    layers = [layer(is_moe, with_indexer)
              for is_moe, with_indexer in zip(_moe_layers(cfg, num_layers, first_moe), indexed, strict=True)]

    notes: list[str] = []
    mtp = cfg.int("num_nextn_predict_layers", default=0, minimum=0)
    if mtp:
        notes.append(
            f"the checkpoint also stores {mtp} multi-token-prediction layer(s) (num_nextn_predict_layers) that "
            "transformers does not instantiate; they are not counted (DeepSeek-V3/R1: 671B counted, 685B stored)"
        )
    if dsa:
        notes.append(
            f"DeepSeek Sparse Attention: {sum(indexed)} of {num_layers} layers run a lightning indexer "
            f"({cfg.int('index_n_heads')} heads of {index_dim}) that caches one {index_dim}-wide key per token beside "
            "the MLA latent (vLLM: fp8 keys with fp32 scales, whatever the KV dtype)"
        )
    if cfg.int("moe_layer_freq", default=1) != 1:
        notes.append(
            "moe_layer_freq is ignored, as transformers ignores it: every layer from first_k_dense_replace on is MoE"
        )

    return decoder_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=layers,
        max_position_embeddings=cfg.int("max_position_embeddings"),
        notes=tuple(notes),
    )
