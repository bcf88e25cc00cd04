"""memest calibrate on the CPU, for real: tiny llama-family models trained and served with the
profiler's memory timeline, one process and two (gloo: DDP and FSDP2), against the estimate.

The tolerance is the issue's: predicted peak allocated within 10% of measured. A case the formulas
miss by more is marked ``xfail(strict=True)`` with the finding that explains it
(benchmarks/calibration_findings.md), so it fails loudly the day the formulas fix it; none is now.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from typer.testing import CliRunner

from memest.calibration import runner as calibration_runner
from memest.calibration.compare import evaluate
from memest.calibration.request import Request, calibration_workload
from memest.cli import app
from memest.sources import load_model

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "calibrate" / "models" / "tiny-llama")
TOLERANCE = 0.10
"""Predicted peak allocated within 10% of measured (issue 6)."""
METHODS_AGREE = 0.001
"""The profiler's categorised timeline and the allocator's running total count the same tensors."""

# tiny-llama: h 128, i 352, 2 layers, 4 heads / 2 KV heads of 32, V 4096, untied lm_head
P = 4096 * 128 + 2 * ((128 * 128 + 2 * 128 * 64 + 128 * 128) + 3 * 128 * 352 + 2 * 128) + 128 + 4096 * 128
NUM_PARAM_TENSORS = 1 + 2 * 9 + 1 + 1  # embedding, 9 per layer (4 attention, 3 MLP, 2 norms), final norm, lm_head

TRAIN = {"micro_batch_size": 2, "seq_len": 128}

# History (benchmarks/calibration_findings.md): before the training formulas were merged, fp32 full
# training (+14.9%), full recompute (+26.4%) and bf16 LoRA (-11.3%) were beyond 10% and xfail(strict)
# here (findings F1-F3); the merge fixed them, which those strict xfails reported as failures.


def calibrate_here(flags):
    """One process, in this interpreter: (measurement payload, Calibration)."""
    request = Request(model=TINY, flags=flags, backend="cpu")
    payloads = calibration_runner.run(request)
    spec = load_model(TINY)
    workload = calibration_workload(request.job(), spec, 1)
    return payloads[0], evaluate(spec, workload, payloads, headroom=0.1)


@pytest.fixture(scope="module")
def fp32_train():
    return calibrate_here({"train": True, "precision": "fp32", **TRAIN})


@pytest.mark.slow
def test_measured_weights_and_optimizer_states_are_exact(fp32_train):
    payload, result = fp32_train
    m = result.ranks[0].measurement
    assert P == 1_417_856
    assert m.by_category["PARAMETER"] == 4 * P
    # AdamW: exp_avg and exp_avg_sq in fp32, plus a 4-byte fp32 `step` tensor per parameter tensor
    assert m.by_category["OPTIMIZER_STATE"] == 2 * 4 * P + 4 * NUM_PARAM_TENSORS
    assert payload["static"]["weights"] == 4 * P
    assert "GRADIENT" not in m.by_category  # the peak is at the loss backward, before any gradient (F1)


@pytest.mark.slow
def test_timeline_and_allocator_total_agree(fp32_train):
    m = fp32_train[1].ranks[0].measurement
    assert m.peak_method == "timeline"
    assert m.allocations_peak_bytes == pytest.approx(m.peak_allocated_bytes, rel=METHODS_AGREE)
    assert len(set(m.step_peak_bytes)) == 1  # identical steps after the warm-up, to the byte


def _within(result):
    for rank in result.ranks:
        row = rank.row("peak allocated")
        assert abs(row.error) <= TOLERANCE, (f"rank {rank.rank}: predicted {row.predicted:,} vs measured "
                                             f"{row.measured:,} ({row.error:+.1%})")


@pytest.mark.slow
def test_full_fp32_within_tolerance(fp32_train):
    _within(fp32_train[1])


@pytest.mark.slow
@pytest.mark.parametrize("flags", [
    pytest.param({"train": True, "precision": "bf16", **TRAIN}, id="train-bf16"),
    pytest.param({"train": True, "precision": "mixed", **TRAIN}, id="train-mixed"),
    pytest.param({"train": True, "precision": "amp", **TRAIN}, id="train-amp"),
    pytest.param({"finetune": "lora", "precision": "fp32", "lora_rank": 8, **TRAIN}, id="lora-fp32"),
    pytest.param({"finetune": "lora", "precision": "mixed", "lora_rank": 8, "lora_targets": "all-linear", **TRAIN},
                 id="lora-mixed-all-linear"),
    pytest.param({"train": True, "precision": "fp32", "recompute": "full", **TRAIN}, id="train-fp32-recompute-full"),
    pytest.param({"serve": True, "dtype": "fp32", "batch_size": 4, "max_model_len": 256}, id="serve-fp32"),
])
def test_one_process_within_tolerance(flags):
    _within(calibrate_here(flags)[1])


# ---- two processes over gloo ----


def calibrate_torchrun(tmp_path, *flags):
    out = subprocess.run(
        [sys.executable, "-m", "memest", "calibrate", TINY, "--device", "cpu", "--nproc", "2", "--json",
         "--results-dir", str(tmp_path), "--micro-batch-size", "2", "--seq-len", "128", *flags],
        check=False, capture_output=True, text=True, timeout=300, env={**os.environ, "MEMEST_DEBUG": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def fsdp2_record(tmp_path_factory):
    # gloo frees some all-gather buffers on its own threads, unseen by the profiler, inflating about one
    # step in three (calibration_findings.md, M2): five steps make the smallest step a clean one
    return calibrate_torchrun(tmp_path_factory.mktemp("fsdp2"), "--train", "--precision", "fsdp2", "--zero-stage", "3",
                              "--steps", "5")


@pytest.mark.slow
def test_fsdp2_two_processes_gather_on_rank_0(fsdp2_record):
    rec = fsdp2_record
    assert [m["rank"] for m in rec["measured"]] == [0, 1]
    assert all(m["world_size"] == 2 and m["outcome"] == "ok" for m in rec["measured"])
    assert rec["inputs"]["nproc"] == 2 and rec["inputs"]["workload"]["parallelism"]["zero_stage"] == 3
    # each rank holds half of the fp32 parameters (sharded dim 0; every tensor's rows are even)
    assert all(m["static"]["weights"] == 4 * P // 2 for m in rec["measured"])


@pytest.mark.slow
def test_fsdp2_within_tolerance(fsdp2_record):
    predicted = fsdp2_record["predicted"]["ranks"][0]["allocated_bytes"]
    for m in fsdp2_record["measured"]:
        assert abs(predicted - m["peak_allocated_bytes"]) <= TOLERANCE * m["peak_allocated_bytes"], m["step_peak_bytes"]


@pytest.mark.slow
def test_ddp_two_processes_within_tolerance(tmp_path):
    rec = calibrate_torchrun(tmp_path, "--train", "--precision", "fp32")
    predicted = rec["predicted"]["ranks"][0]["allocated_bytes"]
    assert [m["rank"] for m in rec["measured"]] == [0, 1]
    for m in rec["measured"]:
        assert abs(predicted - m["peak_allocated_bytes"]) <= TOLERANCE * m["peak_allocated_bytes"]
    assert len(list(tmp_path.glob("*.jsonl"))) == 1


# ---- out of memory and Ctrl-C through the CLI ----


def _fail_on_measured_step(monkeypatch, exc):
    from memest.calibration.training import TrainingSession

    calls = {"n": 0}
    real = TrainingSession.step

    def step(self):
        calls["n"] += 1
        if calls["n"] == 2:  # the warm-up runs, the first measured step fails
            raise exc
        real(self)

    monkeypatch.setattr(TrainingSession, "step", step)


def test_out_of_memory_is_recorded_as_did_not_fit(tmp_path, monkeypatch):
    _fail_on_measured_step(monkeypatch, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    result = CliRunner().invoke(app, ["calibrate", TINY, "--train", "--device", "cpu", "--results-dir", str(tmp_path),
                                      "--precision", "mixed", "--optimizer", "adamw",  # the old default pinned
                                      "--micro-batch-size", "2", "--seq-len", "128", "--json"])
    assert result.exit_code == 3, result.output
    [line] = (tmp_path / "cpu.jsonl").read_text().splitlines()
    rec = json.loads(line)
    assert rec["outcome"] == "oom"
    assert rec["measured"][0]["error"] == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert rec["predicted"]["ranks"][0]["allocated_bytes"] > 0  # the estimate beside it
    assert rec["comparison"]["verdict"]["status"] == "missed"  # predicted a fit on this machine's RAM


def test_ctrl_c_leaves_no_record(tmp_path, monkeypatch):
    _fail_on_measured_step(monkeypatch, KeyboardInterrupt())
    result = CliRunner().invoke(app, ["calibrate", TINY, "--train", "--device", "cpu", "--results-dir", str(tmp_path),
                                      "--precision", "mixed", "--optimizer", "adamw",  # the old default pinned
                                      "--micro-batch-size", "2", "--seq-len", "128"])
    assert result.exit_code == 130  # the CLI's "interrupted"
    assert not list(tmp_path.iterdir())
