"""``memest CMD --help`` keeps every flag name whole at any width: rich wraps the help column
instead of cutting names with "…" (``--attn-implementa…`` at 80 columns before the fix)."""

import os

import pytest
import typer.main
from inprocess import run_memest

from memest.cli import app
from memest.cli.options import WORKLOAD_OPTIONS, flag_name

COMMANDS = ("hf", "plan", "sweep", "calibrate", "check", "serve")
WORKLOAD_COMMANDS = ("hf", "plan", "sweep")


def _flags(command: str) -> set[str]:
    """Every long flag the command shows in its help, its --no- forms too."""
    params = typer.main.get_command(app).commands[command].params
    return {opt for p in params if not getattr(p, "hidden", False)
            for opt in (*p.opts, *p.secondary_opts) if opt.startswith("--")}


def test_workload_commands_take_every_setting() -> None:
    for command in WORKLOAD_COMMANDS:
        assert {flag_name(name) for name in WORKLOAD_OPTIONS} <= _flags(command), command


@pytest.mark.parametrize("columns", [80, 200])
@pytest.mark.parametrize("command", COMMANDS)
def test_help_keeps_flag_names_whole(command: str, columns: int) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MEMEST_DEBUG": "", "COLUMNS": str(columns)}
    result = run_memest(command, "--help", env=env)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "…" not in text
    too_wide = [line for line in text.splitlines() if len(line) > columns]
    assert not too_wide, too_wide
    # a flag is whole when it stands as a word of its own: not followed by more of a name
    words = {w.strip("│,/[]()") for line in text.splitlines() for w in line.split()}
    missing = sorted(f for f in _flags(command) if f not in words)
    assert not missing, missing
