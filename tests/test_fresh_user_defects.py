"""Defects a new user met: the catalog's "GB" against a typed size (memest gpus), CUDA graphs counted for
vLLM on AWS Neuron, and a one-value flag given twice silently taking the last value."""

from __future__ import annotations

import os

import pytest

from memest.devices import get_device
from memest.estimate import estimate
from memest.sources import load_model
from memest.workload import ServingConfig
from tests.inprocess import run_memest

WIDE = {**os.environ, "COLUMNS": "400"}


def test_gpus_says_catalog_gb_is_read_as_gib_and_a_typed_size_is_exact() -> None:
    out = run_memest("gpus", env=WIDE)
    assert out.returncode == 0
    assert "nominal = the vendor's \"GB\" read as GiB" in out.stdout
    assert "--gpu 32GB = 32 x 10^9 B (29.80 GiB)" in out.stdout  # 32e9 / 2^30 = 29.802
    assert "32GB is 32 x 10^9 B" in run_memest("gpus", "--help", env=WIDE).stdout
    # the two readings side by side: the catalog's 48 "GB" card is 48 x 2^30 B, a typed 48GB is 48 x 10^9 B
    assert get_device("RTX-A6000").memory_bytes == 48 * 2**30
    assert get_device("48GB").memory_bytes == 48 * 10**9


@pytest.mark.parametrize(("gpu", "graphs"), [("Inferentia2", False), ("Trainium2", False), ("TPU-v5e", False),
                                             ("Gaudi2", False), ("H100", True), ("MI300X", True)])
def test_vllm_graph_pool_only_where_there_are_cuda_or_hip_graphs(gpu: str, graphs: bool) -> None:
    # Neuron compiles the model ahead of time (neuronx), a TPU through XLA: no CUDA-graph pool to count
    est = estimate(load_model("Qwen/Qwen2.5-0.5B"), ServingConfig(max_model_len=4096), get_device(gpu))
    assert ("runtime.cuda_graphs" in {t.name for t in est.terms}) is graphs


@pytest.mark.parametrize(("flag", "args"), [
    ("--gpu", ["hf", "meta-llama/Llama-3.1-8B", "--gpu", "A100", "--gpu", "H100"]),
    ("--gpu", ["hf", "meta-llama/Llama-3.1-8B", "--gpu=A100", "--gpu", "H100"]),
    ("--max-model-len", ["plan", "meta-llama/Llama-3.1-8B", "--max-model-len", "1024", "--max-model-len", "2048"]),
], ids=["hf-gpu", "hf-gpu-equals", "plan-max-model-len"])
def test_a_one_value_flag_given_twice_is_refused(flag: str, args: list[str]) -> None:
    out = run_memest(*args, env=WIDE)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and f"{flag} was given more than once" in out.stderr


def test_switches_and_repeatable_options_may_repeat() -> None:
    out = run_memest("hf", "meta-llama/Llama-3.1-8B", "--serve", "--serve", "--gpu", "H100", "--json", env=WIDE)
    assert out.returncode == 0, out.stderr
