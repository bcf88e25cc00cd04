"""Records as corrections: ``memest calibrate --report`` (errors per device and stack, the constants records
imply) and ``use_calibration`` (the user's constants in later estimates, said in the assumptions).

The records are built by hand (the fields :mod:`memest.calibration.records` writes and
:func:`memest.calibration.constants.implied` reads); every expected value is computed in a comment.
"""

from __future__ import annotations

import json

import pytest
from inprocess import run_memest

from memest.calibration.measure import Measurement
from memest.calibration.summary import summarize, summary_dict

MiB = 1 << 20
GiB = 1 << 30
H100 = "NVIDIA H100 80GB HBM3"


def _rec(rid, *, device=H100, arch="hopper", backend="cuda", stack="hf-trainer", non_torch=None, allocated=10 * GiB,
         reserved=11 * GiB, errors=(), nproc=1, outcome="ok", origin=None, context=None):
    m = Measurement(backend=backend, device_name=device, steps=2, peak_allocated_bytes=allocated,
                    peak_reserved_bytes=reserved if backend == "cuda" else None,
                    reserved_end_bytes=reserved if backend == "cuda" else None,
                    nvml_process_used_bytes=reserved + non_torch if non_torch is not None else None,
                    cuda_context_bytes=context)
    rows = [{"name": name, "predicted": 0, "measured": 1, "error": e, "terms": []} for name, e in errors]
    rec = {"id": rid, "outcome": outcome, "device": {"backend": backend, "arch": arch, "name": device},
           "inputs": {"nproc": nproc, "mode": "train", "workload": {"stack": stack}},
           "measured": [m.to_dict()], "comparison": {"ranks": [{"rank": 0, "rows": rows}]}}
    if origin:
        rec["origin"] = origin
    return rec


def _write(folder, recs):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "h100.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_summary_per_device_and_stack():
    """Three hopper hf-trainer records within memory: peak allocated errors +0.05, -0.10, +0.02 -> median
    +0.02, worst -0.10; non-torch 500, 700, 600 MiB -> median 600 MiB; slack (11 - 10) / 10 = 0.10 each.
    A two-process run with 1,624 MiB non-torch: NCCL 1,624 - 600 = 1,024 MiB. An out-of-memory run is
    counted, never compared. A CPU track record is a group of its own, with no constants."""
    recs = [
        _rec("a", non_torch=500 * MiB, errors=[("peak allocated", 0.05)], context=400 * MiB),
        _rec("b", non_torch=700 * MiB, errors=[("peak allocated", -0.10)]),
        _rec("c", non_torch=600 * MiB, errors=[("peak allocated", 0.02)], origin="hf-callback"),
        _rec("d", non_torch=1624 * MiB, nproc=2, errors=[("peak allocated", 0.04)]),
        _rec("e", non_torch=10 * GiB, outcome="oom", errors=[("peak allocated", 5.0)]),
        _rec("f", device="cpu", arch="cpu", backend="cpu", stack="pytorch", errors=[("peak allocated", -0.01)],
             origin="track"),
    ]
    groups = summarize(("x.jsonl", r) for r in recs)
    assert [(g.device, g.stack) for g in groups] == [(H100, "hf-trainer"), ("cpu", "pytorch")]
    gpu, cpu = groups
    assert (gpu.records, gpu.out_of_memory) == (5, 1)
    assert dict(gpu.origins) == {"calibrate": 4, "hf-callback": 1}
    (peak,) = gpu.figures
    # errors +0.05, -0.10, +0.02, +0.04 (record d's too): median (0.02 + 0.04) / 2 = 0.03, worst -0.10
    assert (peak.n, peak.median_error, peak.worst_error) == (4, pytest.approx(0.03), -0.10)
    constants = {c.name: c for c in gpu.constants}
    assert (constants["cuda_context_bytes"].value, constants["cuda_context_bytes"].n) == (600 * MiB, 3)
    assert constants["allocator_slack"].value == pytest.approx(0.10)
    assert constants["context_before_tensors_bytes"].value == 400 * MiB
    assert constants["nccl_bytes"].value == 1024 * MiB
    assert cpu.constants == () and cpu.figures[0].worst_error == -0.01
    data = summary_dict(groups)
    assert data["groups"][0]["figures"][0]["name"] == "peak allocated"


def test_report_command_prints_the_summary_and_refuses_nothing_to_read(tmp_path):
    _write(tmp_path / "results", [_rec("a", non_torch=600 * MiB, errors=[("peak allocated", 0.05)])])
    out = run_memest("calibrate", "--report", "--results-dir", str(tmp_path / "results"), "--json")
    assert out.returncode == 0, out.stderr
    group = json.loads(out.stdout)["groups"][0]
    assert (group["device"], group["stack"], group["figures"][0]["worst_error"]) == (H100, "hf-trainer", 0.05)
    text = run_memest("calibrate", "--report", "--results-dir", str(tmp_path / "results"))
    assert text.returncode == 0 and "CUDA context + handles" in text.stdout and "600.00 MiB" in text.stdout
    empty = run_memest("calibrate", "--report", "--results-dir", str(tmp_path / "none"))
    assert empty.returncode == 2 and "no calibration records in" in empty.stderr
    assert len(empty.stderr.strip().splitlines()) == 1
    both = run_memest("calibrate", "tiny", "--report")
    assert both.returncode == 2 and "--report summarizes the records" in both.stderr


def test_use_calibration_applies_the_users_constants_and_says_so(tmp_path, monkeypatch):
    """Records of a hopper GPU: non-torch 600 MiB, slack (11 - 10) / 10 = 0.10. With use_calibration the
    H100 estimate's CUDA context term is 600 MiB = 629,145,600 B (memest's default: 0.51 GiB =
    547,608,330 B) and its assumptions say so; an A100 (ampere) keeps the default and says the records do
    not cover it. Off by default."""
    import memest

    _write(tmp_path / "calibrate" / "results", [_rec("a", non_torch=600 * MiB)])
    monkeypatch.chdir(tmp_path)
    job = {"mode": "train", "seq_len": 512}

    def context(r):
        return next(t["bytes"] for t in r.to_dict()["terms"] if t["name"] == "runtime.cuda_context")

    plain = memest.estimate_memory("meta-llama/Llama-3.1-8B", gpu="H100", **job)
    assert context(plain) == round(0.51 * GiB) == 547_608_330
    assert not any("use_calibration" in a for a in plain.assumptions)
    mine = memest.estimate_memory("meta-llama/Llama-3.1-8B", gpu="H100", use_calibration=True, **job)
    assert context(mine) == 600 * MiB == 629_145_600
    (said,) = [a for a in mine.assumptions if a.startswith("use_calibration:")]
    assert "hopper" in said and "calibrate/results, 1 of 1 record" in said
    ampere = memest.estimate_memory("meta-llama/Llama-3.1-8B", gpu="A100-80GB", use_calibration=True, **job)
    assert context(ampere) == 547_608_330
    assert any("hold no one-process CUDA run on ampere" in a for a in ampere.assumptions)


def test_use_calibration_without_records_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = run_memest("hf", "meta-llama/Llama-3.1-8B", "--train", "--use-calibration")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]
    assert out.stderr.startswith("Error: --use-calibration reads your calibration records")
