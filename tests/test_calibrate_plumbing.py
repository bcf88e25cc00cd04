"""memest calibrate without running a model: flags, supported workloads, device matching, the
predicted-vs-measured rows, the verdict, records, suites and calibrated runtime constants.

Every expected number is derived by hand in the test from the inputs it builds."""

import json
import re
from pathlib import Path

import pytest

from memest.calibration import constants, records, suites
from memest.calibration.compare import VerdictCheck, device_slug, local_device, rows
from memest.calibration.measure import Measurement
from memest.calibration.request import calibration_workload, check_supported, job_from_flags
from memest.devices import get_device
from memest.errors import InputError
from memest.estimate import runtime
from memest.result import Kind, RankEstimate, Term
from memest.sources import load_model
from memest.workload import Engine, Precision, ServingConfig, TrainingConfig
from memest.workload.settings import cli_flag

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "calibrate" / "models" / "tiny-llama")


# ---- flags and supported workloads ----


def test_flags_round_trip_to_the_cli_enums():
    job = job_from_flags({"train": True, "precision": "bf16", "optimizer": "sgd_momentum", "micro_batch_size": 4})
    w = calibration_workload(job, load_model(TINY), 1)
    assert isinstance(w, TrainingConfig)
    assert (w.precision, w.optimizer.value, w.micro_batch_size) == (Precision.BF16, "sgd_momentum", 4)


@pytest.mark.parametrize(("flags", "message"), [
    ({"micro_batchsize": 2}, "unknown workload flag(s) 'micro_batchsize'"),
    ({"precision": "bf32"}, "--precision 'bf32' is not one of mixed, fp16, amp, fsdp2, bf16, fp32"),
], ids=["typo", "bad-choice"])
def test_bad_flags_are_named(flags, message):
    with pytest.raises(InputError) as exc:
        job_from_flags(flags)
    assert message in exc.value.render(cli_flag)  # as the calibrate command prints it
    assert "--" not in str(exc.value)  # a Python caller reads the keywords


def test_nproc_sets_the_data_parallel_degree():
    w = calibration_workload(job_from_flags({"train": True}), load_model(TINY), 2)
    assert (w.parallelism.dp, w.parallelism.world_size) == (2, 2)


@pytest.mark.parametrize(("flags", "nproc", "framework"), [
    ({"train": True, "precision": "mixed"}, 1, "pytorch"),
    ({"train": True, "precision": "bf16"}, 2, "ddp"),
    ({"train": True, "precision": "fsdp2", "zero_stage": 3}, 2, "fsdp"),
    ({"train": True, "precision": "fsdp2"}, 1, "fsdp"),
], ids=["one-process", "ddp", "fsdp2", "fsdp2-one-process"])
def test_the_estimate_is_made_for_the_framework_that_runs(flags, nproc, framework):
    # `memest hf` would pick DeepSpeed for mixed precision; calibrate runs plain PyTorch, so it says so
    w = calibration_workload(job_from_flags(flags), load_model(TINY), nproc)
    assert w.framework.value == framework


def test_a_framework_calibrate_does_not_run_is_refused():
    with pytest.raises(InputError) as exc:
        calibration_workload(job_from_flags({"train": True, "framework": "deepspeed"}), load_model(TINY), 1)
    assert re.search("calibrate runs this job under pytorch .* drop --framework deepspeed", exc.value.render(cli_flag))
    assert re.search("calibrate runs this job under pytorch .* drop framework deepspeed", str(exc.value))


def test_serving_is_estimated_as_the_hf_generate_that_runs():
    w = calibration_workload(job_from_flags({"serve": True, "max_model_len": 256}), load_model(TINY), 1, steps=5)
    assert isinstance(w, ServingConfig)
    assert (w.engine, w.max_new_tokens, w.engine_version) == (Engine.HF, 5, "5")


@pytest.mark.parametrize(("flags", "nproc", "backend", "message"), [
    ({"train": True, "gpus": 4}, 2, "cpu", "--gpus 4 differs from --nproc 2"),
    ({"train": True, "tp": 2, "gpus": 2}, 2, "cpu", "calibrate runs data parallelism only; --tp 2"),
    ({"train": True, "recompute": "selective"}, 1, "cpu", "--recompute selective is Megatron's"),
    ({"train": True, "precision": "fsdp2"}, 2, "cpu", "--precision fsdp2 shards parameters over the 2 processes"),
    ({"train": True, "zero_stage": 3}, 2, "cpu", "--precision mixed keeps a separate fp32 master copy"),
    ({"finetune": "qlora"}, 1, "cpu", "bitsandbytes \\(QLoRA, 8-bit optimizers\\) needs CUDA"),
    ({"train": True, "precision": "amp", "zero_stage": 1}, 2, "cpu", "--zero-stage 1 .* is DeepSpeed's"),
    ({"serve": True, "quantization": "int8"}, 1, "cuda", "calibrate serves unquantized weights"),
    ({"serve": True}, 2, "cuda", "calibrate serves on one device"),
], ids=["gpus-vs-nproc", "tp", "selective", "fsdp2-unsharded", "mixed-zero3", "qlora-cpu", "zero1",
        "quantized-serve", "serve-nproc"])
def test_unsupported_workloads_name_the_flag_and_the_fix(flags, nproc, backend, message):
    with pytest.raises(InputError) as exc:
        w = calibration_workload(job_from_flags(flags), load_model(TINY), nproc)
        check_supported(w, backend=backend, nproc=nproc)
    assert re.search(message, exc.value.render(cli_flag))  # as the calibrate command prints it
    assert "--" not in str(exc.value)  # a Python caller reads the keywords


# ---- the device the estimate is made for ----


@pytest.mark.parametrize(("torch_name", "total", "capability", "catalog", "arch"), [
    ("NVIDIA H100 80GB HBM3", 85_045_870_592, "9.0", "H100-80GB", "hopper"),
    ("NVIDIA A100-SXM4-80GB", 85_097_971_712, "8.0", "A100-80GB", "ampere"),
    ("NVIDIA H200", 150_754_820_096, "9.0", "H200-141GB", "hopper"),
    ("NVIDIA Future GPU", 100 * 2**30, "10.0", "NVIDIA Future GPU", "blackwell"),
], ids=["h100", "a100-sxm4", "h200", "unknown-name"])
def test_cuda_device_names_map_to_the_catalog_with_the_measured_capacity(torch_name, total, capability, catalog, arch):
    d = local_device("cuda", torch_name, total, capability)
    assert (d.name, d.arch, d.memory_bytes, d.measured) == (catalog, arch, total, True)


def test_cpu_device_has_no_runtime_memory():
    cpu = local_device("cpu", "cpu", 64 * 2**30)
    assert (cpu.arch, cpu.kind, device_slug(cpu)) == ("cpu", "cpu", "cpu")
    assert runtime.cuda_context_bytes(cpu) == 0
    assert runtime.cublas_workspace_bytes(cpu) == 0
    assert runtime.allocator_slack(cpu) == 0.0
    assert device_slug(get_device("H100-80GB")) == "h100-80gb"


# ---- rows and the verdict ----

RANK = RankEstimate("all ranks", (
    Term("weights", Kind.WEIGHTS, 1000),
    Term("gradients", Kind.GRADIENTS, 200),
    Term("optimizer_states.moments", Kind.OPTIMIZER_STATES, 400),
    Term("activations.layers", Kind.ACTIVATIONS, 300),
    Term("workspace.cublas", Kind.WORKSPACE, 100),
    Term("allocator", Kind.ALLOCATOR, 200),
    Term("runtime.cuda_context", Kind.RUNTIME, 500),
))


def test_cuda_rows_compare_like_with_like():
    m = Measurement(backend="cuda", device_name="x", steps=2, peak_allocated_bytes=2100, peak_reserved_bytes=2400,
                    reserved_end_bytes=2300, nvml_process_used_bytes=2900, cuda_context_bytes=450)
    got = {r.name: (r.predicted, r.measured) for r in rows(RANK, m, {"weights": 1000, "optimizer_states": 410})}
    assert got["weights"] == (1000, 1000)
    assert got["optimizer_states"] == (400, 410)
    # allocated = 1000 + 200 + 400 + 300 + 100 = 2000; the rest = 2000 - 1000 - 400 vs 2100 - 1000 - 410
    assert got["rest at peak (gradients, activations, logits, kv cache, workspace)"] == (600, 690)
    assert got["peak allocated"] == (2000, 2100)
    assert got["peak reserved"] == (2200, 2400)
    assert got["non-torch memory"] == (500, 2900 - 2300)
    assert got["CUDA context (before any tensor)"] == (500, 450)
    # device used: predicted 2200 + 500; measured peak reserved 2400 + non-torch 600
    assert got["device used"] == (2700, 3000)


def test_error_is_relative_to_the_measurement():
    m = Measurement(backend="cuda", device_name="x", steps=2, peak_allocated_bytes=2100)
    total = next(r for r in rows(RANK, m) if r.name == "peak allocated")
    assert total.delta == -100
    assert total.error == pytest.approx(-100 / 2100)


def test_cpu_rows_move_fp32_masters_from_parameters_to_optimizer_states():
    m = Measurement(backend="cpu", device_name="cpu", steps=2, peak_allocated_bytes=2000,
                    by_category={"PARAMETER": 1300, "OPTIMIZER_STATE": 100, "ACTIVATION": 250, "AUTOGRAD_DETAIL": 40,
                                 "INPUT": 10, "TEMPORARY": 200, "UNKNOWN": 100})
    got = {r.name: (r.predicted, r.measured) for r in rows(RANK, m, {"master_weights": 300})}
    assert got["weights"] == (1000, 1300 - 300)
    assert got["optimizer_states"] == (400, 100 + 300)
    assert got["activations + logits"] == (300, 250 + 40 + 10)
    assert got["workspace"] == (100, 200 + 100)
    assert got["peak allocated"] == (2000, 2000)


@pytest.mark.parametrize(("predicted", "measured", "status"), [
    (True, True, "right"), (False, False, "right"), (False, True, "conservative"), (True, False, "missed"),
], ids=["fits", "oom-foreseen", "conservative", "missed"])
def test_verdict_status(predicted, measured, status):
    assert VerdictCheck(predicted, measured, 0.1).status == status


def test_non_torch_memory_falls_back_to_the_device_delta():
    by_pid = Measurement(backend="cuda", device_name="x", steps=2, reserved_end_bytes=100, nvml_process_used_bytes=700)
    by_delta = Measurement(backend="cuda", device_name="x", steps=2, reserved_end_bytes=100,
                           nvml_device_used_bytes=5000, nvml_used_before_bytes=4200)
    assert by_pid.non_torch_bytes == 600
    assert by_delta.non_torch_bytes == 5000 - 4200 - 100
    assert Measurement(backend="cuda", device_name="x", steps=2, reserved_end_bytes=100).non_torch_bytes is None


def test_measurement_round_trips_through_json():
    m = Measurement(backend="cpu", device_name="cpu", steps=3, peak_allocated_bytes=10, by_category={"PARAMETER": 4},
                    step_peak_bytes=(9, 10, 10), step_seconds=(0.1, 0.2, 0.3))
    assert Measurement.from_dict(json.loads(json.dumps(m.to_dict()))) == m


# ---- records ----


def test_records_append_one_complete_line_each(tmp_path):
    path = tmp_path / "results" / "cpu.jsonl"
    records.append_record(path, {"id": "a", "x": 1})
    records.append_record(path, {"id": "b", "x": [1, 2]})
    lines = path.read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["a", "b"]
    assert [r["id"] for _, r in records.read_records([path])] == ["a", "b"]


def test_a_corrupt_record_line_is_named_and_skipped(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a"}\n{"id": \n')
    with pytest.warns(records.BadRecordLine, match="line 2 is not valid JSON"):
        assert [r["id"] for _, r in records.read_records([path])] == ["a"]


def test_record_ids_sort_by_time():
    from datetime import datetime, timezone

    early = records.new_id(datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc))
    late = records.new_id(datetime(2026, 1, 2, 3, 4, 6, tzinfo=timezone.utc))
    assert early.startswith("20260102T030405Z-") and early < late


# ---- calibrated runtime constants ----


def _cuda_record(rid, *, arch, non_torch, allocated, reserved, mode="train", nproc=1, outcome="ok"):
    m = Measurement(backend="cuda", device_name="H100", steps=3, peak_allocated_bytes=allocated,
                    peak_reserved_bytes=reserved, reserved_end_bytes=reserved, nvml_process_used_bytes=reserved + non_torch)
    return {"id": rid, "outcome": outcome, "device": {"backend": "cuda", "arch": arch},
            "inputs": {"nproc": nproc, "mode": mode}, "measured": [m.to_dict()]}


def test_constants_are_medians_that_name_their_records(tmp_path):
    path = tmp_path / "h100-80gb.jsonl"
    recs = [
        (path, _cuda_record("r1", arch="hopper", non_torch=500, allocated=1000, reserved=1100)),
        (path, _cuda_record("r2", arch="hopper", non_torch=700, allocated=2000, reserved=2400)),
        (path, _cuda_record("r3", arch="hopper", non_torch=600, allocated=1000, reserved=1050, mode="serve")),
        (path, _cuda_record("r4", arch="hopper", non_torch=9999, allocated=1, reserved=2, nproc=2)),  # multi-process: skipped
        (path, _cuda_record("r5", arch="hopper", non_torch=9999, allocated=1, reserved=2, outcome="oom")),  # skipped
    ]
    out = constants.derive(recs, root=tmp_path)
    ctx = out["cuda_context_bytes"]["hopper"]
    assert (ctx["value"], ctx["n"], ctx["min"], ctx["max"]) == (600, 3, 500, 700)  # median of 500, 700, 600
    assert ctx["records"] == ["h100-80gb.jsonl#r1", "h100-80gb.jsonl#r2", "h100-80gb.jsonl#r3"]
    slack = out["allocator_slack"]["hopper"]
    # training records only: 100/1000 = 0.10 and 400/2000 = 0.20 -> median 0.15
    assert (slack["value"], slack["n"]) == (0.15, 2)


def test_runtime_uses_a_calibrated_value_and_says_where_it_came_from(tmp_path, monkeypatch):
    path = tmp_path / "calibrated.json"
    path.write_text(json.dumps({"cuda_context_bytes": {"hopper": {"value": 123_456_789, "records": ["r.jsonl#x"]}},
                                "allocator_slack": {"hopper": {"value": 0.07, "records": ["r.jsonl#y"]}}}))
    monkeypatch.setattr(runtime, "CALIBRATED_PATH", path)
    runtime.calibrated.cache_clear()
    try:
        h100, a100 = get_device("H100-80GB"), get_device("A100-80GB")
        assert runtime.cuda_context_bytes(h100) == 123_456_789
        assert runtime.allocator_slack(h100) == 0.07
        assert runtime.constant_source("cuda_context_bytes", h100) == "calibrated: r.jsonl#x"
        # other families keep the documented defaults
        assert runtime.cuda_context_bytes(a100) == round(0.51 * 2**30)
        assert runtime.allocator_slack(a100) == runtime.ALLOCATOR_SLACK == 0.12
        assert runtime.constant_source("allocator_slack", a100) == "default"
    finally:
        runtime.calibrated.cache_clear()


def test_committed_constants_file_is_well_formed():
    data = json.loads(runtime.CALIBRATED_PATH.read_text())
    for section in ("cuda_context_bytes", "allocator_slack"):
        for arch, entry in data[section].items():
            assert entry["records"], f"{section}.{arch} names no record"
            for ref in entry["records"]:
                file, _, rid = ref.partition("#")
                ids = {r["id"] for _, r in records.read_records([ROOT / file])}
                assert rid in ids, f"{ref} is not a committed record"


# ---- suites ----


@pytest.mark.parametrize("name", ["cpu", "gpu-80gb", "gpu-smoke", "gpu-multi"])
def test_committed_suites_load_and_their_models_resolve(name):
    s = suites.load_suite(str(ROOT / "calibrate" / "suites" / f"{name}.json"))
    assert s.cases and len({c.id for c in s.cases}) == len(s.cases)
    for case in s.cases:
        model = str(s.root / case.model) if (s.root / case.model).exists() else case.model
        assert load_model(model).num_params > 0, case.id


def test_unknown_suite_lists_the_known_ones():
    with pytest.raises(InputError, match="unknown suite 'nope'; known: .*cpu"):
        suites.find_suite("nope", search=(ROOT / "calibrate" / "suites",))


def test_case_command_passes_the_flags_through():
    s = suites.load_suite(str(ROOT / "calibrate" / "suites" / "cpu.json"))
    case = next(c for c in s.cases if c.nproc == 2)
    cmd = suites.case_command(s, case, device="cpu", steps=None, record=False, results_dir=None)
    assert cmd[1:4] == ["-m", "memest", "calibrate"]
    assert cmd[4] == str(s.root / case.model)
    assert [*case.args] == cmd[5:5 + len(case.args)]
    assert cmd[cmd.index("--nproc") + 1] == "2" and "--no-record" in cmd
    assert cmd[cmd.index("--record-tag") + 1] == f"cpu/{case.id}"


# ---- committed records ----

RECORD_FILES = sorted((ROOT / "calibrate" / "results").glob("*.jsonl"))


@pytest.mark.parametrize("path", RECORD_FILES, ids=[p.name for p in RECORD_FILES])
def test_committed_records_are_complete_and_consistent(path):
    seen = set()
    for _, rec in records.read_records([path]):
        assert rec["id"] not in seen
        seen.add(rec["id"])
        assert {"inputs", "model", "versions", "device", "measured", "predicted", "comparison"} <= set(rec)
        for rank in rec["predicted"]["ranks"]:
            allocated = sum(t["bytes"] for t in rank["terms"] if t["kind"] not in ("allocator", "runtime"))
            assert allocated == rank["allocated_bytes"]
        for row_set, m in zip(rec["comparison"]["ranks"], rec["measured"], strict=True):
            total = next(r for r in row_set["rows"] if r["name"] == "peak allocated")
            assert total["measured"] == m["peak_allocated_bytes"]
            assert total["predicted"] == rec["predicted"]["ranks"][0]["allocated_bytes"]


# ---- the CUDA meter's bookkeeping, with a stand-in for torch.cuda (no GPU needed) ----


def test_cuda_meter_carries_peaks_across_steps_and_reads_the_context(monkeypatch):
    import sys
    import types

    from memest.calibration import measure

    stats = iter([
        # baseline (start): what the warm-up left
        {"allocated_bytes.all.current": 50, "reserved_bytes.all.current": 120},
        # step 1 (lap), then the peaks are reset
        {"allocated_bytes.all.peak": 300, "reserved_bytes.all.peak": 400, "active_bytes.all.peak": 350},
        # step 2 (stop): a lower allocated peak; reserved never shrinks
        {"allocated_bytes.all.peak": 250, "reserved_bytes.all.peak": 400, "active_bytes.all.peak": 260,
         "reserved_bytes.all.current": 400, "num_alloc_retries": 2, "num_ooms": 0},
    ])
    cuda = types.SimpleNamespace(
        is_available=lambda: True, device_count=lambda: 1, set_device=lambda i: None, init=lambda: None,
        synchronize=lambda i=None: None, mem_get_info=lambda i=None: (900, 1000),
        get_device_name=lambda i=None: "NVIDIA H100 80GB HBM3", get_device_capability=lambda i=None: (9, 0),
        empty_cache=lambda: None, reset_peak_memory_stats=lambda i=None: None,
        reset_accumulated_memory_stats=lambda i=None: None, memory_stats=lambda i=None: next(stats))
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda, device=lambda *a: a, __version__="x"))
    monkeypatch.setattr(measure.Nvml, "open", classmethod(lambda cls, index: None))  # no nvidia-ml-py
    meter = measure.CudaMeter(0)
    meter.start()
    meter.lap()
    m = meter.stop(2)
    assert m.step_peak_bytes == (300, 250)
    assert (m.peak_allocated_bytes, m.peak_reserved_bytes, m.peak_active_bytes) == (300, 400, 350)
    assert m.peak_requested_bytes is None  # not reported by this allocator
    assert (m.baseline_allocated_bytes, m.baseline_reserved_bytes, m.num_alloc_retries) == (50, 120, 2)
    # without NVML the context is what mem_get_info says the device uses: total 1000 - free 900
    assert (m.context_method, m.cuda_context_bytes) == ("mem_get_info", 100)
    assert m.non_torch_bytes is None and m.device_used_bytes is None


def test_cpu_rows_compare_the_moment_the_measured_peak_matches():
    """The estimate peaks at its optimizer step (weights 100 + gradients 100 + states 200 = 400 B) while the run
    peaked in its loss forward (weights 100 + activations 48 = 148 B): the per-term rows take the estimate's
    loss_forward terms (weights 100, activations 50), the moment nearest the measured breakdown (distance
    |100 - 100| + |50 - 48| = 2, against |0 - 0| + |100 - 0| + |200 - 0| + |0 - 48| = 348 for the step), and the
    totals compare the two peaks: 400 against 148."""
    from memest.result import Kind, RankEstimate, Term

    w, g, o, a = (Term("weights", Kind.WEIGHTS, 100), Term("gradients", Kind.GRADIENTS, 100),
                  Term("optimizer_states", Kind.OPTIMIZER_STATES, 200), Term("activations", Kind.ACTIVATIONS, 50))
    moments = {"loss_forward": [w, a], "optimizer_step": [w, g, o]}
    rank = RankEstimate("all ranks", (w, g, o), 1)
    m = Measurement(backend="cpu", device_name="cpu", steps=2, peak_allocated_bytes=148,
                    by_category={"PARAMETER": 100, "ACTIVATION": 48})
    got = {r.name: r for r in rows(rank, m, moments=moments, peak_moment="optimizer_step")}
    assert set(got) == {"weights", "activations + logits", "peak allocated"}  # no gradients / states at this moment
    assert (got["activations + logits"].predicted, got["activations + logits"].measured) == (50, 48)
    assert got["activations + logits"].error == pytest.approx(2 / 48) and got["weights"].moment == "loss_forward"
    assert (got["peak allocated"].predicted, got["peak allocated"].measured) == (400, 148)
    # without the moments (no training estimate): the peak's own terms, as before
    plain = {r.name: r for r in rows(rank, m)}
    assert plain["gradients"].predicted == 100 and plain["gradients"].measured == 0


def test_a_near_zero_measured_term_has_no_percentage():
    """548 B of activations at a 80 MiB peak is under 1% of it (0.8 MiB): no relative error (-100% says nothing),
    the difference is given; 2% of the peak keeps its error."""
    from memest.result import Kind, RankEstimate, Term

    peak = 80 * 2**20
    rank = RankEstimate("all ranks", (Term("weights", Kind.WEIGHTS, peak),), 1)
    m = Measurement(backend="cpu", device_name="cpu", steps=2, peak_allocated_bytes=peak,
                    by_category={"PARAMETER": peak - 548, "ACTIVATION": 548})
    act = next(r for r in rows(rank, m) if r.name == "activations + logits")
    assert (act.predicted, act.measured, act.error, act.delta) == (0, 548, None, -548)
    m2 = Measurement(backend="cpu", device_name="cpu", steps=2, peak_allocated_bytes=peak,
                     by_category={"PARAMETER": peak - peak // 50, "ACTIVATION": peak // 50})
    assert next(r for r in rows(rank, m2) if r.name == "activations + logits").error == -1.0
