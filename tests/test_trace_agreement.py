"""The analytic estimate against the trace of the same job: peak allocated within 3%.

For every decoder family in the catalog (tiny configs made from real catalog configs:
tests/trace_models.py) and a few full-size models (one a masked LM, BERT), full fine-tune, LoRA and serving, recompute
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

from trace_models import TINY_SOURCES, tiny_config

from memest.devices import get_device
from memest.estimate import estimate, runtime
from memest.sources import load_config, spec_from_config
from memest.trace import trace
from memest.workload import Engine, Method, Precision, Recompute, ServingConfig, TrainingConfig

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

SLACK = ("findings §5 (allocator slack, not a formula finding): the analytic prefill equals the traced tensor peak "
         "to 0.1%; the traced peak allocated adds 1.7 MB of unsplit caching-allocator blocks (gpt-oss's two 1.4 MB "
         "clamp outputs served from 2.3 MB cached blocks whose < 1 MiB remainders are not split off), which only "
         "tiny tensors show")
JAMBA = ("findings §8, a trace limitation, not a formula gap: without the CUDA-only mamba_ssm / causal_conv1d "
         "packages transformers runs the reference selective scan, whose (b, d_inner, s, d_state) tensors a GPU "
         "run with the fused kernels never stores (the traced peaks are 2-6x the analytic ones on this config); "
         "the analytic mamba term is a seed for the fused kernels, which no trace here can check")
GPT_OSS = ("findings §12 (allocator history, not a formula gap): this tiny config's 1-10 MiB tensors (the clamped "
           "SwiGLU's (1024, 704) outputs, the sinks softmax, the loss's (512, 1024) fp32 gradients) are served from "
           "freed cached blocks up to 1 MiB larger, which the caching allocator does not split; less that slack "
           "(LoRA 4,046,848 B, LoRA + recompute 1,564,672 B) the analytic peak is +0.01% and -0.8% of the traced "
           "one (the rest: the residual stream, a local of the rebuilt layer)")

DISAGREE = {
    "full": {"jamba"},
    "full-recompute": {"jamba"},
    "lora": {"gpt_oss", "jamba"},
    "lora-recompute": {"gpt_oss", "jamba"},
    "serve": {"gpt_oss", "jamba"},
}
"""Cases outside the tolerance as of this branch (benchmarks/trace_agreement.py prints the table)."""


def _reason(family: str, job: str) -> str:
    if family == "jamba":
        return JAMBA
    if job == "serve":
        return SLACK
    return GPT_OSS


KNOWN = {(family, job): _reason(family, job) for job, families in DISAGREE.items() for family in families}


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
    # a masked LM (BertForMaskedLM, its config's architectures): at b=2, s=256 the peak is the optimizer step;
    # at b=8, s=512 the loss backward, whose logits are 3 x 2 B per element (no fp32 upcast; findings §13)
    "google-bert/bert-base-uncased": {
        "full-mixed": TrainingConfig(micro_batch_size=2, seq_len=256),
        "full-mixed-b8-s512": TrainingConfig(micro_batch_size=8, seq_len=512),
    },
}
FULL_SIZE_KNOWN: dict[tuple[str, str], str] = {}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "job"),
    [pytest.param(m, j, id=f"{m.split('/')[1]}-{n}",
                  marks=[pytest.mark.xfail(strict=True, reason=FULL_SIZE_KNOWN[(m, n)])] if (m, n) in FULL_SIZE_KNOWN else [])
     for m, jobs in FULL_SIZE_JOBS.items() for n, j in jobs.items()],
)
def test_full_size_models_agree(model, job) -> None:
    error = _relative_error(load_config(model), job)
    assert abs(error) <= TOLERANCE, f"analytic - trace = {error:+.1%} of the traced peak"
