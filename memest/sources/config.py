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
        if not isinstance(raw, Mapping):
            raise ConfigError(f"config of {name!r} is a {type(raw).__name__}, not a JSON object; pass a config.json")
        self.raw: dict[str, Any] = dict(raw)
        self.name = name
        self.source = source
        self.note = note
        self.code_from = code_from

    # ---- identity ----

    @property
    def model_type(self) -> str:
        """The ``model_type`` field (lower-case)."""
        value = self.raw.get("model_type")
        if not isinstance(value, str) or not value:
            raise ConfigError(
                f"config of {self.name!r} has no 'model_type'; add it (e.g. \"llama\") or pass a complete config.json"
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

    def sub(self, key: str) -> HFConfig:
        """A nested config (``vision_config``, ...), which must exist."""
        value = self.raw.get(key)
        if not isinstance(value, Mapping):
            raise ConfigError(f"config of {self.name!r} has no {key!r} section; pass the complete config.json")
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
                f"config of {self.name!r} (model_type {self.raw.get('model_type')!r}) lacks {names}; "
                "add it to the config.json"
            )
        return default

    def int(self, *keys: str, default: Any = _MISSING, minimum: int = 1) -> int:
        """An integer field, at least ``minimum``.

        Raises:
            ConfigError: missing (without default), not an integer, or below ``minimum``.
        """
        value = self.get(*keys, default=default)
        if value is default and default is not _MISSING:
            return value  # type: ignore[no-any-return]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                or int(value) != value:
            raise ConfigError(f"config of {self.name!r}: {keys[0]!r} is {value!r}; it must be an integer")
        if value < minimum:
            raise ConfigError(f"config of {self.name!r}: {keys[0]!r} is {value!r}; it must be at least {minimum}")
        return int(value)

    def bool(self, *keys: str, default: Any = _MISSING) -> bool:
        """A boolean field.

        Raises:
            ConfigError: missing (without default) or not a boolean.
        """
        value = self.get(*keys, default=default)
        if not isinstance(value, bool):
            raise ConfigError(f"config of {self.name!r}: {keys[0]!r} is {value!r}; it must be true or false")
        return value

    def float(self, *keys: str, default: Any = _MISSING) -> float:
        """A numeric field.

        Raises:
            ConfigError: missing (without default) or not a number.
        """
        value = self.get(*keys, default=default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"config of {self.name!r}: {keys[0]!r} is {value!r}; it must be a finite number")
        return float(value)

    def str(self, *keys: str, default: Any = _MISSING) -> str:
        """A string field.

        Raises:
            ConfigError: missing (without default) or not a string.
        """
        value = self.get(*keys, default=default)
        if not isinstance(value, str):
            raise ConfigError(f"config of {self.name!r}: {keys[0]!r} is {value!r}; it must be a string")
        return value

    def divide(self, numerator_key: str, numerator: int, denominator_key: str, denominator: int) -> int:
        """``numerator // denominator``, which must be exact.

        Raises:
            ConfigError: the division leaves a remainder.
        """
        if numerator % denominator:
            raise ConfigError(
                f"config of {self.name!r}: {numerator_key} ({numerator}) is not divisible by "
                f"{denominator_key} ({denominator}); set 'head_dim' explicitly or fix the config"
            )
        return numerator // denominator
