"""Attention as the device would run it: route ``F.scaled_dot_product_attention`` to the fused kernels.

On the meta device ``F.scaled_dot_product_attention`` has no fused backend and falls back to
the math path, which materialises the s x s scores and softmax and keeps them for backward — a
GPU never does that. :func:`routed_attention` swaps the function for one that chooses a kernel
the way the target device's dispatcher does and calls that kernel's aten operator, whose meta
implementation (with backward) allocates exactly the outputs the real kernel returns:

- ``cuda`` (``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``, priority flash >
  memory-efficient > math): FlashAttention-2 (``_scaled_dot_product_flash_attention``: output +
  fp32 logsumexp (b, a, s)) when there is no explicit mask, the dtype is fp16/bf16 and head_dim
  is a multiple of 8 up to 256 (grouped-query K/V are used unrepeated); else the memory-efficient
  kernel (``_scaled_dot_product_efficient_attention``, which takes the mask as a bias and keeps
  it) when K/V have as many heads as Q; else the math fallback, as on the device;
- ``cpu`` (``torch._fused_sdp_choice`` asked directly with one-token CPU tensors of the same
  heads, head_dim and dtype): ``_scaled_dot_product_flash_attention_for_cpu`` or math.

transformers' own attention code (``integrations/sdpa_attention.py``: ``repeat_kv``, the causal
mask or ``is_causal``, ``enable_gqa``) runs unchanged around the call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from memest.trace._autocast import active_dtype

_ORIGINAL = F.scaled_dot_product_attention
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _cuda_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any) -> str:
    d, dv = q.shape[-1], v.shape[-1]
    if attn_mask is None and q.dtype in _LOW_PRECISION and d == dv and d % 8 == 0 and d <= 256:
        return "flash"
    if k.shape[-3] == q.shape[-3] and d % 8 == 0 and dv % 8 == 0:
        return "efficient"
    return "math"


def _cpu_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any, dropout_p: float,
                is_causal: bool, enable_gqa: bool) -> str:
    def probe(t: torch.Tensor) -> torch.Tensor:
        return torch.empty((*t.shape[:-2], 1, t.shape[-1]), dtype=t.dtype, device="cpu")

    mask = None
    if isinstance(attn_mask, torch.Tensor):
        mask = torch.empty([1] * attn_mask.dim(), dtype=attn_mask.dtype, device="cpu")
    choice = torch._fused_sdp_choice(probe(q), probe(k), probe(v), attn_mask=mask, dropout_p=dropout_p,
                                     is_causal=is_causal, enable_gqa=enable_gqa)
    return "cpu_flash" if choice == int(SDPBackend.FLASH_ATTENTION.value) else "math"


@contextlib.contextmanager
def routed_attention(target: str, used: set[str]) -> Iterator[None]:
    """Within the block, ``F.scaled_dot_product_attention`` runs the kernel ``target`` would pick.

    Args:
        target: ``cuda`` or ``cpu``.
        used: Receives the names of the kernels chosen (``flash``, ``efficient``, ``cpu_flash``,
            ``math``), for the trace's settings.
    """

    def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any = None,
             dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
             enable_gqa: bool = False) -> torch.Tensor:
        dtype = active_dtype()
        if dtype is not None:  # attention is on autocast's lower-precision list
            query, key, value = (t.to(dtype) if t.dtype == torch.float32 else t for t in (query, key, value))
        if target == "cuda":
            kernel = _cuda_kernel(query, key, value, attn_mask)
        else:
            kernel = _cpu_kernel(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
        used.add(kernel)
        if kernel == "flash":
            return torch.ops.aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=scale)[0]
        if kernel == "efficient":
            need_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                query, key, value, attn_mask, need_lse, dropout_p, is_causal, scale=scale)[0]
        if kernel == "cpu_flash":
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]
        return _ORIGINAL(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                         scale=scale, enable_gqa=enable_gqa)

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = _ORIGINAL
