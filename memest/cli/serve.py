"""``memest serve``: the JSON API and the page of :mod:`memest.web` on a local port (``pip install 'memest[web]'``)."""

from __future__ import annotations

import errno
import socket
from typing import Annotated

import typer

from memest.cli.app import app
from memest.errors import InputError, MissingDependencyError

HostOpt = Annotated[str, typer.Option("--host", help="Address to listen on; 127.0.0.1 (this machine only) unless "
                                      "you mean to serve others (then put it behind your own proxy).")]
PortOpt = Annotated[int, typer.Option("--port", help="TCP port to listen on; 0: any free one (the one bound is "
                                      "printed).")]


@app.command("serve")
def serve_command(host: HostOpt = "127.0.0.1", port: PortOpt = 8000) -> None:
    """Serve memest over HTTP: POST /v1/estimate, /v1/plan, /v1/sweep (JSON as --json), the catalogs, and a page at /."""
    if not 0 <= port <= 65535:
        raise InputError(f"--port {port} is not a TCP port; give 1-65535 (or 0 for any free one)")
    try:
        import uvicorn

        from memest.web.app import create_app
    except ImportError as exc:
        raise MissingDependencyError(f"memest serve needs the web extra ({exc.name} is not installed): "
                                     "pip install 'memest[web]'") from None
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    typer.echo(f"memest serving on http://{shown}:{bound}/ (Ctrl-C stops)", err=True)
    config = uvicorn.Config(create_app(), log_level="warning", server_header=False)
    uvicorn.Server(config).run(sockets=[sock])


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (0: a free port), bound here so that a port in use is one
    line before anything is printed (uvicorn would log it and exit 1).

    Raises:
        InputError: the host does not resolve, is no address of this machine, or the port is in use or
            needs privileges.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise InputError(f"--host {host!r} does not resolve ({exc}); give an address of this machine, "
                         "e.g. 127.0.0.1") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart reuses the port
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise InputError(f"port {port} on {host} is in use; pick another with --port") from None
        if exc.errno == errno.EACCES:
            raise InputError(f"port {port} on {host} needs privileges; pick one above 1023 with --port") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise InputError(f"--host {host} is no address of this machine; give one of its addresses, e.g. "
                             "127.0.0.1") from None
        raise InputError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); pick another --host or "
                         "--port") from None
    return sock
