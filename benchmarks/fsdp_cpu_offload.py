"""FSDP2 with and without ``CPUOffloadPolicy`` on the CPU (gloo, one process), measured with the profiler's
memory timeline as ``memest calibrate --device cpu`` does, against memest's terms (device and host).

On one CPU process the device is the host: ``CPUOffloadPolicy``'s copies (``sharded_param_data.to(device)``,
``new_sharded_grad.to("cpu")``) are no-ops, so the run shows the tensors both runs hold on the one memory
(the host's shards of parameters, gradients and optimizer states, and what memest places on the device),
which memest's device terms plus its host figure must add up to. Writes ``benchmarks/fsdp_cpu_offload.md``.

    PYTHONPATH=. python benchmarks/fsdp_cpu_offload.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from transformers import LlamaConfig, LlamaForCausalLM

from memest.calibration.measure import CpuMeter
from memest.devices import get_device
from memest.estimate import estimate
from memest.sources import load_model
from memest.workload.resolve import resolve

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
          "intermediate_size": 1376, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8,
          "vocab_size": 8192, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
          "torch_dtype": "float32"}
BATCH, SEQ, STEPS = 2, 512, 3
MiB = 1 << 20
OUT = Path(__file__).with_suffix(".md")


def measure(offload: bool) -> dict:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in CONFIG.items() if k != "architectures"},
                                         attn_implementation="sdpa"))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    policy = {"offload_policy": CPUOffloadPolicy(pin_memory=False)} if offload else {}  # no pinning without CUDA
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp, **policy)
    fully_shard(model, mp_policy=mp, **policy)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ))

    def step() -> None:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):  # warm-up: the optimizer states exist from the first step on
        step()
    meter = CpuMeter()
    live = sum(p.numel() * p.element_size() for p in model.parameters())
    meter.start(live)
    for n in range(STEPS):
        step()
        if n < STEPS - 1:
            meter.lap(live)
    m = meter.stop(STEPS)
    return {"peak": m.peak_allocated_bytes, "by_category": m.by_category, "method": m.peak_method}


def predicted(spec, offload: bool) -> dict:
    device = get_device("H100")
    t = resolve({"train": True, "fsdp": "full_shard", "gpus": 1, "micro_batch_size": BATCH, "seq_len": SEQ,
                 "precision": "fsdp2", "optimizer": "adamw", "offload": "params" if offload else "none"}, spec, device)
    e = estimate(spec, t, device)
    terms = {term.name: term.bytes for term in e.per_device.terms
             if term.kind.value not in ("allocator", "runtime") and term.name != "workspace.cublas"}
    # the host figure is the step's high-water mark: with the gradient shards (P x 4 B, fp32 reduce dtype), which
    # exist only after backward; at the device's peak (the loss backward) the host holds params + Adam states
    grads = spec.num_params * 4 if offload else 0
    return {"device": sum(terms.values()), "host": e.host_bytes, "host_at_peak": e.host_bytes - grads, "terms": terms,
            "moment": e.extra["peak_moment"]}


def main() -> int:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(CONFIG))
        spec = load_model(folder)
        rows = [(offload, measure(offload), predicted(spec, offload)) for offload in (False, True)]
    dist.destroy_process_group()
    lines = [
        "# FSDP2 CPU offload on the CPU, measured (torch " + torch.__version__ + ")",
        "",
        ("`PYTHONPATH=. python benchmarks/fsdp_cpu_offload.py` (gloo, one process; a 4-layer Llama, h 512, V 8192, "
         f"{spec.num_params:,} params; micro-batch {BATCH} x {SEQ} tokens; FSDP2 bf16 compute / fp32 reduce; torch "
         "AdamW). Peak of the profiler's memory timeline (the smallest of 3 profiled steps after 2 warm-up steps), "
         "as `memest calibrate --device cpu` measures. On one CPU process `CPUOffloadPolicy`'s copies are no-ops, "
         "so both runs hold the same tensors in one memory; memest's device terms + its host figure are compared "
         "with it."),
        "",
        ("memest's host figure is the step's high-water mark, with the gradient shards (P x 4 B) that exist only "
         "after backward; at the device's peak moment the host holds the parameter shards and the Adam states "
         "(host at peak = host - P x 4 B)."),
        "",
        ("| run | measured peak (MiB) | memest device (MiB) | memest host (MiB) | host at peak (MiB) | device + host "
         "at peak (MiB) | error | moment |"),
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for offload, m, p in rows:
        total = p["device"] + p["host_at_peak"]
        lines.append(f"| {'CPUOffloadPolicy' if offload else 'no offload'} | {m['peak'] / MiB:.2f} | "
                     f"{p['device'] / MiB:.2f} | {p['host'] / MiB:.2f} | {p['host_at_peak'] / MiB:.2f} | "
                     f"{total / MiB:.2f} | {total / m['peak'] - 1:+.1%} | {p['moment']} |")
    lines += ["", "Per category at the measured peak (MiB) and memest's terms (MiB):", ""]
    for offload, m, p in rows:
        cats = ", ".join(f"{k} {v / MiB:.2f}" for k, v in sorted(m["by_category"].items()))
        terms = ", ".join(f"{k} {v / MiB:.2f}" for k, v in p["terms"].items() if v)
        lines.append(f"- {'CPUOffloadPolicy' if offload else 'no offload'}: measured {cats}; memest {terms}"
                     + (f"; host {p['host'] / MiB:.2f}" if offload else ""))
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
