"""A Hugging Face ``config.json`` with typed, checked getters.

Adapters read configs through :class:`HFConfig` so that a missing or malformed field always becomes
a one-line :class:`~memest.errors.ConfigError` naming the field, the model and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from memest.errors import ConfigError

_MISSING: Any = object()

MAX_DIMENSION = 2**31
"""Largest integer a config field may hold (a width, a vocabulary, a context length, a count): the
largest dimension of any released model is below 2^24 (vocabularies of 256k, contexts of 10M
tokens), and a tensor dimension beyond 2^31 is a typo or a hostile file, not a model."""

MAX_LAYERS = 10_000
"""Most layers a config may declare (the deepest released decoders have ~100-200); one bound so that
a mistyped ``num_hidden_layers`` (1e9) is refused at once instead of building a billion-layer spec."""

LAYER_COUNT_KEYS = frozenset({
    "num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_decoder_layers", "encoder_layers",
    "decoder_layers", "num_encoder_layers",
})
"""Config keys that count layers (bounded by :data:`MAX_LAYERS`)."""

MAX_PARAMETERS = 10**14
"""Most parameters a model may have (100 T; the largest released models have ~2 T): above it the
config's sizes are mistyped and every estimate would be nonsense (1e37 B)."""


NAMED_SOURCES = frozenset({"catalog", "hub", "given data"})
"""The sources that are no file: their configs are named by the model reference in messages."""


class HFConfig:
    """A config dict plus the name and source it was loaded from.

    Args:
        raw: The parsed config.json.
        name: The model reference, for messages and for the ModelSpec.
        source: Where it was read (``catalog``, a file path, ``hub``).
        note: What the user should know about how it was resolved (a catalog variant).
        code_from: The only place the model's own code (``auto_map``) may be loaded from, with
            ``--trust-remote-code``: the absolute path of the folder the config was read from, or
            the Hub repository it was fetched from; None when it has no such place.
    """

    def __init__(self, raw: Mapping[str, Any], *, name: str, source: str, note: str = "",
                 code_from: str | None = None) -> None:
        self.name = name
        self.source = source
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{self.what} is a {type(raw).__name__}, not a JSON object; pass a config.json")
        self.raw: dict[str, Any] = dict(raw)
        self.note = note
        self.code_from = code_from

    @property
    def what(self) -> str:
        """The config as messages name it: the file a local config was read from (the model's name is its
        folder's, which the user may not have written), else ``config of 'NAME'``."""
        if self.source in NAMED_SOURCES or self.source == self.name and not self.source.endswith(".json"):
            return f"config of {self.name!r}"
        return f"config file {self.source!r}"

    # ---- identity ----

    @property
    def model_type(self) -> str:
        """The ``model_type`` field (lower-case)."""
        value = self.raw.get("model_type")
        if not isinstance(value, str) or not value:
            raise ConfigError(
                f"{self.what} has no 'model_type'; add it (e.g. \"llama\") or pass a complete config.json"
            )
        return value

    @property
    def architecture(self) -> str:
        """The first class named in ``architectures`` (empty when the config names none)."""
        archs = self.raw.get("architectures") or []
        return str(archs[0]) if isinstance(archs, list) and archs else ""

    @property
    def text(self) -> HFConfig:
        """The language-model part: ``text_config`` of a multimodal config, else this config."""
        sub = self.raw.get("text_config")
        if isinstance(sub, Mapping):
            return HFConfig(sub, name=self.name, source=self.source, code_from=self.code_from)
        return self

    def sub(self, key: str, *, required: bool = True) -> HFConfig:
        """A nested config (``vision_config``, ...), which must exist unless not ``required`` (then an absent
        section is an empty config, whose class defaults apply)."""
        value = self.raw.get(key)
        if not isinstance(value, Mapping):
            if required:
                raise ConfigError(f"{self.what} has no {key!r} section; pass the complete config.json")
            value = {}
        return HFConfig(value, name=self.name, source=self.source, code_from=self.code_from)

    def with_defaults(self, defaults: Mapping[str, Any], *, aliases: Mapping[str, str] | None = None) -> HFConfig:
        """A copy in which absent fields take the transformers config class's defaults.

        transformers builds a model from ``ConfigClass(**config_json)``, so a field the JSON omits
        gets the class default, while a field the JSON sets to ``null`` stays None (and the class's
        ``__post_init__`` usually derives it, e.g. ``num_key_value_heads = num_attention_heads``);
        getters treat such a null as missing, so adapters pass that derivation as ``default=``.

        Args:
            defaults: Field name to class default, for the fields an adapter reads.
            aliases: The class's ``attribute_map`` (alias to stored field, e.g. ``{"hidden_size":
                "n_embd"}``): a value under the alias fills the field when the field is absent.
        """
        raw = dict(self.raw)
        for alias, field in (aliases or {}).items():
            if field not in raw and alias in raw:
                raw[field] = raw[alias]
        for key, value in defaults.items():
            if key not in raw:
                raw[key] = value
        return HFConfig(raw, name=self.name, source=self.source, note=self.note, code_from=self.code_from)

    # ---- typed getters: the first key present wins; aliases cover renamed fields ----

    def has(self, *keys: str) -> bool:
        """True when any of ``keys`` is present and not null."""
        return any(self.raw.get(k) is not None for k in keys)

    def get(self, *keys: str, default: Any = _MISSING) -> Any:
        """The value of the first of ``keys`` present and not null, else ``default``.

        Raises:
            ConfigError: none is present and no default was given.
        """
        for key in keys:
            value = self.raw.get(key)
            if value is not None:
                return value
        if default is _MISSING:
            names = " / ".join(repr(k) for k in keys)
            raise ConfigError(
                f"{self.what} (model_type {self.raw.get('model_type')!r}) lacks {names}; "
                "add it to the config.json"
            )
        return default

    def int(self, *keys: str, default: Any = _MISSING, minimum: int = 1, maximum: int | None = None) -> int:
        """An integer field, at least ``minimum`` and at most ``maximum``.

        ``maximum`` defaults to :data:`MAX_LAYERS` for a layer count (:data:`LAYER_COUNT_KEYS`) and
        :data:`MAX_DIMENSION` otherwise: every integer an adapter reads is bounded here, once.

        Raises:
            ConfigError: missing (without default), not an integer, or out of bounds.
        """
        value = self.get(*keys, default=default)
        if value is default and default is not _MISSING:
            return value  # type: ignore[no-any-return]
        key = next((k for k in keys if self.raw.get(k) is not None), keys[0])
        return checked_int(value, f"{self.what}: {key!r}", minimum=minimum,
                           maximum=maximum if maximum is not None else size_bound(key))

    def bool(self, *keys: str, default: Any = _MISSING) -> bool:
        """A boolean field.

        Raises:
            ConfigError: missing (without default) or not a boolean.
        """
        value = self.get(*keys, default=default)
        if not isinstance(value, bool):
            raise ConfigError(f"{self.what}: {keys[0]!r} is {value!r}; it must be true or false")
        return value

    def float(self, *keys: str, default: Any = _MISSING) -> float:
        """A numeric field.

        Raises:
            ConfigError: missing (without default) or not a number.
        """
        value = self.get(*keys, default=default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"{self.what}: {keys[0]!r} is {value!r}; it must be a finite number")
        return float(value)

    def str(self, *keys: str, default: Any = _MISSING) -> str:
        """A string field.

        Raises:
            ConfigError: missing (without default) or not a string.
        """
        value = self.get(*keys, default=default)
        if not isinstance(value, str):
            raise ConfigError(f"{self.what}: {keys[0]!r} is {value!r}; it must be a string")
        return value

    def divide(self, numerator_key: str, numerator: int, denominator_key: str, denominator: int) -> int:
        """``numerator // denominator``, which must be exact.

        Raises:
            ConfigError: the division leaves a remainder.
        """
        if numerator % denominator:
            raise ConfigError(
                f"{self.what}: {numerator_key} ({numerator}) is not divisible by "
                f"{denominator_key} ({denominator}); set 'head_dim' explicitly or fix the config"
            )
        return numerator // denominator


def size_bound(key: str) -> int:
    """The largest value an integer config field ``key`` may hold."""
    return MAX_LAYERS if key in LAYER_COUNT_KEYS else MAX_DIMENSION


def checked_int(value: Any, what: str, *, minimum: int = 1, maximum: int = MAX_DIMENSION) -> int:
    """``value`` as an int in ``[minimum, maximum]``; ``what`` names it in the message.

    Raises:
        ConfigError: ``value`` is not an integer (a bool, a string, a fraction, NaN) or out of bounds.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or int(value) != value:
        raise ConfigError(f"{what} is {_shown(value)}; it must be an integer")
    if value < minimum:
        raise ConfigError(f"{what} is {_shown(value)}; it must be at least {minimum}")
    if value > maximum:
        raise ConfigError(f"{what} is {_shown(value)}; memest accepts at most {maximum:,} "
                          f"({'layers' if maximum == MAX_LAYERS else '2^31'}): fix the config")
    return int(value)


def _shown(value: Any) -> str:
    """``repr(value)``, shortened for a one-line message (a 4,000-digit number, a long list)."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}… ({len(text):,} characters)"


def validate_fields(cfg: HFConfig) -> None:
    """Check the shared fields an adapter may not read itself, wherever they appear in the config.

    Adapters read their sizes through :meth:`HFConfig.int` (bounded there); this checks the rest of
    what transformers would use, so a malformed value is refused instead of silently ignored:

    - every integer size field of the text config (:data:`LAYER_COUNT_KEYS` and the usual widths),
      when present: an integer within bounds;
    - ``rope_theta``: a positive finite number; ``rope_scaling`` / ``rope_parameters``: an object
      (or null) whose ``factor`` / ``rope_theta``, when given, are positive finite numbers;
    - ``layer_types``: a list of strings, one per layer; ``mlp_only_layers``: a list of layer indices.

    Raises:
        ConfigError: a field is malformed; the message names it and the value.
    """
    for part in _parts(cfg):
        raw = part.raw
        for key in (*LAYER_COUNT_KEYS, *_SIZE_KEYS):
            if raw.get(key) is None:
                continue
            # Gemma 3n writes intermediate_size as one width per layer (Gemma3nTextConfig)
            values = raw[key] if key == "intermediate_size" and isinstance(raw[key], list) and raw[key] else [raw[key]]
            for n, value in enumerate(values):
                what = f"{key!r}" if len(values) == 1 and values[0] is raw[key] else f"'{key}[{n}]'"
                checked_int(value, f"{cfg.what}: {what}", minimum=1 if key in _POSITIVE_KEYS else 0,
                            maximum=size_bound(key))
        if raw.get("rope_theta") is not None:
            _positive_number(raw["rope_theta"], f"{cfg.what}: 'rope_theta'")
        for key in ("rope_scaling", "rope_parameters"):
            value = raw.get(key)
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise ConfigError(f"{cfg.what}: {key!r} is {_shown(value)}; it must be an object "
                                  "(e.g. {\"rope_type\": \"linear\", \"factor\": 2.0}) or null")
            entries = value.values() if value and all(isinstance(v, Mapping) for v in value.values()) else (value,)
            for entry in entries:  # transformers 5 keys rope_parameters by layer type
                for sub in ("factor", "rope_theta"):
                    if isinstance(entry, Mapping) and entry.get(sub) is not None:
                        _positive_number(entry[sub], f"{cfg.what}: '{key}.{sub}'")
        types = raw.get("layer_types")
        if types is not None:
            layers = raw.get("num_hidden_layers")
            if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
                raise ConfigError(f"{cfg.what}: 'layer_types' is {_shown(types)}; it must be a list of "
                                  "strings, one per layer (e.g. \"full_attention\", \"sliding_attention\")")
            if isinstance(layers, int) and not isinstance(layers, bool) and len(types) != layers:
                raise ConfigError(f"{cfg.what}: 'layer_types' must list {layers} entries (one per "
                                  f"layer), got {len(types)}")
        dense = raw.get("mlp_only_layers")
        if dense is not None and (not isinstance(dense, list) or not all(
                isinstance(n, int) and not isinstance(n, bool) and 0 <= n < MAX_LAYERS for n in dense)):
            raise ConfigError(f"{cfg.what}: 'mlp_only_layers' is {_shown(dense)}; it must be a list of "
                              "layer indices (e.g. [0, 1]) or []")


_SIZE_KEYS = (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size", "head_dim",
    "max_position_embeddings", "moe_intermediate_size", "num_experts", "num_local_experts", "n_routed_experts",
    "num_experts_per_tok", "n_embd", "n_head", "n_positions", "n_inner", "d_model", "d_ff", "d_kv", "ffn_dim",
    "shared_expert_intermediate_size", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
    "v_head_dim", "sliding_window",
)
"""Integer size fields checked by :func:`validate_fields` wherever they appear (not only where an adapter reads them)."""

_POSITIVE_KEYS = frozenset({"hidden_size", "n_embd", "d_model", "num_attention_heads", "n_head", "head_dim",
                            "vocab_size", "num_hidden_layers", "n_layer", "n_layers", "num_layers"})
"""Of those, the ones no model has zero of (the others, such as ``num_experts`` or
``sliding_window``, may be 0 for none): checked at least 1, the bound the adapters then hold them to."""


def _positive_number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{what} is {_shown(value)}; it must be a positive finite number")
    return float(value)


def _parts(cfg: HFConfig) -> tuple[HFConfig, ...]:
    """The config and its language-model part (``text_config``), each once."""
    text = cfg.text
    return (cfg,) if text is cfg else (cfg, text)


def check_parameter_count(name: str, num_params: int) -> None:
    """Refuse a model above :data:`MAX_PARAMETERS` (its sizes are mistyped).

    Raises:
        ConfigError: ``num_params`` exceeds the bound.
    """
    if num_params > MAX_PARAMETERS:
        raise ConfigError(f"config of {name!r} describes {num_params:.3g} parameters, more than memest's bound of "
                          f"{MAX_PARAMETERS:.0e} (100 trillion); its sizes are mistyped: fix the config")
