"""transformers before 4.49's ``ForCausalLMLoss`` (read at 4.48.1, ``src/transformers/loss/loss_utils.py``):

    logits = logits.float()
    shift_logits = logits[..., :-1, :].contiguous()
    ...
    loss = fixed_cross_entropy(shift_logits, shift_labels, ...)

At the log-softmax the caller's bf16 logits (2 B), the fp32 upcast (4 B), its shifted contiguous copy (4 B) and
the fp32 log-softmax (4 B) are alive: 14 B per logit where 4.49.0 (labels padded, no copy) holds 10 B. The
backward is the same in both (log-softmax's saved output, the nll gradient and the log-softmax gradient: 12 B).

Hand-derived with Mistral-7B-v0.1 (V 32,000, h 4,096, 32 layers) at fms-acceleration's refs/a100_80gb.csv LoRA
setting (benchmarks/data/validation_cases.json ``fms_mistral7b_lora_1gpu_bs4``): 4 x 4,096 = 16,384 tokens.
"""

from __future__ import annotations

import pytest

from memest.devices import get_device
from memest.estimate import estimate
from memest.estimate.training import _logits, _logits_forward, execution
from memest.sources import load_model
from memest.workload import (
    AttnImplementation,
    Framework,
    LoraConfig,
    Loss,
    Method,
    Optimizer,
    Precision,
    Recompute,
    TrainingConfig,
)

TOKENS = 4 * 4096
V = 32_000


@pytest.fixture(scope="module")
def mistral():
    return load_model("mistralai/Mistral-7B-v0.1")


def _fms(loss: Loss) -> TrainingConfig:
    return TrainingConfig(method=Method.LORA, micro_batch_size=4, seq_len=4096, precision=Precision.BF16,
                          optimizer=Optimizer.ADAMW, recompute=Recompute.FULL, loss=loss,
                          attn_implementation=AttnImplementation.FLASH_ATTENTION_2, framework=Framework.PYTORCH,
                          lora=LoraConfig(rank=16, targets="q_proj,k_proj,v_proj,o_proj", dropout=0.1))


def test_the_forward_loss_holds_the_shifted_copy(mistral):
    # 16,384 x 32,000 = 524,288,000 logits; 14 B each with the copy, 10 B without
    t = _fms(Loss.SHIFT_COPY)
    x = execution(mistral, t, Framework.PYTORCH)
    assert _logits_forward(mistral, t, Framework.PYTORCH, x, TOKENS).bytes == 524_288_000 * 14 == 7_340_032_000
    d = _fms(Loss.DEFAULT)
    assert _logits_forward(mistral, d, Framework.PYTORCH, x, TOKENS).bytes == 524_288_000 * 10 == 5_242_880_000


def test_the_backward_is_unchanged(mistral):
    # 12 B x 524,288,000 in both
    for loss in (Loss.SHIFT_COPY, Loss.DEFAULT):
        t = _fms(loss)
        x = execution(mistral, t, Framework.PYTORCH)
        assert _logits(mistral, t, Framework.PYTORCH, x, TOKENS).bytes == 524_288_000 * 12 == 6_291_456_000


def test_the_copy_moves_the_lora_peak_to_the_loss_forward(mistral):
    # LoRA on a frozen bf16 base: the loss forward (14 B) outgrows the loss backward (12 B) by 2 B x 524,288,000
    # = 1,048,576,000 B; nothing else differs between the two moments' stored activations (every checkpoint,
    # the head's tensors) and states
    a100 = get_device("A100-80GB")
    old = estimate(mistral, _fms(Loss.SHIFT_COPY), a100)
    new = estimate(mistral, _fms(Loss.DEFAULT), a100)
    assert new.extra["peak_moment"] == "loss_backward"
    assert old.extra["peak_moment"] == "loss_forward"
    assert old.per_device.allocated_bytes - new.per_device.allocated_bytes == 1_048_576_000
