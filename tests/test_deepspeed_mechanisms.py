"""DeepSpeed's ZeRO buffers as the CPU runs of ``benchmarks/deepspeed_cpu.py`` measured them (DeepSpeed 0.14.2 and
0.19.5, gloo, two ranks; ``benchmarks/deepspeed_cpu.md``), and the gist cases' arithmetic behind
``memest/validation/gaps.py``. Expected values are derived by hand below or read from that measurement."""

from __future__ import annotations

from memest.devices import get_device
from memest.estimate.training import moments
from memest.estimate.training.deepspeed import gathered_peak_numel
from memest.workload import Parallelism, TrainingConfig

H100 = get_device("H100-80GB")

# the tiny llama of conftest.py: P = 202,048; at N = 8 ranks the bf16 gradient partition is 2P/8 = 50,512 B,
# 99 blocks of 512 B = 50,688 B
PARTITION = 50_688


def _terms(spec, w, moment):
    return {t.name: t.bytes for t in moments(spec, w, H100)[moment]}


def test_zero2_keeps_the_accumulated_partition_beside_each_micro_batchs_own(tiny):
    # stage_1_and_2.py (0.19.5 all_grad_tensors, 0.14.2 averaged_gradients): under grad_accum_steps > 1 the
    # partition of the window's first micro-batch is kept to the boundary, and each later backward allocates
    # a new grads_in_partition at its first reduction: two partitions at the first layer's backward, one (the
    # accumulated) through the forward. Measured (benchmarks/deepspeed_cpu.md): at GA 2 the boundary
    # micro-batch's epilogue holds the previous partition (4,343,808 B) beside grads_in_partition
    # (4,343,808 B); at GA 1 nothing beside it.
    w = TrainingConfig(seq_len=16, grad_accum_steps=2, parallelism=Parallelism(dp=8, zero_stage=2))
    last = _terms(tiny, w, "last_layer_backward")
    assert (last["gradients"], last["gradients.micro_batch"]) == (PARTITION, PARTITION)
    forward = _terms(tiny, w, "loss_forward")
    assert forward["gradients"] == PARTITION and "gradients.micro_batch" not in forward
    # the step holds one partition (the boundary's epilogue drops the other): 50,688 B, its flattened copy and
    # the fp32 cast (test_training_estimate.py)
    step = _terms(tiny, w, "optimizer_step")
    assert step["gradients"] == PARTITION and "gradients.micro_batch" not in step
    # without accumulation the one partition exists from the first reduction only
    one = w.replace(grad_accum_steps=1)
    assert "gradients.micro_batch" not in _terms(tiny, one, "last_layer_backward")
    assert "gradients" not in _terms(tiny, one, "loss_forward")


def test_zero3_and_zero1_add_no_partition_under_accumulation(tiny):
    # ZeRO-3 accumulates into its persistent grad_partitions_flat_buffer (stage3.py partition_grads:
    # grad_buffer.add_), measured: the GA 2 peaks equal GA 1's (benchmarks/deepspeed_cpu.md); ZeRO-1 keeps
    # param.grad through the window and reduces at the boundary only (engine.py allreduce_gradients)
    for zero in (1, 3):
        w = TrainingConfig(seq_len=16, grad_accum_steps=2, parallelism=Parallelism(dp=8, zero_stage=zero))
        assert "gradients.micro_batch" not in _terms(tiny, w, "last_layer_backward")


def test_zero3_coordinator_matches_deepspeed_0_19_5_on_the_cpu():
    # benchmarks/deepspeed_cpu.md: a 32-layer Llama (hidden 256, intermediate 688, vocab 2048, untied) under
    # DeepSpeed 0.19.5 ZeRO-3 with HF reentrant checkpointing, stage3_prefetch_bucket_size 195,000,
    # stage3_max_live_parameters and stage3_max_reuse_distance 3,910,000 (the Llama-2-7B defaults' ratios to
    # a layer) and stage3_param_persistence_threshold 1,000 (every linear partitioned): the most parameter
    # elements gathered at once, read from each parameter's ds_status at every fetch, was 4,411,392
    # (= 3,910,000 + 501,392: the cap overshot by the fetch that crossed it)
    embed = 2048 * 256  # 524,288
    layer = [256 * 256] * 4 + [256 * 688] * 3  # q, k, v, o 65,536; gate, up, down 176,128
    numel = (embed, *layer * 32, embed)
    assert gathered_peak_numel(numel, tuple(range(len(numel))), max_reuse=3_910_000, prefetch=195_000,
                               max_live=3_910_000) == 4_411_392


def test_the_gists_zero2_peak_is_below_the_states_of_any_step_after_the_first():
    # the gist's ZeRO-2 bs1 rows (DeepSpeed 0.14.2, 8 x A800, LLaMA-7B, Adam: its ZeRO-3 rows' steady 14.8 GB
    # is 16P/N + the 1 GB bucket): after its first optimizer step a rank holds the bf16 weights 2P, the fp32
    # master 4P/N and Adam's two states 8P/N (FusedAdam makes them at its first step):
    # P = 6,738,415,616: 2P = 13,476,831,232 B; 12P/N = 12 x 6,738,415,616 / 8 = 10,107,623,424 B; sum
    # 23,584,454,656 B = 23.58 GB (+ block rounding), above the checkpointed row's max_memory_allocated 23.5 GB:
    # the reading precedes the first step (its memory_allocated, 19.4 GB, is below that too)
    from memest.result import Kind
    from memest.sources import load_model

    w = TrainingConfig(seq_len=4096, grad_accum_steps=8, parallelism=Parallelism(dp=8, zero_stage=2))
    step = moments(load_model("meta-llama/Llama-2-7b-hf"), w, H100)["optimizer_step"]
    states = sum(t.bytes for t in step if t.kind in (Kind.WEIGHTS, Kind.OPTIMIZER_STATES))
    assert 23_584_454_656 <= states <= 23_584_454_656 + 2 * 1024 * 1024 * 300  # per-tensor blocks of the weights
    assert states > 23.5e9
