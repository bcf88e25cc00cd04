"""Problems a new user met with memest, each reproduced as the user met it (CLI in-process, or the Python API)."""

from __future__ import annotations

import pytest
from inprocess import run_memest

import memest


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


TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
              "vocab_size": 256, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "torch_dtype": "float16"}


def _write_gguf(path, layers: int, hidden: int, ffn: int = 128, vocab: int = 256, qkv: bool = False) -> None:
    """A llama-layout GGUF (convert_hf_to_gguf.py's names), f16 matrices and f32 norms, all zeros."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("token_embd.weight", np.zeros((vocab, hidden), dtype=np.float16))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.zeros((hidden,), dtype=np.float32))
        for name in (("attn_qkv",) if qkv else ("attn_q", "attn_k", "attn_v")) + ("attn_output",):
            rows = 3 * hidden if name == "attn_qkv" else hidden
            w.add_tensor(f"blk.{i}.{name}.weight", np.zeros((rows, hidden), dtype=np.float16))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.zeros((hidden,), dtype=np.float32))
        for name in ("ffn_gate", "ffn_up"):
            w.add_tensor(f"blk.{i}.{name}.weight", np.zeros((ffn, hidden), dtype=np.float16))
        w.add_tensor(f"blk.{i}.ffn_down.weight", np.zeros((hidden, ffn), dtype=np.float16))
    w.add_tensor("output_norm.weight", np.zeros((hidden,), dtype=np.float32))
    w.add_tensor("output.weight", np.zeros((vocab, hidden), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_a_gguf_of_another_model_is_refused(tmp_path):
    path = tmp_path / "tiny.gguf"
    _write_gguf(path, layers=2, hidden=64)
    r = run_memest("hf", "meta-llama/Llama-3.1-8B", "--engine", "llama.cpp", "--gguf", str(path))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # both sides named: the file's 2 layers / hidden 64, Llama-3.1-8B's 32 layers / hidden 4096
    assert "2 layers, hidden size 64" in r.stderr and "32 layers, hidden size 4096" in r.stderr and "--gguf" in r.stderr


def test_a_gguf_with_another_layout_is_refused(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    path = tmp_path / "fused.gguf"
    _write_gguf(path, layers=2, hidden=64, qkv=True)  # one attn_qkv where a llama has attn_q / attn_k / attn_v
    r = run_memest("hf", str(tmp_path), "--engine", "llama.cpp", "--gguf", str(path))
    assert r.returncode == 2 and "no attn_k, attn_q, attn_v tensors" in r.stderr, r.stderr


def test_the_gguf_of_the_model_is_used_and_named_once(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    path = tmp_path / "tiny.gguf"
    _write_gguf(path, layers=2, hidden=64)
    r = run_memest("hf", str(tmp_path), "--engine", "llama.cpp", "--gguf", str(path))
    assert r.returncode == 0, r.stderr
    assert "GGUF GGUF" not in r.stdout and "GGUF file" in r.stdout


@pytest.mark.parametrize(("kwargs", "text"), [
    (dict(model="openai-community/gpt2", mode="lora", lora_targets=["c_attn"]), dict(lora_targets="c_attn")),
    (dict(model="openai-community/gpt2", mode="lora", lora_targets=("c_attn", "c_proj")),
     dict(lora_targets="c_attn,c_proj")),
    (dict(model="EleutherAI/pythia-160m", engine="llama.cpp", gpus=2, tensor_split=[1, 1]),
     dict(tensor_split="1,1")),
    (dict(model="EleutherAI/pythia-160m", engine="llama.cpp", gpus=2, tensor_split=(10, 6.5)),
     dict(tensor_split="10,6.5")),
])
def test_a_list_setting_takes_a_list_as_its_comma_separated_text(kwargs, text):
    as_list = memest.estimate_memory(**kwargs).to_dict()
    assert as_list == memest.estimate_memory(**(kwargs | text)).to_dict()


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(mode="lora", lora_targets=["c_attn", 3]), "lora_targets item 3 is not a string"),
    (dict(mode="lora", lora_targets=[]), "lora_targets is an empty list"),
    (dict(engine="llama.cpp", gpus=2, tensor_split=[1, "a"]), "tensor_split item 'a' is not a number"),
    (dict(gpu=["H100"]), "gpu ['H100'] is not a string"),  # a one-value setting takes no list
])
def test_a_list_of_the_wrong_items_is_an_input_error(kwargs, message):
    with pytest.raises(memest.InputError) as info:
        memest.estimate_memory("openai-community/gpt2", **kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize("command", ["hf", "plan"])
def test_finetune_full_is_refused_pointing_to_train(command):
    r = run_memest(command, "openai-community/gpt2", "--finetune", "full")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--finetune 'full' is not one of lora, qlora" in r.stderr and "--train" in r.stderr


def test_finetune_help_lists_lora_and_qlora():
    r = run_memest("hf", "--help")
    line = next(x for x in r.stdout.splitlines() if "--finetune " in x)
    assert "<lora|qlora>" in line and "full" not in line


def test_the_python_api_refuses_finetune_full_too():
    from memest.workload.resolve import complete

    with pytest.raises(memest.InputError) as info:
        complete({"finetune": "full"})
    assert info.value.field == "finetune" and "use mode='train'" in str(info.value)
    assert complete({"finetune": "QLoRA"})["finetune"].value == "qlora"


# The software/hardware table (memest.workload.ENGINE_VENDORS), from each project's supported-hardware
# docs: llama.cpp / Ollama CUDA, HIP, Metal, Vulkan, SYCL; DeepSpeed CUDA, ROCm, XPU, Gaudi; Megatron-LM
# CUDA, ROCm; FSDP / DDP also TPU (torch_xla); one PyTorch process also Apple MPS.
@pytest.mark.parametrize(("args", "words"), [
    (("--train", "--stack", "deepspeed", "--gpu", "M2-Max-64GB"), ("deepspeed", "M2-Max-64GB (apple)",
                                                                   "--framework pytorch")),
    (("--train", "--gpu", "TPU-v5p", "--framework", "megatron"),
     ("--framework megatron does not run on TPU-v5p (google)", "pytorch / ddp / fsdp")),
    (("--train", "--gpu", "Trainium2", "--framework", "fsdp"), ("Trainium2 (aws)", "use another --gpu")),
    (("--train", "--gpu", "Gaudi2", "--framework", "megatron"), ("Gaudi2 (intel)",)),
    (("--engine", "llama.cpp", "--gpu", "TPU-v5e"), ("--engine llama.cpp does not run on TPU-v5e",)),
    (("--engine", "ollama", "--gpu", "Inferentia2"), ("--engine ollama does not run on Inferentia2",)),
])
def test_software_that_does_not_run_on_the_device_is_refused(args, words):
    r = run_memest("hf", "openai-community/gpt2", *args)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert all(w in r.stderr for w in words), r.stderr


@pytest.mark.parametrize("args", [
    ("--train", "--gpu", "M2-Max-64GB", "--framework", "pytorch"),
    ("--train", "--gpu", "TPU-v5p", "--framework", "fsdp"),
    ("--train", "--gpu", "Gaudi2"),  # auto: deepspeed, which runs on Gaudi
    ("--train", "--gpu", "MI300X", "--framework", "megatron"),
    ("--engine", "llama.cpp", "--gpu", "M2-Max-64GB"),
    ("--engine", "ollama", "--gpu", "Arc-A770"),
])
def test_software_that_runs_on_the_device_is_estimated(args):
    r = run_memest("hf", "openai-community/gpt2", *args)
    assert r.returncode == 0, r.stderr


def test_plan_says_the_framework_does_not_run_on_a_device():
    r = run_memest("plan", "openai-community/gpt2", "--train", "--stack", "deepspeed",
                   "--gpus-available", "1xH100,1xTPU-v5p,1xM2-Max-64GB")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "deepspeed does not run on: TPU-v5p, M2-Max-64GB" in text
    assert "Nothing fits on" not in text


def test_plan_json_lists_the_devices_the_engine_does_not_run_on():
    import json

    r = run_memest("plan", "openai-community/gpt2", "--engine", "sglang", "--gpus-available", "1xH100,1xTPU-v5p",
                   "--json")
    data = json.loads(r.stdout)
    assert data["does_not_run_on"] == ["TPU-v5p"] and data["no_fit"] == []


def test_fitting_devices_are_those_the_framework_runs_on():
    from memest.planning.recommend import fitting_devices
    from memest.sources import load_config, spec_from_config
    from memest.workload import TrainingConfig

    spec = spec_from_config(load_config("openai-community/gpt2"))
    job = TrainingConfig(seq_len=1024)  # framework auto with precision mixed: DeepSpeed
    vendors = {d.vendor for d in fitting_devices(spec, job, 1, 0.1)}
    assert "nvidia" in vendors and not vendors & {"google", "aws", "apple"}


@pytest.mark.parametrize(("gpu", "context"), [("H100", True), ("MI300X", True), ("TPU-v5p", False), ("Gaudi2", False),
                                              ("Inferentia2", False), ("Trainium2", False), ("M2-Max-64GB", False)])
def test_the_cuda_context_term_is_only_on_cuda_devices(gpu, context):
    r = memest.estimate_memory("openai-community/gpt2", engine="hf", gpu=gpu)
    names = [t.name for t in r.terms]
    assert ("runtime.cuda_context" in names) is context
    assert any(a.startswith(f"no CUDA context on {r.device.name}") for a in r.assumptions) is not context


def test_the_readme_installs_matplotlib_before_its_plot_example():
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.DOTALL)
    # the set-up (the first block) installs memest without the plot extra ...
    assert "matplotlib" not in blocks[0] and "[plot]" not in blocks[0]
    # ... so every command line that plots comes after one that installs memest[plot] in its block
    for block in blocks:
        lines = [x for x in block.splitlines() if x.strip()]
        for i, line in enumerate(lines):
            if " --plot " in f" {line} " and "memest " in line:
                assert any("pip install 'memest[plot]'" in x for x in lines[:i]), line


def test_a_cost_names_a_custom_device_by_its_label(tmp_path):
    import json

    r = run_memest("plan", "openai-community/gpt2", "--train", "--cost", "my-card=1",
                   "--gpus-available", "2xmy-card:24GB", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["prices_usd_per_hour"] == {"my-card": 1.0}
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"My-Card": 0.5}))  # a label matches as a catalog name does: any case
    p = memest.plan_memory("openai-community/gpt2", mode="train", costs=str(prices), gpus_available="2xmy-card:24GB")
    assert p.prices_usd_per_hour.to_dict() == {"my-card": 0.5}


def test_a_cost_for_a_label_not_among_the_devices_is_unknown():
    r = run_memest("plan", "openai-community/gpt2", "--train", "--cost", "other-card=1",
                   "--gpus-available", "2xmy-card:24GB")
    assert r.returncode == 2 and "unknown device 'other-card'" in r.stderr


@pytest.mark.parametrize("value", [-4096, 0])
def test_a_hidden_size_below_one_names_the_bound_it_is_held_to(value):
    import json
    from pathlib import Path

    config = json.loads((Path(memest.__file__).parent / "catalog/meta-llama/Llama-2-7b-hf/config.json").read_text())
    with pytest.raises(memest.MemestError) as info:
        memest.estimate_memory({**config, "hidden_size": value})
    assert f"'hidden_size' is {value}; it must be at least 1" in str(info.value)


@pytest.mark.parametrize(("share", "shown"), [
    (0.1, "10%"), (0.999, "99.9%"), (0.9999, "99.99%"), (0.001, "0.1%"), (0.004, "0.4%"), (0.0, "0%"), (0.5, "50%"),
])
def test_a_share_rounds_to_0_or_100_percent_only_when_it_is(share, shown):
    from memest.report import percent

    assert percent(share) == shown


def test_headroom_0_999_is_not_printed_as_100_percent():
    r = run_memest("hf", "openai-community/gpt2", "--engine", "hf", "--gpu", "H100", "--headroom", "0.999")
    assert "(99.9% headroom kept)" in r.stdout and "100% headroom" not in r.stdout


def test_a_sweep_range_of_one_value_says_so():
    r = run_memest("sweep", "meta-llama/Llama-3.1-8B", "--train", "--seq-len", "1k..1k")
    assert r.returncode == 2 and "--seq-len '1k..1k' has one value (1,024)" in r.stderr, r.stderr


def test_nothing_fits_names_the_smallest_value_swept():
    # Llama-3.1-8B full training on one H100 (8.03 B params x 16 B of mixed-precision states = 128 GB):
    # no sequence length fits, and the first one swept is 1k = 1,024
    r = run_memest("sweep", "meta-llama/Llama-3.1-8B", "--train", "--gpu", "H100", "--seq-len", "1k..1000k")
    text = " ".join(r.stdout.split())
    assert "Nothing fits: even the smallest value swept, --seq-len 1,024, does not fit" in text
    assert "--seq-len 1 does not fit" not in text


def test_the_json_api_takes_a_list_setting_as_a_list():
    pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")
    from starlette.testclient import TestClient

    from memest.web.app import create_app

    settings = {"mode": "lora", "gpu": "L4", "lora_targets": ["c_attn", "c_proj"]}
    with TestClient(create_app(), raise_server_exceptions=False) as client:
        r = client.post("/v1/estimate", json={"model": "openai-community/gpt2", **settings})
        assert r.status_code == 200, r.text
        assert r.json() == memest.estimate_memory("openai-community/gpt2", **settings).to_dict()
        bad = client.post("/v1/estimate", json={"model": "openai-community/gpt2", **settings, "lora_targets": [1]})
        assert bad.status_code == 422 and "must be a string or a list" in bad.json()["error"]


def test_plan_on_devices_the_framework_never_runs_on_says_so():
    r = run_memest("plan", "openai-community/gpt2", "--train", "--stack", "deepspeed", "--gpus-available", "1xTPU-v5p")
    text = " ".join(r.stdout.split())
    assert "Nothing to search: deepspeed runs on none of the devices given" in text
    assert "Nothing fits within the search" not in text
