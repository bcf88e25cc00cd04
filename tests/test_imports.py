"""The analytic path starts fast: importing the CLI loads no torch, transformers or huggingface_hub."""

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "huggingface_hub", "accelerate")


def test_cli_import_is_light():
    code = (
        "import sys, memest.cli, memest.estimate, memest.planning.search, memest.report, memest.sources;"
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_catalog_estimate_loads_no_heavy_module():
    code = (
        "import sys\n"
        "from memest.cli import main\n"
        "sys.argv = ['memest', 'hf', 'meta-llama/Llama-2-70b-hf', '--serve', '--json']\n"
        "import io, contextlib\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    try:\n"
        "        main()\n"
        "    except SystemExit:\n"
        "        pass\n"
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1:] in ([], [""])


# One catalog model per family with an analytic adapter added for issue 12 (or, for a family without a
# catalog entry, the smallest config its adapter accepts): estimating it must import none of HEAVY.
ANALYTIC_FAMILIES = {
    "kimi_k2": "moonshotai/Kimi-K2-Instruct",
    "minimax_m2": "MiniMaxAI/MiniMax-M2.7",
    "qwen2_5_vl": "Qwen/Qwen2.5-VL-7B-Instruct",
    "qwen3_vl": "Qwen/Qwen3-VL-8B-Instruct",
    "qwen3_vl_moe": "Qwen/Qwen3-VL-30B-A3B-Instruct",
    "llama4": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "internlm2": "internlm/internlm2_5-7b-chat",
    "chatglm": "THUDM/chatglm3-6b",
    "baichuan": "baichuan-inc/Baichuan2-7B-Chat",
    "minicpm": "openbmb/MiniCPM-2B-sft-bf16",
    "starcoder2": "bigcode/starcoder2-7b",
    "stablelm": "stabilityai/stablelm-2-zephyr-1_6b",
    "cohere": "CohereForAI/aya-23-8B",
    "mistral3": "mistralai/Ministral-3-3B-Instruct-2512",
    "exaone4": "LGAI-EXAONE/EXAONE-4.0-32B",
    "internlm3": "internlm/internlm3-8b-instruct",
    "glm4v_moe": "zai-org/GLM-4.5V",
    "kimi_k25": "moonshotai/Kimi-K2.5",
    "deepseek_v32": "deepseek-ai/DeepSeek-V3.2",
    "glm_moe_dsa": "zai-org/GLM-5",
    "mimo": "XiaomiMiMo/MiMo-7B-Base",
    "nemotron-nas": "nvidia/Llama-3_3-Nemotron-Super-49B-v1",
}
_GEOMETRY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 96, "vocab_size": 97}
CONFIG_FAMILIES = {
    model_type: {"model_type": model_type, **_GEOMETRY}
    for model_type in ("smollm3", "olmo3", "granite", "granitemoe", "cohere2", "glm4", "glm4_moe", "ministral3",
                       "llama4_text", "deepseek_v4")
}


def _imports_of(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", f"import sys\n{code}\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"],
        capture_output=True, text=True, check=True,
    )
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""


@pytest.mark.parametrize("model_type", sorted(ANALYTIC_FAMILIES))
def test_new_family_catalog_serve_estimate_loads_no_heavy_module(model_type):
    code = (
        "import io, contextlib\n"
        "from memest.cli import main\n"
        f"sys.argv = ['memest', 'hf', {ANALYTIC_FAMILIES[model_type]!r}, '--serve', '--json']\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        main()\n"
        "    except SystemExit:\n"
        "        pass"
    )
    assert _imports_of(code) == ""


@pytest.mark.parametrize("model_type", sorted(CONFIG_FAMILIES))
def test_new_family_config_loads_no_heavy_module(model_type):
    code = (
        "from memest.sources import spec_from_config\n"
        "from memest.sources.config import HFConfig\n"
        f"spec = spec_from_config(HFConfig({CONFIG_FAMILIES[model_type]!r}, name='t', source='t'))\n"
        "assert not any('meta device' in note for note in spec.notes)"
    )
    assert _imports_of(code) == ""


def test_integrations_package_and_memest_track_are_light():
    """``import memest``, ``memest.track`` and the integrations package load no torch or transformers (the
    callback module itself subclasses transformers' TrainerCallback, so importing it loads transformers)."""
    code = ("import sys, memest, memest.integrations\n"
            "memest.track\n"
            "from memest.integrations import _job, track\n"
            "print(' '.join(m for m in ('torch', 'transformers', 'accelerate', 'peft') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_deepseek_v4_config_folder_serve_estimate_loads_no_heavy_module(tmp_path):
    """A DeepSeek-V4 config folder (no catalog entry) estimated for vLLM and transformers' generate: the analytic
    adapter and the compressed-attention caches, no torch, no transformers."""
    config = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "hidden_size": 4096,
              "num_hidden_layers": 43, "num_attention_heads": 64, "torch_dtype": "bfloat16",
              "compress_ratios": [0, 0] + [4 if n % 2 == 0 else 128 for n in range(41)] + [0]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    code = (
        "import io, contextlib\n"
        "from memest.cli import main\n"
        "for engine in ('vllm', 'hf'):\n"
        f"    sys.argv = ['memest', 'hf', {str(tmp_path)!r}, '--serve', '--engine', engine, '--json']\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        try:\n"
        "            main()\n"
        "        except SystemExit as e:\n"
        "            assert e.code in (None, 0), e.code\n"
        "    assert '\"model_type\": \"deepseek_v4\"' in out.getvalue()"
    )
    assert _imports_of(code) == ""
