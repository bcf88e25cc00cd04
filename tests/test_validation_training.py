"""Every training case of benchmarks/data/validation_cases.json (kinds train_full, train_multi_gpu, lora,
qlora) against memest, like with like.

The mapping from each case's published settings to memest's inputs, and the metric compared, live
in ``memest/validation/training.py`` (``benchmarks/training_cases.py`` writes its report ``benchmarks/training_cases.md``).
Expected values are the published figures. Tolerances: HIGH_TOLERANCE (10%) for tensor-byte figures
of high-confidence cases, DEVICE_TOLERANCE (15%) for reserved / nvidia-smi figures (allocator slack
is a fixed share in memest), MEDIUM_TOLERANCE (25%) for medium-confidence cases, which are sanity
checks. Cases memest does not yet reproduce are marked xfail with the reason; the report lists their
errors too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memest.validation import training as tc
from memest.validation.cases import load_cases

REPORT = Path(__file__).resolve().parents[1] / "benchmarks" / "training_cases.md"

KNOWN_GAPS = {
    "ds_gist_llama7b_zero2_bs1_ckpt": "over-prediction: the gist's ZeRO-2 figures fit a first-iteration reading "
    "(steady 19.4 GB = 2P + 4P/N + 2P/N + bucket, before the lazily created Adam states); memest is steady state",
    "ds_gist_llama7b_zero3_bs4_ckpt_offload_optimizer_param": "over-prediction: the row's peak above its steady "
    "memory (7.9 - 2.2 = 5.7 GB at 4 x 4096 tokens) is below the layer checkpoints and fp32 loss path of 4 x 4096 "
    "tokens that the bs8 row of the same code shows (21.4 GB above steady, memest within 1%); DeepSpeed's "
    "offload_param keeps only the gathered working set and the IPG bucket on the GPU (already counted) and "
    "nothing that shrinks activations: the row reads as bs 2 (memest +11.7% there; benchmarks/offload_findings.md)",
    "ds_gist_llama7b_zero3_bs8_ga2_ckpt": "under-prediction: 24.8 GB above the same run at grad_accum 1 (bs8/64); "
    "DeepSpeed 0.19.5 stage3.py partition_grads accumulates micro-batches into the existing gradient partition, "
    "so memest's figure does not move; the mechanism of the gist's (0.14.2) growth is not identified",
    "torchtitan_llama31_70b_fsdp32_tp8": "torch.compile + float8 + TP with DTensor sequence parallel: 17 GiB above "
    "memest's terms are unaccounted for",
    **{f"litgpt_{m}_qlora_a10g": "under-prediction: litgpt 0.4 QLoRA (bitsandbytes 0.42) keeps 1.0-2.6 GB more than "
       "memest's terms at the loss backward (MatMul4Bit's saved inputs, the NF4 lm_head's dequantized copies and "
       "litgpt's own lm_head are modelled), about 16 B x hidden per token per layer in every row; the mechanism "
       "is not identified" for m in ("falcon7b", "llama27b", "mistral7b", "mistral7bv02", "phi3")},
}

ROWS = tc.rows()


def test_every_training_case_is_compared():
    published = {c["id"] for c in load_cases(*tc.KINDS)}
    compared = {r.case.id.split("@")[0] for r in ROWS}
    assert compared == published


@pytest.mark.parametrize("row", ROWS, ids=[r.case.id for r in ROWS])
def test_case_within_tolerance(row):
    if row.case.id in KNOWN_GAPS and abs(row.error) > row.case.tolerance:
        pytest.xfail(KNOWN_GAPS[row.case.id])
    assert abs(row.error) <= row.case.tolerance, (
        f"{row.case.id}: memest {row.predicted_bytes / tc.GiB:.2f} GiB vs measured "
        f"{row.case.measured_bytes / tc.GiB:.2f} GiB ({row.error:+.1%}, moment {row.estimate.extra['peak_moment']})"
    )


def test_median_error_goal():
    """The earlier goal: median |error| <= 5% over the published training cases."""
    assert tc.summary(ROWS)["median_abs_error"] <= 0.05


@pytest.mark.xfail(strict=True, reason="median 4.8% over 50 cases: the mechanisms named in KNOWN_GAPS and the "
                   "torchtune rows' compiled layers are missing")
def test_median_error_goal_of_issue_14():
    """Issue 14's goal: median |error| <= 3% over the published training cases."""
    assert tc.summary(ROWS)["median_abs_error"] <= 0.03


def test_report_is_current():
    """benchmarks/training_cases.md is what the script generates now."""
    report = REPORT.read_text()
    assert report.startswith(tc.markdown(ROWS))
