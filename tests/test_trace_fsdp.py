"""FSDP2 at world size N on the fake process group: rank 0's shards, worked by hand.

FSDP2 (``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``, ``_init_sharded_param``) splits
each parameter along dim 0 with ``torch.chunk``: rank 0 holds ceil(R / N) rows of an R-row
tensor, padded to that size. With ``--precision fsdp2`` the shards are fp32 (4 B); the gradients
and AdamW's two states are shards of the same size. The tiny Llama (tests/trace_models.py) is
used; every shard is rounded to the caching allocator's 512-byte blocks; the two rotary buffers
(64 B each) are not sharded and take one block each.
"""

import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trace_models import tiny_config

from memest.devices import get_device
from memest.result import Kind
from memest.trace import trace
from memest.trace.allocator import round_size
from memest.workload import Parallelism, Precision, TrainingConfig

L, H, A, K, D, I, V = 2, 256, 8, 2, 32, 704, 1024
SHAPES = (
    [(V, H)]  # embedding
    + L * [(A * D, H), (K * D, H), (K * D, H), (H, A * D), (I, H), (I, H), (H, I), (H, 1), (H, 1)]
    + [(H, 1), (V, H)]  # final norm, lm_head
)
"""(rows, columns) of every parameter; 1-D norms as (h, 1)."""


def _rank0_shard_bytes(n: int) -> int:
    return sum(round_size(math.ceil(rows / n) * cols * 4) for rows, cols in SHAPES)


@pytest.mark.parametrize("n", [4, 1024], ids=["N=4", "N=1024"])
def test_rank0_holds_its_fp32_shards_and_their_adam_states(n: int) -> None:
    w = TrainingConfig(micro_batch_size=2, seq_len=256, precision=Precision.FSDP2,
                       parallelism=Parallelism(dp=n, zero_stage=3))
    result = trace(tiny_config("llama"), w, get_device("h100"))
    rank = result.per_device
    assert result.world_size == n
    assert rank.by_kind[Kind.WEIGHTS] == _rank0_shard_bytes(n) + 2 * 512
    assert rank.by_kind[Kind.OPTIMIZER_STATES] == 2 * _rank0_shard_bytes(n)
    assert any("FSDP2" in s for s in result.settings)


def test_zero2_keeps_parameters_gathered_between_forward_and_backward() -> None:
    # SHARD_GRAD_OP (reshard_after_forward=False) holds every layer's gathered bf16 parameters
    # through the end of the forward, so its peak is above FULL_SHARD's by about the gathered layers
    def peak(stage: int) -> int:
        w = TrainingConfig(micro_batch_size=2, seq_len=256, precision=Precision.FSDP2,
                           parallelism=Parallelism(dp=4, zero_stage=stage))
        return trace(tiny_config("llama"), w, get_device("h100")).per_device.peak_allocated_bytes

    layer_bf16 = 2 * (2 * H * A * D + 2 * H * K * D + 3 * H * I + 2 * H)
    assert peak(2) - peak(3) >= (L - 1) * layer_bf16 * 3 // 4


def test_the_last_rank_holds_no_more_than_rank_0() -> None:
    # N=3 does not divide the 64-row k/v projections: rank 0 has 22 rows, rank 2 has 20; every rank's
    # parameter storage is padded to rank 0's size, the optimizer states are not
    w = TrainingConfig(micro_batch_size=2, seq_len=256, precision=Precision.FSDP2,
                       parallelism=Parallelism(dp=3, zero_stage=3))
    first = trace(tiny_config("llama"), w, get_device("h100"), rank=0).per_device
    last = trace(tiny_config("llama"), w, get_device("h100"), rank=2).per_device
    assert (first.rank, last.rank) == (0, 2)
    assert last.by_kind[Kind.WEIGHTS] == first.by_kind[Kind.WEIGHTS] == _rank0_shard_bytes(3) + 2 * 512
    assert last.by_kind[Kind.OPTIMIZER_STATES] < first.by_kind[Kind.OPTIMIZER_STATES]
