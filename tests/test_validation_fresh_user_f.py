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


# ---- F15. pipeline stages Megatron-LM asserts on ----------------------------------------------------------------


@pytest.mark.parametrize("stack", ["megatron", "nemo"])
def test_megatron_refuses_a_pp_that_does_not_divide_the_layers(stack: str) -> None:
    # Megatron-LM megatron/training/arguments.py validate_args: 32 % 5 != 0 and no uneven first / last stages ->
    # AssertionError 'Number of layers should be divisible by the pipeline-model-parallel size'
    line = _refused("hf", LLAMA8, "--train", "--stack", stack, "--pp", "5", "--gpus", "5")
    assert line.startswith("Error: --pp 5 does not divide the 32 layers of meta-llama/Llama-3.1-8B"), line
    assert "use a --pp that divides 32 (2, 4, 8, 16)" in line, line


def test_megatron_keeps_a_pp_that_divides_the_layers() -> None:
    assert _hf(LLAMA8, "--train", "--stack", "megatron", "--pp", "4", "--gpus", "4")["terms"]


# ---- F14. CLI values ------------------------------------------------------------------------------------------


def test_a_switch_shows_no_value_in_help() -> None:
    # --activation-offloading is a switch (--no-activation-offloading its off form): "<bool>" made users type a value
    out = run_memest("hf", "--help", env={**os.environ, "COLUMNS": "250"})
    assert out.returncode == 0
    rows = [line for line in out.stdout.splitlines() if "--activation-offloading" in line or "--check " in line
            or "--train " in line or "--fsdp-flat-params" in line]
    assert len(rows) >= 4, rows
    assert not any("<bool>" in line for line in rows), rows


@pytest.mark.parametrize(("argv", "words"), [
    (("--recompute", "ful"), "Invalid value for '--recompute': 'ful' is not one of 'none', 'selective'"),
    (("--seq-len", "4x"), "Invalid value for '--seq-len': '4x' is not a positive size; write e.g. 4096, 4k or 1M"),
    (("--fsdp", "--gpus", "2"), ("'--fsdp' takes a value, one of 'full_shard', 'shard_grad_op', 'hybrid_shard', "
                                 "'no_shard'; it was followed by the flag '--gpus'")),
])
def test_a_bad_value_is_named_without_pydantic_words(argv: tuple[str, ...], words: str) -> None:
    line = _refused("hf", LLAMA1, "--train", *argv)
    assert "Value error" not in line, line
    assert words in line, line


def test_seq_len_takes_the_k_suffix_sweep_takes() -> None:
    # memest sweep --seq-len 1k..128k reads k = 1024 (memest.planning.sweep.parse_size): 4k = 4 x 1024 = 4096
    d = _hf(LLAMA1, "--train", "--seq-len", "4k")
    assert d["workload"]["seq_len"] == 4096
    assert _hf(LLAMA1, "--serve", "--max-model-len", "8k")["workload"]["max_model_len"] == 8192


# ---- F5. bf16 on a device without it; F13. the HF Trainer's fp16 --------------------------------------------------


def _note(d: dict, words: str) -> str:
    notes = list(d["workload"]["config_notes"]) + list(d["assumptions"])
    found = [n for n in notes if words in n]
    assert found, notes
    return found[0]


def test_a_stack_default_bf16_runs_its_fp16_on_a_volta() -> None:
    # transformers' TrainingArguments raises "Your setup doesn't support bf16/gpu" below compute capability 8.0
    # (V100: 7.0): the Trainer's fp16=True runs there, fp32 params + autocast fp16 + GradScaler, the bytes of
    # its bf16=True (fp32 weights 4 B, autocast copies 2 B), so the estimate is unchanged and the job line says fp16
    volta = _hf(LLAMA1, "--train", "--gpu", "V100-32GB")
    assert volta["workload"]["half_dtype"] == "fp16" and volta["workload"]["precision"] == "amp"
    _note(volta, "V100-32GB (volta) has no bf16")
    ampere = _hf(LLAMA1, "--train", "--gpu", "A100-40GB")
    assert [t["bytes"] for t in volta["terms"] if t["name"] == "weights"] == \
           [t["bytes"] for t in ampere["terms"] if t["name"] == "weights"]
    out = run_memest("hf", LLAMA1, "--train", "--gpu", "V100-32GB", env=WIDE)
    job = next(line for line in out.stdout.splitlines() if line.startswith("Job"))
    assert "HF Trainer 4.57, fp16=True: fp32 params, autocast fp16, GradScaler" in job, job
    assert "bf16" not in job, job


def test_megatron_default_bf16_runs_its_fp16_on_a_turing() -> None:
    d = _hf(LLAMA1, "--train", "--stack", "megatron", "--gpu", "T4")
    assert d["workload"]["precision"] == "fp16"
    _note(d, "T4 (turing) has no bf16")


@pytest.mark.parametrize(("argv", "fix"), [(("--precision", "amp"), "use --precision fp16, or another --gpu"),
                                           (("--stack", "torchtune"), "use --precision fp32, or another --gpu")])
def test_bf16_asked_on_a_volta_is_refused_with_the_fix(argv: tuple[str, ...], fix: str) -> None:
    # torchtune 0.6 has no fp16 recipe (its recipes raise "full fp16 training is not supported with this recipe")
    line = _refused("hf", LLAMA1, "--train", "--gpu", "V100-32GB", *argv)
    assert "bf16 needs CUDA compute capability 8.0+" in line and line.endswith(fix), line


def test_the_planner_proposes_no_bf16_on_t4() -> None:
    out = run_memest("plan", LLAMA1, "--train", "--gpus-available", "4xT4", env=WIDE)
    assert out.returncode == 0, out.stderr
    cheapest = next(line for line in out.stdout.splitlines() if line.startswith("Cheapest:"))
    assert "bf16" not in cheapest and "--precision" not in cheapest, cheapest  # it resolves to fp16 on a T4
    out = run_memest("plan", LLAMA1, "--train", "--precision", "amp", "--gpus-available", "4xT4", env=WIDE)
    assert "Cheapest:" not in out.stdout and "T4 (not searched)" in out.stdout, out.stdout[-800:]


def test_hf_trainer_fp16_is_fp32_params_with_autocast() -> None:
    # transformers 4.57 without DeepSpeed: fp16=True keeps the fp32 parameters and runs autocast(fp16) with a
    # GradScaler (Trainer: self.use_apex / amp); no fp16 weights and no fp32 master: weights 4 B x P
    d = _hf(LLAMA1, "--train", "--stack", "hf-trainer", "--precision", "fp16")
    assert d["workload"]["precision"] == "amp" and d["workload"]["half_dtype"] == "fp16"
    terms = {t["name"]: t["bytes"] for t in d["terms"]}
    amp = _hf(LLAMA1, "--train", "--stack", "hf-trainer", "--precision", "amp")
    amp = {t["name"]: t["bytes"] for t in amp["terms"]}
    assert terms == amp
    assert not any(name.endswith("master") for name in terms), terms
    out = run_memest("hf", LLAMA1, "--train", "--stack", "hf-trainer", "--precision", "fp16", env=WIDE)
    job = next(line for line in out.stdout.splitlines() if line.startswith("Job"))
    assert "fp16=True: fp32 params, autocast fp16, GradScaler" in job, job


def test_hf_trainer_fp16_under_deepspeed_stays_deepspeed_fp16() -> None:
    # the Trainer's fp16=True fills DeepSpeed's fp16.enabled: fp16 params, fp32 master (HfTrainerDeepSpeedConfig)
    d = _hf(LLAMA1, "--train", "--stack", "hf-trainer", "--precision", "fp16", "--zero-stage", "2", "--gpus", "2")
    assert d["workload"]["precision"] == "fp16"


@pytest.mark.parametrize("stack", ["hf-trainer", "trl"])
def test_hf_trainer_mixed_without_deepspeed_is_refused(stack: str) -> None:
    # bf16 parameters over an fp32 master are DeepSpeed's (bf16.enabled); the Trainer alone autocasts over fp32
    line = _refused("hf", LLAMA1, "--train", "--stack", stack, "--precision", "mixed")
    assert line.startswith("Error: --precision mixed (bf16 params, fp32 master) is DeepSpeed's recipe"), line
    assert line.endswith("drop --precision (or --precision amp), or add --zero-stage 1-3 to run it under DeepSpeed")
    assert _hf(LLAMA1, "--train", "--stack", stack, "--precision", "mixed", "--zero-stage", "1", "--gpus", "2")["terms"]
