"""Which model the trace builds for a config's task, what it refuses in one line, the long-trace warning,
and the trace table's sizes for tiny models."""

import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
from inprocess import run_memest
from trace_models import shrink, tiny_config

from memest.devices import get_device
from memest.errors import InputError, UnsupportedArchitectureError
from memest.report import trace as console
from memest.sources import catalog, load_config, spec_from_config
from memest.sources.config import HFConfig
from memest.trace import _model, trace
from memest.trace.compare import ComparisonRow
from memest.workload import Engine, ServingConfig, TrainingConfig

DEVICE = get_device("h100")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "MEMEST_DEBUG": ""}
MiB = 1 << 20


def _tiny(source: str) -> HFConfig:
    return HFConfig(shrink(catalog.load(catalog.resolve(source))), name=f"tiny {source}", source=source)


@pytest.mark.parametrize(("config", "task", "cls"), [
    (lambda: _tiny("google-bert/bert-base-uncased"), "masked_lm", "BertForMaskedLM"),  # architectures[0]
    (lambda: tiny_config("llama"), "causal_lm", "LlamaForCausalLM"),
])
def test_the_trace_builds_the_class_architectures_names(config, task, cls) -> None:
    cfg = config()
    assert spec_from_config(cfg).task == task
    model, _ = _model.build(cfg, torch.bfloat16, "sdpa", task=task)
    assert type(model).__name__ == cls


def test_a_masked_lm_trains_as_a_masked_lm() -> None:
    # labels of (b, s), loss inside BertForMaskedLM; no causal-LM head, so no "add is_decoder=True" build
    cfg = _tiny("google-bert/bert-base-uncased")
    result = trace(cfg, TrainingConfig(micro_batch_size=2, seq_len=128), DEVICE)
    assert result.per_device.peak_allocated_bytes > 0


def test_encoder_decoder_models_are_refused_in_one_line() -> None:
    with pytest.raises(UnsupportedArchitectureError, match="encoder-decoder model \\(t5\\)") as err:
        trace(load_config("google-t5/t5-small"), TrainingConfig(micro_batch_size=1, seq_len=128), DEVICE)
    assert "\n" not in str(err.value)
    assert "analytic estimate" in str(err.value)


def test_cli_refuses_t5_trace_in_one_line() -> None:
    out = run_memest("hf", "google-t5/t5-small", "--train", "--trace", env=ENV, timeout=300)
    assert out.returncode == 2
    assert out.stderr.startswith("Error: 'google-t5/t5-small' is an encoder-decoder model (t5)")
    assert out.stderr.count("\n") == 1
    assert len(out.stderr) < 400  # was 3.4 KB: transformers' list of every causal-LM config


def test_any_build_failure_is_one_short_line(monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise RuntimeError("first line\n" + "x" * 5000)

    monkeypatch.setattr(_model, "_instantiate", fail)
    with pytest.raises(UnsupportedArchitectureError) as err:
        _model.build(tiny_config("llama"), torch.bfloat16, "sdpa")
    message = str(err.value)
    assert "\n" not in message
    assert message.endswith("as LlamaForCausalLM for the trace: RuntimeError: first line")


def test_serving_a_masked_lm_is_refused() -> None:
    with pytest.raises(InputError, match="needs a causal LM"):
        trace(_tiny("google-bert/bert-base-uncased"), ServingConfig(engine=Engine.HF, max_model_len=128), DEVICE)


def test_long_jamba_trace_is_announced() -> None:
    # Jamba-v0.1's config.json: 32 layers, attention every 8th from layer 4 (4, 12, 20, 28): 28 Mamba layers;
    # the default context is max_position_embeddings 262,144, less 2 decode steps: a 262,142-token prompt
    spec = spec_from_config(load_config("ai21labs/Jamba-v0.1"))
    warning = console.slow_trace_warning(spec, ServingConfig(engine=Engine.HF))
    assert warning is not None
    assert "28 Mamba layers" in warning and "262,142 tokens" in warning
    # 262,142 x 28 x 0.4 ms = 2,936 s, about 49 min; 60 s / (28 x 0.4 ms) = 5,357 tokens: 4096 as a power of two
    assert "about 49 min" in warning
    assert warning.endswith("pass --max-model-len 4096 for a trace of about a minute")
    # 4,094 x 28 x 0.4 ms = 46 s: no warning
    assert console.slow_trace_warning(spec, ServingConfig(engine=Engine.HF, max_model_len=4096)) is None
    # training: 3 passes (forward + backward) of each traced micro-batch: 4,096 x 28 x 0.4 ms x 3 = 138 s
    assert "about 2 min" in console.slow_trace_warning(spec, TrainingConfig(seq_len=4096))


def test_attention_models_trace_without_a_warning_at_any_context() -> None:
    spec = spec_from_config(load_config("meta-llama/Llama-3.1-8B"))  # 131,072 tokens: meta ops cost no more
    assert console.slow_trace_warning(spec, ServingConfig(engine=Engine.HF)) is None


@pytest.mark.parametrize(("analytic", "traced", "shown"), [
    (3 * MiB, MiB // 2, "—"),  # (0.5 - 3) / 0.5 = -500% of a half-MiB figure: no meaningful share
    (0, 0, "—"),
    (MiB, MiB + 1000, "±0"),
    (90 * MiB, 100 * MiB, "+10.0%"),
])
def test_shares_of_near_zero_figures_are_dashes(analytic, traced, shown) -> None:
    assert console._rel(ComparisonRow("activations", analytic, traced)) == shown


def test_tiny_trace_table_prints_mib() -> None:
    from rich.console import Console

    from memest.estimate import estimate
    from memest.trace import compare

    cfg = tiny_config("llama")
    job = ServingConfig(engine=Engine.HF, max_model_len=128)
    result = trace(cfg, job, DEVICE)
    comparison = compare(result, estimate(spec_from_config(cfg), job, DEVICE))
    out = Console(width=200, record=True)
    out.print(console.render(result, comparison))
    text = out.export_text()
    assert "MiB" in text
    assert "0.00 GiB" not in text
    assert " MiB |" in console.to_markdown(result, comparison)
