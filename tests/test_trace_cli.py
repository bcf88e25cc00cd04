"""``memest hf --trace`` / ``--plot`` as a user meets them, and the trace package's import discipline."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from inprocess import run_memest
from trace_models import tiny_config

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "MEMEST_DEBUG": ""}


def run(*args: str) -> subprocess.CompletedProcess:
    return run_memest(*args, env=ENV, timeout=300)  # through main(), in-process (tests/inprocess.py)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "config.json"
    path.write_text(json.dumps(tiny_config("llama").raw))
    return path


def test_trace_json_sits_beside_the_estimate(tiny_path: Path, tmp_path: Path) -> None:
    plot = tmp_path / "timeline.png"
    out = run("hf", str(tiny_path), "--train", "--seq-len", "256", "--micro-batch-size", "2", "--gpu", "H100-80GB",
              "--json", "--plot", str(plot))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    tr = doc["trace"]
    assert tr["world_size"] == 1
    assert tr["peak_phase"] in ("forward", "backward", "optimizer")
    assert sum(tr["by_kind"].values()) == tr["peak_allocated_bytes"]  # the kinds at the peak add up to it
    assert tr["peak_allocated_bytes"] <= tr["peak_reserved_bytes"]
    rows = {r["name"]: r for r in tr["comparison"]}
    assert rows["peak allocated"]["estimate_bytes"] == doc["per_device"]["allocated_bytes"]
    assert rows["peak allocated"]["trace_bytes"] == tr["peak_allocated_bytes"]
    assert all(isinstance(r["diff_bytes"], int) for r in tr["comparison"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trace_table_and_refusals(tiny_path: Path) -> None:
    out = run("hf", str(tiny_path), "--serve", "--engine", "hf", "--max-model-len", "128", "--trace")
    assert out.returncode == 0, out.stderr
    assert "trace vs estimate" in out.stdout
    assert "kv_cache" in out.stdout
    refused = run("hf", str(tiny_path), "--finetune", "qlora", "--trace")
    assert refused.returncode == 2
    assert refused.stderr.startswith("Error: --finetune qlora cannot be traced")


def test_importing_the_trace_package_loads_no_torch() -> None:
    code = (
        "import sys, memest.trace, memest.trace.compare, memest.trace.allocator, memest.trace.result;"
        "print(' '.join(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
