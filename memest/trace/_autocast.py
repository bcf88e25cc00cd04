"""``torch.autocast`` for meta tensors: the casts CUDA autocast makes, emulated above autograd.

CUDA autocast only casts tensors that are on a CUDA device (``is_autocast_eligible`` in
``aten/src/ATen/autocast_mode.h``), so on meta tensors ``torch.autocast`` does nothing. This
``TorchFunctionMode`` makes the same casts at the same level (before autograd records the op, so
the casts have their backward and the cast copies are saved where autograd saves them), from the
op lists of ``aten/src/ATen/autocast_mode.cpp`` as ``torch/testing/_internal/autocast_test_lists.py``
enumerates them for CUDA:

- lower precision (``linear``, ``matmul``, ``mm``, ``bmm``, ``baddbmm``, ``addmm``, convolutions,
  ``einsum``, attention): floating inputs other than float64 are cast to the autocast dtype;
- fp32 (``softmax``, ``log_softmax``, ``exp``, ``pow``, ``rsqrt``, ``sum``, norms, losses, ...):
  fp16/bf16 inputs are cast to float32;
- promote (``addcmul``, ``addcdiv``, ``cat``-like ops, ...): inputs are cast to the widest type.

Like ``cached_cast``, the cast of a leaf fp32 tensor that requires grad (a parameter) is cached
until the autocast region ends: each weight's bf16 copy is made once per forward and lives as
long as the region or autograd keeps it. Each such copy is handed to ``on_weight_cast`` (the trace
files it as workspace, the kind of the estimate's ``workspace.autocast_weights``).

Limitation: regions that disable autocast (``torch.autocast(..., enabled=False)``, as rotary
embeddings do) are not honoured; what they compute is small (b x s x head_dim).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

LOWER_PRECISION = frozenset({
    "linear", "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "baddbmm", "addmm", "addbmm", "addmv",
    "addr", "mv", "einsum", "chain_matmul", "multi_dot", "vecdot", "prelu", "conv1d", "conv2d", "conv3d",
    "conv_tbc", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "convolution",
    "scaled_dot_product_attention",
})
FP32 = frozenset({
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow", "__pow__", "__rpow__", "softplus", "softmax", "log_softmax", "layer_norm", "rms_norm",
    "group_norm", "norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "hinge_embedding_loss",
    "kl_div", "margin_ranking_loss", "triplet_margin_loss", "binary_cross_entropy_with_logits", "cumprod", "cumsum",
    "dist", "pdist", "cdist", "prod", "renorm", "sum", "logsumexp", "nll_loss", "cross_entropy", "l1_loss",
    "smooth_l1_loss", "huber_loss", "mse_loss", "multilabel_margin_loss", "soft_margin_loss", "multi_margin_loss",
})
PROMOTE = frozenset({
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put", "tensordot",
    "scatter_add",
})

_active: list[AutocastEmulation] = []


def active_dtype() -> torch.dtype | None:
    """The autocast dtype of the innermost active emulation, or None."""
    return _active[-1].dtype if _active else None


class AutocastEmulation(TorchFunctionMode):
    """Autocast to ``dtype`` (bf16 or fp16) for tensors on any device, CUDA's op lists.

    Args:
        dtype: The lower-precision dtype.
        on_weight_cast: Called with each cached cast of a parameter as it is made.
    """

    def __init__(self, dtype: torch.dtype, on_weight_cast: Callable[[torch.Tensor], None] | None = None) -> None:
        super().__init__()
        self.dtype = dtype
        self.on_weight_cast = on_weight_cast
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __enter__(self) -> AutocastEmulation:  # noqa: PYI034 - the mode object itself is what callers use
        _active.append(self)
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        _active.remove(self)
        self._cache.clear()

    def cast_lower(self, t: Any) -> Any:
        """``t`` at the autocast dtype if it is a floating tensor other than float64 (cached for parameters)."""
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dtype in (self.dtype, torch.float64):
            return t
        cacheable = t.dtype == torch.float32 and t.requires_grad and t.is_leaf and not t._is_view()
        if cacheable:
            hit = self._cache.get(id(t))
            if hit is not None and hit[0] is t:
                return hit[1]
        out = t.to(self.dtype)
        if cacheable:
            self._cache[id(t)] = (t, out)
            if self.on_weight_cast is not None:
                self.on_weight_cast(out)
        return out

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in LOWER_PRECISION:
            args, kwargs = tree_map(self.cast_lower, (args, kwargs))
        elif name in FP32:
            args, kwargs = tree_map(_to_fp32, (args, kwargs))
        elif name in PROMOTE:
            widest = _widest(args, kwargs)
            if widest is not None:
                args, kwargs = tree_map(lambda t: _to(t, widest), (args, kwargs))
        return func(*args, **kwargs)


def _to_fp32(t: Any) -> Any:
    if isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16):
        return t.to(torch.float32)
    return t


def _to(t: Any, dtype: torch.dtype) -> Any:
    if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != dtype:
        return t.to(dtype)
    return t


def _widest(args: Any, kwargs: Any) -> torch.dtype | None:
    found: list[torch.dtype] = []
    tree_map(lambda t: found.append(t.dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else None,
             (args, kwargs))
    if not found:
        return None
    return max(found, key=lambda d: torch.finfo(d).bits)
