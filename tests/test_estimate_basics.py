"""Hand-computed tiny cases for parameter sharding, model states, KV cache, and term arithmetic.

The tiny llama: h=64, a=4 heads, k=2 KV heads, d=16, i=128, L=2, V=1000, untied lm_head.
Per layer: q 64x64=4096, k 64x32=2048, v 2048, o 4096 (attention 12,288); gate/up/down 3 x 64x128
= 24,576; two RMSNorms 128 -> 36,992. Total: embed 64,000 + 2 x 36,992 + final norm 64 + lm_head
64,000 = 202,048.
"""

from dataclasses import replace

import pytest

from memest.devices import get_device
from memest.estimate import estimate
from memest.estimate.sharding import stage_shard_numel, stages, vllm_stages
from memest.estimate.training import moments
from memest.result import Kind, RankEstimate
from memest.sources import load_model, spec_from_config
from memest.sources.config import HFConfig
from memest.workload import Parallelism, ServingConfig, TrainingConfig

TINY_PARAMS = 202_048
H100 = get_device("H100-80GB")


def test_tiny_param_count(tiny):
    assert tiny.num_params == TINY_PARAMS


@pytest.mark.parametrize(("tp", "expected"), [
    (1, TINY_PARAMS),
    # tp=2: embed 500 rows x 64 = 32,000; per layer 12,288/2 + 24,576/2 + 128 = 18,560 (x2); norm 64; lm_head 32,000
    (2, 32_000 + 2 * 18_560 + 64 + 32_000),
    # tp=4 > k=2: q,o /4 = 1024 each; k,v /min(4,2) = 1024 each (replicated beyond 2); MLP 24,576/4 = 6144
    (4, 16_000 + 2 * (4 * 1024 + 6144 + 128) + 64 + 16_000),
])
def test_tensor_parallel_shards(tiny, tp, expected):
    (stage,) = stages(tiny.num_layers, 1)
    assert stage_shard_numel(tiny, stage, Parallelism(tp=tp)) == expected


def test_pipeline_stages_split_layers_embedding_first_head_last(tiny):
    first, last = stages(tiny.num_layers, 2)
    par = Parallelism(pp=2)
    assert stage_shard_numel(tiny, first, par) == 64_000 + 36_992
    assert stage_shard_numel(tiny, last, par) == 36_992 + 64 + 64_000


@pytest.mark.parametrize(("num_layers", "pp", "training", "vllm"), [
    # 61 = 2 x 30 + 1: training gives the 1 to the first stage; vLLM to the second-to-last, which is also the first
    (61, 2, (31, 30), (31, 30)),
    # 61 = 4 x 15 + 1: vLLM's remainder goes to partitions[-2] (stage 2), never to the last stage
    (61, 4, (16, 15, 15, 15), (15, 15, 16, 15)),
    # 10 = 4 x 2 + 2: vLLM adds one to partitions[-2] and [-3] (stages 2 and 1)
    (10, 4, (3, 3, 2, 2), (2, 3, 3, 2)),
    # 126 = 8 x 15 + 6: vLLM adds one to stages 6, 5, 4, 3, 2, 1; the first and last keep 15
    (126, 8, (16,) * 6 + (15,) * 2, (15,) + (16,) * 6 + (15,)),
    (80, 4, (20,) * 4, (20,) * 4),  # even: both the same
    (7, 7, (1,) * 7, (1,) * 7),
])
def test_stage_splits_by_hand(num_layers, pp, training, vllm):
    for split, sizes in ((stages, training), (vllm_stages, vllm)):
        out = split(num_layers, pp)
        assert tuple(s.num_layers for s in out) == sizes
        assert [s.start for s in out] == [sum(sizes[:i]) for i in range(pp)]  # contiguous from layer 0
        assert out[-1].stop == num_layers
        assert [(s.first, s.last) for s in out] == [(i == 0, i == pp - 1) for i in range(pp)]


def test_vllm_stages_never_give_the_last_stage_more_than_the_even_share():
    # vLLM's rule over every split up to 64 layers: stages differ by at most one layer, the last holds
    # num_layers // pp, and when the remainder is at most pp - 2 the first does too
    for num_layers in range(1, 65):
        for pp in range(1, num_layers + 1):
            sizes = [s.num_layers for s in vllm_stages(num_layers, pp)]
            base, extra = divmod(num_layers, pp)
            assert sum(sizes) == num_layers and set(sizes) <= {base, base + 1}
            assert sizes[-1] == base
            assert sizes[0] == base + (pp > 1 and extra == pp - 1)


def _states(per):
    return {k: v for k, v in per.by_kind().items() if k in (Kind.WEIGHTS, Kind.GRADIENTS, Kind.OPTIMIZER_STATES)}


def _block(nbytes: int) -> int:
    """The CUDA caching allocator's block for a tensor under 10 MiB: a multiple of 512 B."""
    return -(-nbytes // 512) * 512


NORMS = 5
"""Tensors of the tiny llama whose 16-bit bytes are not a multiple of 512: its five 64-element norm
weights (128 B, a 512-B block each); every other tensor is (64,000 x 2 B = 250 x 512 B, ...)."""
PER_TENSOR_16BIT = 2 * TINY_PARAMS + NORMS * (512 - 128)


@pytest.mark.parametrize(("zero", "weights", "grads", "optimizer"), [
    # mixed precision AdamW (DeepSpeed 0.19.5), N = 4 ranks: weights 2P, grads 2P, master 4P + moments 8P,
    # each tensor in a 512-B block: the 16-bit weights and gradients per parameter, DeepSpeed's flat fp32
    # master and the two FusedAdam states as one tensor each of P/N elements (4P/4 = 202,048 B -> 202,240).
    # Without ZeRO, bf16 runs FP16_Optimizer (deepspeed/runtime/fp16/fused_optimizer.py): master and moments
    # unpartitioned, one flat tensor each (4P = 808,192 B -> 808,448), and param.grad alive at the step
    # (its fp32 copies are workspace, not counted here).
    (0, PER_TENSOR_16BIT, PER_TENSOR_16BIT, 3 * _block(4 * TINY_PARAMS)),
    # ZeRO-1: reduce_gradients (stage_1_and_2.py) leaves the rank's partition (grads_in_partition, 2P/4 =
    # 101,024 B -> 101,376) and drops param.grad before the step
    (1, PER_TENSOR_16BIT, _block(2 * TINY_PARAMS // 4), 3 * _block(4 * TINY_PARAMS // 4)),
    # ZeRO-2: one flat bf16 gradient partition (grads_in_partition), 2P/4 = 101,024 B -> 101,376
    (2, PER_TENSOR_16BIT, _block(2 * TINY_PARAMS // 4), 3 * _block(4 * TINY_PARAMS // 4)),
    # ZeRO-3: one flat bf16 weight partition and one gradient partition, 2P/4 each; besides, every tiny
    # parameter has at most 64,000 <= 1e5 elements (stage3_param_persistence_threshold): never partitioned,
    # each also whole on every rank in its own tensor (parameter_offload.py mark_persistent_parameters):
    # 101,376 + PER_TENSOR_16BIT (406,016) = 507,392 B of weights
    (3, _block(2 * TINY_PARAMS // 4) + PER_TENSOR_16BIT, _block(2 * TINY_PARAMS // 4), 3 * _block(4 * TINY_PARAMS // 4)),
])
def test_zero_stages_shard_model_states(tiny, zero, weights, grads, optimizer):
    # the model states at the optimizer step (training.moments)
    step = moments(tiny, TrainingConfig(seq_len=16, parallelism=Parallelism(dp=4, zero_stage=zero)), H100)["optimizer_step"]
    states = _states(RankEstimate("all ranks", tuple(step)))
    assert states[Kind.WEIGHTS] == weights
    assert states[Kind.GRADIENTS] == grads
    assert states[Kind.OPTIMIZER_STATES] == optimizer


@pytest.mark.parametrize(("tp", "kv_per_token"), [
    (1, 2 * 2 * 2 * 16 * 2),  # 2 (K,V) x L=2 x k=2 x d=16 x 2 B = 256
    (2, 2 * 2 * 1 * 16 * 2),  # one KV head per rank: 128
    (4, 2 * 2 * 1 * 16 * 2),  # tp > k: a head is replicated, still one per rank: 128
])
def test_kv_cache_bytes_per_token(tiny, tp, kv_per_token):
    est = estimate(tiny, ServingConfig(max_model_len=256, parallelism=Parallelism(tp=tp)), H100)
    assert est.serving.kv_cache_bytes_per_token == kv_per_token
    # 3 sequences of 256 tokens (16 blocks of 16 each)
    est3 = estimate(tiny, ServingConfig(max_model_len=256, batch_size=3, parallelism=Parallelism(tp=tp)), H100)
    assert est3.per_device.term("kv_cache").bytes == 3 * 256 * kv_per_token


def test_kv_cache_rounds_up_to_whole_blocks(tiny):
    est = estimate(tiny, ServingConfig(max_model_len=17), H100)
    assert est.per_device.term("kv_cache").bytes == 32 * 256  # 17 tokens occupy two 16-token blocks


@pytest.mark.parametrize("workload", [
    TrainingConfig(seq_len=64),
    TrainingConfig(seq_len=64, parallelism=Parallelism(pp=2, dp=2, zero_stage=3)),
    ServingConfig(max_model_len=128, batch_size=4),
], ids=["train", "train-pp-zero3", "serve"])
def test_three_figures_are_nested_sums(tiny, workload):
    for rank in estimate(tiny, workload, H100).ranks:
        alloc = sum(t.bytes for t in rank.terms if t.kind not in (Kind.ALLOCATOR, Kind.RUNTIME))
        assert rank.allocated_bytes == alloc
        assert rank.reserved_bytes == alloc + sum(t.bytes for t in rank.terms if t.kind is Kind.ALLOCATOR)
        assert rank.device_used_bytes == sum(t.bytes for t in rank.terms)
        assert rank.low_bytes <= rank.device_used_bytes <= rank.high_bytes


def test_weights_served_as_the_checkpoint_dtype_and_quantized(tiny):
    bf16 = estimate(tiny, ServingConfig(max_model_len=64), H100).per_device.term("weights").bytes
    assert bf16 == 2 * TINY_PARAMS
    # int8 (bitsandbytes): linear weights 1 B + an fp32 scale per output row; the rest stays 2 B.
    # linear weights per layer: 36,864 elements, output rows 64+32+32+64+128+128+64 = 512
    linear, rows = 2 * 36_864, 2 * 512
    int8 = estimate(tiny, ServingConfig(max_model_len=64, quantization="int8"), H100).per_device.term("weights").bytes
    assert int8 == linear * 1 + rows * 4 + (TINY_PARAMS - linear) * 2


TINY_MOE = {
    "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 1000,
    "num_local_experts": 4, "num_experts_per_tok": 2, "max_position_embeddings": 256, "torch_dtype": "bfloat16",
}
# routed experts per layer: gate_up (4 experts x 2*128 x 64) + down (4 x 64 x 128) = 65,536 + 32,768 = 98,304
EXPERTS_PER_LAYER = 4 * 256 * 64 + 4 * 64 * 128


@pytest.mark.parametrize(("par", "expected"), [
    (Parallelism(), EXPERTS_PER_LAYER),
    (Parallelism(tp=2), EXPERTS_PER_LAYER // 2),  # each expert split column/row-wise
    # EP over data-parallel ranks (Megatron): 4 experts / ep 4 = 1 whole expert per rank
    (Parallelism(dp=4, ep=4), EXPERTS_PER_LAYER // 4),
    # ep 2 over dp 2, each of the 2 experts split by tp 2: a quarter per rank
    (Parallelism(tp=2, dp=2, ep=2), EXPERTS_PER_LAYER // 4),
    # vLLM's EP = TP x DP: ep 4 across the 4 tensor-parallel ranks, whole experts, not split again by tp
    (Parallelism(tp=4, ep=4), EXPERTS_PER_LAYER // 4),
    # ep 2 reaching into tp 4 (ep > dp): the experts are spread over all 4 ranks, not divided by 2 x 4
    (Parallelism(tp=4, ep=2), EXPERTS_PER_LAYER // 4),
], ids=["none", "tp2", "dp4-ep4", "tp2-dp2-ep2", "tp4-ep4", "tp4-ep2"])
def test_expert_parallel_shards(par, expected):
    from memest.estimate.sharding import shard_numel
    from memest.spec import Component

    spec = spec_from_config(HFConfig(TINY_MOE, name="tiny-moe", source="test"))
    layer = spec.layers[0]
    experts = [t for t in layer.tensors if t.component is Component.EXPERTS]
    assert sum(t.numel for t in experts) == EXPERTS_PER_LAYER
    assert sum(shard_numel(t, par, spec.num_kv_heads) for t in experts) == expected


@pytest.mark.parametrize("par", [Parallelism(), Parallelism(dp=2), Parallelism(tp=2, dp=3), Parallelism(tp=2, pp=4, dp=2)])
def test_rank_counts_add_up_to_the_world_size(par):
    """Each RankEstimate counts devices: tp x pp x cp x dp of them in all, whatever the stage grouping
    (pp=4 gives first, middle x2, last: 4 stages x tp 2 x dp 2 = 16 devices)."""
    spec = load_model("meta-llama/Llama-2-7b-hf")
    dev = get_device("H100-80GB")
    train = estimate(spec, TrainingConfig(seq_len=512, parallelism=par), dev)
    assert sum(r.count for r in train.ranks) == par.tp * par.pp * par.cp * par.dp
    serve = estimate(spec, ServingConfig(parallelism=replace(par, dp=1)), dev)
    assert sum(r.count for r in serve.ranks) == par.tp * par.pp


# TINY_MOE's parameters: routed experts E = 2 layers x 98,304 = 196,608; the rest D = embed 64,000 +
# lm_head 64,000 (untied) + 2 x (attention 12,288 + router 4 x 64 = 256 + two norms 128) + final norm 64
# = 153,408.
MOE_EXPERTS, MOE_DENSE = 2 * EXPERTS_PER_LAYER, 64_000 + 64_000 + 2 * (12_288 + 256 + 128) + 64


@pytest.mark.parametrize(("dp", "ep", "master_bytes"), [
    # ep 1: fp32 master of everything / 4 ranks = 4 x (D + E) / 4 = 350,016 B -> 684 blocks of 512
    (4, 1, 684 * 512),
    # ep 4 = dp: a rank holds E/4 experts, whose expert-data-parallel group is 1 rank: 4 x E/4 unsharded
    # + 4 x D / 4 = 196,608 + 153,408 = 350,016 B, the same as ep 1 (not E / 16)
    (4, 4, 684 * 512),
    # dp 8, ep 4: experts E/4 over a group of 2 -> 4 x E/8 = 98,304; dense 4 x D/8 = 76,704; 175,008 B
    # -> 342 blocks
    (8, 4, 342 * 512),
])
def test_expert_states_shard_over_the_expert_data_parallel_group(dp, ep, master_bytes):
    from memest.workload import Framework

    spec = spec_from_config(HFConfig(TINY_MOE, name="tiny-moe", source="test"))
    assert sum(t.numel * c for t, c in spec.tensors()) == MOE_EXPERTS + MOE_DENSE
    t = TrainingConfig(seq_len=64, framework=Framework.DEEPSPEED, parallelism=Parallelism(dp=dp, ep=ep, zero_stage=1))
    est = estimate(spec, t, get_device("H100-80GB"))
    states = {term.name: term.bytes for term in est.per_device.terms}
    assert states["optimizer_states.master"] == master_bytes
    assert states["optimizer_states.moments"] == 2 * master_bytes  # FusedAdam: two fp32 states like the master


def test_nccl_communicators_only_on_an_accelerator(tiny):
    # two ranks on H100s hold NCCL's buffers (the 1 GiB of runtime.NCCL_BYTES); two CPU ranks run gloo in host
    # memory that the profiler already counts, so there is no such term (a 2-rank memest.track / calibrate --nproc
    # job on CPU)
    from memest.calibration.compare import local_device

    cpu = local_device("cpu", "cpu", 16 * 2**30)
    job = TrainingConfig(micro_batch_size=1, seq_len=16, parallelism=Parallelism(dp=2))
    nccl = {name: [t.bytes for t in estimate(tiny, job, device).ranks[0].terms if t.name == "runtime.nccl"]
            for name, device in (("h100", H100), ("cpu", cpu))}
    assert nccl == {"h100": [2**30], "cpu": []}
