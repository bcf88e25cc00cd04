"""The Starlette application of ``memest serve``: the JSON API over :mod:`memest.api` and the page.

Every answer is JSON; an error is ``{"error": "<one line>"}``: 400 for bad input (the library's
message, naming the request's keywords), 413 for a body over :data:`MAX_BODY_BYTES`, 422 for a body of
the wrong shape, 504 past the time limit, 500 (no traceback) for a defect. CORS headers are never sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from memest.errors import MemestError
from memest.web import schema

MAX_BODY_BYTES = 2**20
"""Largest request body read (1 MiB): a config.json is a few KB, a big one a few hundred."""

TIMEOUT_S = 30.0
"""Longest a request may compute before it is answered 504 (an analytic estimate takes milliseconds;
a plan, a sweep or a config without an analytic adapter up to seconds)."""

STATIC = Path(__file__).resolve().parent / "static"


class _TooLarge(Exception):
    pass


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def _body(request: Request) -> Any:
    """The request's JSON, read up to :data:`MAX_BODY_BYTES`.

    Raises:
        _TooLarge: a longer body.
        schema.SchemaError: not JSON.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _TooLarge
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_BODY_BYTES:
            raise _TooLarge
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise schema.SchemaError(f"the body is not JSON ({str(exc).splitlines()[0][:120]}); send a JSON object") from None


def _estimate(model: Any, mode: str | None, rest: dict[str, Any]) -> Any:
    from memest.api import estimate_memory

    return estimate_memory(model, mode=mode or "serve", **rest).to_dict()


def _plan(model: Any, mode: str | None, rest: dict[str, Any]) -> Any:
    from memest.api import plan_memory

    return plan_memory(model, mode=mode or "serve", **rest).to_dict()


def _sweep(model: Any, mode: str | None, rest: dict[str, Any]) -> Any:
    from memest.api import sweep_memory

    return sweep_memory(model, mode=mode, **rest).to_dict()


def _check(logs: list[tuple[str, str]], keywords: dict[str, Any]) -> Any:
    """``memest check --json`` of pasted logs; the model a log names resolves from the catalog only."""
    from memest.api import check_logs

    return [c.to_dict() for c in check_logs(logs, **keywords, local_files=False)]


def _command(model: Any, mode: str | None, rest: dict[str, Any]) -> Any:
    """The ``memest hf`` command line of an estimate request (a pasted config is named ``config.json``)."""
    import shlex

    from memest.api import settings_of
    from memest.workload.settings import given_flags

    parts = ["memest", "hf", shlex.quote("config.json" if isinstance(model, dict) else model)]
    for flag, value in given_flags(settings_of(mode or "serve", rest)).items():
        parts += [flag, shlex.quote(value)] if value else [flag]
    return {"command": " ".join(parts)}


def _endpoint(kind: str, compute: Callable[..., Any], timeout_s: float,
              parse: Callable[[Any, str], tuple[Any, ...]] = schema.parse) -> Callable[[Request], Any]:
    """A POST endpoint: the body read (:func:`_body`) and checked by ``parse``, then ``compute(*parsed)`` in a
    worker thread under the time limit; every failure answered as one line (the module's docstring)."""
    async def endpoint(request: Request) -> Response:
        try:
            body = await _body(request)
            parsed = parse(body, kind)
            with anyio.fail_after(timeout_s):
                data = await anyio.to_thread.run_sync(compute, *parsed, abandon_on_cancel=True)
        except _TooLarge:
            return _error(413, f"the body is over {MAX_BODY_BYTES // 2**20} MB; a config.json is a few KB, a start-up "
                               "log a few hundred: send the log from its start to ready")
        except schema.SchemaError as exc:
            return _error(422, str(exc))
        except MemestError as exc:
            return _refused(exc)
        except TimeoutError:
            return _error(504, f"the request took longer than {timeout_s:g} s and was abandoned; try a smaller "
                               "search (plan: gpus_available, max_gpus) or fewer sweep points")
        except Exception as exc:  # a defect: say so in one line, never a traceback
            return _error(500, f"memest failed unexpectedly: {type(exc).__name__}; run the same job with the CLI "
                               "and MEMEST_DEBUG=1 for the traceback and report it")
        return JSONResponse(data)

    return endpoint


def _refused(exc: MemestError) -> JSONResponse:
    """A 400 of bad input: its one-line message; for ``/v1/check`` logs of which some were checked, also
    ``checks`` (theirs) and ``errors`` (each failed log's), as ``memest check --json`` prints them."""
    from memest.api import LogsFailed

    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, LogsFailed) and exc.checks:
        return JSONResponse({"error": message, **exc.to_dict()}, status_code=400)
    return _error(400, message)


def _cached(build: Callable[[], Any]) -> Callable[[Request], Any]:
    """A GET endpoint answering the JSON of ``build()``, built once: the catalogs do not change while serving."""
    held: list[Any] = []

    async def endpoint(request: Request) -> Response:
        if not held:
            held.append(await anyio.to_thread.run_sync(build))
        return JSONResponse(held[0])

    return endpoint


def _catalog_models() -> Any:
    from memest.report.catalogs import models_list

    return models_list()


def _catalog_gpus() -> Any:
    from memest.report.catalogs import gpus_list

    return gpus_list()


def _catalog_stacks() -> Any:
    """The training stacks the ``stack`` setting names, in its declaration order: the page's stack picker.
    Each with its label and the job line's recipe words at its own defaults."""
    from memest.workload.config import Stack
    from memest.workload.stacks import STACKS, recipe_words

    return [{"name": s.value, "label": STACKS[s].label, "bf16": STACKS[s].bf16,
             "recipe": recipe_words(s, STACKS[s].precision, STACKS[s].optimizer)} for s in Stack]


async def _health(request: Request) -> Response:
    from memest import __version__

    return JSONResponse({"status": "ok", "version": __version__})


async def _openapi(request: Request) -> Response:
    return JSONResponse(schema.openapi())


async def _page(request: Request) -> Response:
    return FileResponse(STATIC / "index.html", media_type="text/html")


async def _docs(request: Request) -> Response:
    return FileResponse(STATIC / "docs.html", media_type="text/html")


async def _not_found(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 404)
    return _error(status, f"{request.method} {request.url.path}: {getattr(exc, 'detail', 'not found')}")


async def _failed(request: Request, exc: Exception) -> Response:
    return _error(500, f"memest failed unexpectedly: {type(exc).__name__}")


def create_app(*, timeout_s: float = TIMEOUT_S) -> Starlette:
    """The application: ``POST /v1/estimate``, ``/v1/plan``, ``/v1/sweep``, ``/v1/check``, ``/v1/command``;
    ``GET /v1/models``,
    ``/v1/gpus``, ``/v1/stacks``, ``/v1/health``, ``/openapi.json``, ``/docs`` and the page at ``/``."""
    from starlette.exceptions import HTTPException

    posts = {"estimate": _estimate, "plan": _plan, "sweep": _sweep, "command": _command}
    routes = [Route(f"/v1/{kind}", _endpoint("estimate" if kind == "command" else kind, fn, timeout_s),
                    methods=["POST"]) for kind, fn in posts.items()]
    routes.append(Route("/v1/check", _endpoint("check", _check, timeout_s, schema.parse_check), methods=["POST"]))
    routes += [Route("/v1/models", _cached(_catalog_models), methods=["GET"]),
               Route("/v1/gpus", _cached(_catalog_gpus), methods=["GET"]),
               Route("/v1/stacks", _cached(_catalog_stacks), methods=["GET"]),
               Route("/v1/health", _health, methods=["GET"]),
               Route("/openapi.json", _openapi, methods=["GET"]),
               Route("/docs", _docs, methods=["GET"]),
               Route("/", _page, methods=["GET"]),
               Mount("/static", StaticFiles(directory=STATIC), name="static")]
    return Starlette(routes=routes, exception_handlers={HTTPException: _not_found, Exception: _failed})
