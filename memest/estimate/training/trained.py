"""What trains on one rank: (tensor, local elements, count) items, their allocator blocks, the groups
backward makes their gradients in, and the expert-data-parallel weighting of sharded states.

A multimodal checkpoint's vision tower (component ``other`` before the first layer) has optimizer
states and flat-buffer space but no gradient in a text-only step. Every tensor is counted as the CUDA
caching allocator's block for it (:func:`memest.estimate.runtime.cuda_block_bytes`): per parameter
for weights, param.grad and torch optimizer states, once for each flat buffer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from memest.estimate.runtime import cuda_block_bytes
from memest.estimate.sharding import Stage
from memest.spec import Component, ModelSpec, TensorSpec
from memest.workload import Parallelism

Item = tuple[TensorSpec, int, int]
"""(tensor, elements on the rank, how many times the stage holds it)."""


class GradGroups(NamedTuple):
    """The trained tensors of a stage, as backward produces their gradients.

    Attributes:
        used: Those the step computes a gradient for: all but a multimodal checkpoint's vision
            tower and projector (component ``other`` before the first layer), which a text-only
            step never runs (their optimizer states and flat buffers still exist).
        head: Made first, by the lm_head's backward: the final norm, lm_head, and the embedding when
            tied to it.
        first: The stage's first layer (one of its kind), made last but the embedding's.
        embedding: The untied embeddings (first stage), made last.
    """

    used: list[Item]
    head: list[Item]
    first: list[Item]
    embedding: list[Item]


def grad_groups(spec: ModelSpec, stage: Stage, trainable: Sequence[Item]) -> GradGroups:
    unused = {id(tn) for tn in spec.embedding if tn.component is Component.OTHER} if stage.first else set()
    head = {id(tn) for tn in spec.head} if stage.last else set()
    embedding = {id(tn) for tn in spec.embedding if tn.component is not Component.OTHER} if stage.first else set()
    if spec.tie_word_embeddings and stage.last:
        head |= embedding
        embedding = set()
    first = {id(tn) for tn in spec.layers[stage.start].tensors}
    used = [item for item in trainable if id(item[0]) not in unused]
    return GradGroups(
        used=used,
        head=[item for item in used if id(item[0]) in head],
        first=[(tn, local, 1) for tn, local, _ in used if id(tn) in first],
        embedding=[item for item in used if id(item[0]) in embedding],
    )


def blocks(items: Sequence[Item], itemsize: int, shard: int = 1) -> int:
    """Bytes of one tensor per (tensor, local elements, count) item at ``itemsize`` B per element (each
    ``shard``-th of it), as the CUDA caching allocator counts them (:func:`runtime.cuda_block_bytes`)."""
    return sum(cuda_block_bytes(math.ceil(local * itemsize / shard)) * count for _, local, count in items)


def expert_data_ranks(par: Parallelism, n: int) -> int:
    """e: how many of the ``n`` sharding ranks hold different experts (min(ep, n)); the experts'
    sharded states are split over the other n / e (see :func:`expert_weighted`)."""
    return min(par.ep, n)


def expert_weighted(items: Sequence[Item], par: Parallelism, n: int) -> Sequence[Item]:
    """``items`` with each routed expert's local elements scaled so that dividing by ``n`` shards them
    over their expert-data-parallel group, as ZeRO/FSDP do with expert parallelism.

    A rank holds E/ep experts (:func:`sharding.shard_numel`); only the ``n / e`` data-parallel ranks
    holding the same experts share their states, e = min(ep, n) (Megatron-LM's expert data-parallel
    group, ``megatron/core/parallel_state.py``; DeepSpeed-MoE's ``expert_data_parallel_group``,
    ``deepspeed/utils/groups.py``). So an expert shard is local / (n / e) = local x e / n.
    """
    e = expert_data_ranks(par, n)
    if e <= 1:
        return items
    return [(tn, local * e if tn.component is Component.EXPERTS else local, c) for tn, local, c in items]


def sharded_note(shard: int) -> str:
    return f" / {shard} (sharded)" if shard > 1 else ""



class Gradients(NamedTuple):
    """Bytes of the gradients a framework keeps, as backward makes them.

    Attributes:
        all: Every gradient of the step, once backward is done.
        head: The head's, the first made (the first layer's backward).
        before_first_layer: All but the stage's first layer's and the embeddings' (the last layer's
            backward).
        formula: How ``all`` is computed.
    """

    all: int = 0
    head: int = 0
    before_first_layer: int = 0
    formula: str = ""


def param_gradients(groups: GradGroups, gb: int, formula: str) -> Gradients:
    """param.grad of every used tensor (one block each), of the head's, and of all but the first layer's
    and the embeddings' (what exists when the backward reaches the stage's first layer)."""
    every = blocks(groups.used, gb)
    return Gradients(all=every, head=blocks(groups.head, gb),
                     before_first_layer=every - blocks(groups.first, gb) - blocks(groups.embedding, gb),
                     formula=formula)
