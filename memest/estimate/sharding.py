"""Which parameters one rank holds under tensor, pipeline and expert parallelism.

Tensor parallelism follows Megatron-LM / vLLM: column- and row-parallel weights are divided by
tp; KV projections by min(tp, num_kv_heads) (replicated beyond, vLLM ``QKVParallelLinear``);
vocabulary-parallel embeddings by tp (rows rounded up); norms, routers and row-parallel biases
are replicated. Routed experts: with ep <= dp x cp (expert parallelism over data-parallel ranks,
Megatron-LM) each rank holds E/ep experts, each split by tp along its split; with ep > dp x cp
(vLLM's EP = TP x DP) whole experts are spread over all tp x dp x cp ranks. Pipeline stages
take contiguous layers; the first also holds the embedding, the last the final norm and lm_head. An
uneven split puts the remainder on the first stages for training (:func:`stages`) and, as vLLM does,
on the stages before the last for serving (:func:`vllm_stages`).

Stage splits and each tensor's shard size are computed once and remembered (per (num_layers, pp) and
(tensor, tp, ep, dp x cp, k), :mod:`memest.memo`): the planner estimates thousands of setups of one
model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memest.memo import remembered
from memest.spec import Component, LayerSpec, ModelSpec, Split, TensorSpec
from memest.workload import Parallelism


@dataclass(frozen=True, slots=True)
class Stage:
    """One pipeline stage.

    Attributes:
        index: 0-based stage number.
        start: First layer index.
        stop: One past the last layer index.
        first: Holds the embedding.
        last: Holds the head (final norm, lm_head) and computes the logits.
    """

    index: int
    start: int
    stop: int
    first: bool
    last: bool

    @property
    def num_layers(self) -> int:
        """Layers in this stage."""
        return self.stop - self.start


@remembered(maxsize=4096)
def stages(num_layers: int, pp: int) -> tuple[Stage, ...]:
    """Split ``num_layers`` into ``pp`` contiguous stages for training; the first stages take the
    remainder."""
    base, extra = divmod(num_layers, pp)
    return _contiguous([base + (1 if i < extra else 0) for i in range(pp)])


@remembered(maxsize=4096)
def vllm_stages(num_layers: int, pp: int) -> tuple[Stage, ...]:
    """Split ``num_layers`` into ``pp`` contiguous stages as vLLM does (``vllm/distributed/utils.py``
    ``get_pp_indices``, without ``VLLM_PP_LAYER_PARTITION``): num_layers // pp each, and the remainder
    one layer apiece to the stages before the last, from the second-to-last backwards (the last
    holds the final norm and lm_head). 61 layers over 4 stages: 15, 15, 16, 15; 10 over 4: 2, 3, 3, 2.
    Any pp up to num_layers is valid; the remainder is at most pp - 1, so the last stage never takes one."""
    base, extra = divmod(num_layers, pp)
    sizes = [base] * pp
    for i in range(2, extra + 2):
        sizes[-i] += 1
    return _contiguous(sizes)


def _contiguous(sizes: list[int]) -> tuple[Stage, ...]:
    out, start = [], 0
    for i, n in enumerate(sizes):
        out.append(Stage(i, start, start + n, i == 0, i == len(sizes) - 1))
        start += n
    return tuple(out)


def shard_numel(tensor: TensorSpec, par: Parallelism, num_kv_heads: int) -> int:
    """Elements of ``tensor`` one rank holds (remembered per tensor, tp, ep, dp x cp and k).

    Args:
        tensor: The full tensor.
        par: The parallel degrees (tp, ep and, for routed experts under expert parallelism, dp x cp
            are read).
        num_kv_heads: k, to split KV projections by min(tp, k).
    """
    return _shard_numel(tensor, par.tp, par.ep, par.dp * par.cp, num_kv_heads)


@remembered(maxsize=1 << 16)
def _shard_numel(tensor: TensorSpec, tp: int, ep: int, data: int, num_kv_heads: int) -> int:
    numel = tensor.numel
    if tensor.component is Component.EXPERTS and ep > 1:
        if ep > data:
            # expert parallelism reaches into the tensor-parallel ranks (vLLM's EP = TP x DP; Megatron-core
            # with expert_tensor_parallel_size = tp x dp x cp / ep): the routed experts are spread over
            # all tp x dp x cp ranks of the stage, whole experts, no further TP split
            return math.ceil(numel / (tp * data))
        numel //= ep  # EP over data-parallel ranks (Megatron): E/ep experts, each TP-split below
    if tp == 1 or tensor.split is Split.NONE:
        return numel
    if tensor.split is Split.KV:
        return numel // min(tp, num_kv_heads)
    return math.ceil(numel / tp)


def stage_tensors(spec: ModelSpec, stage: Stage) -> tuple[tuple[TensorSpec, int], ...]:
    """Distinct tensors of a stage with their multiplicity (the spec's own objects)."""
    out: list[tuple[TensorSpec, int]] = []
    if stage.first:
        out.extend((t, 1) for t in spec.embedding)
    for layer, count in spec.layer_kinds(stage.start, stage.stop):
        out.extend((t, count) for t in layer.tensors)
    if stage.last:
        out.extend((t, 1) for t in spec.head)
    return tuple(out)


def layer_shard_numel(layer: LayerSpec, par: Parallelism) -> int:
    """Elements of one layer a rank holds under tp/ep."""
    k = layer.attention.num_kv_heads
    return sum(shard_numel(t, par, k) for t in layer.tensors)


def stage_shard_numel(spec: ModelSpec, stage: Stage, par: Parallelism) -> int:
    """Elements of a stage one rank holds under tp/ep."""
    k = spec.num_kv_heads
    return sum(shard_numel(t, par, k) * n for t, n in stage_tensors(spec, stage))
