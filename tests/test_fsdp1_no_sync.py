"""FSDP1 (``fsdp_flat_params``) and accumulation inside ``no_sync`` (``no_sync_accumulation``), as litgpt's
``finetune/full.py`` runs them under Lightning Fabric's ``FSDPStrategy`` (memest.estimate.training.fsdp): every
unit's unsharded gradient lives through the accumulating micro-batches, and the root FlatParameter's gradient is
assembled from its views once the embedding's gradient arrives at the end of backward.

The numbers are the litgpt config-hub gemma-2b full fine-tune row (4 x A10G, micro-batch 1, accumulation 4, litgpt's
own untied lm_head), derived by hand from gemma-2b's dimensions: h 2,048, 18 layers, 8 heads / 1 KV head of 256,
intermediate 16,384, V 256,000.
"""

from __future__ import annotations

import pytest

from memest.devices import get_device
from memest.estimate.training.step import estimate_training, moments
from memest.sources import load_config, spec_from_config
from memest.sources.config import HFConfig
from memest.workload import Framework, Optimizer, Parallelism, Precision, Recompute, TrainingConfig

# One layer: q and o 2,048 x 2,048 = 4,194,304 each; k and v 2,048 x 256 = 524,288 each; gate, up, down
# 2,048 x 16,384 = 33,554,432 each; two RMSNorm weights of 2,048: 8,388,608 + 1,048,576 + 100,663,296 + 4,096
LAYER = 110_104_576
EMBEDDING = LM_HEAD = 256_000 * 2_048  # 524,288,000 each (litgpt's lm_head untied)
FINAL_NORM = 2_048
P = 18 * LAYER + EMBEDDING + LM_HEAD + FINAL_NORM
assert P == 3_030_460_416


@pytest.fixture(scope="module")
def spec():
    cfg = load_config("google/gemma-2b")
    return spec_from_config(HFConfig({**cfg.raw, "tie_word_embeddings": False}, name=cfg.name, source=cfg.source))


def _job(**changes) -> TrainingConfig:
    job = TrainingConfig(micro_batch_size=1, seq_len=512, grad_accum_steps=4, precision=Precision.BF16,
                         optimizer=Optimizer.ADAMW, recompute=Recompute.FULL, framework=Framework.FSDP,
                         parallelism=Parallelism(dp=4, zero_stage=3), fsdp_flat_params=True, no_sync_accumulation=True)
    return job.replace(**changes)


def _bytes(terms, name):
    return [x.bytes for x in terms if x.name == name]


def test_no_sync_keeps_every_unsharded_gradient_through_forward_and_backward(spec):
    # every tensor's bf16 gradient unsharded: each a whole number of 512 B (under 10 MiB) or of 2 MiB (the 64 MiB
    # MLP weights, the 1,000 MiB embedding and lm_head), so no block rounding: 3,030,460,416 x 2 = 6,060,920,832 B
    at = moments(spec, _job(), get_device("A10G"))
    for moment in ("layer_forward", "loss_forward", "loss_backward", "first_layer_backward", "last_layer_backward"):
        assert _bytes(at[moment], "gradients") == [P * 2], moment
    assert P * 2 == 6_060_920_832
    # the last micro-batch reduce-scatters the accumulated gradient itself: no previous unit's copy
    assert not _bytes(at["last_layer_backward"], "workspace.reduce_scatter_input")
    # the sharded gradients at the step: far below the unsharded ones (about P x 2 / 4)
    assert _bytes(at["optimizer_step"], "gradients")[0] < P * 2 / 4 * 1.01


def test_without_no_sync_or_accumulation_the_gradients_stay_sharded(spec):
    for job in (_job(no_sync_accumulation=False), _job(grad_accum_steps=1)):
        at = moments(spec, job, get_device("A10G"))
        assert _bytes(at["last_layer_backward"], "gradients")[0] < P * 2 / 4 * 1.01


def test_the_root_flat_gradient_is_assembled_at_the_embeddings_backward(spec):
    at = moments(spec, _job(), get_device("A10G"))
    # the head's view gradients (lm_head + final norm) held from the loss backward on:
    # (524,288,000 + 2,048) x 2 = 1,048,580,096 B (2 MiB rounding would leave 2,093,056 B > 1 MiB: kept)
    held = (LM_HEAD + FINAL_NORM) * 2
    assert held == 1_048_580_096
    for moment in ("loss_backward", "first_layer_backward", "last_layer_backward"):
        assert _bytes(at[moment], "workspace.root_grad_views") == [held], moment
    # then the embedding's gradient, 524,288,000 x 2 = 1,048,576,000 B, and the root's flat gradient made from
    # both, (524,290,048 + 524,288,000) x 2 = 2,097,156,096 B (its 2 MiB segment would leave 2,093,056 B: kept)
    assert _bytes(at["last_layer_backward"], "workspace.root_flat_grad") == [1_048_576_000 + 2_097_156_096]
    assert not _bytes(at["layer_forward"], "workspace.root_grad_views")


def test_fsdp2_has_no_flat_root_gradient(spec):
    at = moments(spec, _job(fsdp_flat_params=False, no_sync_accumulation=False), get_device("A10G"))
    for moment in ("loss_backward", "last_layer_backward"):
        assert not _bytes(at[moment], "workspace.root_grad_views")
        assert not _bytes(at[moment], "workspace.root_flat_grad")
    assert _bytes(at["last_layer_backward"], "workspace.reduce_scatter_input")


def test_the_peak_and_its_assumptions(spec):
    est = estimate_training(spec, _job(), get_device("A10G"))
    assert est.extra["peak_moment"] == "last_layer_backward"
    text = " ".join(est.assumptions)
    assert "FSDP1 FullyShardedDataParallel" in text and "inside no_sync" in text


# Llama-2-7B, LoRA rank 8 on q and v, 2 ranks (litgpt resource-tables.md's multi-GPU rows): one layer's tensors
# q, k, v, o 4,096 x 4,096 = 16,777,216 each; gate, up, down 4,096 x 11,008 = 45,088,768 each; two norms of 4,096:
# 67,108,864 + 135,266,304 + 8,192 = 202,383,360; its adapters (A 8 x 4,096 and B 4,096 x 8 on q and on v) 131,072
LLAMA_LAYER, LLAMA_ADAPTERS = 202_383_360, 131_072


def _lora_job(**changes) -> TrainingConfig:
    from memest.workload import LoraConfig, LoraLibrary, Method
    job = _job(grad_accum_steps=128, seq_len=1304).replace(
        method=Method.LORA, lora=LoraConfig(rank=8, targets="q_proj,v_proj", dropout=0.05),
        lora_library=LoraLibrary.LITGPT, parallelism=Parallelism(dp=2, zero_stage=3))
    return job.replace(**changes)


@pytest.fixture(scope="module")
def llama2():
    from memest.sources import load_model
    return load_model("meta-llama/Llama-2-7b-hf")


def test_fsdp1_lora_layer_units_take_the_whole_layers_gradient(llama2):
    # each layer's FlatParameter holds the frozen base beside the adapters and requires grad as a whole; inside
    # no_sync every layer's unsharded gradient is kept: 32 x (202,383,360 + 131,072) x 2 B = 12,960,923,648 B
    # (every tensor a whole number of 2 MiB or of 512 B: no rounding); the frozen root (embedding, lm_head,
    # final norm) has no gradient
    at = moments(llama2, _lora_job(), get_device("A100-40GB"))
    whole = 32 * (LLAMA_LAYER + LLAMA_ADAPTERS) * 2
    assert whole == 12_960_923_648
    assert _bytes(at["first_layer_backward"], "gradients") == [whole]
    # the unit in backward makes its whole unsharded gradient before it is added: 202,383,360 (+ adapters) x 2 B
    assert _bytes(at["first_layer_backward"], "workspace.unsharded_grads")[0] >= LLAMA_LAYER * 2
    # after the last micro-batch's reduce-scatters, the whole layers' gradients sharded over 2 ranks (about
    # 6.48e9 B; the shards' block rounding aside)
    assert _bytes(at["optimizer_step"], "gradients")[0] == pytest.approx(whole / 2, rel=0.03)


def test_fsdp2_lora_keeps_the_adapters_gradients_only(llama2):
    # per-parameter sharding: only the adapters have gradients, 32 x 131,072 x 2 B = 8,388,608 B unsharded
    at = moments(llama2, _lora_job(fsdp_flat_params=False), get_device("A100-40GB"))
    assert _bytes(at["first_layer_backward"], "gradients") == [32 * LLAMA_ADAPTERS * 2]
    assert not _bytes(at["first_layer_backward"], "workspace.unsharded_grads")


def test_a_tied_embedding_is_held_from_the_head_and_made_again_by_the_lookup():
    from memest.sources import load_model
    # gemma-2b as the Hub ties it: the root FlatParameter holds wte (524,288,000) and the final norm (2,048); the
    # tied weight's lm_head contribution and the norm's, (524,288,000 + 2,048) x 2 = 1,048,580,096 B, wait for the
    # lookup's, 524,288,000 x 2 = 1,048,576,000 B, beside the assembled flat gradient of 1,048,580,096 B
    at = moments(load_model("google/gemma-2b"), _job(), get_device("A10G"))
    assert _bytes(at["loss_backward"], "workspace.root_grad_views") == [1_048_580_096]
    assert _bytes(at["last_layer_backward"], "workspace.root_flat_grad") == [1_048_576_000 + 1_048_580_096]
