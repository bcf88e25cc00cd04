"""bitsandbytes' paged optimizers: the states of tensors >= 1e5 elements in CUDA managed memory, outside
PyTorch's caching allocator (bitsandbytes 0.42-0.50 ``bitsandbytes/optim/optimizer.py``
``Optimizer8bit.get_state_buffer``: ``if not self.is_paged or p.numel() < 1e5: torch.zeros_like`` else
``F.get_paged``, which is ``cudaMallocManaged(..., cudaMemAttachHost)`` in ``csrc/pythonInterface.cpp``
``cget_managed_ptr``); ``min_8bit_size`` 4096 keeps 32-bit states for smaller tensors; the block-wise
``absmax`` is ``torch.zeros`` on the device."""

from __future__ import annotations

import dataclasses

import pytest

from memest.devices import get_device
from memest.estimate import estimate
from memest.sources import load_model
from memest.workload import Framework, Optimizer, Precision, Recompute, TrainingConfig

A100 = get_device("A100-80GB")
GiB = 1 << 30

# Llama-3.2-1B: 1,235,814,400 parameters (tied embedding); its norms: 16 layers x 2 x 2048 + the final 2048
# = 67,584 elements in 2048-element tensors (< 4096: 32-bit states, < 1e5: not paged); every other tensor
# (the 262,668,288-element embedding, the 1,048,576- to 16,777,216-element linears) is >= 1e5: paged
P = 1_235_814_400
NORMS = 67_584
PAGED = 2 * (P - NORMS)                      # two uint8 states: 2 x 1,235,746,816 = 2,471,493,632 B
ON_ALLOCATOR = 8 * NORMS + (P - NORMS) // 32  # norms' 2 fp32 states 540,672 + absmax 2 x 4 B / 256 = 38,617,088


@pytest.fixture(scope="module")
def llama():
    return load_model("meta-llama/Llama-3.2-1B")


def _train(optimizer: Optimizer) -> TrainingConfig:
    return TrainingConfig(micro_batch_size=1, seq_len=1024, precision=Precision.BF16, optimizer=optimizer,
                          recompute=Recompute.FULL, framework=Framework.PYTORCH)


def named(rank, name):
    return sum(t.bytes for t in rank.terms if t.name == name)


def test_paged_states_leave_the_allocated_figure(llama):
    paged = estimate(llama, _train(Optimizer.PAGED_ADAMW8BIT), A100)
    rank = paged.ranks[0]
    assert PAGED == 2_471_493_632 and ON_ALLOCATOR == 39_157_760
    assert named(rank, "optimizer_states.moments") == ON_ALLOCATOR
    assert named(rank, "runtime.paged_optimizer_states") == PAGED  # 2.3 GiB: room on an 80 GB card
    plain = estimate(llama, _train(Optimizer.ADAMW8BIT), A100).ranks[0]
    # adamw8bit: every state on the allocator, 2 x (1 + 4 / 256) B per element of the 8-bit tensors
    assert named(plain, "optimizer_states.moments") == 8 * NORMS + (P - NORMS) * 2 * 65 // 64
    assert named(plain, "runtime.paged_optimizer_states") == 0
    # the same peak moment: peak allocated falls by the paged bytes; nvidia-smi's figure counts them (resident)
    assert plain.allocated_bytes - rank.allocated_bytes == PAGED
    slack = named(plain, "allocator") - named(rank, "allocator")  # the allocator's slack is a share of allocated
    assert plain.device_used_bytes - rank.device_used_bytes == slack
    assert paged.host_bytes == 0


def test_paged_states_evicted_when_the_device_is_full(llama):
    # a card with 1 GiB of room beside the rest of the rank: 1 GiB of the paged states resident, the other
    # 2,471,493,632 - 1,073,741,824 = 1,397,751,808 B evicted to host RAM (cudaMallocManaged's pages), no OOM
    full = estimate(llama, _train(Optimizer.PAGED_ADAMW8BIT), A100).ranks[0]
    rest = full.device_used_bytes - PAGED
    small = dataclasses.replace(A100, memory_bytes=rest + GiB)
    est = estimate(llama, _train(Optimizer.PAGED_ADAMW8BIT), small)
    assert named(est.ranks[0], "runtime.paged_optimizer_states") == GiB
    assert est.ranks[0].device_used_bytes == small.memory_bytes
    assert est.host_bytes == 1_397_751_808
    # no room at all: none resident, every paged byte on the host
    none = dataclasses.replace(A100, memory_bytes=rest - GiB)
    est = estimate(llama, _train(Optimizer.PAGED_ADAMW8BIT), none)
    assert named(est.ranks[0], "runtime.paged_optimizer_states") == 0
    assert est.host_bytes == PAGED


def test_a_job_whose_paged_states_are_evicted_fits(llama):
    # the fit rule asks for device used less the evictable paged states: on the card with 1 GiB of room beside the
    # rest, device used is the whole card (1 GiB of paged states resident) and the job fits with no headroom; on one
    # 1 GiB short of the rest it does not
    from memest.planning.fit import verdict

    full = estimate(llama, _train(Optimizer.PAGED_ADAMW8BIT), A100).ranks[0]
    rest = full.device_used_bytes - PAGED
    small = dataclasses.replace(A100, memory_bytes=rest + GiB)
    v = verdict(estimate(llama, _train(Optimizer.PAGED_ADAMW8BIT), small), small, 1, 0.0)
    assert v.needed_bytes == rest and v.fits
    short = dataclasses.replace(A100, memory_bytes=rest - GiB)
    assert not verdict(estimate(llama, _train(Optimizer.PAGED_ADAMW8BIT), short), short, 1, 0.0).fits
    # adamw8bit keeps the same states on the allocator: it needs them on the device
    assert not verdict(estimate(llama, _train(Optimizer.ADAMW8BIT), small), small, 1, 0.0).fits


def test_paged_adamw32bit_keeps_fp32_states_in_managed_memory(llama):
    # bitsandbytes PagedAdamW / PagedAdamW32bit (Optimizer2State, optim_bits=32): two fp32 states whatever the
    # parameters' dtype, min_8bit_size irrelevant; the tensors >= 1e5 elements paged: 8 x 1,235,746,816 =
    # 9,885,974,528 B in managed memory, the norms' 8 x 67,584 = 540,672 B on the allocator
    rank = estimate(llama, _train(Optimizer.PAGED_ADAMW32BIT), A100).ranks[0]
    assert named(rank, "runtime.paged_optimizer_states") == 9_885_974_528
    assert named(rank, "optimizer_states.moments") == 540_672
    assert named(rank, "workspace.optimizer_step") == 0  # bitsandbytes' fused update: no foreach temporary


def test_the_readers_and_litgpt_name_the_paged_optimizers(llama):
    from memest.workload.files import torchtune, trainer
    from memest.workload.resolve import resolve

    # transformers OptimizerNames: PAGED_ADAMW = "paged_adamw_32bit", PAGED_ADAMW_8BIT = "paged_adamw_8bit"
    assert trainer.OPTIM["paged_adamw_32bit"] is Optimizer.PAGED_ADAMW32BIT
    assert trainer.OPTIM["paged_adamw_8bit"] is Optimizer.PAGED_ADAMW8BIT
    assert trainer.OPTIM["adamw_8bit"] is Optimizer.ADAMW8BIT  # not paged
    assert torchtune.OPTIMIZERS["bitsandbytes.optim.PagedAdamW"] is Optimizer.PAGED_ADAMW32BIT
    assert torchtune.OPTIMIZERS["bitsandbytes.optim.PagedAdamW8bit"] is Optimizer.PAGED_ADAMW8BIT
    # litgpt/utils.py instantiate_bnb_optimizer (commit 00af8b0): --quantize swaps in bnb.optim.PagedAdamW
    assert resolve({"finetune": "qlora", "stack": "litgpt"}, llama, A100).optimizer is Optimizer.PAGED_ADAMW32BIT
    assert resolve({"finetune": "lora", "stack": "litgpt"}, llama, A100).optimizer is Optimizer.ADAMW
    given = resolve({"finetune": "qlora", "stack": "litgpt", "optimizer": "adamw"}, llama, A100)
    assert given.optimizer is Optimizer.ADAMW  # what the user gives wins


def test_the_hf_spelling_is_refused_naming_memest_s():
    from inprocess import run_memest

    out = run_memest("hf", "meta-llama/Llama-3.2-1B", "--train", "--optimizer", "paged_adamw_32bit")
    assert out.returncode == 2
    assert "paged_adamw32bit" in out.stderr and "Traceback" not in out.stderr


def test_the_verdict_says_why_it_leaves_the_paged_states_out():
    # Fresh-user report F10: device used counts the resident paged states, the FITS figure does not (they are
    # evictable, see above); the output must say so next to the verdict. Llama-3.2-1B, paged_adamw8bit: 2 x
    # 1,235,746,816 B = 2,471,493,632 B = 2.30 GiB in managed memory, all resident on an A100-80GB.
    from inprocess import run_memest

    job = ("hf", "meta-llama/Llama-3.2-1B", "--train", "--micro-batch-size", "1", "--seq-len", "1024", "--precision",
           "bf16", "--recompute", "full", "--framework", "pytorch", "--gpu", "A100-80GB")
    for fmt in ((), ("--markdown",)):
        out = " ".join(run_memest(*job, "--optimizer", "paged_adamw8bit", *fmt).stdout.split())
        verdict_at = out.index("FITS: ")
        note_at = out.index("The fit leaves out the 2.30 GiB of paged optimizer states in device used")
        assert verdict_at < note_at < out.index("band ")
        assert "the driver evicts to host RAM when the device fills" in out
        # the same states on the allocator (adamw8bit) are in the fit: no such line
        assert "paged optimizer states" not in run_memest(*job, "--optimizer", "adamw8bit", *fmt).stdout
    assert round(PAGED / GiB, 2) == 2.30
