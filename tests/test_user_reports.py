"""Problems a new user met with memest, each reproduced as the user met it (CLI in-process, or the Python API)."""

from __future__ import annotations

import pytest

import memest
from inprocess import run_memest


@pytest.mark.parametrize("model", [None, 123, 1.5, ["gpt2"]])
@pytest.mark.parametrize("call", [
    lambda m: memest.estimate_memory(m),
    lambda m: memest.plan_memory(m, gpus_available="1xH100"),
    lambda m: memest.sweep_memory(m, max_model_len="1k..2k"),
])
def test_a_model_that_is_no_reference_is_an_input_error(call, model):
    with pytest.raises(memest.InputError) as info:
        call(model)
    assert info.value.field == "model" and repr(model) in str(info.value)


HF_FIXED = ("--engine", "hf", "--prompt-len", "100", "--max-new-tokens", "100")


@pytest.mark.parametrize("args", [
    ("plan", "meta-llama/Llama-3.1-8B", *HF_FIXED, "--gpus-available", "1xH100"),
    ("plan", "meta-llama/Llama-3.1-8B", *HF_FIXED, "--gpus-available", "1xH100", "--max-model-len", "4096"),
    ("sweep", "meta-llama/Llama-3.1-8B", *HF_FIXED, "--max-model-len", "1k..4k"),
])
def test_hf_prompt_and_new_tokens_are_held_by_the_max_model_len_search(args):
    # memest hf takes these flags (test_hf_takes_the_same_flags); the planner's largest-max_model_len search must start at
    # prompt_len + max_new_tokens = 200, not at 1 (which the hf workload refuses)
    r = run_memest(*args)
    assert r.returncode == 0, r.stderr


def test_the_max_model_len_search_starts_where_the_prompt_and_new_tokens_fit():
    from memest.devices import get_device
    from memest.planning.maxfit import largest, query_start
    from memest.sources import load_config, spec_from_config
    from memest.workload.resolve import complete, resolve

    spec = spec_from_config(load_config("meta-llama/Llama-3.1-8B"))
    device = get_device("H100")
    w = resolve(complete({"engine": "hf", "prompt_len": 100, "max_new_tokens": 100}), spec, device)
    assert query_start(w, "max_model_len") == 200  # 100 + 100
    # only max_new_tokens: a prompt needs at least one token, 1 + 100
    assert query_start(w.replace(prompt_len=None), "max_model_len") == 101
    found = largest(spec, w, device, "max_model_len", headroom=0.1)
    assert found.value is not None and found.value >= 200


def test_hf_takes_the_same_flags():
    assert run_memest("hf", "meta-llama/Llama-3.1-8B", *HF_FIXED, "--gpu", "H100").returncode == 0
