"""What outlives a litgpt QLoRA micro-batch's backward, measured on the CPU: the check of
``memest.estimate.training.activation_terms._previous_microbatch`` (``tests/test_lora_library.py``).

Usage: ``python benchmarks/litgpt_fit_retained.py LITGPT_SRC MODEL [B T LAYERS KEEP]``, LITGPT_SRC as for
``benchmarks/litgpt_saved_tensors.py`` (``litgpt/config.py``, ``model.py``, ``lora.py`` of commit 00af8b0 and an
empty ``litgpt/__init__.py``), KEEP how the ``MatMul4Bit`` stand-in keeps its input: ``ctx`` as bitsandbytes
0.42.0 (``ctx.tensors = (A, B)``), ``saved`` through ``save_for_backward``, ``none`` as 0.43.2+ (``(None, B)``).
Every ``torch.nn.Linear`` (the lm_head included, as Fabric's ``BitsandbytesPrecision`` replaces them) runs the
stand-in, which also makes 0.42's dequantized fp16 copy and its cast in forward and backward. The loop is
``litgpt/finetune/lora.py`` ``fit()`` at 00af8b0: ``logits = model(input_ids, lm_head_chunk_size=128)`` (Fabric's
``convert_output`` casting each chunk to fp32), ``logits[-1] = logits[-1][..., :-1, :]``, ``loss =
chunked_cross_entropy(...)``, ``backward(loss / 4)``, both names kept until the next micro-batch rebinds them.
Live bytes are the CPU allocator's, from ``torch.profiler`` memory events.

Recorded (torch 2.13 CPU; Mistral-7B-v0.1 at 2 layers, b 1 x 256 tokens, r 32 on q and v, dropout 0.05; 3
micro-batches): after every backward ``ctx`` holds 61,816,836 B, ``saved`` and ``none`` 34,553,860: 27,262,976 B
more, which is (layer 0: o_proj's, the MLP's and down_proj's inputs 2 x 4096 + 2 x 4096 + 2 x 14336 B; layer 1:
those and q/k/v's input, 2 x 4096 B; the lm_head's input 2 x 4096 B) x 256 tokens = 106,496 x 256 exactly.
The peak of micro-batches 2 and 3 is in the forward (at the lm_head's last chunk, located with forward
hooks on it), 720,955,156 B under ``ctx`` and 693,692,180 B under ``saved``: the same 27,262,976 B above;
their backward's is 692,080,668 B, and the first micro-batch's peak is in its backward (690,376,732 B
either way).
"""

from __future__ import annotations

import sys
import types


def main(src: str, name: str, b: int = 1, t: int = 256, n_layer: int = 2, keep: str = "ctx") -> None:
    import torch
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, record_function

    utils = types.ModuleType("litgpt.utils")
    utils.find_multiple = lambda n, k: n if n % k == 0 else n + k - (n % k)
    utils.map_old_state_dict_weights = lambda state_dict, mapping, prefix: state_dict
    sys.modules["litgpt.utils"] = utils
    sys.path.insert(0, src)

    class MatMul4Bit(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, w):
            out = torch.nn.functional.linear(a, w.to(torch.float16).to(a.dtype))
            if keep == "saved":
                ctx.save_for_backward(a, w)
            ctx.tensors = (a, w) if keep == "ctx" else (None, w)
            return out

        @staticmethod
        def backward(ctx, g):
            w = ctx.tensors[1]
            return torch.matmul(g, w.to(torch.float16).to(g.dtype)), None

    class Linear4bit(nn.Linear):
        def forward(self, x):
            out = MatMul4Bit.apply(x, self.weight)
            return out if self.bias is None else out + self.bias

    nn.Linear = Linear4bit
    from litgpt import lora

    def chunked_cross_entropy(logits, targets, ignore_index=-100):  # litgpt/utils.py at 00af8b0, list input
        logit_chunks = [c.reshape(-1, c.size(-1)) for c in logits]
        target_chunks = [c.reshape(-1) for c in targets.split(logits[0].size(1), dim=1)]
        losses = [torch.nn.functional.cross_entropy(x, y, ignore_index=ignore_index, reduction="none")
                  for x, y in zip(logit_chunks, target_chunks)]
        n = (targets != ignore_index).sum()
        return torch.cat(losses).sum() / n.maximum(torch.ones_like(n))

    cfg = lora.Config.from_name(name, n_layer=n_layer, lora_r=32, lora_alpha=16, lora_dropout=0.05,
                                lora_query=True, lora_key=False, lora_value=True)
    torch.set_default_dtype(torch.bfloat16)
    model = lora.GPT(cfg)
    torch.set_default_dtype(torch.float32)
    model.max_seq_length = t
    lora.mark_only_lora_as_trainable(model)
    model.train()
    torch.manual_seed(0)
    iters = 3
    batches = [torch.randint(0, cfg.vocab_size, (b, t + 1)) for _ in range(iters)]

    def fit():
        for i in range(iters):
            with record_function(f"micro-batch {i}"):
                ids, targets = batches[i][:, :-1], batches[i][:, 1:]
                with record_function(f"forward {i}"):
                    torch.set_default_dtype(torch.bfloat16)  # Fabric's forward_context
                    out = model(ids, lm_head_chunk_size=128)
                    torch.set_default_dtype(torch.float32)
                    logits = [o.to(torch.float32) for o in out]  # Fabric's convert_output
                    del out
                logits[-1] = logits[-1][..., :-1, :]
                loss = chunked_cross_entropy(logits, targets[..., 1:])
                with record_function(f"backward {i}"):
                    (loss / 4).backward()

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fit()
    events = list(prof.profiler.kineto_results.events())
    mem = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    spans = {e.name(): (e.start_ns(), e.end_ns()) for e in events if e.name().startswith(("micro-batch", "backward"))}
    peak: dict[str, int] = {}
    live = 0
    for ts, nb in mem:
        live += nb
        for k, (s, e) in spans.items():
            if s <= ts <= e:
                peak[k] = max(peak.get(k, live), live)

    def at(ts: int) -> int:
        return sum(nb for tt, nb in mem if tt <= ts)
    for i in range(iters):
        print(f"{name} {keep} micro-batch {i}: peak {peak[f'micro-batch {i}']:,} B (its backward's "
              f"{peak[f'backward {i}']:,}); live after its backward {at(spans[f'backward {i}'][1]):,} B")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], args[1], *(int(a) for a in args[2:5]), *args[5:6])
