"""torchtune's chunked cross-entropy (``CEWithChunkedOutputLoss``): what memest counts, derived by hand, and
what autograd and inductor hold, measured on the CPU.

The loss is torchtune's at commit 1814feb17 (the README 'Optimization flags' table's commit):
``torchtune/modules/loss/ce_chunked_output_loss.py`` (``compute_cross_entropy`` upcasts one chunk and runs
``F.cross_entropy(..., reduction="sum")``; ``forward`` reshapes the chunks and sums them one at a time),
``torchtune/training/_compile.py`` ``compile_loss`` (under ``compile: True`` only ``compute_cross_entropy`` is
compiled) and ``torchtune/modules/transformer.py`` ``chunked_output`` (``[self.output(chunk) for chunk in
h.chunk(num_output_chunks, dim=1)]``). The measured tests re-run those functions, copied below, on tiny shapes.
"""

from __future__ import annotations

import pytest

from memest.estimate.sharding import stages
from memest.estimate.training.activation_terms import LOSS_CHUNKS, activation_terms, activations_input
from memest.estimate.training.table import ACTIVATION_LIFETIMES
from memest.sources import load_model
from memest.workload import Framework, LoraConfig, LoraLibrary, Loss, Method, Precision, Recompute, TrainingConfig

# Llama-3.2-3B: V 128,256, h 3,072, tied embeddings; torchtune's README row: batch 2 x 4,096 packed tokens, bf16
V, H, TOKENS = 128_256, 3_072, 2 * 4_096
LOGITS = TOKENS * V * 2                       # 1,050,673,152 logits x 2 B = 2,101,346,304 B


def _logits(t: TrainingConfig) -> dict[str, int]:
    spec = load_model("meta-llama/Llama-3.2-3B-Instruct")
    terms = activation_terms(spec, activations_input(t), Framework.PYTORCH, stages(spec.num_layers, 1)[0])
    names = ("logits.forward", "logits.backward")
    return {name: x.bytes for name, lifetime in zip(ACTIVATION_LIFETIMES, terms.lifetimes)
            for x in lifetime if x.name == "logits" and name in names}


def _job(**kw) -> TrainingConfig:
    return TrainingConfig(micro_batch_size=2, seq_len=4096, precision=Precision.BF16, framework=Framework.PYTORCH,
                          loss=Loss.CHUNKED, recompute=Recompute.FULL, lora_library=LoraLibrary.TORCHTUNE, **kw)


def test_compiled_chunked_loss_with_a_frozen_head_holds_nine_eighths_of_the_logits():
    # LoRA: the tied embedding is frozen. Backward through the compiled chunks: 8 chunks' bf16 logits saved, and
    # the gradients written so far: K + 1 = 9 chunks = 2,101,346,304 x 9 / 8 = 2,364,014,592 B (was 3.25 B x V
    # per token: 3,414,687,744 B). The forward: the 8 chunks, 2,101,346,304 B.
    t = _job(method=Method.LORA, torch_compile=True, lora=LoraConfig(rank=64, targets="q_proj,v_proj"))
    assert _logits(t) == {"logits.forward": 2_101_346_304, "logits.backward": 2_364_014_592}


def test_compiled_chunked_loss_with_a_trained_head_peaks_in_the_projections_backward():
    # full fine-tune, bf16 parameters (g = 2): the second output projection's backward holds K - 2 = 6 chunk
    # gradients, 2,101,346,304 x 6 / 8 = 1,576,009,728 B, and three V x h x 2 B weight gradients,
    # 3 x 128,256 x 3,072 x 2 = 2,364,014,592 B: 3,940,024,320 B > the chunks' 2,364,014,592 B
    assert _logits(_job(torch_compile=True)) == {"logits.forward": 2_101_346_304, "logits.backward": 3_940_024_320}


def test_eager_chunked_loss_forward_holds_the_list_and_every_fp32_log_softmax():
    # eager: at the last chunk, the recipe's list of bf16 logits (2 B), every chunk's saved fp32 log-softmax (4 B)
    # and the last chunk's fp32 upcast (4 B / 8): 1,050,673,152 x 6.5 = 6,829,375,488 B; its backward as before,
    # 1,050,673,152 x (4 + 10 / 8) = 5,516,034,048 B
    assert _logits(_job()) == {"logits.forward": 6_829_375_488, "logits.backward": 5_516_034_048}


# --- measured on the CPU ------------------------------------------------------------------------------------------

K = LOSS_CHUNKS
ROWS, D, VOCAB = 16, 32, 4096        # one chunk: 16 tokens x V 4096; the weight V x D = 2 chunks' worth


def compute_cross_entropy(logits, labels):
    """torchtune 1814feb17 ``CEWithChunkedOutputLoss.compute_cross_entropy`` (ignore_index -100)."""
    import torch.nn.functional as F
    return F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum")


def _step(torch, ce, dtype, train_head, hooks=None, order=None):
    """One forward + backward of torchtune's chunked output and loss on a (1, K x ROWS, D) hidden state. The
    projection of each chunk is ``F.linear`` on the chunk as a matrix: what ``matmul`` folds a 3-D chunk to when
    the weight needs a gradient (``should_fold``); a frozen weight keeps the 3-D ``bmm`` path, whose CPU kernel
    copies the weight (cuBLAS reads it in place), so the measured peaks use the 2-D form."""
    import contextlib

    import torch.nn.functional as F
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(VOCAB, D, generator=gen).to(dtype).requires_grad_(train_head)
    h = torch.randn(1, K * ROWS, D, generator=gen).to(dtype).requires_grad_(True)
    labels = torch.randint(0, VOCAB, (1, K * ROWS), generator=gen)

    def run(measured=True):
        outs = [F.linear(chunk.reshape(-1, D), w) for chunk in h.chunk(K, dim=1)]
        if order is not None and measured:
            for i, out in enumerate(outs):
                out.grad_fn.register_prehook(lambda g, i=i: order.append(("projection", i)))
        with (hooks if hooks is not None and measured else contextlib.nullcontext()):
            chunks = [c.reshape(-1) for c in labels.chunk(K, dim=1)]
            total = 0.0
            for i, (out, lab) in enumerate(zip(outs, chunks)):
                loss = ce(out.reshape(-1, VOCAB), lab)
                if order is not None and measured:
                    loss.grad_fn.register_prehook(lambda g, i=i: order.append(("loss", i)))
                total = total + loss
        del outs, out  # the recipe's ``del logits``
        total.backward()

    run(measured=False)  # the first call compiles
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_saved_for_backward(torch, compiled):
    # bf16 logits: eager keeps each chunk's fp32 log-softmax (16 x 4096 x 4 B = 262,144 B per chunk, saved by
    # log_softmax and nll_loss alike: one storage); compiled keeps each chunk's bf16 input (131,072 B)
    saved = {}

    def pack(x):
        if x.dim() == 2 and x.shape[1] == VOCAB:
            saved[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
        return x
    ce = torch.compile(compute_cross_entropy) if compiled else compute_cross_entropy
    _step(torch, ce, torch.bfloat16, False, hooks=torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x))
    per_chunk = ROWS * VOCAB * (2 if compiled else 4)
    assert sorted(saved.values()) == [per_chunk] * K


@pytest.mark.slow
@pytest.mark.parametrize("train_head", [False, True], ids=["frozen", "trained"])
def test_compiled_chunks_run_backward_before_any_projection_and_peak_as_counted(torch, train_head):
    # fp32 (c = g = 4 B; the CPU's bf16 mm upcasts its weight): one chunk u = 16 x 4096 x 4 = 262,144 B, the
    # weight's gradient 4096 x 32 x 4 = 524,288 B = 2u. Frozen head: (K + 1) u = 9u; trained head: the second
    # projection's backward, (K - 2) u + 3 x 2u = 12u > 9u. Besides them: the losses, row statistics, the
    # hidden state's gradient chunks: < 0.1u.
    order = []
    peak = _step(torch, torch.compile(compute_cross_entropy), torch.float32, train_head, order=order)
    assert [kind for kind, _ in order] == ["loss"] * K + ["projection"] * K
    u = ROWS * VOCAB * 4
    expected = (K - 2) * u + 3 * VOCAB * D * 4 if train_head else (K + 1) * u
    assert expected <= peak < expected + u // 10
