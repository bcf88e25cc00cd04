"""``memest serve``: the JSON API and the page of :mod:`memest.web` on a local port (``pip install 'memest[web]'``)."""

from __future__ import annotations

from typing import Annotated

import typer

from memest.cli.app import app
from memest.errors import InputError, MissingDependencyError

HostOpt = Annotated[str, typer.Option("--host", help="Address to listen on; 127.0.0.1 (this machine only) unless "
                                      "you mean to serve others (then put it behind your own proxy).")]
PortOpt = Annotated[int, typer.Option("--port", help="TCP port to listen on.")]


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
    typer.echo(f"memest serving on http://{host}:{port}/ (Ctrl-C stops)", err=True)
    uvicorn.run(create_app(), host=host, port=port, log_level="warning", server_header=False)
