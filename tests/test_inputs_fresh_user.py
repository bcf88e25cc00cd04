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


# --- 4. a config file's bad value is named by the file and key ---------------------------------------------

def _refused(*argv: str, cwd: Path | None = None) -> str:
    import os

    if cwd is not None:
        old = Path.cwd()
        os.chdir(cwd)
    try:
        out = run_memest(*argv)
    finally:
        if cwd is not None:
            os.chdir(old)
    assert out.returncode == 2, (out.returncode, out.stderr)
    return out.stderr.strip().splitlines()[-1]


def test_a_deepspeed_stage_out_of_range_names_the_file_and_key(tmp_path):
    # no --zero-stage was given: the 5 is ds5.json's zero_optimization.stage, on its line 1
    ds = _write(tmp_path, "ds5.json", '{"zero_optimization": {"stage": 5}}')
    line = _refused("hf", MISTRAL, "--config", ds)
    assert line == "Error: ds5.json:1: zero_optimization.stage is 5; it must be 0, 1, 2 or 3", line


def test_a_recipe_value_out_of_range_names_its_key(tmp_path):
    recipe = _write(tmp_path, "mb0.yaml", f"model_name_or_path: {MISTRAL}\nper_device_train_batch_size: 0\n")
    line = _refused("hf", "--config", recipe)
    assert line.startswith("Error: mb0.yaml:2: per_device_train_batch_size is 0;") and "--micro-batch-size" not in line


def test_a_flag_given_is_still_named_as_the_flag(tmp_path):
    ds = _write(tmp_path, "ds.json", '{"zero_optimization": {"stage": 2}}')
    line = _refused("hf", MISTRAL, "--config", ds, "--zero-stage", "5")
    assert "--zero-stage" in line and "ds.json" not in line, line


@pytest.mark.parametrize(("text", "words"), [("", "is empty"), ("# only a comment\n\n", "is empty (comments only)")])
def test_an_empty_config_says_it_is_empty(tmp_path, text, words):
    line = _refused("hf", MISTRAL, "--config", _write(tmp_path, "empty.yaml", text))
    assert f"empty.yaml: {words};" in line and "not a format" not in line, line


def test_a_binary_config_says_it_is_not_text(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")  # byte 0 (0x89) is no UTF-8 start byte
    line = _refused("hf", MISTRAL, "--config", str(path))
    assert "model.bin: not a text file" in line and "UnicodeDecodeError" not in line, line


def test_a_bad_config_json_is_named_by_its_file(tmp_path):
    folder = tmp_path / "fresh"
    folder.mkdir()
    (folder / "badheads.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 0,
        "intermediate_size": 11008, "vocab_size": 32000}))
    line = _refused("hf", "badheads.json", cwd=folder)
    assert "badheads.json" in line and "'num_attention_heads' is 0" in line and "'fresh'" not in line, line


# --- 5. suggestions: a quantized checkpoint's base model, a bare number's size ---------------------------------

@pytest.mark.parametrize(("ref", "base", "quantization"), [
    ("Qwen/Qwen2.5-7B-Instruct-AWQ", "Qwen/Qwen2.5-7B-Instruct", "awq"),
    ("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4", "Qwen/Qwen2.5-7B-Instruct", "gptq"),
    ("Qwen/Qwen2.5-7B-FP8", "Qwen/Qwen2.5-7B", "fp8"),
    ("unsloth/Llama-3.1-8B-Instruct-bnb-4bit", "meta-llama/Llama-3.1-8B-Instruct", "nf4"),
])
def test_a_quantized_checkpoint_suggests_its_base_and_the_quantization(monkeypatch, ref, base, quantization):
    # the name less its quantized ending is a catalog model: suggest it with the quantization the ending names
    import memest

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(memest.InputError) as info:
        memest.estimate_memory(ref, mode="serve", gpu="A100-80GB")
    assert f"pass {base!r} with quantization {quantization}" in str(info.value), str(info.value)
    assert "VL" not in str(info.value)


def test_the_cli_names_the_quantization_flag(monkeypatch):
    import os

    out = run_memest("hf", "Qwen/Qwen2.5-7B-Instruct-AWQ", "--serve", env=dict(os.environ) | {"HF_HUB_OFFLINE": "1"})
    assert out.returncode == 2 and "'Qwen/Qwen2.5-7B-Instruct' with --quantization awq" in out.stderr, out.stderr


def test_a_bare_number_suggests_sizes():
    from memest.devices import get_device
    from memest.errors import UnknownDeviceError

    with pytest.raises(UnknownDeviceError) as info:
        get_device("48")
    assert "did you mean '48GB' or '48GiB'?" in str(info.value) and "T4" not in str(info.value)


# --- 6. an engine that does not run on the device names the engines that do ---------------------------------

def test_apple_suggests_the_engines_that_run_there():
    # ENGINE_VENDORS: apple is listed by llama.cpp and ollama; hf (not listed) runs on every device; vLLM,
    # SGLang and TensorRT-LLM list no apple
    line = _refused("hf", "meta-llama/Llama-3.1-8B", "--serve", "--gpu", "M4-Max-128GB")
    assert "use --engine llama.cpp, --engine ollama or --engine hf" in line, line


def test_a_tpu_with_llamacpp_suggests_vllm_and_hf():
    # google is listed by vllm only among the serving engines; hf runs anywhere
    line = _refused("hf", "meta-llama/Llama-3.1-8B", "--serve", "--gpu", "TPU-v5e", "--engine", "llama.cpp")
    assert "use --engine vllm or --engine hf," in line and "ollama" not in line, line


# --- 7. -ngl -1 and -ngl 999 mean every layer ----------------------------------------------------------------

def _gguf_estimate(n_gpu_layers, engine="llama.cpp"):
    import memest

    return memest.estimate_memory("meta-llama/Llama-3.1-8B", mode="serve", engine=engine, gpu="RTX-4090",
                                  n_gpu_layers=n_gpu_layers).to_dict()


@pytest.mark.parametrize("ngl", [-1, 999])
def test_all_layers_idioms_offload_every_layer(ngl):
    # Llama-3.1-8B: 32 layers + the output layer = 33; llama.cpp common/arg.cpp (145b6280) keeps -ngl -1 as
    # "use the default" (every layer), and a count above 33 offloads all 33: the same estimate as -ngl 33
    every = _gguf_estimate(33)
    out = _gguf_estimate(ngl)
    assert out["per_device"] == every["per_device"]
    assert any("-ngl 33 (33/33 layers on the GPU)" in a for a in out["assumptions"])
    assert any(f"n_gpu_layers {ngl}" in n for n in out["workload"]["config_notes"])


def test_other_negative_layer_counts_are_still_refused():
    import memest

    with pytest.raises(memest.InputError, match="n_gpu_layers -2 is outside 0..33"):
        _gguf_estimate(-2)


# --- 8. a sweep range ends at its end ------------------------------------------------------------------------

def test_a_sweep_range_includes_its_end():
    # 1k..1000k doubles from 1,024 (k = 1024): 1k, 2k, ... 512k = 524,288, then the end 1000k = 1,024,000
    from memest.planning.sweep import parse_values

    values = parse_values("1k..1000k", "seq_len")
    assert values[-2:] == (524_288, 1_024_000) and len(values) == 11


# --- 9. wording: "1 request", "give only one of" -------------------------------------------------------------

def test_one_request_is_singular():
    # Llama-3.1-8B at max_model_len 131,072 on an L40S: the pool holds one sequence (the estimate says so)
    import os

    out = run_memest("hf", "meta-llama/Llama-3.1-8B", "--serve", "--max-model-len", "131072", "--gpu", "L40S",
                     env=dict(os.environ) | {"COLUMNS": "400"})  # one line per sentence
    assert out.returncode == 0, out.stderr
    assert "KV pool holds 1 request of" in out.stdout and "1 requests" not in out.stdout, out.stdout
    assert "Capacity: 1 request of 131,072 tokens" in out.stdout


def test_a_term_formula_with_one_request_is_singular():
    import memest

    est = memest.estimate_memory("meta-llama/Llama-3.1-8B", mode="serve", gpu="A100-80GB", batch_size=1)
    kv = next(t for t in est.to_dict()["terms"] if t["name"] == "kv_cache")
    assert kv["formula"].startswith("1 request x "), kv["formula"]


def test_the_service_says_give_only_one_of_model_or_config():
    from memest.web.schema import SchemaError, parse

    with pytest.raises(SchemaError, match="give only one of model .* or config .*, not both"):
        parse({"model": "meta-llama/Llama-3.1-8B", "config": {}}, "estimate")


# --- 2. DeepSpeed "auto" bucket sizes, filled as the HF integration fills them -------------------------------

DS_AUTO = """{
  "zero_optimization": {"stage": %d, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                        "stage3_param_persistence_threshold": "auto"},
  "bf16": {"enabled": true}
}"""


def _ds_job(tmp_path, stage, *flags):
    ds = _write(tmp_path, "ds_auto.json", DS_AUTO % stage)
    out = run_memest("hf", "meta-llama/Llama-3.1-8B", "--config", ds, "--gpus", "8", *flags, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_auto_reduce_bucket_is_hidden_size_squared_under_the_hf_integration(tmp_path):
    # transformers integrations/deepspeed.py trainer_config_finalize (5.24.0): reduce_bucket_size = hidden_size^2;
    # Llama-3.1-8B hidden_size 4,096: 4,096^2 = 16,777,216 elements; ZeRO-2 with bf16 gradients (2 B):
    # ipg_buffer 16,777,216 x 2 = 33,554,432 B (a multiple of 2 MiB: no rounding), not 5e8 x 2 = 1e9 B
    # (--recompute none: trl checkpoints by default, which moves the peak to the optimizer step, where no bucket lives)
    doc = _ds_job(tmp_path, 2, "--stack", "trl", "--recompute", "none")
    assert doc["workload"]["deepspeed_buckets"]["reduce_bucket_size"] == 16_777_216
    bucket = next(t for t in doc["terms"] if t["name"] == "workspace.reduce_bucket")
    assert bucket["bytes"] == 33_554_432 and "16,777,216" in bucket["formula"]
    assert any("hidden_size² = 4,096² = 16,777,216 elements" in n for n in doc["workload"]["config_notes"])


def test_auto_zero3_buckets_under_the_hf_integration(tmp_path):
    # under ZeRO-3 also stage3_prefetch_bucket_size = int(0.9 x 4,096^2) = int(15,099,494.4) = 15,099,494 and
    # stage3_param_persistence_threshold = 10 x 4,096 = 40,960
    doc = _ds_job(tmp_path, 3, "--stack", "hf-trainer")
    assert doc["workload"]["deepspeed_buckets"] == {"reduce_bucket_size": 16_777_216,
                                                     "prefetch_bucket_size": 15_099_494,
                                                     "param_persistence_threshold": 40_960,
                                                     # not in the file: DeepSpeed's defaults (None: by stage)
                                                     "overlap_comm": None, "contiguous_gradients": True,
                                                     "optimizer_nvme": False, "sub_group_size": 1_000_000_000,
                                                     "optimizer_buffer_count": 4}


def test_auto_outside_the_hf_integration_is_deepspeeds_default(tmp_path):
    # the deepspeed stack (the file alone): nobody fills "auto"; DeepSpeed's default reduce_bucket_size 5e8
    doc = _ds_job(tmp_path, 2)
    assert doc["workload"]["stack"] == "deepspeed"
    assert doc["workload"]["deepspeed_buckets"]["reduce_bucket_size"] == 500_000_000
    assert any("DeepSpeed's default, 500,000,000 elements" in n for n in doc["workload"]["config_notes"])
