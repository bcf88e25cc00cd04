"""Google Gemma 3n: gemma3n (text, vision and audio) and gemma3n_text.

Follows transformers ``models/gemma3n/modeling_gemma3n.py`` and ``configuration_gemma3n.py`` (5.24).

Text layers (``Gemma3nTextDecoderLayer``), with h = hidden_size, a heads / k KV heads of d = head_dim,
i_n = ``intermediate_size[n]`` (one width for all layers or one per layer), p = hidden_size_per_layer_input,
m = altup_num_inputs, r = laurel_rank:

- ``self_attn``: ``q_proj (a d, h)``, ``q_norm (d)``, ``o_proj (h, a d)``, and, except in the last
  ``num_kv_shared_layers`` layers (``kv_sharing_modes`` "reuse", which attend over the cache of the last
  earlier layer of their type and cache nothing: :attr:`AttentionSpec.kv_reused`), ``k_proj`` / ``v_proj``
  ``(k d, h)`` and ``k_norm (d)`` (``v_norm`` has no scale); layer n attends by ``layer_types[n]``
  (``sliding_attention`` within ``sliding_window``, ``full_attention``; by default every fifth layer full:
  ``Gemma3nTextConfig.__post_init__``, the last layer not forced);
- a GeGLU ``mlp`` i_n wide; four RMSNorms (Gemma 3's sandwich);
- AltUp (``altup``): ``correct_output_scale (h)``, ``correction_coefs (m, m)``, ``prediction_coefs (m^2, m)``,
  ``modality_router (m, h)``, ``router_norm (h)``;
- LAuReL (``laurel``): ``linear_left (r, h)``, ``linear_right (h, r)``, ``post_laurel_norm (h)``;
- per-layer input: ``per_layer_input_gate (p, h)``, ``per_layer_projection (h, p)``,
  ``post_per_layer_input_norm (h)``.

The text model: ``embed_tokens (V, h)``, the per-layer embeddings (PLE) ``embed_tokens_per_layer
(vocab_size_per_layer_input, L p)``, ``per_layer_model_projection (L p, h)``, ``per_layer_projection_norm (p)``
and m - 1 ``altup_projections (h, h)`` before the layers; ``norm`` and m - 1 ``altup_unembed_projections (h, h)``
after them. ``lm_head`` is tied to ``embed_tokens`` by default.

Towers (``Gemma3nModel``), in ``embedding`` as :attr:`Component.OTHER`:

- audio (``Gemma3nAudioEncoder``, the USM Conformer) of width D: ``subsample_conv_projection`` (two bias-free
  Conv2d of ``sscp_conv_channel_size`` channels with ``sscp_conv_kernel_size`` kernels, each with a
  cumulative-group-norm scale, then ``input_proj_linear (D, c1 x f)`` where f is ``input_feat_size`` after two
  convolutions padded by one on each side: f -> (f + 2 - kw) // sw + 1); per conformer block two feed-forwards
  (``ffw_layer_1 (4 D, D)``, ``ffw_layer_2``, two norms), attention (``pre_attn_norm``, ``q/k/v_proj (D, D)``,
  ``per_dim_scale (D / heads)``, ``relative_position_embedding.pos_proj (D, D)``, ``post (D, D)``,
  ``post_norm``), a light conv (``pre_layer_norm``, ``linear_start (2 D, D)``, depthwise ``(D, 1,
  conf_conv_kernel_size)``, ``conv_norm``, ``linear_end (D, D)``) and ``norm``;
- vision: a timm model named by ``vision_config.architecture`` (``TimmWrapperModel``); its parameter count is
  :data:`TIMM_TOWERS`' (one tensor stands for the tower);
- ``embed_vision`` / ``embed_audio`` (``Gemma3nMultimodalEmbedder``): ``embedding (vocab_size, width)``, two
  norms of the tower width and ``embedding_projection (h, width)``.

AltUp keeps m copies of the hidden state through every layer (``hidden_states`` is (m, b, s, h)); the
activation estimates count one.
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
    softcapped_text_spec,
    text_config_of,
    token_embedding,
)
from memest.sources.families._layers import listed_kinds
from memest.sources.families.gemma4 import LAYER_TYPES, kv_sharing
from memest.spec import AttentionSpec, Component, LayerSpec, MLPSpec, ModelSpec, Split, TensorSpec

# Gemma3nTextConfig defaults (the E4B geometry)
_TEXT_DEFAULTS: dict[str, object] = {
    "vocab_size": 262_400,
    "intermediate_size": 16_384,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 32_768,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "sliding_window": 512,
    "final_logit_softcapping": 30.0,
    "vocab_size_per_layer_input": 262_144,
    "hidden_size_per_layer_input": 256,
    "altup_num_inputs": 4,
    "num_kv_shared_layers": 15,
    "laurel_rank": 64,
}
# Gemma3nAudioConfig defaults
_AUDIO_DEFAULTS: dict[str, object] = {
    "vocab_size": 128,
    "input_feat_size": 128,
    "hidden_size": 1536,
    "conf_num_attention_heads": 8,
    "conf_num_hidden_layers": 12,
    "conf_conv_kernel_size": 5,
    "sscp_conv_channel_size": [128, 32],
    "sscp_conv_kernel_size": [[3, 3], [3, 3]],
    "sscp_conv_stride_size": [[2, 2], [2, 2]],
}
# Gemma3nVisionConfig defaults
_VISION_DEFAULTS: dict[str, object] = {"architecture": "mobilenetv5_300m_enc", "hidden_size": 2048, "vocab_size": 128}

TIMM_TOWERS: dict[str, int] = {"mobilenetv5_300m_enc": 294_126_912}
"""Parameters of the timm vision towers Gemma 3n configs name (``vision_config.architecture``): counted on
the meta device, ``sum(p.numel() for p in timm.create_model("mobilenetv5_300m_enc", pretrained=False,
num_classes=0).parameters())`` with timm 1.0.31 (``timm/models/mobilenetv5.py``, ``MobileNetV5Encoder``: 548
tensors), equal to ``Gemma3nModel.vision_tower`` of transformers 5.24 built from the default config. The
architecture is timm's code, not the config's fields, so memest cannot derive it from config.json."""


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a gemma3n / gemma3n_text config.

    Raises:
        ConfigError: a ``layer_types`` entry other than ``sliding_attention`` / ``full_attention``, an
            ``intermediate_size`` list of the wrong length, ``num_kv_shared_layers`` out of range, a vision
            tower memest does not know, malformed audio convolution settings.
    """
    top, text, prefix = text_config_of(cfg, "gemma3n_text", _TEXT_DEFAULTS)
    layers, embedding, head = _text_model(text, prefix=prefix)
    towers: list[TensorSpec] = []
    notes: tuple[str, ...] = ()
    if top is not text:
        h = text.int("hidden_size")
        vision = top.sub("vision_config", required=False).with_defaults(_VISION_DEFAULTS)
        audio = top.sub("audio_config", required=False).with_defaults(_AUDIO_DEFAULTS)
        towers = [
            _timm_tower(vision),
            *audio_tensors(audio, prefix="model.audio_tower."),
            *_embedder(vision, h, prefix="model.embed_vision."),
            *_embedder(audio, h, prefix="model.embed_audio."),
        ]
        notes = ("the MobileNet-v5 vision tower, the Conformer audio tower and their embedders are counted in "
                 "'embedding' (component other); the vision tower as one tensor of its timm parameter count",)
    return softcapped_text_spec(
        top, text, layers=layers, embedding=[*towers, *embedding], head=head,
        notes=(*notes, f"AltUp carries {text.int('altup_num_inputs')} copies of the hidden state through every "
                       "layer; the activation estimate counts one"),
    )


def _widths(text: HFConfig, num_layers: int) -> list[int]:
    """``intermediate_size`` per layer (``Gemma3nTextConfig.__post_init__``: one value repeats)."""
    given = text.get("intermediate_size")
    if isinstance(given, list):
        if len(given) != num_layers:
            raise ConfigError(f"{text.what}: intermediate_size lists {len(given)} widths for "
                              f"{num_layers} layers; give one per layer or a single number")
        return [_positive(text, f"intermediate_size[{n}]", w) for n, w in enumerate(given)]
    return [text.int("intermediate_size")] * num_layers


def _positive(cfg: HFConfig, what: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{cfg.what}: {what} = {value!r}; it must be a positive integer")
    return value


def _text_model(text: HFConfig, *, prefix: str) -> tuple[list[LayerSpec], list[TensorSpec], list[TensorSpec]]:
    """Layers, tensors before them (embeddings, PLE, AltUp projections) and after (final norm, AltUp
    unembedding)."""
    h = text.int("hidden_size")
    a = text.int("num_attention_heads")
    k = text.int("num_key_value_heads", default=a)
    d = text.int("head_dim")
    num_layers = text.int("num_hidden_layers")
    bias = text.bool("attention_bias")
    per_layer = text.int("hidden_size_per_layer_input")
    m = text.int("altup_num_inputs")
    rank = text.int("laurel_rank")
    window = text.int("sliding_window")
    widths = _widths(text, num_layers)
    if text.get("layer_types", default=None) is None:
        kinds = ["full" if (n + 1) % 5 == 0 else "sliding" for n in range(num_layers)]
    else:
        kinds = listed_kinds(text, "layer_types", num_layers, LAYER_TYPES)
    reuse = kv_sharing(kinds, text.int("num_kv_shared_layers", minimum=0))
    activation = text.str("hidden_activation")
    common = [
        *(t for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                         "post_feedforward_layernorm") for t in norm(name, h)),
        TensorSpec("altup.correct_output_scale", (h,), OTHER),
        *linear("altup.correction_coefs", m, m, OTHER, Split.NONE),
        *linear("altup.prediction_coefs", m, m * m, OTHER, Split.NONE),
        *linear("altup.modality_router", h, m, OTHER, Split.NONE),
        *norm("altup.router_norm", h, component=OTHER),
        *linear("laurel.linear_left", h, rank, OTHER, Split.NONE),
        *linear("laurel.linear_right", rank, h, OTHER, Split.NONE),
        *norm("laurel.post_laurel_norm", h, component=OTHER),
        *linear("per_layer_input_gate", h, per_layer, OTHER, Split.NONE),
        *linear("per_layer_projection", per_layer, h, OTHER, Split.NONE),
        *norm("post_per_layer_input_norm", h),
    ]
    built: dict[object, LayerSpec] = {}

    def layer(n: int) -> LayerSpec:
        sliding = kinds[n] == "sliding"

        def make() -> LayerSpec:
            attn = [*linear("self_attn.q_proj", h, a * d, ATTN, Split.COL, bias=bias), *norm("self_attn.q_norm", d)]
            if not reuse[n]:
                attn += [*linear("self_attn.k_proj", h, k * d, ATTN, Split.KV, bias=bias),
                         *linear("self_attn.v_proj", h, k * d, ATTN, Split.KV, bias=bias),
                         *norm("self_attn.k_norm", d)]
            attn += linear("self_attn.o_proj", a * d, h, ATTN, Split.ROW, bias=bias)
            return LayerSpec(
                attention=AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d,
                                        sliding_window=window if sliding else None, qk_norm="head",
                                        kv_reused=reuse[n]),
                mlp=MLPSpec(gated=True, intermediate_size=widths[n], activation=activation),
                norm="rms_fp32", norm_position="sandwich",
                tensors=(*attn, *gated_mlp(h, widths[n]), *common))

        return intern(built, (sliding, reuse[n], widths[n]), make)

    vocab = text.int("vocab_size")
    embedding = [
        token_embedding(f"{prefix}embed_tokens.weight", vocab, h),
        TensorSpec(f"{prefix}embed_tokens_per_layer.weight",
                   (text.int("vocab_size_per_layer_input"), num_layers * per_layer), Component.EMBEDDING,
                   Split.VOCAB),  # vLLM Gemma3nTextModel: a VocabParallelEmbedding
        # vLLM Gemma3nTextModel: ColumnParallelLinear (gather_output) for these projections
        *linear(f"{prefix}per_layer_model_projection", h, num_layers * per_layer, OTHER, Split.COL),
        *norm(f"{prefix}per_layer_projection_norm", per_layer),
        *(t for j in range(m - 1) for t in linear(f"{prefix}altup_projections.{j}", h, h, OTHER, Split.COL)),
    ]
    head = [*norm(f"{prefix}norm", h),
            *(t for j in range(m - 1) for t in linear(f"{prefix}altup_unembed_projections.{j}", h, h, OTHER,
                                                      Split.COL))]
    return [layer(n) for n in range(num_layers)], embedding, head


def _timm_tower(vision: HFConfig) -> TensorSpec:
    """The vision tower as one tensor of :data:`TIMM_TOWERS`' count.

    Raises:
        ConfigError: an architecture memest has not counted.
    """
    arch = vision.get("architecture")
    if arch not in TIMM_TOWERS:
        raise ConfigError(f"{vision.what}: vision_config.architecture = {arch!r} is a timm model memest "
                          f"has not counted; known: {', '.join(map(repr, TIMM_TOWERS))}")
    return TensorSpec("model.vision_tower.timm_model", (TIMM_TOWERS[str(arch)],), OTHER)


def _pairs(audio: HFConfig, key: str) -> list[tuple[int, int]]:
    value = audio.get(key)
    if not (isinstance(value, list | tuple) and len(value) == 2
            and all(isinstance(v, list | tuple) and len(v) == 2
                    and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v) for v in value)):
        raise ConfigError(f"{audio.what}: audio_config.{key} = {value!r}; it must be two pairs of positive "
                          "integers")
    return [(int(v[0]), int(v[1])) for v in value]


def audio_tensors(audio: HFConfig, *, prefix: str) -> list[TensorSpec]:
    """Every parameter of a ``Gemma3nAudioEncoder`` (see the module docstring).

    Raises:
        ConfigError: ``sscp_conv_channel_size`` / ``_kernel_size`` / ``_stride_size`` malformed, or the width
            not a multiple of the heads.
    """
    dim = audio.int("hidden_size")
    heads = audio.int("conf_num_attention_heads")
    channels = audio.get("sscp_conv_channel_size")
    if not (isinstance(channels, list | tuple) and len(channels) == 2
            and all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in channels)):
        raise ConfigError(f"{audio.what}: audio_config.sscp_conv_channel_size = {channels!r}; it must be "
                          "two positive channel counts")
    kernels, strides = _pairs(audio, "sscp_conv_kernel_size"), _pairs(audio, "sscp_conv_stride_size")
    if dim % heads:
        raise ConfigError(f"{audio.what}: audio_config.hidden_size ({dim}) is not a multiple of "
                          f"conf_num_attention_heads ({heads})")
    freq = audio.int("input_feat_size")
    for (_, kw), (_, sw) in zip(kernels, strides, strict=True):
        freq = (freq + 2 - kw) // sw + 1  # Gemma3nAudioSubSampleConvProjection: padding 1 each side
    c0, c1 = channels
    s = f"{prefix}subsample_conv_projection."
    tensors = [
        TensorSpec(f"{s}conv_0.conv.weight", (c0, 1, *kernels[0]), OTHER),
        TensorSpec(f"{s}conv_0.norm.weight", (c0,), OTHER),
        TensorSpec(f"{s}conv_1.conv.weight", (c1, c0, *kernels[1]), OTHER),
        TensorSpec(f"{s}conv_1.norm.weight", (c1,), OTHER),
        *linear(f"{s}input_proj_linear", c1 * freq, dim, OTHER, Split.NONE),
    ]
    kernel = audio.int("conf_conv_kernel_size")
    for n in range(audio.int("conf_num_hidden_layers")):
        q = f"{prefix}conformer.{n}."
        for ff in ("ffw_layer_start", "ffw_layer_end"):
            tensors += [*norm(f"{q}{ff}.pre_layer_norm", dim, component=OTHER),
                        *linear(f"{q}{ff}.ffw_layer_1", dim, 4 * dim, OTHER, Split.NONE),
                        *linear(f"{q}{ff}.ffw_layer_2", 4 * dim, dim, OTHER, Split.NONE),
                        *norm(f"{q}{ff}.post_layer_norm", dim, component=OTHER)]
        tensors += [
            *norm(f"{q}attention.pre_attn_norm", dim, component=OTHER),
            TensorSpec(f"{q}attention.attn.per_dim_scale", (dim // heads,), OTHER),
            *linear(f"{q}attention.attn.relative_position_embedding.pos_proj", dim, dim, OTHER, Split.NONE),
            *(t for name in ("q_proj", "k_proj", "v_proj")
              for t in linear(f"{q}attention.attn.{name}", dim, dim, OTHER, Split.NONE)),
            *linear(f"{q}attention.post", dim, dim, OTHER, Split.NONE),
            *norm(f"{q}attention.post_norm", dim, component=OTHER),
            *norm(f"{q}lconv1d.pre_layer_norm", dim, component=OTHER),
            *linear(f"{q}lconv1d.linear_start", dim, 2 * dim, OTHER, Split.NONE),
            TensorSpec(f"{q}lconv1d.depthwise_conv1d.weight", (dim, 1, kernel), OTHER),
            *norm(f"{q}lconv1d.conv_norm", dim, component=OTHER),
            *linear(f"{q}lconv1d.linear_end", dim, dim, OTHER, Split.NONE),
            *norm(f"{q}norm", dim, component=OTHER),
        ]
    return tensors


def _embedder(tower: HFConfig, h: int, *, prefix: str) -> list[TensorSpec]:
    """A ``Gemma3nMultimodalEmbedder``: hard-token embedding, two norms of the tower width, the projection to h
    (its post-projection norm has no scale)."""
    width = tower.int("hidden_size")
    return [
        TensorSpec(f"{prefix}embedding.weight", (tower.int("vocab_size"), width), OTHER),
        *norm(f"{prefix}hard_embedding_norm", width, component=OTHER),
        *norm(f"{prefix}soft_embedding_norm", width, component=OTHER),
        *linear(f"{prefix}embedding_projection", width, h, OTHER, Split.NONE),
    ]


__all__ = ["TIMM_TOWERS", "audio_tensors", "build"]
