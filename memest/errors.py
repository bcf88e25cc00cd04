"""The exceptions memest raises.

Every error a user can cause is a :class:`MemestError`. Its message is one line that names the
offending value (with ``!r``), states the rule and suggests the fix. The CLI prints it as
``Error: <message>`` and exits with code 2 (see ``memest.cli``); no traceback unless
``MEMEST_DEBUG=1``.
"""

from __future__ import annotations


class MemestError(Exception):
    """Base class of every error memest raises on bad input or a missing resource."""


class InputError(MemestError, ValueError):
    """A value the user gave breaks a rule (non-positive size, impossible parallelism, ...)."""


class UnknownModelError(MemestError, LookupError):
    """A model reference matches no catalog entry, local file or reachable Hub repository."""


class ConfigError(MemestError, ValueError):
    """A model config is malformed or lacks a field memest needs."""


class UnsupportedArchitectureError(MemestError):
    """A config's ``model_type`` has no analytic adapter and cannot be instantiated either."""


class UnknownDeviceError(MemestError, LookupError):
    """An accelerator name is not in the device catalog."""


class MissingDependencyError(MemestError, ImportError):
    """An optional dependency (torch, transformers, huggingface_hub, ...) is not installed."""
