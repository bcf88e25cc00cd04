"""Training defects a fresh user met: a recommendation's plan that refused the user's own sharded float8
all-gather / offload job, float8 and unsloth / bitsandbytes on devices that cannot run them, the trl stack's
checkpointing default, and NeMo's LoRA activations."""

from __future__ import annotations

import os

from tests.inprocess import run_memest

WIDE = {**os.environ, "COLUMNS": "400"}
LLAMA31 = "meta-llama/Llama-3.1-8B"


# ---- 2. a setting that needs sharding (FSDP2 float8 all-gather, offload) does not abort the estimate ----


def test_float8_all_gather_job_is_estimated_and_planned() -> None:
    # torchtitan on 8 devices shards with FSDP2 (zero_stage 3, stacks.apply), which the float8 all-gather
    # needs (torchao Float8LinearConfig.enable_fsdp_float8_all_gather); the planner's layouts without it are
    # skipped, not raised
    job = (LLAMA31, "--train", "--gpus", "8", "--gpu", "H100", "--stack", "torchtitan", "--float8", "tensorwise",
           "--float8-all-gather", "--micro-batch-size", "2", "--seq-len", "8192")
    for extra in ((), ("--zero-stage", "3")):
        out = run_memest("hf", *job, *extra, env=WIDE)
        assert out.returncode == 0, out.stderr
        assert "all-gathers FSDP2" not in out.stderr
    out = run_memest("plan", *job[:2], "--gpus-available", "8xH100", *job[6:], env=WIDE)
    assert out.returncode == 0, out.stderr


def test_offload_job_is_planned() -> None:
    # --offload optimizer needs ZeRO; the job asks for ZeRO-3 and the planner searches from there
    out = run_memest("plan", LLAMA31, "--train", "--gpus-available", "8xH100", "--zero-stage", "3", "--offload",
                     "optimizer", env=WIDE)
    assert out.returncode == 0, out.stderr


def test_float8_all_gather_without_sharding_is_still_refused() -> None:
    out = run_memest("hf", LLAMA31, "--train", "--gpu", "H100", "--stack", "torchtitan", "--float8", "tensorwise",
                     "--float8-all-gather", env=WIDE)
    assert out.returncode == 2
    assert "all-gathers FSDP2's sharded weights" in out.stderr
