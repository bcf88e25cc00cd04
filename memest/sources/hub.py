"""Model references resolved on the Hugging Face Hub: config.json only, never weights."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from memest.errors import ConfigError, MissingDependencyError, UnknownModelError


def hub_offline() -> bool:
    """True when the environment forbids Hub access (``HF_HUB_OFFLINE`` or ``MEMEST_OFFLINE``)."""
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in ("HF_HUB_OFFLINE", "MEMEST_OFFLINE"))


class HubUnreachableError(UnknownModelError):
    """The Hub cannot be reached from this machine (no network, DNS failure, firewall)."""


def _check_reachable(timeout: float = 3.0) -> None:
    """Fail fast when the Hub's host cannot be reached (huggingface_hub would retry for a minute).

    Raises:
        HubUnreachableError: DNS or TCP connect to the endpoint fails within ``timeout`` seconds.
    """
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    parsed = urlparse(endpoint)
    host, port = parsed.hostname or "huggingface.co", parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        raise HubUnreachableError(f"cannot reach {host} ({type(exc).__name__})") from exc


def fetch_config(repo_id: str, *, revision: str | None = None) -> dict[str, Any]:
    """Download ``config.json`` of a Hub model repository (cached by huggingface_hub).

    Falls back to Meta's ``params.json`` for repositories that ship only that.

    Raises:
        UnknownModelError: the repository does not exist or is gated without a token.
        HubUnreachableError: the Hub cannot be reached.
        MissingDependencyError: huggingface_hub is not installed.
    """
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise MissingDependencyError("reading a Hub model needs huggingface_hub: pip install huggingface_hub") from exc
    from huggingface_hub import try_to_load_from_cache

    from memest.sources.local import read_local

    cached = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    if isinstance(cached, str):
        return read_local(Path(cached))[0]
    _check_reachable()
    try:
        try:
            path = hf_hub_download(repo_id, "config.json", revision=revision, etag_timeout=5)
        except EntryNotFoundError:
            path = hf_hub_download(repo_id, "params.json", revision=revision, etag_timeout=5)
            return read_local(Path(path))[0]  # a params.json is converted there
        raw = read_local(Path(path))[0]
    except ConfigError:
        raise
    except GatedRepoError as exc:
        raise UnknownModelError(
            f"{repo_id!r} is gated on the Hub; accept its license on huggingface.co and set HF_TOKEN"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise UnknownModelError(f"no Hub repository {repo_id!r}; check the id (org/name)") from exc
    except EntryNotFoundError as exc:
        raise UnknownModelError(f"Hub repository {repo_id!r} has no config.json or params.json") from exc
    except (OSError, ValueError) as exc:  # network errors are OSError subclasses
        raise UnknownModelError(f"cannot fetch the config of {repo_id!r} from the Hub: {type(exc).__name__}") from exc
    if not isinstance(raw, dict):
        raise UnknownModelError(f"the config.json of {repo_id!r} is not a JSON object")
    return raw


def safetensors_parameter_counts(repo_id: str, *, revision: str | None = None) -> tuple[tuple[str, int], ...]:
    """Parameters per stored dtype of a Hub checkpoint, from its safetensors headers only.

    huggingface_hub ``get_safetensors_metadata`` reads the JSON header of each ``.safetensors``
    file (or the index of a sharded checkpoint) with HTTP range requests; no weights are
    downloaded. Returns ``(dtype, count)`` pairs sorted by dtype (``BF16``, ``F32``, ``I8``, ...).

    Raises:
        UnknownModelError: the repository does not exist, is gated, has no safetensors files, or
            its headers cannot be parsed.
        HubUnreachableError: offline (``HF_HUB_OFFLINE`` / ``MEMEST_OFFLINE``) or the Hub cannot be
            reached.
        MissingDependencyError: huggingface_hub is not installed.
    """
    if hub_offline():
        raise HubUnreachableError(
            f"{{exact_weights}} reads the safetensors headers of {repo_id!r} on the Hub, which is offline "
            "(HF_HUB_OFFLINE / MEMEST_OFFLINE); drop {exact_weights} or go online", field="exact_weights"
        )
    try:
        from huggingface_hub import get_safetensors_metadata
        from huggingface_hub.errors import (
            GatedRepoError,
            NotASafetensorsRepoError,
            RepositoryNotFoundError,
            SafetensorsParsingError,
        )
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise MissingDependencyError("{exact_weights} needs huggingface_hub: pip install huggingface_hub",
                                     field="exact_weights") from exc
    _check_reachable()
    try:
        meta = get_safetensors_metadata(repo_id, revision=revision)
    except GatedRepoError as exc:
        raise UnknownModelError(f"{repo_id!r} is gated on the Hub; accept its license on huggingface.co and set HF_TOKEN") from exc
    except RepositoryNotFoundError as exc:
        raise UnknownModelError(f"no Hub repository {repo_id!r}; check the id (org/name) or drop {{exact_weights}}",
                                field="exact_weights") from exc
    except NotASafetensorsRepoError as exc:
        raise UnknownModelError(f"{repo_id!r} has no safetensors checkpoint; drop {{exact_weights}}",
                                field="exact_weights") from exc
    except SafetensorsParsingError as exc:
        raise UnknownModelError(f"the safetensors headers of {repo_id!r} cannot be parsed ({exc}); drop {{exact_weights}}",
                                field="exact_weights") from exc
    except (OSError, ValueError) as exc:  # network errors are OSError subclasses
        raise UnknownModelError(f"cannot read the safetensors headers of {repo_id!r}: {type(exc).__name__}") from exc
    return tuple(sorted((str(dtype), int(n)) for dtype, n in meta.parameter_count.items()))
