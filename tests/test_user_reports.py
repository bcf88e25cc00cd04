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
