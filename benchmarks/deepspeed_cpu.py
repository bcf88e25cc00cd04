"""DeepSpeed ZeRO-2 / ZeRO-3 on the CPU (gloo, two ranks): what the gist cases' gaps need checked.

A small untied Llama in bf16 under DeepSpeed's engine (``bf16.enabled``, torch AdamW as the client optimizer),
HF reentrant gradient checkpointing. Each run reads, on rank 0:

- ``peaks_MB``: the CPU allocator's total at its highest in each micro-step (the profiler's allocation events,
  profiling from before the model is built so every allocation is counted; a sentinel allocation marks each
  micro-step's end); ``ends_MB`` the total at each micro-step's end;
- ZeRO-3: the parameter elements gathered (``ds_status`` not ``NOT_AVAILABLE``, persistent ones left out) after
  every ``fetch_sub_module`` of the last step (their maximum) and at the lm_head's forward, and those left
  gathered after each micro-step;
- ZeRO-2: at each ``independent_gradient_partition_epilogue``, the bytes of ``grads_in_partition`` and of the
  other gradient storages the optimizer holds (``all_grad_tensors`` at 0.19.5, ``averaged_gradients`` at 0.14.2).

Needs DeepSpeed importable (not a memest dependency): ``pip install --target DIR --no-deps deepspeed==V`` (with
``hjson``, ``py-cpuinfo``, ``msgpack``, ``einops``); 0.14.2 under torch 2.13 needs two import fixes in its copy
(``elasticity/elastic_agent.py`` ``_get_socket_with_port``, ``autotuning/scheduler.py`` ``numpy.BUFSIZE``).

    PYTHONPATH=DIR python benchmarks/deepspeed_cpu.py      # every configuration, a Markdown table on stdout

Recorded results: ``benchmarks/deepspeed_cpu.md``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

RUNS = (  # (label, environment): the scaled coordinator settings keep Llama-2-7B's ratios to a layer
    ("zero3_ga1", {"STAGE": "3", "GA": "1", "MB": "2", "SEQ": "256", "LAYERS": "32", "VOCAB": "2048",
                   "PERSIST": "1000", "PREFETCH": "195000", "MAXLIVE": "3910000", "REUSE": "3910000",
                   "BUCKET": "1960000"}),
    ("zero3_ga2", {"STAGE": "3", "GA": "2", "MB": "2", "SEQ": "256", "LAYERS": "32", "VOCAB": "2048",
                   "PERSIST": "1000", "PREFETCH": "195000", "MAXLIVE": "3910000", "REUSE": "3910000",
                   "BUCKET": "1960000"}),
    ("zero2_ga1", {"STAGE": "2", "GA": "1", "MB": "1", "SEQ": "64", "LAYERS": "4", "VOCAB": "2048",
                   "BUCKET": "1960000", "CKPT": "0"}),
    ("zero2_ga2", {"STAGE": "2", "GA": "2", "MB": "1", "SEQ": "64", "LAYERS": "4", "VOCAB": "2048",
                   "BUCKET": "1960000", "CKPT": "0"}),
)
SENTINEL = 100_003


def worker() -> None:
    """One rank of one configuration (environment: :data:`RUNS`); rank 0 prints ``RESULT {json}``."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import torch
    import torch.distributed as dist
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import OpTree
    from transformers import LlamaConfig, LlamaForCausalLM

    env = os.environ
    stage, ga, mb, seq = int(env["STAGE"]), int(env["GA"]), int(env["MB"]), int(env["SEQ"])
    deepspeed.init_distributed(dist_backend="gloo")
    cfg = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=int(env["LAYERS"]),
                      num_attention_heads=4, num_key_value_heads=4, vocab_size=int(env["VOCAB"]),
                      max_position_embeddings=1024, tie_word_embeddings=False)
    torch.manual_seed(0)
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    prof.__enter__()
    sentinels = []
    zero = {"stage": stage, "reduce_bucket_size": int(env["BUCKET"]), "allgather_bucket_size": 2_000_000,
            "stage3_prefetch_bucket_size": int(env.get("PREFETCH", 50_000_000)),
            "stage3_param_persistence_threshold": int(env.get("PERSIST", 100_000)),
            "stage3_max_live_parameters": int(env.get("MAXLIVE", 1_000_000_000)),
            "stage3_max_reuse_distance": int(env.get("REUSE", 1_000_000_000))}
    ds_cfg = {"train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": ga, "bf16": {"enabled": True},
              "zero_optimization": zero, "zero_allow_untested_optimizer": True, "steps_per_print": 10**9}
    if stage == 3:
        with deepspeed.zero.Init(config_dict_or_path=ds_cfg, dtype=torch.bfloat16):
            model = LlamaForCausalLM(cfg)
    else:
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    if env.get("CKPT", "1") == "1":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4),
                                      config=ds_cfg)
    fetched: list[int] = []
    at_head: list[int] = []
    epilogues: list[dict] = []
    live = None
    if stage == 3:
        from deepspeed.runtime.zero import partitioned_param_coordinator as ppc
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        def live() -> int:
            return sum(p.ds_numel for p in model.parameters()
                       if p.ds_status != ZeroParamStatus.NOT_AVAILABLE and not p.ds_persist)

        fetch = ppc.PartitionedParameterCoordinator.fetch_sub_module

        def counted_fetch(self, module, forward):
            out = fetch(self, module, forward)
            fetched.append(live())
            return out

        ppc.PartitionedParameterCoordinator.fetch_sub_module = counted_fetch
        model.lm_head.register_forward_hook(lambda *_: at_head.append(live()))
    else:
        kind = type(engine.optimizer)
        epilogue = kind.independent_gradient_partition_epilogue

        def counted_epilogue(self):
            held = {}
            for group in (getattr(self, "all_grad_tensors", {}), self.averaged_gradients):
                for tensors in (group.values() if isinstance(group, dict) else ()):
                    for t in tensors or ():
                        held[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            own = self.grads_in_partition
            if own is not None:
                held.pop(own.untyped_storage().data_ptr(), None)
            epilogues.append({"grads_in_partition": own.numel() * own.element_size() if own is not None else 0,
                              "held_beside": sum(held.values())})
            return epilogue(self)

        kind.independent_gradient_partition_epilogue = counted_epilogue
    ids = torch.randint(0, cfg.vocab_size, (mb, seq))
    sentinels.append(torch.empty(SENTINEL, dtype=torch.uint8))
    left, per_step = [], []
    for i in range(4 * ga):
        start = len(fetched)
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
        per_step.append(fetched[start:])
        sentinels.append(torch.empty(SENTINEL + i + 1, dtype=torch.uint8))
        if live is not None:
            left.append(live())
    prof.__exit__(None, None, None)
    peaks, ends = [], []
    for ev in OpTree(prof.profiler.kineto_results).sorted_nodes:
        if ev.typed[0] == _EventType.Allocation and ev.typed[1].device.type == "cpu":
            a = ev.typed[1]
            if SENTINEL <= a.alloc_size <= SENTINEL + 64:
                peaks.append(0)
                ends.append(0)
            if peaks:
                peaks[-1] = max(peaks[-1], int(a.total_allocated))
                ends[-1] = int(a.total_allocated)
    if dist.get_rank() == 0:
        print("RESULT", json.dumps({
            "deepspeed": deepspeed.__version__, "P": sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters()),
            "peaks_MB": [round(p / 1e6, 2) for p in peaks[:-1]], "ends_MB": [round(e / 1e6, 2) for e in ends[:-1]],
            "gathered_max_last_step": max(per_step[-1], default=0),
            "gathered_at_lm_head": at_head[-1] if at_head else 0, "left_gathered": left,
            "epilogues": epilogues[-2 * ga:]}))


def main() -> None:
    print("| run | DeepSpeed | peak per micro-step (MB) | gathered max / at lm_head (elements) | left gathered | "
          "ZeRO-2 epilogues (grads_in_partition / held beside, B) |")
    print("|---|---|---|---|---|---|")
    for label, env in RUNS:
        out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", __file__,
                              "--worker"], env=os.environ | env | {"LOCAL_SIZE": "2"}, capture_output=True, text=True,
                             timeout=900)
        line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            print(f"| {label} | failed: {out.stderr.strip().splitlines()[-1:]} | | | | |")
            continue
        r = json.loads(line[len("RESULT "):])
        ep = ", ".join(f"{e['grads_in_partition']}/{e['held_beside']}" for e in r["epilogues"])
        print(f"| {label} | {r['deepspeed']} | {', '.join(map(str, r['peaks_MB']))} | "
              f"{r['gathered_max_last_step']:,} / {r['gathered_at_lm_head']:,} | {r['left_gathered']} | {ep} |")


if __name__ == "__main__":
    worker() if "--worker" in sys.argv else main()
