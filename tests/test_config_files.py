"""Config files as input (memest/workload/files/): real files from the projects' repositories
(tests/data/configs/README.md cites each), each with the workload derived by hand from its keys."""

from __future__ import annotations

from pathlib import Path

import pytest
from inprocess import run_memest

from memest.devices import get_device
from memest.errors import InputError
from memest.sources import load_model
from memest.workload import Framework, FsdpStrategy, Offload, Precision, Recompute, Stack, resolve_framework
from memest.workload.resolve import resolve
from memest.workload.stacks import recipe_words
from memest.workload.validate import workload_notes

DATA = Path(__file__).resolve().parent / "data" / "configs"
ZERO3 = str(DATA / "ds_config_zero3.json")
FSDP = str(DATA / "accelerate_fsdp.yaml")
LLAMA = "meta-llama/Llama-2-7b-hf"
A100 = get_device("A100-80GB")


@pytest.fixture(scope="module")
def llama():
    return load_model(LLAMA)


def test_transformers_zero3_json(llama):
    # "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}
    # -> ZeRO-3 with parameters (and so optimizer states) offloaded; "fp16": {"enabled": true} -> DeepSpeed fp16;
    # no train_micro_batch_size_per_gpu / gradient_accumulation_steps keys -> memest's 1 and 1
    t = resolve({"train": True, "config": [ZERO3], "gpus": 8}, llama, A100)
    assert t.stack is Stack.DEEPSPEED and resolve_framework(t) is Framework.DEEPSPEED
    assert (t.parallelism.zero_stage, t.offload, t.precision) == (3, Offload.PARAMS, Precision.FP16)
    assert (t.micro_batch_size, t.grad_accum_steps, t.parallelism.dp) == (1, 1, 8)


def test_accelerate_fsdp_yaml(llama):
    # distributed_type FSDP, fsdp_sharding_strategy FULL_SHARD -> ZeRO-3 under FSDP; num_processes 2 x
    # num_machines 1 (absent) -> 2 devices; mixed_precision bf16 -> MixedPrecision(param_dtype=bf16) over fp32
    # shards (memest fsdp2); fsdp_activation_checkpointing false, fsdp_offload_params false
    t = resolve({"train": True, "config": [FSDP]}, llama, A100)
    assert t.stack is Stack.ACCELERATE and resolve_framework(t) is Framework.FSDP
    assert (t.parallelism.zero_stage, t.parallelism.dp, t.precision) == (3, 2, Precision.FSDP2)
    assert (t.recompute, t.offload) == (Recompute.NONE, Offload.NONE)


def test_flags_given_override_the_file(llama):
    t = resolve({"train": True, "config": [ZERO3], "gpus": 8, "zero_stage": 2, "offload": "optimizer"}, llama, A100)
    assert (t.parallelism.zero_stage, t.offload, t.precision) == (2, Offload.OPTIMIZER, Precision.FP16)
    f = resolve({"train": True, "config": [FSDP], "fsdp": FsdpStrategy.SHARD_GRAD_OP, "gpus": 4}, llama, A100)
    assert (f.parallelism.zero_stage, f.parallelism.dp) == (2, 4)


def test_auto_is_said_in_the_assumptions(llama, tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": true}, '
                    '"zero_optimization": {"stage": 2}}')
    t = resolve({"train": True, "config": [str(path)], "gpus": 2}, llama, A100)
    assert t.micro_batch_size == 1 and t.precision is Precision.MIXED and t.parallelism.zero_stage == 2
    assert any("train_micro_batch_size_per_gpu is \"auto\"" in note for note in workload_notes(llama, t))


@pytest.mark.parametrize(("text", "message"), [
    ('{\n  "zero_optimization": {\n    "stage": 3,\n  }\n}', "line 4: malformed JSON"),
    # two lines: PyYAML marks the stream's end on the line after the last newline (0-based 2); the file's
    # last line is 2
    ("distributed_type: FSDP\nfsdp_config: [unclosed\n", "line 2 (the end of the file): malformed YAML"),
    ("distributed_type: FSDP\nfsdp_config: [a, b\nnum_processes: 2\n", "line 3: malformed YAML"),  # the ':'
    ("[training]\nlr = \n", "line 2: malformed TOML"),
    ("model: llama\n", "not a format memest reads"),
    ('{"zero_optimization": {"stage": "three"}}', "zero_optimization.stage is 'three'; expected 0, 1, 2 or 3"),
], ids=["json", "yaml-at-end", "yaml", "toml", "unknown", "type"])
def test_bad_files_are_one_line_naming_the_file(tmp_path, text, message):
    path = tmp_path / "bad.cfg"
    path.write_text(text)
    out = run_memest("hf", LLAMA, "--train", "--config", str(path))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and message in lines[0], lines


@pytest.mark.parametrize(("name", "message"), [("nonexist.yaml", "does not exist"), ("", "is a directory")],
                         ids=["missing", "directory"])
def test_a_config_path_that_is_no_file_says_so(tmp_path, name, message):
    """As memest check says of a log path: what is wrong with the path, not the list of formats."""
    path = tmp_path / name
    out = run_memest("hf", LLAMA, "--train", "--config", str(path))
    assert out.returncode == 2 and out.stdout == ""
    line = out.stderr.strip()
    assert line.startswith(f"Error: --config {path}: {message}; ") and "\n" not in line, line
    assert "torchtune" not in line and len(line) < 160, line  # no format list: the file is not there


def test_the_library_names_no_flag():
    from memest.workload import files

    with pytest.raises(InputError) as exc:
        files.read([str(DATA / "README.md")])
    assert exc.value.field == "config"


_FSDP2 = ("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config:\n"
          "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_cpu_ram_efficient_loading: true\n"
          "  fsdp_offload_params: false\n  fsdp_reshard_after_forward: {raf}\n"
          "  fsdp_state_dict_type: SHARDED_STATE_DICT\n  fsdp_version: 2\n  fsdp_activation_checkpointing: false\n"
          "mixed_precision: bf16\nnum_machines: 1\nnum_processes: 4\n")
"""A user's accelerate FSDP2 config (the report's accel_fsdp2.yaml)."""


@pytest.mark.parametrize(("raf", "stage"), [("false", 2), ("true", 3)])
def test_accelerate_fsdp2_reshard_after_forward(llama, tmp_path, raf, stage):
    # accelerate v1.14.0 utils/dataclasses.py: under fsdp_version 2 reshard_after_forward is a bool passed to
    # every fully_shard unit; false keeps each unit gathered from its forward to its backward = SHARD_GRAD_OP
    # (zero_stage 2), true reshards = FULL_SHARD (3); the file has no fsdp_sharding_strategy, so "read:" names
    # fsdp_reshard_after_forward (line 7)
    path = tmp_path / "accel_fsdp2.yaml"
    path.write_text(_FSDP2.format(raf=raf))
    t = resolve({"train": True, "config": [str(path)]}, llama, A100)
    assert (t.parallelism.zero_stage, t.parallelism.dp) == (stage, 4)
    assert any("fsdp_config.fsdp_reshard_after_forward" in line and "accel_fsdp2.yaml:7" in line
               for line in t.config_read), t.config_read
    assert not any("fsdp_sharding_strategy" in line for line in t.config_read)


def test_accelerate_fsdp_version_selects_the_key(llama, tmp_path):
    # fsdp_version 2 reads fsdp_reshard_after_forward, not fsdp_sharding_strategy (dataclasses.py reads
    # FSDP_SHARDING_STRATEGY only when fsdp_version == 1): SHARD_GRAD_OP here is not what runs, the default
    # reshard_after_forward true is (FULL_SHARD, 3), said as a default
    path = tmp_path / "v2.yaml"
    path.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_sharding_strategy: SHARD_GRAD_OP\n"
                    "num_processes: 2\n")
    t = resolve({"train": True, "config": [str(path)]}, llama, A100)
    assert t.parallelism.zero_stage == 3
    assert any("accelerate launch's default, true" in line for line in t.config_read), t.config_read
    assert any("fsdp_sharding_strategy is not read under fsdp_version 2" in n for n in workload_notes(llama, t))
    # FSDP1 with the strategy as its number: ShardingStrategy(2) = SHARD_GRAD_OP (1-based, dataclasses.py)
    path.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: 2\nnum_processes: 2\n")
    assert resolve({"train": True, "config": [str(path)]}, llama, A100).parallelism.zero_stage == 2


def test_nvme_offload_is_named_and_below_zero3_stays_in_host_ram(llama, tmp_path):
    # DeepSpeed v0.19.5 stage_1_and_2.py __init__: any offload_optimizer.device but none sets cpu_offload, and
    # ZeRO-1/2 have no swapper (only stage3.py swaps to NVMe: swap_optimizer = device == nvme), so the user's
    # ZeRO-2 nvme file keeps its states in host RAM exactly as device cpu does: same host bytes, and a note
    # naming nvme
    path = tmp_path / "nvme.json"
    path.write_text('{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": '
                    '"/local_nvme"}}, "bf16": {"enabled": true}}')
    cpu = tmp_path / "cpu.json"
    cpu.write_text(path.read_text().replace('"nvme"', '"cpu"'))
    from memest.estimate import estimate

    t = resolve({"train": True, "config": [str(path)], "gpus": 4}, llama, A100)
    c = resolve({"train": True, "config": [str(cpu)], "gpus": 4}, llama, A100)
    assert t.offload is Offload.OPTIMIZER
    assert estimate(llama, t, A100).host_bytes == estimate(llama, c, A100).host_bytes > 0
    assert any("offload_optimizer.device nvme at ZeRO 2" in n and "stay in host RAM" in n
               for n in workload_notes(llama, t))
    path.write_text(path.read_text().replace('"stage": 2', '"stage": 3'))
    t3 = resolve({"train": True, "config": [str(path)], "gpus": 4}, llama, A100)
    assert any("ZeRO-3 swaps the fp32 master, optimizer states and fp32 gradients to /local_nvme" in n
               for n in workload_notes(llama, t3))


def test_zero3_nvme_optimizer_keeps_only_the_swap_buffers_in_host_ram(llama, tmp_path):
    # DeepSpeed v0.19.5 stage3.py: sub-groups close once they reach sub_group_size (1: every parameter its own);
    # OptimizerSwapper allocates buffer_count 4 pinned fp32 buffers of the largest (I/O-aligned to 256
    # elements); a swappable sub-group (>= 1 MiB of fp32 = 262,144 elements) keeps its fp32 master, Adam states
    # and fp32 gradient (4 + 8 + 4 = 16 B/element) on NVMe instead of host RAM.
    # Llama-2-7b on 8 ranks: partitions are numel / 8; the largest, embed_tokens / lm_head 32000 x 4096 / 8 =
    # 16,384,000 (a multiple of 256): buffers 4 x 16,384,000 x 4 B = 262,144,000 B per rank. The 65 RMSNorm
    # weights (4096 / 8 = 512 elements each) are not swappable; the rest is: 6,738,415,616 / 8 - 65 x 512 =
    # 842,301,952 - 33,280 = 842,268,672 elements x 16 B = 13,476,298,752 B leave host RAM per rank.
    # Per node (8 ranks): 8 x (262,144,000 - 13,476,298,752) = -105,713,238,016 B against device cpu.
    # At the default sub_group_size 1e9 the 842,301,952-element partition is one sub-group: 4 x its elements x
    # 4 B = 16 B/element of buffers, the same host RAM as cpu.
    from memest.estimate import estimate

    def host(device: str, sub_group: str) -> int:
        path = tmp_path / f"{device}{sub_group}.json"
        path.write_text('{"bf16": {"enabled": true}, "zero_optimization": {"stage": 3, "offload_optimizer": '
                        '{"device": "%s"}%s}}' % (device, sub_group))
        return estimate(llama, resolve({"train": True, "config": [str(path)], "gpus": 8}, llama, A100), A100).host_bytes

    one = ', "sub_group_size": 1'
    assert host("nvme", one) - host("cpu", one) == 8 * (262_144_000 - 13_476_298_752) == -105_713_238_016
    assert host("nvme", "") == host("cpu", "")


def test_accelerate_deepspeed_nvme_offload_is_named(llama, tmp_path):
    # accelerate's deepspeed_config offload_optimizer_device nvme at zero_stage 3: DeepSpeed swaps the states
    # to NVMe (stage3.py swap_optimizer); memest does not take the swap from an accelerate YAML, and says so
    path = tmp_path / "accel_ds.yaml"
    path.write_text("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n  offload_optimizer_device: nvme\n"
                    "  offload_param_device: none\nmixed_precision: bf16\nnum_processes: 4\n")
    t = resolve({"train": True, "config": [str(path)]}, llama, A100)
    assert t.offload is Offload.OPTIMIZER
    assert any("offload_optimizer_device nvme" in n and "over-count of host RAM" in n for n in workload_notes(llama, t))


def test_accelerate_deepspeed_launch_is_accelerate_and_fills_auto(llama, tmp_path):
    # distributed_type DEEPSPEED with a deepspeed_config_file: accelerate runs the step and hands the model to
    # DeepSpeed (Accelerator.prepare -> _prepare_deepspeed), which fills the JSON's hidden-size "auto" keys from
    # model.config.hidden_size (Llama-2-7b: 4096): reduce_bucket_size 4096² = 16,777,216, stage3_prefetch_bucket_size
    # int(0.9 x 4096²) = int(15,099,494.4) = 15,099,494, stage3_param_persistence_threshold 10 x 4096 = 40,960
    (tmp_path / "ds_z3_offload.json").write_text(
        '{"bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, '
        '"offload_optimizer": {"device": "cpu"}, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto", '
        '"stage3_param_persistence_threshold": "auto"}}')
    path = tmp_path / "acc_ds.yaml"
    path.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n"
                    "  deepspeed_config_file: ds_z3_offload.json\n  zero3_init_flag: true\nnum_processes: 8\n"
                    "mixed_precision: bf16\n")
    t = resolve({"train": True, "config": [str(path)]}, llama, A100)
    assert t.stack is Stack.ACCELERATE and resolve_framework(t) is Framework.DEEPSPEED
    assert (t.parallelism.zero_stage, t.offload, t.parallelism.dp) == (3, Offload.PARAMS, 8)
    b = t.deepspeed_buckets
    assert (b.reduce_bucket_size, b.prefetch_bucket_size, b.param_persistence_threshold) == (16_777_216, 15_099_494,
                                                                                             40_960)
    # the job line names accelerate and the backend that shards it, not FSDP as well
    job = recipe_words(t.stack, t.precision, t.optimizer, resolve_framework(t), 3)
    assert job.startswith("accelerate + DeepSpeed ZeRO-3,") and "FSDP" not in job, job


@pytest.mark.parametrize("fsdp_config", ["  fsdp_sharding_strategy: SHARD_GRAD_OP\n",
                                         "  fsdp_version: 2\n  fsdp_reshard_after_forward: false\n"],
                         ids=["fsdp1-shard-grad-op", "fsdp2-no-reshard"])
def test_param_offload_without_reshard_names_the_file_keys(tmp_path, fsdp_config):
    # torch runs it (FSDP1 CPUOffload(offload_params=True) takes any sharded strategy, FSDP2 fully_shard has no check
    # against reshard_after_forward=False with CPUOffloadPolicy); memest does not model it, and says so with the keys
    # the file wrote: fsdp_offload_params (not "--offload params", nor "--zero-stage 3", which nobody typed)
    path = tmp_path / "accel.yaml"
    path.write_text("distributed_type: FSDP\nnum_processes: 8\nmixed_precision: bf16\nfsdp_config:\n" + fsdp_config
                    + "  fsdp_offload_params: true\n")
    out = run_memest("hf", LLAMA, "--train", "--config", str(path), "--gpu", "A100-80GB")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    message = out.stderr.strip()
    assert "fsdp_config.fsdp_offload_params" in message and "torch runs it" in message, message
    assert "FULL_SHARD" in message and "fsdp_reshard_after_forward: true" in message, message
    assert "--" not in message and "params params" not in message, message


def test_optimizer_in_bwd_refusal_names_the_recipe_key(tmp_path):
    # torchtune refuses optimizer_in_bwd with gradient accumulation; both came from the recipe, so the message
    # names its keys (gradient_accumulation_steps 8), not --grad-accum-steps
    recipe = (DATA / "torchtune" / "v0.6.1" / "llama3_1" / "8B_full.yaml").read_text()
    recipe = recipe.replace("optimizer_in_bwd: False", "optimizer_in_bwd: True").replace(
        "gradient_accumulation_steps: 1", "gradient_accumulation_steps: 8")
    path = tmp_path / "8B_full.yaml"
    path.write_text(recipe)
    out = run_memest("hf", "meta-llama/Llama-3.1-8B", "--config", str(path), "--gpus", "8", "--gpu", "A100-80GB")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    message = out.stderr.strip()
    assert "gradient_accumulation_steps 8" in message and "use gradient_accumulation_steps 1" in message, message
    assert "--grad-accum-steps" not in message, message
