"""FSDP1 as litgpt runs it (Lightning Fabric ``FSDPStrategy``), on the CPU: the three mechanisms of
``memest/estimate/training/fsdp.py`` checked on a small litgpt-shaped GPT over 2 gloo ranks.

The model: an embedding of V 32,000 x h 256, 2 blocks (norm, fused QKV h x 3h, projection, MLP h x 4h and 4h x h),
a final norm and an untied lm_head h x V, all bf16 (litgpt ``bf16-true``); ``FullyShardedDataParallel`` FULL_SHARD,
``use_orig_params=True``, ``ModuleWrapPolicy({Block})`` (Fabric's ``auto_wrap_policy={Block}``), the loss
``F.cross_entropy`` on the bf16 logits. Rank 0 reports:

1. accumulation inside ``no_sync()`` (Fabric ``no_backward_sync``): after the first micro-batch's backward every
   unit's ``flat_param.grad`` is unsharded (its numel against the unit's unsharded and sharded numel);
2. a LoRA-style block (base weights frozen, a small trainable adapter inside the same Block unit): its
   FlatParameter requires grad and its gradient covers the whole unit, frozen base included;
3. the root unit's gradient (embedding, final norm, lm_head in one FlatParameter): the step's peak (profiler memory
   timeline, :class:`memest.calibration.measure.CpuMeter`, the smaller of 2 profiled steps after 2 warm-up steps)
   against the sum memest's model gives at the embedding's backward (``foreach=False`` AdamW: no step temporary).

The installed torch (2.13) is newer than the runs' (2.1 - 2.3); FSDP1's code paths read for the model are the same
functions. Writes ``benchmarks/fsdp1_litgpt_cpu.md``.

    PYTHONPATH=. python benchmarks/fsdp1_litgpt_cpu.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

V, H, LAYERS, SEQ = 32_000, 256, 2, 32
MB = 10**6
OUT = Path(__file__).with_suffix(".md")


class Block(nn.Module):
    def __init__(self, adapter: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(H)
        self.qkv = nn.Linear(H, 3 * H, bias=False)
        self.proj = nn.Linear(H, H, bias=False)
        self.fc = nn.Linear(H, 4 * H, bias=False)
        self.out = nn.Linear(4 * H, H, bias=False)
        self.lora_a = nn.Parameter(torch.zeros(8, H)) if adapter else None
        self.lora_b = nn.Parameter(torch.zeros(3 * H, 8)) if adapter else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        qkv = self.qkv(y)
        if self.lora_a is not None:
            qkv = qkv + (y @ self.lora_a.t()) @ self.lora_b.t()
        q, k, v = qkv.split(H, dim=-1)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True))
        return x + self.out(F.gelu(self.fc(x)))


class GPT(nn.Module):
    def __init__(self, adapter: bool = False) -> None:
        super().__init__()
        self.wte = nn.Embedding(V, H)
        self.h = nn.ModuleList(Block(adapter) for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(H)
        self.lm_head = nn.Linear(H, V, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def _wrap(model: nn.Module, units: set) -> nn.Module:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return FSDP(model, auto_wrap_policy=ModuleWrapPolicy(units), use_orig_params=True,
                sharding_strategy=ShardingStrategy.FULL_SHARD, limit_all_gathers=True, device_id=torch.device("cpu"))


def _handles(model: nn.Module):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return [m._handle for m in model.modules() if isinstance(m, FSDP) and m._handle is not None]


def _grads(model: nn.Module) -> list[dict]:
    out = []
    for h in _handles(model):
        fp = h.flat_param
        out.append({"unsharded": int(fp._unpadded_unsharded_size.numel()), "shard": int(fp._local_shard.numel()),
                    "grad": int(fp.grad.numel()) if fp.grad is not None else 0,
                    "requires_grad": bool(fp.requires_grad)})
    return out


def measure(rank: int, world: int, store: str, result: str) -> None:
    from memest.calibration.measure import CpuMeter

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.manual_seed(0)
    ids = torch.randint(0, V, (1, SEQ))
    out: dict = {}

    # 1. accumulation inside no_sync: the first micro-batch's gradients stay unsharded
    model = _wrap(GPT().to(torch.bfloat16), {Block})
    with model.no_sync():
        F.cross_entropy(model(ids)[0], ids[0]).backward()
    out["no_sync"] = _grads(model)
    F.cross_entropy(model(ids)[0], ids[0]).backward()  # the synced micro-batch
    out["synced"] = _grads(model)

    # 2. a LoRA-style block unit: the frozen base beside a trainable adapter in one FlatParameter
    lora = GPT(adapter=True).to(torch.bfloat16)
    for name, p in lora.named_parameters():
        p.requires_grad = "lora_" in name
    lora = _wrap(lora, {Block})
    with lora.no_sync():
        F.cross_entropy(lora(ids)[0], ids[0]).backward()
    out["lora"] = _grads(lora)

    # 3. the root FlatParameter's gradient: the step's peak (memest's sum at the embedding's backward in main())
    torch.manual_seed(0)
    model = _wrap(GPT().to(torch.bfloat16), {Block})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)

    def step() -> None:
        F.cross_entropy(model(ids)[0], ids[0]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    meter = CpuMeter()
    meter.start(0)
    step()
    meter.lap(0)
    step()
    out["peak"] = meter.stop(2).peak_allocated_bytes
    if rank == 0:
        Path(result).write_text(json.dumps(out))
    dist.destroy_process_group()


def _row(name: str, units: list[dict]) -> str:
    return (f"| {name} | " + ", ".join(f"{u['grad']:,} of {u['unsharded']:,} (shard {u['shard']:,})" for u in units)
            + " |")


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        store, result = str(Path(folder) / "store"), str(Path(folder) / "result.json")
        mp.spawn(measure, args=(2, store, result), nprocs=2)
        r = json.loads(Path(result).read_text())
    vh = V * H  # elements of the embedding and of the lm_head
    root = 2 * vh + 2 * H  # the root FlatParameter: wte, ln_f (weight, bias), lm_head
    layer = r["synced"][1]["unsharded"]
    p = root + LAYERS * layer
    parts = {  # rank 0 at the embedding's backward, in bytes (memest's fsdp.py terms; bf16 = 2 B)
        "sharded params P / 2": p,
        "AdamW states 2 x P / 2 (bf16)": 2 * p,
        "the layers' sharded gradients (reduced)": LAYERS * layer,
        "root gathered (not freed after forward)": 2 * root,
        "lm_head's view gradient held (root_grad_views)": 2 * vh,
        "the embedding's gradient + the root's assembled flat gradient (root_flat_grad)": 2 * vh + 2 * root,
    }
    total = sum(parts.values())
    lines = [
        f"# FSDP1 as litgpt runs it, on the CPU (torch {torch.__version__}, gloo, 2 ranks)",
        "",
        "`PYTHONPATH=. python benchmarks/fsdp1_litgpt_cpu.py` (see its docstring): a litgpt-shaped GPT (V 32,000, "
        "h 256, 2 blocks, untied lm_head, bf16), FULL_SHARD, use_orig_params, the blocks as units. Rank 0.",
        "",
        "## Gradients of each FlatParameter (root, block 1, block 2): grad numel of unsharded numel",
        "",
        "| after | units |",
        "|---|---|",
        _row("a micro-batch inside no_sync()", r["no_sync"]),
        _row("the next, synced micro-batch", r["synced"]),
        _row("no_sync, LoRA-style blocks (base frozen, adapter inside)", r["lora"]),
        "",
        "Inside `no_sync()` every unit keeps its unsharded gradient (the synced micro-batch reduce-scatters it to the "
        "shard); a block whose base is frozen but which holds an adapter takes the gradient of the whole unit, the "
        "frozen root none.",
        "",
        "## The step's peak with the root unit {wte, ln_f, lm_head}",
        "",
        "| term (memest's model, at the embedding's backward) | MB |",
        "|---|---:|",
        *[f"| {k} | {v / MB:.2f} |" for k, v in parts.items()],
        f"| **sum** | **{total / MB:.2f}** |",
        f"| measured peak (profiler timeline, smaller of 2 steps) | {r['peak'] / MB:.2f} |",
        "",
        f"Measured / modelled - 1: {r['peak'] / total - 1:+.1%} (activations of 32 tokens and the logits, freed by then, "
        f"not counted). Without the held view gradient and the assembled flat gradient the sum would be "
        f"{(total - 2 * vh - 2 * root) / MB:.2f} MB.",
    ]
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
