"""Recipes as config files (memest/workload/files/: trainer, axolotl, llamafactory) and what every format
shares: the model a file names, several files read together, where each setting was read, notes for keys
memest does not model, and the one-line errors. The fixtures are real files from the projects' repositories
(tests/data/configs/README.md cites each); each test's expected workload is derived by hand from the keys
quoted in its comment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from inprocess import run_memest

from memest.devices import get_device
from memest.errors import InputError
from memest.sources import load_model
from memest.workload import (
    AttnImplementation,
    Framework,
    Loss,
    Method,
    Offload,
    Optimizer,
    Precision,
    Recompute,
    Stack,
    files,
    resolve_framework,
)
from memest.workload.resolve import resolve

DATA = Path(__file__).resolve().parent / "data" / "configs"
HANDBOOK = DATA / "handbook" / "recipes"
QLORA = str(HANDBOOK / "zephyr-7b-beta" / "sft" / "config_qlora.yaml")
FULL = str(HANDBOOK / "zephyr-7b-beta" / "sft" / "config_full.yaml")
ZERO3_LAUNCH = str(HANDBOOK / "accelerate_configs" / "zero3.yaml")
FSDP_LAUNCH = str(HANDBOOK / "accelerate_configs" / "fsdp.yaml")
TRL_EXAMPLE = str(DATA / "trl" / "example_config.yaml")
AXOLOTL_QLORA = str(DATA / "axolotl" / "qlora.yml")
AXOLOTL_FSDP = str(DATA / "axolotl" / "fft-8b-liger-fsdp.yaml")
LF = DATA / "llamafactory" / "examples"
LF_LORA_DS3 = str(LF / "train_lora" / "llama3_lora_sft_ds3.yaml")
LF_QLORA = str(LF / "train_qlora" / "llama3_lora_sft_otfq.yaml")
LF_FULL_DS3 = str(LF / "train_full" / "llama3_full_sft.yaml")
DS_ZERO3 = str(DATA / "ds_config_zero3.json")
ACCEL_FSDP = str(DATA / "accelerate_fsdp.yaml")
A100 = get_device("A100-80GB")
MISTRAL = "mistralai/Mistral-7B-v0.1"


@pytest.fixture(scope="module")
def mistral():
    return load_model(MISTRAL)


@pytest.fixture(scope="module")
def llama3():
    return load_model("meta-llama/Meta-Llama-3-8B-Instruct")


def test_handbook_qlora_recipe(mistral):
    # use_peft: true + load_in_4bit: true -> QLoRA (no mode given: the recipe's); trl ModelConfig / SFTConfig keys
    # (use_peft, max_seq_length, dataset_num_proc) -> stack trl; lora_r 16, lora_dropout 0.05, lora_target_modules
    # the seven projections; per_device_train_batch_size 4, gradient_accumulation_steps 2, max_seq_length 2048;
    # gradient_checkpointing true -> full recompute; attn_implementation flash_attention_2; bf16 true over LoRA
    # (a QLoRA base is NF4 whatever torch_dtype loads) -> autocast over fp32 adapters (amp)
    t = resolve({"config": [QLORA]}, mistral, A100)
    assert (t.method, t.stack, t.stack_assumed) == (Method.QLORA, Stack.TRL, "")
    assert (t.lora.rank, t.lora.dropout) == (16, 0.05)
    assert t.lora.targets == "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    assert (t.micro_batch_size, t.grad_accum_steps, t.seq_len) == (4, 2, 2048)
    assert (t.recompute, t.attn_implementation, t.precision) == (Recompute.FULL, AttnImplementation.FLASH_ATTENTION_2,
                                                                 Precision.AMP)


def test_handbook_full_recipe_under_its_zero3_launcher(mistral):
    # config_full.yaml: per_device_train_batch_size 16, gradient_accumulation_steps 1, max_seq_length 2048,
    # gradient_checkpointing true, bf16 true, torch_dtype bfloat16; zero3.yaml (accelerate launch --config_file):
    # distributed_type DEEPSPEED, zero_stage 3, offload devices none, num_processes 8, mixed_precision bf16.
    # The trl stack stays (the recipe's), DeepSpeed runs the step: ZeRO-3 over 8 ranks with DeepSpeed's bf16
    # (bf16 weights, fp32 master: memest's mixed), not the recipe's torch_dtype bf16
    t = resolve({"config": [FULL, ZERO3_LAUNCH]}, mistral, A100)
    assert (t.method, t.stack, resolve_framework(t)) == (Method.FULL, Stack.TRL, Framework.DEEPSPEED)
    assert (t.parallelism.zero_stage, t.parallelism.dp, t.offload, t.precision) == (3, 8, Offload.NONE,
                                                                                    Precision.MIXED)
    assert (t.micro_batch_size, t.grad_accum_steps, t.seq_len, t.recompute) == (16, 1, 2048, Recompute.FULL)


def test_trl_example_names_its_model_and_turns_bf16_on():
    # trl examples/cli_configs/example_config.yaml: model_name_or_path Qwen/Qwen2.5-0.5B and nothing else that
    # sizes memory; dataset_name is trl's ScriptArguments -> stack trl; no bf16 / fp16: trl's configs set
    # bf16 = not fp16 -> autocast bf16 over fp32 parameters (amp); a recipe is training (full: no use_peft)
    out = run_memest("hf", "--config", TRL_EXAMPLE, "--gpu", "A100-80GB", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["model"]["name"] == "Qwen/Qwen2.5-0.5B" and doc["mode"] == "train"
    assert (doc["workload"]["stack"], doc["workload"]["precision"]) == ("trl", "amp")
    assert "model Qwen/Qwen2.5-0.5B from example_config.yaml:9 model_name_or_path" in doc["workload"]["config_read"]


def test_axolotl_qlora(llama3):
    # adapter qlora (load_in_4bit true); lora_r 32, lora_dropout 0.05, lora_target_linear true -> all-linear;
    # sequence_len 4096, micro_batch_size 2, gradient_accumulation_steps 4; gradient_checkpointing true;
    # optimizer paged_adamw_32bit -> bitsandbytes' paged AdamW (two fp32 states, the large ones in managed memory);
    # attn_implementation flash_attention_2; bf16 auto over adapters -> amp. The file names
    # NousResearch/Meta-Llama-3-8B (not in the offline catalog): the same architecture is passed
    t = resolve({"config": [AXOLOTL_QLORA]}, llama3, A100)
    assert (t.method, t.stack) == (Method.QLORA, Stack.AXOLOTL)
    assert (t.lora.rank, t.lora.dropout, t.lora.targets) == (32, 0.05, "all-linear")
    assert (t.seq_len, t.micro_batch_size, t.grad_accum_steps) == (4096, 2, 4)
    assert (t.recompute, t.optimizer, t.attn_implementation, t.precision) == (
        Recompute.FULL, Optimizer.PAGED_ADAMW32BIT, AttnImplementation.FLASH_ATTENTION_2, Precision.AMP)
    assert files.read([AXOLOTL_QLORA]).model == "NousResearch/Meta-Llama-3-8B"


def test_axolotl_liger_fsdp(llama3):
    # no adapter -> full fine-tune; liger_fused_linear_cross_entropy true -> fused loss; fsdp [full_shard,
    # auto_wrap] -> ZeRO-3 under FSDP; fsdp_config.fsdp_offload_params true -> parameters offloaded;
    # optimizer adamw_torch_fused; bf16 auto, full -> bf16 weights trained in place (pure bf16);
    # sequence_len 4096, micro_batch_size 2, gradient_accumulation_steps 4, gradient_checkpointing true
    t = resolve({"config": [AXOLOTL_FSDP], "gpus": 8}, llama3, A100)
    assert (t.method, t.stack, resolve_framework(t)) == (Method.FULL, Stack.AXOLOTL, Framework.FSDP)
    assert (t.parallelism.zero_stage, t.offload, t.loss, t.precision) == (3, Offload.PARAMS, Loss.FUSED, Precision.BF16)
    assert (t.optimizer, t.seq_len, t.micro_batch_size, t.grad_accum_steps, t.recompute) == (
        Optimizer.ADAMW_FUSED, 4096, 2, 4, Recompute.FULL)


def test_llamafactory_lora_reads_its_deepspeed_json(llama3):
    # finetuning_type lora, lora_rank 8, lora_target all -> all-linear; cutoff_len 2048,
    # per_device_train_batch_size 1, gradient_accumulation_steps 2; deepspeed examples/deepspeed/ds_z3_config.json
    # (relative to the repository root: found above the recipe) -> ZeRO-3, no offload, its bf16.enabled "auto"
    # filled from the recipe's bf16 true -> DeepSpeed bf16 (mixed); LLaMA-Factory keeps gradient checkpointing on
    # by default -> full
    t = resolve({"config": [LF_LORA_DS3], "gpus": 2}, llama3, A100)
    assert (t.method, t.stack, resolve_framework(t)) == (Method.LORA, Stack.LLAMAFACTORY, Framework.DEEPSPEED)
    assert (t.lora.rank, t.lora.targets, t.seq_len, t.micro_batch_size, t.grad_accum_steps) == (
        8, "all-linear", 2048, 1, 2)
    assert (t.parallelism.zero_stage, t.offload, t.precision, t.recompute) == (3, Offload.NONE, Precision.MIXED,
                                                                               Recompute.FULL)
    assert any('bf16.enabled "auto" is filled from llama3_lora_sft_ds3.yaml:38 bf16' in n for n in t.config_notes)


def test_llamafactory_qlora_and_full(llama3):
    # llama3_lora_sft_otfq.yaml: quantization_bit 4 + finetuning_type lora -> QLoRA; gradient_accumulation_steps 8;
    # bf16 true, no DeepSpeed -> amp
    q = resolve({"config": [LF_QLORA]}, llama3, A100)
    assert (q.method, q.grad_accum_steps, q.precision, q.lora.rank) == (Method.QLORA, 8, Precision.AMP, 8)
    # llama3_full_sft.yaml: finetuning_type full + the same ds_z3_config.json -> full training under ZeRO-3, mixed
    f = resolve({"config": [LF_FULL_DS3], "gpus": 4}, llama3, A100)
    assert (f.method, f.parallelism.zero_stage, f.precision, f.micro_batch_size) == (Method.FULL, 3, Precision.MIXED, 1)


def test_explain_lists_file_line_and_key():
    # config_qlora.yaml line 10 is "lora_r: 16", line 63 "per_device_train_batch_size: 4" (YAML node marks)
    out = run_memest("hf", "--config", QLORA, "--gpu", "A100-80GB", "--explain")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "read: lora_rank 16 from config_qlora.yaml:10 lora_r" in text
    assert "read: micro_batch_size 4 from config_qlora.yaml:63 per_device_train_batch_size" in text


def test_json_lines_come_from_a_key_search():
    # ds_config_zero3.json: "stage": 3 is on line 12, "enabled": true (fp16) on line 3
    origins = files.read([DS_ZERO3]).origins
    assert origins["zero_stage"] == "ds_config_zero3.json:12 zero_optimization.stage"
    assert origins["precision"] == "ds_config_zero3.json:3 fp16.enabled"


def test_flags_and_model_given_override_the_file_said_once():
    out = run_memest("hf", "Qwen/Qwen2.5-0.5B", "--config", QLORA, "--micro-batch-size", "1", "--gpu", "A100-80GB")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert text.count("settings given override the config files") == 1
    assert "micro_batch_size 1 over 4 (config_qlora.yaml:63 per_device_train_batch_size)" in text
    assert text.count("the model given (Qwen/Qwen2.5-0.5B) is used, not mistralai/Mistral-7B-v0.1") == 1
    assert "Qwen/Qwen2.5-0.5B" in text.split("Job")[0]  # the Model line


def test_a_mode_given_wins_over_the_recipes(mistral):
    # --train with a LoRA recipe: full training; the recipe's LoRA settings are not read (no refusal)
    t = resolve({"train": True, "config": [QLORA]}, mistral, A100)
    assert (t.method, t.micro_batch_size) == (Method.FULL, 4)


def test_a_launcher_file_without_a_mode_is_training():
    # a DeepSpeed JSON sizes training states only: with no mode anywhere the job is training, not serving
    out = run_memest("hf", MISTRAL, "--config", DS_ZERO3, "--gpus", "8", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["mode"] == "train" and doc["workload"]["parallelism"]["zero_stage"] == 3


def test_calibrate_without_model_or_config_is_one_line():
    out = run_memest("calibrate", "--train")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "--config FILE" in out.stderr


def test_plan_and_sweep_take_the_model_from_the_file():
    sweep = run_memest("sweep", "--config", QLORA, "--seq-len", "1k..4k", "--gpu", "A100-80GB", "--json")
    assert sweep.returncode == 0, sweep.stderr
    assert [p["value"] for p in json.loads(sweep.stdout)["points"]] == [1024, 2048, 4096]
    plan = run_memest("plan", "--config", QLORA, "--micro-batch-size", "1", "--gpus-available", "1xA100-80GB",
                      "--top", "1", "--json")
    assert plan.returncode == 0, plan.stderr
    command = json.loads(plan.stdout)["fits"][0]["command"]
    # the printed command repeats the file, not what it says (lora_dropout 0.05 is the file's), and keeps a
    # flag given over the file at its default (--micro-batch-size 1 over per_device_train_batch_size 4)
    assert command.startswith(f"memest hf {MISTRAL} --config {QLORA}"), command
    assert "--micro-batch-size 1" in command and "--lora-dropout" not in command, command


def test_no_model_anywhere_is_one_line():
    out = run_memest("hf", "--train")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "no MODEL given" in out.stderr
    named = run_memest("hf", "--train", "--config", DS_ZERO3)
    assert named.returncode == 2 and "no --config file names one" in named.stderr, named.stderr


@pytest.mark.parametrize(("first", "second", "setting"), [
    (DS_ZERO3, ACCEL_FSDP, "stack"),          # DeepSpeed ZeRO-3 and an accelerate FSDP launch: who runs the step
    (ZERO3_LAUNCH, FSDP_LAUNCH, "framework"),  # both accelerate launches: DeepSpeed or FSDP runs the step
    (AXOLOTL_QLORA, LF_QLORA, "stack"),      # two recipes of different stacks
], ids=["ds-json-vs-fsdp", "accelerate-ds-vs-fsdp", "two-stacks"])
def test_conflicting_files_are_one_error_naming_both(first, second, setting):
    out = run_memest("hf", MISTRAL, "--train", "--config", first, "--config", second)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and first in lines[0] and second in lines[0] and f"disagree on {setting}" in lines[0]


def test_a_memory_relevant_key_memest_does_not_model_is_named():
    # fsdp.yaml line 10: fsdp_forward_prefetch: true (accelerate's default false)
    notes = files.read([FSDP_LAUNCH]).notes
    assert any(n.startswith("fsdp.yaml:10 fsdp_config.fsdp_forward_prefetch is True") for n in notes), notes


def test_a_missing_deepspeed_file_is_said(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model_name_or_path: mistralai/Mistral-7B-v0.1\ndeepspeed: nowhere/ds.json\nbf16: true\n")
    assert any("deepspeed names nowhere/ds.json, not found" in n for n in files.read([recipe]).notes)


def test_an_inline_deepspeed_mapping(mistral, tmp_path):
    # deepspeed as a mapping inside the recipe: stage 2 -> ZeRO-2 under DeepSpeed; bf16 true -> DeepSpeed bf16
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model_name_or_path: m\nbf16: true\ndeepspeed:\n  zero_optimization:\n    stage: 2\n")
    r = files.read([recipe])
    assert (r.values["zero_stage"], r.values["precision"]) == (2, Precision.MIXED)
    assert r.origins["zero_stage"] == "recipe.yaml:5 deepspeed.zero_optimization.stage"


@pytest.mark.parametrize(("text", "message"), [
    ("base_model: m\nmicro_batch_size: [2\n", "line 2 (the end of the file): malformed YAML"),
    ("model_name_or_path: m\nper_device_train_batch_size: '4'\n",
     "per_device_train_batch_size is '4'; expected an integer"),
    ("base_model: m\nadapter: lora\nlora_r: 8.5\n", "lora_r is 8.5; expected an integer"),
    ("finetuning_type: lora\nquantization_bit: four\n", "quantization_bit is 'four'; expected 4 or 8"),
    ("steps: 10\n", "not a format memest reads; pass"),
], ids=["malformed", "type-trainer", "type-axolotl", "type-llamafactory", "unknown"])
def test_bad_recipes_are_one_line_naming_the_file(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    out = run_memest("hf", MISTRAL, "--train", "--config", str(path))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and message in lines[0], lines


def test_unknown_format_names_every_format(tmp_path):
    path = tmp_path / "other.yaml"
    path.write_text("steps: 10\n")
    with pytest.raises(InputError) as exc:
        files.read([path])
    for words in ("DeepSpeed", "accelerate", "TrainingArguments", "axolotl", "LLaMA-Factory"):
        assert words in str(exc.value)


def test_the_python_api_takes_the_model_and_mode_from_a_recipe():
    # no model, no mode: the recipe's (mistralai/Mistral-7B-v0.1, QLoRA: use_peft + load_in_4bit)
    import memest

    answer = memest.estimate_memory(config=[QLORA], gpu="A100-80GB")
    assert (answer.model["name"], answer.mode, answer.workload["method"]) == (MISTRAL, "qlora", "qlora")
    with pytest.raises(InputError, match="batch_size is a serving flag"):  # a keyword the recipe's job would not read
        memest.estimate_memory(config=[QLORA], batch_size=4)


def test_a_preference_stage_is_named(tmp_path):
    # LLaMA-Factory stage dpo: a reference model memest does not model -> a note naming the stage
    path = tmp_path / "dpo.yaml"
    path.write_text("model_name_or_path: m\nstage: dpo\nfinetuning_type: lora\n")
    assert any("stage dpo also holds a reference" in n for n in files.read([path]).notes)


def test_settings_the_job_does_not_read_are_named(mistral):
    # --serve with a QLoRA recipe: its training settings (lora_r, per_device_train_batch_size, ...) are not read
    w = resolve({"serve": True, "config": [QLORA]}, mistral, A100)
    note = next(n for n in w.config_notes if n.startswith("a serve job does not read"))
    assert "lora_rank (config_qlora.yaml:10 lora_r)" in note


def test_plan_does_not_say_a_files_device_count_was_given():
    # zero3.yaml's num_processes 8 is the file's, not a --gpus typed: no "plan searches --gpus" note
    out = run_memest("plan", "--config", FULL, "--config", ZERO3_LAUNCH, "--gpus-available", "8xH100", "--json")
    assert out.returncode == 0 and "plan searches" not in out.stderr, out.stderr


def test_trainer_torch_compile_and_trl_activation_offloading_are_read(tmp_path):
    # TrainingArguments.torch_compile (the Trainer wraps the model in torch.compile) and trl SFTConfig's
    # activation_offloading (trl/models/activation_offloading.py: torchtune's get_act_offloading_ctx_manager)
    # become the settings memest models; axolotl passes torch_compile on to the Trainer
    recipe = tmp_path / "sft.yaml"
    recipe.write_text("model_name_or_path: meta-llama/Llama-3.1-8B\nper_device_train_batch_size: 2\n"
                      "use_peft: true\ntorch_compile: true\nactivation_offloading: true\n")
    r = files.read([str(recipe)])
    assert (r.values["torch_compile"], r.values["activation_offloading"]) == (True, True)
    assert r.origins["torch_compile"] == "sft.yaml:4 torch_compile"
    assert not any("torch_compile" in n or "activation_offloading" in n for n in r.notes), r.notes
    axolotl = tmp_path / "ax.yaml"
    axolotl.write_text("base_model: meta-llama/Llama-3.1-8B\nmicro_batch_size: 1\nsequence_len: 2048\n"
                       "torch_compile: true\n")
    a = files.read([str(axolotl)])
    assert a.values["torch_compile"] is True and not any("torch_compile" in n for n in a.notes), a.notes
    off = tmp_path / "off.yaml"  # false keeps the defaults (not compiled, no offloading)
    off.write_text("model_name_or_path: meta-llama/Llama-3.1-8B\ntorch_compile: false\n")
    assert "torch_compile" not in files.read([str(off)]).values
