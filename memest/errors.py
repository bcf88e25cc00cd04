"""The exceptions memest raises.

Every error a user can cause is a :class:`MemestError`. Its message is one line that names the
offending value (with ``!r``), states the rule and suggests the fix. The CLI prints it as
``Error: <message>`` and exits with code 2 (see ``memest.cli``); no traceback unless
``MEMEST_DEBUG=1``.
"""

from __future__ import annotations

import re
from collections.abc import Callable


class MemestError(Exception):
    """Base class of every error memest raises on bad input or a missing resource.

    With ``field`` (the setting or option at fault, e.g. ``"seq_len"``) the message is a template
    whose ``{name}`` placeholders name settings: ``str()`` renders them as keywords (``seq_len``, the
    Python API's names), :meth:`render` as the caller names them (the CLI: ``--seq-len``). Without it
    the message is plain text. The library's messages name no CLI flag.

    Attributes:
        field: The setting at fault, or None.
        template: The message with its placeholders (the plain message when ``field`` is None).
    """

    def __init__(self, message: str = "", *, field: str | None = None) -> None:
        self.field = field
        self.template = message
        super().__init__(self.render(keyword) if field is not None else message)

    def render(self, name: Callable[[str], str | None]) -> str:
        """The message with every placeholder ``{setting}`` replaced by ``name(setting)`` (left as it
        is where that returns None)."""
        if self.field is None:
            return self.template
        return _PLACEHOLDER.sub(lambda m: name(m.group(1)) or m.group(0), self.template)

    def named(self, name: Callable[[str], str | None]) -> MemestError:
        """The same error with its message rendered by ``name`` (the CLI's flags); ``field`` kept."""
        out = type(self)(self.render(name))
        out.field = self.field
        return out


class InputError(MemestError, ValueError):
    """A value the user gave breaks a rule (non-positive size, impossible parallelism, ...); its
    message names settings as ``{field}`` placeholders (see :class:`MemestError`)."""


_PLACEHOLDER = re.compile(r"\{([a-z][a-z0-9_]*)\}")


def keyword(setting: str) -> str:
    """A setting as the Python API names it: its keyword, the mode as ``mode``."""
    return {"train": "mode='train'", "serve": "mode='serve'", "finetune": "mode"}.get(setting, setting)


class UnknownModelError(InputError, LookupError):
    """A model reference matches no catalog entry, local file or reachable Hub repository: bad input, so an
    :class:`InputError` (``field`` ``"model"`` unless the message names another setting), and a
    ``LookupError``."""

    def __init__(self, message: str = "", *, field: str | None = "model") -> None:
        super().__init__(message, field=field)


class ConfigError(MemestError, ValueError):
    """A model config is malformed or lacks a field memest needs."""


class UnsupportedArchitectureError(MemestError):
    """A config's ``model_type`` has no analytic adapter and cannot be instantiated either."""


class UnknownDeviceError(InputError, LookupError):
    """An accelerator name is not in the device catalog (nor a size): bad input, so an :class:`InputError`
    (``field`` ``"gpu"``, the keyword that names the device), and a ``LookupError``."""

    def __init__(self, message: str = "", *, field: str | None = "gpu") -> None:
        super().__init__(message, field=field)


class MissingDependencyError(MemestError, ImportError):
    """An optional dependency (torch, transformers, huggingface_hub, ...) is not installed."""
