"""DeepSpeed's ZeRO buffers as the CPU runs of ``benchmarks/deepspeed_cpu.py`` measured them (DeepSpeed 0.14.2 and
0.19.5, gloo, two ranks; ``benchmarks/deepspeed_cpu.md``), and the gist cases' arithmetic behind
``memest/validation/gaps.py``. Expected values are derived by hand below or read from that measurement."""

from __future__ import annotations

from memest.devices import get_device
from memest.estimate.training import moments
from memest.estimate.training.deepspeed import gathered_peak
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
    assert gathered_peak(numel, tuple(range(len(numel))), max_reuse=3_910_000, prefetch=195_000,
                         max_live=3_910_000)[0] == 4_411_392


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


def test_offloaded_gathers_copy_each_set_s_host_partitions_to_the_device():
    # the coordinator scenario of tests/test_training_estimate.py (four 10-element parameters, trace
    # 0 1 2 3 | 3 2 1 0, prefetch 10, max_live 25, max_reuse 15) with offload_param: each all-gather first
    # copies the set's host partitions to the device (partition_parameters.py all_gather_coalesced,
    # ds_tensor.to(current_device), DeepSpeed bf6b9802c / v0.16.4). Gathered elements per step:
    # step 0: gather p0 (10; + its copy 10 = 20), prefetch p1 (20 + 10 = 30), release p0 (10)
    # steps 1, 2: prefetch the next (20 + 10 = 30), release the current (10)
    # step 3: prefetch p2 for its backward (20 + 10 = 30); p3 kept (20)
    # step 4: budget min(25 - 20, 10) = 5 prefetches p1 (30 + its copy 10 = 40): the peak, first reached here
    # step 5: prefetches p0 (30 + 10 = 40, not above); then releases down to 0
    from memest.estimate.training.deepspeed import gathered_peak
    numel, forward = (10, 10, 10, 10), (0, 1, 2, 3)
    kw = {"max_reuse": 15, "prefetch": 10, "max_live": 25}
    assert gathered_peak(numel, forward, **kw, copies_over=1) == (30, 10)
    # over 2 ranks each copy is the partition, half the parameter: step 4 holds 30 + 5
    assert gathered_peak(numel, forward, **kw, copies_over=2) == (30, 5)
    # without offload ds_tensor is already on the device (.to copies nothing): the coordinator's 30 alone
    assert gathered_peak(numel, forward, **kw) == (30, 0)


def test_a_frozen_embedding_is_not_fetched_for_backward_and_t5_s_decoder_re_uses_it():
    # t5-small: shared (32128 x 512 = 16,449,536) is the only parameter above a 1e6-element persistence
    # threshold besides the layers' (512 x 2048 = 1,048,576 each: wi, wo in 6 + 6 blocks; the attention
    # projections 512 x 512 = 262,144 stay whole) and the tied lm_head re-uses shared.
    # forward: shared, 6 encoder blocks (wi, wo), shared (the decoder's embed_tokens), 6 decoder blocks, shared
    # full training: the backward is the forward reversed (27 uses); under LoRA the embedding modules'
    # outputs need no gradient (PreBackwardFunction never runs): the backward drops both embedding uses
    # but keeps the tied lm_head's: 25
    from types import SimpleNamespace

    from memest.estimate.sharding import stages
    from memest.estimate.training.deepspeed import _module_trace
    from memest.sources import load_model
    from memest.workload import DeepSpeedBuckets, LoraConfig, Method

    spec = load_model("google-t5/t5-small")
    t = TrainingConfig(parallelism=Parallelism(dp=1, zero_stage=3),
                       deepspeed_buckets=DeepSpeedBuckets(param_persistence_threshold=1_000_000))
    ctx = SimpleNamespace(spec=spec, stage=stages(spec.num_layers, 1)[0], t=t)
    numel, forward, backward = _module_trace(ctx)
    shared = numel.index(32128 * 512)
    assert [p for p in forward if p == shared] == [shared] * 3
    assert forward.index(shared, 1) == 1 + 6 * 2  # after the encoder's 12 feed-forward weights
    assert len(forward) == 27 and backward == tuple(reversed(forward))
    lora = SimpleNamespace(spec=spec, stage=ctx.stage, t=t.replace(method=Method.LORA, lora=LoraConfig(rank=8)))
    _, forward_lora, backward_lora = _module_trace(lora)
    assert forward_lora == forward
    assert len(backward_lora) == 25 and backward_lora[0] == shared and shared not in backward_lora[1:]


def test_the_peft_bloomz_offload_row_copies_the_tied_embedding_in_for_the_lm_head():
    # peft README (73d7224b5): bloomz-7b1 LoRA under ZeRO-3 with offload_param on one GPU, fp32. The largest
    # all-gather is the tied word embedding (250,880 x 4,096 = 1,027,604,480 elements) prefetched for the
    # lm_head near the forward's end: its whole host partition (N = 1) is copied to the device beside the
    # gathered buffer, 1,027,604,480 x 4 B = 4,110,417,920 B
    from memest.estimate import estimate
    from memest.sources import load_model
    from memest.workload import Framework, LoraConfig, Method, Offload, Precision

    w = TrainingConfig(method=Method.LORA, micro_batch_size=8, seq_len=64, precision=Precision.FP32,
                       lora=LoraConfig(rank=8, targets="query_key_value", dropout=0.1), framework=Framework.DEEPSPEED,
                       offload=Offload.PARAMS, parallelism=Parallelism(dp=1, zero_stage=3))
    terms = {t.name: t.bytes for t in estimate(load_model("bigscience/bloomz-7b1"), w,
                                               get_device("A100-80GB")).per_device.terms}
    assert terms["workspace.offload_partition_copies"] == 250_880 * 4_096 * 4
    # without parameter offload the partitions are on the device already: no copy
    terms = {t.name: t.bytes for t in estimate(load_model("bigscience/bloomz-7b1"), w.replace(offload=Offload.OPTIMIZER),
                                               get_device("A100-80GB")).per_device.terms}
    assert "workspace.offload_partition_copies" not in terms


def test_overlap_comm_double_buffers_the_zero2_reduce_bucket(tiny, tmp_path):
    # stage_1_and_2.py v0.19.5 setup_buckets: with contiguous_gradients each bucket gets buf_0 of
    # reduce_bucket_size elements at the optimizer dtype, and buf_1 too when overlap_comm ("Use double buffers to
    # avoid data access conflict when overlap_comm is enabled"). reduce_bucket_size 5e8 x 2 B (bf16) = 1e9 B, a
    # segment of >= 10 MiB rounded to 2 MiB: ceil(1e9 / 2,097,152) = 477 blocks = 1,000,341,504 B; two of them
    # = 2,000,683,008 B. overlap_comm false, or absent (zero/config.py overlap_comm_valid: true only at
    # stage 3): one.
    from memest.workload.resolve import resolve

    bucket = 477 * 2 * 1024 * 1024
    for overlap, buffers in (("true", 2), ("false", 1), (None, 1)):
        zero = '"stage": 2, "contiguous_gradients": true, "reduce_bucket_size": 5e8'
        zero += f', "overlap_comm": {overlap}' if overlap else ""
        path = tmp_path / "ds.json"
        path.write_text('{"bf16": {"enabled": true}, "zero_optimization": {%s}}' % zero)
        w = resolve({"train": True, "config": [str(path)], "gpus": 8, "seq_len": 16}, tiny, H100)
        assert w.deepspeed_buckets.overlap_comm == ({"true": True, "false": False}.get(overlap))
        assert _terms(tiny, w, "last_layer_backward")["workspace.reduce_bucket"] == buffers * bucket, overlap
