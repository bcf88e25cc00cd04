"""torchtune's training log (its recipes' ``_log`` lines and its metric loggers' step lines).

Lines read (torchtune 0.3-0.6, ``torchtune/training/memory.py`` and ``recipes/*.py``):

- ``Running FullFinetuneRecipeSingleDevice with resolved config:`` and the YAML that follows
  (``config._utils.log_config``): ``batch_size``, ``gradient_accumulation_steps``, ``tokenizer.max_seq_len``,
  ``model._component_`` (the model builder: :data:`BUILDERS`; ``lora_`` / ``qlora_`` builders and
  ``lora_rank``), ``enable_activation_checkpointing``, ``enable_activation_offloading``,
  ``optimizer_in_bwd``, ``loss._component_``, ``compile``; the recipe's name (``...Distributed``: several
  devices, whose count the log does not print);
- ``log_memory_stats``: ``Memory stats after model init:`` then ``GPU peak memory allocation / reserved /
  active: X GiB`` (0.1 printed ``GB``, ``get_memory_stats`` dividing by 1e9 then; 1024**3 since);
- the metric loggers' step lines with ``log_peak_memory_stats: True``: ``Step 1 | loss:... peak_memory_active:
  47.32 peak_memory_alloc:52.00 peak_memory_reserved:52.00`` (``DiskLogger``; ``StdoutLogger`` likewise), in
  the unit ``get_memory_stats`` returns: GiB, or GB where the log's memory stats say GB. The largest of each
  over the steps is the run's peak.
"""

from __future__ import annotations

import re
from typing import Any

from memest.devices import GB, GiB
from memest.logs._text import NUMBER, first, keep, line_of, number
from memest.logs.record import EngineLog, Logged

FIGURE_LINES = ("Memory stats after model init", "peak_memory_alloc:")
"""The lines of figures named when a log has none of them."""

MARKERS = (r"torchtune", r"Running \w+Recipe\w* with resolved config:", r"\bpeak_memory_active:\s*[0-9.]",
           r"Memory stats after model init")

BUILDERS: dict[str, str] = {
    "llama3_2_1b": "meta-llama/Llama-3.2-1B", "llama3_2_3b": "meta-llama/Llama-3.2-3B",
    "llama3_1_8b": "meta-llama/Llama-3.1-8B", "llama3_1_70b": "meta-llama/Llama-3.1-70B",
    "llama3_1_405b": "meta-llama/Llama-3.1-405B", "llama3_8b": "meta-llama/Meta-Llama-3-8B",
    "llama3_70b": "meta-llama/Meta-Llama-3-70B", "llama2_7b": "meta-llama/Llama-2-7b-hf",
    "llama2_13b": "meta-llama/Llama-2-13b-hf", "llama2_70b": "meta-llama/Llama-2-70b-hf",
    "qwen2_5_0_5b": "Qwen/Qwen2.5-0.5B", "qwen2_5_1_5b_base": "Qwen/Qwen2.5-1.5B",
    "qwen2_5_1_5b_instruct": "Qwen/Qwen2.5-1.5B-Instruct", "qwen2_5_7b_base": "Qwen/Qwen2.5-7B",
    "qwen2_5_7b_instruct": "Qwen/Qwen2.5-7B-Instruct", "mistral_7b": "mistralai/Mistral-7B-v0.1",
    "gemma_2b": "google/gemma-2b", "gemma_7b": "google/gemma-7b", "phi3_mini": "microsoft/Phi-3-mini-4k-instruct",
}
"""torchtune model builders (``torchtune/models/<family>/_model_builders.py``; ``lora_`` / ``qlora_``
prefixes stripped) -> the Hub model whose checkpoint their configs load."""

OPTIMIZERS = {"PagedAdamW8bit": "paged_adamw8bit", "AdamW8bit": "adamw8bit", "PagedAdamW": "paged_adamw32bit", "SGD": "sgd"}
"""torchtune configs' ``optimizer._component_`` classes (``torch.optim``, ``bitsandbytes.optim``, ``torchao.optim``)
-> memest's optimizer (torch AdamW: ``adamw``, with ``fused: True`` ``adamw_fused``)."""

_LOG_LINE = re.compile(r"^(?:INFO|DEBUG|WARNING|ERROR)[: ]|^\d{4}-\d\d-\d\d|^\[|^\S+\.py:\d+")


def detect(text: str) -> bool:
    """True when ``text`` is a torchtune log."""
    return any(re.search(m, text) for m in MARKERS)


def _config(text: str) -> tuple[str | None, dict[str, Any]]:
    """The recipe's name and its resolved config (flattened to dotted keys), as printed."""
    m = first(r"Running (\w+) with resolved config:\n", text)
    if m is None:
        return None, {}
    lines: list[str] = []
    for line in text[m.end():].splitlines():
        if lines and (_LOG_LINE.match(line) or line.startswith("<")):
            break
        lines.append(line)
    from pathlib import Path

    from memest.errors import InputError
    from memest.workload.files._common import load_yaml

    try:
        doc = load_yaml(Path("the log's resolved config"), "\n".join(lines))
    except InputError:  # a config cut short in a pasted log: read none of it
        doc = None
    flat: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}{k}.", v) if isinstance(v, dict) else flat.__setitem__(f"{prefix}{k}", v)

    walk("", doc if isinstance(doc, dict) else {})
    return m.group(1), flat


def _settings(recipe: str | None, cfg: dict[str, Any]) -> tuple[dict[str, Any], str | None, list[str], list[str]]:
    """memest's settings, the model, the settings the log leaves open and notes, from the resolved config."""
    out: dict[str, Any] = {}
    missing: list[str] = []
    notes: list[str] = []
    builder = str(cfg.get("model._component_", "")).rsplit(".", 1)[-1]
    adapter = re.match(r"(q?lora)_(.*)", builder)
    base = adapter.group(2) if adapter else builder
    model = BUILDERS.get(base)
    if model is None and cfg.get("checkpointer.checkpoint_dir"):
        model = str(cfg["checkpointer.checkpoint_dir"])
    if adapter:
        out["finetune"] = adapter.group(1)
        if isinstance(cfg.get("model.lora_rank"), int):
            out["lora_rank"] = cfg["model.lora_rank"]
    for key, name in (("batch_size", "micro_batch_size"), ("tokenizer.max_seq_len", "seq_len"),
                      ("gradient_accumulation_steps", "grad_accum_steps")):
        if isinstance(cfg.get(key), int) and not isinstance(cfg.get(key), bool):
            out[name] = cfg[key]
    if cfg and "seq_len" not in out:
        notes.append("tokenizer.max_seq_len is not set: the run trained at each batch's longest sample")
    for key, name in (("enable_activation_offloading", "activation_offloading"),
                      ("optimizer_in_bwd", "optimizer_in_bwd"), ("compile", "torch_compile")):
        if isinstance(cfg.get(key), bool) and not (adapter and name == "optimizer_in_bwd"):  # full fine-tunes only
            out[name] = cfg[key]
    if isinstance(cfg.get("enable_activation_checkpointing"), bool):
        out["recompute"] = "full" if cfg["enable_activation_checkpointing"] else "none"
    optimizer = str(cfg.get("optimizer._component_", ""))
    if optimizer:
        name = optimizer.rsplit(".", 1)[-1]
        out["optimizer"] = OPTIMIZERS.get(name, "adamw_fused" if name == "AdamW" and cfg.get("optimizer.fused") else
                                          "adamw" if name == "AdamW" else None)
        if out["optimizer"] is None:
            del out["optimizer"]
            notes.append(f"optimizer {optimizer} is not one memest models: its default is estimated")
    loss = str(cfg.get("loss._component_", ""))
    if loss:
        out["loss"] = "chunked" if "Chunked" in loss else "fused" if "LinearCrossEntropy" in loss else "default"
    if recipe and "Distributed" in recipe:
        missing.append("gpus")
    return out, model, missing, notes


def _unit(text: str) -> int:
    """Bytes per printed unit of the step lines: GB (1e9) where the log's memory stats print 'GB', else GiB."""
    stats = first(r"GPU peak memory \w+: [0-9.]+ (GiB|GB)\b", text)
    return GB if stats is not None and stats.group(1) == "GB" else GiB


def parse(text: str) -> EngineLog:
    """The job and the figures of a torchtune training log (rank 0's lines)."""
    recipe, cfg = _config(text)
    settings, model, missing, notes = _settings(recipe, cfg)
    unit = _unit(text)
    figures: dict[str, Logged | None] = {}
    init = first(r"Memory stats after model init:", text)
    if init is not None:
        block = text[init.end():init.end() + 400]
        for key, word in (("init_allocated", "allocation"), ("init_reserved", "reserved")):
            m = re.search(rf"GPU peak memory {word}: {NUMBER} (GiB|GB)", block)
            if m is not None:
                figures[key] = Logged(round(number(m.group(1)) * (GB if m.group(2) == "GB" else GiB)), "bytes",
                                      line_of(block, m))
    for key, field in (("peak_active", "peak_memory_active"), ("peak_allocated", "peak_memory_alloc"),
                       ("peak_reserved", "peak_memory_reserved")):
        figures[key] = _peak(rf"\b{field}:\s*{NUMBER}", text, unit)
    return EngineLog(engine="torchtune", format=f"torchtune {recipe}" if recipe else "torchtune", model=model,
                     settings=settings, figures=keep(figures), training=True, missing=tuple(missing),
                     notes=tuple(notes))


def _peak(pattern: str, text: str, unit: int) -> Logged | None:
    """The largest value of ``pattern`` (group 1) over the step lines, in bytes."""
    best: tuple[float, re.Match[str]] | None = None
    for m in re.finditer(pattern, text):
        value = number(m.group(1))
        if best is None or value > best[0]:
            best = (value, m)
    return None if best is None else Logged(round(best[0] * unit), "bytes", line_of(text, best[1]))
