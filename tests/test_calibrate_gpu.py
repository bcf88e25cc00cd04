"""memest calibrate on a CUDA device (skipped without one: see conftest.py).

Run on a GPU machine with ``python -m pytest -q -m gpu tests/test_calibrate_gpu.py`` (or
``calibrate/run_gpu_suite.sh``, which runs these first)."""

import json
from pathlib import Path

import pytest

from memest.calibration import runner as calibration_runner
from memest.calibration.compare import evaluate
from memest.calibration.request import Request, calibration_workload
from memest.sources import load_model

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "calibrate" / "models" / "tiny-llama")
TOLERANCE = 0.10
P = 1_417_856  # tiny-llama's parameters (derived by hand in test_calibrate_cpu.py)
TRAIN = {"micro_batch_size": 2, "seq_len": 128}


def calibrate_cuda(flags):
    request = Request(model=TINY, flags=flags, backend="cuda")
    payloads = calibration_runner.run(request)
    spec = load_model(TINY)
    return payloads[0], evaluate(spec, calibration_workload(request.job(), spec, 1), payloads, headroom=0.1)


@pytest.fixture(scope="module")
def bf16_train():
    return calibrate_cuda({"train": True, "precision": "bf16", **TRAIN})


def test_cuda_protocol_figures_are_consistent(bf16_train):
    payload, result = bf16_train
    m = result.ranks[0].measurement
    assert m.backend == "cuda" and m.outcome == "ok" and m.steps == 3
    assert payload["static"]["weights"] == 2 * P  # bf16 parameters, exactly
    # AdamW states in the parameter dtype (bf16) + one fp32 step tensor per parameter tensor (21)
    assert payload["static"]["optimizer_states"] == 2 * 2 * P + 4 * 21
    assert m.baseline_allocated_bytes >= 2 * P + 2 * 2 * P
    assert m.peak_allocated_bytes <= m.peak_active_bytes <= m.peak_reserved_bytes
    assert m.peak_allocated_bytes % 512 == 0  # the caching allocator's block rounding
    assert m.cuda_context_bytes > 100 * 2**20  # every CUDA context of the last decade is hundreds of MiB
    assert m.device_total_bytes > m.device_free_end_bytes
    assert len(m.step_peak_bytes) == 3 and max(m.step_peak_bytes) == m.peak_allocated_bytes
    if m.nvml_device_used_bytes is not None:  # nvidia-ml-py installed
        assert m.non_torch_bytes > 0
        assert m.device_used_bytes == m.peak_reserved_bytes + m.non_torch_bytes
    assert payload["environment"]["cuda"] and payload["environment"]["device_capability"]


def test_cuda_bf16_training_within_tolerance(bf16_train):
    row = bf16_train[1].ranks[0].row("peak allocated")
    assert abs(row.error) <= TOLERANCE, (row.predicted, row.measured)


def test_cuda_serving_within_tolerance():
    _, result = calibrate_cuda({"serve": True, "dtype": "bf16", "batch_size": 4, "max_model_len": 256})
    row = result.ranks[0].row("peak allocated")
    assert abs(row.error) <= TOLERANCE, (row.predicted, row.measured)


def test_cuda_out_of_memory_is_recorded_and_the_device_released(tmp_path):
    import torch
    from typer.testing import CliRunner

    from memest.cli import app

    torch.cuda.set_per_process_memory_fraction(0.0001)  # a few MiB: the model cannot even be built
    try:
        result = CliRunner().invoke(app, ["calibrate", TINY, "--train", "--device", "cuda", "--json",
                                          "--results-dir", str(tmp_path), "--micro-batch-size", "2", "--seq-len", "128"])
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert result.exit_code == 3, result.output
    [line] = next(tmp_path.glob("*.jsonl")).read_text().splitlines()
    rec = json.loads(line)
    assert rec["outcome"] == "oom" and rec["measured"][0]["error"].startswith("OutOfMemoryError")
    assert torch.cuda.memory_allocated() == 0  # nothing of the failed run is left on the device
