"""torchtitan's tensor parallel (DTensor) at the loss: ``loss_parallel()``'s decomposed cross-entropy and the
lm_head's all-gathered input (torch/distributed/tensor/parallel/loss.py, style.py; torchtitan 9dec370
``parallelize_llama.apply_tp`` and ``train.py``).

Hand-derived with Llama-3.1-70B's dims (h 8192, V 128,256) and the published FSDP 32 x TP 8 row's settings
(benchmarks/data/validation_cases.json ``torchtitan_llama31_70b_fsdp32_tp8``: local batch 16; llama3_70b.toml
at 9dec370: seq_len 8192, activation_checkpoint.mode 'full'): tokens = 16 x 8192 = 131,072 per rank (the TP
group shares the batch), the vocabulary shard V/tp = 128,256 / 8 = 16,032.
"""

from __future__ import annotations

import pytest

from memest.estimate.sharding import Stage
from memest.estimate.training import _logits, _logits_forward, execution
from memest.estimate.training.activation_terms import activation_terms, activations_input
from memest.sources import load_model
from memest.workload import Framework, Optimizer, Parallelism, Precision, Recompute, TrainingConfig

TOKENS = 16 * 8192  # 131,072
V_SHARD = 128_256 // 8  # 16,032
H = 8192


@pytest.fixture(scope="module")
def llama70b():
    return load_model("meta-llama/Llama-3.1-70B")


def _titan(tp: int = 8, sp: bool = True, framework: Framework = Framework.FSDP) -> TrainingConfig:
    return TrainingConfig(micro_batch_size=16, seq_len=8192, precision=Precision.FSDP2, optimizer=Optimizer.ADAMW,
                          recompute=Recompute.FULL, framework=framework,
                          parallelism=Parallelism(dp=32, tp=tp, zero_stage=3, sequence_parallel=sp))


def test_loss_parallel_backward_holds_four_fp32_vocab_shards(llama70b):
    # _nll_loss_and_log_softmax_backward: the saved fp32 log-probs x (4 B), grad_input = zeros_like(x) (4 B),
    # torch.exp(x) (4 B) and grad_input + exp(x) (4 B) alive at once: 16 B per vocabulary entry of the shard.
    # 131,072 x 16,032 = 2,101,346,304 entries x 16 B = 33,621,540,864 B (31.3 GiB); aten's fused
    # log_softmax / nll_loss backward (no TP) held 12 B: 25,216,155,648 B
    t = _titan()
    x = execution(llama70b, t, Framework.FSDP)
    assert _logits(llama70b, t, Framework.FSDP, x, TOKENS).bytes == 2_101_346_304 * 16 == 33_621_540_864


def test_loss_parallel_forward_holds_shifted_and_exp(llama70b):
    # _log_softmax (the decomposition): bf16 logits (2 B), their .float() x (4 B), shifted = x - x_max (4 B),
    # torch.exp(shifted) (4 B; result = shifted - logsumexp takes its place): 14 B x 2,101,346,304
    t = _titan()
    x = execution(llama70b, t, Framework.FSDP)
    assert _logits_forward(llama70b, t, Framework.FSDP, x, TOKENS).bytes == 2_101_346_304 * 14 == 29_418_848_256


def test_megatron_vocab_parallel_loss_is_unchanged(llama70b):
    # Megatron's own vocab-parallel cross-entropy: fp32 softmax + bf16 logits and gradient, 8 B per entry
    t = _titan(framework=Framework.MEGATRON)
    x = execution(llama70b, t, Framework.MEGATRON)
    assert _logits(llama70b, t, Framework.MEGATRON, x, TOKENS).bytes == 2_101_346_304 * 8


def test_without_tp_the_fused_aten_loss_keeps_12_bytes(llama70b):
    # FSDP alone (the 8B rows' path): fp32 log-probs, nll grad, log-softmax grad = 12 B over the full V
    t = _titan(tp=1, sp=False)
    x = execution(llama70b, t, Framework.FSDP)
    assert _logits(llama70b, t, Framework.FSDP, x, TOKENS).bytes == TOKENS * 128_256 * 12


def _head(spec, t: TrainingConfig) -> int:
    n = spec.num_layers
    terms = activation_terms(spec, activations_input(t), Framework.FSDP, Stage(0, 0, n, True, True))
    return sum(term.bytes for lifetime in terms.lifetimes for term in lifetime if term.name == "activations.head")


def test_lm_head_keeps_its_all_gathered_input_under_sequence_parallel(llama70b):
    # torchtitan's RMSNorm, eager (the blocks alone are compiled): ``x * torch.rsqrt(...)`` keeps x.float() (4h)
    # and the fp32 rsqrt (4 B per token), the weight's product the normalized type_as(x) output (2h), on the
    # s/tp shard: (6 x 8192 + 4) x 131,072 / 8 = 805,371,904 B;
    # ColwiseParallel(input_layouts=Shard(1)) all-gathers the norm output to Replicate and F.linear saves
    # the full b x s x h bf16 tensor: 2 x 8192 x 131,072 = 2,147,483,648 B. Before, the lm_head input was
    # counted on the shard (2h / 8: 268,435,456 B).
    own = (6 * H + 4) * TOKENS // 8
    gathered = 2 * H * TOKENS
    assert _head(llama70b, _titan()) == own + gathered == 2_952_855_552
    # TP without sequence parallel: the norm runs on the full sequence too, (6h + 4 + 2h) x tokens
    assert _head(llama70b, _titan(sp=False)) == (8 * H + 4) * TOKENS
