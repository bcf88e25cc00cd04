"""The analytic estimate against the trace of the same job: peak allocated within 3%.

For every decoder family on this branch (tiny configs made from real catalog configs:
tests/trace_models.py) and a few full-size models, full fine-tune, LoRA and serving, recompute
none and full. Both sides are on an H100 (its cuBLAS workspace, a device constant both add, is
left out so that it cannot hide a difference on a tiny model).

Where they disagree the tolerance is not loosened: the case is marked ``xfail(strict=True)`` with
the finding that explains it (benchmarks/trace_findings.md, section in the reason). The formulas
are the training / serving estimators' to fix; when one is fixed its case starts passing and the
strict xfail turns into a failure, which is the signal to drop the mark.
"""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trace_models import TINY_SOURCES, tiny_config  # noqa: E402

from memest.devices import get_device  # noqa: E402
from memest.estimate import estimate, runtime  # noqa: E402
from memest.sources import load_config, spec_from_config  # noqa: E402
from memest.trace import trace  # noqa: E402
from memest.workload import Engine, Method, Precision, Recompute, ServingConfig, TrainingConfig  # noqa: E402

TOLERANCE = 0.03
"""Largest relative difference of peak allocated, (analytic - traced) / traced."""

DEVICE = get_device("h100")
CUBLAS = runtime.cublas_workspace_bytes(DEVICE)

TINY_JOBS = {
    "full": TrainingConfig(micro_batch_size=2, seq_len=256),
    "full-recompute": TrainingConfig(micro_batch_size=2, seq_len=256, recompute=Recompute.FULL),
    "lora": TrainingConfig(method=Method.LORA, micro_batch_size=2, seq_len=256),
    "lora-recompute": TrainingConfig(method=Method.LORA, micro_batch_size=2, seq_len=256, recompute=Recompute.FULL),
    "serve": ServingConfig(engine=Engine.HF, max_model_len=256, batch_size=2),
}

LORA = ("findings §3: LoRA activations are not the full fine-tune's (frozen linears keep no input, PEFT keeps an "
        "fp32 copy of each adapter's input, adapters are fp32 with no master copy)")
LORA_RECOMPUTE = ("findings §3 and §4: with recompute the analytic LoRA estimate keeps every layer's full fine-tune "
                  "activations for the rebuilt layer and the logits term; the traced peak is the rebuilt layer")
SERVE = ("findings §5: the prefill peak holds 4 hidden-size tensors per token besides the MLP's 3 (the embedding "
         "output stays referenced), not 3")
RECOMPUTE_STEP = ("findings §1 and §4: the analytic peak is its end-of-forward moment with gradients allocated and "
                  "the logits term; the traced peak is the DeepSpeed-style optimizer step (fp32 flat gradient)")

KNOWN = {
    ("llama", "lora"): LORA, ("mistral", "lora"): LORA, ("qwen2", "lora"): LORA,
    ("llama", "lora-recompute"): LORA_RECOMPUTE, ("mistral", "lora-recompute"): LORA_RECOMPUTE,
    ("qwen2", "lora-recompute"): LORA_RECOMPUTE,
    ("llama", "serve"): SERVE, ("mistral", "serve"): SERVE, ("qwen2", "serve"): SERVE,
    ("qwen2", "full-recompute"): RECOMPUTE_STEP,
}


def _params(jobs, known, models):
    out = []
    for model in models:
        for name, job in jobs.items():
            marks = [pytest.mark.xfail(strict=True, reason=known[(model, name)])] if (model, name) in known else []
            out.append(pytest.param(model, job, marks=marks, id=f"{model}-{name}"))
    return out


def _relative_error(cfg, job) -> float:
    spec = spec_from_config(cfg)
    analytic = estimate(spec, job, DEVICE).per_device.allocated_bytes - CUBLAS
    traced = trace(cfg, job, DEVICE).per_device.peak_allocated_bytes - CUBLAS
    return (analytic - traced) / traced


@pytest.mark.parametrize(("family", "job"), _params(TINY_JOBS, KNOWN, TINY_SOURCES))
def test_tiny_family_models_agree(family, job) -> None:
    error = _relative_error(tiny_config(family), job)
    assert abs(error) <= TOLERANCE, f"analytic - trace = {error:+.1%} of the traced peak"


FULL_SIZE_JOBS = {
    "meta-llama/Llama-2-7b-hf": {
        "full-mixed": TrainingConfig(micro_batch_size=1, seq_len=2048),
        "full-amp": TrainingConfig(micro_batch_size=1, seq_len=2048, precision=Precision.AMP),
        "lora": TrainingConfig(method=Method.LORA, micro_batch_size=1, seq_len=2048),
    },
    "meta-llama/Llama-3.1-8B": {
        "serve": ServingConfig(engine=Engine.HF, max_model_len=8192, batch_size=1),
    },
}
FULL_SIZE_KNOWN = {
    ("meta-llama/Llama-2-7b-hf", "full-mixed"): ("findings §1: the DeepSpeed ZeRO step upcasts the flattened bf16 "
                                                 "gradients to one fp32 flat gradient (4 B/param), the analytic step "
                                                 "moment keeps 2 B/param of bf16 gradients"),
    ("meta-llama/Llama-2-7b-hf", "lora"): LORA,
}


@pytest.mark.parametrize(
    ("model", "job"),
    [pytest.param(m, j, id=f"{m.split('/')[1]}-{n}",
                  marks=[pytest.mark.xfail(strict=True, reason=FULL_SIZE_KNOWN[(m, n)])] if (m, n) in FULL_SIZE_KNOWN else [])
     for m, jobs in FULL_SIZE_JOBS.items() for n, j in jobs.items()],
)
def test_full_size_models_agree(model, job) -> None:
    error = _relative_error(load_config(model), job)
    assert abs(error) <= TOLERANCE, f"analytic - trace = {error:+.1%} of the traced peak"
