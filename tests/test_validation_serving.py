"""Every serve case of benchmarks/data/validation_cases.json against memest, figure by figure.

Expected values are the published measurements (vLLM start-up logs, the transformers docs); the
predictions come from memest/validation/serving.py (benchmarks/serving_cases.py writes benchmarks/serving_cases.md).
Like with like: vLLM's logged weights, activation peak, available KV memory, KV tokens/blocks and
maximum concurrency against the same quantities of vLLM's arithmetic; peak allocated against peak
allocated for transformers generate.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("MEMEST_OFFLINE", "1")  # no Hub in tests: uncatalogued models skip

from memest.errors import MemestError
from memest.validation import serving as cases_module

WEIGHTS_TOLERANCE = 0.01
"""Weights within 1% (the issue's goal)."""
KV_TOLERANCE = 0.03
"""KV tokens, blocks, available KV memory and maximum concurrency within 3% of vLLM's log."""
ACTIVATION_TOLERANCE = 0.05
"""The profiled activation peak (1-2.3 GiB) within 5%; it moves the KV pool by < 0.2%."""
NON_TORCH_TOLERANCE = 0.05
"""Non-torch memory is a measured constant per tp (see memest.estimate.serving.vllm.budget.NON_TORCH_INCREASE)."""
BUDGET_TOLERANCE = 0.005
"""gpu_memory_utilization x capacity is exact up to the log's rounding."""
GENERATE_TOLERANCE = 0.05
"""Peak allocated during transformers generate within 5% (the issue's goal)."""

TOLERANCES = {
    "weights_GiB": WEIGHTS_TOLERANCE, "tp2_weights_per_gpu_GiB": WEIGHTS_TOLERANCE,
    "torch_activation_peak_increase_GiB": ACTIVATION_TOLERANCE, "activation_peak_GiB": ACTIVATION_TOLERANCE,
    "tp2_activation_peak_GiB": ACTIVATION_TOLERANCE,
    "non_torch_forward_increase_GiB": NON_TORCH_TOLERANCE, "non_torch_memory_GiB": NON_TORCH_TOLERANCE,
    "tp2_non_torch_per_gpu_GiB": NON_TORCH_TOLERANCE,
    "instance_budget_GiB": BUDGET_TOLERANCE,
    "available_kv_cache_GiB": KV_TOLERANCE, "kv_cache_tokens": KV_TOLERANCE, "kv_cache_blocks": KV_TOLERANCE,
    "max_concurrency_x_at_max_model_len": KV_TOLERANCE,
    "llama2_7b_tp1_num_gpu_blocks_after_fix": KV_TOLERANCE,
    "llama2_70b_tp4_4xA100_num_gpu_blocks_after_fix": KV_TOLERANCE,
    "peak_allocated_GiB": GENERATE_TOLERANCE,
}


def _params() -> list:
    out = []
    for case in cases_module.load_cases():
        if case["id"] in cases_module.NOT_MODELLED:
            out.append(pytest.param(case, None, id=f"{case['id']}-not-modelled",
                                    marks=pytest.mark.skip(reason=cases_module.NOT_MODELLED[case["id"]])))
            continue
        try:
            rows = cases_module.comparisons(case)
        except MemestError as exc:
            out.append(pytest.param(case, None, id=f"{case['id']}-unavailable",
                                    marks=pytest.mark.skip(reason=f"model not loadable offline yet: {exc}")))
            continue
        for row in rows:
            out.append(pytest.param(case, row, id=f"{case['id']}-{row.figure}"))
    return out


@pytest.mark.parametrize(("case", "row"), _params())
def test_serving_case(case: dict, row) -> None:
    tolerance = TOLERANCES[row.figure]
    assert abs(row.error) <= tolerance, (
        f"{row.case} {row.figure}: predicted {row.predicted:.4f} vs measured {row.measured} "
        f"({row.error:+.2%}, tolerance {tolerance:.0%})"
    )


def test_every_serve_case_is_reported() -> None:
    """The benchmark report lists every serve case (modelled, not yet loadable, or not modelled)."""
    text = (Path(__file__).resolve().parent.parent / "benchmarks" / "serving_cases.md").read_text()
    for case in cases_module.load_cases():
        assert case["id"] in text
