"""RWKV recurrent language models: rwkv (RWKV-4, in transformers), rwkv5 (Eagle) and rwkv6 (Finch), whose
Hub checkpoints (``RWKV/rwkv-5-world-*``, ``RWKV/v6-Finch-*-HF``) ship remote code: memest counts them from
config.json alone.

Sources: transformers ``models/rwkv/modeling_rwkv.py`` / ``configuration_rwkv.py`` (5.24); for RWKV-5 and -6
the classes of huggingface/transformers ``src/transformers/models/rwkv5/modeling_rwkv5.py`` (commit
00f480f6d99a4cac1988a5fce76b09166a84515f) and ``src/transformers/models/rwkv6/modeling_rwkv6.py`` /
``configuration_rwkv6.py`` (commit 4b0238f4d70cae752ed8f044be15ed3052a84db5), the code the RWKV Hub repos run.

Every block (``rwkv.blocks.n``): LayerNorms ``ln1`` and ``ln2`` (and ``pre_ln`` in block 0), a time mix
(``attention``) and a channel mix (``feed_forward``). With h = hidden_size, a = attention_hidden_size
(default h), i the channel-mix width, H heads of S = head size:

- RWKV-4 time mix: ``time_decay`` / ``time_first`` (a), ``time_mix_key`` / ``_value`` / ``_receptance``
  (1, 1, h), ``key`` / ``value`` / ``receptance`` (a, h), ``output`` (h, a); i defaults to 4 h;
- RWKV-5: the same plus ``time_mix_gate`` and ``gate (a, h)``; ``time_decay`` / ``time_faaaa`` (H, S);
  GroupNorm ``ln_x`` (h, weight and bias). The config's ``num_attention_heads`` is the head *size* S
  (``RwkvSelfAttention``: H = h // num_attention_heads); i defaults to int(3.5 h) // 32 x 32;
- RWKV-6: data-dependent mixing: ``time_maa_x`` / ``_w`` / ``_k`` / ``_v`` / ``_r`` / ``_g`` (1, 1, h),
  ``time_maa_w1 (h, 5 m)``, ``time_maa_w2 (5, m, h)`` (m = 32, 64 when h = 4096), ``time_decay (1, 1, a)``,
  ``time_decay_w1 (h, n)``, ``time_decay_w2 (n, a)`` (n = 64, 128 when h = 4096), ``time_faaaa (H, S)``
  with H = a // ``head_size``, the five projections and ``ln_x``; ``Rwkv6Config`` ignores
  ``intermediate_size`` (it sets None), so i = int(3.5 h) // 32 x 32 always;
- channel mix: ``time_mix_key`` / ``time_mix_receptance`` (RWKV-6: ``time_maa_k`` / ``time_maa_r``),
  ``key (i, h)``, ``receptance (h, h)``, ``value (h, i)``.

The model: ``rwkv.embeddings (V, h)``, ``rwkv.ln_out``, ``head (V, h)`` (untied by default).

RWKV-7 (``rwkv7``: the flash-linear-attention classes the ``fla-hub`` / RWKV-7 Hub repos run;
fla-org/flash-linear-attention @ bc3b101dcb713ddc5bd8924b66754eb68b5ccf89 ``fla/layers/rwkv7.py``,
``fla/models/rwkv7/modeling_rwkv7.py`` / ``configuration_rwkv7.py``, ``fla/layers/rwkv6.py`` ``LoRA``), with
H = h / head_dim heads, value width v_n = ``value_dim[n]`` (default h): ``model.layers.n`` has ``pre_norm`` (block
0, with ``norm_first``), ``attn_norm``, ``ffn_norm`` (LayerNorms, biased with ``norm_bias``); ``attn``:
``x_r/w/k/v/a/g (1, 1, h)``, ``k_k`` / ``k_a (h)``, ``r_k (H, head_dim)``, ``r_proj`` / ``k_proj (h, h)``,
``v_proj (v, h)``, ``o_proj (h, v)``, low-rank ``w_lora`` / ``a_lora`` (``lora.0 (r, h)``, ``lora.2 (h, r)`` +
bias), ``v_lora`` (to v, with bias; not in block 0), ``g_lora`` (to v, no bias), GroupNorm ``g_norm`` (v, weight
and bias); ``ffn``: ``x_k (h)``, ``key (i, h)``, ``value (h, i)``, i = ``intermediate_size`` or 4 h rounded up to
32. ``model.embeddings``, ``model.norm``, ``lm_head``. Its state per sequence: the token shifts of ``attn`` and
``ffn`` (2 h) and the recurrent state (H, head_dim, v / H) in float32 (``fla/ops/rwkv7/fused_recurrent.py``:
``ht`` float32).

**State, no KV cache.** Each sequence keeps per layer the token-shift inputs of the time mix and of the
channel mix (2 h at the model dtype) and the time mix's recurrent state in float32: RWKV-4 numerator,
denominator and running max, 3 x h (``RwkvModel.forward`` allocates five (b, h, L) tensors, the last three
float32); RWKV-5/6 one S x S matrix per head, H x S x S (``state_attn_kv``: (b, H, S, S, L) float32).
"""

from __future__ import annotations

from memest.errors import ConfigError
from memest.sources.config import HFConfig
from memest.sources.families._build import ATTN, MLP, intern, linear, lm_head, model_spec, norm, token_embedding
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec, Split, StateSpec, TensorSpec

# RwkvConfig / Rwkv5Config / Rwkv6Config defaults of the fields read here
_DEFAULTS: dict[str, dict[str, object]] = {
    "rwkv": {"vocab_size": 50277, "context_length": 1024, "attention_hidden_size": None, "intermediate_size": None,
             "tie_word_embeddings": False},
    "rwkv5": {"vocab_size": 65536, "num_attention_heads": 64, "attention_hidden_size": None,
              "intermediate_size": None, "tie_word_embeddings": False, "context_length": 4096},
    "rwkv6": {"vocab_size": 65536, "head_size": 64, "attention_hidden_size": None, "tie_word_embeddings": False},
    "rwkv7": {"vocab_size": 32000, "hidden_ratio": 4, "intermediate_size": None, "head_dim": 64, "num_heads": None,
              "decay_low_rank_dim": 64, "gate_low_rank_dim": 128, "a_low_rank_dim": 64, "v_low_rank_dim": 16,
              "max_position_embeddings": 2048, "norm_first": True, "norm_bias": True, "attn": None,
              "tie_word_embeddings": False, "value_dim": None},
}


def _width(cfg: HFConfig, key: str, fallback: int) -> int:
    return fallback if cfg.get(key, default=None) is None else cfg.int(key)


def _time_mix(cfg: HFConfig, version: str, h: int, a: int, heads: int, size: int) -> list[TensorSpec]:
    p = "attention."

    def vec(name: str, shape: tuple[int, ...]) -> TensorSpec:
        return TensorSpec(f"{p}{name}", shape, ATTN, Split.COL if shape[-1] == a and name.startswith("time_decay")
                          else Split.NONE)

    projections = ("receptance", "key", "value") + (("gate",) if version != "rwkv" else ())
    tensors = [t for name in projections for t in linear(f"{p}{name}", h, a, ATTN, Split.COL)]
    tensors += linear(f"{p}output", a, h, ATTN, Split.ROW)
    if version == "rwkv":
        tensors += [vec("time_decay", (a,)), vec("time_first", (a,))]
        tensors += [vec(f"time_mix_{x}", (1, 1, h)) for x in ("key", "value", "receptance")]
        return tensors
    tensors += norm(f"{p}ln_x", h, bias=True)  # GroupNorm(H, h)
    if version == "rwkv5":
        tensors += [vec("time_decay", (heads, size)), vec("time_faaaa", (heads, size))]
        tensors += [vec(f"time_mix_{x}", (1, 1, h)) for x in ("gate", "key", "value", "receptance")]
        return tensors
    mix, decay = (64, 128) if h == 4096 else (32, 64)  # Rwkv6SelfAttention: TIME_MIX / TIME_DECAY_EXTRA_DIM
    tensors += [vec(f"time_maa_{x}", (1, 1, h)) for x in ("x", "w", "k", "v", "r", "g")]
    tensors += [TensorSpec(f"{p}time_maa_w1", (h, 5 * mix), ATTN), TensorSpec(f"{p}time_maa_w2", (5, mix, h), ATTN),
                vec("time_decay", (1, 1, a)), TensorSpec(f"{p}time_decay_w1", (h, decay), ATTN),
                TensorSpec(f"{p}time_decay_w2", (decay, a), ATTN), vec("time_faaaa", (heads, size))]
    return tensors


def _channel_mix(version: str, h: int, i: int) -> list[TensorSpec]:
    p = "feed_forward."
    mixes = ("time_maa_k", "time_maa_r") if version == "rwkv6" else ("time_mix_key", "time_mix_receptance")
    return [
        *(TensorSpec(f"{p}{name}", (1, 1, h), MLP) for name in mixes),
        *linear(f"{p}key", h, i, MLP, Split.COL),
        *linear(f"{p}receptance", h, h, MLP, Split.NONE),
        *linear(f"{p}value", i, h, MLP, Split.ROW),
    ]


def _heads(cfg: HFConfig, version: str, h: int, a: int) -> tuple[int, int]:
    """(H, S) of an RWKV-5/6 time mix; (0, 0) for RWKV-4, which has no heads.

    Raises:
        ConfigError: the head size does not divide the width it splits.
    """
    if version == "rwkv":
        return 0, 0
    key, width, what = (("num_attention_heads", h, "hidden_size") if version == "rwkv5"
                        else ("head_size", a, "attention_hidden_size"))
    size = cfg.int(key)
    if width % size:
        raise ConfigError(f"config of {cfg.name!r}: {key} ({size}) is the head size of model_type {version!r} and must "
                          f"divide {what} ({width}); fix one of them")
    return width // size, size


def _lora(name: str, h: int, out: int, rank: int, *, bias: bool) -> list[TensorSpec]:
    """fla's ``LoRA``: ``lora.0 (rank, h)`` without bias, an activation, ``lora.2 (out, rank)``."""
    return [*linear(f"{name}.lora.0", h, rank, ATTN, Split.NONE), *linear(f"{name}.lora.2", rank, out, ATTN,
                                                                         Split.NONE, bias=bias)]


def _build_rwkv7(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of an rwkv7 (flash-linear-attention) config (see the module docstring).

    Raises:
        ConfigError: hybrid softmax-attention layers (``attn``), which memest does not count here; a head size
            that does not divide hidden_size; ``value_dim`` of the wrong length.
    """
    h = cfg.int("hidden_size")
    vocab = cfg.int("vocab_size")
    num_layers = cfg.int("num_hidden_layers")
    if cfg.get("attn", default=None) is not None:
        raise ConfigError(f"config of {cfg.name!r}: 'attn' = {cfg.get('attn', default=None)!r} makes some rwkv7 layers softmax "
                          "attention, which memest does not count; use a config without 'attn'")
    if cfg.get("head_dim", default=None) is not None:
        size = cfg.int("head_dim")
        heads = cfg.divide("hidden_size", h, "head_dim", size)
    else:
        heads = cfg.int("num_heads")
        size = cfg.divide("hidden_size", h, "num_heads", heads)
    given = cfg.get("value_dim", default=None)
    if given is None:
        values = [h] * num_layers
    elif isinstance(given, list):
        if len(given) != num_layers:
            raise ConfigError(f"config of {cfg.name!r}: value_dim lists {len(given)} widths for {num_layers} layers")
        values = [int(v) for v in given]
    else:
        values = [cfg.int("value_dim")] * num_layers
    width = cfg.get("intermediate_size", default=None)
    i = cfg.int("intermediate_size") if width is not None else 32 * -(-int(h * cfg.float("hidden_ratio")) // 32)
    bias = cfg.bool("norm_bias")
    ranks = {key: cfg.int(f"{key}_low_rank_dim") for key in ("decay", "gate", "a", "v")}

    def block(n: int) -> LayerSpec:
        v = values[n]
        attn = [
            *(TensorSpec(f"attn.x_{x}", (1, 1, h), ATTN) for x in "rwkvag"),
            TensorSpec("attn.k_k", (h,), ATTN), TensorSpec("attn.k_a", (h,), ATTN),
            TensorSpec("attn.r_k", (heads, size), ATTN),
            *linear("attn.r_proj", h, h, ATTN, Split.COL), *linear("attn.k_proj", h, h, ATTN, Split.COL),
            *linear("attn.v_proj", h, v, ATTN, Split.COL), *linear("attn.o_proj", v, h, ATTN, Split.ROW),
            *_lora("attn.w_lora", h, h, ranks["decay"], bias=True),
            *(_lora("attn.v_lora", h, v, ranks["v"], bias=True) if n else []),
            *_lora("attn.a_lora", h, h, ranks["a"], bias=True),
            *_lora("attn.g_lora", h, v, ranks["gate"], bias=False),
            *norm("attn.g_norm", v, bias=True),
        ]
        ffn = [TensorSpec("ffn.x_k", (h,), MLP), *linear("ffn.key", h, i, MLP, Split.COL),
               *linear("ffn.value", i, h, MLP, Split.ROW)]
        norms = [*(norm("pre_norm", h, bias=bias) if n == 0 and cfg.bool("norm_first") else []),
                 *norm("attn_norm", h, bias=bias), *norm("ffn_norm", h, bias=bias)]
        state = StateSpec(shift_channels=2 * h, ssm_elements=heads * size * (v // heads), ssm_dtype="float32")
        return LayerSpec(
            attention=AttentionSpec(kind="linear", num_heads=0, num_kv_heads=0, head_dim=0, rope="none", state=state),
            mlp=MLPSpec(gated=False, intermediate_size=i, activation="relu2"), norm="layer",
            tensors=(*norms, *attn, *ffn))

    kinds: dict[object, LayerSpec] = {}
    layers = [intern(kinds, (n == 0, values[n]), lambda n=n: block(n)) for n in range(num_layers)]
    tied = cfg.bool("tie_word_embeddings")
    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=layers,
        embedding=[token_embedding("model.embeddings.weight", vocab, h)],
        head=[*norm("model.norm", h, bias=bias), *([] if tied else lm_head(vocab, h))],
        tie_word_embeddings=tied,
        max_position_embeddings=cfg.int("max_position_embeddings"),
        notes=("RWKV keeps a fixed-size state per sequence (token shifts and the float32 time-mix state), "
               "no KV cache",),
    )


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of an rwkv / rwkv5 / rwkv6 / rwkv7 config."""
    version = cfg.model_type
    cfg = cfg.with_defaults(_DEFAULTS[version])
    if version == "rwkv7":
        return _build_rwkv7(cfg)
    h = cfg.int("hidden_size")
    vocab = cfg.int("vocab_size")
    num_layers = cfg.int("num_hidden_layers")
    a = _width(cfg, "attention_hidden_size", h)
    default_i = 4 * h if version == "rwkv" else int(h * 3.5) // 32 * 32
    i = default_i if version == "rwkv6" else _width(cfg, "intermediate_size", default_i)
    heads, size = _heads(cfg, version, h, a)
    if version == "rwkv":
        state = StateSpec(shift_channels=2 * h, ssm_elements=3 * h, ssm_dtype="float32")
    else:
        state = StateSpec(shift_channels=2 * h, ssm_elements=heads * size * size, ssm_dtype="float32")
    body = (*_time_mix(cfg, version, h, a, heads, size), *_channel_mix(version, h, i))
    attention = AttentionSpec(kind="linear", num_heads=0, num_kv_heads=0, head_dim=0, rope="none", state=state)
    mlp = MLPSpec(gated=False, intermediate_size=i, activation="relu2")

    def block(first: bool) -> LayerSpec:
        norms = [*(norm("pre_ln", h, bias=True) if first else []), *norm("ln1", h, bias=True),
                 *norm("ln2", h, bias=True)]
        return LayerSpec(attention=attention, mlp=mlp, norm="layer", tensors=(*norms, *body))

    rest = block(False)
    tied = cfg.bool("tie_word_embeddings")
    context = cfg.get("context_length", "max_position_embeddings", default=None)
    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[block(True), *[rest] * (num_layers - 1)],
        embedding=[token_embedding("rwkv.embeddings.weight", vocab, h)],
        head=[*norm("rwkv.ln_out", h, bias=True), *([] if tied else lm_head(vocab, h, name="head"))],
        tie_word_embeddings=tied,
        max_position_embeddings=int(context) if isinstance(context, int) and context > 0 else None,
        notes=("RWKV keeps a fixed-size state per sequence (token shifts and the float32 time-mix state), "
               "no KV cache",),
    )


__all__ = ["build"]
