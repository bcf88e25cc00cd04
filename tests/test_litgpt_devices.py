"""litgpt by device count (memest/workload/stacks.py ``LITGPT_FSDP``): ``litgpt/finetune/full.py`` and ``lora.py``
at commit 0077627d hard-code, when ``devices * num_nodes > 1``, ``FSDPStrategy(auto_wrap_policy={Block},
activation_checkpointing_policy={Block}, ...)`` (Fabric FSDP1 FULL_SHARD, every Block checkpointed, accumulation
inside ``no_backward_sync``), else strategy ``"auto"``; ``lora.py`` raises NotImplementedError for ``--quantize``
on several devices."""

from __future__ import annotations

import re

import pytest
from inprocess import run_memest

from memest.devices import get_device
from memest.errors import InputError
from memest.estimate import estimate
from memest.planning.search import DeviceChoice, Space, plan
from memest.sources import load_model
from memest.workload import Method, Recompute, Stack
from memest.workload.resolve import resolve
from memest.workload.validate import validate

LLAMA = "meta-llama/Llama-2-7b-hf"
A100 = get_device("A100-80GB")


@pytest.fixture(scope="module")
def llama():
    return load_model(LLAMA)


def build(spec, **values):
    return resolve({"train": True, "stack": "litgpt", **values}, spec, A100)


def test_several_devices_run_litgpts_fsdp_strategy(llama):
    t = build(llama, gpus=4)
    assert t.recompute is Recompute.FULL  # activation_checkpointing_policy={Block}
    assert t.parallelism.zero_stage == 3  # FSDPStrategy's default sharding_strategy FULL_SHARD
    assert t.fsdp_flat_params and t.no_sync_accumulation  # FSDP1 FlatParameters; fabric.no_backward_sync
    one = build(llama, gpus=1)  # strategy "auto": no checkpointing, no sharding
    assert one.recompute is Recompute.NONE and one.parallelism.zero_stage == 0 and not one.fsdp_flat_params


def test_the_default_is_the_explicit_fsdp1_job(llama):
    # the stack's defaults on 4 devices are the settings the litgpt validation cases gave by hand
    by_hand = build(llama, gpus=4, recompute="full", zero_stage=3, fsdp_flat_params=True, no_sync_accumulation=True,
                    grad_accum_steps=4)
    default = build(llama, gpus=4, grad_accum_steps=4)
    assert estimate(llama, default, A100).per_device.device_used_bytes == \
        estimate(llama, by_hand, A100).per_device.device_used_bytes


@pytest.mark.parametrize("values, args, field, fix", [
    ({"gpus": 4, "recompute": "none"}, "--train --gpus 4 --recompute none", "recompute",
     "or --recompute full), or use --gpus 1"),
    ({"gpus": 4, "recompute": "selective"}, "--train --gpus 4 --recompute selective", "recompute", "or use --gpus 1"),
    ({"gpus": 2, "zero_stage": 2}, "--train --gpus 2 --zero-stage 2", "zero_stage", "use another --stack"),
    ({"gpus": 2, "zero_stage": 1}, "--train --gpus 2 --zero-stage 1", "zero_stage", "use another --stack"),
    ({"gpus": 1, "zero_stage": 3}, "--train --gpus 1 --zero-stage 3", "zero_stage", "use more --gpus"),
    ({"gpus": 4, "finetune": "qlora"}, "--finetune qlora --gpus 4", "finetune", "use --gpus 1, or another --stack"),
])
def test_what_litgpt_cannot_run_by_device_count_is_refused(llama, values, args, field, fix):
    out = run_memest("hf", LLAMA, *args.split(), "--stack", "litgpt", "--gpu", "A100-80GB")
    assert out.returncode == 2, out.stdout
    error = [line for line in out.stderr.splitlines() if line.startswith("Error")]
    assert len(error) == 1 and fix in error[0], out.stderr
    with pytest.raises(InputError) as exc:
        validate(llama, resolve({"stack": "litgpt", **({} if "finetune" in values else {"train": True}), **values},
                                llama, A100))
    assert exc.value.field == field


def test_litgpt_qlora_on_one_device_still_runs(llama):
    t = resolve({"finetune": "qlora", "stack": "litgpt", "gpus": 1}, llama, A100)
    validate(llama, t)
    assert t.method is Method.QLORA


def test_the_planner_never_proposes_what_litgpt_refuses():
    spec = load_model("meta-llama/Llama-3.1-8B")
    for asked in (resolve({"finetune": "qlora", "stack": "litgpt", "seq_len": 2048}, spec, A100),
                  resolve({"train": True, "stack": "litgpt", "seq_len": 2048}, spec, A100)):
        result = plan(spec, asked, Space(devices=(DeviceChoice(A100, 8),)), max_queries=False)
        assert result.fits
        for f in result.fits:
            w = f.setup.workload
            assert w.stack is Stack.LITGPT
            n = w.parallelism.world_size
            if asked.method is Method.QLORA:
                assert n == 1
            assert w.parallelism.zero_stage == (3 if n > 1 else 0)
            assert n == 1 or (w.recompute is Recompute.FULL and w.fsdp_flat_params)


def test_the_planners_litgpt_command_reproduces_its_figure():
    out = run_memest("plan", "meta-llama/Llama-3.1-8B", "--train", "--stack", "litgpt", "--seq-len", "2048",
                     "--gpus-available", "4xA100-80GB", "--top", "1", timeout=300)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    row = re.search(r"│ 1 │(?:[^│]*│){4}\s*([\d.]+)\s*│", out.stdout)  # the peak GiB/device column
    command = re.search(r"Cheapest: memest hf (.*?) Confirm", text)
    assert row and command, out.stdout
    assert "--recompute full" in command.group(1) and "--zero-stage 3" in command.group(1)
    # the printed command, and the same with litgpt's FSDPStrategy spelt out (the validation cases' hand settings)
    for extra in ((), ("--fsdp-flat-params", "--no-sync-accumulation")):
        again = run_memest("hf", *command.group(1).split(), *extra)
        assert again.returncode == 0, again.stderr
        assert f"FITS: {row.group(1)} GiB" in again.stdout, (row.group(1), extra, again.stdout)


def test_a_litgpt_config_hub_yaml_is_named_in_its_refusal():
    from memest.validation import stack_mapping as sm
    from memest.workload import files

    stored = sm.CONFIG_DIR / "configs/Lightning-AI/litgpt/00af8b0d9b43/config_hub/finetune/falcon-7b/qlora.yaml"
    with pytest.raises(InputError, match="not a format memest reads") as exc:
        files.read([stored])
    assert "a litgpt config: memest has no reader for it" in str(exc.value)
    assert "with stack litgpt (micro_batch_size, seq_len, lora_rank" in str(exc.value)


def test_a_yaml_of_no_known_format_is_not_called_litgpt(tmp_path):
    from memest.workload import files

    p = tmp_path / "x.yaml"
    p.write_text("precision: bf16\nfoo: {bar: 1}\n")
    with pytest.raises(InputError, match="not a format memest reads") as exc:
        files.read([p])
    assert "litgpt" not in str(exc.value)


def test_a_multi_gpu_litgpt_job_that_does_not_fit_gets_its_suggestions():
    # memest.planning.search's one-device check of the job ran at ZeRO stage 3, which litgpt refuses on one
    # device (strategy "auto"): the job itself was refused instead of answered
    out = run_memest("hf", "meta-llama/Llama-3.1-8B", "--train", "--stack", "litgpt", "--gpu", "A100-80GB",
                     "--gpus", "2", "--seq-len", "2048")
    assert out.returncode == 0, out.stderr
    assert "DOES NOT FIT" in out.stdout and "Cheapest fit: --stack litgpt" in " ".join(out.stdout.split())


@pytest.mark.parametrize("gpus", [1, 4])
def test_litgpt_offloads_nothing(gpus):
    """litgpt finetune/full.py / lora.py at 0077627d: FSDPStrategy(..., cpu_offload=False) on several devices,
    strategy "auto" (no sharding backend) on one: an offload is refused either way, naming the setting."""
    out = run_memest("hf", "meta-llama/Llama-3.1-8B", "--train", "--stack", "litgpt", "--gpu", "A100-80GB",
                     "--gpus", str(gpus), "--offload", "optimizer")
    assert out.returncode == 2 and "--offload optimizer does not run on" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
