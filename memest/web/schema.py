"""A request body checked against the settings' declarations, and the OpenAPI document they make.

A body is a JSON object: ``model`` (a catalog name or Hub id) or ``config`` (a config.json's contents),
``mode``, and any setting keyword of the Python API (:func:`memest.workload.settings.settings`), each of
the JSON type its declaration names; ``/v1/plan`` also takes the planner's own keywords, read from
:func:`memest.api.plan_memory`'s signature (:func:`own_keywords`), and ``/v1/sweep`` a range (a string
such as ``"1k..128k"``, an integer or a list of integers) for the sweepable settings. A body of the wrong
shape is a :class:`SchemaError` (HTTP 422); a value of the right type that breaks a rule is the library's
InputError (HTTP 400).
"""

from __future__ import annotations

import functools
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memest.errors import InputError

REFUSED: dict[str, str] = {
    "trust_remote_code": "the service never runs a model's own code; use the CLI on your own machine for that",
    "gguf": "it names a file, and the service reads no files; use 'memest hf --gguf FILE' on your machine",
    "costs": "it names a file, and the service reads no files; give the prices as cost, e.g. {\"H100\": 2.49}",
}
"""Keywords a request may not set, and why (a request names no files and runs no code)."""

MODE_FIELDS = ("train", "finetune", "serve")
"""The mode settings, given in a request as ``mode``."""


class SchemaError(Exception):
    """A request body of the wrong shape: not an object, a field of the wrong JSON type, an unknown field."""


@functools.cache
def setting_types() -> dict[str, dict[str, Any]]:
    """Every setting keyword's JSON schema (type, default, description, enum values), from its declaration."""
    from enum import Enum

    from memest.errors import keyword
    from memest.workload.settings import enum_of, settings

    out: dict[str, dict[str, Any]] = {}
    for name, s in settings().items():
        if name in MODE_FIELDS or name in REFUSED:
            continue
        enum = enum_of(s.type)
        kinds = [k for k in (s.type, *typing.get_args(s.type)) if isinstance(k, type) and k is not type(None)]
        base = kinds[0] if kinds else str
        schema: dict[str, Any] = {"type": "string"} if enum is not None else {
            "type": {bool: "boolean", int: "integer", float: "number"}.get(base, "string")}
        if enum is not None:
            schema["enum"] = [m.value for m in enum]
        if s.items is not None:  # a comma-separated list: its text, or a list of its items (as the Python API)
            item = {str: "string", float: "number", int: "integer"}[s.items]
            schema["oneOf"] = [{"type": "string"}, {"type": "array", "items": {"type": item}}]
        default = s.default
        schema["default"] = default.value if isinstance(default, Enum) else default
        schema["description"] = InputError(s.help, field=s.name).render(keyword)
        if default is None:
            schema["nullable"] = True
        out[name] = schema
    return out


def _sweep_schema(base: dict[str, Any]) -> dict[str, Any]:
    return {**base, "type": None, "oneOf": [{"type": "integer"}, {"type": "string"},
                                             {"type": "array", "items": {"type": "integer"}}]}


@functools.cache
def fields(kind: str) -> dict[str, dict[str, Any]]:
    """The JSON schema of each field a request of ``kind`` (``estimate``, ``plan``, ``sweep``) takes."""
    from memest.api import MODES
    from memest.planning.sweep import SWEEPABLE

    out: dict[str, dict[str, Any]] = {
        "model": {"type": "string", "description": "A catalog name (GET /v1/models) or a Hub id; not a path."},
        # null as the Python API's mode=None: serve (a sweep: the swept setting's mode)
        "mode": {"type": "string", "enum": list(MODES), "nullable": True,
                 "default": None if kind == "sweep" else "serve"},
        # the setting `config` names files (DeepSpeed / accelerate); the service reads none: here `config`
        # is a pasted config.json
        **{name: schema for name, schema in setting_types().items() if name != "config"},
        "config": {"type": "object", "description": "A config.json's contents (data only: no model code is run), "
                                                    "in place of model."},
    }
    if kind == "plan":
        from memest.api import plan_memory

        out |= own_keywords(plan_memory)
    if kind == "sweep":
        out |= {name: _sweep_schema(out[name]) for name in SWEEPABLE}
    return out


def _json_schema(hint: Any) -> dict[str, Any]:
    """The JSON schema of a Python type hint (``int | None``, ``Mapping[str, float] | Iterable[str]``)."""
    from collections.abc import Iterable, Mapping

    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if hint is not None and typing.get_origin(hint) in (typing.Union, types.UnionType):
        nullable = len(args) < len(typing.get_args(hint))
        inner = [_json_schema(a) for a in args]
        schema = inner[0] if len(inner) == 1 else {"type": None, "oneOf": inner}
        return schema | ({"nullable": True} if nullable else {})
    origin = typing.get_origin(hint) or hint
    if isinstance(origin, type) and issubclass(origin, Mapping):
        return {"type": "object", "additionalProperties": _json_schema(args[-1]) if args else {"type": "string"}}
    if origin is not str and isinstance(origin, type) and issubclass(origin, Iterable):
        return {"type": "array", "items": _json_schema(args[0]) if args else {"type": "string"}}
    return {"type": {bool: "boolean", int: "integer", float: "number"}.get(origin, "string")}


def _arg_docs(func: Any) -> dict[str, str]:
    """Each keyword's text in ``func``'s docstring ``Args:`` section (one entry may name several)."""
    import inspect

    doc = inspect.getdoc(func) or ""
    section = re.search(r"^Args:\n((?:(?: {4}.*)?\n)+)", doc + "\n", re.M)
    out: dict[str, str] = {}
    for entry in re.finditer(r"^ {4}(\w+(?:, \w+)*):(.*(?:\n {8}.*)*)", section.group(1) if section else "", re.M):
        text = " ".join(entry.group(2).split()).replace("``", "")
        for name in entry.group(1).split(", "):
            out[name] = text
    return out


def own_keywords(func: Any) -> dict[str, dict[str, Any]]:
    """The JSON schema of each keyword of ``func`` (:func:`memest.api.plan_memory`) that is neither the
    model, the mode, a setting (:func:`setting_types`) nor refused (:data:`REFUSED`): its type from the
    signature's hints, its default from the signature, its description from the docstring."""
    import inspect

    from memest.workload.settings import settings

    hints = typing.get_type_hints(func)
    docs = _arg_docs(func)
    out: dict[str, dict[str, Any]] = {}
    for name, p in inspect.signature(func).parameters.items():
        if (p.kind is not inspect.Parameter.KEYWORD_ONLY or name in ("model", "mode") or name in settings()
                or name in REFUSED):
            continue
        out[name] = _json_schema(hints[name]) | {"default": p.default} | (
            {"description": docs[name]} if name in docs else {})
    return out


def _json_type_ok(value: Any, schema: Mapping[str, Any]) -> bool:
    if value is None:
        return bool(schema.get("nullable"))
    if "oneOf" in schema:
        return any(_json_type_ok(value, {**s, "nullable": False}) for s in schema["oneOf"])
    kind = schema["type"]
    if kind == "array":
        return isinstance(value, list) and all(_json_type_ok(v, schema["items"]) for v in value)
    if kind == "object":
        if not isinstance(value, dict):
            return False
        inner = schema.get("additionalProperties")
        return inner is None or all(_json_type_ok(v, inner) for v in value.values())
    return {"boolean": isinstance(value, bool), "integer": isinstance(value, int) and not isinstance(value, bool),
            "number": isinstance(value, int | float) and not isinstance(value, bool),
            "string": isinstance(value, str)}[kind]


_TYPE_WORDS = {"boolean": "true or false", "integer": "an integer", "number": "a number", "string": "a string",
               "object": "a JSON object", "array": "a list"}
_PLURALS = {"boolean": "booleans", "integer": "integers", "number": "numbers", "string": "strings",
            "object": "JSON objects", "array": "lists"}


def type_words(schema: Mapping[str, Any]) -> str:
    """What a value of ``schema`` is, in words: ``an integer, a string or a list of integers``."""
    if "oneOf" in schema:
        alternatives = [type_words(s) for s in schema["oneOf"]]
        return ", ".join(alternatives[:-1]) + " or " + alternatives[-1]
    if schema["type"] == "array":
        return f"a list of {_PLURALS[schema['items']['type']]}"
    if schema["type"] == "object" and "additionalProperties" in schema:
        return f"a JSON object of {_PLURALS[schema['additionalProperties']['type']]}"
    return _TYPE_WORDS[schema["type"]]


def parse(body: Any, kind: str) -> tuple[Any, str | None, dict[str, Any]]:
    """The model (a reference, or a config mapping), the mode and the other keywords of a request body.

    Raises:
        SchemaError: not an object, an unknown field, a field of the wrong JSON type, neither or both of
            ``model`` and ``config``.
        InputError: a refused keyword (:data:`REFUSED`), a model that is a file-system path.
    """
    if not isinstance(body, dict):
        raise SchemaError(f"the body is a JSON {type(body).__name__}; send a JSON object such as "
                          '{"model": "meta-llama/Llama-3.1-8B", "mode": "serve", "gpu": "H100"}')
    for name in body:
        if name in REFUSED:
            raise InputError(f"{name} is not taken here: {REFUSED[name]}", field=name)
        if name in MODE_FIELDS:
            raise InputError(f"give the mode as mode (one of train, lora, qlora, serve), not {name}", field=name)
    known = fields(kind)
    unknown = [n for n in body if n not in known]
    if unknown:
        raise SchemaError(f"unknown field {unknown[0]!r}; the fields are: {', '.join(known)}")
    for name, value in body.items():
        if not _json_type_ok(value, known[name]):
            raise SchemaError(f"field {name!r} is {value!r:.80}; it must be {type_words(known[name])}"
                              + (" or null" if known[name].get("nullable") else ""))
    if "model" in body and "config" in body:
        raise SchemaError("give only one of model (a catalog name or Hub id) or config (a config.json's contents), "
                          "not both")
    if "model" not in body and "config" not in body:
        raise SchemaError("give one of model (a catalog name or Hub id) or config (a config.json's contents)")
    rest = {k: v for k, v in body.items() if k not in ("model", "config", "mode")}
    mode = body.get("mode", known["mode"]["default"])
    if "config" in body:
        return body["config"], mode, rest
    return check_reference(body["model"]), mode, rest


CHECK_FIELDS: dict[str, dict[str, Any]] = {
    "log": {"type": "string", "description": "One engine start-up log or training log, pasted (its text, not a path)."},
    "logs": {"type": "array", "items": {"type": "string"}, "description": "Several logs, in place of log."},
    "model": {"type": "string", "nullable": True,
              "description": "The model, when the log names none memest resolves offline: a catalog name or a Hub "
                             "id; not a path."},
    "gpu": {"type": "string", "nullable": True, "description": "The accelerator, when the log names none memest "
                                                               "knows (GET /v1/gpus)."},
    "engine_version": {"type": "string", "nullable": True,
                       "description": "The engine arithmetic to apply (default: the one of the log's version)."},
    "settings": {"type": "object", "description": "Settings of the job the log does not print, by the Python API's "
                                                  "keywords ({\"seq_len\": 4096, \"gpus\": 8}); not config."},
}
"""The fields of a ``/v1/check`` body: ``memest check``'s arguments by :func:`memest.api.check_logs`'s keywords."""

REFUSED_SETTINGS: dict[str, str] = {
    **REFUSED, "config": "it names files, and the service reads no files; give the settings the log does not print "
                         "by name in settings ({\"seq_len\": 4096})"}
"""Settings a ``/v1/check`` request may not give, and why: :data:`REFUSED`, and ``config`` (files)."""


def parse_check(body: Any, kind: str = "check") -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """The logs (named ``log``, or ``logs[0]``, ``logs[1]``, ...) and the keywords of a ``/v1/check`` body.

    Raises:
        SchemaError: not an object, an unknown field, a field or a setting of the wrong JSON type, neither
            or both of ``log`` and ``logs``.
        InputError: a refused setting (:data:`REFUSED_SETTINGS`), a model that is a file-system path.
    """
    if not isinstance(body, dict):
        raise SchemaError(f"the body is a JSON {type(body).__name__}; send a JSON object such as "
                          '{"log": "<the engine\'s start-up log>", "gpu": "H100"}')
    unknown = [n for n in body if n not in CHECK_FIELDS]
    if unknown:
        raise SchemaError(f"unknown field {unknown[0]!r}; the fields are: {', '.join(CHECK_FIELDS)}")
    for name, value in body.items():
        if not _json_type_ok(value, CHECK_FIELDS[name]):
            words = {"log": "a string (the log's text)", "logs": "a list of strings (the logs' texts)",
                     "settings": "a JSON object of settings"}.get(name, "a string or null")
            raise SchemaError(f"field {name!r} is {value!r:.80}; it must be {words}")
    if ("log" in body) == ("logs" in body):
        raise SchemaError("give one of log (a log's text) or logs (a list of them)")
    logs = [("log", body["log"])] if "log" in body else [(f"logs[{i}]", t) for i, t in enumerate(body["logs"])]
    settings = dict(body.get("settings") or {})
    types = setting_types()
    for name, value in settings.items():
        if name in REFUSED_SETTINGS:
            raise InputError(f"settings {name!r} is not taken here: {REFUSED_SETTINGS[name]}", field=name)
        if name in types and not _json_type_ok(value, types[name]):
            raise SchemaError(f"setting {name!r} is {value!r:.80}; it must be {type_words(types[name])}")
    model = body.get("model")
    return logs, {"model": None if model is None else check_reference(model), "gpu": body.get("gpu"),
                  "engine_version": body.get("engine_version"), "settings": settings}


def check_reference(model: str) -> str:
    """``model`` when it names a catalog model or a Hub repository, never a file.

    Raises:
        InputError: it looks like a path or names something on this machine's disk.
    """
    ref = model.strip()
    looks_like_path = (ref.startswith((".", "/", "~")) or ref.endswith(".json") or ref.count("/") > 1
                       or "\\" in ref or ".." in ref or ":" in ref.split("/")[0])
    try:
        on_disk = bool(ref) and (Path(ref).exists() or Path(ref).is_symlink())
    except (OSError, ValueError):
        on_disk = True
    if looks_like_path or on_disk:
        raise InputError(f"model {model!r:.120} is a file-system path; the service reads no files: give a catalog "
                         "name or a Hub id (org/name), or paste the config.json's contents as config", field="model")
    return ref


def openapi() -> dict[str, Any]:
    """The OpenAPI 3 document of the service, its request schemas generated from the settings."""
    from memest import __version__

    def body(kind: str) -> dict[str, Any]:
        props = {}
        for name, schema in fields(kind).items():
            s = {k: v for k, v in schema.items() if v is not None or k == "default"}
            if s.get("type") is None:
                s.pop("type", None)
            props[name] = s
        return {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "additionalProperties": False, "properties": props}}}}

    errors = {"400": {"description": "bad input: {\"error\": one line naming the value and the fix}"},
              "413": {"description": "body over 1 MB"}, "422": {"description": "body of the wrong shape"},
              "504": {"description": "the request took longer than the service's time limit"}}
    paths: dict[str, Any] = {}
    for kind, what in (("estimate", "Per-device memory of a job: memest hf --json"),
                       ("plan", "The cheapest setups that fit: memest plan --json"),
                       ("sweep", "The estimate across a range of one setting: memest sweep --json")):
        paths[f"/v1/{kind}"] = {"post": {"summary": what, "requestBody": body(kind),
                                         "responses": {"200": {"description": "the CLI's --json"}, **errors}}}
    check_body = {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "additionalProperties": False,
        "properties": {k: {n: v for n, v in f.items()} for k, f in CHECK_FIELDS.items()}}}}}
    paths["/v1/check"] = {"post": {"summary": "A pasted engine start-up log or training log against memest's estimate "
                                              "of its job: memest check --json",
                                   "requestBody": check_body,
                                   "responses": {"200": {"description": "the CLI's --json: a list, one item per log"},
                                                 **errors, "400": {"description": (
                                                     "bad input: {\"error\": one line naming the value and the "
                                                     "fix}; when some logs were checked and some not, also "
                                                     "\"checks\" (their items) and \"errors\" ([{\"log\", "
                                                     "\"error\"}]), as memest check --json")}}}}
    paths["/v1/command"] = {"post": {"summary": "The memest hf command line of an estimate request",
                                     "requestBody": body("estimate"),
                                     "responses": {"200": {"description": "{\"command\": \"memest hf ...\"}"},
                                                   **errors}}}
    for path, what in (("/v1/models", "The offline catalog: memest models --json"),
                       ("/v1/gpus", "The accelerator catalog: memest gpus --json"),
                       ("/v1/stacks", ("The training stacks the stack field names: name, label, bf16 switch, "
                                       "recipe at the stack's defaults")),
                       ("/v1/health", "{\"status\": \"ok\", \"version\": ...}")):
        paths[path] = {"get": {"summary": what, "responses": {"200": {"description": "JSON"}}}}
    return {"openapi": "3.0.3", "info": {"title": "memest", "version": __version__,
                                         "description": "How much accelerator memory a model needs, per device."},
            "paths": paths}
