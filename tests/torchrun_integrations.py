"""One rank of a tests/test_integrations_torchrun.py job: ``python -m torch.distributed.run --standalone
--nproc_per_node 2 tests/torchrun_integrations.py MODE OUT`` (gloo, CPU).

MODE ``ddp``: ``DistributedDataParallel`` + ``memest.track``; ``fsdp2``: FSDP2 ``fully_shard`` on every decoder
layer, then the model (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, as ``memest calibrate
--precision fsdp2 --zero-stage 3`` wraps it) + ``memest.track``; ``hf``: the HF Trainer (``use_cpu=True``,
``ddp_backend="gloo"``: it wraps the model in DDP itself) with ``MemestCallback``. After its measured block
``ddp`` runs a second one in which rank 1's watch fails (an unknown ``gpu``) and rank 0's does not. Every run appends to the
records folder ``OUT/results``; each rank writes what its watch read and logged to ``OUT/rank-N.json``.

The model is tests/test_integrations.py's tiny Llama (h 128, i 384, 3 layers, 4 heads / 2 KV heads of 32, V 300,
untied lm_head), seeded alike on every rank.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

TINY = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 300}
BATCH, SEQ = 4, 128
MEASURED = {"ddp": 2, "fsdp2": 4, "hf": 2}
"""Optimizer steps measured. FSDP2 over gloo: about one step in three is inflated by a buffer gloo frees on its
own thread, unseen by the profiler (benchmarks/calibration_findings.md, M2); four steps hold a clean one."""


def model():
    import torch
    from cpu_measure import tiny_llama_config
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = tiny_llama_config(**TINY)
    torch.manual_seed(0)
    config = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def plain_loop(mode: str, out: Path, lines: list[str]) -> dict:
    import torch
    import torch.distributed as dist

    import memest

    dist.init_process_group("gloo")
    net = model()
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(net)
    else:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in net.model.layers:
            fully_shard(layer, mp_policy=mp)
        wrapped = fully_shard(net, mp_policy=mp)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-4)  # torch's default on the CPU: the per-tensor loop
    g = torch.Generator().manual_seed(dist.get_rank())
    ids = torch.randint(0, TINY["vocab_size"], (BATCH, SEQ), generator=g)

    def step() -> None:
        loss = wrapped(input_ids=ids, labels=ids).loss
        loss.backward()
        del loss
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # the optimizer states exist before the block
    with memest.track(wrapped, opt, log=lines.append, results_path=out / "results") as t:
        for _ in range(MEASURED[mode]):
            step()
    w = t.watch
    read = {"values": _plain(w.values), "parallelism": _plain(_parallelism(w)), "report": t.report,
            "record_path": str(t.record_path) if t.record_path else None}
    if mode == "ddp":  # a second block in which rank 1's watch fails (an unknown gpu): the gather still completes
        failing: list[str] = []
        bad = {"gpu": "no-such-gpu"} if dist.get_rank() == 1 else {}
        with memest.track(wrapped, opt, record=False, log=failing.append, **bad) as t2:
            for _ in range(2):
                step()
        read["second"] = {"lines": failing, "report": t2.report}
    dist.barrier()
    dist.destroy_process_group()
    return read


def trainer(out: Path, lines: list[str]) -> dict:
    import torch
    from transformers import Trainer, TrainingArguments

    from memest.integrations.hf import MemestCallback

    class Tokens(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int) -> dict:
            ids = torch.randint(0, TINY["vocab_size"], (SEQ,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}

    cb = MemestCallback(log=lines.append, results_path=out / "results", steps=MEASURED["hf"])
    args = TrainingArguments(output_dir=str(out / "hf"), per_device_train_batch_size=BATCH,
                             max_steps=1 + MEASURED["hf"], use_cpu=True, ddp_backend="gloo", optim="adamw_torch",
                             report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             dataloader_num_workers=0)
    result = Trainer(model=model(), args=args, train_dataset=Tokens(), callbacks=[cb]).train()
    w = cb.watch
    return {"values": _plain(w.values), "parallelism": _plain(_parallelism(w)), "global_step": result.global_step,
            "record_path": str(w.record_path) if w.record_path else None}


def _parallelism(w) -> dict | None:
    t = getattr(w, "_workload", None)
    if t is None:
        return None
    from memest.workload.stacks import resolve_framework

    return {"world_size": t.parallelism.world_size, "dp": t.parallelism.dp, "zero_stage": t.parallelism.zero_stage,
            "framework": resolve_framework(t).value, "precision": t.precision.value}


def _plain(data):
    return json.loads(json.dumps(data, default=lambda v: getattr(v, "value", str(v))))


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    rank = int(os.environ["RANK"])
    lines: list[str] = []
    read = trainer(out, lines) if mode == "hf" else plain_loop(mode, out, lines)
    (out / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "lines": lines, **read}))
    import torch.distributed as dist

    if dist.is_initialized():  # the Trainer (accelerate) leaves its gloo group up: a process exiting with it
        dist.barrier()  # alive can abort in teardown ("terminate called without an active exception")
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
