"""Traced training steps of a tiny Llama against model-state arithmetic worked by hand.

The tiny config (tests/trace_models.py, from Llama-3.1-8B): L=2 layers, h=256, a=8 heads, k=2 KV
heads, d=32, i=704, V=1024, untied lm_head. Every parameter tensor's bytes are a multiple of 512,
so the caching allocator's rounding adds nothing to them. Besides the parameters, the model holds
two rotary buffers (inv_freq and its copy, d/2 = 16 fp32 = 64 B, one 512-byte block each); the
step holds the input ids (b x s int64) and the cuBLAS workspace (a device constant).
"""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trace_models import tiny_config

from memest.devices import get_device
from memest.errors import InputError
from memest.estimate import runtime
from memest.result import Kind
from memest.trace import trace
from memest.workload import LoraConfig, Method, Optimizer, Parallelism, Precision, TrainingConfig

DEVICE = get_device("h100")
CUBLAS = runtime.cublas_workspace_bytes(DEVICE)
L, H, A, K, D, I, V = 2, 256, 8, 2, 32, 704, 1024
B, S = 2, 256
P = 2 * V * H + L * (2 * H * A * D + 2 * H * K * D + 3 * H * I + 2 * H) + H
"""Parameters: embedding + lm_head (V x h each), per layer q/o (h x a*d), k/v (h x k*d), gate/up/down
(h x i) and two norms (h), the final norm (h)."""
BUFFERS = 2 * 512
IDS = B * S * 8


def _step(**kw) -> object:
    return trace(tiny_config("llama"), TrainingConfig(micro_batch_size=B, seq_len=S, **kw), DEVICE)


@pytest.mark.parametrize(
    ("precision", "param_bytes"),
    [(Precision.BF16, 2), (Precision.FP32, 4)],
    ids=["bf16", "fp32"],
)
def test_adamw_step_holds_weights_grads_two_states_and_the_sqrt_temporary(precision, param_bytes) -> None:
    # torch AdamW (foreach): weights + gradients + exp_avg + exp_avg_sq + torch._foreach_sqrt(exp_avg_sq),
    # all in the parameter dtype: 5 copies of the parameters
    peak = _step(precision=precision).per_device.phase_peaks["optimizer"]
    assert peak == 5 * param_bytes * P + BUFFERS + IDS + CUBLAS


def test_mixed_runs_deepspeed_fp16_optimizer_at_24_bytes_per_param() -> None:
    # DeepSpeed 0.19.5 ZeRO-0 bf16 runs FP16_Optimizer (fp16/fused_optimizer.py): bf16 weights (2P) + fp32
    # flat master (4P) + fused Adam's exp_avg, exp_avg_sq (8P) + the bf16 param.grad left by backward (2P) +
    # at the step every gradient's fp32 copy (4P) and their flattened concatenation (4P); the fused step
    # makes no temporary, its step counter is one fp32 scalar on the device (one block)
    rank = _step(precision=Precision.MIXED).per_device
    assert rank.phase_peaks["optimizer"] == 24 * P + 512 + BUFFERS + IDS + CUBLAS


def test_ddp_adds_gradient_buckets_over_every_parameter() -> None:
    # dp=2 without ZeRO is DDP: its reducer's buckets (gradient_as_bucket_view=False) hold another
    # gradient-sized buffer for the whole run: the bf16 AdamW step's 5 copies + 1
    rank = _step(precision=Precision.BF16, parallelism=Parallelism(dp=2)).per_device
    assert rank.phase_peaks["optimizer"] == 6 * 2 * P + BUFFERS + IDS + CUBLAS


def test_sgd_without_momentum_keeps_no_state() -> None:
    # weights + grads only (plain SGD: foreach add of -lr * grad, in place)
    rank = _step(precision=Precision.BF16, optimizer=Optimizer.SGD).per_device
    assert Kind.OPTIMIZER_STATES not in rank.by_kind
    assert rank.phase_peaks["optimizer"] == 2 * 2 * P + BUFFERS + IDS + CUBLAS


def test_lora_trains_fp32_adapters_on_a_frozen_bf16_base() -> None:
    # r=16 on q, k, v, o of each layer: A (r x in) + B (out x r); PEFT keeps adapters fp32 on a bf16 base;
    # plain PyTorch (bf16 recipe): torch AdamW states in the adapters' dtype
    r = 16
    adapters = L * r * ((H + A * D) + (H + K * D) + (H + K * D) + (A * D + H))
    rank = _step(precision=Precision.BF16, method=Method.LORA, lora=LoraConfig(rank=r, targets="attention")).per_device
    assert rank.by_kind[Kind.WEIGHTS] == 2 * P + 4 * adapters + BUFFERS
    assert rank.by_kind[Kind.OPTIMIZER_STATES] == 2 * 4 * adapters  # AdamW exp_avg + exp_avg_sq, fp32


def test_loss_keeps_three_fp32_vocab_tensors_at_the_start_of_backward() -> None:
    # transformers ForCausalLMLoss: logits.float() -> cross_entropy = log_softmax + nll_loss. When the
    # loss's backward has run: the saved log_softmax output, nll_loss_backward's dense gradient and
    # log_softmax_backward's output, each b x s x V fp32, with every layer's activations still alive;
    # and three fp32 scalars (the loss, its ones_like seed gradient, the gradient of the mean's division),
    # one 512-byte block each
    rank = _step(precision=Precision.BF16).per_device
    assert rank.peak_phase == "backward"
    assert rank.by_kind[Kind.LOGITS] == 3 * 4 * B * S * V + 3 * 512


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"method": Method.QLORA}, "qlora"),
        ({"optimizer": Optimizer.ADAMW8BIT}, "adamw8bit"),
        ({"loss": "chunked"}, "chunked"),
        ({"parallelism": Parallelism(tp=2)}, "^tp 2 cannot be traced.*drop tp$"),  # keywords for a Python caller
        ({"parallelism": Parallelism(dp=2, zero_stage=1)}, "^zero_stage 1 cannot be traced"),
    ],
    ids=["qlora", "8bit-adam", "chunked-loss", "tp", "zero1"],
)
def test_settings_the_trace_cannot_simulate_are_refused(kw, match) -> None:
    with pytest.raises(InputError, match=match):
        _step(**kw)


def test_autocast_weight_copies_are_workspace_as_the_estimate_files_them() -> None:
    """precision amp: fp32 parameters, torch.autocast(bf16) casts each linear weight once per forward and the copy is
    kept for backward; the estimate calls those copies workspace (workspace.autocast_weights), and so does the trace.
    At the traced peak (the loss's backward, before any layer's backward) every copy is alive: per layer q, o
    (h x a*d) + k, v (h x k*d) + gate, up, down (h x i), and the untied lm_head (V x h), 2 B each:
    (2 x (2 x 256 x 256 + 2 x 256 x 64 + 3 x 256 x 704) + 1024 x 256) x 2 B = 3,342,336 B (multiples of 512 B)."""
    rank = _step(precision=Precision.AMP).per_device
    copies = [g for g in rank.groups if g.label == "autocast weight copy"]
    assert rank.peak_phase == "backward"
    assert [g.kind for g in copies] == [Kind.WORKSPACE]
    assert copies[0].bytes == (L * (2 * H * A * D + 2 * H * K * D + 3 * H * I) + V * H) * 2 == 3_342_336
    weight_shapes = {(A * D, H), (H, A * D), (K * D, H), (I, H), (H, I), (V, H)}
    for g in rank.groups:  # no weight-shaped cast is left among the activations
        if g.kind is Kind.ACTIVATIONS and g.label.startswith("aten._to_copy"):
            assert not any(str(shape) in g.label for shape in weight_shapes), g.label


def test_the_table_gives_no_share_of_a_near_zero_kind() -> None:
    """A kind the trace holds 8 MiB of at a 23 GiB peak (under 1% of it, 235.9 MiB) shows its difference and "—" for
    the share, not -22,843%; 2.31 GiB against 1.82 GiB is (2.31 - 1.82) / 2.31 = +21.2% of the trace."""
    from memest.report.trace import _rel
    from memest.trace.compare import ComparisonRow

    MiB, GiB = 2**20, 2**30
    peak = round(23.04 * GiB)
    assert _rel(ComparisonRow("workspace", round(1.82 * GiB), round(8.12 * MiB)), peak) == "—"
    assert _rel(ComparisonRow("workspace", round(1.82 * GiB), round(2.31 * GiB)), peak) == "+21.2%"
    assert _rel(ComparisonRow("peak allocated", round(22.55 * GiB), peak)) == "+2.1%"
