"""Defects found by trying bad input (issue 11, section 6): each test reproduces one defect.

Every bad input is one line on stderr with exit code 2 and no traceback; nothing hangs; nothing
written is half-written; remote code runs only from the folder the user named, and only with the flag.
Most tests call the CLI's error boundary (``memest.cli.main``) in-process; the few that need a fresh
interpreter (remote code, which transformers caches per process; file-size limits; signals) use a
subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memest import cli

ROOT = Path(__file__).resolve().parent.parent
ENV = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "MEMEST_DEBUG")} | {"HF_HUB_OFFLINE": "1",
                                                                                     "PYTHONPATH": str(ROOT)}
TINY = {  # a 2-layer Llama: hidden 64, 4 heads of 16, vocab 128
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 128,
    "max_position_embeddings": 256, "torch_dtype": "bfloat16",
}


def memest(monkeypatch, capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``memest ARGV`` through the CLI's error boundary in this process: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["memest", *argv])
    monkeypatch.delenv("MEMEST_DEBUG", raising=False)
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def refused(monkeypatch, capsys, *argv: str) -> str:
    """The one-line message of a refused input (exit code 2, no traceback)."""
    code, out, err = memest(monkeypatch, capsys, *argv)
    assert code == 2, (code, out[-2000:], err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    assert "Traceback" not in err and "unexpectedly" not in err, err
    return lines[0]


def write_config(folder: Path, raw: dict, name: str = "config.json") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(raw))
    return path


# ---- remote code comes only from the folder named ------------------------------------------------

_REMOTE_CONFIG = """
from pathlib import Path
Path({marker!r}).write_text("imported")
from transformers import LlamaConfig
class RemoteConfig(LlamaConfig):
    model_type = "memest_remote_test"
"""
_REMOTE_MODEL = """
from transformers import LlamaForCausalLM
from .configuration_remote import RemoteConfig
class RemoteForCausalLM(LlamaForCausalLM):
    config_class = RemoteConfig
"""


def _remote_folder(folder: Path, marker: Path) -> None:
    raw = dict(TINY, model_type="memest_remote_test", architectures=["RemoteForCausalLM"],
               auto_map={"AutoConfig": "configuration_remote.RemoteConfig",
                         "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM"})
    write_config(folder, raw)
    (folder / "configuration_remote.py").write_text(_REMOTE_CONFIG.format(marker=str(marker)))
    (folder / "modeling_remote.py").write_text(_REMOTE_MODEL)


def test_remote_code_runs_from_the_named_folder_not_the_cwd(tmp_path):
    # /tmp/x/named/remote is the folder the user names; /tmp/x/cwd/remote is a decoy of the same base
    # name in the working directory. Only the named folder's configuration_remote.py may run.
    named, decoy = tmp_path / "named" / "remote", tmp_path / "cwd" / "remote"
    _remote_folder(named, tmp_path / "named.marker")
    _remote_folder(decoy, tmp_path / "decoy.marker")
    env = ENV | {"HF_MODULES_CACHE": str(tmp_path / "modules")}
    proc = subprocess.run([sys.executable, "-m", "memest", "hf", str(named), "--trust-remote-code", "--json"],
                          cwd=tmp_path / "cwd", capture_output=True, text=True, env=env, timeout=300)
    assert not (tmp_path / "decoy.marker").exists(), proc.stderr[-2000:]
    assert (tmp_path / "named.marker").exists(), proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr[-2000:]
    # 2 layers x (4 x 64x64 attention + 3 x 64x128 MLP + 2 x 64 norms) + 2 x 128x64 (embedding, head) + 64
    # = 2 x (16384 + 24576 + 128) + 16384 + 64 = 82176 + 16384 + 64 = 98624
    assert json.loads(proc.stdout)["model"]["num_params"] == 98624


def test_remote_code_never_runs_without_the_flag(tmp_path, monkeypatch, capsys):
    named = tmp_path / "remote"
    _remote_folder(named, tmp_path / "named.marker")
    monkeypatch.chdir(tmp_path)
    message = refused(monkeypatch, capsys, "hf", str(named))
    assert "--trust-remote-code" in message
    assert not (tmp_path / "named.marker").exists()
