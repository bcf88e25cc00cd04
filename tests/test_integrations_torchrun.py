"""memest.integrations under ``torchrun --nproc_per_node 2`` with gloo on the CPU, for real: DDP and FSDP2 with
``memest.track``, and the HF Trainer (its own DDP) with ``MemestCallback``. Each job is one launch of
tests/torchrun_integrations.py (one process per rank); what each rank's watch read and logged comes back in
``rank-N.json``, the record in ``results/cpu.jsonl``.

The model is tests/test_integrations.py's tiny Llama, P = 667,520 parameters in 30 tensors (the count is derived
there: embed 38,400 + 3 layers x 196,864 + final norm 128 + lm_head 38,400). By hand, per rank:

- DDP (a full replica): weights 4 B x P = 2,670,080 B; torch AdamW's exp_avg and exp_avg_sq 2 x 4 B x P plus
  one 4-byte ``step`` tensor per parameter tensor: 5,340,160 + 120 = 5,340,280 B.
- FSDP2 (``fully_shard`` on each decoder layer and the model, 2 ranks): every parameter is sharded on dim 0,
  and every dim 0 is even (300, 128, 64, 384), so each rank holds exactly half: weights 4 B x P / 2 =
  1,335,040 B (the fp32 shards; the bf16 ``param_dtype`` copies exist only while a unit is unsharded);
  AdamW's two states follow the shards, 2 x 4 B x P / 2 = 2,670,080 B, and the 30 ``step`` scalars are not
  sharded: 2,670,200 B.

The measured peak of each rank is within TOLERANCE of the estimate: the 10% ``memest calibrate`` meets on the
CPU for the same two-process DDP and FSDP2 jobs (tests/test_calibrate_cpu.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve().parent / "torchrun_integrations.py"
TOLERANCE = 0.10
"""Predicted peak allocated within 10% of measured, as tests/test_calibrate_cpu.py."""
P = 38_400 + 3 * 196_864 + 128 + 38_400
TENSORS = 1 + 3 * 9 + 1 + 1
TIMEOUT_S = 240
"""One launch: two interpreters importing torch and transformers, a few profiled steps of a 0.7 M-parameter model."""


def launch(tmp_path: Path, mode: str) -> tuple[dict[int, dict], list[dict]]:
    """Run MODE under torchrun; (each rank's report, the records written)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MEMEST_DEBUG": "",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
                          str(SCRIPT), mode, str(tmp_path)],
                         capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=tmp_path, check=False)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    ranks = {r: json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)}
    from memest.calibration.records import BadRecordLine, read_records

    with warnings.catch_warnings():
        warnings.simplefilter("error", BadRecordLine)  # a line two processes garbled would be one
        records = [rec for _, rec in read_records(sorted((tmp_path / "results").glob("*.jsonl")))]
    return ranks, records


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    return launch(tmp_path_factory.mktemp("ddp"), "ddp")


@pytest.fixture(scope="module")
def fsdp2(tmp_path_factory):
    return launch(tmp_path_factory.mktemp("fsdp2"), "fsdp2")


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    return launch(tmp_path_factory.mktemp("hf"), "hf")


def _one_record_of_both_ranks(ranks: dict[int, dict], records: list[dict], origin: str) -> dict:
    """One record, written by rank 0, holding both ranks' measurements and comparisons."""
    (rec,) = records
    assert rec["origin"] == origin and rec["inputs"]["nproc"] == 2 and rec["device"]["count"] == 2
    assert [m["rank"] for m in rec["measured"]] == [0, 1]
    assert all(m["world_size"] == 2 and m["outcome"] == "ok" and m["backend"] == "cpu" for m in rec["measured"])
    assert [c["rank"] for c in rec["comparison"]["ranks"]] == [0, 1]
    assert ranks[0]["record_path"] is not None and ranks[1]["record_path"] is None
    return rec


def _rank_zero_alone_logs(ranks: dict[int, dict]) -> None:
    """Rank 0 logs the estimate once and both ranks' comparisons; rank 1 logs nothing."""
    lines = ranks[0]["lines"]
    assert sum("predicted per device on cpu" in line for line in lines) == 1
    assert any(line.startswith("memest: rank 0 on cpu") for line in lines)
    assert any(line.startswith("memest: rank 1 on cpu") for line in lines)
    assert ranks[1]["lines"] == []


def _within_tolerance(rec: dict) -> None:
    """Each rank's measured peak is that rank's real figure, and the estimate is within 10% of it."""
    for m, comparison in zip(rec["measured"], rec["comparison"]["ranks"], strict=True):
        rows = {r["name"]: r for r in comparison["rows"]}
        peak = rows["peak allocated"]
        assert peak["measured"] == m["peak_allocated_bytes"] == min(m["step_peak_bytes"])
        assert peak["predicted"] == rec["predicted"]["ranks"][0]["allocated_bytes"]
        assert abs(peak["error"]) <= TOLERANCE, (m["rank"], peak, m["step_peak_bytes"])


# ---- DDP + memest.track ----


@pytest.mark.slow
def test_ddp_track_reads_two_replicas(ddp):
    ranks, _ = ddp
    for r in (0, 1):  # every rank reads the same job
        assert ranks[r]["values"]["gpus"] == 2
        assert ranks[r]["parallelism"] == {"world_size": 2, "dp": 2, "zero_stage": 0, "framework": "ddp",
                                           "precision": "fp32"}


@pytest.mark.slow
def test_ddp_track_records_both_ranks_once_and_logs_on_rank_zero(ddp):
    ranks, records = ddp
    rec = _one_record_of_both_ranks(ranks, records, "track")
    assert rec["inputs"]["workload"]["parallelism"]["dp"] == 2
    assert rec["inputs"]["steps"] == 2  # two optimizer steps in the block, each profiled alone
    _rank_zero_alone_logs(ranks)
    for m in rec["measured"]:  # a full replica on each rank
        assert m["static"]["weights"] == 4 * P == 2_670_080
        assert m["static"]["optimizer_states"] == 2 * 4 * P + 4 * TENSORS == 5_340_280
        assert len(m["step_peak_bytes"]) == 2


@pytest.mark.slow
def test_ddp_track_within_tolerance(ddp):
    ranks, records = ddp
    _within_tolerance(records[0])
    assert [r["name"] for r in ranks[0]["report"]][-1] == "peak allocated"
    assert ranks[1]["report"] == []  # the comparison lives on rank 0


@pytest.mark.slow
def test_a_failure_on_one_rank_leaves_the_others_compared(ddp):
    """The second block: rank 1's watch fails (gpu 'no-such-gpu'), logs it once with its rank and still joins
    the gather; rank 0 compares its own figures and says rank 1 sent none; the job finished (exit 0)."""
    ranks, _ = ddp
    second = {r: ranks[r]["second"] for r in (0, 1)}
    (failure,) = second[1]["lines"]
    assert failure.startswith("memest: rank 1: estimating the job failed") and "no-such-gpu" in failure
    assert "memest stops watching this run" in failure
    assert any("rank(s) 1 sent no figures" in line for line in second[0]["lines"])
    assert any(line.startswith("memest: rank 0 on cpu") for line in second[0]["lines"])
    assert not any(line.startswith("memest: rank 1 on cpu") for line in second[0]["lines"])
    rows = {r["name"]: r for r in second[0]["report"]}
    assert abs(rows["peak allocated"]["error"]) <= TOLERANCE


# ---- FSDP2 fully_shard + memest.track ----


@pytest.mark.slow
def test_fsdp2_track_reads_the_sharding(fsdp2):
    """fully_shard with reshard_after_forward (the default) below the root: ZeRO 3 (FULL_SHARD);
    MixedPrecisionPolicy(param_dtype=bf16) over fp32 shards: the fsdp2 recipe."""
    ranks, _ = fsdp2
    for r in (0, 1):
        assert ranks[r]["parallelism"] == {"world_size": 2, "dp": 2, "zero_stage": 3, "framework": "fsdp",
                                           "precision": "fsdp2"}


@pytest.mark.slow
def test_fsdp2_track_records_half_the_states_per_rank(fsdp2):
    ranks, records = fsdp2
    rec = _one_record_of_both_ranks(ranks, records, "track")
    assert rec["inputs"]["workload"]["parallelism"]["zero_stage"] == 3
    _rank_zero_alone_logs(ranks)
    for m in rec["measured"]:
        assert m["static"]["weights"] == 4 * P // 2 == 1_335_040
        assert m["static"]["optimizer_states"] == 2 * 4 * P // 2 + 4 * TENSORS == 2_670_200
        assert len(m["step_peak_bytes"]) == 4


@pytest.mark.slow
def test_fsdp2_track_within_tolerance(fsdp2):
    _within_tolerance(fsdp2[1][0])


# ---- the HF Trainer (DDP over gloo) + MemestCallback ----


@pytest.mark.slow
def test_hf_trainer_under_torchrun(hf):
    """TrainingArguments(use_cpu=True, ddp_backend="gloo") under torchrun: args.world_size 2, the Trainer's DDP;
    steps 2 and 3 measured on each rank, one record, the estimate within 10% on both."""
    ranks, records = hf
    for r in (0, 1):
        assert ranks[r]["global_step"] == 3
        assert ranks[r]["parallelism"] == {"world_size": 2, "dp": 2, "zero_stage": 0, "framework": "ddp",
                                           "precision": "fp32"}
    rec = _one_record_of_both_ranks(ranks, records, "hf-callback")
    _rank_zero_alone_logs(ranks)
    for m in rec["measured"]:
        assert m["static"]["weights"] == 4 * P
        assert m["static"]["optimizer_states"] == 2 * 4 * P + 4 * TENSORS
    _within_tolerance(rec)


# ---- the wrapper read, in this process ----


@pytest.fixture
def one_process_group():
    """A one-process gloo group on an in-memory store (as ``memest calibrate`` runs FSDP2 on one process)."""
    import torch.distributed as dist

    from memest.calibration import distributed

    started = distributed.init_process_group("cpu", None)
    yield
    if started:
        dist.destroy_process_group()


def _tiny(layers: int = 1):
    import torch
    from cpu_measure import tiny_llama_config
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = tiny_llama_config(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=2,
                            num_key_value_heads=1, vocab_size=128)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(**{k: v for k, v in cfg.items()
                                                                     if k != "architectures"}))


def test_parallel_of_reads_the_wrapper(one_process_group):
    """fully_shard(reshard_after_forward=False) on the layers: ZeRO 2 (SHARD_GRAD_OP), and without a
    MixedPrecisionPolicy no precision (the fp32 parameters say fp32); the model alone fully_shard-ed: ZeRO 2 (the
    root never reshards after forward) and a note; DDP with gradient_as_bucket_view=True: ddp and a note; a bare
    model in a 2-process job: gpus 2 and a note, no framework."""
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    from memest.integrations._job import parallel_of
    from memest.workload import Framework

    sharded = _tiny(layers=2)
    for layer in sharded.model.layers:
        fully_shard(layer, reshard_after_forward=False)
    fully_shard(sharded)
    values, notes = parallel_of(sharded, 1)
    assert values == {"gpus": 1, "framework": Framework.FSDP, "zero_stage": 2} and notes == []

    root_only = _tiny()
    fully_shard(root_only, reshard_after_forward=False)
    values, notes = parallel_of(root_only, 1)
    assert values["zero_stage"] == 2 and "precision" not in values
    assert len(notes) == 1 and "no unit per decoder layer" in notes[0]

    values, notes = parallel_of(DistributedDataParallel(_tiny(), gradient_as_bucket_view=True), 1)
    assert values == {"gpus": 1, "framework": Framework.DDP}
    assert len(notes) == 1 and "gradient_as_bucket_view=True" in notes[0]

    values, notes = parallel_of(_tiny(), 2)
    assert values == {"gpus": 2} and len(notes) == 1 and "neither a DistributedDataParallel" in notes[0]
