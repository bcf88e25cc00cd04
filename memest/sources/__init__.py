"""Turning a model reference into a :class:`~memest.spec.ModelSpec`.

A reference is, in the order tried: a local directory or config file (``config.json``, Meta's
``params.json``); a model of the offline catalog, by Hub id or alias; any other Hub id, whose
``config.json`` is fetched through huggingface_hub (never weights) unless the environment is
offline (``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from memest.errors import (
    ConfigError,
    InputError,
    MissingDependencyError,
    UnknownModelError,
    UnsupportedArchitectureError,
)
from memest.sources import catalog
from memest.sources.config import HFConfig, check_parameter_count, validate_fields
from memest.sources.families import ADAPTERS, supported_model_types
from memest.sources.hub import HubUnreachableError, fetch_config, hub_offline
from memest.sources.local import check_config_data, config_from_meta_params, is_meta_params, read_local
from memest.sources.spec_cache import Notice, cached_spec
from memest.spec import ModelSpec

__all__ = ["config_from_data", "load_config", "load_model", "spec_from_config"]


_HUB_URL = re.compile(r"^(?:https?://)?(?:www\.)?(?:huggingface\.co|hf\.co)/([^/\s]+/[^/\s]+?)(?:/(?:tree|blob|resolve)/.*)?/?$")


def _hub_id_of_url(ref: str) -> str:
    """``org/name`` of a model page URL (https://huggingface.co/org/name[/tree/main/...]); other references as given."""
    match = _HUB_URL.match(ref)
    return match.group(1) if match else ref


def load_config(reference: str, *, revision: str | None = None) -> HFConfig:
    """The config a reference names, read from disk, the catalog or the Hub.

    Raises:
        UnknownModelError: nothing matches; the message lists close catalog matches.
        ConfigError: the file is not a valid config.
    """
    ref = _hub_id_of_url(reference.strip())
    if not ref:
        raise UnknownModelError("empty model reference; pass a Hub id, a catalog name or a path (see 'memest models')")
    path = Path(ref).expanduser()
    if _exists(path):
        if revision is not None:
            raise InputError(f"{{revision}} {revision!r} names a Hub revision, but {ref!r} is a local path; drop "
                             "{revision} (or check out that revision there)", field="revision")
        raw, where = read_local(path)
        return HFConfig(raw, name=_local_name(path), source=where, code_from=str(Path(where).resolve().parent))
    hit = catalog.resolve(ref)
    if hit is not None:
        if revision is None:
            return _from_catalog(hit)
        why = "the Hub is offline (HF_HUB_OFFLINE)"
        if not hub_offline():
            try:
                return HFConfig(fetch_config(hit.model_id, revision=revision), name=hit.model_id, source="hub",
                                code_from=hit.model_id)
            except HubUnreachableError as exc:
                why = f"the Hub is unreachable: {exc}"
        raise InputError(f"{{revision}} {revision!r} needs the Hub, and {why}: the offline catalog holds one revision "
                         f"of {hit.model_id}; drop {{revision}} to use it", field="revision")
    if _looks_like_path(ref):
        raise UnknownModelError(f"no such file or directory: {ref!r}; pass an existing config.json, params.json or model folder")
    why = "not in the offline catalog; pass a Hub id (org/name) or a path"
    if ref.count("/") == 1:
        why = "not in the offline catalog and the Hub is offline (HF_HUB_OFFLINE)"
        if not hub_offline():
            try:
                return HFConfig(fetch_config(ref, revision=revision), name=ref, source="hub", code_from=ref)
            except HubUnreachableError as exc:
                why = f"not in the offline catalog and the Hub is unreachable: {exc}"
    matches = catalog.close_matches(ref)
    hint = f"; did you mean {', '.join(repr(m) for m in matches)}?" if matches else ""
    raise UnknownModelError(f"unknown model {ref!r}: {why}{hint} (list the catalog with 'memest models')")


def catalog_config(reference: str) -> HFConfig | None:
    """The config of the catalog entry ``reference`` names, read from the package's catalog only (never a
    path on this machine, never the Hub), or None when no entry matches."""
    hit = catalog.resolve(reference)
    return None if hit is None else _from_catalog(hit)


def _from_catalog(hit: catalog.CatalogHit) -> HFConfig:
    return HFConfig(catalog.load(hit), name=hit.model_id, source="catalog", note=hit.note, code_from=hit.model_id)


def config_from_data(raw: Any, *, name: str = "config.json") -> HFConfig:
    """The config of a config.json's (or a Meta params.json's) contents given as data, not read from
    anywhere: checked as a file's would be, with no place to load model code from (``code_from`` None),
    so it never runs remote code.

    Raises:
        ConfigError: not a JSON object, or nested too deeply.
    """
    data = check_config_data(raw, name)
    if is_meta_params(data, name):
        data = config_from_meta_params(data, name)
    return HFConfig(data, name=name, source="given data")


def spec_from_config(cfg: HFConfig, *, trust_remote_code: bool = False, notice: Notice | None = None) -> ModelSpec:
    """The ModelSpec of a config: by the family's analytic adapter, else on the meta device.

    Multimodal configs whose family has no adapter use the adapter of their ``text_config`` and
    say that the other towers are not counted. A spec built on the meta device is kept on disk and
    read back on the next call with the same config (:mod:`memest.sources.spec_cache`); ``notice``
    (else the callback :func:`memest.sources.spec_cache.notices` installed) is told when the slow build
    runs.

    Raises:
        UnsupportedArchitectureError: no adapter, and the model cannot be built on the meta device.
        ConfigError: the config lacks or mangles a field the adapter needs, or its sizes are out of
            bounds (see :mod:`memest.sources.config`).
    """
    validate_fields(cfg)
    adapter = ADAPTERS.get(cfg.model_type)
    if adapter is not None:
        spec = adapter(cfg)
    else:
        text = cfg.text
        text_type = text.raw.get("model_type")
        if text is not cfg and text_type in ADAPTERS:
            spec = ADAPTERS[text_type](text)
            spec = spec.replace(notes=(*spec.notes, f"only the {text_type} language model of this {cfg.model_type} checkpoint is counted"))
        else:
            spec = _spec_on_meta(cfg, trust_remote_code=trust_remote_code, notice=notice)
    check_parameter_count(cfg.name, spec.num_params)
    if cfg.note:
        spec = spec.replace(notes=(cfg.note, *spec.notes))
    return spec


def load_model(reference: str, *, trust_remote_code: bool = False, revision: str | None = None) -> ModelSpec:
    """The ModelSpec of a model reference (see the module docstring for what a reference is).

    Raises:
        UnknownModelError, ConfigError, UnsupportedArchitectureError: as their names say.
    """
    return spec_from_config(load_config(reference, revision=revision), trust_remote_code=trust_remote_code)


def _spec_on_meta(cfg: HFConfig, *, trust_remote_code: bool, notice: Notice | None = None) -> ModelSpec:
    try:
        from memest.sources import meta
    except ImportError as exc:  # pragma: no cover
        raise UnsupportedArchitectureError(str(exc)) from exc
    try:
        return cached_spec(cfg, lambda: meta.spec_from_meta(cfg, trust_remote_code=trust_remote_code),
                           trust_remote_code=trust_remote_code, notice=notice,
                           check=lambda: meta.check_buildable(cfg, trust_remote_code=trust_remote_code))
    except (UnsupportedArchitectureError, ConfigError, MissingDependencyError):
        raise  # memest's own refusals (check_buildable's among them) say what to fix as they are
    except Exception as exc:
        raise UnsupportedArchitectureError(
            f"model_type {cfg.model_type!r} of {cfg.name!r} has no analytic adapter "
            f"(supported: {', '.join(supported_model_types())}) and building it on the meta device failed: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc


def _exists(path: Path) -> bool:
    """True when ``path`` names something on disk (a dangling symlink too, so it can be reported).

    Raises:
        UnknownModelError: the name is too long for the file system, or cannot be checked.
    """
    try:
        return path.exists() or path.is_symlink()
    except OSError as exc:
        shown = str(path) if len(str(path)) <= 80 else f"{str(path)[:60]}… ({len(str(path)):,} characters)"
        raise UnknownModelError(f"cannot look up {shown!r}: {exc.strerror or exc}; pass a shorter path, a Hub id or "
                                "a catalog name") from exc


def _looks_like_path(ref: str) -> bool:
    return ref.startswith((".", "/", "~")) or ref.endswith(".json") or ref.count("/") > 1 or "\\" in ref


def _local_name(path: Path) -> str:
    folder = path if path.is_dir() else path.parent
    return folder.resolve().name or str(path)


