"""Every ``serve`` case of the published cases: memest's prediction vs the measurement.

``benchmarks/serving_cases.py`` writes :func:`render` to ``benchmarks/serving_cases.md``; the tests
(tests/test_validation_serving.py) check :func:`comparisons`, so the report and the tests compare the
same figures. Each comparison is like with like: a vLLM log line against the same quantity of vLLM's
arithmetic, peak allocated against peak allocated.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from memest.devices import Device, GiB, get_device
from memest.errors import MemestError
from memest.estimate import estimate
from memest.estimate.serving.vllm.engine import vllm_ranks
from memest.sources import load_model
from memest.validation import cases
from memest.workload import Engine, Parallelism, ServingConfig


@dataclass(frozen=True)
class Comparison:
    """One predicted figure against its measurement.

    Attributes:
        case: The case id.
        figure: What is compared (the measurement's key).
        predicted: memest's value, in the measurement's unit.
        measured: The published value.
        unit: ``GiB``, ``tokens``, ``blocks``, ``x``.
        fitted: True when the measurement was used to fit a constant this figure depends on (so
            agreement is partly by construction).
    """

    case: str
    figure: str
    predicted: float
    measured: float
    unit: str
    fitted: bool = False

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted - self.measured) / self.measured


def load_cases() -> list[dict[str, Any]]:
    """The serve cases."""
    return cases.load_cases("serve")


def _device(name: str, total_gib: float | None = None) -> Device:
    d = get_device(name)
    return dataclasses.replace(d, memory_bytes=round(total_gib * GiB)) if total_gib else d


def _vllm019(c: dict[str, Any]) -> list[Comparison]:
    m, st, par = c["measured"], c["settings"], c["parallelism"]
    spec = load_model(c["model"])
    s = ServingConfig(
        dtype="fp32" if c["dtype"] == "float32" else "auto",
        quantization=c["quantization"] or "none",
        kv_cache_dtype=st["kv_cache_dtype"],
        max_model_len=c["seq_len"]["max_model_len"],
        gpu_memory_utilization=st["gpu_memory_utilization"],
        max_num_batched_tokens=st["max_num_batched_tokens"],
        max_num_seqs=st["max_num_seqs"],
        block_size=st["block_size_tokens"],
        engine_version="0.19",
        parallelism=Parallelism(tp=par["tp"], pp=par["pp"]),
    )
    device = _device("H100-80GB", m["total_gpu_memory_GiB"])
    rank0 = vllm_ranks(spec, s, device)[0]
    summary = estimate(spec, s, device).serving
    assert summary is not None
    b = rank0.budget
    fit_act = c["id"] in ("vllm019_llama31_8b_pp2", "vllm019_llama31_8b_fp32")
    return [
        Comparison(c["id"], "weights_GiB", b.weights / GiB, m["weights_GiB"], "GiB"),
        Comparison(c["id"], "torch_activation_peak_increase_GiB", b.activation / GiB,
                   m["torch_activation_peak_increase_GiB"], "GiB", fitted=fit_act),
        Comparison(c["id"], "non_torch_forward_increase_GiB", b.non_torch / GiB, m["non_torch_forward_increase_GiB"],
                   "GiB", fitted=True),
        Comparison(c["id"], "available_kv_cache_GiB", b.available / GiB, m["available_kv_cache_GiB"], "GiB"),
        Comparison(c["id"], "kv_cache_tokens", summary.kv_cache_tokens, m["kv_cache_tokens"], "tokens"),
        Comparison(c["id"], "kv_cache_blocks", summary.kv_cache_blocks, m["kv_cache_blocks"], "blocks"),
        Comparison(c["id"], "max_concurrency_x_at_max_model_len", summary.max_concurrency,
                   m["max_concurrency_x_at_max_model_len"], "x"),
    ]


def _vllm065(c: dict[str, Any]) -> list[Comparison]:
    m = c["measured"]
    spec = load_model(c["model"])
    device = _device("H100-80GB", m["total_gpu_memory_GiB"])
    out = []
    for tp, prefix in ((1, ""), (2, "tp2_")):
        s = ServingConfig(engine_version="0.6", max_model_len=8192, gpu_memory_utilization=0.9,
                          parallelism=Parallelism(tp=tp))
        b = vllm_ranks(spec, s, device)[0].budget
        weights_key = "weights_GiB" if tp == 1 else "tp2_weights_per_gpu_GiB"
        nt_key = "non_torch_memory_GiB" if tp == 1 else "tp2_non_torch_per_gpu_GiB"
        out += [
            Comparison(c["id"], weights_key, b.weights / GiB, m[weights_key], "GiB"),
            Comparison(c["id"], f"{prefix}activation_peak_GiB", b.activation / GiB, m[f"{prefix}activation_peak_GiB"],
                       "GiB", fitted=True),
            Comparison(c["id"], nt_key, b.non_torch / GiB, m[nt_key], "GiB", fitted=True),
        ]
        if tp == 1:
            out.append(Comparison(c["id"], "instance_budget_GiB", b.requested / GiB, m["instance_budget_GiB"], "GiB"))
            out.append(Comparison(c["id"], "available_kv_cache_GiB", b.available / GiB, m["available_kv_cache_GiB"],
                                  "GiB", fitted=True))
    return out


def _vllm024(c: dict[str, Any]) -> list[Comparison]:
    m = c["measured"]
    device = get_device("A100-80GB")
    out = []
    for model, tp, key in (("meta-llama/Llama-2-7b-hf", 1, "llama2_7b_tp1_num_gpu_blocks_after_fix"),
                           ("meta-llama/Llama-2-70b-hf", 4, "llama2_70b_tp4_4xA100_num_gpu_blocks_after_fix")):
        s = ServingConfig(engine_version="0.2", max_model_len=4096, gpu_memory_utilization=0.9,
                          parallelism=Parallelism(tp=tp))
        blocks = min(r.num_blocks for r in vllm_ranks(load_model(model), s, device))
        out.append(Comparison(c["id"], key, blocks, m[key], "blocks", fitted=True))
    return out


def _hf_octocoder(c: dict[str, Any]) -> list[Comparison]:
    quantization = {"hf_octocoder_bf16": "none", "hf_octocoder_int8": "int8", "hf_octocoder_int4": "fp4"}[c["id"]]
    s = ServingConfig(engine=Engine.HF, engine_version="4.34", quantization=quantization, dtype="bf16"
                      if quantization == "none" else "fp16", batch_size=1, prompt_len=20, max_new_tokens=60)
    est = estimate(load_model(c["model"]), s, get_device("A100-40GB"))
    return [Comparison(c["id"], "peak_allocated_GiB", est.per_device.allocated_bytes / GiB,
                       c["measured"]["peak_allocated_GiB"], "GiB")]


HANDLERS = {
    "vllm019_": _vllm019,
    "vllm065dev_": _vllm065,
    "vllm_pr2031_": _vllm024,
    "hf_octocoder_": _hf_octocoder,
}

NOT_MODELLED = {
    "torchao_llama31_8b_longctx_kvcache": "torchao's gpt-fast generate.py (static cache plus a cache_size^2 boolean "
    "mask) is neither vLLM nor transformers generate; its figure is peak *reserved*, not allocated",
}


def comparisons(case: dict[str, Any]) -> list[Comparison]:
    """memest's predictions for one case (empty when the case is not modelled).

    Raises:
        MemestError: the model cannot be loaded (e.g. its family has no adapter yet).
    """
    for prefix, handler in HANDLERS.items():
        if case["id"].startswith(prefix):
            return handler(case)
    return []


def render() -> str:
    """The Markdown report."""
    lines = [
        "# Serving: memest vs published measurements",
        "",
        "Generated by `python benchmarks/serving_cases.py` from `benchmarks/data/validation_cases.json` (every case of kind "
        "`serve`). Error = (predicted − measured) / measured. Figures marked *fitted* depend on a constant fitted to "
        "that same measurement (see `memest/estimate/serving/vllm/budget.py`), so their agreement is partly by construction. "
        "vLLM logs GiB with two decimals, so a GiB figure is only known to ±0.005 GiB.",
        "",
        "| case | figure | predicted | measured | error | note |",
        "|---|---|---:|---:|---:|---|",
    ]
    worst: list[Comparison] = []
    for case in load_cases():
        if case["id"] in NOT_MODELLED:
            lines.append(f"| {case['id']} | — | — | — | — | not modelled: {NOT_MODELLED[case['id']]} |")
            continue
        try:
            rows = comparisons(case)
        except MemestError as exc:
            lines.append(f"| {case['id']} | — | — | — | — | cannot run yet: {exc} |")
            continue
        for r in rows:
            fmt = "{:,.0f}" if r.unit in ("tokens", "blocks") else "{:,.3f}" if r.unit == "GiB" else "{:,.2f}"
            lines.append(f"| {r.case} | {r.figure} | {fmt.format(r.predicted)} | {fmt.format(r.measured)} | "
                         f"{r.error:+.2%} | {'fitted' if r.fitted else ''} |")
            if not r.fitted:
                worst.append(r)
    worst.sort(key=lambda r: -abs(r.error))
    lines += ["", "## Largest errors (figures not fitted to their own case)", ""]
    for r in worst[:8]:
        lines.append(f"- {r.case} · {r.figure}: {r.error:+.2%}")
    return "\n".join(lines) + "\n"
