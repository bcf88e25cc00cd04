"""Activation memory: what a layer keeps for backward (training) or holds in a forward (serving).

Symbols (see ``memest.estimate``): b micro-batch, s seq_len, h hidden_size, a heads, k KV heads,
d head_dim, i intermediate_size, V vocab, t tp, c bytes per element of the compute dtype.

Per token, one layer keeps for backward (training, no recompute), derived from the module graph of
a pre-norm transformer layer as PyTorch autograd saves it:

- each norm: its input (h·c) and its output, which the next linear saves (h·c), plus an fp32
  statistic (rstd; LayerNorm adds the mean);
- attention: Q, K, V as the fused kernel receives them ((a·d + 2·k·d)·c), its output (a·d·c),
  the contiguous copy the output projection saves (a·d·c), and the kernel's fp32 logsumexp (4·a).
  Eager attention also keeps the fp32 softmax and its cast copy, a·s·(4 + c) per token — the
  s x s matrix flash/SDPA kernels never store;
- gated MLP: gate and up outputs, the activation's output and the product (4·i·c); a plain MLP
  keeps the pre-activation and the activation output (2·i·c);
- MoE: the router's fp32 logits (4·E), each token's copy dispatched to its top-k experts and
  gathered back (2·topk·h·c), and the MLP tensors of top-k experts (topk × the MLP term).

This matches Korthikanti et al. 2022 (§4.1, 34·s·b·h + 5·a·s²·b for GPT) term by term where the
architectures agree (their 34 counts dropout masks and a 4h GELU MLP; flash kernels drop the
5·a·s²·b part). Tensors inside the tensor-parallel regions (Q/K/V, attention output, MLP
intermediates) are divided by t; norm inputs/outputs are divided by t only with sequence
parallelism (§4.2.2).
"""

from __future__ import annotations

from dataclasses import dataclass

from memest.spec import LayerSpec


@dataclass(frozen=True, slots=True)
class LayerActivations:
    """Bytes per token one layer keeps, split by how tensor parallelism divides them.

    Attributes:
        inside: Bytes inside tensor-parallel regions (divided by tp).
        outside: Bytes outside them (divided by tp only with sequence parallelism).
    """

    inside: float
    outside: float

    def per_rank(self, tp: int, sequence_parallel: bool) -> float:
        """Bytes per token on one TP rank."""
        return self.inside / tp + (self.outside / tp if sequence_parallel else self.outside)


def layer_activations(layer: LayerSpec, *, hidden: int, c: int, seq_len: int, eager: bool) -> LayerActivations:
    """Bytes per token one layer keeps for backward, without recompute.

    Args:
        layer: The layer.
        hidden: h, the model width.
        c: Bytes per element of the compute dtype (2 for bf16/fp16, 4 for fp32).
        seq_len: s, for the eager attention matrix.
        eager: True for eager attention (scores and softmax stored).
    """
    attn, mlp = layer.attention, layer.mlp
    inside = 0.0
    norm_stat = 4 if layer.norm == "rms" else 8
    num_norms = 1 if layer.parallel_residual else 2
    outside = num_norms * (2 * hidden * c + norm_stat)

    if attn.kind in ("gqa", "mla"):
        a, k, d, dv = attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.v_head_dim
        if attn.kind == "mla":
            # compressed q/kv latents kept by the up-projections, then full-width q, k, v
            inside += (attn.q_lora_rank or 0) * c + (attn.kv_lora_rank + attn.qk_rope_head_dim) * c
            k = a
        inside += (a * d + k * d + k * dv) * c  # q, k, v
        inside += 2 * a * dv * c  # attention output + contiguous copy for o_proj
        inside += 4 * a  # fp32 logsumexp
        if eager:
            window = min(seq_len, attn.sliding_window or seq_len)
            inside += a * window * (4 + c)
        if attn.cross_attention:
            inside += (a * d + 2 * k * d + 2 * a * dv) * c + 4 * a + 2 * hidden * c
    elif attn.kind == "mamba":
        # seed: the mixer's in_proj output (2 x d_inner = 4h), conv and SSM inputs; not yet traced
        inside += 6 * hidden * c

    per_mlp = (4 if mlp.gated else 2) * mlp.intermediate_size * c
    if mlp.is_moe:
        inside += mlp.num_experts_per_tok * per_mlp
        outside += 4 * mlp.num_experts + 2 * mlp.num_experts_per_tok * hidden * c
        if mlp.num_shared_experts:
            inside += (4 if mlp.gated else 2) * mlp.shared_intermediate_size * c
    else:
        inside += per_mlp
    return LayerActivations(inside=inside, outside=outside)

