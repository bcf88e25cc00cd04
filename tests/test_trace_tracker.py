"""The storage tracker, the fused-attention routing and the autocast emulation on small programs worked by hand."""

import pytest

torch = pytest.importorskip("torch")

from memest.result import Kind
from memest.trace._attention import routed_attention
from memest.trace._autocast import AutocastEmulation
from memest.trace._tracker import StorageTracker

MiB = 1024 * 1024
F = torch.nn.functional


def test_allocations_frees_and_views_are_counted_as_cuda_blocks() -> None:
    # 1000 x 1000 fp32 = 4,000,000 B -> 7813 blocks of 512 B = 4,000,256 B
    block = 4_000_256
    tracker = StorageTracker()
    with tracker:
        x = torch.empty(1000, 1000, device="meta")
        x.view(-1)  # a view: same storage, no allocation
        x.t()
        y = x * 2  # temporary
        z = y + 1
        del y
    assert tracker.peak == 3 * block
    assert tracker.allocated == 2 * block
    assert tracker.peak_tensor_bytes == 3 * 4_000_000
    # three 4 MB blocks (< 10 MiB) are cut from one 20 MiB segment
    assert tracker.allocator.peak_reserved_bytes == 20 * MiB
    del x, z


def test_saved_activations_are_freed_by_backward() -> None:
    tracker = StorageTracker(cuda=False)
    w = torch.empty(64, 32, device="meta", requires_grad=True)
    tracker.adopt([w], Kind.WEIGHTS, "parameter")
    with tracker:
        x = torch.empty(8, 32, device="meta")
        h = torch.relu(x @ w.t())  # h (8 x 64) saved by relu's backward
        loss = h.sum()
        del h
        loss.backward()
        del loss
        del x
    # left: the weight and its gradient, 64 x 32 x 4 B each
    assert tracker.allocated == 2 * 64 * 32 * 4
    assert tracker.record_of(w.grad) is not None


def test_cpu_tensors_are_not_device_memory() -> None:
    tracker = StorageTracker(cuda=False)
    with tracker:
        step = torch.tensor(0.0)  # an optimizer's step counter lives on the CPU
        x = torch.empty(10, device="meta")
    assert tracker.allocated == 40  # the 10 fp32 meta elements only
    del step, x


def test_flash_attention_backward_adds_its_kernel_workspaces() -> None:
    # b=1, a=4 query heads, k=2 KV heads, s=256, d=64, bf16 (2 B)
    b, a, k, s, d = 1, 4, 2, 256, 64
    q = torch.empty(b, a, s, d, device="meta", dtype=torch.bfloat16, requires_grad=True)
    kv = torch.empty(b, k, s, d, device="meta", dtype=torch.bfloat16, requires_grad=True)
    tracker = StorageTracker(cuda=False)
    with tracker:
        out = torch.ops.aten._scaled_dot_product_flash_attention(q, kv, kv, 0.0, True, False)[0]
        out.sum().backward()
    sizes = {label: n for label, n in zip(tracker.labels, tracker.nbytes) if isinstance(label, str)}
    assert sizes["flash backward softmax_d (fp32)"] == 4 * b * a * s  # s already a multiple of 128
    assert sizes["flash backward dq_accum (fp32)"] == 4 * b * s * a * d  # d already a multiple of 32
    assert sizes["flash backward dk_expanded (GQA)"] == 2 * b * s * a * d
    assert sizes["flash backward dv_expanded (GQA)"] == 2 * b * s * a * d
    freed = [tracker.free_event[i] for i, label in enumerate(tracker.labels) if isinstance(label, str)]
    assert all(f >= 0 for f in freed)  # transient: freed when the kernel returns


@pytest.mark.parametrize(
    ("target", "dtype", "kv_heads", "mask", "kernel"),
    [
        ("cuda", torch.bfloat16, 4, False, "flash"),
        ("cuda", torch.bfloat16, 2, False, "flash"),  # FlashAttention-2 takes grouped K/V as they are
        ("cuda", torch.bfloat16, 4, True, "efficient"),  # an explicit mask rules flash out
        ("cuda", torch.float32, 4, False, "efficient"),  # flash needs fp16/bf16
        ("cuda", torch.float32, 2, False, "math"),  # efficient needs as many K/V heads as Q heads
        ("cpu", torch.float32, 4, False, "cpu_flash"),
    ],
    ids=["cuda-bf16-mha", "cuda-bf16-gqa", "cuda-mask", "cuda-fp32", "cuda-fp32-gqa", "cpu-fp32"],
)
def test_attention_goes_to_the_kernel_the_device_would_pick(target, dtype, kv_heads, mask, kernel) -> None:
    q = torch.empty(1, 4, 16, 32, device="meta", dtype=dtype)
    kv = torch.empty(1, kv_heads, 16, 32, device="meta", dtype=dtype)
    attn_mask = torch.empty(1, 1, 16, 16, device="meta", dtype=torch.bool) if mask else None
    used: set[str] = set()
    with routed_attention(target, used):
        out = F.scaled_dot_product_attention(q, kv, kv, attn_mask=attn_mask, enable_gqa=kv_heads != 4)
    assert used == {kernel}
    assert out.shape == q.shape
    assert F.scaled_dot_product_attention.__name__ == "scaled_dot_product_attention"  # restored


def test_math_attention_keeps_the_scores_the_fused_kernel_does_not() -> None:
    # b=1, a=4, s=512, d=64, bf16: the math path materialises 4 x 512 x 512 scores (2 MiB in bf16)
    q = torch.empty(1, 4, 512, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)

    def saved_bytes(route: bool) -> int:
        tracker = StorageTracker(cuda=False)
        with tracker:
            if route:
                with routed_attention("cuda", set()):
                    out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
            else:
                out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        del out
        return tracker.peak_tensor_bytes

    flash = saved_bytes(True)
    assert flash == 2 * 4 * 512 * 64 + 4 * 4 * 512 + 16 + 8  # output + fp32 logsumexp + philox seed/offset
    assert saved_bytes(False) > flash + 4 * 512 * 512 * 2


def test_autocast_emulation_casts_like_cuda_autocast_and_caches_weight_casts() -> None:
    w = torch.nn.Parameter(torch.empty(16, 8, device="meta"))
    x = torch.empty(4, 8, device="meta")
    with AutocastEmulation(torch.bfloat16) as mode:
        y1 = F.linear(x, w)  # lower-precision list
        y2 = F.linear(x, w)
        p = torch.softmax(y1, dim=-1)  # fp32 list
        s = y1 + y2  # not listed: plain type promotion
        z = torch.addcmul(torch.empty(4, 16, device="meta"), y1, y2)  # promote list: widest (fp32)
        assert len(mode._cache) == 1  # the weight was cast once
    assert (y1.dtype, p.dtype, s.dtype, z.dtype) == (torch.bfloat16, torch.float32, torch.bfloat16, torch.float32)
    assert len(mode._cache) == 0  # the cache ends with the region
