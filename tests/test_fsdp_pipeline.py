"""FSDP2 under pipeline parallelism (memest.estimate.training.fsdp): the stage stays gathered from its first
forward, and every parameter's unsharded gradient accumulates in reduce_dtype over the micro-batches until the
last one's reduce-scatter (torchtitan 9dec370 ``apply_fsdp``: reshard_after_forward False when pp_enabled;
torch ``pipelining/stage.py`` ``backward_maybe_with_nosync``; ``_fsdp_param.py`` ``to_accumulated_grad_if_needed``).

The numbers are torchtitan's Llama 3.1 405B 1F1B row (FSDP 8 x TP 8 x PP 8, float8 all-gather), derived by hand
from the 405B's dimensions: h 16,384, i 53,248, 126 layers, 128 heads / 8 KV heads (head_dim 128), V 128,256.
"""

from __future__ import annotations

import pytest

from memest.devices import get_device
from memest.estimate.sharding import stages
from memest.estimate.training.step import estimate_training, moments
from memest.sources import load_model
from memest.workload import Float8, Optimizer, Parallelism, Precision, Recompute, TrainingConfig

GiB = 2**30

# One layer on a TP rank (tp 8): q_proj and o_proj 16,384 x 16,384 / 8 = 33,554,432 each; k_proj and v_proj
# 16,384 x (8 x 128) / 8 = 2,097,152 each; gate, up, down 16,384 x 53,248 / 8 = 109,051,904 each. Linears:
# 2 x 33,554,432 + 2 x 2,097,152 + 3 x 109,051,904 = 398,458,880; the two RMSNorm weights (replicated under TP)
# 2 x 16,384 = 32,768; the layer 398,491,648. The embedding, vocab-parallel: 128,256 x 16,384 / 8 = 262,668,288.
LINEARS, NORMS, EMBEDDING = 398_458_880, 32_768, 262_668_288
LAYER = LINEARS + NORMS
assert LAYER == 398_491_648
# float8 all-gather: the linears in float8 (1 B), the norms at param_dtype bf16 (2 B): 398,524,416 B a layer
LAYER_FP8 = LINEARS * 1 + NORMS * 2
assert LAYER_FP8 == 398_524_416
# 126 layers over 8 stages: the first six take 16 (126 = 8 x 15 + 6), the rest 15; stage 0 also the embedding
STAGE0_LAYERS = 16


def _job(pp: int) -> TrainingConfig:
    return TrainingConfig(micro_batch_size=4, seq_len=8192, grad_accum_steps=8, precision=Precision.FSDP2,
                          optimizer=Optimizer.ADAMW, recompute=Recompute.FULL, torch_compile=True,
                          float8=Float8.TENSORWISE, float8_all_gather=True,
                          parallelism=Parallelism(dp=8, tp=8, pp=pp, zero_stage=3, sequence_parallel=True))


@pytest.fixture(scope="module")
def first_stage():
    spec = load_model("meta-llama/Llama-3.1-405B")
    stage = stages(spec.num_layers, 8)[0]
    assert (stage.start, stage.stop, stage.first) == (0, STAGE0_LAYERS, True)
    return moments(spec, _job(8), get_device("H100-96GB"), stage)


def _bytes(terms, name):
    return [x.bytes for x in terms if x.name == name]


def test_the_whole_stage_stays_gathered_through_forward_and_backward(first_stage):
    # 16 x 398,524,416 = 6,376,390,656 B (5.94 GiB) of layers + the embedding at bf16 262,668,288 x 2 =
    # 525,336,576 B: 6,901,727,232 B, at every moment of forward and backward; no per-layer units beside it
    gathered = STAGE0_LAYERS * LAYER_FP8 + EMBEDDING * 2
    assert gathered == 6_901_727_232
    for moment in ("layer_forward", "loss_forward", "first_layer_backward", "last_layer_backward"):
        terms = first_stage[moment]
        assert _bytes(terms, "workspace.gathered_params") == [gathered], moment
        assert not _bytes(terms, "workspace.gathered_layers") and not _bytes(terms, "workspace.gathered_root")
    assert not _bytes(first_stage["optimizer_step"], "workspace.gathered_params")  # resharded after the last


def test_unsharded_grads_accumulate_in_fp32_over_the_micro_batches(first_stage):
    # every parameter's unsharded gradient upcast to reduce_dtype fp32 (4 B); each tensor a multiple of 512 B,
    # so no block rounding: (16 x 398,491,648 + 262,668,288) x 4 = 25,503,465,472 (23.75 GiB) + 1,050,673,152
    accumulated = (STAGE0_LAYERS * LAYER + EMBEDDING) * 4
    assert accumulated == 26_554_138_624
    assert STAGE0_LAYERS * LAYER * 4 / GiB == pytest.approx(23.75, abs=0.01)
    for moment in ("layer_forward", "loss_forward", "first_layer_backward", "last_layer_backward"):
        assert _bytes(first_stage[moment], "gradients") == [accumulated], moment
    # no reduce-scatter until the last micro-batch: no previous unit's reduce-scatter input in backward
    assert not _bytes(first_stage["last_layer_backward"], "workspace.reduce_scatter_input")
    # the unit in backward still makes its bf16 unsharded gradients before they are added: 398,491,648 x 2
    assert _bytes(first_stage["first_layer_backward"], "workspace.unsharded_grads") == [LAYER * 2]
    # the optimizer step sees the sharded fp32 gradients instead: the layers' 16 x 398,491,648 x 4 / 8 =
    # 3,187,933,184 (each shard a whole number of MiB or under 10 MiB) + the embedding's 262,668,288 x 4 / 8 =
    # 131,334,144 B (125.25 MiB: a 2 MiB-rounded segment, 126 MiB, its 0.75 MiB rest not split) 132,120,576
    assert _bytes(first_stage["optimizer_step"], "gradients") == [3_187_933_184 + 132_120_576]


def test_the_reduce_scatter_after_the_last_micro_batch(first_stage):
    # at the first unit's reduce (the largest layer): the other units still gathered, 6,901,727,232 - 398,524,416
    # = 6,503,202,816; every accumulated gradient; its flat fp32 input 398,491,648 x 4 = 1,593,966,592 and its
    # sharded output 1,593,966,592 / 8 = 199,245,824
    terms = first_stage["gradient_reduction"]
    assert _bytes(terms, "workspace.gathered_params") == [6_503_202_816]
    assert _bytes(terms, "gradients") == [26_554_138_624]
    assert _bytes(terms, "workspace.reduce_scatter_input") == [1_593_966_592]
    assert _bytes(terms, "workspace.reduce_scatter_output") == [199_245_824]


def test_without_pipeline_parallelism_two_layer_units_and_sharded_grads():
    # pp 1 on 64 ranks (dp 8 x tp 8): FSDP2 reshards each layer after forward, two layer units while layers run,
    # 2 x 398,524,416 = 797,048,832; no accumulated unsharded gradients, no gradient_reduction moment
    spec = load_model("meta-llama/Llama-3.1-405B")
    out = moments(spec, _job(1), get_device("H100-96GB"), stages(spec.num_layers, 1)[0])
    assert _bytes(out["layer_forward"], "workspace.gathered_layers") == [2 * LAYER_FP8]
    assert not _bytes(out["layer_forward"], "workspace.gathered_params")
    assert "gradient_reduction" not in out


def test_the_estimate_says_so():
    spec = load_model("meta-llama/Llama-3.1-405B")
    said = [estimate_training(spec, _job(pp), get_device("H100-96GB")).assumptions for pp in (8, 1)]
    assert [any("FSDP2 under pipeline parallelism" in line for line in lines) for lines in said] == [True, False]


def test_shard_grad_op_gathers_each_layer_as_a_full_shard_unit_is_gathered():
    # SHARD_GRAD_OP (and FSDP2 under PP) keeps every unit gathered, each as full shard gathers it: a QLoRA base
    # layer in NF4 (torchao NF4Tensor.fsdp_pre_all_gather sends it as stored), not at the compute dtype. Llama-2-7B:
    # 32 layers x the full-shard unit (half of the two units alive while layers run) + the root at bf16: embedding
    # 32,000 x 4,096 x 2 = 262,144,000, final norm 4,096 x 2 = 8,192, lm_head 262,144,000: 524,296,192
    from memest.estimate.training.protocol import states_input
    from memest.estimate.training.states import model_states
    from memest.workload import Framework, Method

    spec = load_model("meta-llama/Llama-2-7b-hf")
    stage = stages(spec.num_layers, 1)[0]

    def gathered(zero_stage, name):
        t = TrainingConfig(method=Method.QLORA, precision=Precision.FSDP2, framework=Framework.FSDP,
                           parallelism=Parallelism(dp=2, zero_stage=zero_stage))
        running = model_states(spec, states_input(t), Framework.FSDP, stage).lifetimes[1]  # gathered.running
        return [x.bytes for x in running if x.name == name]
    (two_units,) = gathered(3, "workspace.gathered_layers")
    assert gathered(2, "workspace.gathered_params") == [32 * two_units // 2 + 524_296_192]
