"""Defects a new user met in training estimates and their fixes: a printed fix that, run as printed, sized
another backend (the HF Trainer's ZeRO stage as FSDP; a plan on Megatron-LM with the HF Trainer's recipe),
stack / method pairs that do not exist, advice naming a flag the mode refuses, the replaced mode flag, and
sharding flags that conflict (memest/workload/stacks.py cites the sources of each stack's rule)."""

from __future__ import annotations

import json
import os
import re
import shlex

import pytest

from tests.inprocess import run_memest

WIDE = {**os.environ, "COLUMNS": "400"}
LLAMA2 = "meta-llama/Llama-2-7b-hf"
LLAMA2_PARAMS = 6_738_415_616
"""Llama-2-7B's parameters: 32 layers x (4 x 4096^2 attention + 3 x 4096 x 11008 MLP + 2 x 4096 norms)
+ 2 x 32000 x 4096 (embedding, untied lm_head) + 4096 (final norm) = 32 x 202,383,360 + 262,148,096
= 6,738,415,616."""


def _hf(*args: str) -> dict:
    out = run_memest("hf", *args, "--json", env=WIDE)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _fixes(*args: str) -> list[tuple[str, str]]:
    """The printed fixes of ``memest hf ARGS``: (flags, the GiB figure printed)."""
    out = run_memest("hf", *args, env=WIDE)
    assert out.returncode == 0, out.stderr
    found = []
    for line in out.stdout.splitlines():
        m = re.match(r"(?:Cheapest|Lossless) fit: (.*?)(?: \(in place of [^)]*\))? → ([\d.,]+) GiB per device", line)
        if m:
            found.append((m.group(1), m.group(2)))
    return found


def _gib(n: int) -> str:
    return f"{n / 2**30:,.2f}"


# ---- 1. the HF Trainer's ZeRO stage is DeepSpeed (deepspeed=ds.json), and a printed fix reproduces its figure ----


def test_hf_trainer_zero_stage_runs_deepspeed_with_its_bf16_recipe() -> None:
    # transformers 4.57 integrations/deepspeed.py: the Trainer's bf16=True fills DeepSpeed's bf16.enabled, so
    # DeepSpeed holds bf16 parameters and fp32 master + Adam moments, each sharded over the 2 ranks by ZeRO-3:
    # weights 2 B x P / 2 = P, master 4 B x P / 2 = 2 P, moments 2 x 4 B x P / 2 = 4 P (P = 6,738,415,616)
    d = _hf(LLAMA2, "--train", "--gpu", "A100-80GB", "--stack", "hf-trainer", "--gpus", "2", "--zero-stage", "3")
    terms = {t["name"]: t["bytes"] for t in d["terms"]}
    assert terms["weights"] == LLAMA2_PARAMS  # was 4 B x P / 2: fp32 parameters under FSDP
    assert terms["optimizer_states.master"] == 2 * LLAMA2_PARAMS
    assert terms["optimizer_states.moments"] == 4 * LLAMA2_PARAMS
    assert any(a.startswith("framework deepspeed") for a in d["assumptions"]), d["assumptions"]


def test_hf_trainer_fsdp_runs_accelerates_fsdp_mixed_precision() -> None:
    # the Trainer's fsdp=full_shard with bf16=True is accelerate FSDP, whose AcceleratorState turns bf16 into
    # FSDP MixedPrecision(param_dtype=bf16): fp32 parameters sharded over 2 ranks, 4 B x P / 2 = 2 P, and one
    # decoder layer gathered in bf16 at a time: 2 B x (4 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096) = 2 x 202,383,360
    # B; no autocast copy of the whole model
    d = _hf(LLAMA2, "--train", "--gpu", "A100-80GB", "--stack", "hf-trainer", "--gpus", "2", "--fsdp", "full_shard")
    terms = {t["name"]: t["bytes"] for t in d["terms"]}
    assert terms["weights"] == 2 * LLAMA2_PARAMS
    assert terms["workspace.gathered_layers"] == 2 * 202_383_360
    assert "workspace.autocast_weights" not in terms


@pytest.mark.parametrize(("flags", "words"), [
    (("--zero-stage", "3"), "HF Trainer 4.57 + DeepSpeed ZeRO-3 (deepspeed=ds.json)"),
    (("--fsdp", "full_shard"), "HF Trainer 4.57 + FSDP FULL_SHARD (fsdp=full_shard)"),
], ids=["deepspeed", "fsdp"])
def test_the_job_line_names_the_sharding_backend(flags: tuple[str, ...], words: str) -> None:
    out = run_memest("hf", LLAMA2, "--train", "--gpu", "A100-80GB", "--stack", "hf-trainer", "--gpus", "2", *flags,
                     env=WIDE)
    assert out.returncode == 0, out.stderr
    job = next(line for line in out.stdout.splitlines() if line.startswith("Job"))
    assert words in job, job


def test_a_zero_stage_fix_names_the_backend_it_was_sized_with() -> None:
    out = run_memest("hf", LLAMA2, "--train", "--gpu", "A100-80GB", env=WIDE)
    fixes = [line for line in out.stdout.splitlines() if "--zero-stage" in line and "fit:" in line]
    assert fixes and all("--stack hf-trainer" in f and "(HF Trainer 4.57: deepspeed=ds.json with "
                         "zero_optimization.stage" in f for f in fixes), fixes


@pytest.mark.parametrize("args", [
    (LLAMA2, "--train", "--gpu", "A100-80GB"),  # the README's "What you get"
    ("mistralai/Mistral-7B-v0.1", "--finetune", "lora", "--gpu", "RTX-4090"),
    ("meta-llama/Llama-3.1-8B", "--train", "--gpu", "L40S", "--micro-batch-size", "2", "--seq-len", "4096"),
    (LLAMA2, "--train", "--micro-batch-size", "16", "--gpu", "L4", "--allow-stack-change"),  # a fix on Megatron-LM
], ids=["llama2-a100", "mistral-lora-4090", "llama31-l40s", "stack-change-l4"])
def test_a_printed_fix_run_as_printed_gives_the_figure_printed(args: tuple[str, ...]) -> None:
    fixes = _fixes(*args)
    assert fixes
    for flags, figure in fixes:
        tokens = shlex.split(flags)
        replaced = {t for t in tokens if t.startswith("--")}
        if "--finetune" in tokens:  # the fix's method replaces the one asked
            replaced.add("--train")
        job, i = [args[0]], 1  # the user's flags less those the fix sets (a flag's value follows it)
        while i < len(args):
            takes = i + 1 < len(args) and not args[i + 1].startswith("--")
            if args[i] not in replaced:
                job += args[i:i + 1 + takes]
            i += 1 + takes
        again = _hf(*job, *tokens)
        assert _gib(again["needed_bytes"]) == figure, (flags, figure)


def test_readme_what_you_get_is_what_the_tool_prints() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = readme.split("## What you get", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    command = block.strip().splitlines()[0]
    assert command == f"$ memest hf {LLAMA2} --train --gpu A100-80GB"
    out = run_memest(*shlex.split(command)[2:], env={**os.environ, "COLUMNS": "250"})
    printed = [line.rstrip() for line in out.stdout.splitlines()]
    for line in block.strip().splitlines()[1:]:
        if line.startswith(("Model", "Job", "Device", "DOES NOT FIT", "band", "Cheapest fit", "Lossless fit")):
            assert line.rstrip() in printed, line


# ---- 2. a plan's printed command, re-estimated, gives the plan's figure ----


@pytest.mark.parametrize("args", [
    ("meta-llama/Llama-3.1-70B", "--train", "--micro-batch-size", "4", "--seq-len", "8192",
     "--gpus-available", "64xH100,64xA100-80GB", "--allow-stack-change"),
    (LLAMA2, "--train", "--gpus-available", "8xA100-80GB,8xL40S", "--top", "4"),
    (LLAMA2, "--finetune", "lora", "--gpus-available", "8xL4", "--allow-method-change", "--allow-stack-change"),
    (LLAMA2, "--train", "--stack", "torchtune", "--gpus-available", "8xA100-40GB"),
    (LLAMA2, "--train", "--fsdp", "shard_grad_op", "--gpus-available", "8xL40S"),  # ZeRO 3 as --fsdp full_shard
], ids=["70b-stack-change", "llama2-trainer", "lora-method-change", "torchtune", "fsdp-strategy-raised"])
def test_each_plan_command_reestimated_gives_the_plans_figure(args: tuple[str, ...]) -> None:
    out = run_memest("plan", *args, "--json", env=WIDE)
    assert out.returncode == 0, out.stderr
    fits = json.loads(out.stdout)["fits"]
    assert fits
    for fit in fits:
        tokens = shlex.split(fit["command"])
        assert tokens[:2] == ["memest", "hf"]
        assert _hf(*tokens[2:])["needed_bytes"] == fit["needed_bytes"], fit["command"]


def test_a_plan_on_megatron_takes_megatrons_recipe_not_the_trainers() -> None:
    # Megatron-LM --bf16: bf16 parameters, fp32 main_grad and master, its fused Adam (not adamw_torch_fused)
    out = run_memest("plan", "meta-llama/Llama-3.1-70B", "--train", "--micro-batch-size", "4", "--seq-len", "8192",
                     "--gpus-available", "64xA100-80GB", "--allow-stack-change", "--json", env=WIDE)
    fit = json.loads(out.stdout)["fits"][0]
    assert fit["workload"]["stack"] == "megatron"
    assert (fit["workload"]["precision"], fit["workload"]["optimizer"]) == ("mixed", "adamw")
    assert "--optimizer" not in fit["command"]


# ---- 3. stack / method pairs that do not exist ----


@pytest.mark.parametrize(("method", "stack", "label"), [
    ("qlora", "megatron", "Megatron-LM"), ("lora", "megatron", "Megatron-LM"), ("qlora", "torchtitan", "torchtitan"),
    ("qlora", "nemo", "NeMo 2"),
])
def test_a_method_the_stack_does_not_run_is_refused(method: str, stack: str, label: str) -> None:
    out = run_memest("hf", LLAMA2, "--finetune", method, "--stack", stack, env=WIDE)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert f"--finetune {method} does not run under --stack {stack}: {label} has no" in out.stderr
    assert "stacks that run it: hf-trainer, trl" in out.stderr and f" {stack}," not in out.stderr


def test_torchtitan_lora_is_in_tree() -> None:
    # torchtitan at b5bcd76c: torchtitan/components/lora.py LoRAConverter (added in 74181b1e, 2026-05-08)
    assert run_memest("hf", LLAMA2, "--finetune", "lora", "--stack", "torchtitan", env=WIDE).returncode == 0


def test_the_planner_never_proposes_a_method_the_stack_does_not_run(tmp_path) -> None:
    # a vLLM launch with tensor parallelism 2: the training job is assumed Megatron-LM (tp > 1), full only
    script = tmp_path / "serve.sh"
    script.write_text("vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 2 --max-model-len 8192\n")
    fixes = _fixes("--config", str(script), "--train", "--gpu", "L40S")
    assert fixes
    assert not any("--finetune" in flags for flags, _ in fixes), fixes
    # a plan allowed both another method and another stack: no LoRA / QLoRA on Megatron-LM
    out = run_memest("plan", "meta-llama/Llama-3.1-70B", "--train", "--gpus-available", "16xL40S",
                     "--allow-method-change", "--allow-stack-change", "--top", "3", "--json", env=WIDE)
    for fit in json.loads(out.stdout)["fits"]:
        w = fit["workload"]
        assert not (w["stack"] == "megatron" and w["method"] != "full"), fit["command"]


# ---- 4. advice when nothing fits names only what the mode reads ----


def test_training_plan_advice_names_training_switches_and_the_stack_change_that_fits() -> None:
    args = ("plan", "meta-llama/Llama-3.1-70B", "--train", "--micro-batch-size", "4", "--seq-len", "8192",
            "--gpus-available", "64xH100")
    out = run_memest(*args, env=WIDE)
    assert out.returncode == 0, out.stderr
    advice = next(line for line in out.stdout.splitlines() if line.startswith("Nothing fits within"))
    assert "--allow-quantization" not in advice
    assert "--allow-stack-change finds a fit" in advice and "--allow-method-change" in advice
    assert json.loads(run_memest(*args, "--allow-stack-change", "--json", env=WIDE).stdout)["fits"]


def test_serving_plan_advice_names_quantization_only() -> None:
    out = run_memest("plan", "meta-llama/Llama-3.1-70B", "--serve", "--gpus-available", "1xL4", env=WIDE)
    advice = next(line for line in out.stdout.splitlines() if line.startswith("Nothing fits within"))
    assert "--allow-quantization" in advice
    assert "--allow-method-change" not in advice and "--allow-stack-change" not in advice


# ---- 5. the mode flag a method change replaces is the user's ----


def test_a_method_change_says_which_flag_it_replaces() -> None:
    # an RTX-4080 (15.99 GiB, 14.39 usable) cannot hold even the bf16 base DeepSpeed keeps (7.24e9 x 2 B = 13.49 GiB)
    # with LoRA's states and activations, so the fit needs QLoRA (on a 4090, ZeRO-1's bf16 engine fits LoRA on one card)
    out = run_memest("hf", "mistralai/Mistral-7B-v0.1", "--finetune", "lora", "--gpu", "RTX-4080", env=WIDE)
    cheapest = next(line for line in out.stdout.splitlines() if line.startswith("Cheapest fit:"))
    assert "--finetune qlora (in place of --finetune lora)" in cheapest, cheapest


# ---- 6. sharding flags that conflict are refused, naming both ----


@pytest.mark.parametrize(("args", "named"), [
    (("--train", "--zero-stage", "3", "--fsdp", "full_shard", "--gpus", "8"), ("--fsdp full_shard", "--zero-stage 3")),
    (("--train", "--stack", "deepspeed", "--fsdp", "full_shard", "--gpus", "8"), ("--stack deepspeed", "--fsdp")),
    (("--train", "--stack", "megatron", "--fsdp", "full_shard", "--gpus", "8"), ("--stack megatron", "--fsdp")),
], ids=["zero-and-fsdp", "deepspeed-fsdp", "megatron-fsdp"])
def test_conflicting_sharding_flags_are_refused(args: tuple[str, ...], named: tuple[str, str]) -> None:
    out = run_memest("hf", LLAMA2, *args, env=WIDE)
    assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1, out.stderr
    assert all(n in out.stderr for n in named), out.stderr


# ---- restack: the settings a stack filled, taken again, are what a command naming that stack resolves to ----


@pytest.mark.parametrize("values", [
    {"train": True},
    {"train": True, "gpus": 8, "zero_stage": 3},
    {"train": True, "gpus": 8, "fsdp": "full_shard", "stack": "trl"},
    {"finetune": "qlora", "stack": "trl", "gpus": 2, "framework": "fsdp", "zero_stage": 2},
    {"finetune": "qlora", "stack": "litgpt"},
    {"train": True, "stack": "torchtune", "gpus": 8},
    {"finetune": "lora", "stack": "unsloth", "recompute": "none"},
    {"train": True, "stack": "megatron", "gpus": 16, "tp": 8, "zero_stage": 1},
], ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()))
def test_restack_to_its_own_stack_and_layout_changes_nothing(values: dict) -> None:
    from memest.devices import get_device
    from memest.sources import load_model
    from memest.workload import resolve
    from memest.workload.stacks import restack

    t = resolve.resolve(values, load_model(LLAMA2), get_device("H100"))
    assert restack(t) == t


def test_restack_to_megatron_is_what_naming_megatron_resolves() -> None:
    from memest.devices import get_device
    from memest.sources import load_model
    from memest.workload import resolve
    from memest.workload.stacks import restack

    spec, h100 = load_model(LLAMA2), get_device("H100")
    layout = {"train": True, "gpus": 16, "tp": 8, "zero_stage": 1}
    trainer = resolve.resolve({**layout, "stack": "hf-trainer", "recompute": "full"}, spec, h100)
    megatron = resolve.resolve({**layout, "stack": "megatron", "recompute": "full"}, spec, h100)
    moved = restack(trainer, megatron.stack)
    # Megatron-LM --bf16 and its Adam replace the Trainer's autocast recipe and adamw_torch_fused; the
    # recompute the user gave stays
    assert (moved.precision.value, moved.optimizer.value, moved.recompute.value) == ("mixed", "adamw", "full")
    assert moved.replace(stack_assumed="", stack_filled=megatron.stack_filled) == megatron
