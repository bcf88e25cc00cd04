"""Training defects a fresh user met: a recommendation's plan that refused the user's own sharded float8
all-gather / offload job, float8 and unsloth / bitsandbytes on devices that cannot run them, the trl stack's
checkpointing default, and NeMo's LoRA activations."""

from __future__ import annotations

import json
import os

import pytest

from memest.devices import get_device
from memest.sources import load_model
from memest.workload import Recompute, Stack
from memest.workload.resolve import resolve
from tests.inprocess import run_memest

WIDE = {**os.environ, "COLUMNS": "400"}
LLAMA31 = "meta-llama/Llama-3.1-8B"


# ---- 1. trl checkpoints by default ----


@pytest.fixture(scope="module")
def llama2():
    return load_model("meta-llama/Llama-2-7b-hf")


def test_trl_stack_checkpoints_by_default(llama2) -> None:
    # trl 0.22.0+ trl/trainer/sft_config.py: gradient_checkpointing: bool = field(default=True) (#3510, a222aeb4);
    # transformers 4.57 TrainingArguments (the HF Trainer stack): False
    a100 = get_device("A100-80GB")
    for method in ({"train": True}, {"finetune": "lora"}, {"finetune": "qlora"}):
        assert resolve({**method, "stack": "trl"}, llama2, a100).recompute is Recompute.FULL, method
        assert resolve({**method, "stack": "hf-trainer"}, llama2, a100).recompute is Recompute.NONE, method
    # what the user gives wins
    assert resolve({"train": True, "stack": "trl", "recompute": "none"}, llama2, a100).recompute is Recompute.NONE


@pytest.mark.parametrize("line, expected", [("gradient_checkpointing: false\n", Recompute.NONE),
                                            ("gradient_checkpointing: true\n", Recompute.FULL),
                                            ("", Recompute.FULL)])
def test_trl_recipe_states_its_checkpointing(tmp_path, llama2, line: str, expected: Recompute) -> None:
    # a trl recipe (TRL_KEYS: packing, max_length) that says gradient_checkpointing: false runs without it, against
    # the trl stack's default; one that does not say gets the default (full)
    recipe = tmp_path / "sft.yaml"
    recipe.write_text("model_name_or_path: meta-llama/Llama-2-7b-hf\npacking: true\nmax_length: 1024\n" + line)
    t = resolve({"config": [str(recipe)]}, llama2, get_device("A100-80GB"))
    assert t.stack is Stack.TRL
    assert t.recompute is expected


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


# ---- 4. what a device cannot run is refused, with the source (memest/workload/config.py training_refusal) ----


@pytest.mark.parametrize("gpu, arch", [("A100-80GB", "ampere"), ("V100-32GB", "volta")])
def test_float8_training_needs_sm89(gpu: str, arch: str) -> None:
    # torchtitan components/quantization/float8.py: "float8 is only supported on SM89 or later"; A100 is sm_80,
    # V100 sm_70
    out = run_memest("hf", LLAMA31, "--train", "--float8", "tensorwise", "--gpu", gpu, env=WIDE)
    assert out.returncode == 2
    line = out.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith(f"Error: --float8 tensorwise does not run on {gpu} (nvidia {arch})"), line
    assert "8.9" in line and "hopper" in line


def test_float8_training_runs_on_hopper_and_ada() -> None:
    for gpu in ("H100", "L40S", "MI300X"):
        out = run_memest("hf", LLAMA31, "--train", "--float8", "tensorwise", "--gpu", gpu, env=WIDE)
        assert out.returncode == 0, (gpu, out.stderr)


@pytest.mark.parametrize("args, field", [(("--stack", "unsloth", "--finetune", "qlora"), "--stack unsloth"),
                                         (("--stack", "unsloth", "--finetune", "lora"), "--stack unsloth"),
                                         (("--finetune", "qlora"), "--finetune qlora"),
                                         (("--stack", "litgpt", "--finetune", "qlora"), "--finetune qlora")])
def test_unsloth_and_bitsandbytes_refused_on_apple(args: tuple[str, ...], field: str) -> None:
    # unsloth/device_type.py: cuda, hip or xpu, else NotImplementedError; bitsandbytes 0.42: CUDA only
    out = run_memest("hf", LLAMA31, "--gpu", "M3-Max-64GB", *args, env=WIDE)
    assert out.returncode == 2
    assert out.stderr.startswith(f"Error: {field} does not run on M3-Max-64GB (apple)"), out.stderr


def test_lora_and_torchao_nf4_still_run_on_apple() -> None:
    # PEFT LoRA on MPS (a plain PyTorch process), torchtune's QLoRA base is torchao's NF4 (plain torch ops)
    for args in (("--finetune", "lora"), ("--stack", "torchtune", "--finetune", "qlora")):
        out = run_memest("hf", LLAMA31, "--gpu", "M3-Max-64GB", *args, env=WIDE)
        assert out.returncode == 0, (args, out.stderr)


def test_plan_skips_devices_that_cannot_run_float8() -> None:
    out = run_memest("plan", LLAMA31, "--train", "--gpus-available", "8xA100-80GB,8xH100", "--float8", "tensorwise",
                     "--json", env=WIDE)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["does_not_run_on"] == ["A100-80GB"]
    assert [f["device"] for f in d["fits"]] == ["H100-80GB"]


# ---- 3. NeMo's LoRA keeps Megatron's activations plus its adapters' r-wide intermediates ----


def _nemo_terms(tmp_path, name: str, factory: str, keys: str = "") -> tuple[dict, dict[str, int]]:
    launch = tmp_path / f"{name}.sh"
    launch.write_text(f"nemo llm finetune --factory \"{factory}\" {keys}\n")
    out = run_memest("hf", "--config", str(launch), "--gpu", "H100", "--json", env=WIDE)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    return d["workload"], {t["name"]: t["bytes"] for t in d["terms"]}


def test_nemo_lora_activations_are_megatrons_plus_the_adapters(tmp_path) -> None:
    # llama3_70b finetune_recipe (NeMo 8cfedd72): lora -> peft.dim 16, tp 8; the full run pinned to the same layout
    # (tp 8, pp 1, 2 nodes: dp 2); SquadDataModule seq_length 2048, micro_batch_size 1; no recompute, no SP
    lora_w, lora = _nemo_terms(tmp_path, "lora", "llama3_70b(num_nodes=2, peft_scheme='lora')")
    full_w, full = _nemo_terms(tmp_path, "full", "llama3_70b(num_nodes=2, peft_scheme='none')",
                               "trainer.strategy.pipeline_model_parallel_size=1")
    assert lora_w["lora_library"] == "megatron"
    assert (lora_w["parallelism"]["tp"], full_w["parallelism"]["tp"]) == (8, 8)
    # Llama-3-70B: 80 layers, hidden 8192, r 16, bf16, 2048 tokens a rank.
    # Each layer adds 4 adapters (linear_qkv, linear_proj, linear_fc1, linear_fc2), each keeping linear_out's
    # input, linear_in's r-wide output whole on every rank: 16 x 2 B x 2048 = 65,536 B (a multiple of 512: one
    # CUDA block of that size). The linears' inputs are the tensors Megatron's full training keeps already.
    adapters = 80 * 4 * 16 * 2 * 2048  # 20,971,520 B
    # The first layer's input (the frozen embeddings' output) needs no gradient and its norm weight is frozen: its
    # input norm keeps neither its input (2 B x 8192 x 2048 = 33,554,432 B) nor its rstd (4 B x 2048 = 8,192 B)
    first_layer = 2 * 8192 * 2048 + 4 * 2048
    assert lora["activations.layers"] == full["activations.layers"] + adapters - first_layer
    # was PEFT's layer (fp32 copies of every adapted linear's input): 36.8 GiB against full training's 15.1 GiB


def test_megatron_adapters_refused_where_they_do_not_run() -> None:
    out = run_memest("hf", LLAMA31, "--gpu", "H100", "--finetune", "qlora", "--lora-library", "megatron", env=WIDE)
    assert out.returncode == 2 and "has no 4-bit base" in out.stderr
    out = run_memest("hf", LLAMA31, "--gpu", "H100", "--finetune", "lora", "--lora-library", "megatron", env=WIDE)
    assert out.returncode == 2 and "inside Megatron-core layers" in out.stderr
