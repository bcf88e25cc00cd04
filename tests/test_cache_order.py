"""An estimate does not depend on what was estimated before it in the same process.

``plan`` and ``sweep`` estimate thousands of setups of one model in one process, and the estimator
remembers results it has computed (``memest.memo``). This estimates a grid of setups of a dense and
of a mixture-of-experts model (tp / pp / dp / ep / ZeRO stage / framework / precision / recompute /
full, LoRA, QLoRA, and serving) three ways: each in a fresh cache state, all in grid order, and all
in reverse order, and again with equal but distinct spec objects, and requires every estimate (every
rank's terms: name, kind, bytes, formula; the counts, peaks, assumptions, host bytes) to be the same
each time.

The defect it would have caught (issue 11): the activations were remembered without the expert-
parallel degree, so Qwen3-30B-A3B with ``--ep 8`` after the same job with ``--ep 1`` reported the
``--ep 1`` autocast weight copies (60,416,327,680 B instead of 9,682,026,496 B).
"""

from __future__ import annotations

import itertools

from memest import memo
from memest.devices import get_device
from memest.errors import InputError
from memest.estimate import estimate
from memest.sources import load_model
from memest.workload import (
    Engine,
    Framework,
    Method,
    Offload,
    Parallelism,
    Precision,
    Recompute,
    ServingConfig,
    TrainingConfig,
    validate,
)

DENSE = load_model("meta-llama/Llama-3.2-1B")
MOE = load_model("Qwen/Qwen3-30B-A3B")
H100 = get_device("H100-80GB")

# (tp, pp, dp, ep, zero_stage)
LAYOUTS = [(1, 1, 1, 1, 0), (1, 1, 8, 1, 3), (1, 1, 8, 8, 3), (2, 1, 4, 4, 3), (1, 2, 4, 2, 1), (2, 2, 2, 1, 2),
           (1, 1, 8, 8, 2)]
RECIPES = [(Method.FULL, Precision.AMP), (Method.FULL, Precision.MIXED), (Method.LORA, Precision.AMP),
           (Method.QLORA, Precision.MIXED)]
FRAMEWORKS = [Framework.AUTO, Framework.FSDP]
RECOMPUTES = [Recompute.NONE, Recompute.FULL, Recompute.SELECTIVE]


def _grid():
    jobs = []
    for spec in (DENSE, MOE):
        for (tp, pp, dp, ep, zero), (method, precision), fw, recompute in itertools.product(
                LAYOUTS, RECIPES, FRAMEWORKS, RECOMPUTES):
            if ep > 1 and not spec.num_experts:
                continue
            w = TrainingConfig(method=method, precision=precision, framework=fw, recompute=recompute,
                               micro_batch_size=2, seq_len=1024, grad_accum_steps=2,
                               parallelism=Parallelism(tp=tp, pp=pp, dp=dp, ep=ep, zero_stage=zero))
            jobs.append((spec, w))
        # the step in backward, activation offloading and FSDP CPU offload beside the same jobs without them
        for fw, dp, zero in ((Framework.PYTORCH, 1, 0), (Framework.FSDP, 8, 3)):
            base = TrainingConfig(precision=Precision.BF16, framework=fw, recompute=Recompute.FULL, micro_batch_size=2,
                                  seq_len=1024, parallelism=Parallelism(dp=dp, zero_stage=zero))
            jobs += [(spec, base.replace(**kw)) for kw in ({"optimizer_in_bwd": True}, {"activation_offloading": True},
                                                           {"offload": Offload.PARAMS}, {})]
        for tp, pp, engine in itertools.product((1, 2), (1, 2), (Engine.VLLM, Engine.HF)):
            jobs.append((spec, ServingConfig(max_model_len=4096, batch_size=4, engine=engine,
                                             parallelism=Parallelism(tp=tp, pp=pp))))
    valid = []
    for spec, w in jobs:
        try:
            validate(spec, w)
        except InputError:  # a combination the CLI refuses
            continue
        valid.append((spec, w))
    return valid


GRID = _grid()


def _summary(e):
    """Everything an estimate reports, as plain comparable values."""
    ranks = tuple((r.label, r.count, r.device_used_bytes, tuple((t.name, t.kind, t.bytes, t.formula) for t in r.terms))
                  for r in e.ranks)
    return ranks, e.assumptions, e.host_bytes, sorted(e.extra.items()), e.serving


def _in_order(jobs):
    memo.clear_all()
    return {n: _summary(estimate(spec, w, H100)) for n, spec, w in jobs}


def test_grid_is_large_and_mixed():
    kinds = {(spec.name, type(w).__name__) for spec, w in GRID}
    assert len(kinds) == 4
    assert sum(isinstance(w, TrainingConfig) and w.parallelism.ep > 1 for _, w in GRID) >= 20
    assert len(GRID) >= 150


def test_estimates_do_not_depend_on_order():
    numbered = [(n, spec, w) for n, (spec, w) in enumerate(GRID)]
    forward = _in_order(numbered)
    backward = _in_order(numbered[::-1])
    for n, spec, w in numbered:
        assert forward[n] == backward[n], (spec.name, w)
    # one at a time, each after a cleared memory (every third: enough to pin both orders)
    for n, spec, w in numbered[::3]:
        memo.clear_all()
        assert _summary(estimate(spec, w, H100)) == forward[n], (spec.name, w)


def test_an_equal_spec_loaded_again_gets_the_same_estimates():
    """Results are remembered per value: a second, equal ModelSpec object finds what the first left, and
    must get the estimates the first got (the estimator compares a spec's own layers and tensors by
    identity, so nothing remembered may hand it another spec's objects)."""
    numbered = [(n, spec, w) for n, (spec, w) in enumerate(GRID)]
    first = _in_order(numbered)
    again = {DENSE.name: load_model(DENSE.name), MOE.name: load_model(MOE.name)}
    assert all(again[s.name] == s and again[s.name] is not s for s in (DENSE, MOE))
    # half of the setups with the first objects, then every setup with the second: those of the other half
    # find only what the first objects' estimates left below the whole-setup level (stage splits, layer
    # groups, per-layer activations)
    _in_order(numbered[::2])
    for n, spec, w in numbered:
        assert _summary(estimate(again[spec.name], w, H100)) == first[n], (spec.name, w)


def test_expert_parallel_autocast_copies_after_ep1():
    """Qwen3-30B-A3B, amp, FSDP full shard, 8 GPUs: the autocast copies of every linear weight, 2 B each.

    Per layer: q 32 x 128 x 2048 = 8,388,608, k and v 4 x 128 x 2048 = 1,048,576 each, o 8,388,608
    (attention 18,874,368); routed experts 128 x 3 x 768 x 2048 = 603,979,776 (the router is not a
    cast linear). 48 layers; lm_head 151,936 x 2048 = 311,164,928.
    ep 1: (18,874,368 + 603,979,776) x 48 + 311,164,928 = 30,208,163,840 elements -> 60,416,327,680 B.
    ep 8: (18,874,368 + 603,979,776 / 8) x 48 + 311,164,928 = 4,841,013,248 elements -> 9,682,026,496 B.
    """
    def job(ep):
        return TrainingConfig(precision=Precision.AMP, framework=Framework.FSDP,
                              parallelism=Parallelism(dp=8, ep=ep, zero_stage=3))

    def copies(ep):
        return estimate(MOE, job(ep), H100).per_device.term("workspace.autocast_weights").bytes

    memo.clear_all()
    assert copies(1) == 60_416_327_680
    assert copies(8) == 9_682_026_496
    assert copies(1) == 60_416_327_680
