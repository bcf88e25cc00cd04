"""A chunked / fused cross-entropy as a candidate fix (memest/planning/recommend.py ``logits_dominate``,
memest/workload/stacks.py ``StackDefaults.losses``): when the logits dominate a training job that does not fit and
its stack switches such a loss on, ``memest hf`` offers it, in the stack.

The case: Gemma-2B (memest/catalog/google/gemma-2b: V 256,000, h 2048, 2,506,172,416 params) fully fine-tuned by
the HF Trainer (bf16=True: fp32 params, autocast bf16, adamw_torch_fused) at seq_len 16,384, micro-batch 1, full
recompute, on one A100-80GB (79.14 GiB, 71.23 GiB usable with 10% headroom).

    logits, default loss  = b x s x V x 12 B = 1 x 16,384 x 256,000 x 12 = 50,331,648,000 B
        (fp32 log-probs, nll grad, log-softmax grad: transformers ForCausalLMLoss's upcast)
    Adam states           = 2 x 4 B x 2,506,172,416 = 20,049,379,328 B     -> the logits are the largest term
    logits, fused loss    = b x s x h x (2 x 2 + 8) B = 16,384 x 2,048 x 12 = 402,653,184 B
        (Liger's one chunk of bf16 logits and gradient + fp32 softmax statistics)
    saving at the loss    = 50,331,648,000 - 402,653,184 = 49,928,994,816 B (46.5 GiB)
"""

from __future__ import annotations

import json
import os

from memest.api import estimate_memory
from memest.devices import get_device
from memest.estimate.training.step import moments
from memest.planning.recommend import logits_dominate
from memest.result import Kind
from memest.workload import Loss
from tests.inprocess import run_memest

JOB = {"mode": "train", "gpu": "A100-80GB", "seq_len": 16_384, "recompute": "full"}
A100 = get_device("A100-80GB")


def test_the_logits_dominate_the_job() -> None:
    r = estimate_memory("google/gemma-2b", **JOB)
    terms = {t.name: t for t in r.result.estimate.terms}
    assert terms["logits"].bytes == 50_331_648_000 and terms["logits"].kind is Kind.LOGITS
    assert terms["optimizer_states.moments"].bytes == 20_049_379_328
    assert logits_dominate(r.result.estimate) and not r.fits


def test_the_trainer_job_is_offered_liger_in_its_own_stack() -> None:
    r = estimate_memory("google/gemma-2b", **JOB)
    best = r.result.recommendation.cheapest
    assert best is not None and best.flags == "--stack hf-trainer --loss fused" and best.lossless
    assert best.devices == 1 and best.workload.loss is Loss.FUSED
    assert [c.how for c in best.changes if c.how] == ["HF Trainer 4.57: use_liger_kernel=True"]
    spec = r.result.spec
    before = sum(t.bytes for t in moments(spec, r.result.workload, A100)["loss_backward"])
    after = sum(t.bytes for t in moments(spec, best.workload, A100)["loss_backward"])
    assert before - after == 50_331_648_000 - 402_653_184 == 49_928_994_816
    assert best.verdict.fits


def test_the_printed_fix_names_the_stack_and_its_switch() -> None:
    out = run_memest("hf", "google/gemma-2b", "--train", "--gpu", "A100-80GB", "--seq-len", "16384",
                     "--recompute", "full", "--stack", "llamafactory", env={**os.environ, "COLUMNS": "300"})
    assert "Cheapest fit: --stack llamafactory --loss fused" in out.stdout
    assert "(LLaMA-Factory: enable_liger_kernel: true)" in out.stdout
    doc = json.loads(run_memest("hf", "google/gemma-2b", "--train", "--gpu", "A100-80GB", "--seq-len", "16384",
                                "--recompute", "full", "--json").stdout)
    assert doc["recommendation"]["cheapest"]["how"] == ["HF Trainer 4.57: use_liger_kernel=True"]


def test_no_loss_fix_where_the_stack_has_no_switch() -> None:
    # DeepSpeed's own engine names no loss: the fix stays a DeepSpeed one (LoRA, more devices)
    r = estimate_memory("google/gemma-2b", stack="deepspeed", **JOB)
    rec = r.result.recommendation
    assert all(c is None or c.workload.loss is Loss.DEFAULT for c in (rec.cheapest, rec.lossless))


def test_no_loss_fix_where_the_logits_are_small() -> None:
    # seq_len 2048: the logits (2,048 x 256,000 x 12 = 6,291,456,000 B) are freed before the peak, which is the
    # last layer's backward (fp32 gradients of 4 x 2,506,172,416 = 10,024,689,664 B alive beside the Adam states);
    # a Trainer job that does not fit an L4 is not offered a loss change
    r = estimate_memory("google/gemma-2b", mode="train", gpu="L4", seq_len=2048, recompute="full")
    assert r.result.estimate.extra["peak_moment"] == "last_layer_backward"
    assert not any(t.kind is Kind.LOGITS for t in r.result.estimate.terms)
    assert not logits_dominate(r.result.estimate) and not r.fits
    rec = r.result.recommendation
    assert all(c is None or c.workload.loss is Loss.DEFAULT for c in (rec.cheapest, rec.lossless))
