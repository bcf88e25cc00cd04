"""What litgpt 0.4's own layer keeps for backward, counted on the CPU: the check of
``memest.estimate.activations.Execution.litgpt_attention`` (``tests/test_lora_library.py``).

Usage: ``python benchmarks/litgpt_saved_tensors.py LITGPT_SRC MODEL [B T MODE]`` where LITGPT_SRC is a folder
holding ``litgpt/config.py``, ``model.py`` and ``lora.py`` of litgpt commit 00af8b0 and an empty
``litgpt/__init__.py`` (``git show
00af8b0d9b43:litgpt/model.py`` ...; its ``utils.py`` is stubbed here, it needs lightning), MODEL a litgpt
config name (``Llama-2-7b-hf``), MODE ``qv`` (q and v adapters) or ``all``. Every ``torch.nn.Linear`` is
built as a stand-in for bitsandbytes 0.42's ``MatMul4Bit`` (its ``ctx.tensors = (A, B)`` keeps the input);
the model is built in bf16 with its rope cache in fp32 (``fit()`` sets ``max_seq_length`` outside the dtype
context); a ``saved_tensors_hooks`` pack hook counts each saved storage once, parameters and buffers left out,
per block. CPU dropout keeps a bf16 noise tensor where CUDA's ``native_dropout`` keeps a 1 B mask: 1 B x
width less per LoRA dropout on a GPU.

Recorded (block 1 of 2, b 1 x 256 tokens, r 8, dropout 0.05; B x h per token, CPU; GPU = less the dropouts'
extra byte): Llama-2-7b-hf qv 55.63 (GPU 54.63), Mistral-7B-v0.1 qv 56.74 (55.74), Meta-Llama-3-8B qv 56.61
(55.61), falcon-7b qv 36.19 (35.19), Phi-3-mini-4k-instruct all 74.28 (67.61), gemma-7b all 144.09 (132.09),
phi-2 all 62.09 (55.09). memest's litgpt layer: 54.55, 55.55, 55.55, 33.08, 67.40, 131.74, 55.08.
"""

from __future__ import annotations

import sys
import types


def main(src: str, name: str, b: int = 1, t: int = 256, mode: str = "qv") -> None:
    import torch
    import torch.nn as nn

    utils = types.ModuleType("litgpt.utils")
    utils.find_multiple = lambda n, k: n if n % k == 0 else n + k - (n % k)
    utils.map_old_state_dict_weights = lambda state_dict, mapping, prefix: state_dict
    sys.modules["litgpt.utils"] = utils
    sys.path.insert(0, src)

    class MatMul4BitStandIn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, w):
            ctx.save_for_backward(a, w)
            return torch.nn.functional.linear(a, w)

        @staticmethod
        def backward(ctx, g):
            _, w = ctx.saved_tensors
            return g @ w, None

    class Linear4bit(nn.Linear):
        def forward(self, x):
            out = MatMul4BitStandIn.apply(x, self.weight)
            return out if self.bias is None else out + self.bias

    nn.Linear = Linear4bit
    import litgpt.lora as lora

    adapters = dict(lora_query=True, lora_key=mode == "all", lora_value=True, lora_projection=mode == "all",
                    lora_mlp=mode == "all", lora_head=mode == "all")
    cfg = lora.Config.from_name(name, n_layer=2, lora_r=8, lora_alpha=16, lora_dropout=0.05, **adapters)
    torch.set_default_dtype(torch.bfloat16)
    model = lora.GPT(cfg)
    torch.set_default_dtype(torch.float32)
    model.max_seq_length = t
    lora.mark_only_lora_as_trainable(model)
    model.train()
    fixed = {p.untyped_storage().data_ptr() for p in [*model.parameters(), *model.buffers()]}
    where, seen, sizes = {"block": "other"}, set(), {}

    def pack(x):
        ptr = x.untyped_storage().data_ptr()
        if ptr not in fixed and ptr not in seen:
            seen.add(ptr)
            sizes[where["block"]] = sizes.get(where["block"], 0) + x.untyped_storage().nbytes()
        return x

    for i, block in enumerate(model.transformer.h):
        block.register_forward_pre_hook(lambda m, a, i=i: where.__setitem__("block", f"block{i}"))
        block.register_forward_hook(lambda m, a, o: where.__setitem__("block", "head"))
    idx = torch.randint(0, cfg.vocab_size, (b, t))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        model(idx, lm_head_chunk_size=128)
    for block, n in sizes.items():
        print(f"{name} {block}: {n / (b * t):,.0f} B per token = {n / (b * t) / cfg.n_embd:.2f} x h")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], args[1], *(int(a) for a in args[2:4]), *args[4:5])
