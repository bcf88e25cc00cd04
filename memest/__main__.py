"""``python -m memest`` and the ``memest`` console script.

A Ctrl-C while the modules load is answered as one later is (:func:`memest.cli.main`): one
"Interrupted." line and exit code 130, no traceback.
"""

import sys


def run() -> None:
    """The console entry point: load the CLI, then run it."""
    try:
        from memest.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("Interrupted.\n")
        raise SystemExit(130) from None
    main()


if __name__ == "__main__":
    run()
