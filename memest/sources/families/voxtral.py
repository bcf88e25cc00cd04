"""Mistral Voxtral: voxtral (a Whisper-style audio encoder, a projector and a Llama language model).

Follows transformers ``models/voxtral/modeling_voxtral.py`` and ``configuration_voxtral.py`` (5.24)
``VoxtralForConditionalGeneration``:

- ``model.language_model``: the Llama model of ``text_config`` (counted by :mod:`llama`), whose
  absent fields take ``VoxtralConfig``'s ``text_config`` init values (h 3072, 30 layers, 8 KV heads of
  128, i 8192, V 131072: Voxtral-Mini-3B) before the Llama class defaults; ``lm_head`` at the top
  level and never tied (the class declares no tied weights);
- ``model.audio_tower`` (``VoxtralEncoder``, Whisper's encoder): ``conv1 Conv1d(n_mels, d, 3)`` and
  ``conv2 Conv1d(d, d, 3, stride 2)`` with biases, a position table ``embed_positions
  (max_source_positions, d)`` (kept in fp32, ``_keep_in_fp32_modules_strict``), ``encoder_layers``
  pre-norm layers (``self_attn`` Q/V/out biased, K without bias, LayerNorms, ``fc1 (ffn, d)`` /
  ``fc2 (d, ffn)`` biased) and a final LayerNorm;
- ``model.multi_modal_projector`` (``VoxtralMultiModalProjector``): four encoder frames stacked
  (``intermediate_size`` wide, = 4 d in the released configs) through bias-free ``linear_1 (h, ffn)``
  and ``linear_2 (h, h)``.

The tower and projector are :attr:`Component.OTHER`, in ``embedding`` (they run before the first text
layer); the audio tokens they make are ordinary positions of the text model's KV cache.
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families import llama
from memest.sources.families._build import OTHER, linear, norm, with_towers
from memest.spec import ModelSpec, Split, TensorSpec

# VoxtralConfig.sub_configs_defaults["text_config"].init_kwargs (configuration_voxtral.py)
_TEXT_INIT: dict[str, object] = {
    "vocab_size": 131072,
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 30,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "head_dim": 128,
}
# VoxtralEncoderConfig defaults and its attribute_map (d_model, encoder_layers, ...)
_AUDIO_DEFAULTS: dict[str, object] = {
    "hidden_size": 1280,
    "intermediate_size": 5120,
    "num_hidden_layers": 32,
    "num_mel_bins": 128,
    "max_source_positions": 1500,
}
_AUDIO_ALIASES = {"d_model": "hidden_size", "encoder_layers": "num_hidden_layers", "encoder_ffn_dim": "intermediate_size"}


def audio_tensors(audio: HFConfig, *, prefix: str) -> list[TensorSpec]:
    """Every parameter of a ``VoxtralEncoder`` (see the module docstring)."""
    audio = audio.with_defaults(_AUDIO_DEFAULTS, aliases=_AUDIO_ALIASES)
    d, ffn, mels = audio.int("hidden_size"), audio.int("intermediate_size"), audio.int("num_mel_bins")
    tensors = [
        TensorSpec(f"{prefix}conv1.weight", (d, mels, 3), OTHER),
        TensorSpec(f"{prefix}conv1.bias", (d,), OTHER),
        TensorSpec(f"{prefix}conv2.weight", (d, d, 3), OTHER),
        TensorSpec(f"{prefix}conv2.bias", (d,), OTHER),
        TensorSpec(f"{prefix}embed_positions.weight", (audio.int("max_source_positions"), d), OTHER),
    ]
    for n in range(audio.int("num_hidden_layers")):
        p = f"{prefix}layers.{n}."
        tensors += [
            *linear(f"{p}self_attn.k_proj", d, d, OTHER, Split.COL),
            *linear(f"{p}self_attn.v_proj", d, d, OTHER, Split.COL, bias=True),
            *linear(f"{p}self_attn.q_proj", d, d, OTHER, Split.COL, bias=True),
            *linear(f"{p}self_attn.out_proj", d, d, OTHER, Split.ROW, bias=True),
            *norm(f"{p}self_attn_layer_norm", d, bias=True, component=OTHER),
            *linear(f"{p}fc1", d, ffn, OTHER, Split.COL, bias=True),
            *linear(f"{p}fc2", ffn, d, OTHER, Split.ROW, bias=True),
            *norm(f"{p}final_layer_norm", d, bias=True, component=OTHER),
        ]
    return [*tensors, *norm(f"{prefix}layer_norm", d, bias=True, component=OTHER)]


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a voxtral config."""
    text_raw = cfg.raw.get("text_config")
    text_raw = {**_TEXT_INIT, **(text_raw if isinstance(text_raw, dict) else {})}
    text = llama.build(HFConfig({**text_raw, "model_type": "llama"}, name=cfg.name, source=cfg.source))
    audio = cfg.sub("audio_config", required=False)
    ffn = audio.with_defaults(_AUDIO_DEFAULTS, aliases=_AUDIO_ALIASES).int("intermediate_size")
    h = text.hidden_size
    p = "model.multi_modal_projector."
    projector = [*linear(f"{p}linear_1", ffn, h, OTHER, Split.NONE), *linear(f"{p}linear_2", h, h, OTHER, Split.NONE)]
    return with_towers(
        cfg,
        text,
        towers=[*audio_tensors(audio, prefix="model.audio_tower."), *projector],
        tied=False,
        notes=("the Whisper-style audio encoder and its projector are counted in 'embedding' (component other)",),
    )


__all__ = ["audio_tensors", "build"]
