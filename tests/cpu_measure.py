"""Real training steps of tiny transformers models on the CPU, measured with torch.profiler.

``measure_step`` runs a warm-up step (optimizer states appear at the first step), then profiles one
more with ``profile_memory=True`` and reads the memory timeline by category
(``torch.profiler._memory_profiler``): the peak, and each category's bytes at that instant.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CATEGORIES = ("PARAMETER", "OPTIMIZER_STATE", "GRADIENT", "ACTIVATION", "TEMPORARY", "AUTOGRAD_DETAIL", "INPUT")


@dataclass(frozen=True)
class Measured:
    """Bytes at the profiled step's peak: the total and per profiler category (None = unknown)."""

    peak: int
    by_category: dict[str, int]

    def get(self, *names: str) -> int:
        return sum(self.by_category.get(n, 0) for n in names)


def tiny_llama_config(**overrides: Any) -> dict[str, Any]:
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
        "intermediate_size": 640, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
        "vocab_size": 1000, "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "attention_dropout": 0.0, "torch_dtype": "float32",
    }
    cfg.update(overrides)
    return cfg


def write_config(folder: Path, cfg: dict[str, Any]) -> Path:
    path = folder / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def measure_step(cfg: dict[str, Any], *, precision: str, batch: int, seq: int, attn: str = "sdpa",
                 lora_targets: list[str] | None = None, lora_rank: int = 8, checkpointing: bool = False,
                 optimizer: str = "adamw") -> Measured:
    """Profile the second of two steps of forward, backward, AdamW (foreach) and zero_grad(set_to_none).

    precision: ``bf16`` (bf16 parameters), ``fp32``, or ``amp`` (fp32 parameters, bf16 autocast).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    config._attn_implementation = attn
    model = AutoModelForCausalLM.from_config(config)
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    if checkpointing:
        model.gradient_checkpointing_enable()
    if lora_targets is not None:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=lora_rank, target_modules=lora_targets, lora_dropout=0.0))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    if optimizer == "adamw":
        opt = torch.optim.AdamW(params, lr=1e-4, foreach=True)
    else:
        opt = torch.optim.SGD(params, lr=1e-4)
    ids = torch.randint(0, cfg["vocab_size"], (batch, seq))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "amp" else contextlib.nullcontext()

    def step() -> None:
        with autocast:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step()
    timeline = MemoryProfileTimeline(prof._memory_profile())
    _, sizes = timeline._coalesce_timeline("cpu")
    names = ["unknown"] + [c.name if c is not None else "None" for c in _CATEGORY_TO_INDEX]
    totals = [sum(s) for s in sizes]
    at = max(range(len(totals)), key=totals.__getitem__)
    return Measured(peak=totals[at], by_category={n: v for n, v in zip(names, sizes[at]) if v})
