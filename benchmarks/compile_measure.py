"""Saved-for-backward bytes per token per layer of a Llama decoder stack, eager vs torch.compile (inductor), on CPU.

Runs transformers' ``LlamaModel`` (bf16, SDPA) on ``inputs_embeds`` that require a gradient, with L and 2L layers,
and takes the difference of the bytes alive after the forward (the net of the profiler's ``[memory]`` events
over the forward: what autograd keeps, the output included) divided by L x tokens: the embeddings, final norm,
rotary tables and output cancel. Also counts, with ``torch.autograd.graph.saved_tensors_hooks``, the distinct
storages packed for backward (eager: every op's saved tensors; compiled: the ``save_for_backward`` of
AOTAutograd's ``CompiledFunction``, i.e. the partitioner's saved set).

    .venv/bin/python benchmarks/compile_measure.py            # writes nothing; prints a table
    .venv/bin/python benchmarks/compile_measure.py --json     # one JSON line per case

Modes: ``full`` (every weight trains), ``float8-tensorwise`` / ``float8-rowwise`` (full training with torchao's
``convert_to_float8_training`` at that recipe: torchao 0.18.0, installed apart, e.g. ``pip install --target
/tmp/torchao torchao==0.18.0`` and ``PYTHONPATH=/tmp/torchao``; ``torch._scaled_mm`` runs on the CPU), ``lora`` (base frozen, rank-8 adapters on q_proj and v_proj, bf16, as
torchtune's), each with and without per-layer activation checkpointing (non-reentrant, torchtune's
``checkpoint_wrapper``), the layers compiled one by one (torchtune ``compile_model``; with checkpointing the
wrapped block, as torchtitan ``apply_compile`` after ``apply_ac``).
"""

from __future__ import annotations

import argparse
import json
import sys

DUMP = False

SIZES = {  # (hidden, intermediate, heads, kv_heads)
    "s": (256, 640, 8, 2),
    "m": (512, 1408, 8, 4),
    "l": (768, 2048, 12, 4),
}


def _model(size: str, layers: int, lora: bool, float8: str = ""):
    import torch
    from transformers import LlamaConfig, LlamaModel

    h, i, a, k = SIZES[size]
    cfg = LlamaConfig(hidden_size=h, intermediate_size=i, num_hidden_layers=layers, num_attention_heads=a,
                      num_key_value_heads=k, vocab_size=128, max_position_embeddings=4096, rms_norm_eps=1e-5)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaModel(cfg).to(torch.bfloat16)
    if lora:
        for p in model.parameters():
            p.requires_grad_(False)
        for layer in model.layers:
            for name in ("q_proj", "v_proj"):
                base = getattr(layer.self_attn, name)
                setattr(layer.self_attn, name, _Lora(base, 8))
    if float8:  # torchtitan's float8 converter: every nn.Linear of the layers swapped for torchao's Float8Linear
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(float8))
    return model


def _lora_cls():
    import torch

    class Lora(torch.nn.Module):
        """base(x) + B(A(x)) * scale, adapters at the run's dtype (torchtune LoRALinear, dropout 0)."""

        def __init__(self, base, rank):
            super().__init__()
            self.base = base
            self.a = torch.nn.Linear(base.in_features, rank, bias=False, dtype=base.weight.dtype)
            self.b = torch.nn.Linear(rank, base.out_features, bias=False, dtype=base.weight.dtype)
            torch.nn.init.normal_(self.b.weight, std=0.02)

        def forward(self, x):
            return self.base(x) + self.b(self.a(x)) * 2.0

    return Lora


class _LoraProxy:
    cls = None


def _Lora(base, rank):  # noqa: N802
    if _LoraProxy.cls is None:
        _LoraProxy.cls = _lora_cls()
    return _LoraProxy.cls(base, rank)


def _wrap(model, compiled: bool, checkpoint: bool):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for n, layer in enumerate(model.layers):
        if checkpoint:  # torchtitan apply_ac then apply_compile: the checkpointed block is compiled
            layer = model.layers[n] = checkpoint_wrapper(layer)
        if compiled:
            layer.compile(backend="inductor")
    return model


def measure(size: str, layers: int, seq: int, *, compiled: bool, lora: bool, checkpoint: bool,
            batch: int = 1, float8: str = "") -> dict:
    """Net bytes alive after the forward, and the distinct storages packed for backward (bytes)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch._dynamo.reset()
    torch._dynamo.config.automatic_dynamic_shapes = False  # one static graph per layer: the recompute matches it
    torch._dynamo.config.cache_size_limit = 64
    torch._C._dynamo.eval_frame._set_lru_cache(False)  # the recompute picks the graph the forward ran
    model = _wrap(_model(size, layers, lora, float8), compiled, checkpoint)
    h = SIZES[size][0]

    def inputs():
        torch.manual_seed(1)
        return torch.randn(batch, seq, h, dtype=torch.bfloat16, requires_grad=True)

    for _ in range(2):  # compile and warm up
        x = inputs()
        model(inputs_embeds=x, use_cache=False).last_hidden_state.float().sum().backward()
    x = inputs()
    packed: dict[int, int] = {}
    shapes: dict[int, str] = {}

    def pack(t):
        if t.device.type == "cpu" and not isinstance(t, torch.nn.Parameter):
            try:
                st = t.untyped_storage()
                packed.setdefault(st.data_ptr(), st.nbytes())
                shapes.setdefault(st.data_ptr(), f"{tuple(t.shape)}:{str(t.dtype)[6:]}")
            except (RuntimeError, NotImplementedError):
                pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = model(inputs_embeds=x, use_cache=False).last_hidden_state
    net = _net_alive(prof)
    out.float().sum().backward()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = sum(v for k, v in packed.items() if k not in params and k != x.untyped_storage().data_ptr())
    if DUMP:
        print(layers, "layers:", sorted(v for k, v in shapes.items() if k not in params), file=sys.stderr)
    return {"net": net, "packed": saved}


def _net_alive(prof) -> int:
    """Bytes allocated inside the profiled window and not freed in it (frees of older blocks ignored)."""
    from torch._C._profiler import _EventType
    from torch.profiler import _utils

    alive: dict[int, int] = {}
    nodes = sorted((n for n in _utils.traverse_dfs(prof.profiler.kineto_results.experimental_event_tree())
                    if n.typed[0] == _EventType.Allocation), key=lambda n: n.start_time_ns)
    for n in nodes:
        f = n.typed[1]
        if f.alloc_size > 0:
            alive[f.ptr] = f.alloc_size
        else:
            alive.pop(f.ptr, None)
    return sum(alive.values())


def per_token_layer(size: str, seq: int, **kw) -> dict:
    """(measure at 2L) - (measure at L), per token and layer."""
    lo, hi = measure(size, 2, seq, **kw), measure(size, 4, seq, **kw)
    return {k: (hi[k] - lo[k]) / (2 * seq) for k in lo}


def list_partition(size: str, seq: int, float8: str) -> list[str]:
    """The tensors the min-cut partitioner saves for backward in one compiled layer (``aot_eager_decomp_partition``:
    inductor's decompositions and partitioner without its code generation), as ``name dtype[shape]``, the
    layer's parameters and input left out: a listing where a float8 run of inductor on the CPU is too slow."""
    import torch
    from torch._functorch import partitioners

    torch._dynamo.reset()
    torch._dynamo.config.automatic_dynamic_shapes = False
    saved: list[str] = []
    original = partitioners.min_cut_rematerialization_partition

    def spy(joint, inputs, **kw):
        fw, bw = original(joint, inputs, **kw)
        outs = next(n for n in fw.graph.nodes if n.op == "output").args[0]
        n_saved = len([n for n in bw.graph.nodes if n.op == "placeholder" and not n.name.startswith("tangents")])
        for node in outs[len(outs) - n_saved:]:
            val = node.meta.get("val")
            if node.op != "placeholder" and isinstance(val, torch.Tensor):
                saved.append(f"{node.name} {str(val.dtype)[6:]}{list(val.shape)}")
        return fw, bw

    partitioners.min_cut_rematerialization_partition = spy
    try:
        model = _model(size, 1, False, float8)
        model.layers[0].compile(backend="aot_eager_decomp_partition")
        x = torch.randn(1, seq, SIZES[size][0], dtype=torch.bfloat16, requires_grad=True)
        model(inputs_embeds=x, use_cache=False).last_hidden_state.float().sum().backward()
    finally:
        partitioners.min_cut_rematerialization_partition = original
    return saved


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--sizes", default="s,m,l")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--modes", default="full,lora")
    ap.add_argument("--checkpoint", default="no,yes")
    ap.add_argument("--dump", action="store_true", help="print the packed tensors' shapes to stderr")
    ap.add_argument("--list-partition", metavar="FLOAT8", help="list one compiled layer's saved tensors: none, "
                    "tensorwise or rowwise (needs torchao for the float8 ones)")
    args = ap.parse_args()
    if args.list_partition:
        for line in list_partition(args.sizes.split(",")[0], args.seq, "" if args.list_partition == "none"
                                   else args.list_partition):
            print(line)
        return 0
    global DUMP
    DUMP = args.dump
    for size in args.sizes.split(","):
        for mode in args.modes.split(","):
            for checkpoint in [c == "yes" for c in args.checkpoint.split(",")]:
                row = {"size": size, "hidik": SIZES[size], "mode": mode, "checkpoint": checkpoint}
                for compiled in (False, True):
                    r = per_token_layer(size, args.seq, compiled=compiled, lora=mode == "lora", checkpoint=checkpoint,
                                        float8=mode[len("float8-"):] if mode.startswith("float8-") else "")
                    row["compiled" if compiled else "eager"] = r
                print(json.dumps(row) if args.json else
                      f"{size} {SIZES[size]} {mode:4} ckpt={checkpoint!s:5} eager net {row['eager']['net']:8.1f} "
                      f"packed {row['eager']['packed']:8.1f} | compiled net {row['compiled']['net']:8.1f} "
                      f"packed {row['compiled']['packed']:8.1f}  B/token/layer", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
