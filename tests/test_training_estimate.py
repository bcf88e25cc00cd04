"""Hand-computed training terms of the tiny llama (see test_estimate_basics.py).

h=64, a=4 heads, k=2 KV heads, d=16, i=128, L=2, V=1000, untied lm_head, P = 202,048 parameters:
embed 64,000; per layer q 4096, k 2048, v 2048, o 4096, gate/up/down 8192 each, two norms 64 each
(36,992); final norm 64; lm_head 64,000.
"""

from __future__ import annotations

import pytest

from memest.devices import get_device
from memest.estimate import estimate
from memest.estimate.activations import Execution, layer_activations
from memest.estimate.training import moments
from memest.estimate.training.deepspeed import gathered_peak
from memest.result import Kind, RankEstimate
from memest.sources import load_model
from memest.workload import (
    AttnImplementation,
    Framework,
    KbitPrep,
    LoraConfig,
    Loss,
    Method,
    Offload,
    Optimizer,
    Parallelism,
    Precision,
    Recompute,
    TrainingConfig,
)

P = 202_048
LAYER = 36_992
NORMS = 5
"""The tiny llama's 64-element norm weights (2 per layer, the final one): the only tensors whose bytes are
not a multiple of 512, the CUDA caching allocator's block (runtime.cuda_block_bytes): at 2 B (128 B),
4 B (256 B) or sharded 4 ways at 4 B (64 B) each takes a 512-B block."""
BF16_TENSORS = 2 * P + NORMS * (512 - 128)   # every parameter's own bf16 tensor, in blocks
FP32_TENSORS = 4 * P + NORMS * (512 - 256)
FP32_SHARDS_4 = P + NORMS * (512 - 64)        # 4P/4 over 4 ranks, each parameter sharded on its own (FSDP2)
H100 = get_device("H100-80GB")


def _kinds(terms) -> dict[Kind, int]:
    return RankEstimate("r", tuple(terms)).by_kind()


def test_layer_activations_bf16_sdpa(tiny):
    # two RMSNorms: fp32 input 4h + rstd 4 + normalized 2h + output 2h = 8 x 64 + 4 = 516 each -> 1032
    # attention: q 2ad 128 + k 2kd 64 + v 64 + output 128 + logsumexp 4a 16 = 400; gated MLP 4 x 2i = 1024
    x = Execution(compute_bytes=2, stream_bytes=2)
    assert layer_activations(tiny.layers[0], hidden=64, seq_len=32, x=x).per_rank(1, False) == 1032 + 400 + 1024


def test_layer_activations_bf16_eager(tiny):
    # eager at s=32: q, K and V repeated to 4 heads (3 x 128), fp32 softmax 4 a s = 512, its bf16 copy
    # 2 a s = 256, the contiguous output copy read by o_proj 128 -> 1280; norms 1032; MLP 1024
    x = Execution(compute_bytes=2, stream_bytes=2, eager=True, repeat_kv=True)
    assert layer_activations(tiny.layers[0], hidden=64, seq_len=32, x=x).per_rank(1, False) == 1032 + 1280 + 1024


def test_layer_activations_tensor_parallel_split(tiny):
    # tp=2 without sequence parallelism: attention and MLP (400 + 1024) halve, norms (1032) stay
    x = Execution(compute_bytes=2, stream_bytes=2)
    layer = layer_activations(tiny.layers[0], hidden=64, seq_len=32, x=x)
    assert layer.per_rank(2, False) == 1032 + (400 + 1024) / 2
    assert layer.per_rank(2, True) == (1032 + 400 + 1024) / 2


def test_pytorch_bf16_foreach_adamw_step(tiny):
    # one process, bf16 params, grads and AdamW states (2 x 2 B), one state-sized foreach temporary, one
    # tensor per parameter each
    step = _kinds(moments(tiny, TrainingConfig(seq_len=16, precision=Precision.BF16), H100)["optimizer_step"])
    assert step[Kind.WEIGHTS] == BF16_TENSORS == 2 * P + 1920
    assert step[Kind.GRADIENTS] == BF16_TENSORS
    assert step[Kind.OPTIMIZER_STATES] == 2 * BF16_TENSORS
    assert step[Kind.WORKSPACE] == BF16_TENSORS + 32 * 1024 * 1024  # the temporary + H100's 32 MiB cuBLAS workspace


def test_fused_adamw_has_no_step_temporary(tiny):
    w = TrainingConfig(seq_len=16, precision=Precision.BF16, optimizer=Optimizer.ADAMW_FUSED)
    assert _kinds(moments(tiny, w, H100)["optimizer_step"])[Kind.WORKSPACE] == 32 * 1024 * 1024


def test_gradients_live_through_the_forward_only_when_kept(tiny):
    base = TrainingConfig(seq_len=16, precision=Precision.BF16)
    assert Kind.GRADIENTS not in _kinds(moments(tiny, base, H100)["loss_backward"])
    for kept in (base.replace(grad_accum_steps=2), base.replace(set_grads_to_none=False)):
        assert _kinds(moments(tiny, kept, H100)["loss_backward"])[Kind.GRADIENTS] == BF16_TENSORS


def test_ddp_buckets_double_the_gradients(tiny):
    # amp: fp32 grads 4P in param.grad (one tensor each) plus DDP's buckets 4P (one flat buffer:
    # 808,192 B -> 1579 blocks of 512 B = 808,448)
    w = TrainingConfig(seq_len=16, precision=Precision.AMP, parallelism=Parallelism(dp=2))
    step = _kinds(moments(tiny, w, H100)["optimizer_step"])
    assert step[Kind.GRADIENTS] == FP32_TENSORS + 808_448


def test_megatron_distributed_optimizer(tiny):
    # 2 (bf16, one tensor per parameter) + 4 (one fp32 main_grad buffer: 808,192 B -> 808,448) + 12/N
    # (master + two Adam states, a flat 4P/4 = 202,048 B -> 202,240 each) B/param, N = 4
    w = TrainingConfig(seq_len=16, framework=Framework.MEGATRON, parallelism=Parallelism(dp=4, zero_stage=1))
    step = _kinds(moments(tiny, w, H100)["optimizer_step"])
    assert (step[Kind.WEIGHTS], step[Kind.GRADIENTS], step[Kind.OPTIMIZER_STATES]) == (
        BF16_TENSORS, 808_448, 3 * 202_240)


def test_fsdp2_full_shard(tiny):
    # fp32 sharded params 4P/N, Adam 8P/N, sharded fp32 grads 4P/N and the foreach temporary 4P/N (N = 4),
    # each parameter's shard its own tensor
    w = TrainingConfig(seq_len=16, precision=Precision.FSDP2, parallelism=Parallelism(dp=4, zero_stage=3))
    m = moments(tiny, w, H100)
    step = _kinds(m["optimizer_step"])
    assert (step[Kind.WEIGHTS], step[Kind.GRADIENTS], step[Kind.OPTIMIZER_STATES]) == (
        FP32_SHARDS_4, FP32_SHARDS_4, 2 * FP32_SHARDS_4)
    # gathered in bf16 (FSDP2 fsdp_param_group.py): the root unit (embed + final norm + lm_head = 128,064)
    # from the forward on; at the loss backward one layer besides (the last, prefetched by the root's
    # pre-backward hook); in a layer's backward two (the unit computed and the one prefetched) and the
    # unit's unsharded gradients (bf16); in the first layer's, one unit and the previous unit's fp32
    # reduce-scatter input
    loss = {t.name: t.bytes for t in m["loss_backward"]}
    assert loss["workspace.gathered_root"] == 128_064 * 2
    assert loss["workspace.gathered_layers"] == 1 * LAYER * 2
    assert "workspace.unsharded_grads" not in loss
    last_layer = {t.name: t.bytes for t in m["first_layer_backward"]}
    assert last_layer["workspace.gathered_layers"] == 2 * LAYER * 2
    assert last_layer["workspace.unsharded_grads"] == LAYER * 2
    first_layer = {t.name: t.bytes for t in m["last_layer_backward"]}
    assert first_layer["workspace.gathered_layers"] == 1 * LAYER * 2
    assert (first_layer["workspace.unsharded_grads"], first_layer["workspace.reduce_scatter_input"]) == (
        LAYER * 2, LAYER * 4)
    assert not any(t.name.startswith("workspace.gathered") for t in m["optimizer_step"])


def test_deepspeed_zero2_step_casts_the_partition_to_fp32(tiny):
    # bf16 grads_in_partition 2P/N, its flattened copy 2P/N and the fp32 copy 4P/N (N = 8), one flat tensor
    # each in 512-B blocks: 50,512 B -> 99 blocks = 50,688; 101,024 B -> 198 blocks = 101,376
    w = TrainingConfig(seq_len=16, parallelism=Parallelism(dp=8, zero_stage=2))
    step = {t.name: t.bytes for t in moments(tiny, w, H100)["optimizer_step"]}
    assert (step["gradients"], step["workspace.flat_gradients"], step["workspace.fp32_gradients"]) == (
        50_688, 50_688, 101_376)
    # the reduce bucket, 5e8 bf16 elements = 1e9 B, gets a segment of its own rounded up to 2 MiB
    # (477 x 2 MiB = 1,000,341,504 B); the 341,504 B left (under 1 MiB) are not split off
    backward = {t.name: t.bytes for t in moments(tiny, w, H100)["loss_backward"]}
    assert backward["workspace.reduce_bucket"] == 477 * 2 * 1024 * 1024


def test_deepspeed_zero3_keeps_small_parameters_whole_and_copies_a_bucket_to_reduce_scatter(tiny):
    # DeepSpeed 0.19.5 ZeRO-3 (parameter_offload.py mark_persistent_parameters): every parameter of <= 1e5
    # elements (stage3_param_persistence_threshold) is never partitioned; the tiny llama's largest, the
    # embedding and lm_head, have 64,000, so every parameter is whole on each rank, each its own bf16 tensor:
    # BF16_TENSORS = 2 x 202,048 + 5 norms x (512 - 128) = 406,016 B, beside the 2P/8 flat partition
    w = TrainingConfig(seq_len=16, parallelism=Parallelism(dp=8, zero_stage=3))
    m = moments(tiny, w, H100)
    for moment in ("loss_backward", "optimizer_step"):
        assert {t.name: t.bytes for t in m[moment]}["weights.persistent"] == BF16_TENSORS == 406_016
    # reduce_scatter_coalesced (comm/coalesced_collectives.py) torch.cats a bucket's gradients into one new
    # tensor: min(5e8, P = 202,048) x 2 B = 404,096 B -> 790 blocks of 512 B = 404,480, at the first layer's
    # backward, not before any gradient exists
    first = {t.name: t.bytes for t in m["last_layer_backward"]}
    assert first["workspace.reduce_scatter_input"] == 404_480
    assert "workspace.reduce_scatter_input" not in {t.name for t in m["loss_backward"]}
    # every parameter persistent: none is ever gathered
    assert "workspace.gathered_params" not in {t.name for t in m["loss_backward"]}
    # LoRA r = 4 on q, k, v, o: the frozen bf16 base whole as above, and the fp32 adapters (each < 1e5) whole:
    # per layer q 4x64 + 64x4 = 512, k and v 4x64 + 32x4 = 384 each, o 512 -> 1,792 elements x 2 layers x 4 B
    # = 14,336 B, every tensor (1,024 or 512 B) a whole number of 512-B blocks
    lora = w.replace(method=Method.LORA, lora=LoraConfig(rank=4, targets="attention"))
    step = {t.name: t.bytes for t in moments(tiny, lora, H100)["optimizer_step"]}
    assert step["weights.persistent"] == BF16_TENSORS + 14_336
    # below ZeRO-3 DeepSpeed keeps every weight whole anyway: no such term
    assert "weights.persistent" not in {t.name for t in moments(tiny, w.replace(
        parallelism=Parallelism(dp=8, zero_stage=2)), H100)["optimizer_step"]}


def test_zero3_coordinator_keeps_prefetched_and_reused_parameters_gathered():
    # four 10-element parameters used 0 1 2 3 | 3 2 1 0 (forward, backward); prefetch 10, max_live 25,
    # max_reuse 15 (partitioned_param_coordinator.py, v0.19.5):
    # step 0: gather p0 (10), prefetch p1 (20); p0's next use is beyond 15 elements of trace: released (10)
    # steps 1, 2: p1 / p2 already gathered, prefetch the next (20), release the current (10)
    # step 3: prefetch passes over gathered p3 (its backward use) and gathers p2 (20); p3 is used next: kept
    # step 4: budget min(25 - 20, 10) = 5 > 0 prefetches p1 whole: 30 (the cap is overshot by one parameter)
    # step 5: budget 5 prefetches p0: 30; then releases down to 0
    numel, forward = (10, 10, 10, 10), (0, 1, 2, 3)
    assert gathered_peak(numel, forward, max_reuse=15, prefetch=10, max_live=25)[0] == 30
    # no prefetch: only the module's own parameter, and p3 kept from its forward to its backward: 10
    assert gathered_peak(numel, forward, max_reuse=15, prefetch=0, max_live=25)[0] == 10
    # a large reuse distance keeps every parameter from its forward to its backward: all 40
    assert gathered_peak(numel, forward, max_reuse=1000, prefetch=0, max_live=25)[0] == 40


def test_zero3_gathers_up_to_the_live_parameter_cap():
    # Llama-2-7B (q, k, v, o 16,777,216; gate, up, down 45,088,768; embed and lm_head 131,072,000 elements),
    # ZeRO-3 defaults: each fetch prefetches 5e7 more elements while a module uses 28.9M on average, so
    # the gathered parameters run up to stage3_max_live_parameters (1e9) and overshoot it by at most the
    # module fetched (the lm_head, 131,072,000) and one prefetched parameter (45,088,768): between
    # 1e9 and 1,176,160,768 elements, at 2 B
    spec = load_model("meta-llama/Llama-2-7b-hf")
    w = TrainingConfig(seq_len=16, parallelism=Parallelism(dp=8, zero_stage=3))
    gathered = {t.name: t.bytes for t in moments(spec, w, H100)["loss_backward"]}["workspace.gathered_params"]
    assert 2 * 10**9 <= gathered <= 2 * 1_176_160_768


def test_deepspeed_zero1_reduces_to_a_partition_before_the_step(tiny):
    # ZeRO-1 (deepspeed/runtime/zero/stage_1_and_2.py, DeepSpeed 0.19.5): full bf16 param.grad through backward;
    # after it reduce_gradients moves them into the 5e8-element bucket (477 x 2 MiB, see the ZeRO-2 test) and
    # copies the rank's partition into grads_in_partition (2P/N = 50,512 B -> 50,688, N = 8), then drops
    # param.grad, so the step holds the partition, its flattened copy (50,688) and the fp32 copy (4P/N =
    # 101,024 B -> 101,376), not the full gradients
    w = TrainingConfig(seq_len=16, parallelism=Parallelism(dp=8, zero_stage=1))
    m = moments(tiny, w, H100)
    step = {t.name: t.bytes for t in m["optimizer_step"]}
    assert (step["gradients.partition"], step["workspace.flat_gradients"], step["workspace.fp32_gradients"]) == (
        50_688, 50_688, 101_376)
    assert "gradients" not in step
    # rank 0's partition is allocated at the first bucket's reduction, beside (nearly) every bf16 gradient
    reduction = {t.name: t.bytes for t in m["gradient_reduction"]}
    assert (reduction["gradients"], reduction["workspace.reduce_bucket"], reduction["gradients.partition"]) == (
        BF16_TENSORS, 477 * 2 * 1024 * 1024, 50_688)
    # ZeRO-2 has no such moment: it reduces during backward
    assert "gradient_reduction" not in moments(tiny, w.replace(parallelism=Parallelism(dp=8, zero_stage=2)), H100)


def test_adamw8bit_states(tiny):
    # tensors of >= 4096 elements: 2 x (1 B + 4 B / 256) per element; smaller ones keep fp32 states (8 B)
    big = 2 * 64_000 + 2 * (2 * 4096 + 3 * 8192)      # embed, lm_head, q, o, gate, up, down: 193,536
    small = P - big                                     # k, v, norms: 8,512
    w = TrainingConfig(seq_len=16, precision=Precision.BF16, optimizer=Optimizer.ADAMW8BIT)
    states = _kinds(moments(tiny, w, H100)["optimizer_step"])[Kind.OPTIMIZER_STATES]
    assert states == big * 2 + big * 2 * 4 // 256 + small * 8 == 461_216


def test_adafactor_factored_states(tiny):
    # one row and one column vector per matrix, fp32; vectors keep a full fp32 second moment
    matrices = 2 * (1000 + 64) + 2 * ((64 + 64) + 2 * (32 + 64) + (64 + 64) + 2 * (128 + 64) + (64 + 128))
    vectors = 2 * 2 * 64 + 64
    w = TrainingConfig(seq_len=16, precision=Precision.FP32, optimizer=Optimizer.ADAFACTOR)
    assert _kinds(moments(tiny, w, H100)["optimizer_step"])[Kind.OPTIMIZER_STATES] == 4 * (matrices + vectors)


@pytest.mark.parametrize(("loss", "expected"), [
    (Loss.DEFAULT, 12 * 32 * 1000),                # fp32 log-probs + nll grad + log-softmax grad
    (Loss.CHUNKED, 32 * 1000 * 4 + 32 * 1000 * 10 // 8),  # all chunks' log-probs + one chunk's grads
    (Loss.FUSED, 32 * 64 * (2 * 2 + 8)),           # one b x s x h / V chunk of logits
], ids=["default", "chunked", "fused"])
def test_logits_by_loss(tiny, loss, expected):
    w = TrainingConfig(micro_batch_size=2, seq_len=16, precision=Precision.BF16, loss=loss)
    assert {t.name: t.bytes for t in moments(tiny, w, H100)["loss_backward"]}["logits"] == expected


def test_qlora_weights(tiny):
    # NF4 linear weights: 0.5 B each + per tensor one byte per 64-block + 4 B per 256 blocks;
    # blocks per layer: q 64, k 32, v 32, o 64, gate/up/down 128 -> 604 B of scales per layer
    nf4 = 2 * (36_864 // 2 + 604)
    embeddings, norms = 64_000 + 64_000, 2 * 2 * 64 + 64  # embed_tokens + lm_head; 2 norms per layer + final
    adapters = 2 * 16 * ((64 + 64) + (64 + 32) + (64 + 32) + (64 + 64)) * 4  # r=16 on q,k,v,o, fp32
    w = TrainingConfig(method=Method.QLORA, seq_len=16, precision=Precision.BF16, lora=LoraConfig(rank=16),
                       prepare_kbit_training=KbitPrep.NONE)
    weights = {prep: _kinds(moments(tiny, w.replace(prepare_kbit_training=prep), H100)["optimizer_step"])[Kind.WEIGHTS]
               for prep in KbitPrep}
    # none: everything not quantized in bf16
    assert weights[KbitPrep.NONE] == nf4 + (embeddings + norms) * 2 + adapters == 352_056
    # peft (prepare_model_for_kbit_training): everything not quantized upcast to fp32
    assert weights[KbitPrep.PEFT] == nf4 + (embeddings + norms) * 4 + adapters
    # trl (peft_module_casting_to_bf16 after the upcast): embeddings and lm_head back to bf16, norms fp32
    assert weights[KbitPrep.TRL] == nf4 + embeddings * 2 + norms * 4 + adapters == 352_056 + norms * 2
    assert TrainingConfig().prepare_kbit_training is KbitPrep.TRL  # the default


def test_offload_host_ram_per_node(tiny):
    # DeepSpeed 0.19.5 ZeRO-2, optimizer offloaded, 8 ranks on one node (stage_1_and_2.py, cpu_offload): per
    # parameter in host RAM fp32 master 4 + Adam 8 + fp32 grads 4 + the bf16 partition buffer
    # (param_buffer_of_bit16_for_cpu_offload_groups) 2 = 18 B, each rank a 1/8 shard -> 18 P bytes per node;
    # besides, on every rank temp_grad_buffer_for_cpu_offload: the largest parameter (embed, 64,000) x 2 B =
    # 128,000 B, x 8 ranks = 1,024,000
    w = TrainingConfig(seq_len=16, offload=Offload.OPTIMIZER, parallelism=Parallelism(dp=8, zero_stage=2))
    est = estimate(tiny, w, H100)
    assert est.host_bytes == 18 * P + 8 * 128_000 == 4_660_864
    assert Kind.OPTIMIZER_STATES not in est.per_device.by_kind()
    # on the GPU temp_grad_buffer_for_gpu_offload, the same 64,000 x 2 B = 128,000 B (250 blocks of 512 B)
    step = {t.name: t.bytes for t in moments(tiny, w, H100)["optimizer_step"]}
    assert step["workspace.offload_grad_buffer"] == 128_000
    # under gradient accumulation accumulated_grads_in_cpu adds each partition parameter at 2 B: 20 P
    assert estimate(tiny, w.replace(grad_accum_steps=2), H100).host_bytes == 20 * P + 8 * 128_000
    # ZeRO-3 (stage3.py): the bf16 gradient partition grad_partitions_flat_buffer lives on the offload device
    # instead: 4 + 8 + 4 + 2 = 18 B per parameter, no per-rank buffer
    z3 = w.replace(parallelism=Parallelism(dp=8, zero_stage=3))
    assert estimate(tiny, z3, H100).host_bytes == 18 * P


def test_pipeline_first_stage_keeps_in_flight_microbatches(tiny):
    # pp=2, 4 micro-batches: stage 0 holds min(pp, 4) = 2 micro-batches of its one layer; stage 1 one
    w = TrainingConfig(micro_batch_size=1, seq_len=64, precision=Precision.BF16, grad_accum_steps=4,
                       framework=Framework.MEGATRON, parallelism=Parallelism(pp=2))
    first, _ = estimate(tiny, w, H100).ranks
    # Megatron's fused norms keep input 2h + rstd 4 + output 2h = 260 each: 520 + 400 + 1024 = 1944 per token;
    # per micro-batch of 64 tokens each tensor is a multiple of 512 B but the two norms' rstd (4 x 64 = 256 B,
    # a 512-B block each: +2 x 256 B)
    per_microbatch = 64 * 1944 + 2 * 256
    assert first.term("activations.layers").bytes == 2 * per_microbatch
    last = {t.name: t.bytes for t in moments(tiny, w, H100)["loss_backward"]}  # the last stage by default
    assert last["activations.layers"] == 1 * per_microbatch


def test_peak_moment_is_reported(tiny):
    short = estimate(tiny, TrainingConfig(seq_len=16, precision=Precision.BF16), H100)
    long = estimate(tiny, TrainingConfig(seq_len=256, micro_batch_size=8, precision=Precision.BF16), H100)
    assert short.extra["peak_moment"] == "optimizer_step"
    assert long.extra["peak_moment"] == "loss_backward"
    assert any("peak moment: loss_backward" in a for a in long.assumptions)


def test_full_recompute_keeps_layer_inputs(tiny):
    # checkpoints: one b x s x h bf16 input per layer: 2 layers x 4 x 64 tokens x 64 x 2 B
    w = TrainingConfig(micro_batch_size=4, seq_len=64, precision=Precision.BF16, recompute=Recompute.FULL,
                       attn_implementation=AttnImplementation.FLASH_ATTENTION_2)
    terms = {t.name: t.bytes for t in moments(tiny, w, H100)["loss_backward"]}
    assert terms["activations.checkpoints"] == 2 * 4 * 64 * 64 * 2


def test_qlora_trl_keeps_fp32_checkpoints_and_mlp(tiny):
    """trl's SFTTrainer QLoRA (KbitPrep.TRL): fp32 norms make the residual stream fp32 (RMSNorm returns
    weight(fp32) * x, bitsandbytes Linear4bit casts its output back to its input's dtype), embeddings bf16.

    b = 4, s = 64: 256 tokens; h 64, a 4 x d 16, k 2, i 128, LoRA r 16 with dropout on q, k, v, o; full recompute.
    """
    tokens = 256
    w = TrainingConfig(method=Method.QLORA, micro_batch_size=4, seq_len=64, precision=Precision.BF16,
                       recompute=Recompute.FULL, attn_implementation=AttnImplementation.FLASH_ATTENTION_2,
                       lora=LoraConfig(rank=16, targets="q_proj,k_proj,v_proj,o_proj", dropout=0.1),
                       framework=Framework.PYTORCH)

    def terms(prep: KbitPrep, moment: str) -> dict[str, int]:
        return {t.name: t.bytes for t in moments(tiny, w.replace(prepare_kbit_training=prep), H100)[moment]}

    # checkpoints: the layer inputs. trl: the first layer's is the bf16 embeddings' output, the second's fp32
    assert terms(KbitPrep.TRL, "loss_backward")["activations.checkpoints"] == tokens * 64 * (2 + 4) == 98_304
    assert terms(KbitPrep.NONE, "loss_backward")["activations.checkpoints"] == tokens * 64 * (2 + 2)
    assert terms(KbitPrep.PEFT, "loss_backward")["activations.checkpoints"] == tokens * 64 * (4 + 4)

    # the rebuilt layer under trl, bytes per token:
    norms = 2 * (4 * 64 + 4)               # input and post-attention RMSNorm: fp32 input (the stream) + rstd
    qkv = 3 * (64 + 2 * 64 + 2 * 16)       # per adapter: dropout mask, lora_A's bf16 autocast copy, A's bf16 output
    flash = 2 * 64 + 2 * 32 + 2 * 32 + 2 * 64 + 4 * 4  # bf16 q, k, v (cast from fp32 for the kernel), out, fp32 lse
    o = 64 + 2 * 64 + 2 * 16               # o_proj reads flash's bf16 output: mask, dropout output, A's output
    mlp = 3 * 4 * 128                      # gate output (silu input), silu output, up output: fp32 (Linear4bit)
    first = terms(KbitPrep.TRL, "first_layer_backward")
    assert first["activations.recomputed_layer"] == tokens * (norms + qkv + flash + o + mlp) == 858_112
    # its backward: the fp32 output gradient and three fp32 i-wide MLP gradients (the down projection is frozen)
    assert first["activations.backward"] == tokens * (4 * 64 + 3 * 4 * 128)
    # autocast casts the fp32 adapters (one layer's, rebuilt) to bf16: r x (in + out) of q, k, v, o x 2 B
    assert first["workspace.autocast_weights"] == 16 * ((64 + 64) + (64 + 32) + (64 + 32) + (64 + 64)) * 2


def test_cli_hybrid_shard_and_dp_flags():
    from memest.cli.options import WORKLOAD_OPTIONS, JobOptions
    from memest.sources import load_model

    spec = load_model("meta-llama/Llama-3.1-8B")
    values = {name: default for name, (_, default) in WORKLOAD_OPTIONS.items()}
    values.update(train=True, gpus=32, fsdp="hybrid_shard", gpu="H100-80GB")
    from memest.workload import FsdpStrategy

    values["fsdp"] = FsdpStrategy.HYBRID_SHARD
    w = JobOptions(values).workload(spec)
    # 32 ranks, 8 per H100 node: FULL_SHARD inside the node, replicas across 4 nodes
    assert (w.parallelism.dp, w.parallelism.zero_stage, w.parallelism.shard_degree, w.framework) == (
        32, 3, 8, Framework.FSDP)
    values.update(fsdp=None, gpus=1, dp=4, tp=2)
    w = JobOptions(values).workload(spec)
    assert (w.parallelism.dp, w.parallelism.tp, w.parallelism.world_size) == (4, 2, 8)


def test_masked_lm_loss_runs_at_the_logits_dtype():
    # BertForMaskedLM: CrossEntropyLoss on the bf16 prediction scores, no fp32 upcast. At the loss backward
    # b x s x V x 3 x 2 B (log-probs, nll grad, log-softmax grad) = 8 x 512 x 30,522 x 6 = 750,108,672 B;
    # in the forward's loss the scores and their log-softmax, 8 x 512 x 30,522 x 4 = 500,072,448 B
    from memest.estimate.training import _logits, _logits_forward, execution
    from memest.sources import load_model
    from memest.workload import resolve_framework

    spec = load_model("google-bert/bert-base-uncased")
    t = TrainingConfig(micro_batch_size=8, seq_len=512)
    fw = resolve_framework(t)
    x = execution(spec, t, fw)
    assert _logits(spec, t, fw, x, 8 * 512).bytes == 8 * 512 * 30_522 * 6 == 750_108_672
    assert _logits_forward(spec, t, fw, x, 8 * 512).bytes == 8 * 512 * 30_522 * 4 == 500_072_448
    # under autocast (amp) cross_entropy runs in fp32: the causal-LM 12 B per element
    amp = TrainingConfig(micro_batch_size=8, seq_len=512, precision=Precision.AMP)
    assert _logits(spec, amp, fw, execution(spec, amp, fw), 8 * 512).bytes == 8 * 512 * 30_522 * 12


def test_lora_param_offload_keeps_the_frozen_base_in_host_ram():
    # ZeRO-3 with offload_param moves every parameter to the host, the frozen bf16 base too:
    # Llama-2-7B base 6,738,415,616 x 2 B = 13,476,831,232; adapters on q,k,v,o at r 16:
    # 16 x (4096 + 4096) x 4 x 32 = 16,777,216 params x (4 master + 8 Adam + 4 grads + 2 weight + 4 the fp32
    # adapters' gradient partition, grad_partitions_flat_buffer, on the offload device: stage3.py) = 22 B
    # -> 369,098,752;
    # per node (2 ranks sharing the states): (13,476,831,232 + 369,098,752) / 2 x 2
    from memest.sources import load_model
    from memest.workload import Framework, Offload

    t = TrainingConfig(method=Method.LORA, framework=Framework.DEEPSPEED, offload=Offload.PARAMS,
                       parallelism=Parallelism(dp=2, zero_stage=3))
    est = estimate(load_model("meta-llama/Llama-2-7b-hf"), t, get_device("H100-80GB"))
    assert est.host_bytes == 13_476_831_232 + 369_098_752 == 13_845_929_984


def test_autocast_copies_the_tied_lm_head_too():
    """Llama-3.2-1B ties its lm_head to the embedding (tie_word_embeddings): under torch.autocast the head's linear
    casts that fp32 matrix like any linear weight (a cached bf16 copy kept for backward), the embedding lookup casts
    nothing. Copies, 2 B each: 16 layers x (q, o 2048 x 2048 + k, v 2048 x 512 + gate, up, down 2048 x 8192)
    = 16 x 60,817,408 + the tied head 128,256 x 2048 = 262,668,288 -> 1,235,746,816 x 2 B = 2,471,493,632 B (the
    meta-device trace of the step holds 113 copies, 2.30 GiB: memest hf meta-llama/Llama-3.2-1B --train --trace)."""
    from memest.devices import get_device
    from memest.estimate import estimate
    from memest.sources import load_model
    from memest.workload import Precision, TrainingConfig

    spec = load_model("meta-llama/Llama-3.2-1B")
    assert spec.tie_word_embeddings
    est = estimate(spec, TrainingConfig(precision=Precision.AMP, micro_batch_size=1, seq_len=2048),
                   get_device("A100-80GB"))
    cast = next(t for t in est.per_device.terms if t.name == "workspace.autocast_weights")
    layer = 2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192
    assert layer == 60_817_408
    assert cast.bytes == (16 * layer + 128_256 * 2048) * 2 == 2_471_493_632
