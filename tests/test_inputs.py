"""Input handling as a new user meets it: every bad input is a one-line MemestError (exit code 2 from
the CLI, no traceback), flags the job would not read are refused, and models without attention heads
estimate instead of crashing."""

import json
import os
import re
import shlex
import subprocess
from dataclasses import replace

import pytest
from inprocess import run_memest

from memest.cli.options import (
    ENGINE_ONLY,
    METHOD_ONLY,
    SERVING_ONLY,
    TRAINING_ONLY,
    WORKLOAD_OPTIONS,
    JobOptions,
)
from memest.devices import get_device
from memest.errors import ConfigError, InputError
from memest.estimate import estimate
from memest.estimate.sharding import stages
from memest.estimate.training import lora_adapters, moments
from memest.planning.recommend import assess
from memest.report import render, to_dict, to_markdown
from memest.sources import load_model
from memest.spec import AttentionSpec, Component, LayerSpec, MLPSpec, ModelSpec, Split, StateSpec, TensorSpec
from memest.workload import (
    AttnImplementation,
    Engine,
    Framework,
    FsdpStrategy,
    KbitPrep,
    LoraConfig,
    LoraLibrary,
    Loss,
    Method,
    Offload,
    Optimizer,
    Parallelism,
    Precision,
    Recompute,
    ServingConfig,
    TrainingConfig,
    lora_module_names,
    validate,
)

ENV = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"HF_HUB_OFFLINE": "1", "MEMEST_DEBUG": ""}
LLAMA = "meta-llama/Llama-2-7b-hf"  # 32 heads, 32 KV heads, max_position_embeddings 4096
H100 = get_device("H100")


def run(*args: str) -> subprocess.CompletedProcess:
    return run_memest(*args, env=ENV)  # in-process (tests/inprocess.py); test_cli.py runs real subprocesses


def assert_one_line_error(out: subprocess.CompletedProcess, message: str) -> None:
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), out.stderr
    assert message in lines[0], lines[0]


def job(**values) -> JobOptions:
    """Parsed options: the defaults with ``values`` changed."""
    return JobOptions({name: default for name, (_, default) in WORKLOAD_OPTIONS.items()} | values)


# ---- 1. models without attention heads (Mamba, RWKV) ----

H, V, D_IN, N, K = 64, 100, 128, 16, 4


def tiny_mamba() -> ModelSpec:
    """A two-layer Mamba-style spec built by hand: mixers only, no attention heads."""
    mixer = (
        TensorSpec("mixer.in_proj.weight", (2 * D_IN, H), Component.OTHER),
        TensorSpec("mixer.conv1d.weight", (D_IN, 1, K), Component.OTHER),
        TensorSpec("mixer.out_proj.weight", (H, D_IN), Component.OTHER),
        TensorSpec("mixer.A_log", (D_IN, N), Component.OTHER),
        TensorSpec("norm.weight", (H,), Component.NORM),
    )
    layer = LayerSpec(attention=AttentionSpec(kind="mamba", num_heads=0, num_kv_heads=0, head_dim=0,
                                              state=StateSpec(conv_channels=D_IN, conv_kernel=K,
                                                              ssm_elements=D_IN * N)),
                      mlp=MLPSpec(gated=False, intermediate_size=4 * H), tensors=mixer)
    return ModelSpec(name="tiny-mamba", model_type="mamba", architecture="MambaForCausalLM", hidden_size=H,
                     vocab_size=V, max_position_embeddings=None, tie_word_embeddings=False, layers=(layer, layer),
                     embedding=(TensorSpec("backbone.embeddings.weight", (V, H), Component.EMBEDDING, Split.VOCAB),),
                     head=(TensorSpec("backbone.norm_f.weight", (H,), Component.NORM),
                           TensorSpec("lm_head.weight", (V, H), Component.LM_HEAD, Split.VOCAB)),
                     torch_dtype="bfloat16")


ATTENTION_FREE_WORKLOADS = {
    "serve-hf": ServingConfig(engine=Engine.HF, max_model_len=256),
    "serve-vllm-tp2": ServingConfig(max_model_len=256, parallelism=Parallelism(tp=2)),
    "train": TrainingConfig(seq_len=256),
    "train-tp2-megatron": TrainingConfig(seq_len=256, parallelism=Parallelism(tp=2), framework=Framework.MEGATRON),
    "train-zero3-dp4": TrainingConfig(seq_len=256, parallelism=Parallelism(dp=4, zero_stage=3)),
    "lora-mixer": TrainingConfig(method=Method.LORA, seq_len=256, lora=LoraConfig(targets="in_proj,out_proj")),
}


@pytest.mark.parametrize("workload", ATTENTION_FREE_WORKLOADS.values(), ids=ATTENTION_FREE_WORKLOADS.keys())
def test_attention_free_model_estimates_and_reports(workload):
    spec = tiny_mamba()
    a = assess(spec, workload, H100)  # validate, estimate, verdict, recommendation, fits_on: no ZeroDivisionError
    assert a.estimate.per_device.allocated_bytes > 0
    render(a)
    assert "no attention heads" in to_markdown(a)


def test_attention_free_weights_counted_by_hand():
    # parameters: embedding 100 x 64 = 6,400; per layer in_proj 256 x 64 = 16,384, conv1d 128 x 4 = 512,
    # out_proj 64 x 128 = 8,192, A_log 128 x 16 = 2,048, norm 64 -> 27,200 (x 2 layers = 54,400); final norm 64;
    # lm_head 6,400: 67,264 in all
    spec = tiny_mamba()
    assert spec.num_params == 6_400 + 2 * 27_200 + 64 + 6_400 == 67_264
    # bf16 weights, each tensor in the caching allocator's 512-byte blocks: embedding and lm_head 12,800 B each;
    # per layer 32,768 + 1,024 + 16,384 + 4,096 + 512 (128 B of norm) = 54,784; final norm 512
    est = estimate(spec, ATTENTION_FREE_WORKLOADS["serve-hf"], H100)
    weights = next(t.bytes for t in est.per_device.terms if t.name == "weights")
    assert weights == 2 * 12_800 + 2 * 54_784 + 512 == 135_680


def test_tp_on_key_value_projections_without_kv_heads_is_an_input_error():
    # RWKV through the meta fallback: its 'attention.key' / 'attention.value' projections are split like KV
    # projections, but the layers have no KV heads to divide them by
    spec = tiny_mamba()
    kv_layer = replace(spec.layers[0], tensors=(*spec.layers[0].tensors,
                                                TensorSpec("attention.key.weight", (H, H), Component.ATTENTION, Split.KV)))
    rwkv_like = spec.replace(layers=(kv_layer, kv_layer))
    validate(rwkv_like, TrainingConfig(seq_len=256))  # tp 1: nothing to divide
    with pytest.raises(InputError, match=r"^tp 2 cannot split the key/value projections of tiny-mamba.*use tp 1"):
        validate(rwkv_like, TrainingConfig(seq_len=256, parallelism=Parallelism(tp=2)))


TINY_MAMBA_CONFIG = {"model_type": "mamba", "architectures": ["MambaForCausalLM"], "hidden_size": 64,
                     "num_hidden_layers": 2, "vocab_size": 100, "state_size": 4, "expand": 2, "conv_kernel": 4}
TINY_RWKV_CONFIG = {"model_type": "rwkv", "architectures": ["RwkvForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
                    "vocab_size": 100, "attention_hidden_size": 64, "intermediate_size": 128, "context_length": 128}


@pytest.mark.parametrize(("config", "args"), [
    (TINY_MAMBA_CONFIG, ("--serve", "--gpus", "2")),
    (TINY_MAMBA_CONFIG, ("--train", "--gpus", "2", "--tp", "2")),
    (TINY_RWKV_CONFIG, ("--train",)),
    # the rwkv adapter splits the time mix's key / value by channels (column-parallel, no KV heads to divide), so
    # tp 2 trains; on the meta path they were guessed to be KV projections and tp 2 was refused. No tensor-parallel
    # serving engine serves RWKV-4 (memest.workload.config.ENGINES_SERVING): it serves under transformers
    (TINY_RWKV_CONFIG, ("--train", "--gpus", "2", "--tp", "2")),
    (TINY_RWKV_CONFIG, ("--serve", "--engine", "hf")),
], ids=["mamba-serve-tp2", "mamba-train-tp2", "rwkv-train", "rwkv-train-tp2", "rwkv-serve-hf"])
def test_attention_free_configs_on_the_cli(tmp_path, config, args):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    out = run("hf", str(path), *args)
    assert out.returncode == 0, out.stderr
    assert "no attention heads" in out.stdout and "FITS" in out.stdout


# ---- 2. num_heads must be a multiple of num_kv_heads ----

@pytest.mark.parametrize(("heads", "kv_heads", "message"), [
    (32, 7, r"num_attention_heads \(32\) is not divisible by num_key_value_heads \(7\)"),
    (8, 16, r"num_attention_heads \(8\) is not divisible by num_key_value_heads \(16\)"),
    (32, 0, r"num_key_value_heads is 0 with num_attention_heads 32"),
], ids=["32-over-7", "fewer-heads-than-kv", "kv-zero"])
def test_attention_spec_refuses_heads_not_grouped_evenly(heads, kv_heads, message):
    with pytest.raises(ConfigError, match=message):
        AttentionSpec(num_heads=heads, num_kv_heads=kv_heads, head_dim=128)


@pytest.mark.parametrize(("heads", "kv_heads"), [(32, 32), (32, 8), (32, 1), (0, 0)], ids=["mha", "gqa", "mqa", "none"])
def test_attention_spec_accepts_even_groups(heads, kv_heads):
    assert AttentionSpec(num_heads=heads, num_kv_heads=kv_heads, head_dim=128).num_kv_heads == kv_heads


def test_config_with_uneven_kv_heads_is_exit_2(tmp_path):
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
              "intermediate_size": 11008, "num_attention_heads": 32, "num_key_value_heads": 7,
              "num_hidden_layers": 2, "vocab_size": 32000}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert_one_line_error(run("hf", str(path)), "num_attention_heads (32) is not divisible by num_key_value_heads (7)")


# ---- 3. flags the mode, method or engine does not read ----

MODE_ERRORS = {
    "train-batch-size": (("--train", "--batch-size", "4"),
                         "--batch-size is a serving flag (concurrent sequences); for training use --micro-batch-size"),
    "serve-seq-len": (("--serve", "--seq-len", "4096"),
                      "--seq-len is a training flag (tokens per training sequence); for serving use --max-model-len"),
    "default-seq-len": (("--seq-len", "4096"), "add --train or --finetune (serving is the default)"),
    "serve-micro-batch": (("--serve", "--micro-batch-size", "2"), "--micro-batch-size is a training flag"),
    "train-quantization": (("--train", "--quantization", "nf4"), "QLoRA's base is NF4 by definition"),
    "qlora-quantization": (("--finetune", "qlora", "--quantization", "nf4"), "--quantization is a serving flag"),
    "train-max-model-len": (("--train", "--max-model-len", "4096"), "--max-model-len is a serving flag"),
    "serve-optimizer": (("--serve", "--optimizer", "adamw8bit"), "--optimizer is a training flag"),
    "serve-zero-stage": (("--serve", "--zero-stage", "3"), "--zero-stage is a training flag"),
    "serve-cp": (("--serve", "--cp", "2", "--gpus", "2"), "--cp is a training flag"),
    "serve-sequence-parallel": (("--serve", "--sequence-parallel"), "--sequence-parallel is a training flag"),
    "sequence-parallel-tp1": (("--train", "--sequence-parallel"), "--sequence-parallel needs --tp > 1"),
    "hf-gpu-memory-utilization": (("--serve", "--engine", "hf", "--gpu-memory-utilization", "0.8"),
                                  "--gpu-memory-utilization is a --engine vllm flag"),
    "vllm-prompt-len": (("--serve", "--engine", "vllm", "--prompt-len", "100"), "--prompt-len is a --engine hf flag"),
    "vllm-max-new-tokens": (("--serve", "--max-new-tokens", "10"), "--max-new-tokens is a --engine hf flag"),
    "vllm-mem-fraction-static": (("--serve", "--mem-fraction-static", "0.8"),
                                 "--mem-fraction-static is a --engine sglang flag"),
    "sglang-tokens-per-block": (("--serve", "--engine", "sglang", "--tokens-per-block", "64"),
                                "--tokens-per-block is a --engine trtllm flag"),
    "trtllm-gpu-memory-utilization": (("--serve", "--engine", "trtllm", "--gpu-memory-utilization", "0.8"),
                                      "--gpu-memory-utilization is a --engine vllm flag"),
    "train-page-size": (("--train", "--page-size", "16"), "--page-size is a serving flag"),
    "train-lora-rank": (("--train", "--lora-rank", "8"), "--lora-rank applies to --finetune lora or --finetune qlora"),
    "lora-prepare-kbit": (("--finetune", "lora", "--prepare-kbit-training", "peft"),
                          "--prepare-kbit-training applies to --finetune qlora, not --finetune lora"),
}


@pytest.mark.parametrize(("args", "message"), MODE_ERRORS.values(), ids=MODE_ERRORS.keys())
def test_flag_the_job_would_not_read_is_refused(args, message):
    assert_one_line_error(run("hf", LLAMA, *args), message)


def test_scope_lists_name_workload_options():
    listed = [*SERVING_ONLY, *TRAINING_ONLY, *METHOD_ONLY, *ENGINE_ONLY]
    assert set(listed) <= set(WORKLOAD_OPTIONS)
    assert not set(SERVING_ONLY) & set(TRAINING_ONLY)
    assert set(ENGINE_ONLY) <= set(SERVING_ONLY) and set(METHOD_ONLY) <= set(TRAINING_ONLY)


# A non-default value for every mode-specific workload option. Left out: the options both modes read (model
# reference, device, headroom, --gpus/--dp/--tp/--pp/--ep: test_serving_layout_from_gpus_and_dp) and
# --exact-weights, which reads the Hub.
SAMPLES = {
    "micro_batch_size": 2, "seq_len": 1024, "grad_accum_steps": 2, "precision": "bf16", "optimizer": "lion",
    "recompute": "full", "zero_stage": 1, "offload": "optimizer", "lora_rank": 8, "lora_targets": "all-linear",
    "attn_implementation": "eager", "loss": "fused", "lora_dropout": 0.1, "target_len": 64, "framework": "ddp",
    "fsdp": "full_shard", "set_grads_to_none": False, "prepare_kbit_training": "none", "lora_library": "litgpt", "batch_size": 4,
    "max_model_len": 1024, "dtype": "fp16", "quantization": "int8", "kv_cache_dtype": "fp8", "engine": "hf",
    "engine_version": "0.6", "prompt_len": 100, "max_new_tokens": 10, "gpu_memory_utilization": 0.8,
    "max_num_batched_tokens": 1024, "max_num_seqs": 8, "block_size": 32, "enforce_eager": True, "dp_shard": 2,
    "cp": 2, "sequence_parallel": True, "mem_fraction_static": 0.8, "max_running_requests": 8,
    "chunked_prefill_size": 4096, "page_size": 16, "kv_cache_free_gpu_mem_fraction": 0.8, "max_batch_size": 8,
    "max_num_tokens": 4096, "tokens_per_block": 64, "n_gpu_layers": 3, "n_batch": 256, "n_ubatch": 128,
    "flash_attn": True, "tensor_split": "1,1", "optimizer_in_bwd": True, "activation_offloading": True,
    "float8": "tensorwise", "float8_all_gather": True, "custom_sharded_layers": "tok_embeddings,output",
}
"""--gguf is left out too: it reads a file (tests/test_llamacpp.py writes one); --torch-compile needs --loss chunked
(tests/test_lora_library.py)."""
ENUMS = {"precision": Precision, "optimizer": Optimizer, "recompute": Recompute, "offload": Offload,
         "attn_implementation": AttnImplementation, "loss": Loss, "framework": Framework, "fsdp": FsdpStrategy,
         "engine": Engine, "prepare_kbit_training": KbitPrep, "lora_library": LoraLibrary}


def _built(monkeypatch, base: dict, name: str | None):
    """The workload the options build from ``base`` with ``name`` at its sample value, the scope check
    bypassed."""
    from memest.cli import options

    monkeypatch.setattr(options, "_check_scope", lambda values, mode: None)
    values = dict(base)
    if name is not None:
        values[name] = ENUMS[name](SAMPLES[name]) if name in ENUMS else SAMPLES[name]
    return job(**values).workload(load_model("meta-llama/Llama-3.2-1B"))


def test_serving_only_and_training_only_flags_shape_only_their_mode(monkeypatch):
    """Each flag listed as serving-only changes the serving workload and not the training one, and the
    reverse; a flag in neither list changes both. So the lists refuse exactly the flags a mode ignores."""
    train_base = {"finetune": Method.QLORA, "gpus": 8, "tp": 2}  # QLoRA reads every training flag; tp 2 for sp
    serve_base = {"serve": True, "gpus": 8}
    train0, serve0 = _built(monkeypatch, train_base, None), _built(monkeypatch, serve_base, None)
    for name in SAMPLES:
        shaped_train = _built(monkeypatch, train_base, name) != train0
        shaped_serve = _built(monkeypatch, serve_base, name) != serve0
        expected = (name not in SERVING_ONLY, name not in TRAINING_ONLY)
        assert (shaped_train, shaped_serve) == expected, name


@pytest.mark.parametrize("name", sorted(n for n in ENGINE_ONLY if n in SAMPLES))
def test_engine_only_flags_do_not_change_the_other_engines_estimate(monkeypatch, name):
    own = ENGINE_ONLY[name]
    other = Engine.HF if own is Engine.VLLM else Engine.VLLM
    base = {"serve": True, "engine": other, "max_model_len": 1024}
    spec = load_model("meta-llama/Llama-3.2-1B")
    with_flag = _built(monkeypatch, base, name)
    assert with_flag != _built(monkeypatch, base, None)  # the option is stored ...
    assert estimate(spec, with_flag, H100) == estimate(spec, _built(monkeypatch, base, None), H100)  # ... not read


@pytest.mark.parametrize("name", sorted(METHOD_ONLY))
def test_method_only_flags_do_not_change_other_methods_estimates(monkeypatch, name):
    spec = load_model("meta-llama/Llama-3.2-1B")
    for method in (m for m in Method if m not in METHOD_ONLY[name]):
        base = {"train": True} if method is Method.FULL else {"finetune": method}
        assert estimate(spec, _built(monkeypatch, base, name), H100) == estimate(spec, _built(monkeypatch, base, None), H100)


def test_sweep_plan_and_calibrate_still_parse_their_shared_options():
    assert run("sweep", LLAMA, "--batch-size", "1..4", "--max-model-len", "4096", "--gpu", "H100").returncode == 0
    out = run("plan", LLAMA, "--train", "--sequence-parallel", "--seq-len", "4096", "--gpu", "H100", "--top", "1")
    assert out.returncode == 0, out.stderr
    assert "plan searches --sequence-parallel" in out.stderr


def test_calibrate_serving_reads_hf_flags():
    from memest.calibration.request import calibration_workload

    spec = load_model("meta-llama/Llama-3.2-1B")
    w = calibration_workload(job(serve=True, max_new_tokens=4, max_model_len=64).values, spec, 1)
    assert (w.engine, w.max_new_tokens) == (Engine.HF, 4)
    with pytest.raises(InputError, match="^gpu_memory_utilization is a engine vllm flag"):  # the library names keywords
        calibration_workload(job(serve=True, gpu_memory_utilization=0.5).values, spec, 1)


# ---- 4. serving data parallelism ----

@pytest.mark.parametrize(("values", "par"), [
    ({"dp": 2, "gpus": 2}, Parallelism(tp=1, pp=1, dp=2)),
    ({"dp": 2, "gpus": 8}, Parallelism(tp=4, pp=1, dp=2)),  # tp = 8 / (1 x 2)
    ({"dp": 2, "pp": 2, "gpus": 8}, Parallelism(tp=2, pp=2, dp=2)),  # tp = 8 / (2 x 2)
    ({"gpus": 4}, Parallelism(tp=4, pp=1, dp=1)),
    ({"tp": 2, "gpus": 4}, Parallelism(tp=2, pp=1, dp=2)),
], ids=["dp2-gpus2", "dp2-gpus8", "pp2-dp2-gpus8", "gpus4", "tp2-gpus4"])
def test_serving_layout_from_gpus_and_dp(values, par):
    w = job(serve=True, **values).workload(load_model(LLAMA))
    assert w.parallelism == par


@pytest.mark.parametrize(("args", "message"), [
    (("--dp", "2"), "--gpus 1 is not divisible by pp x dp = 2"),
    (("--gpus", "3"), "--gpus 3 serves with tensor parallelism 3 by default (gpus / (pp x dp)), which does not "
                      "divide num_heads (32) of meta-llama/Llama-2-7b-hf; pass --tp and --dp, e.g. --tp 1 --dp 3"),
    (("--tp", "2", "--dp", "2", "--gpus", "2"), "--gpus 2 is not tp x pp x dp = 4"),
], ids=["dp2-gpus1", "gpus3", "tp-dp-gpus-disagree"])
def test_serving_layout_errors(args, message):
    assert_one_line_error(run("hf", LLAMA, "--serve", *args), message)


# ---- 5. --target-len ----

def test_target_len_needs_an_encoder_decoder_model():
    with pytest.raises(InputError, match="^target_len applies to encoder-decoder models .* is causal_lm"):
        estimate(load_model(LLAMA), TrainingConfig(seq_len=512, target_len=64), H100)
    t5 = load_model("google-t5/t5-small")
    # accepted, and it shapes the decoder's activations (compared inside backward: the peak of this small
    # model is DeepSpeed ZeRO 0's optimizer step, which holds no activation)
    longer, shorter = (sum(term.bytes for term in moments(t5, TrainingConfig(seq_len=512, target_len=n), H100)["loss_backward"])
                       for n in (512, 64))
    assert shorter < longer


# ---- 6. --lora-targets ----

LLAMA_MODULES = "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"  # LlamaDecoderLayer's linears


@pytest.mark.parametrize("targets", ["foo_proj", "", "q_proj,,v_proj", "q_proj,foo"])
def test_lora_targets_must_name_modules_of_the_model(targets):
    with pytest.raises(InputError, match=re.escape(LLAMA_MODULES)):
        estimate(load_model(LLAMA), TrainingConfig(method=Method.LORA, lora=LoraConfig(targets=targets)), H100)


@pytest.mark.parametrize("targets", ["attention", "all-linear", "q_proj,v_proj", " q_proj , v_proj "])
def test_lora_targets_accepted(targets):
    estimate(load_model(LLAMA), TrainingConfig(method=Method.LORA, seq_len=512, lora=LoraConfig(targets=targets)), H100)


@pytest.mark.parametrize("model", [LLAMA, "openai-community/gpt2", "google-t5/t5-small", "ai21labs/Jamba-v0.1"])
def test_every_listed_lora_module_gets_adapters(model):
    spec = load_model(model)
    whole = stages(spec.num_layers, 1)[0]
    for name in lora_module_names(spec):
        assert lora_adapters(spec, whole, LoraConfig(rank=8, targets=name), 1), name


def test_lora_attention_on_a_model_without_attention():
    with pytest.raises(InputError, match="tiny-mamba has no attention projections; name its modules instead "
                                         r"\(it has in_proj, out_proj\)"):
        validate(tiny_mamba(), TrainingConfig(method=Method.LORA, seq_len=256))


def test_lora_targets_error_on_the_cli():
    assert_one_line_error(run("hf", LLAMA, "--finetune", "lora", "--lora-targets", "foo_proj"),
                          f"--lora-targets names 'foo_proj', not a module of {LLAMA}")


# ---- 7. --gpu "", --max-new-tokens 0, lengths beyond the position table ----

@pytest.mark.parametrize(("args", "message"), [
    (("--gpu", ""), "--gpu '' is empty; pass a device name"),
    (("--serve", "--engine", "hf", "--max-new-tokens", "0"), "--max-new-tokens is 0; it must be a positive integer"),
    (("--serve", "--engine", "hf", "--prompt-len", "0"), "--prompt-len is 0; it must be a positive integer"),
], ids=["empty-gpu", "max-new-tokens-0", "prompt-len-0"])
def test_empty_or_zero_values(args, message):
    assert_one_line_error(run("hf", LLAMA, *args), message)


@pytest.mark.parametrize(("model", "positions"), [
    ("openai-community/gpt2", 1024),  # wpe (1024, 768)
    ("facebook/opt-1.3b", 2048),  # embed_positions (2050, 2048): 2048 positions after OPT's offset of 2
    ("google-bert/bert-base-uncased", 512),  # position_embeddings (512, 768)
    (LLAMA, None),  # rotary
    ("bigscience/bloom-560m", None),  # ALiBi
    ("google-t5/t5-small", None),  # relative position buckets
])
def test_learned_positions(model, positions):
    assert load_model(model).learned_positions == positions


@pytest.mark.parametrize(("model", "positions"), [("openai-community/gpt2", 1024), ("facebook/opt-1.3b", 2048),
                                                  ("google-bert/bert-base-uncased", 512)])
def test_training_beyond_a_learned_position_table_is_refused(model, positions):
    spec = load_model(model)
    estimate(spec, TrainingConfig(seq_len=positions), H100)
    with pytest.raises(InputError, match=f"^seq_len {positions + 1} is more than the {positions} positions"):
        estimate(spec, TrainingConfig(seq_len=positions + 1), H100)


def test_serving_beyond_a_learned_position_table_is_refused():
    with pytest.raises(InputError, match="1025 tokens is more than the 1024 positions"):
        estimate(load_model("openai-community/gpt2"), ServingConfig(engine=Engine.HF, max_model_len=1025), H100)


def test_rotary_model_beyond_max_position_embeddings_is_a_note():
    out = run("hf", LLAMA, "--train", "--seq-len", "8192", "--gpu", "H100")
    assert out.returncode == 0, out.stderr
    assert f"Note: --seq-len 8,192 is beyond {LLAMA}'s max_position_embeddings (4,096)" in out.stdout
    a = assess(load_model(LLAMA), TrainingConfig(seq_len=8192), H100, search=False)
    assert any("RoPE scaling" in line for line in to_dict(a)["assumptions"])
    assert assess(load_model(LLAMA), TrainingConfig(seq_len=4096), H100, search=False).notes == ()


# ---- 8. --json / --markdown ----

@pytest.mark.parametrize("command", ["hf", "plan", "sweep"])
def test_json_and_markdown_together_is_refused(command):
    extra = ("--batch-size", "1..4") if command == "sweep" else ()
    assert_one_line_error(run(command, LLAMA, "--json", "--markdown", *extra), "choose one of --json, --markdown")


def test_markdown_has_what_the_table_has():
    out = run("hf", "meta-llama/Llama-2-70b-hf", "--serve", "--max-model-len", "4096", "--markdown")
    assert out.returncode == 0, out.stderr
    table = run("hf", "meta-llama/Llama-2-70b-hf", "--serve", "--max-model-len", "4096").stdout
    for text in ("band ", "vLLM 0.19: KV cache", "Capacity: ", "Cheapest fit:", "Fits (1 device"):
        assert text in table and text in out.stdout, text


# ---- 9. memest plan ----

@pytest.mark.parametrize(("args", "message"), [
    (("--top", "0"), "--top is 0; it must be at least 1"),
    (("--top", "-1"), "--top is -1; it must be at least 1"),
    (("--host-memory", "-1"), "--host-memory -1 GiB is negative"),
    (("--host-memory", "nan"), "--host-memory nan GiB is not a size"),
    (("--gpus-available", "-2xH100"), "--gpus-available item '-2xH100': the count must be at least 1, a positive "
                                      "number of devices (got -2)"),
], ids=["top-0", "top-negative", "host-memory", "host-memory-nan", "negative-count"])
def test_plan_input_errors(args, message):
    assert_one_line_error(run("plan", LLAMA, *args), message)


PLAN_TRAIN = (LLAMA, "--train", "--seq-len", "4096", "--precision", "bf16", "--keep-grads", "--gpus-available",
              "8xA100-80GB")


def test_plan_prints_a_runnable_command():
    table = run("plan", *PLAN_TRAIN)
    assert table.returncode == 0, table.stderr
    assert "<your flags>" not in table.stdout and f"Cheapest: memest hf {LLAMA} --train --seq-len 4096" in table.stdout
    command = shlex.split(json.loads(run("plan", *PLAN_TRAIN, "--json").stdout)["fits"][0]["command"])
    assert command[:3] == ["memest", "hf", LLAMA]
    for flag in ("--train", "--seq-len", "--precision", "--keep-grads", "--gpu", "--gpus", "--tp", "--pp", "--dp"):
        assert flag in command, flag
    again = run(*command[1:], "--check")  # the plan's setup fits when estimated again
    assert again.returncode == 0, (command, again.stderr)


def test_plan_headroom_wording_follows_the_verdict():
    serve = run("plan", LLAMA, "--serve", "--max-model-len", "4096", "--gpu", "H100", "--top", "1", "--markdown")
    train = run("plan", LLAMA, "--train", "--gpu", "H100", "--top", "1", "--markdown")
    assert "--headroom not applied" in serve.stdout and "headroom kept" not in serve.stdout
    assert "10% headroom kept" in train.stdout


# ---- 10. --plot ----

@pytest.mark.parametrize("command", ["sweep", "hf"])
def test_plot_suffix_is_checked_before_any_work(command, tmp_path):
    target = tmp_path / "x.jpg"
    extra = ("--seq-len", "1k..64k") if command == "sweep" else ("--train",)
    out = run(command, "meta-llama/Llama-3.2-1B", *extra, "--plot", str(target))
    assert_one_line_error(out, "the file must end in .png, .svg or .pdf")
    assert out.stdout == "" and not target.exists()


def test_sweep_help_names_the_plot_extra():
    out = run("sweep", "--help")
    assert "pip install 'memest[plot]'" in " ".join(out.stdout.replace("│", " ").split())


# ---- 11. calibrate on a machine without a GPU ----

def test_calibrate_refuses_a_cpu_run_beyond_the_hosts_ram():
    # Llama-2-70B full training holds 16 B per parameter of weights and Adam states (69 B parameters: about
    # 1 TiB), far above any test machine's RAM
    out = run("calibrate", "meta-llama/Llama-2-70b-hf", "--train", "--device", "cpu", "--no-record")
    assert_one_line_error(out, "calibrating meta-llama/Llama-2-70b-hf on the CPU needs about")
    assert "use a smaller model, or --device cuda on a GPU machine" in out.stderr


def test_calibrate_auto_without_cuda_warns():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("auto picks CUDA here")
    out = run("calibrate", "meta-llama/Llama-2-70b-hf", "--train", "--no-record")
    assert out.returncode == 2
    warning, error = out.stderr.strip().splitlines()
    assert warning.startswith("Warning: torch sees no CUDA device, so calibrate measures on the CPU")
    assert error.startswith("Error: calibrating")


def test_cpu_run_checked_against_available_ram(monkeypatch):
    from memest.calibration.compare import local_device
    from memest.cli import calibrate

    spec = load_model("meta-llama/Llama-3.2-1B")
    w = TrainingConfig(seq_len=128)
    need = estimate(spec, w, local_device("cpu", "cpu", 1 << 40)).per_device.allocated_bytes
    monkeypatch.setattr(calibrate, "host_available_bytes", lambda: int(need / 0.79))  # need is 79% of it: runs
    calibrate._check_cpu_run(spec, w, calibrate.Backend.CPU, 1)
    monkeypatch.setattr(calibrate, "host_available_bytes", lambda: int(need / 0.81))  # 81%: refused
    with pytest.raises(InputError, match="more than 80% of the"):
        calibrate._check_cpu_run(spec, w, calibrate.Backend.CPU, 1)
    monkeypatch.setattr(calibrate, "host_available_bytes", lambda: int(need / 0.79))
    with pytest.raises(InputError, match="over 2 processes"):  # two processes on one host need twice as much
        calibrate._check_cpu_run(spec, w.replace(parallelism=Parallelism(dp=2)), calibrate.Backend.CPU, 2)


def test_host_available_bytes_is_within_physical_memory():
    from memest.cli.calibrate import host_available_bytes

    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < host_available_bytes() <= physical


# ---- 12. help text ----

def test_piped_help_shows_whole_option_names():
    out = run("hf", "--help")
    assert out.returncode == 0
    for flag in ("--attn-implementation", "--prepare-kbit-training", "--max-num-batched-tokens",
                 "--gpu-memory-utilization", "--set-grads-to-none"):
        assert re.search(re.escape(flag) + r"\s", out.stdout), flag
    assert "…" not in out.stdout


# ---- usage errors, non-finite numbers, unwritable plots, impossible routing ----

@pytest.mark.parametrize(("args", "message"), [
    (("hf", "gpt2", "--finetune", "foo"), "Invalid value for '--finetune'"),
    (("hf", "gpt2", "--seq-len", "4q"), "Invalid value for '--seq-len'"),  # 4k is 4096, as memest sweep reads it
    (("hf", "gpt2", "--zero-stage", "4"), "Invalid value for '--zero-stage'"),
    (("hf", "gpt2", "--bogus"), "No such option: --bogus"),
    (("plan", "gpt2", "--check"), "No such option: --check"),
], ids=["choice", "not-an-int", "out-of-range", "unknown-flag", "unknown-plan-flag"])
def test_usage_errors_are_one_line(args, message):
    out = run(*args)
    assert_one_line_error(out, message)
    assert f"memest {args[0]} --help')" in out.stderr  # 'memest' or 'python -m memest'


def test_version():
    from memest import __version__

    out = run("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"memest {__version__}"


def _config_file(tmp_path, model: str, **changes) -> str:
    from memest.sources import catalog

    raw = json.loads(catalog.entries()[model].read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw | changes))  # json.dumps writes Infinity / NaN for inf / nan
    return str(path)


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_non_finite_config_numbers_are_refused(tmp_path, value):
    path = _config_file(tmp_path, "mistralai/Mistral-7B-v0.1", num_hidden_layers=value)
    assert_one_line_error(run("hf", path, "--serve"), "'num_hidden_layers' is")


def test_top_k_above_the_expert_count_is_refused(tmp_path):
    path = _config_file(tmp_path, "mistralai/Mixtral-8x7B-v0.1", num_experts_per_tok=9)
    assert_one_line_error(run("hf", path, "--serve"), "num_experts_per_tok is 9 with 8 experts")


@pytest.mark.parametrize(("plot", "message"), [
    ("/proc/memest-plot.png", "cannot be written"),  # procfs: the folder exists but takes no new files
    ("/etc/passwd/x.png", "does not exist"),  # a file, not a folder
])
def test_unwritable_plot_is_refused_before_the_sweep(plot, message):
    out = run("sweep", LLAMA, "--serve", "--max-model-len", "1k..4k", "--plot", plot)
    assert_one_line_error(out, message)
    assert out.stdout == ""  # refused before any table is printed


@pytest.mark.parametrize(("args", "message"), [
    (("plan", LLAMA, "--serve", "--allow-method-change"), "--allow-method-change lets a training plan"),
    (("plan", LLAMA, "--train", "--allow-quantization"), "--allow-quantization lets a serving plan"),
    (("hf", LLAMA, "--serve", "--max-num-seqs", "4", "--batch-size", "16"), "--batch-size 16 is more than --max-num-seqs 4"),
    (("calibrate", "gpt2", "--serve", "--device", "cpu", "--gpu", "H100"), "--gpu H100 with --device cpu"),
], ids=["plan-serve-method", "plan-train-quantization", "max-num-seqs", "calibrate-cpu-gpu"])
def test_flags_the_job_cannot_use_are_refused(args, message):
    assert_one_line_error(run(*args), message)


def test_encoder_only_serving_says_it_needs_no_kv_cache():
    out = run("hf", "google-bert/bert-base-uncased", "--serve")
    assert out.returncode == 0, out.stderr
    assert "no KV cache" in out.stdout and "pool 0 tokens" not in out.stdout


@pytest.mark.parametrize(("args", "message"), [
    (("hf", LLAMA, "--train", "--micro-batch-size", "99999999999999999999"), "is beyond anything memest can size"),
    (("hf", LLAMA, "--serve", "--gpus", "99999999999999999999"), "is beyond anything memest can size"),
    (("hf", LLAMA, "--finetune", "lora", "--lora-rank", "99999"), "--lora-rank 99999 is more than"),
    (("hf", LLAMA, "--train", "--fsdp", "full_shard", "--offload", "optimizer", "--gpus", "2"),
     "FSDP offloads parameters, gradients and optimizer states together"),
    (("hf", LLAMA, "--serve", "--max-num-batched-tokens", "8", "--max-num-seqs", "16"),
     "--max-num-batched-tokens 8 is less than --max-num-seqs 16"),
], ids=["huge-micro-batch", "huge-gpus", "lora-rank", "fsdp-optimizer-offload", "mnbt-below-seqs"])
def test_impossible_values_are_refused_fast(args, message):
    assert_one_line_error(run(*args), message)


def test_method_change_replaces_train_in_the_printed_command():
    # the old default recipe pinned (DeepSpeed, bf16 + fp32 master): its cheapest fit is LoRA
    out = run("hf", "meta-llama/Llama-2-7b-hf", "--train", "--gpu", "A100-80GB", "--precision", "mixed",
              "--framework", "deepspeed")
    assert "--finetune lora (in place of --train)" in out.stdout
    fits = json.loads(run("plan", LLAMA, "--train", "--seq-len", "8192", "--allow-method-change", "--json",
                          "--gpus-available", "1xL4").stdout)["fits"]
    assert fits and "--finetune" in shlex.split(fits[0]["command"])  # one L4 only fits with QLoRA
    for fit in fits:
        command = shlex.split(fit["command"])
        assert not ("--train" in command and "--finetune" in command), fit["command"]


def test_plot_without_matplotlib_is_refused_before_any_work(monkeypatch, tmp_path):
    import importlib.util

    from memest.errors import MissingDependencyError
    from memest.report.plot import plot_path

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(MissingDependencyError, match=r"pip install 'memest\[plot\]'"):
        plot_path(tmp_path / "sweep.png")
    assert not (tmp_path / "sweep.png").exists()
