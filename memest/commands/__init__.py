"""CLI commands that live in their own module (registered in :mod:`memest.cli`)."""
