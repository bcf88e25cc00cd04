"""memest over HTTP: a JSON API and a single page (``memest serve``; ``pip install 'memest[web]'``).

:mod:`memest.web.schema` checks a request body against the settings' declarations and describes them as
OpenAPI; :mod:`memest.web.app` is the Starlette application, which calls :mod:`memest.api` (never the
CLI) and answers with its ``to_dict()``, exactly the CLI's ``--json``. The page in ``static/`` is plain
HTML, CSS and JS shipped in the package: no CDN, no network.

Security: requests name models by catalog name or Hub id, or paste a config.json's contents (data only:
no model code is ever loaded); file-system paths, ``trust_remote_code`` and settings that name files are
refused; a pasted log (``/v1/check``) is text only: its ``config`` setting is refused and the model it names
resolves from the catalog alone; bodies are at most :data:`memest.web.app.MAX_BODY_BYTES`; each request runs
under a time limit.
"""
