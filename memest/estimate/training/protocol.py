"""The one protocol every framework module (``pytorch``, ``ddp``, ``deepspeed``, ``megatron``, ``fsdp``)
follows: given what trains on a rank, the frozen, named terms of the buffers it adds, by lifetime.

The common model states (weights, fp32 master, optimizer states: :mod:`.states`) read two facts of
a framework, :attr:`FrameworkModel.FLAT_STATES` and :attr:`FrameworkModel.PER_PARAMETER_SHARDS`, and
how many ranks its weights are sharded over; the rest is the framework's :class:`FrameworkStates`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from memest.estimate.sharding import Stage
from memest.estimate.training.trained import GradGroups, Gradients, Item
from memest.result import Term
from memest.spec import ModelSpec
from memest.workload import (
    DeepSpeedBuckets,
    KbitPrep,
    LoraConfig,
    LoraLibrary,
    Method,
    Offload,
    Optimizer,
    Parallelism,
    Precision,
    TrainingConfig,
)


class StatesInput(NamedTuple):
    """The fields of a TrainingConfig the model states read, named as there (the whole key of the
    remembered :func:`memest.estimate.training.states.model_states`): the batch, the sequence and
    recompute are not among them; ``grad_accum_steps`` is (DeepSpeed ZeRO-2 keeps a second gradient partition
    under accumulation, :mod:`.deepspeed`)."""

    method: Method
    precision: Precision
    optimizer: Optimizer
    offload: Offload
    optimizer_in_bwd: bool
    parallelism: Parallelism
    lora: LoraConfig | None  # None under full training (no adapters)
    prepare_kbit_training: KbitPrep
    lora_library: LoraLibrary
    grad_accum_steps: int
    float8_all_gather: bool = False  # FSDP2 gathers the float8 linears' weights in float8 (fsdp.states)
    deepspeed_buckets: DeepSpeedBuckets = DeepSpeedBuckets()  # the DeepSpeed JSON's bucket sizes
    custom_sharded_layers: str = ""  # torchtune's FSDP2 units of their own (fsdp.states)
    fsdp_flat_params: bool = False  # FSDP1's FlatParameter units (fsdp.states)
    no_sync_accumulation: bool = False  # accumulation inside no_sync: FSDP's gradients unsharded (fsdp.states)
    half_dtype: str = "bf16"  # fp16 autocast: trl casts no QLoRA embeddings to bf16 (recipes.kbit_weight_bytes)


def states_input(t: TrainingConfig) -> StatesInput:
    """The model states' view of ``t``."""
    return StatesInput(t.method, t.precision, t.optimizer, t.offload, t.optimizer_in_bwd and t.method is Method.FULL,
                       t.parallelism, t.lora if t.method is not Method.FULL else None, t.prepare_kbit_training,
                       t.lora_library, t.grad_accum_steps, t.float8_all_gather and t.method is Method.FULL,
                       t.deepspeed_buckets, t.custom_sharded_layers, t.fsdp_flat_params,
                       t.no_sync_accumulation and t.grad_accum_steps > 1, t.half_dtype)


class StateContext(NamedTuple):
    """What a framework's buffers are computed from.

    Attributes:
        spec: The model.
        t: The workload's fields the model states read.
        stage: The rank's pipeline stage.
        trainable: What trains on the rank (tensor, local elements, count).
        sharded_numel: The trainable elements as ZeRO / FSDP partition them over ``n`` (routed experts
            weighted by their expert-data-parallel group, :func:`.trained.expert_weighted`).
        groups: The trainable items as backward makes their gradients.
        n: Ranks the sharded states are split over (dp x cp, or dp_shard).
        gb: Bytes per gradient element.
        state_b: Bytes per optimizer-state element.
        head_numel: Trainable elements of the head (made first by backward).
    """

    spec: ModelSpec
    t: StatesInput
    stage: Stage
    trainable: Sequence[Item]
    sharded_numel: int
    groups: GradGroups
    n: int
    gb: int
    state_b: int
    head_numel: int

    @property
    def zero_stage(self) -> int:
        """The ZeRO stage (FSDP: 3 full shard, 2 shard grad op)."""
        return self.t.parallelism.zero_stage


class FrameworkStates(NamedTuple):
    """The buffers a framework adds to the model states, named by when they are alive.

    Attributes:
        gradients: Its gradients as backward makes them.
        persistent: Alive through the whole step (DDP buckets, Megatron's main_grad, ZeRO-3's bucket).
        backward_buffers: From backward's start (DeepSpeed's reduce bucket).
        layer_buffers: While a layer runs its backward (FSDP's unsharded gradients).
        reduce_input: At the first layer's backward (FSDP: the previous unit's reduce-scatter input; DeepSpeed
            ZeRO-3: a bucket's reduce-scatter copy).
        gathered: Gathered weights alive at every moment (ZeRO-3's current + prefetched layers; FSDP's root).
        gathered_head: FSDP with the output projection a unit of its own (torchtune ``custom_sharded_layers``):
            gathered from its forward through the loss backward (``loss_forward``, ``loss_backward``).
        gathered_embedding: FSDP with the token embedding a unit of its own: gathered for its forward and, prefetched,
            from the first layer's backward (``last_layer_backward``).
        gathered_unit: FSDP: one layer unit gathered at the compute dtype (how many are alive: per moment).
        gathered_formula: How ``gathered_unit`` is computed.
        stream_pool: Reserved beside the peak, never allocated on the compute stream (FSDP's all-gather outputs).
        stream_pool_formula: How ``stream_pool`` is computed.
        step: The optimizer step's temporaries.
        step_grads: The gradients alive at the step when not every gradient (DeepSpeed ZeRO 1).
        reduction: Beside every gradient after backward (DeepSpeed ZeRO 1: its own moment).
        accumulated: The gradients alive through forward and backward in place of ``gradients`` (FSDP2 under
            pipeline parallelism: each parameter's unsharded gradient accumulated over the micro-batches).
        reduction_grads: The gradients alive beside ``reduction`` when not every gradient (FSDP2 under pipeline
            parallelism: the accumulated unsharded ones, before the first reduce-scatter).
    """

    gradients: Gradients = Gradients()
    persistent: tuple[Term, ...] = ()
    backward_buffers: tuple[Term, ...] = ()
    layer_buffers: tuple[Term, ...] = ()
    reduce_input: tuple[Term, ...] = ()
    gathered: tuple[Term, ...] = ()
    gathered_head: tuple[Term, ...] = ()
    gathered_embedding: tuple[Term, ...] = ()
    gathered_unit: int = 0
    gathered_formula: str = ""
    stream_pool: int = 0
    stream_pool_formula: str = ""
    step: tuple[Term, ...] = ()
    step_grads: Term | None = None
    reduction: tuple[Term, ...] = ()
    accumulated: Term | None = None
    reduction_grads: Term | None = None


class FrameworkModel(Protocol):
    """A framework module."""

    FLAT_STATES: bool
    """Its optimizer keeps one flat fp32 master and flat optimizer states (DeepSpeed, Megatron)."""

    PER_PARAMETER_SHARDS: bool
    """Sharded weights and torch optimizer states are kept per parameter (FSDP2), not as one flat partition."""

    def weight_shards(self, zero_stage: int, n: int) -> int:
        """Ranks the weights are sharded over."""
        ...

    def states(self, ctx: StateContext) -> FrameworkStates:
        """The buffers it adds."""
        ...


def zero3_weight_shards(zero_stage: int, n: int) -> int:
    """Weights sharded over ``n`` ranks at ZeRO 3 only."""
    return n if zero_stage >= 3 else 1
