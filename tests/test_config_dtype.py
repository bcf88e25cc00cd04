"""A config.json whose torch_dtype memest does not know is refused where the config is read, naming
the config (not ``--dtype``), for a serving and a training job alike."""

import json
import os

import pytest
from conftest import TINY_LLAMA
from inprocess import run_memest

from memest.errors import ConfigError
from memest.sources import spec_from_config
from memest.sources.config import HFConfig

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "MEMEST_DEBUG": ""}
MESSAGE = "config.json torch_dtype 'float99' is not a dtype memest knows"


@pytest.fixture
def float99(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY_LLAMA, "torch_dtype": "float99"}))
    return path


@pytest.mark.parametrize("job", [(), ("--serve",), ("--train",), ("--finetune", "lora")])
def test_cli_refuses_unknown_config_dtype(float99, job) -> None:
    result = run_memest("hf", str(float99), *job, env=ENV)
    assert result.returncode == 2, result.stdout
    assert MESSAGE in result.stderr
    assert "--dtype" not in result.stderr  # the value is the config's, not a flag's
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])  # "dtype": transformers 5's name of the field
def test_spec_refuses_unknown_config_dtype(key) -> None:
    raw = {k: v for k, v in TINY_LLAMA.items() if k != "torch_dtype"} | {key: "float99"}
    with pytest.raises(ConfigError, match="torch_dtype 'float99'"):
        spec_from_config(HFConfig(raw, name="tiny", source="test"))


@pytest.mark.parametrize("stated", ["bfloat16", "float16", "float32", "torch.float16", "bf16"])
def test_known_config_dtypes_are_kept(stated) -> None:
    spec = spec_from_config(HFConfig({**TINY_LLAMA, "torch_dtype": stated}, name="tiny", source="test"))
    assert spec.torch_dtype == stated
