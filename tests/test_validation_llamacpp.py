"""Every llama.cpp / Ollama case of benchmarks/data/llamacpp_cases.json (the llama.cpp / Ollama cases
of the shared validation/engines.json) against memest, figure by figure.

Expected values are the logged figures (case ids as pytest ids); predictions come from
benchmarks/llamacpp_cases.py, which also writes benchmarks/llamacpp_cases.md. Tolerances: model
buffers, file sizes and weights within 1%; KV, output and compute buffers, Ollama's graph and
required totals within 2%. Ollama prints GiB with one decimal, so its GiB figures carry up to
0.05 GiB of rounding (graph_partial 1.3 GiB: 3.8%); they still meet 2%.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("MEMEST_OFFLINE", "1")

_spec = importlib.util.spec_from_file_location(
    "llamacpp_cases", Path(__file__).resolve().parent.parent / "benchmarks" / "llamacpp_cases.py")
assert _spec and _spec.loader
cases_module = importlib.util.module_from_spec(_spec)
sys.modules["llamacpp_cases"] = cases_module
_spec.loader.exec_module(cases_module)

WEIGHTS_TOLERANCE = 0.01
"""Model buffers, file size and bits per weight, Ollama's weights: within 1% (the issue's goal)."""
BUFFER_TOLERANCE = 0.02
"""KV, output and compute buffers, Ollama's KV / graph / required totals: within 2%."""


def _tolerance(key: str) -> float:
    weights = ("model_buffer", "file_size", "file_bpw", "weights_")
    return WEIGHTS_TOLERANCE if any(w in key for w in weights) else BUFFER_TOLERANCE


def _params() -> list:
    out = []
    for f in cases_module.figures():
        reason = cases_module.UNMODELLED.get((f.case, f.key))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(f, id=f"{f.case}-{f.key}", marks=marks))
    return out


@pytest.mark.parametrize("figure", _params())
def test_logged_figure(figure):
    tol = _tolerance(figure.key)
    assert abs(figure.error) <= tol, (f"{figure.case} {figure.key}: memest {figure.predicted:.3f}, logged "
                                      f"{figure.measured:g} ({figure.error:+.2%}, tolerance {tol:.0%})")


def test_every_case_is_compared():
    """Each of the 8 llama.cpp and 1 Ollama cases contributes figures (none silently skipped)."""
    cases = cases_module.load_cases()
    assert sum(c["engine"] == "llama.cpp" for c in cases) == 8
    assert sum(c["engine"] == "ollama" for c in cases) == 1
    compared = {f.case for f in cases_module.figures()}
    assert compared == {c["id"] for c in cases}


def test_ollama_layer_split_as_logged():
    """ollama_pr12000_gemma3_12b_cuda_offload_estimate: 'layers.offload=48' of 'layers.model=49' on
    11.1 GiB (with the logged projector as input: the output layer + projector no longer fit)."""
    case = next(c for c in cases_module.load_cases() if c["engine"] == "ollama")
    pred = cases_module.predict(case)
    offload, model = case["measured"]["layers_offloaded"].split("/")
    assert pred["layers_offloaded"] == int(offload) == 48
    assert int(model) == 49


def test_pythia_q4_k_m_tensor_types_as_logged():
    """llamacpp_b4715_pythia28b_q4_k_v100 logs 'type q4_K: 81, q5_K: 32, q6_K: 17, f32: 258'."""
    from memest.estimate.serving.llamacpp.quant import quantized_tensors, type_counts

    case = next(c for c in cases_module.load_cases() if c["id"] == "llamacpp_b4715_pythia28b_q4_k_v100")
    counts = type_counts(quantized_tensors(cases_module._spec(case), "q4_k_m"))
    assert counts == {"f32": 258, "q4_K": 81, "q5_K": 32, "q6_K": 17}
