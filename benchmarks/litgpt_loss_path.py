"""litgpt 0.4's loss path alone, measured on the CPU: the lm_head in 128-token chunks through a bitsandbytes 0.42
``MatMul4Bit`` stand-in (its fp16 dequantized copy and the cast, in forward and backward), Fabric's
``convert_output`` to fp32, ``chunked_cross_entropy`` and the backward (``litgpt/model.py``, ``utils.py`` and
``finetune/lora.py`` ``fit()`` at 00af8b0; torch 2.13 CPU allocator, ``torch.profiler`` memory events).

Usage: ``python benchmarks/litgpt_loss_path.py`` (V 32000, h 4096, b 1 x 512 tokens; about 12 minutes on 2 CPU
cores) or ``--plain`` (V 32000, h 256, three shapes).

Recorded (benchmarks/litgpt_loss_path.md): with the NF4 stand-in the lm_head's forward peaks at 4 V h + 1.76 B x
b s V, the loss forward at 8.25 B and the backward at 4 V h + 6.26 B; with a plain frozen bf16 head (``--plain``,
h 256) the loss forward at 8.01 B (b 1) / 9.00 B (b 2) and the backward at 10.01 B (s 512) / 8.99 B (s 1044).
memest's :attr:`Loss.LITGPT_CHUNKED` (``activation_terms._litgpt_logits_forward`` / ``_litgpt_logits_backward``):
forward 8 B (fp32 chunks + fp32 log-softmax; b > 1: the shifted last chunk's reshape copy, 4 B x b x 127 x V
here), backward the larger of 8 B + 8 B x b x 128 x V (the cross-entropy's phase) and 4 + 2 B beside the
dequantized head (the head's phase); the head input's copy (2 h / V B) is the script's ``x0 * 1.0``.
"""

from __future__ import annotations


def main(v: int = 32000, h: int = 4096, b: int = 1, s: int = 512, plain: bool = False) -> None:
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
            if plain:  # litgpt's LoRA, bf16-true: the frozen bf16 lm_head
                out = [torch.nn.functional.linear(xi, w) for xi in x.split(128, dim=1)]
            else:
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
    bsv, deq = b * s * v, 0 if plain else 4 * v * h
    last = s - 128 * ((s - 1) // 128)
    copy = 4 * b * (last - 1) * v if b > 1 else 0
    model = {"loss forward": 8 * bsv + copy,
             "backward": max(8 * bsv + 8 * b * min(128, s) * v, 6 * bsv + deq)}
    print(f"b {b}, s {s}, V {v}, h {h}, {'plain bf16' if plain else 'NF4 stand-in'} head; input copy "
          f"{2 * h / v:.2f} B x b s V")
    for k in names:
        rest = peak[k] - (deq if k != "loss forward" else 0)
        line = f"{k}: peak {peak[k]:,} B = {'4 V h + ' if deq and k != 'loss forward' else ''}{rest / bsv:.2f} B x b s V"
        if k in model:
            line += f"; memest's Loss.LITGPT_CHUNKED + the input copy: {model[k] + 2 * b * s * h:,} B"
        print(line)


if __name__ == "__main__":
    import sys

    if "--plain" in sys.argv:
        for b, s in ((1, 512), (2, 512), (1, 1044)):
            main(h=256, b=b, s=s, plain=True)
    else:
        main()
