"""Model references resolved on the Hugging Face Hub: config.json only, never weights."""

from __future__ import annotations

import json
import os
from typing import Any

from memest.errors import MissingDependencyError, UnknownModelError


def hub_offline() -> bool:
    """True when the environment forbids Hub access (``HF_HUB_OFFLINE`` or ``MEMEST_OFFLINE``)."""
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in ("HF_HUB_OFFLINE", "MEMEST_OFFLINE"))


def fetch_config(repo_id: str, *, revision: str | None = None) -> dict[str, Any]:
    """Download ``config.json`` of a Hub model repository (cached by huggingface_hub).

    Falls back to Meta's ``params.json`` for repositories that ship only that.

    Raises:
        UnknownModelError: the repository does not exist, is gated without a token, or the Hub
            cannot be reached.
        MissingDependencyError: huggingface_hub is not installed.
    """
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise MissingDependencyError("reading a Hub model needs huggingface_hub: pip install huggingface_hub") from exc
    from memest.sources.local import config_from_meta_params

    try:
        try:
            path = hf_hub_download(repo_id, "config.json", revision=revision, etag_timeout=5)
        except EntryNotFoundError:
            path = hf_hub_download(repo_id, "params.json", revision=revision, etag_timeout=5)
            return config_from_meta_params(json.loads(open(path).read()), f"{repo_id}/params.json")
        with open(path) as f:
            raw = json.load(f)
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
