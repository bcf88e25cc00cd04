"""The worked examples of the main job, with every expected number derived by hand.

Parameter counts are the published totals of the checkpoints (safetensors index ``total_size`` / 2
for the bf16/fp16 files): Llama-2-7B 6,738,415,616; Llama-2-70B 68,976,648,192.
"""


from memest.devices import get_device
from memest.estimate import estimate
from memest.estimate.training import moments
from memest.planning.recommend import assess
from memest.planning.search import verdict
from memest.result import Kind
from memest.sources import load_model
from memest.workload import Parallelism, ServingConfig, TrainingConfig

LLAMA2_7B_PARAMS = 6_738_415_616
LLAMA2_70B_PARAMS = 68_976_648_192


def model_state_bytes(est) -> int:
    per = est.per_device
    return sum(t.bytes for t in per.terms if t.kind in (Kind.WEIGHTS, Kind.GRADIENTS, Kind.OPTIMIZER_STATES))


def test_llama2_7b_full_finetune_on_one_a100_80gb_does_not_fit():
    spec = load_model("meta-llama/Llama-2-7b-hf")
    assert spec.num_params == LLAMA2_7B_PARAMS
    device = get_device("A100-80GB")
    result = assess(spec, TrainingConfig(), device)
    # mixed precision + AdamW on one GPU runs as DeepSpeed bf16 without ZeRO. DeepSpeed 0.19.5 accumulates
    # gradients in the model dtype (engine.py get_data_types, since v0.17.6), so bf16 at ZeRO 0 runs
    # FP16_Optimizer (deepspeed/runtime/fp16/fused_optimizer.py): 2 (bf16 weights) + 2 (bf16 param.grad)
    # + 4 (fp32 flat master) + 4 + 4 (FusedAdam m, v) = 16 B/param of model states at the optimizer step
    # -> 16 x 6,738,415,616 = 107,814,649,856 B ~ 107.8 GB, more than the whole A100's 79.14 GiB =
    # 84,976,... B. The CUDA caching allocator gives each of the three flat fp32 buffers (4P =
    # 26,953,662,464 B: master, Adam m and v) a segment of its own rounded up to 2 MiB (12,853 x 2 MiB =
    # 26,954,694,656 B) and does not split off the 1,032,192 B left (<= 1 MiB); the per-tensor bf16 weights
    # and gradients are exact multiples of 2 MiB (4096 x 4096 x 2 = 32 MiB, 11008 x 4096 x 2 = 86 MiB,
    # 32000 x 4096 x 2 = 250 MiB) or of 512 B (the norms, 8 KiB)
    assert model_state_bytes(result.estimate) == 16 * LLAMA2_7B_PARAMS + 3 * 1_032_192 == 107_817_746_432
    # FP16_Optimizer.step copies every gradient to fp32 (p.grad.to(fp32), per tensor: 4P, again exact
    # multiples of 2 MiB / 512 B) and flattens the copies (one 4P buffer, + 1,032,192 B as above) while the
    # bf16 gradients still exist: 8P = 53,907,324,928 B more, 24 B/param at the step
    step = {t.name: t.bytes for t in result.estimate.per_device.terms}
    assert step["workspace.fp32_grad_copies"] == 4 * LLAMA2_7B_PARAMS == 26_953_662_464
    assert step["workspace.fp32_gradients"] == 4 * LLAMA2_7B_PARAMS + 1_032_192 == 26_954_694_656
    assert result.estimate.extra["peak_moment"] == "optimizer_step"
    # the figure, the ZeRO paper's 16 B/param (2 + 2 + K=12), is shown beside it as a rule of thumb:
    # 16 x 6,738,415,616 = 107,814,649,856 B ~ 107.8 GB, already more than the device holds
    sixteen = next(r for r in result.rules if r.name.startswith("16 B/param"))
    assert sixteen.bytes == 16 * LLAMA2_7B_PARAMS == 107_814_649_856 > device.memory_bytes
    assert not result.verdict.fits
    rec = result.recommendation
    assert rec is not None and rec.cheapest is not None
    # the recommendation fits by its own, independent re-estimate
    again = estimate(spec, rec.cheapest.workload, device)
    assert verdict(again, device, rec.cheapest.devices, 0.10).fits


def test_llama2_7b_zero1_on_8_h100_peaks_at_the_gradient_reduction():
    # DeepSpeed 0.19.5 ZeRO-1, 8 ranks (deepspeed/runtime/zero/stage_1_and_2.py): after backward
    # reduce_gradients moves the bf16 gradients into the 5e8-element bucket and rank 0 allocates its
    # grads_in_partition at the first bucket's reduction, while (nearly) all gradients still exist.
    # Blocks (>= 10 MiB: 2-MiB multiples, unsplit when <= 1 MiB would be left):
    #   bf16 weights and gradients per tensor, exact (see above): 2P = 13,476,831,232 B each
    #   4P/8 = 3,369,207,808 B -> 1607 x 2 MiB = 3,370,123,264 (915,456 B left: unsplit); master, Adam m, v
    #   2P/8 = 1,684,603,904 B: 804 x 2 MiB would leave 1,506,304 B (> 1 MiB, split off), so 512-B multiples:
    #   1,684,603,904 (= 3,290,242 x 512)
    #   bucket: 5e8 x 2 B = 1e9 B -> 477 x 2 MiB = 1,000,341,504
    spec = load_model("meta-llama/Llama-2-7b-hf")
    est = estimate(spec, TrainingConfig(parallelism=Parallelism(dp=8, zero_stage=1)), get_device("H100-80GB"))
    assert est.extra["peak_moment"] == "gradient_reduction"
    terms = {t.name: t.bytes for t in est.per_device.terms}
    assert terms["gradients"] == 2 * LLAMA2_7B_PARAMS
    assert terms["gradients.partition"] == 1_684_603_904
    assert terms["workspace.reduce_bucket"] == 1_000_341_504
    assert terms["optimizer_states.master"] + terms["optimizer_states.moments"] == 3 * 3_370_123_264
    # 2P + 2P + 3 x 3,370,123,264 + 1,000,341,504 + 1,684,603,904 = 39,748,977,664 B of states and buffers;
    # the former step moment (full 2P gradients + flat 2P/8 + fp32 4P/8) no longer exists: the step holds
    # the partition, its flattened copy and its fp32 cast, 2P + 3 x 3,370,123,264 + 2 x 1,684,603,904 +
    # 3,370,123,264 = 30,326,532,096 B
    assert model_state_bytes(est) + terms["workspace.reduce_bucket"] == 39_748_977_664
    step = moments(spec, TrainingConfig(parallelism=Parallelism(dp=8, zero_stage=1)), get_device("H100-80GB"))
    assert sum(t.bytes for t in step["optimizer_step"] if t.name != "workspace.cublas") == 30_326_532_096


def test_the_16_bytes_rule_is_split_as_the_zero_paper_splits_each_stage():
    # ZeRO paper (Rajbhandari et al. 2020, figure 1), N = 8 ranks, P = 6,738,415,616: stage 1 keeps the 2 B
    # weights and 2 B gradients whole, 2 + 2 + 12/8 = 5.5 B/param = 37,061,285,888 B; stage 2 the weights,
    # 2 + 14/8 = 3.75 B/param = 25,269,058,560 B; stage 3 none, 16/8 = 2 B/param = 13,476,831,232 B
    spec = load_model("meta-llama/Llama-2-7b-hf")
    for stage, expected in ((1, 37_061_285_888), (2, 25_269_058_560), (3, 13_476_831_232)):
        result = assess(spec, TrainingConfig(parallelism=Parallelism(dp=8, zero_stage=stage)), get_device("H100-80GB"))
        sixteen = next(r for r in result.rules if r.name.startswith("16 B/param"))
        assert sixteen.bytes == expected, stage


def test_llama2_70b_zero3_on_8_h100_does_not_fit():
    spec = load_model("meta-llama/Llama-2-70b-hf")
    assert spec.num_params == LLAMA2_70B_PARAMS
    device = get_device("H100-80GB")
    workload = TrainingConfig(parallelism=Parallelism(dp=8, zero_stage=3))
    result = assess(spec, workload, device)
    # ZeRO-3 shards all 16 B/param over 8 ranks: 16 x 68,976,648,192 / 8 = 137,953,296,384 B ~ 138 GB per device,
    # in five flat partitions: the bf16 weights and gradients (2P/8 = 17,244,162,048 B each: their 2-MiB
    # segments, 8,223 x 2 MiB, leave 718,848 B <= 1 MiB unsplit) and the fp32 master and Adam m, v (4P/8 =
    # 34,488,324,096 B each: 1,437,696 B left over > 1 MiB, split off); besides, the 161 RMSNorm weights (2 per
    # layer x 80 + the final one, 8,192 elements each <= stage3_param_persistence_threshold 1e5) are never
    # partitioned: each whole on every rank, 8,192 x 2 B = 16,384 B (a 512-B multiple): 161 x 16,384 = 2,637,824 B
    expected = 16 * LLAMA2_70B_PARAMS // 8 + 2 * 718_848 + 161 * 16_384
    assert model_state_bytes(result.estimate) == expected == 137_957_371_904
    assert not result.verdict.fits
    rec = result.recommendation
    assert rec is not None and rec.cheapest is not None
    again = estimate(spec, rec.cheapest.workload, device)
    assert verdict(again, device, rec.cheapest.devices, 0.10).fits


def test_llama2_70b_served_in_bf16():
    spec = load_model("meta-llama/Llama-2-70b-hf")
    est = estimate(spec, ServingConfig(dtype="bf16", max_model_len=4096), get_device("H100-80GB"))
    # weights: 68,976,648,192 params x 2 B = 137,953,296,384 B
    assert est.per_device.term("weights").bytes == 137_953_296_384
    # KV cache per token: 2 (K and V) x 80 layers x 8 KV heads x 128 head_dim x 2 B = 327,680 B
    assert est.serving.kv_cache_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    # one sequence of 4096 tokens (256 blocks of 16): 4096 x 327,680 = 1,342,177,280 B
    assert est.per_device.term("kv_cache").bytes == 4096 * 327_680


def test_method_change_is_not_recommended_when_a_lossless_fit_costs_the_same():
    # Llama-3.1-70B under Megatron (tp 8, distributed optimizer) on 64 H100s does not fit as asked;
    # sequence parallelism + full recompute on the same 64 devices fits, so nothing that changes the
    # method (QLoRA) or numerics may be the headline recommendation: it would save no money.
    from memest.workload import Framework

    spec = load_model("meta-llama/Llama-3.1-70B")
    workload = TrainingConfig(framework=Framework.MEGATRON, parallelism=Parallelism(tp=8, dp=8, zero_stage=1))
    result = assess(spec, workload, get_device("H100-80GB"))
    rec = result.recommendation
    assert not result.verdict.fits and rec is not None and rec.lossless is not None
    assert rec.lossless.devices == 64
    assert rec.cheapest is rec.lossless
