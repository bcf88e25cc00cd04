"""An on-disk cache of the specs built on the meta device, so a family without an analytic adapter
is slow once per config, not on every call.

:func:`memest.sources.meta.spec_from_meta` imports torch and transformers and builds the model: 8-13 s
of CPU, nearly all of it imports. Its result depends only on the config's contents, the transformers
release that builds it and memest's own code, so it is stored under a key of exactly those:

    sha256(canonical JSON of config.json, trust_remote_code, transformers version, memest version,
           FORMAT)

(the transformers version is read from its installed metadata, :func:`importlib.metadata.version`,
without importing it). The stored spec leaves out the fields that say where the config came from
(``name``, ``source``): those are the caller's, put back on reading. A model whose config points at
remote code (``auto_map``) run with ``trust_remote_code`` is never cached: its code can change in
its repository while its config does not.

Where: ``$MEMEST_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/memest``, else ``~/.cache/memest``
(the XDG base-directory rule), in ``specs/``. ``MEMEST_NO_CACHE=1`` turns the cache off. A file is
written whole to a temporary file in the same folder and moved into place with :func:`os.replace`
(atomic on POSIX and Windows), so concurrent runs each write a complete file and a reader sees an
old one or a new one, never a part. A file that cannot be read back (truncated by a full disk,
another FORMAT) is a miss and is rewritten. A folder that cannot be written is not an error: the
spec is still returned, and the notice says it was not cached.

The library never prints: what the cache is doing goes to the notice callback, the one passed or
the one :func:`notices` installs for the current context (the CLI's prints to stderr).

This module imports only the standard library and memest.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import enum
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from memest import spec as spec_module
from memest.spec import ModelSpec

__all__ = ["FORMAT", "Notice", "cache_dir", "cached_spec", "decode", "encode", "notices", "notify"]

Notice = Callable[[str], None]
"""A callback told, in one line, what a slow step is doing."""

FORMAT = 1
"""The layout of a stored spec; a change makes every older file a miss."""

_NOTICE: contextvars.ContextVar[Notice | None] = contextvars.ContextVar("memest_notice", default=None)


@contextlib.contextmanager
def notices(callback: Notice | None) -> Iterator[None]:
    """Within the block, library notices (:func:`notify`) go to ``callback``."""
    token = _NOTICE.set(callback)
    try:
        yield
    finally:
        _NOTICE.reset(token)


def notify(message: str, notice: Notice | None = None) -> None:
    """Tell ``notice``, else the context's callback (:func:`notices`), else nobody."""
    callback = notice if notice is not None else _NOTICE.get()
    if callback is not None:
        callback(message)


def cache_dir() -> Path | None:
    """The folder stored specs live in, or None when ``MEMEST_NO_CACHE`` is set (not ``0`` / empty)."""
    if os.environ.get("MEMEST_NO_CACHE", "").strip() not in ("", "0"):
        return None
    override = os.environ.get("MEMEST_CACHE_DIR", "").strip()
    if override:
        return Path(override).expanduser() / "specs"
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "memest" / "specs"


def transformers_version() -> str | None:
    """The installed transformers' version, from its metadata (no import); None when not installed."""
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


def cache_key(raw: dict[str, Any], *, trust_remote_code: bool, transformers: str) -> str:
    """The file name of a config's stored spec (see the module docstring)."""
    from memest import __version__

    text = json.dumps([raw, trust_remote_code, transformers, __version__, FORMAT], sort_keys=True,
                      separators=(",", ":"), allow_nan=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def cached_spec(cfg: Any, build: Callable[[], ModelSpec], *, trust_remote_code: bool,
                notice: Notice | None = None, check: Callable[[], None] | None = None) -> ModelSpec:
    """The spec of ``cfg`` (an :class:`~memest.sources.config.HFConfig`) from the cache, else ``build()``'s,
    stored for the next call.

    ``build`` runs (and the notice says so) when the cache is off, the file is missing or unreadable,
    or the config runs remote code (never cached). ``check`` runs first and raises for a config ``build``
    would refuse (:func:`memest.sources.meta.check_buildable`), so a refused config gets no notice of a
    build that never happens. Errors of both propagate; nothing is stored then.
    """
    version = transformers_version()
    folder = cache_dir()
    remote = trust_remote_code and "auto_map" in cfg.raw
    what = (f"no analytic adapter for model_type {cfg.model_type!r}: building {cfg.name} on the meta device with "
            f"transformers {version or '(not installed)'}")
    if folder is None or version is None or remote:
        if check is not None:
            check()
        notify(f"{what} (takes seconds)", notice)
        return build()
    path = folder / f"{cache_key(cfg.raw, trust_remote_code=trust_remote_code, transformers=version)}.json"
    stored = _read(path)
    if stored is not None:
        return dataclasses.replace(stored, name=cfg.name, source=cfg.source)
    if check is not None:
        check()
    notify(f"{what} (takes seconds, once: the spec is kept in {folder})", notice)
    spec = build()
    try:
        _write(path, encode(spec))
    except OSError as exc:
        notify(f"could not keep the spec of {cfg.name} in {folder}: {exc.strerror or exc}; set MEMEST_CACHE_DIR to "
               "a writable folder (or MEMEST_NO_CACHE=1)", notice)
    return spec


def _read(path: Path) -> ModelSpec | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return decode(data)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` whole: a temporary file in the same folder, then :func:`os.replace`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem[:16]}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(data, out, separators=(",", ":"))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ---- the spec as JSON ----------------------------------------------------------------------------

_CLASSES: dict[str, type] = {cls.__name__: cls for cls in (
    spec_module.TensorSpec, spec_module.StateSpec, spec_module.AttentionSpec, spec_module.MLPSpec,
    spec_module.BufferSpec, spec_module.LayerSpec, spec_module.QuantizationSpec,
)}
_ENUMS: dict[str, type[enum.Enum]] = {cls.__name__: cls for cls in (spec_module.Component, spec_module.Split)}
_SKIPPED = frozenset({"name", "source"})


def encode(spec: ModelSpec) -> dict[str, Any]:
    """A JSON-ready form of ``spec``: the distinct layers once, with the order they occur in, and the
    fields of every part (``name`` and ``source`` left out)."""
    kinds = spec.layer_kinds()
    index = {id(layer): n for n, (layer, _) in enumerate(kinds)}
    pattern = [index.get(id(layer), next(i for i, (k, _) in enumerate(kinds) if k == layer)) for layer in spec.layers]
    fields = {f.name: _value(getattr(spec, f.name)) for f in dataclasses.fields(spec)
              if f.init and f.name not in _SKIPPED and f.name != "layers"}
    return {"format": FORMAT, "kinds": [_value(layer) for layer, _ in kinds], "pattern": pattern, "fields": fields}


def decode(data: dict[str, Any]) -> ModelSpec:
    """The spec :func:`encode` wrote (``name`` and ``source`` empty: the caller's to fill).

    Raises:
        ValueError, KeyError, TypeError: not what :func:`encode` writes, or another FORMAT.
    """
    if data.get("format") != FORMAT:
        raise ValueError(f"stored spec format {data.get('format')!r}, not {FORMAT}")
    kinds = [_object(layer) for layer in data["kinds"]]
    layers = tuple(kinds[n] for n in data["pattern"])
    fields = {name: _object(value) for name, value in data["fields"].items()}
    return ModelSpec(name="", source="", layers=layers, **fields)


def _value(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return {"enum": type(value).__name__, "value": value.value}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"class": type(value).__name__,
                **{f.name: _value(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}}
    if isinstance(value, tuple | list):
        return [_value(v) for v in value]
    return value


def _object(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_object(v) for v in value)
    if isinstance(value, dict):
        if "enum" in value:
            return _ENUMS[value["enum"]](value["value"])
        cls = _CLASSES[value["class"]]
        return cls(**{k: _object(v) for k, v in value.items() if k != "class"})
    return value
