"""Max queries: the largest micro-batch, seq_len, concurrency or context that fits, exact at the boundary.

Exactness is checked by re-estimating: the answer fits and answer + step does not. One case per mode
is also derived by hand from the linear part of the estimate (KV cache per sequence, activations per
token), so a bisection that stopped one step early or late would be caught twice.
"""

from __future__ import annotations

import pytest

from memest.devices import get_device
from memest.errors import InputError
from memest.estimate import estimate
from memest.planning.fit import usable_bytes, verdict
from memest.planning.maxfit import CAPS, Largest, largest, limits
from memest.sources import load_model
from memest.workload import Engine, Parallelism, Recompute, ServingConfig, TrainingConfig

HEADROOM = 0.10


def _fits(spec, w, device) -> bool:
    return verdict(estimate(spec, w, device), device, w.parallelism.world_size, HEADROOM).fits


CASES = [
    pytest.param("meta-llama/Llama-2-7b-hf", TrainingConfig(seq_len=4096, parallelism=Parallelism(dp=8, zero_stage=3)),
                 "H100", "micro_batch_size", id="llama2-7b-zero3-mbs"),
    pytest.param("meta-llama/Llama-2-7b-hf", TrainingConfig(recompute=Recompute.FULL, parallelism=Parallelism(dp=8, zero_stage=3)),
                 "H100", "seq_len", id="llama2-7b-zero3-seq"),
    pytest.param("Qwen/Qwen2.5-7B", TrainingConfig(seq_len=8192, parallelism=Parallelism(tp=4, pp=2, dp=2, zero_stage=1)),
                 "A100-80GB", "micro_batch_size", id="qwen2.5-7b-tp4-pp2-mbs"),
    pytest.param("Qwen/Qwen2.5-7B", TrainingConfig(parallelism=Parallelism(cp=4, dp=2, zero_stage=2)),
                 "A100-80GB", "seq_len", id="qwen2.5-7b-cp4-seq-steps-of-8"),
    pytest.param("meta-llama/Llama-2-70b-hf", ServingConfig(max_model_len=4096, parallelism=Parallelism(tp=4)),
                 "H100", "batch_size", id="llama2-70b-tp4-concurrency"),
    pytest.param("meta-llama/Llama-3.1-8B", ServingConfig(batch_size=4), "L4", "max_model_len", id="llama3.1-8b-L4-context"),
    pytest.param("meta-llama/Llama-3.1-8B", ServingConfig(max_model_len=2048, engine=Engine.HF), "A10G", "batch_size",
                 id="llama3.1-8b-hf-generate-batch"),
]


@pytest.mark.parametrize(("model", "workload", "device", "setting"), CASES)
def test_answer_fits_and_answer_plus_one_step_does_not(model, workload, device, setting):
    spec = load_model(model)
    dev = get_device(device)
    q = largest(spec, workload, dev, setting, headroom=HEADROOM)
    assert q.value is not None and not q.capped
    assert q.value % q.step == 0
    assert _fits(spec, workload.replace(**{setting: q.value}), dev)
    assert not _fits(spec, workload.replace(**{setting: q.value + q.step}), dev)


def test_context_parallel_seq_len_moves_in_steps_of_two_cp():
    spec = load_model("Qwen/Qwen2.5-7B")
    q = largest(spec, TrainingConfig(parallelism=Parallelism(cp=4, dp=2, zero_stage=2)), get_device("A100-80GB"),
                "seq_len", headroom=HEADROOM)
    assert q.step == 8  # ring attention splits each sequence into 2 x cp chunks


def test_concurrency_by_hand_from_the_kv_cache_per_sequence():
    # Llama-2-7B, vLLM, one H100, max_model_len 4096. Every term but the KV cache is independent of
    # batch_size; the KV cache is 2 (K, V) x 32 layers x 32 KV heads x 128 head_dim x 2 B = 524,288 B
    # per token, x 4096 tokens (256 whole blocks of 16) = 2 GiB per sequence. So the largest batch is
    # floor((usable - fixed) / 2 GiB), where fixed = device used at batch 1 less one sequence's KV.
    spec = load_model("meta-llama/Llama-2-7b-hf")
    device = get_device("H100")
    w = ServingConfig(max_model_len=4096, batch_size=1)
    per_sequence = 2 * 32 * 32 * 128 * 2 * 4096
    assert per_sequence == 2 * 2**30
    fixed = estimate(spec, w, device).per_device.device_used_bytes - per_sequence
    expected = (usable_bytes(device, HEADROOM) - fixed) // per_sequence
    assert largest(spec, w, device, "batch_size", headroom=HEADROOM).value == expected


def test_micro_batch_by_hand_from_the_activations_per_sequence():
    # Llama-2-7B, ZeRO-3 over 8 H100s, seq_len 4096, no recompute. At the forward's end (the peak once
    # activations outweigh the optimizer-step temporary) only activations and logits grow with the
    # micro-batch, linearly, and the allocator's slack is 10% of allocated. So
    # device_used(b) = fixed + b x per_sequence x 1.1, up to rounding of a few bytes per term.
    spec = load_model("meta-llama/Llama-2-7b-hf")
    device = get_device("H100")
    w = TrainingConfig(seq_len=4096, parallelism=Parallelism(dp=8, zero_stage=3))
    used = [estimate(spec, w.replace(micro_batch_size=b), device).per_device.device_used_bytes for b in (2, 3)]
    per_sequence = used[1] - used[0]
    fixed = used[0] - 2 * per_sequence
    expected = (usable_bytes(device, HEADROOM) - fixed) // per_sequence
    got = largest(spec, w, device, "micro_batch_size", headroom=HEADROOM).value
    assert got == expected


def test_nothing_fits_gives_none():
    spec = load_model("meta-llama/Llama-2-70b-hf")
    q = largest(spec, ServingConfig(), get_device("L4"), "batch_size", headroom=HEADROOM)
    assert q == Largest("batch_size", None, 1, False, 1)


def test_a_cap_reached_is_reported_as_capped():
    spec = load_model("Qwen/Qwen2.5-0.5B")
    q = largest(spec, ServingConfig(max_model_len=512), get_device("H200"), "batch_size", headroom=HEADROOM, cap=64)
    assert (q.value, q.capped) == (64, True)
    assert _fits(spec, ServingConfig(max_model_len=512, batch_size=64), get_device("H200"))


def test_caps_are_powers_of_two_so_doubling_lands_on_them():
    assert all(cap & (cap - 1) == 0 for cap in CAPS.values())


@pytest.mark.parametrize(("workload", "setting", "message"), [
    (TrainingConfig(), "batch_size", "--batch-size cannot be searched for a train job; use one of --micro-batch-size, --seq-len"),
    (ServingConfig(), "seq_len", "--seq-len cannot be searched for a serve job; use one of --batch-size, --max-model-len"),
])
def test_settings_of_the_other_mode_are_refused(workload, setting, message):
    spec = load_model("meta-llama/Llama-2-7b-hf")
    with pytest.raises(InputError, match=message):
        largest(spec, workload, get_device("H100"), setting, headroom=HEADROOM)


def test_limits_ask_both_questions_of_the_mode():
    spec = load_model("meta-llama/Llama-3.2-1B")
    device = get_device("L4")
    assert [q.setting for q in limits(spec, TrainingConfig(), device, headroom=HEADROOM)] == ["micro_batch_size", "seq_len"]
    assert [q.setting for q in limits(spec, ServingConfig(), device, headroom=HEADROOM)] == ["batch_size", "max_model_len"]


@pytest.mark.parametrize("model", ["meta-llama/Llama-2-7b-hf", "Qwen/Qwen2.5-0.5B", "mistralai/Mistral-7B-v0.1"])
def test_memory_grows_with_each_queried_setting(model):
    # the monotonicity the bisection relies on, on a geometric grid of each setting
    spec = load_model(model)
    device = get_device("H100")
    grids = [
        (TrainingConfig(), "micro_batch_size", [1, 2, 3, 8, 16]),
        (TrainingConfig(recompute=Recompute.FULL), "seq_len", [128, 1000, 4096, 32768]),
        (ServingConfig(max_model_len=4096), "batch_size", [1, 7, 64, 300]),
        (ServingConfig(batch_size=2), "max_model_len", [1, 15, 16, 17, 1000, 4096]),
    ]
    for w, setting, values in grids:
        used = [estimate(spec, w.replace(**{setting: v}), device).per_device.device_used_bytes for v in values]
        assert used == sorted(used), (setting, used)
