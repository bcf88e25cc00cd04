"""A fresh user's findings on input checks (issue "valfix"): engines a stack never runs, bf16 on cards without it,
the HF Trainer's fp16, pipeline stages Megatron-LM refuses, and CLI value parsing. memest/workload/stacks.py and
memest/workload/config.py cite the sources of each rule."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from inprocess import run_memest

WIDE = {**os.environ, "COLUMNS": "400"}
LLAMA8 = "meta-llama/Llama-3.1-8B"
LLAMA1 = "meta-llama/Llama-3.2-1B"
DS_Z3 = str(Path(__file__).parent / "data/configs/llamafactory/examples/deepspeed/ds_z3_config.json")


def _refused(*argv: str) -> str:
    out = run_memest(*argv, env=WIDE)
    assert out.returncode == 2, (out.returncode, out.stdout[-2000:], out.stderr)
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def _hf(*args: str) -> dict:
    out = run_memest("hf", *args, "--json", env=WIDE)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


# ---- F1. a stack that never runs DeepSpeed / Megatron-LM refuses them -------------------------------------------


@pytest.mark.parametrize(("stack", "framework"), [("torchtune", "deepspeed"), ("torchtune", "megatron"),
                                                  ("torchtitan", "deepspeed"), ("litgpt", "deepspeed"),
                                                  ("fsdp", "megatron"), ("hf-trainer", "megatron")])
def test_a_stack_refuses_an_engine_it_never_runs(stack: str, framework: str) -> None:
    # torchtune 0.6 / torchtitan / litgpt (finetune/full.py: FSDPStrategy or "auto", no strategy argument) shard
    # with FSDP; the HF Trainer has no Megatron-LM argument: the job would be sized on an engine that never runs
    line = _refused("hf", LLAMA8, "--train", "--stack", stack, "--framework", framework, "--gpus", "2")
    assert f"--stack {stack} does not run --framework {framework}" in line, line
    assert "drop it" in line and "use a stack that runs" in line, line
    runs = {"deepspeed": "hf-trainer, trl, accelerate, axolotl, llamafactory, unsloth or deepspeed",
            "megatron": "accelerate, llamafactory, megatron or nemo"}[framework]
    assert line.endswith(runs), line


def test_a_deepspeed_config_under_torchtune_names_the_file() -> None:
    line = _refused("hf", LLAMA8, "--train", "--stack", "torchtune", "--gpus", "2", "--config", DS_Z3)
    assert "--stack torchtune does not run deepspeed (ds_z3_config.json:" in line, line
    assert "drop that file" in line, line


@pytest.mark.parametrize(("stack", "framework"), [("hf-trainer", "deepspeed"), ("accelerate", "deepspeed"),
                                                  ("torchtune", "fsdp")])
def test_a_stack_keeps_the_engines_it_runs(stack: str, framework: str) -> None:
    args = ("--tp", "2") if framework == "megatron" else ("--zero-stage", "3")
    d = _hf(LLAMA1, "--train", "--stack", stack, "--framework", framework, "--gpus", "2", *args)
    assert d["terms"], d
