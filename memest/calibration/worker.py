"""Entry point of each torchrun worker that ``memest calibrate --nproc N`` starts.

``python -m memest.calibration.worker REQUEST.json``: measures this rank; rank 0 writes every
rank's figures to ``result.json`` in the run folder (:data:`~memest.calibration.distributed.RUN_DIR_ENV`).
Progress lines of rank 0 go to stdout prefixed with ``[memest]`` for the launcher to show.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from memest.calibration.distributed import RUN_DIR_ENV, DistEnv
from memest.calibration.request import Request
from memest.calibration.runner import run, write_json
from memest.errors import MemestError
from memest.workload.settings import cli_flag


def _progress(message: str) -> None:
    print(f"[memest] {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the request file named in ``argv``; 0 on success, 2 on bad input."""
    args = sys.argv[1:] if argv is None else argv
    request = Request.from_dict(json.loads(Path(args[0]).read_text()))
    env = DistEnv.from_environ()
    try:
        gathered = run(request, progress=_progress if env is None or env.rank == 0 else (lambda _: None))
    except MemestError as exc:
        print(f"[memest] Error: {exc.render(cli_flag)}", flush=True)  # the calibrate command's flags
        return 2
    run_dir = os.environ.get(RUN_DIR_ENV)
    if gathered is not None and run_dir:
        write_json(Path(run_dir) / "result.json", gathered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
