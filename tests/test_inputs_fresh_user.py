"""Defects a fresh user found in memest's inputs, readers and errors (lead's brief to branch fixB): each test
reproduces one defect and fails without its fix. Expected values are derived by hand in the comments from the
sources named there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from inprocess import run_memest

from memest.devices import get_device
from memest.sources import load_model
from memest.workload import Method, Precision, files
from memest.workload.resolve import resolve

A100 = get_device("A100-80GB")
MISTRAL = "mistralai/Mistral-7B-v0.1"


@pytest.fixture(scope="module")
def mistral():
    return load_model(MISTRAL)


def _write(folder: Path, name: str, text: str) -> str:
    path = folder / name
    path.write_text(text)
    return str(path)


# --- 1. the frozen base's dtype from the recipe -------------------------------------------------------------

LORA_RECIPE = """model_name_or_path: mistralai/Mistral-7B-v0.1
torch_dtype: bfloat16
use_peft: true
lora_r: 16
bf16: true
per_device_train_batch_size: 1
max_seq_length: 1024
"""


@pytest.mark.parametrize("key", ["torch_dtype: bfloat16", "dtype: bfloat16",
                                 "model_init_kwargs:\n  torch_dtype: bfloat16", "model_init_kwargs:\n  dtype: bfloat16"])
def test_trl_lora_recipe_loads_its_base_at_the_named_dtype(tmp_path, mistral, key):
    # alignment-handbook ModelArguments.torch_dtype / trl ModelConfig.dtype (trl/trainer/model_config.py at
    # f2cd57710) / SFTConfig.model_init_kwargs go to from_pretrained: the frozen base is bf16, 2 B per parameter
    # (memest's bf16 recipe: weights 2 B), not the 4 B of an fp32 load under autocast (amp)
    text = LORA_RECIPE.replace("torch_dtype: bfloat16", key)
    t = resolve({"config": [_write(tmp_path, "config_lora.yaml", text)]}, mistral, A100)
    assert (t.method, t.precision) == (Method.LORA, Precision.BF16)


def test_trl_lora_recipe_weights_term_says_two_bytes(tmp_path):
    out = run_memest("hf", "--config", _write(tmp_path, "config_lora.yaml", LORA_RECIPE), "--gpu", "A100-80GB",
                     "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    weights = next(t for t in doc["terms"] if t["name"] == "weights")
    assert "frozen base x 2 B" in weights["formula"]
    # Mistral-7B: 7,241,732,096 parameters (its safetensors index: 14,483,464,192 bf16 bytes / 2); a bf16 base
    # holds about 7.24e9 x 2 = 14.48e9 bytes, an fp32 one 28.97e9: the term must be near the first
    assert 14.4e9 < weights["bytes"] < 15.0e9


def test_hf_trainer_recipe_without_a_dtype_keeps_fp32():
    # a bare TrainingArguments recipe (no torch_dtype): transformers 4.57 from_pretrained loads fp32 and bf16
    # autocasts over it (amp)
    doc = {"model_name_or_path": MISTRAL, "per_device_train_batch_size": 1, "bf16": True}
    assert files.read_data(doc, "TrainingArguments").values["precision"] is Precision.AMP


def test_llamafactory_lora_base_is_16_bit(tmp_path, mistral):
    # LLaMA-Factory v0.9.3 patch_config loads at compute_dtype (bf16 under bf16: true), v0.9.4+ at the
    # checkpoint's (bf16); init_adapter casts only the trained adapters to fp32: a bf16 frozen base
    text = ("model_name_or_path: mistralai/Mistral-7B-v0.1\nstage: sft\nfinetuning_type: lora\nlora_target: all\n"
            "cutoff_len: 1024\nper_device_train_batch_size: 1\nbf16: true\n")
    t = resolve({"config": [_write(tmp_path, "lf_lora.yaml", text)]}, mistral, A100)
    assert (t.method, t.precision) == (Method.LORA, Precision.BF16)


def test_llamafactory_full_keeps_fp32_trained_params(tmp_path, mistral):
    # a full fine-tune trains every parameter, and init_adapter casts them all to fp32 under autocast: amp
    text = ("model_name_or_path: mistralai/Mistral-7B-v0.1\nstage: sft\nfinetuning_type: full\n"
            "cutoff_len: 1024\nper_device_train_batch_size: 1\nbf16: true\n")
    t = resolve({"config": [_write(tmp_path, "lf_full.yaml", text)]}, mistral, A100)
    assert (t.method, t.precision) == (Method.FULL, Precision.AMP)


def test_axolotl_lora_base_is_bf16(tmp_path, mistral):
    # axolotl normalize_config: bf16 -> cfg.torch_dtype bfloat16; loaders/model.py passes it to from_pretrained
    text = ("base_model: mistralai/Mistral-7B-v0.1\nadapter: lora\nlora_r: 16\nsequence_len: 1024\n"
            "micro_batch_size: 1\nbf16: true\n")
    t = resolve({"config": [_write(tmp_path, "axolotl_lora.yml", text)]}, mistral, A100)
    assert (t.method, t.precision) == (Method.LORA, Precision.BF16)


# --- 3. every bad input from the public API is an InputError with a field -----------------------------------

def test_unknown_device_is_an_input_error_naming_gpu():
    import memest

    with pytest.raises(memest.InputError) as info:
        memest.estimate_memory("meta-llama/Llama-3.1-8B", gpu="nosuch")
    assert info.value.field == "gpu" and isinstance(info.value, LookupError)
    assert "'nosuch'" in str(info.value)


def test_unknown_model_is_an_input_error_naming_model(monkeypatch):
    import memest

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(memest.InputError) as info:
        memest.estimate_memory("./no/such/folder", gpu="A100-80GB")
    assert info.value.field == "model" and isinstance(info.value, LookupError)


def test_the_cli_still_exits_2_on_an_unknown_device():
    out = run_memest("hf", "meta-llama/Llama-3.1-8B", "--gpu", "nosuch")
    assert out.returncode == 2 and out.stderr.startswith("Error: unknown device 'nosuch'"), out.stderr
