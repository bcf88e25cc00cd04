"""Does FSDP1 add memory per sequence to a LoRA step? A CPU check of the fms-acceleration FSDP rows' shortfall.

fms-acceleration's refs/a100_80gb.csv (commit 24bdadb) Mistral-7B LoRA rows grow by 3.41 GB per 4096-token sequence
under accelerate FSDP over 2 GPUs and by 3.01 GB on one (memest/validation/gaps.py). This runs the same kind of step
on the CPU, with and without FSDP1, at two batch sizes: a 2-layer Mistral (h 256, 1 KV head, V 32,000) in bf16, peft
LoRA r 16 on q, k, v, o (dropout 0.1), reentrant gradient checkpointing (transformers' default before 5), the loss of
transformers 4.48.1 (``ForCausalLMLoss`` with its shifted fp32 copy), AdamW on the adapters; FSDP1
``FullyShardedDataParallel`` FULL_SHARD over 2 gloo ranks, ``use_orig_params=True``, BACKWARD_PRE, peft's
``fsdp_auto_wrap_policy`` (what transformers' Trainer installs for a LoRA model under FSDP). Peak of the profiler's
memory timeline on rank 0 (:class:`memest.calibration.measure.CpuMeter`, 2 warm-up steps, the smaller of 2 profiled
steps). The installed torch / transformers / peft are newer than the run's (torch 2.4.1, transformers 4.48.1,
peft 0.13.2). Writes ``benchmarks/fsdp1_lora_cpu.md``.

    PYTHONPATH=. python benchmarks/fsdp1_lora_cpu.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import transformers
from torch import nn

SEQ, VOCAB = 512, 32_000
MB = 10**6
OUT = Path(__file__).with_suffix(".md")


def loss_4_48(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, **kwargs):
    """transformers 4.48.1 ``loss/loss_utils.py`` ``ForCausalLMLoss`` (mean reduction)."""
    logits = logits.float()
    shift_logits = logits[..., :-1, :].contiguous()
    shift_labels = labels[..., 1:].contiguous()
    return nn.functional.cross_entropy(shift_logits.view(-1, vocab_size), shift_labels.view(-1),
                                       ignore_index=ignore_index)


def measure(rank: int, world: int, batch: int, store: str, result: str) -> None:
    import transformers.loss.loss_utils as loss_utils
    from peft import LoraConfig, get_peft_model
    from transformers import MistralConfig, MistralForCausalLM

    from memest.calibration.measure import CpuMeter

    loss_utils.LOSS_MAPPING["ForCausalLM"] = loss_4_48
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.manual_seed(0)
    config = MistralConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=1, vocab_size=VOCAB, max_position_embeddings=1024,
                           attn_implementation="sdpa")
    model = get_peft_model(MistralForCausalLM(config).to(torch.bfloat16),
                           LoraConfig(r=16, lora_alpha=16, lora_dropout=0.1,
                                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.enable_input_require_grads()
    if world > 1:
        from peft.utils.other import fsdp_auto_wrap_policy
        from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        model = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), use_orig_params=True,
                     sharding_strategy=ShardingStrategy.FULL_SHARD, backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
                     device_id=torch.device("cpu"))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, VOCAB, (batch, SEQ))

    def step() -> None:
        loss = model(input_ids=ids, labels=ids)["loss"]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    meter = CpuMeter()
    meter.start(0)
    step()
    meter.lap(0)
    step()
    m = meter.stop(2)
    if rank == 0:
        Path(result).write_text(json.dumps({"peak": m.peak_allocated_bytes, "by_category": m.by_category}))
    if world > 1:
        dist.destroy_process_group()


def run(world: int, batch: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        store, result = str(Path(folder) / "store"), str(Path(folder) / "result.json")
        if world > 1:
            mp.spawn(measure, args=(world, batch, store, result), nprocs=world)
        else:
            measure(0, 1, batch, store, result)
        return json.loads(Path(result).read_text())


def main() -> int:
    import peft

    rows = {(world, batch): run(world, batch) for world in (1, 2) for batch in (1, 2)}
    lines = [
        f"# FSDP1 and a LoRA step's memory per sequence, on the CPU (torch {torch.__version__}, transformers "
        f"{transformers.__version__}, peft {peft.__version__})",
        "",
        "`PYTHONPATH=. python benchmarks/fsdp1_lora_cpu.py` (see its docstring). Rank 0's peak (MB = 10^6 B):",
        "",
        "| run | batch 1 | batch 2 | growth per sequence |",
        "|---|---:|---:|---:|",
    ]
    for world in (1, 2):
        one, two = rows[(world, 1)]["peak"], rows[(world, 2)]["peak"]
        name = "one process, no FSDP" if world == 1 else "FSDP1 FULL_SHARD over 2 ranks"
        lines.append(f"| {name} | {one / MB:.2f} | {two / MB:.2f} | {(two - one) / MB:.2f} |")
    gap = (rows[(2, 2)]["peak"] - rows[(2, 1)]["peak"]) - (rows[(1, 2)]["peak"] - rows[(1, 1)]["peak"])
    shift = rows[(2, 1)]["peak"] - rows[(1, 1)]["peak"]
    lines += ["", f"FSDP1's growth per sequence less the plain step's: {gap / MB:+.2f} MB; its constant above the plain "
              f"step at batch 1: {shift / MB:+.2f} MB (the root unit gathered: embed_tokens + lm_head, 2 x 32,000 x 256 "
              "x 2 B = 32.77 MB, of which rank 0 holds half as its shard)."]
    OUT.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
