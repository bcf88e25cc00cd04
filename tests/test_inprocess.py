"""tests/inprocess.py runs the CLI as a subprocess would: same exit code, stdout and stderr.

The CLI tests call ``run_memest`` instead of ``python -m memest`` (no interpreter and import start-up
per call); each case here runs both ways and requires identical results, so an in-process test checks
what a user's shell would see.
"""

import os
import subprocess
import sys
import warnings

import pytest
from inprocess import run_memest

ENV = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"HF_HUB_OFFLINE": "1", "MEMEST_DEBUG": ""}


@pytest.mark.parametrize("args", [
    ("hf", "meta-llama/Llama-2-7b-hf", "--serve", "--gpu", "A100-80GB", "--max-model-len", "4096", "--json"),  # 0
    ("hf", "meta-llama/Llama-2-70b-hf", "--serve", "--check", "--gpu", "A100-80GB"),  # 3: does not fit
    ("hf", "meta-llama/Llama-2-7b-hf", "--tp", "3", "--gpus", "3"),  # 2: a MemestError, one line
    ("hf", "gpt2", "--seq-len", "4k"),  # 2: click's usage error, one line
    ("plan", "--help"),  # 0: rich help, piped width
], ids=["json", "check-3", "input-error", "usage-error", "help"])
def test_in_process_run_matches_a_subprocess(args):
    real = subprocess.run([sys.executable, "-m", "memest", *args], capture_output=True, text=True, env=ENV,
                          timeout=120)
    here = run_memest(*args, env=ENV)
    assert (here.returncode, here.stdout, here.stderr) == (real.returncode, real.stdout, real.stderr)


def test_environment_argv_and_warnings_are_restored():
    before_env, before_argv, before_filters = dict(os.environ), list(sys.argv), list(warnings.filters)
    run_memest("hf", "gpt2", env={**ENV, "MEMEST_DEBUG": "1"})
    assert dict(os.environ) == before_env  # COLUMNS, which main() sets for piped output, is gone again too
    assert sys.argv == before_argv and warnings.filters == before_filters


def test_a_warning_reaches_the_captured_stderr(monkeypatch):
    # pytest records warnings raised in a test; a user's terminal prints them, and so does run_memest
    import memest.cli

    def warn(**kwargs):
        warnings.warn("shown to the user", UserWarning, stacklevel=1)

    monkeypatch.setattr(memest.cli, "app", warn)
    out = run_memest("hf")
    assert out.returncode == 0 and "UserWarning: shown to the user" in out.stderr
