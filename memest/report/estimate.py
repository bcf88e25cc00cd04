"""``memest hf``: one job's estimate, verdict and recommendation as a rich table, JSON and Markdown.

One row builder (:func:`rows`) feeds every format, so they cannot drift apart."""

from __future__ import annotations

import math
from typing import Any

from memest import __version__
from memest.devices import GiB
from memest.planning.recommend import Assessment, Candidate
from memest.report.tables import Narrowest, name_col, new_table, number_col, prose_col
from memest.report.units import CONFIRM, count, gib, percent, plural, size
from memest.result import RankEstimate, ServingSummary, plain, rank_dict
from memest.spec import ModelSpec
from memest.workload import Method, ServingConfig, TrainingConfig, Workload
from memest.workload.settings import describe


def rows(rank: RankEstimate) -> list[tuple[str, str, int, float, str]]:
    """(name, kind, bytes, share of device used, formula) per term."""
    total = rank.device_used_bytes or 1
    return [(t.name, t.kind.value, t.bytes, t.bytes / total, t.formula) for t in rank.terms]


def describe_model(spec: ModelSpec) -> str:
    """One line of architecture facts."""
    parts = [
        spec.model_type,
        f"{count(spec.num_params)} params",
        f"{spec.num_layers} layers",
        f"h {spec.hidden_size}",
        *((f"{spec.num_heads} heads / {spec.num_kv_heads} KV", f"head_dim {spec.head_dim}") if spec.num_heads
          else ("no attention heads",)),
        f"V {spec.vocab_size:,}",
    ]
    if spec.num_experts:
        parts.append(f"{spec.num_experts} experts, top-{spec.num_experts_per_tok}")
    return " · ".join(parts)


def describe_workload(w: Workload) -> str:
    """One line of the workload's main settings (:func:`memest.workload.settings.describe`)."""
    return describe(w)


# ---- JSON ----


_BASIS_WORDS = {"measured": "measured", "nominal": "nominal", "working set": "Metal working set", "user": "as given"}
"""How the device line labels a capacity (:attr:`memest.devices.Device.capacity_basis`)."""


def finite(x: float) -> float | None:
    """A cost for JSON: None for an unpriced device's ``inf`` (JSON has no infinity)."""
    return x if math.isfinite(x) else None


def _candidate_dict(c: Candidate | None) -> dict[str, Any] | None:
    if c is None:
        return None
    return {
        "flags": c.flags,
        "cost": finite(c.cost),
        "lossless": c.lossless,
        "how": [change.how for change in c.changes if change.how],
        "devices": c.devices,
        "device_used_bytes": c.estimate.per_device.device_used_bytes,
        "needed_bytes": c.verdict.needed_bytes,
        "usable_bytes": c.verdict.usable_bytes,
        "workload": plain(c.workload),
    }


def to_dict(a: Assessment) -> dict[str, Any]:
    """The JSON document of ``memest hf --json`` (ints for bytes, no rounding)."""
    spec, est, v = a.spec, a.estimate, a.verdict
    per = est.per_device
    out: dict[str, Any] = {
        "memest_version": __version__,
        "model": {
            "name": spec.name,
            "model_type": spec.model_type,
            "architecture": spec.architecture,
            "source": spec.source,
            "num_params": spec.num_params,
            "num_active_params": spec.num_active_params,
            "params_by_component": {c.value: n for c, n in spec.params_by_component().items()},
            "num_layers": spec.num_layers,
            "hidden_size": spec.hidden_size,
            "intermediate_size": spec.intermediate_size,
            "num_heads": spec.num_heads,
            "num_kv_heads": spec.num_kv_heads,
            "head_dim": spec.head_dim,
            "vocab_size": spec.vocab_size,
            "num_experts": spec.num_experts,
            "max_position_embeddings": spec.max_position_embeddings,
            "tie_word_embeddings": spec.tie_word_embeddings,
            "notes": list(spec.notes),
        },
        "mode": a.workload.mode,
        "workload": plain(a.workload),
        "device": {"name": a.fleet.name if a.fleet else v.device.name, "memory_bytes": v.device.memory_bytes,
                   "count": v.count, "measured_capacity": v.device.measured},
        "per_device": {
            "allocated_bytes": per.allocated_bytes,
            "reserved_bytes": per.reserved_bytes,
            "device_used_bytes": per.device_used_bytes,
            "low_bytes": per.low_bytes,
            "high_bytes": per.high_bytes,
        },
        "terms": [{"name": t.name, "kind": t.kind.value, "bytes": t.bytes, "formula": t.formula} for t in per.terms],
        "ranks": [rank_dict(r) for r in est.ranks],
        "fits": v.fits,
        "verdict": v.kind,
        "concurrency": ({"held": v.held_sequences, "asked": v.asked_sequences, "tokens": v.sequence_tokens}
                        if not v.headroom_applied else None),
        "headroom": v.headroom,
        "headroom_applied": v.headroom_applied,
        "fit_blocker": v.blocker,
        "needed_bytes": v.needed_bytes,
        "usable_bytes": v.usable_bytes,
        "margin_bytes": v.margin_bytes,
        "fits_on": [d.name for d in a.fits_on] if not a.device_given else None,
        "recommendation": None,
        "rules_of_thumb": [{"rule": r.name, "bytes": r.bytes} for r in a.rules],
        "assumptions": [*est.assumptions, *a.notes],
        "confirm": CONFIRM,
    }
    if a.recommendation is not None:
        out["recommendation"] = {
            "cheapest": _candidate_dict(a.recommendation.cheapest),
            "lossless": _candidate_dict(a.recommendation.lossless),
            "on_device": _candidate_dict(a.recommendation.on_device),
            "evaluated": a.recommendation.evaluated,
        }
    if est.serving is not None:
        out["serving"] = plain(est.serving)
    if est.host_bytes:
        out["host_bytes_per_node"] = est.host_bytes
    if a.fleet is not None:
        out["fleet"] = fleet_dict(a)
    if a.gguf_options:
        out["gguf_options"] = [{"quantization": o.quantization, "n_ctx": o.n_ctx, "gpu_layers": o.gpu_layers,
                                "layers": o.layers, "largest_full_ctx": o.largest_full_ctx} for o in a.gguf_options]
    return out


def fleet_dict(a: Assessment) -> dict[str, Any]:
    """Unlike devices (``--gpu A,B``): each device, each verdict (one per device for llama.cpp / Ollama; the
    binding card's alone for the engines that run at the smallest pool) and the device that binds."""
    assert a.fleet is not None
    return {
        "devices": [{"name": d.name, "memory_bytes": d.memory_bytes, "capacity_basis": d.capacity_basis}
                    for d in a.fleet.devices],
        "verdicts": [{"device": x.device.name, "needed_bytes": x.needed_bytes, "usable_bytes": x.usable_bytes,
                      "margin_bytes": x.margin_bytes, "fits": x.fits, "verdict": x.kind} for x in a.device_verdicts],
        "binding": a.verdict.device.name,
        "split": "layers" if len(a.device_verdicts) == len(a.fleet) else "smallest pool",
    }


def _device_text(a: Assessment) -> str:
    """The device line: ``N × NAME (capacity basis)``, or a fleet's devices."""
    v = a.verdict
    if a.fleet is not None:
        return f"{len(a.fleet)} unlike devices: " + ", ".join(
            f"{d.name} ({gib(d.memory_bytes)})" for d in a.fleet.devices)
    basis = "" if v.device.measured else " " + _BASIS_WORDS[v.device.capacity_basis]
    return f"{v.count} × {v.device.name} ({gib(v.device.memory_bytes)}{basis})"


def fleet_lines(a: Assessment) -> list[str]:
    """Per-device fit on unlike devices: each device's figure against its own usable memory (llama.cpp /
    Ollama), or the card with the smallest pool, which every rank runs at (vLLM, SGLang, TensorRT-LLM)."""
    if a.fleet is None:
        return []
    if len(a.device_verdicts) != len(a.fleet):
        engine = a.estimate.serving.engine if a.estimate.serving else "the engine"
        return [f"unlike devices: {_engine_name(engine)} shards tensors equally and takes the smallest KV pool of its "
                f"ranks, so every rank runs at {a.verdict.device.name}'s memory; the verdict is that card's"]
    out = []
    for j, x in enumerate(a.device_verdicts):
        state = "fits" if x.fits else f"does not fit, short by {size(-x.margin_bytes)}"
        out.append(f"CUDA{j} {x.device.name}: {gib(x.needed_bytes)} of {gib(x.usable_bytes)} usable, {state}"
                   + (" (the least room: it decides)" if x is a.verdict and len(a.device_verdicts) > 1 else ""))
    return out


# ---- Markdown ----


def to_markdown(a: Assessment) -> str:
    """The estimate table, verdict, band, serving summary and recommendation as GitHub Markdown:
    what :func:`render` shows, less the rules of thumb."""
    per = a.estimate.per_device
    lines = [
        f"**{a.spec.name}** — {describe_model(a.spec)}  ",
        f"{describe_workload(a.workload)} · "
        + (a.fleet.name if a.fleet else f"{a.verdict.count} × {a.verdict.device.name}"),
        "",
    ]
    notes = [*a.spec.notes, *a.notes]
    if notes:
        lines += [f"> Note: {note}  " for note in notes] + [""]
    ranks = a.estimate.ranks if len(a.estimate.ranks) > 1 else (per,)
    for rank in ranks:
        if len(ranks) > 1:
            lines += [f"*{rank.label} (×{rank.count})*", ""]
        lines += ["| term | kind | GiB | share |", "|---|---|---:|---:|"]
        for name, kind, n, share, _ in rows(rank):
            lines.append(f"| {name} | {kind} | {n / GiB:,.2f} | {share:.1%} |")
        lines += [
            f"| **peak allocated** | | {rank.allocated_bytes / GiB:,.2f} | |",
            f"| **peak reserved** | | {rank.reserved_bytes / GiB:,.2f} | |",
            f"| **device used** | | {rank.device_used_bytes / GiB:,.2f} | |",
            "",
        ]
    summary = [f"**{_verdict_line(a)}**", *filter(None, [paged_line(a)]), *fleet_lines(a), _band_line(a)]
    summary += [text for text, _ in serving_lines(a)]
    if a.estimate.host_bytes:
        summary.append(_host_line(a))
    for label, flags, tail, _ in _recommendation_parts(a):
        summary.append(f"**{label}:** `{flags}`{tail}" if label else tail)
    if not a.device_given:
        summary.append(_fits_on_line(a))
    lines += [f"{text}  " for text in summary[:-1]] + summary[-1:]
    return "\n".join(lines) + "\n"


def _band_line(a: Assessment) -> str:
    line = _band_words(a)
    return line.replace(" per device", f" on {a.verdict.device.name}") if a.fleet is not None else line


def _band_words(a: Assessment) -> str:
    per = a.estimate.per_device
    each = a.device_verdicts
    if a.fleet is not None and len(each) == len(a.estimate.ranks):  # the band of the device that decides
        per = a.estimate.ranks[next(j for j, x in enumerate(each) if x is a.verdict)]
    if not a.verdict.headroom_applied:  # vLLM holds its budget whatever the job's tensors take
        return (f"band of the job's own memory (weights, activations, its KV cache): {gib(per.low_bytes)} – "
                f"{gib(per.high_bytes)} per device")
    return f"band {gib(per.low_bytes)} – {gib(per.high_bytes)} per device"


def _host_line(a: Assessment) -> str:
    s = a.estimate.serving
    if s is not None and s.engine in ("llama.cpp", "ollama"):  # no training states: what stays on the CPU
        return (f"host RAM for what {s.engine} keeps on the CPU (mmapped file pages of the layers left there, "
                f"host KV, host buffers): {gib(a.estimate.host_bytes)} per node")
    return f"host RAM for offloaded states: {gib(a.estimate.host_bytes)} per node"


def _fits_on_line(a: Assessment) -> str:
    """The catalog devices that fit at the same count (shown when no --gpu was given)."""
    v = a.verdict
    names = ", ".join(d.name for d in a.fits_on) or "none"
    rule = f"{percent(v.headroom)} headroom" if v.headroom_applied else f"the engine's {_share_name(a)}"
    return f"Fits ({v.count} device{'s' if v.count > 1 else ''}, {rule}): {names}"


def serving_lines(a: Assessment) -> list[tuple[str, str]]:
    """The serving summary as (text, rich style) lines: the engine's KV arithmetic, its start-up
    error if it would refuse the job, and the inverse queries (largest length, concurrency, devices)."""
    from memest.planning.search import MAX_PP_QUERY

    s = a.estimate.serving
    if s is None or not isinstance(a.workload, ServingConfig):
        return []
    w = a.workload
    out: list[tuple[str, str]] = []
    state = f" + {gib(s.state_bytes_per_sequence)} per sequence (states)" if s.state_bytes_per_sequence else ""
    if s.engine == "vllm" and s.kv_cache_bytes_per_token == 0 and not s.state_bytes_per_sequence:
        out.append((f"vLLM {s.engine_version}: no KV cache (encoder-only: each request is one forward) · "
                    f"{gib(s.kv_budget_bytes)} of {gib(s.requested_bytes)} requested left free (non-KV "
                    f"{gib(s.non_kv_bytes)}) · max_num_seqs bounds the requests at once: {s.largest_concurrency:,}", ""))
    elif s.engine == "vllm":
        out.append((f"vLLM {s.engine_version}: KV cache {s.kv_cache_bytes_per_token:,} B/token{state} · available "
                    f"{gib(s.kv_budget_bytes)} of {gib(s.requested_bytes)} requested (non-KV {gib(s.non_kv_bytes)}) · pool "
                    f"{s.kv_cache_tokens:,} tokens ({s.kv_cache_blocks:,} blocks) · max concurrency "
                    f"{s.max_concurrency:.2f}x at {s.max_model_len:,} tokens", ""))
    elif s.engine == "sglang":
        out.append((f"SGLang {s.engine_version}: KV cache {s.kv_cache_bytes_per_token:,} B/token · weights "
                    f"{gib(s.non_kv_bytes)} of the static {gib(s.requested_bytes)} (mem_fraction_static) · pool "
                    f"{s.kv_cache_tokens:,} tokens ({gib(s.kv_budget_bytes)}) · max concurrency "
                    f"{s.max_concurrency:.2f}x at {s.max_model_len:,} tokens", ""))
    elif s.engine == "trtllm":
        out.append((f"TensorRT-LLM {s.engine_version}: KV cache {s.kv_cache_bytes_per_token:,} B/token · "
                    f"{gib(s.kv_budget_bytes)} for the KV cache after non-KV {gib(s.non_kv_bytes)} · pool "
                    f"{s.kv_cache_tokens:,} tokens ({s.kv_cache_blocks:,} blocks) · max concurrency "
                    f"{s.max_concurrency:.2f}x at {s.max_model_len:,} tokens", ""))
    elif s.engine in ("llama.cpp", "ollama"):
        e = a.estimate.extra
        ftype = e["llamacpp_file_type"]
        kind = "GGUF file" if ftype == "gguf" else f"{ftype.upper()} GGUF"  # a given file: its own mix of types
        out.append((f"{s.engine} {s.engine_version}: {kind} "
                    f"{gib(e['llamacpp_file_bytes'])} · {e['llamacpp_offloaded_layers']}/{e['llamacpp_layers']} layers "
                    f"on the GPU · KV {s.kv_cache_bytes_per_token:,} B/cell x {s.kv_cache_tokens:,} cells · host RAM "
                    f"{gib(a.estimate.host_bytes)} (mmapped file pages, host KV, host buffers)", ""))
        if a.gguf_options and not (a.verdict.fits and e["llamacpp_offloaded_layers"] == e["llamacpp_layers"]):
            out.append((gguf_line(a), ""))  # a smaller type is the answer only when the asked one does not fit
        if s.engine_error == "no_memory":
            out.append((f"{s.engine} would fail to allocate its buffers on this device; lower --n-gpu-layers, "
                        "--max-model-len or the --quantization", "bold red"))
        return out  # n_ctx is the capacity: the quant search above answers it
    else:
        out.append((f"transformers {s.engine_version} generate: KV cache {s.kv_cache_bytes_per_token:,} B/token{state} · "
                    f"non-KV peak {gib(s.non_kv_bytes)}", ""))
    higher = _higher_utilization(a)
    if s.engine_error == "no_memory":
        fixes = ["more devices (--tp/--pp)"]
        if a.spec.quantization is None and isinstance(a.workload, ServingConfig) and a.workload.quantization == "none":
            fixes.append("a --quantization")  # not for a checkpoint already stored quantized (fp8, AWQ, ...)
        if higher:
            fixes.append(higher)
        if s.engine == "sglang":
            fixes.append("a higher --mem-fraction-static (SGLang's own hint)")
        listed = fixes[0] if len(fixes) == 1 else ", ".join(fixes[:-1]) + " or " + fixes[-1]
        out.append((f"{_engine_name(s.engine)} would refuse to start: no memory left for the KV cache; use {listed}"
                    if s.engine != "hf" else "generate would run out of memory on this device", "bold red"))
    elif s.engine_error == "max_model_len":
        hint = (f" Based on the available memory, the estimated maximum model length is "
                f"{s.largest_max_model_len_one_request:,}." if s.largest_max_model_len_one_request else "")
        fix = f"Use {higher} or decrease --max-model-len." if higher else "Decrease --max-model-len."
        if s.engine == "vllm":
            out.append((f"vLLM would refuse to start: to serve at least one request with max_model_len "
                        f"({s.max_model_len:,}), {gib(s.request_kv_bytes)} KV cache is needed, more than the available "
                        f"{gib(s.kv_budget_bytes)}.{hint} {fix}", "bold red"))
        else:  # SGLang rejects longer inputs; TensorRT-LLM caps max_seq_len to its pool
            out.append((f"{_engine_name(s.engine)}'s pool of {s.kv_cache_tokens:,} tokens cannot hold one request of "
                        f"max_model_len ({s.max_model_len:,}): {gib(s.request_kv_bytes)} KV cache is needed, more than "
                        f"{gib(s.kv_budget_bytes)}; the longest that fits is {s.largest_max_model_len_one_request:,}. "
                        "Decrease --max-model-len or add devices.", "bold red"))
    par = a.fewest
    layout = w.layout_words(par) if par and isinstance(w, ServingConfig) else None
    fewest = ((layout or f"tp {par.tp}" + (f" x pp {par.pp}" if par.pp > 1 else ""))
              + f" ({par.tp * par.pp} x {a.verdict.device.name})"
              if par else f"none with tp within a node and pp up to {MAX_PP_QUERY}")
    held = (f"{plural(s.held_sequences, 'request')} ({s.replicas} replicas x {s.largest_concurrency:,})"
            if s.replicas > 1 else plural(s.largest_concurrency, 'request'))
    out.append((f"Capacity: {held} of {s.max_model_len:,} tokens at once · longest "
                f"max_model_len for {plural(w.batch_size, 'request')}: {s.largest_max_model_len:,}"
                + ("" if a.fleet is not None else  # the fewest-devices search is over alike devices
                   f" · fewest devices for {w.batch_size} x {s.max_model_len:,} tokens: {fewest}"), ""))
    return out


def gguf_line(a: Assessment) -> str:
    """The llama.cpp quant x context x offload search in words ("Q5_K_M fits fully on the GPU at
    16,384 tokens; Q8_0 fits with 6 of 33 layers in RAM")."""
    from memest.estimate.serving.llamacpp.fit import best

    full, partial, shorter = best(list(a.gguf_options))
    parts = []
    if shorter is not None:
        parts.append(f"{shorter.quantization.upper()} fits fully on the GPU at up to {shorter.largest_full_ctx:,} tokens")
    if full is not None:
        longest = f" (up to {full.largest_full_ctx:,})" if full.largest_full_ctx > full.n_ctx else ""
        parts.append(f"{full.quantization.upper()} fits fully on the GPU at {full.n_ctx:,} tokens{longest}")
    if partial is not None:
        parts.append(f"{partial.quantization.upper()} fits with {partial.host_layers} of {partial.layers} layers in RAM")
    if not parts:
        tried = ", ".join(o.quantization.upper() for o in a.gguf_options)
        return f"GGUF quants: none of {tried} fits at {a.gguf_options[0].n_ctx:,} tokens"
    return "GGUF quants: " + "; ".join(parts)


def _higher_utilization(a: Assessment) -> str:
    """"a higher --gpu-memory-utilization (0.95 fits)" when a higher value makes the job fit, else
    "": never when the weights and the activation peak leave no room even at 1.0."""
    util = a.utilization
    if util is None or not isinstance(a.workload, ServingConfig) or util <= a.workload.gpu_memory_utilization:
        return ""
    return f"a higher --gpu-memory-utilization ({util:.2f} fits)"


ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM", "hf": "transformers"}
SHARE_NAMES = {"vllm": "gpu_memory_utilization", "sglang": "mem_fraction_static", "trtllm": "free_gpu_memory_fraction"}


def workload_share(w: Workload) -> str:
    """"vLLM's gpu_memory_utilization" (SGLang's mem_fraction_static, ...) for a serving workload."""
    engine = w.engine.value if isinstance(w, ServingConfig) else "vllm"
    return f"{_engine_name(engine)}'s {SHARE_NAMES.get(engine, 'gpu_memory_utilization')}"


def _engine_name(engine: str) -> str:
    return ENGINE_NAMES.get(engine, engine)


def _share_name(a: Assessment) -> str:
    """The setting that sets an up-front engine's share of the device."""
    s = a.estimate.serving
    return SHARE_NAMES.get(s.engine if s else "vllm", "gpu_memory_utilization")


def _engine_verdict_line(a: Assessment) -> str:
    """The up-front fit rule of :mod:`memest.planning.fit` in words, for SGLang and TensorRT-LLM."""
    v, s = a.verdict, a.estimate.serving
    assert s is not None
    name, share = _engine_name(s.engine), _share_name(a)
    held = f"{name} holds {gib(v.needed_bytes)} of {gib(v.usable_bytes)} per device"
    note = f"--headroom {percent(v.headroom)} not applied: {share} sets {name}'s share"
    pool = _pool_words(s)
    if v.fits:
        return f"FITS: {held}; {pool} ({_batch_words(s)}); {note}"
    if v.blocker == "no_memory":
        return f"DOES NOT FIT: {name} would refuse to start (below); {note}"
    if v.blocker == "max_model_len":
        return f"DOES NOT FIT: one request of max_model_len does not fit {name}'s pool (below); {note}"
    if v.kind == "queues":
        return f"{queued_words(a)}; {held}; {note}"
    return f"DOES NOT FIT: {held}, over by {size(-v.margin_bytes)}; {note}"


def _vllm_verdict_line(a: Assessment) -> str:
    """The vLLM fit rule of :mod:`memest.planning.fit` in words."""
    v, s = a.verdict, a.estimate.serving
    assert s is not None and isinstance(a.workload, ServingConfig)
    util = a.workload.gpu_memory_utilization
    held = (f"vLLM holds {gib(v.needed_bytes)} of {gib(v.usable_bytes)} per device (gpu_memory_utilization {util:.2f}: "
            f"{gib(s.requested_bytes)} + {gib(v.needed_bytes - s.requested_bytes)} outside it)")
    note = f"--headroom {percent(v.headroom)} not applied: gpu_memory_utilization sets vLLM's share"
    pool = (_pool_words(s) if s.kv_cache_bytes_per_token or s.state_bytes_per_sequence
            else f"no KV cache needed; max_num_seqs allows {plural(s.largest_concurrency, 'request')} "
            f"of {s.max_model_len:,} tokens" + (" per replica" if s.replicas > 1 else ""))
    if v.fits:
        return f"FITS: {held}; {pool} ({_batch_words(s)}); {note}"
    if v.blocker in ("no_memory", "max_model_len"):
        return f"DOES NOT FIT: vLLM would refuse to start (below); {note}"
    if v.kind == "queues":
        return f"{queued_words(a)}; {held}; {note}"
    util = a.utilization
    outside = v.needed_bytes - s.requested_bytes
    if util is not None and util < a.workload.gpu_memory_utilization:
        fix = f"lower --gpu-memory-utilization ({util:.2f} fits)"
    elif outside + v.device.memory_bytes // 100 > v.usable_bytes:  # even 0.01 of the card is over it
        fix = f"what vLLM holds outside gpu_memory_utilization ({gib(outside)}) alone fills the device"
    else:  # the search found the largest value within the card: its pool is too small
        fix = "a lower --gpu-memory-utilization would leave the KV pool too small for the job"
    return f"DOES NOT FIT: {held}, over by {size(-v.margin_bytes)}: {fix}; {note}"


def _pool_words(s: ServingSummary) -> str:
    """What the KV pool holds, each replica's pool when there are several data-parallel replicas."""
    if s.replicas == 1:
        return f"KV pool holds {plural(s.largest_concurrency, 'request')} of {s.max_model_len:,} tokens"
    return (f"each of {s.replicas} replicas' KV pools holds {plural(s.largest_concurrency, 'request')} of "
            f"{s.max_model_len:,} tokens ({s.held_sequences:,} at once)")


def _batch_words(s: ServingSummary) -> str:
    """``batch_size N``, and each replica's share of it when there are several replicas."""
    if s.replicas == 1:
        return f"batch_size {s.batch_size:,}"
    return f"batch_size {s.batch_size:,} over {s.replicas} replicas: up to {s.replica_batch_size:,} each"


def queued_words(a: Assessment) -> str:
    """The verdict of a job that starts and queues (:attr:`memest.planning.fit.Verdict.kind`), in words;
    with data-parallel replicas, the held sequences are every replica's pool's together."""
    v, s = a.verdict, a.estimate.serving
    name = _engine_name(s.engine if s else "vllm")
    each = (f"{s.replicas} replicas x {s.largest_concurrency:,} each, {s.replica_batch_size:,} asked of each; "
            if s is not None and s.replicas > 1 else "")
    return (f"STARTS: {name} holds {v.held_sequences:,} of {v.asked_sequences:,} concurrent sequences at "
            f"{v.sequence_tokens:,} tokens ({each}the rest wait)")


def _verdict_line(a: Assessment) -> str:
    line = _verdict_words(a)
    return line.replace(" per device", f" on {a.verdict.device.name}") if a.fleet is not None else line


def paged_line(a: Assessment) -> str | None:
    """Why the verdict's figure is below the table's device used, when bitsandbytes' paged optimizer states are
    resident (:data:`memest.result.PAGED_STATES`): they live in CUDA managed memory, which the driver evicts to host
    RAM when the device fills, so the fit leaves them out (:attr:`memest.result.RankEstimate.required_bytes`);
    None without them."""
    per = a.estimate.per_device
    paged = per.device_used_bytes - per.required_bytes
    if paged <= 0 or not a.verdict.headroom_applied:
        return None
    return (f"The fit leaves out the {gib(paged)} of paged optimizer states in device used: bitsandbytes keeps them "
            "in CUDA managed memory, which the driver evicts to host RAM when the device fills (slower steps, no "
            "out-of-memory).")


def _verdict_words(a: Assessment) -> str:
    v = a.verdict
    if not v.headroom_applied:
        s = a.estimate.serving
        return _engine_verdict_line(a) if s is not None and s.engine != "vllm" else _vllm_verdict_line(a)
    used, usable = gib(v.needed_bytes), gib(v.usable_bytes)
    if v.fits:
        return (f"FITS: {used} of {usable} usable per device ({percent(v.headroom)} headroom kept), "
                f"margin {size(v.margin_bytes)}")
    return (f"DOES NOT FIT: {used} needed, {usable} usable per device ({percent(v.headroom)} headroom kept), "
            f"short by {size(-v.margin_bytes)}")


# ---- rich ----


def render(a: Assessment, *, explain: bool = False) -> Any:
    """A rich renderable of the whole assessment."""
    from rich.console import Group
    from rich.text import Text

    spec, est, v = a.spec, a.estimate, a.verdict
    parts: list[Any] = [
        Text.assemble(("Model   ", "bold"), spec.name, "  ", (describe_model(spec), "dim")),
        Text.assemble(("Job     ", "bold"), describe_workload(a.workload)),
        Text.assemble(("Device  ", "bold"), _device_text(a) + ("" if a.device_given else "  [default; pass --gpu]")),
    ]
    for note in (*spec.notes, *a.notes):
        parts.append(Text(f"Note: {note}", style="yellow"))
    ranks = est.ranks if len(est.ranks) > 1 else (est.per_device,)
    for rank in ranks:
        parts.append(_table(rank, explain=explain, title=None if len(ranks) == 1 else f"{rank.label} (×{rank.count})"))
    if not v.headroom_applied:  # vLLM takes its budget up front, whatever the job's own tensors need
        parts.append(Text("The table is the job's own memory at its peak (weights, activations, the KV of its "
                          f"requests); {_engine_name(est.serving.engine if est.serving else 'vllm')} itself holds its "
                          f"{_share_name(a)} budget, below.", style="dim"))
    per = est.per_device
    style = "bold green" if v.fits else "bold yellow" if v.starts else "bold red"
    parts.append(Text(_verdict_line(a), style=style))
    if paged_line(a):
        parts.append(Text(paged_line(a) or "", style="dim"))
    for line in fleet_lines(a):
        parts.append(Text(line))
    parts.append(Text(_band_line(a), style="dim"))
    for line, style in serving_lines(a):
        parts.append(Text(line, style=style))
    if est.host_bytes:
        parts.append(Text(_host_line(a)))
    for label, flags, tail, style in _recommendation_parts(a):
        parts.append(Text.assemble((f"{label}: ", "bold"), (flags, "cyan"), tail) if label else Text(tail, style=style))
    if not a.device_given:
        parts.append(Text(_fits_on_line(a)))
    thumbs = new_table(prose_col("rule"), number_col("per device"), number_col("vs estimate"),
                       title="rules of thumb vs this estimate", title_style="dim", show_edge=False, box=None)
    for r in a.rules:
        thumbs.add_row(r.name, gib(r.bytes), f"{r.bytes / max(per.device_used_bytes, 1):.0%}")
    parts.append(Narrowest(thumbs))
    for assumption in est.assumptions:  # the user's own constants are said even without --explain
        if explain or assumption.startswith("use_calibration:"):
            parts.append(Text(f"assumes: {assumption}", style="dim"))
    if explain:
        for line in a.workload.config_read:
            parts.append(Text(f"read: {line}", style="dim"))
    parts.append(Text(CONFIRM, style="dim"))
    return Group(*parts)


def _table(rank: RankEstimate, *, explain: bool, title: str | None) -> Any:
    """The terms table; narrower without the kind column (each term's name starts with its kind)."""
    return Narrowest(_terms_table(rank, explain=explain, title=title, kinds=True),
                     _terms_table(rank, explain=explain, title=title, kinds=False))


def _terms_table(rank: RankEstimate, *, explain: bool, title: str | None, kinds: bool) -> Any:
    columns = [name_col("term"), *([name_col("kind", "dim")] if kinds else []), number_col("GiB"), number_col("share"),
               *([prose_col("formula", "dim")] if explain else [])]
    table = new_table(*columns, title=title, show_footer=False)
    for name, kind, n, share, formula in rows(rank):
        table.add_row(name, *([kind] if kinds else []), f"{n / GiB:,.2f}", f"{share:.1%}",
                      *([formula] if explain else []))
    table.add_section()
    for label, n in (("peak allocated", rank.allocated_bytes), ("peak reserved", rank.reserved_bytes),
                     ("device used", rank.device_used_bytes)):
        table.add_row(f"[bold]{label}[/bold]", *([""] if kinds else []), f"[bold]{n / GiB:,.2f}[/bold]", "",
                      *([""] if explain else []))
    return table


def _recommendation_parts(a: Assessment) -> list[tuple[str, str, str, str]]:
    """The recommendation as (label, flags, tail, style) lines; label and flags are empty for a
    plain message (shown in ``style``)."""
    rec = a.recommendation
    if rec is None:
        return []
    if rec.cheapest is None:
        return [("", "", f"No setup within the search fits ({rec.evaluated} evaluated); try a larger device "
                 "(memest gpus).", "yellow")]
    out = []
    # a job that starts and queues was searched for because all its sequences were asked for at once
    held = f" holding all {a.verdict.asked_sequences:,} at once" if a.verdict.kind == "queues" else ""
    for label, cand in ((f"Cheapest fit{held}", rec.cheapest), (f"Lossless fit{held}", rec.lossless),
                        ("Every layer on the GPUs", rec.on_device)):
        if cand is None or (not label.startswith("Cheapest") and cand is rec.cheapest):
            continue
        tail = (f" → {gib(cand.verdict.needed_bytes)} on {cand.verdict.device.name}, the card that binds, of {a.fleet.name}"
                if a.fleet is not None else
                f" → {gib(cand.verdict.needed_bytes)} per device on {cand.devices} × {cand.verdict.device.name}")
        flags = cand.flags or "(no change)"
        if "--finetune" in flags.split():
            asked = a.workload.method if isinstance(a.workload, TrainingConfig) else Method.FULL
            flags += f" (in place of {'--train' if asked is Method.FULL else f'--finetune {asked.value}'})"
        hows = [c.how for c in cand.changes if c.how]
        if hows:
            tail += f" ({'; '.join(hows)})"
        out.append((label, flags, tail, ""))
    if rec.lossless is None:
        out.append(("", "", "No lossless setup (parallelism, sharding, recompute, batching, devices) fits within the "
                    "search.", "dim"))
    return out
