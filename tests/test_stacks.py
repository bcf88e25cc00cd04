"""Named training stacks (memest/workload/stacks.py): each stack's defaults fill the settings a user did
not give, what the user gave wins, the stack a job implies when it names none, and the job line."""

from __future__ import annotations

import pytest
from inprocess import run_memest

from memest.devices import get_device
from memest.estimate import estimate
from memest.sources import load_model
from memest.workload import (
    Framework,
    KbitPrep,
    Loss,
    Optimizer,
    Precision,
    Recompute,
    Stack,
    resolve_framework,
)
from memest.workload.resolve import resolve

LLAMA = "meta-llama/Llama-2-7b-hf"
A100 = get_device("A100-80GB")


@pytest.fixture(scope="module")
def llama():
    return load_model(LLAMA)


def build(spec, **values):
    return resolve(values, spec, A100)


def test_a_plain_training_question_is_the_hf_trainers(llama):
    # transformers 4.57 training_args.py: bf16=True autocasts over fp32 parameters; optim defaults to
    # adamw_torch_fused on torch >= 2.8; gradient_checkpointing False; one process on one device
    t = build(llama, train=True)
    assert t.stack is Stack.HF_TRAINER and t.stack_assumed == "no stack named"
    assert (t.precision, t.optimizer, t.recompute, t.loss) == (Precision.AMP, Optimizer.ADAMW_FUSED, Recompute.NONE,
                                                               Loss.DEFAULT)
    assert resolve_framework(t) is Framework.PYTORCH
    terms = {term.name: term.bytes for term in estimate(llama, t, A100).terms}
    # fp32 parameters: 4 B per parameter (the old default, bf16 + fp32 master, kept 2 B of weights)
    assert terms["weights"] == 4 * llama.num_params


def test_the_stack_a_job_implies(llama):
    assert build(llama, train=True, gpus=4, zero_stage=2).stack is Stack.DEEPSPEED
    deepspeed = build(llama, train=True, gpus=4, zero_stage=2)
    assert deepspeed.precision is Precision.MIXED and resolve_framework(deepspeed) is Framework.DEEPSPEED
    fsdp = build(llama, train=True, gpus=4, fsdp="full_shard")
    assert fsdp.stack is Stack.ACCELERATE and fsdp.precision is Precision.FSDP2  # MixedPrecision over fp32 shards
    megatron = build(llama, train=True, gpus=2, tp=2)
    assert megatron.stack is Stack.MEGATRON and resolve_framework(megatron) is Framework.MEGATRON
    assert build(llama, train=True, framework="deepspeed").stack is Stack.DEEPSPEED
    assert build(llama, finetune="lora").stack is Stack.HF_TRAINER


def test_a_named_stack_sets_its_defaults_and_given_flags_win(llama):
    # torchtune recipes/configs/llama3_1/8B_full*.yaml: dtype bf16, AdamW(fused=True), CEWithChunkedOutputLoss,
    # enable_activation_checkpointing True
    tune = build(llama, train=True, stack="torchtune")
    assert (tune.precision, tune.optimizer, tune.loss, tune.recompute) == (Precision.BF16, Optimizer.ADAMW_FUSED,
                                                                         Loss.CHUNKED, Recompute.FULL)
    assert tune.stack_assumed == ""
    mine = build(llama, train=True, stack="torchtune", optimizer="adamw", recompute="none")
    assert (mine.precision, mine.optimizer, mine.recompute) == (Precision.BF16, Optimizer.ADAMW, Recompute.NONE)
    # full_finetune_distributed shards with FSDP2 fully_shard
    many = build(llama, train=True, stack="torchtune", gpus=4)
    assert resolve_framework(many) is Framework.FSDP and many.parallelism.zero_stage == 3
    titan = build(llama, train=True, stack="torchtitan")
    assert titan.precision is Precision.FSDP2 and titan.recompute is Recompute.SELECTIVE_OP
    # torchtitan llama3_70b.toml: tensor_parallel_degree 8, data_parallel_shard_degree -1: FSDP over the
    # 16 / 8 = 2 data-parallel ranks beside TP (parallelize_llama.apply_fsdp), not replicated parameters
    titan_tp = build(llama, train=True, stack="torchtitan", gpus=16, tp=8)
    assert (titan_tp.parallelism.dp, titan_tp.parallelism.zero_stage) == (2, 3)
    assert resolve_framework(titan_tp) is Framework.FSDP
    assert build(llama, finetune="qlora", stack="trl").prepare_kbit_training is KbitPrep.TRL
    # axolotl src/axolotl/utils/models.py (15f7910): QLoRA under FSDP skips prepare_model_for_kbit_training; on
    # one GPU it runs it, then casts the norms, embed_tokens and lm_head back to torch_dtype (needs_fa2_dtype is
    # set for any adapter): every non-quantized weight 16-bit either way
    assert build(llama, finetune="qlora", stack="axolotl").prepare_kbit_training is KbitPrep.NONE
    assert build(llama, finetune="qlora", stack="axolotl", gpus=2,
                 fsdp="full_shard").prepare_kbit_training is KbitPrep.NONE
    assert build(llama, finetune="lora", stack="llamafactory").lora.targets == "all-linear"  # lora_target "all"
    nemo = build(llama, train=True, stack="nemo", gpus=8)
    assert resolve_framework(nemo) is Framework.MEGATRON and nemo.parallelism.zero_stage == 1  # distributed optimizer


def test_the_job_line_names_the_stack_and_its_recipe():
    out = run_memest("hf", LLAMA, "--train", "--gpu", "A100-80GB")
    assert out.returncode == 0, out.stderr
    line = " ".join(out.stdout.split())  # the job line may wrap
    assert "HF Trainer 4.57, bf16=True: fp32 params, autocast bf16, adamw_torch_fused (assumed: no stack named)" in line
    named = " ".join(run_memest("hf", LLAMA, "--train", "--stack", "deepspeed", "--gpu", "A100-80GB").stdout.split())
    assert "DeepSpeed, bf16.enabled: bf16 params and grads, fp32 master and states, FusedAdam" in named
    assert "assumed" not in named


def test_an_unknown_stack_is_one_line_with_the_choices():
    out = run_memest("hf", LLAMA, "--train", "--stack", "keras")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "hf-trainer" in out.stderr


# ---- recommendations that stay in the stack ----


def _fixes(*args: str) -> list[str]:
    out = run_memest("hf", *args)
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if line.startswith(("Cheapest fit:", "Lossless fit:"))]


def test_a_printed_fix_names_the_stack_and_stays_in_it():
    # PEFT LoRA under the HF Trainer has no tensor parallelism: its fixes never add --tp / --pp
    job = (LLAMA, "--finetune", "lora", "--micro-batch-size", "16", "--gpu", "L4")
    fixes = _fixes(*job)
    assert fixes and all("--stack hf-trainer" in f for f in fixes)
    assert not any("--tp" in f or "--pp" in f for f in fixes), fixes
    # allowed to leave the stack, LoRA still has no tensor-parallel fix: the stack that runs tp, Megatron-LM, has
    # no LoRA (memest/workload/stacks.py, StackDefaults.methods)
    moved = _fixes(*job, "--allow-stack-change")
    assert moved and not any("--tp" in f or "--stack megatron" in f for f in moved), moved
    # full training allowed to leave the stack: a tensor-parallel fix names the stack that runs it
    full = _fixes(LLAMA, "--train", "--micro-batch-size", "16", "--gpu", "L4", "--allow-stack-change")
    tp = [f for f in full if "--tp " in f]
    assert tp and all("--stack megatron" in f for f in tp), full


def test_plan_keeps_the_optimizer_and_micro_batch_unless_allowed():
    import json
    import shlex

    args = ("plan", LLAMA, "--train", "--micro-batch-size", "4", "--gpus-available", "8xA100-80GB", "--json")
    kept = json.loads(run_memest(*args).stdout)["fits"]
    assert kept
    for fit in kept:
        flags = shlex.split(fit["flags"])
        assert "adamw8bit" not in flags and "--micro-batch-size" not in flags, fit["flags"]
        assert flags[flags.index("--stack") + 1] == "hf-trainer"
    # the same job with both allowed: a cheaper (or equal) setup, reached by reshaping or 8-bit states
    free = json.loads(run_memest(*args, "--allow-batch-reshape", "--allow-optimizer-change").stdout)["fits"]
    assert free[0]["usd_per_hour"] <= kept[0]["usd_per_hour"]


def test_top_n_is_the_n_best_setups_overall():
    import json

    fits = json.loads(run_memest("plan", LLAMA, "--train", "--gpu", "A100-80GB", "--top", "3", "--json").stdout)["fits"]
    # one device type, three setups (before: one fit per device type, so one row)
    assert len(fits) == 3 and {f["device"] for f in fits} == {"A100-80GB"}
    assert [f["usd_per_hour"] for f in fits] == sorted(f["usd_per_hour"] for f in fits)
    assert len({f["flags"] for f in fits}) == 3


def test_calibrate_runs_the_trainers_default_optimizer_as_fused_adamw():
    # the HF Trainer's default adamw_torch_fused is torch.optim.AdamW(fused=True) (transformers
    # optimization: OptimizerNames.ADAMW_TORCH_FUSED); it needs no bitsandbytes and runs on the CPU
    torch = pytest.importorskip("torch")
    from memest.calibration.training import make_optimizer

    opt = make_optimizer([torch.nn.Parameter(torch.zeros(4))], Optimizer.ADAMW_FUSED, device_type="cpu")
    assert type(opt) is torch.optim.AdamW and opt.defaults["fused"] is True
