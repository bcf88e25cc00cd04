"""litgpt 0.4's loss path alone, measured on the CPU: the lm_head in 128-token chunks through a bitsandbytes 0.42
``MatMul4Bit`` stand-in (its fp16 dequantized copy and the cast, in forward and backward), Fabric's
``convert_output`` to fp32, ``chunked_cross_entropy`` and the backward (``litgpt/model.py``, ``utils.py`` and
``finetune/lora.py`` ``fit()`` at 00af8b0; torch 2.13 CPU allocator, ``torch.profiler`` memory events).

Usage: ``python benchmarks/litgpt_loss_path.py`` (V 32000, h 4096, b 1 x 512 tokens).

Recorded: the lm_head's forward peaks at 4 V h + 2.35 B x b s V (memest's ``head_forward``: 4 V h + 2 B x b s V
of logits, the head's input apart); the cross-entropy's forward at 8.25 B x b s V (the fp32 chunks kept by
``fit()``'s ``logits`` and every chunk's fp32 log-softmax; memest's ``loss_forward`` counts 10 B); the backward
at 4 V h + 6.26 B x b s V (the fp32 chunks, every chunk's bf16 gradient waiting for the lm_head's backward, the
dequantized weight; memest's ``loss_backward`` counts 4 V h + 12 B). Beyond whole bytes: the input's copy,
b s h x 2 B = 0.26 B x b s V here. Not modelled yet: a finding for the loss path.
"""

from __future__ import annotations


def main(v: int = 32000, h: int = 4096, b: int = 1, s: int = 512) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    class MatMul4Bit(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, w):
            out = torch.nn.functional.linear(a, w.to(torch.float16).to(a.dtype))
            ctx.tensors = (a, w)
            return out

        @staticmethod
        def backward(ctx, g):
            return torch.matmul(g, ctx.tensors[1].to(torch.float16).to(g.dtype)), None

    w = torch.randn(v, h, dtype=torch.bfloat16)
    x0 = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, v, (b, s))

    def run():
        x = x0 * 1.0
        with record_function("lm_head forward"):
            out = [MatMul4Bit.apply(xi, w) for xi in x.split(128, dim=1)]
            logits = [o.to(torch.float32) for o in out]
            del out
        logits[-1] = logits[-1][..., :-1, :]
        with record_function("loss forward"):
            chunks = [c.reshape(-1, c.size(-1)) for c in logits]
            tchunks = [c.reshape(-1) for c in targets[..., 1:].split(128, dim=1)]
            losses = [torch.nn.functional.cross_entropy(c, t, reduction="none") for c, t in zip(chunks, tchunks)]
            loss = torch.cat(losses).sum() / s
            del chunks, losses
        with record_function("backward"):
            loss.backward()

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = list(prof.profiler.kineto_results.events())
    mem = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    names = ("lm_head forward", "loss forward", "backward")
    spans = {e.name(): (e.start_ns(), e.end_ns()) for e in events if e.name() in names}
    live, peak = 0, {}
    for ts, nb in mem:
        live += nb
        for k, (start, end) in spans.items():
            if start <= ts <= end:
                peak[k] = max(peak.get(k, live), live)
    bsv, deq = b * s * v, 4 * v * h
    for k in names:
        rest = peak[k] - (deq if k != "loss forward" else 0)
        print(f"{k}: peak {peak[k]:,} B = {'4 V h + ' if k != 'loss forward' else ''}{rest / bsv:.2f} B x b s V")


if __name__ == "__main__":
    main()
