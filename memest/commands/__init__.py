"""Commands that live in their own module (typer's one-file-per-command pattern).

Each module registers its command on :data:`memest.cli.app` when imported; ``memest.cli`` imports
them at its end. They follow the rules of ``memest.cli``: parse flags, call the library, hand the
result to :mod:`memest.report`; no heavy imports.
"""
