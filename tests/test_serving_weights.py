"""Quantized weight formats, vLLM's allocator-rounded weights, checkpoint headers (mocked Hub)."""

from __future__ import annotations

import types

import pytest

from memest.errors import InputError, UnknownModelError
from memest.estimate.runtime import cuda_block_bytes
from memest.estimate.weights import SCHEMES, QuantScheme, checkpoint_bytes, scheme_of
from memest.sources.hub import HubUnreachableError
from memest.sources.quantization import compressed_tensors_spec
from memest.spec import QuantizationSpec

MiB = 1 << 20
OUT, IN = 4096, 11008


@pytest.mark.parametrize(
    ("scheme", "expected"),
    [
        # LLM.int8: 1 B/weight + fp32 SCB per output row
        (SCHEMES["int8"], OUT * IN + 4 * OUT),
        # NF4 + double quant: 0.5 B/weight, one 8-bit absmax per 64 weights, an fp32 per 256 absmaxes
        (SCHEMES["nf4"], OUT * IN // 2 + OUT * IN // 64 + 4 * -(-(OUT * IN // 64) // 256)),
        # FP4 (transformers' load_in_4bit defaults): fp32 absmax per 64 weights
        (SCHEMES["fp4"], OUT * IN // 2 + 4 * (OUT * IN // 64)),
        # AWQ 4-bit g128: fp16 scale + 4-bit zero per (group, output)
        (SCHEMES["awq"], OUT * IN // 2 + OUT * (IN // 128 + (IN % 128 > 0)) * (2 + 0.5)),
        # GPTQ adds an int32 g_idx per input feature
        (SCHEMES["gptq"], OUT * IN // 2 + OUT * -(-IN // 128) * 2.5 + 4 * IN),
        # vLLM online fp8: 1 B/weight + one fp32 scale per tensor
        (SCHEMES["fp8"], OUT * IN + 4),
        # MXFP4: 0.5 B/weight + an 8-bit exponent per 32 inputs
        (SCHEMES["mxfp4"], OUT * IN // 2 + OUT * IN // 32),
    ],
    ids=["int8", "nf4", "fp4", "awq", "gptq", "fp8", "mxfp4"],
)
def test_quantized_linear_bytes(scheme: QuantScheme, expected: float) -> None:
    assert scheme.tensor_bytes((OUT, IN)) == int(expected)


def test_fp8_block_scales() -> None:
    # DeepSeek-V3 weight_block_size [128, 128]: fp32 scale per block, 8 experts stacked
    scheme = scheme_of(QuantizationSpec(method="fp8", bits=8, block_shape=(128, 128)))
    assert scheme.tensor_bytes((8, 2048, 7168)) == 8 * 2048 * 7168 + 4 * 8 * 16 * 56


def test_gptq_8bit_without_groups_is_per_channel() -> None:
    scheme = scheme_of(QuantizationSpec(method="gptq", bits=8, group_size=-1))
    # 1 B/weight, fp16 scale + 8-bit zero per output row, int32 g_idx per input
    assert scheme.tensor_bytes((OUT, IN)) == OUT * IN + OUT * 3 + 4 * IN


def test_compressed_tensors_config() -> None:
    q = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 8, "type": "float", "strategy": "channel", "group_size": None, "symmetric": True}}},
        "ignore": ["lm_head"],
    }
    spec = compressed_tensors_spec(q)
    assert (spec.bits, spec.strategy, spec.skip_modules) == (8, "channel", ("lm_head",))
    # W8A8 fp8 per channel: 1 B/weight + fp32 scale per output row (vLLM CompressedTensorsW8A8Fp8)
    assert scheme_of(spec).tensor_bytes((OUT, IN)) == OUT * IN + 4 * OUT


def test_unknown_method_names_the_fix() -> None:
    with pytest.raises(InputError, match="'hqq'.*pass quantization to choose"):
        scheme_of(QuantizationSpec(method="hqq", bits=4))


@pytest.mark.parametrize(
    ("nbytes", "expected"),
    [
        (100, 512),  # small: 512-byte rounding
        (5 * MiB + 1, 5 * MiB + 512),  # below 10 MiB: split from a 20 MiB segment, exact
        (int(129.5 * MiB), 130 * MiB),  # Qwen2.5-7B down_proj: remainder 0.5 MiB <= 1 MiB, not split
        (int(31.5 * MiB), 32 * MiB),  # Qwen2.5-7B qkv_proj
        (int(24.5 * MiB), int(24.5 * MiB)),  # remainder 1.5 MiB > 1 MiB: split off, exact
        (48 * MiB, 48 * MiB),  # Llama-3.1-8B qkv_proj: a multiple of 2 MiB
    ],
    ids=["small", "mid", "qwen-down", "qwen-qkv", "split", "exact"],
)
def test_cuda_block_bytes(nbytes: int, expected: int) -> None:
    assert cuda_block_bytes(nbytes) == expected


def test_checkpoint_bytes_converts_floats_keeps_packed() -> None:
    # 1e9 BF16 params served in fp16 (2 B) + 2e9 I32 packed words (4 B) + 1e6 F32 scales served at 2 B
    params = (("BF16", 10**9), ("I32", 2 * 10**9), ("F32", 10**6))
    assert checkpoint_bytes(params, 2) == 2 * 10**9 + 8 * 10**9 + 2 * 10**6
    with pytest.raises(InputError, match="'Q4'"):
        checkpoint_bytes((("Q4", 1),), 2)


def test_safetensors_counts_from_mocked_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    from memest.sources import hub

    calls = {}

    def fake_metadata(repo_id, *, revision=None, **_):
        calls["args"] = (repo_id, revision)
        return types.SimpleNamespace(parameter_count={"F32": 3, "BF16": 8030261248})

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "get_safetensors_metadata", fake_metadata)
    monkeypatch.setattr(hub, "_check_reachable", lambda: None)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("MEMEST_OFFLINE", raising=False)
    assert hub.safetensors_parameter_counts("meta-llama/Llama-3.1-8B", revision="main") == (
        ("BF16", 8030261248), ("F32", 3))
    assert calls["args"] == ("meta-llama/Llama-3.1-8B", "main")


def test_safetensors_counts_offline_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    from memest.sources import hub

    monkeypatch.setenv("MEMEST_OFFLINE", "1")
    with pytest.raises(HubUnreachableError, match="drop exact_weights or go online"):
        hub.safetensors_parameter_counts("meta-llama/Llama-3.1-8B")


def test_safetensors_counts_not_a_safetensors_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub
    from huggingface_hub.errors import NotASafetensorsRepoError

    from memest.sources import hub

    def fake_metadata(repo_id, **_):
        raise NotASafetensorsRepoError("no safetensors")

    monkeypatch.setattr(huggingface_hub, "get_safetensors_metadata", fake_metadata)
    monkeypatch.setattr(hub, "_check_reachable", lambda: None)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("MEMEST_OFFLINE", raising=False)
    with pytest.raises(UnknownModelError, match="no safetensors checkpoint"):
        hub.safetensors_parameter_counts("org/model")


def test_exact_weights_scale_the_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Headers that say the checkpoint is 1% larger than the analytic count scale the weights 1%."""
    from memest.estimate.serving.common import stage_weight_bytes
    from memest.estimate.sharding import stages
    from memest.sources import load_model
    from memest.workload import ServingConfig

    spec = load_model("meta-llama/Llama-3.1-8B-Instruct")
    plain = ServingConfig()
    exact = ServingConfig(checkpoint_params=(("BF16", round(spec.num_params * 1.01)),))
    stage = stages(spec.num_layers, 1)[0]
    ratio = stage_weight_bytes(spec, exact, stage) / stage_weight_bytes(spec, plain, stage)
    assert ratio == pytest.approx(1.01, rel=1e-6)


@pytest.mark.parametrize(("engine", "dtype", "bytes_per_param"), [
    ("vllm", "bfloat16", 2),  # vLLM _resolve_auto_dtype: float32 -> the platform's first dtype, bfloat16
    ("hf", "float32", 4),  # transformers dtype="auto" keeps the checkpoint's float32
])
def test_float32_checkpoint_served_dtype(engine, dtype, bytes_per_param):
    from memest.devices import get_device
    from memest.estimate import estimate
    from memest.estimate.serving.common import weight_dtype
    from memest.sources import load_model
    from memest.workload import Engine, ServingConfig

    spec = load_model("google/gemma-2-9b")  # config.json: "torch_dtype": "float32"
    assert spec.torch_dtype == "float32"
    s = ServingConfig(engine=Engine(engine), max_model_len=1024)
    assert weight_dtype(spec, s) == dtype
    params = sum(t.numel * c for t, c in spec.tensors())
    weights = estimate(spec, s, get_device("H200-141GB")).per_device.term("weights").bytes
    assert params * bytes_per_param <= weights <= params * bytes_per_param * 1.001  # + allocator block rounding


def test_vllm_refuses_float16_for_gemma2():
    from memest.sources import load_model
    from memest.workload import ServingConfig, validate

    with pytest.raises(InputError, match="vLLM refuses dtype fp16 for model_type 'gemma2'"):
        validate(load_model("google/gemma-2-9b"), ServingConfig(dtype="fp16"))
