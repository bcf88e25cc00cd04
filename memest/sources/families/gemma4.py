"""Google Gemma 4: gemma4 (multimodal) and gemma4_text.

Follows transformers ``models/gemma4/modeling_gemma4.py`` and ``configuration_gemma4.py`` (5.24).

Text layers (``Gemma4TextDecoderLayer``): Gemma 3's sandwich of four RMSNorms, per-head ``q_norm`` /
``k_norm`` (``v_norm`` has no scale, so no parameter), a GeGLU ``mlp``; layer n attends by
``layer_types[n]`` (``sliding_attention`` within ``sliding_window``, ``full_attention``; five sliding
then one full by default, the last layer always full: ``Gemma4TextConfig.__post_init__``). What differs
from Gemma 3:

- **global layers** take ``global_head_dim`` (default 512) and, with ``attention_k_eq_v``,
  ``num_global_key_value_heads`` KV heads (``per_layer_config``), and then have no ``v_proj``: K is
  used as V, so the cache holds one tensor (:attr:`AttentionSpec.kv_shared`);
- **KV sharing**: the last ``num_kv_shared_layers`` layers (``kv_sharing_modes`` "reuse") attend over
  the cache of the last earlier layer of their type and have no ``k_proj`` / ``v_proj`` / ``k_norm``:
  they cache nothing (:attr:`AttentionSpec.kv_reused`; vLLM ``kv_sharing_target_layer_name``); with
  ``use_double_wide_mlp`` their MLP is 2 i wide;
- **per-layer embeddings** (``hidden_size_per_layer_input`` p > 0: the small "E" models): the model has
  ``embed_tokens_per_layer (vocab_size_per_layer_input, L p)``, ``per_layer_model_projection (L p, h)``
  and ``per_layer_projection_norm (p)``; each layer ``per_layer_input_gate (p, h)``,
  ``per_layer_projection (h, p)`` and ``post_per_layer_input_norm (h)``;
- **MoE** (``enable_moe_block``): beside the dense MLP (every token, counted as a shared expert) a
  ``router`` (``proj (E, h)``, ``scale (h)``, ``per_expert_scale (E)``), fused ``experts``
  (``gate_up_proj (E, 2 m, h)``, ``down_proj (E, h, m)``, m = ``moe_intermediate_size``, top-k
  ``top_k_experts``) and three more RMSNorms.

Towers (``Gemma4Model``), when the config has them, in ``embedding`` as :attr:`Component.OTHER`:

- vision (``Gemma4VisionModel``): ``patch_embedder.input_proj (vh, 3 p^2)`` and a 2-D position table
  ``(2, position_embedding_size, vh)``; ``num_hidden_layers`` encoder layers of the text layer's shape
  (bias-free Q/K/V/O through ``Gemma4ClippableLinear``: ``.linear.weight``, q/k norms over head_dim,
  a GeGLU MLP, four norms); the pooler has no parameters; ``embed_vision.embedding_projection (h, vh)``;
- audio (``Gemma4AudioModel``, a Conformer): two stride-2 Conv2d 3x3 (bias-free) with bias-free
  LayerNorms, ``input_proj_linear (d, c0 / 4 x c1)``; per layer two macaron feed-forwards
  (``d -> 4 d -> d``, two norms each), attention (Q/K/V/``post`` d x d, ``relative_k_proj``,
  ``per_dim_scale (d / heads)``), a light conv (``linear_start (2 d, d)``, depthwise
  ``(d, 1, conv_kernel_size)``, ``linear_end``, two norms) and three norms; ``output_proj
  (output_proj_dims, d)`` with bias; ``embed_audio.embedding_projection (h, output_proj_dims)``.

``lm_head`` is tied to the text embedding (``tie_word_embeddings``, default true). Scalar buffers
(``layer_scalar``, the clipped linears' bounds) are left out.
"""

from __future__ import annotations

from memest.errors import ConfigError
from memest.sources.config import HFConfig
from memest.sources.families._build import (
    ATTN,
    OTHER,
    gated_mlp,
    intern,
    linear,
    norm,
    router,
    softcapped_text_spec,
    text_config_of,
    token_embedding,
)
from memest.sources.families._layers import listed_kinds
from memest.spec import AttentionSpec, Component, LayerSpec, MLPSpec, ModelSpec, Split, TensorSpec

# Gemma4TextConfig defaults and the kwargs its __post_init__ pops (global_head_dim, num_global_key_value_heads)
_TEXT_DEFAULTS: dict[str, object] = {
    "vocab_size": 262_144,
    "intermediate_size": 9216,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "sliding_window": 512,
    "use_bidirectional_attention": None,
    "final_logit_softcapping": None,
    "vocab_size_per_layer_input": 262_144,
    "hidden_size_per_layer_input": 256,
    "attention_k_eq_v": False,
    "num_kv_shared_layers": 0,
    "enable_moe_block": False,
    "use_double_wide_mlp": False,
    "global_head_dim": 512,
    "num_global_key_value_heads": None,
}
# Gemma4VisionConfig defaults
_VISION_DEFAULTS: dict[str, object] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 16,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
    "head_dim": 64,
    "patch_size": 16,
    "position_embedding_size": 10 * 1024,
}
# Gemma4AudioConfig defaults
_AUDIO_DEFAULTS: dict[str, object] = {
    "hidden_size": 1024,
    "num_hidden_layers": 12,
    "num_attention_heads": 8,
    "subsampling_conv_channels": [128, 32],
    "conv_kernel_size": 5,
    "output_proj_dims": 1536,
}
LAYER_TYPES = {"sliding_attention": "sliding", "full_attention": "full"}


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a gemma4 / gemma4_text config."""
    top, text, prefix = text_config_of(cfg, "gemma4_text", _TEXT_DEFAULTS)
    layers, embedding, head = _text_model(text, prefix=prefix)
    towers: list[TensorSpec] = []
    names = [] if top is text else [name for name in ("vision", "audio")
                                    if isinstance(top.raw.get(f"{name}_config"), dict)]
    h = text.int("hidden_size")
    if "vision" in names:
        vision = top.sub("vision_config").with_defaults(_VISION_DEFAULTS)
        towers += vision_tensors(vision, prefix="model.vision_tower.")
        towers += linear("model.embed_vision.embedding_projection", vision.int("hidden_size"), h, OTHER, Split.NONE)
    if "audio" in names:
        audio = top.sub("audio_config").with_defaults(_AUDIO_DEFAULTS)
        towers += audio_tensors(audio, prefix="model.audio_tower.")
        towers += linear("model.embed_audio.embedding_projection", audio.int("output_proj_dims"), h, OTHER,
                         Split.NONE)
    notes = (f"the {' and '.join(names)} tower{'s' if len(names) > 1 else ''} and "
             f"{'their projections are' if len(names) > 1 else 'its projection is'} counted in 'embedding' "
             "(component other)",) if names else ()
    return softcapped_text_spec(top, text, layers=layers, embedding=[*towers, *embedding], head=head, notes=notes)


def layer_types(text: HFConfig, num_layers: int) -> list[str]:
    """Each layer's type, ``sliding`` or ``full`` (``Gemma4TextConfig.__post_init__``: five sliding then one
    full without ``layer_types``; the last layer full whatever the list says).

    Raises:
        ConfigError: a ``layer_types`` entry other than ``sliding_attention`` / ``full_attention``.
    """
    if text.get("layer_types", default=None) is None:
        kinds = ["sliding" if (n + 1) % 6 else "full" for n in range(num_layers)]
    else:
        kinds = listed_kinds(text, "layer_types", num_layers, LAYER_TYPES)
    return [*kinds[:-1], "full"] if kinds else kinds


def kv_sharing(kinds: list[str], shared: int) -> list[bool]:
    """For each layer, True when it reuses an earlier layer's cache (``kv_sharing_modes`` "reuse": the last
    ``num_kv_shared_layers`` layers).

    Raises:
        ConfigError: ``num_kv_shared_layers`` out of range, or a shared layer whose type no earlier layer
            caches (transformers raises ValueError).
    """
    n = len(kinds)
    if not 0 <= shared <= n:
        raise ConfigError(f"num_kv_shared_layers is {shared}; it must be between 0 and num_hidden_layers ({n})")
    first = n - shared
    if 0 < first < n and set(kinds[first:]) - set(kinds[:first]):
        raise ConfigError(f"num_kv_shared_layers {shared}: layers {first}..{n - 1} reuse the cache of an earlier layer "
                          f"of their type, but no layer before {first} is {sorted(set(kinds[first:]) - set(kinds[:first]))}"
                          "; lower num_kv_shared_layers")
    return [i >= first for i in range(n)]


def _per_layer_overrides(text: HFConfig, kinds: list[str]) -> dict[int, dict[str, int]]:
    """``per_layer_config`` as given, else the config class's: global head_dim and KV heads on full layers."""
    given = text.get("per_layer_config", default=None)
    if given is not None:
        if not isinstance(given, dict):
            raise ConfigError(f"{text.what}: 'per_layer_config' must map layer indices to overrides, "
                              f"got {given!r}")
        out: dict[int, dict[str, int]] = {}
        for key, value in given.items():
            unknown = set(value) - {"head_dim", "num_key_value_heads"} if isinstance(value, dict) else {"?"}
            if unknown or not str(key).isdigit():
                raise ConfigError(f"{text.what}: per_layer_config[{key!r}] = {value!r}: memest reads "
                                  "only head_dim and num_key_value_heads per layer index")
            out[int(key)] = {k: int(v) for k, v in value.items()}
        return out
    override = {"head_dim": text.int("global_head_dim")}
    global_kv = text.get("num_global_key_value_heads", default=None)
    if text.bool("attention_k_eq_v") and global_kv is not None:
        override["num_key_value_heads"] = int(global_kv)
    return {n: override for n, kind in enumerate(kinds) if kind == "full"}


def _text_model(text: HFConfig, *, prefix: str) -> tuple[list[LayerSpec], list[TensorSpec], list[TensorSpec]]:
    """Layers, tensors before them (embeddings, the per-layer embedding path) and after (final norm)."""
    h = text.int("hidden_size")
    a = text.int("num_attention_heads")
    k = text.int("num_key_value_heads", default=a)
    d = text.int("head_dim")
    i = text.int("intermediate_size")
    num_layers = text.int("num_hidden_layers")
    bias = text.bool("attention_bias")
    per_layer = text.int("hidden_size_per_layer_input", minimum=0)
    bidirectional = text.get("use_bidirectional_attention", default=None) == "all"
    window = text.int("sliding_window")
    if bidirectional:
        window = window // 2 + 1  # Gemma4TextConfig.__post_init__ (exclusive bounds)
    kinds = layer_types(text, num_layers)
    reuse = kv_sharing(kinds, text.int("num_kv_shared_layers", minimum=0))
    overrides = _per_layer_overrides(text, kinds)
    k_eq_v = text.bool("attention_k_eq_v")
    moe = text.bool("enable_moe_block")
    double_wide = text.bool("use_double_wide_mlp")
    activation = text.str("hidden_activation")
    experts = text.int("num_experts") if moe else 0
    moe_width = text.int("moe_intermediate_size") if moe else 0
    top_k = text.int("top_k_experts") if moe else 0

    built: dict[object, LayerSpec] = {}

    def layer(n: int) -> LayerSpec:
        sliding = kinds[n] == "sliding"
        dn = overrides.get(n, {}).get("head_dim", d)
        kn = overrides.get(n, {}).get("num_key_value_heads", k)
        if kn <= 0 or a % kn:
            raise ConfigError(f"{text.what}: layer {n} has {kn} KV heads, which do not divide "
                              f"num_attention_heads ({a}); fix num_global_key_value_heads / per_layer_config")
        shared_v = k_eq_v and not sliding
        width = i * (2 if double_wide and reuse[n] else 1)
        key = (sliding, dn, kn, shared_v, reuse[n], width)

        def make() -> LayerSpec:
            attn = [*linear("self_attn.q_proj", h, a * dn, ATTN, Split.COL, bias=bias),
                    *norm("self_attn.q_norm", dn)]
            if not reuse[n]:
                attn += [*norm("self_attn.k_norm", dn),
                         *linear("self_attn.k_proj", h, kn * dn, ATTN, Split.KV, bias=bias),
                         *([] if shared_v else linear("self_attn.v_proj", h, kn * dn, ATTN, Split.KV, bias=bias))]
            attn += linear("self_attn.o_proj", a * dn, h, ATTN, Split.ROW, bias=bias)
            tensors = [*attn, *gated_mlp(h, width),
                       *(t for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                                        "post_feedforward_layernorm") for t in norm(name, h))]
            if per_layer:
                tensors += [*linear("per_layer_input_gate", h, per_layer, OTHER, Split.NONE),
                            *linear("per_layer_projection", per_layer, h, OTHER, Split.NONE),
                            *norm("post_per_layer_input_norm", h)]
            if moe:
                tensors += [TensorSpec("router.scale", (h,), Component.ROUTER),
                            TensorSpec("router.per_expert_scale", (experts,), Component.ROUTER),
                            *router("router.proj", h, experts),
                            TensorSpec("experts.gate_up_proj", (experts, 2 * moe_width, h), Component.EXPERTS,
                                       Split.COL),
                            TensorSpec("experts.down_proj", (experts, h, moe_width), Component.EXPERTS, Split.ROW),
                            *norm("post_feedforward_layernorm_1", h), *norm("post_feedforward_layernorm_2", h),
                            *norm("pre_feedforward_layernorm_2", h)]
            mlp = (MLPSpec(gated=True, intermediate_size=moe_width, activation=activation, num_experts=experts,
                           num_experts_per_tok=top_k, num_shared_experts=1, shared_intermediate_size=width)
                   if moe else MLPSpec(gated=True, intermediate_size=width, activation=activation))
            return LayerSpec(
                attention=AttentionSpec(num_heads=a, num_kv_heads=kn, head_dim=dn,
                                        sliding_window=window if sliding else None, causal=not bidirectional,
                                        qk_norm="head", kv_shared=shared_v, kv_reused=reuse[n]),
                mlp=mlp, norm="rms_fp32", norm_position="sandwich", tensors=tuple(tensors))

        return intern(built, key, make)

    vocab = text.int("vocab_size")
    embedding = [token_embedding(f"{prefix}embed_tokens.weight", vocab, h)]
    if per_layer:
        embedding += [
            TensorSpec(f"{prefix}embed_tokens_per_layer.weight",
                       (text.int("vocab_size_per_layer_input"), num_layers * per_layer), Component.EMBEDDING,
                       Split.NONE),
            *linear(f"{prefix}per_layer_model_projection", h, num_layers * per_layer, OTHER, Split.NONE),
            *norm(f"{prefix}per_layer_projection_norm", per_layer),
        ]
    return [layer(n) for n in range(num_layers)], embedding, norm(f"{prefix}norm", h)


def vision_tensors(vision: HFConfig, *, prefix: str) -> list[TensorSpec]:
    """Every parameter of a ``Gemma4VisionModel`` (see the module docstring)."""
    vh, vi = vision.int("hidden_size"), vision.int("intermediate_size")
    a, k, d = vision.int("num_attention_heads"), vision.int("num_key_value_heads"), vision.int("head_dim")
    p = vision.int("patch_size")
    tensors = [
        TensorSpec(f"{prefix}patch_embedder.position_embedding_table", (2, vision.int("position_embedding_size"), vh),
                   OTHER),
        *linear(f"{prefix}patch_embedder.input_proj", 3 * p * p, vh, OTHER, Split.NONE),
    ]
    for n in range(vision.int("num_hidden_layers")):
        q = f"{prefix}encoder.layers.{n}."
        tensors += [
            *linear(f"{q}self_attn.q_proj.linear", vh, a * d, OTHER, Split.COL),
            *linear(f"{q}self_attn.k_proj.linear", vh, k * d, OTHER, Split.COL),
            *linear(f"{q}self_attn.v_proj.linear", vh, k * d, OTHER, Split.COL),
            *linear(f"{q}self_attn.o_proj.linear", a * d, vh, OTHER, Split.ROW),
            *norm(f"{q}self_attn.q_norm", d, component=OTHER),
            *norm(f"{q}self_attn.k_norm", d, component=OTHER),
            *linear(f"{q}mlp.gate_proj.linear", vh, vi, OTHER, Split.COL),
            *linear(f"{q}mlp.up_proj.linear", vh, vi, OTHER, Split.COL),
            *linear(f"{q}mlp.down_proj.linear", vi, vh, OTHER, Split.ROW),
            *(t for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                             "post_feedforward_layernorm") for t in norm(f"{q}{name}", vh, component=OTHER)),
        ]
    return tensors


def audio_tensors(audio: HFConfig, *, prefix: str) -> list[TensorSpec]:
    """Every parameter of a ``Gemma4AudioModel`` (see the module docstring).

    Raises:
        ConfigError: ``subsampling_conv_channels`` is not two positive channel counts.
    """
    d = audio.int("hidden_size")
    heads = audio.int("num_attention_heads")
    channels = audio.get("subsampling_conv_channels")
    if not (isinstance(channels, list | tuple) and len(channels) == 2
            and all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in channels)):
        raise ConfigError(f"{audio.what}: audio_config.subsampling_conv_channels = {channels!r}; "
                          "it must be two positive channel counts")
    c0, c1 = channels
    kernel = audio.int("conv_kernel_size")
    out = audio.int("output_proj_dims")
    s = f"{prefix}subsample_conv_projection."
    tensors = [
        TensorSpec(f"{s}layer0.conv.weight", (c0, 1, 3, 3), OTHER), *norm(f"{s}layer0.norm", c0, component=OTHER),
        TensorSpec(f"{s}layer1.conv.weight", (c1, c0, 3, 3), OTHER), *norm(f"{s}layer1.norm", c1, component=OTHER),
        *linear(f"{s}input_proj_linear", c0 // 4 * c1, d, OTHER, Split.NONE),
    ]
    for n in range(audio.int("num_hidden_layers")):
        q = f"{prefix}layers.{n}."
        for ff in ("feed_forward1", "feed_forward2"):
            tensors += [*linear(f"{q}{ff}.ffw_layer_1.linear", d, 4 * d, OTHER, Split.COL),
                        *linear(f"{q}{ff}.ffw_layer_2.linear", 4 * d, d, OTHER, Split.ROW),
                        *norm(f"{q}{ff}.pre_layer_norm", d, component=OTHER),
                        *norm(f"{q}{ff}.post_layer_norm", d, component=OTHER)]
        tensors += [
            TensorSpec(f"{q}self_attn.per_dim_scale", (d // heads,), OTHER),
            *(t for name in ("q_proj", "k_proj", "v_proj", "post")
              for t in linear(f"{q}self_attn.{name}.linear", d, d, OTHER, Split.NONE)),
            *linear(f"{q}self_attn.relative_k_proj", d, d, OTHER, Split.NONE),
            *linear(f"{q}lconv1d.linear_start.linear", d, 2 * d, OTHER, Split.NONE),
            *linear(f"{q}lconv1d.linear_end.linear", d, d, OTHER, Split.NONE),
            TensorSpec(f"{q}lconv1d.depthwise_conv1d.weight", (d, 1, kernel), OTHER),
            *norm(f"{q}lconv1d.pre_layer_norm", d, component=OTHER),
            *norm(f"{q}lconv1d.conv_norm", d, component=OTHER),
            *(t for name in ("norm_pre_attn", "norm_post_attn", "norm_out") for t in norm(f"{q}{name}", d,
                                                                                            component=OTHER)),
        ]
    return [*tensors, *linear(f"{prefix}output_proj", d, out, OTHER, Split.NONE, bias=True)]


__all__ = ["audio_tensors", "build", "kv_sharing", "layer_types", "vision_tensors"]
