"""The analytic estimate against the trace of the same job: peak allocated within 3%.

For every decoder family in the catalog (tiny configs made from real catalog configs:
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

FULL = ("findings §1: DeepSpeed bf16 at ZeRO 0 leaves the previous step's bf16 gradients alive through the forward "
        "(cleared when the next backward starts), and the forward's loss holds the bf16 logits, their fp32 upcast and "
        "the log-softmax at once; the analytic loss_backward moment has neither")
RECOMPUTE = ("findings §1 and §4: with recompute the traced peak is the forward's loss moment (§1) or the rebuilt "
             "layer; see the appendix row of this family")
LORA = ("findings §3: LoRA activations per family (norms before frozen projections, PEFT's fp32 input casts), and "
        "--precision mixed resolves to DeepSpeed, whose fp32 master of the adapters the analytic LoRA estimate omits")
SERVE = ("findings §5: the prefill peak per family (hidden-size tensors held besides the MLP's, GELU-tanh "
         "temporaries, MoE routed copies, Falcon's K/V cached at num_heads)")
EAGER = ("findings §6: transformers has no SDPA attention for this family; eager keeps the s x s scores "
         "(fp32 softmax and its cast) where the analytic --attn-implementation sdpa assumes a fused kernel")
BIGCODE = ("findings §7: GPTBigCode registers a (n_positions x n_positions) bool causal-mask buffer (64 MiB at "
           "8192); transformers 5 keeps it, the analytic estimate counts it only for engine version 4.34")
JAMBA = ("findings §8 (a trace limitation, not a formula finding): without the CUDA-only mamba_ssm/causal_conv1d "
         "kernels transformers runs the reference selective scan, whose (b, d_inner, s, d_state) tensors a GPU "
         "run with the kernels never stores")

DISAGREE = {
    "full": set(TINY_SOURCES),
    "full-recompute": {"qwen3_moe", "gemma2", "gpt_oss", "gpt_bigcode", "gpt_neox", "falcon", "bloom", "opt", "jamba"},
    "lora": {"qwen3", "mixtral", "gemma2", "gemma3", "phi", "phi3", "deepseek_v3", "gpt_oss", "gpt2", "gpt_bigcode",
             "falcon", "bloom", "opt", "olmo2", "jamba"},
    "lora-recompute": set(TINY_SOURCES) - {"mixtral", "gpt_neox", "falcon"},
    "serve": set(TINY_SOURCES) - {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma3"},
}
"""Cases outside the tolerance as of this branch (benchmarks/trace_agreement.py prints the table)."""


def _reason(family: str, job: str) -> str:
    if family == "jamba":
        return JAMBA
    if family == "gpt_bigcode":
        return BIGCODE
    if family in ("gemma2", "gpt_oss", "bloom"):
        return EAGER
    if job.startswith("lora"):
        return LORA
    if job == "serve":
        return SERVE
    return FULL if job == "full" else RECOMPUTE


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
}
FULL_SIZE_KNOWN = {
    ("meta-llama/Llama-2-7b-hf", "full-mixed"): FULL,
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
