"""One training step as a fine-tuning script runs it, on meta tensors, under the tracker.

The step is the steady state a measurement reads after warm-up (DESIGN.md, "Measuring"): the
optimizer states exist before it starts (they are created by one step on zero gradients, after
which the peak is reset, as ``torch.cuda.reset_peak_memory_stats`` would be), then
``grad_accum_steps`` micro-batches (two at most: every later one repeats the second) of forward
with the loss inside the model (``labels=``, as the HF Trainer calls it; the ModelOutput with the
logits is dropped before backward, as ``Trainer.compute_loss`` does), backward, then
``optimizer.step()`` and ``zero_grad(set_to_none=True)``.

Precision recipes (the names of :class:`memest.workload.Precision`) as concrete code:

| recipe | parameters | forward | gradients | optimizer | reference code |
|---|---|---|---|---|---|
| fp32 | fp32 | fp32 | fp32, made in backward | torch AdamW (foreach), fp32 states | plain PyTorch |
| bf16 | bf16 | bf16 | bf16, made in backward | torch AdamW, states in the param dtype | plain PyTorch |
| amp | fp32 | autocast bf16 | fp32, made in backward | torch AdamW, fp32 states | HF Trainer ``bf16=True`` |
| mixed / fp16 | bf16 / fp16 | bf16 / fp16 | bf16 / fp16, made in backward | fp32 flat master + fp32 states | DeepSpeed ZeRO-1/2 ``step`` |
| fsdp2 | fp32, sharded | bf16 (gathered copies) | fp32, sharded | torch AdamW on the shards | FSDP2 ``MixedPrecisionPolicy`` |

LoRA (PEFT ``get_peft_model``): the frozen base at the recipe's parameter dtype, the adapters as
PEFT keeps them (fp32 when the base is 16-bit), torch AdamW straight on the adapters — no master
copy, as with the HF Trainer — and the recipe's autocast, if any.

``mixed``/``fp16`` follow ``deepspeed/runtime/zero/stage_1_and_2.py`` (``step``) at one device:
the 16-bit gradients are flattened and cast to one fp32 flat gradient, the 16-bit gradients are
freed, the optimizer steps the fp32 flat master (its states flat fp32 too), and the master is
copied back into the 16-bit parameters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from memest.errors import InputError
from memest.result import Kind
from memest.trace._autocast import AutocastEmulation
from memest.trace._tracker import StorageTracker
from memest.workload import Optimizer, Precision, TrainingConfig

ADAM_BETAS = (0.9, 0.999)


@dataclass(frozen=True, slots=True)
class TraceRecipe:
    """How a precision recipe runs.

    Attributes:
        param_dtype: dtype of the model's parameters.
        autocast: Autocast dtype of the forward, or None.
        flat_master: True for a DeepSpeed-style fp32 flat master copy stepped by the optimizer.
        fsdp_param_dtype: FSDP2 ``MixedPrecisionPolicy.param_dtype`` when sharded (None: none).
    """

    param_dtype: torch.dtype
    autocast: torch.dtype | None = None
    flat_master: bool = False
    fsdp_param_dtype: torch.dtype | None = None


RECIPES: dict[Precision, TraceRecipe] = {
    Precision.FP32: TraceRecipe(torch.float32),
    Precision.BF16: TraceRecipe(torch.bfloat16),
    Precision.AMP: TraceRecipe(torch.float32, autocast=torch.bfloat16),
    Precision.MIXED: TraceRecipe(torch.bfloat16, flat_master=True, fsdp_param_dtype=torch.bfloat16),
    Precision.FP16: TraceRecipe(torch.float16, flat_master=True, fsdp_param_dtype=torch.float16),
    Precision.FSDP2: TraceRecipe(torch.float32, fsdp_param_dtype=torch.bfloat16),
}


def sharded_recipe(precision: Precision) -> TraceRecipe:
    """The recipe under FSDP2: 16-bit 'mixed' recipes keep fp32 sharded parameters (they are the master)."""
    r = RECIPES[precision]
    if r.fsdp_param_dtype is not None:
        return TraceRecipe(torch.float32, fsdp_param_dtype=r.fsdp_param_dtype)
    return r


def lora_recipe(recipe: TraceRecipe) -> TraceRecipe:
    """LoRA as PEFT + the HF Trainer run it: the base at the recipe's dtype, the adapters as PEFT keeps
    them (fp32 on a 16-bit base), torch AdamW straight on the adapters (no separate master copy)."""
    return TraceRecipe(recipe.param_dtype, autocast=recipe.autocast, fsdp_param_dtype=recipe.fsdp_param_dtype)


def make_optimizer(params: list[torch.Tensor], optimizer: Optimizer) -> torch.optim.Optimizer:
    """The torch optimizer memest's ``--optimizer`` names, with ``foreach=True`` as on a GPU.

    torch picks the foreach implementation by default only for CUDA tensors
    (``torch/optim/optimizer.py`` ``_default_to_fused_or_foreach``); it is forced here so the
    meta run keeps the same temporaries (e.g. AdamW's ``exp_avg_sq.sqrt()`` for all parameters
    of a dtype at once).

    Raises:
        InputError: an optimizer whose kernels have no meta implementation (8-bit, Lion).
    """
    if optimizer is Optimizer.ADAMW:
        return torch.optim.AdamW(params, lr=1e-5, betas=ADAM_BETAS, foreach=True)
    if optimizer is Optimizer.SGD:
        return torch.optim.SGD(params, lr=1e-3, foreach=True)
    if optimizer is Optimizer.SGD_MOMENTUM:
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True)
    if optimizer is Optimizer.ADAFACTOR:
        return torch.optim.Adafactor(params, lr=1e-3, foreach=True)
    raise InputError(
        f"--optimizer {optimizer.value} cannot be traced (its kernels come from bitsandbytes or an external "
        "package with no meta implementation); trace with adamw, adafactor, sgd or sgd_momentum"
    )


class FlatMasterOptimizer:
    """DeepSpeed ZeRO-1/2's mixed-precision step at one device (``stage_1_and_2.py``, ``step``).

    Holds one fp32 flat copy of the trainable 16-bit parameters; ``step`` flattens the 16-bit
    gradients, casts them to one fp32 flat gradient, frees the 16-bit gradients, steps the inner
    optimizer on the flat master and copies it back into the parameters.
    """

    def __init__(self, params: list[torch.Tensor], optimizer: Optimizer) -> None:
        self.params = params
        with torch.no_grad():
            self.master = torch.cat([p.detach().reshape(-1) for p in params]).to(torch.float32)
        self.master.requires_grad_(True)
        self.inner = make_optimizer([self.master], optimizer)

    @torch.no_grad()
    def step(self) -> None:
        # a parameter the step did not reach gets zeros, as DeepSpeed's flat partition does
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params])
        self.master.grad = flat.to(torch.float32)
        del flat
        for p in self.params:
            p.grad = None
        self.inner.step()
        self.master.grad = None
        offset = 0
        for p in self.params:
            p.copy_(self.master[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def state_tensors(self) -> list[torch.Tensor]:
        """The master copy and the inner optimizer's states."""
        return [self.master, *optimizer_state_tensors(self.inner)]


def optimizer_state_tensors(opt: Any) -> list[torch.Tensor]:
    """Every tensor in an optimizer's state (DTensors as their local shards)."""
    if isinstance(opt, FlatMasterOptimizer):
        return opt.state_tensors()
    out = []
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                out.append(local(v))
    return out


def step_counters(opt: Any) -> list[torch.Tensor]:
    """The optimizer's 0-dim ``step`` tensors: CPU scalars on a GPU run (foreach, not capturable)."""
    inner = opt.inner if isinstance(opt, FlatMasterOptimizer) else opt
    return [local(v) for state in inner.state.values() for k, v in state.items()
            if k == "step" and isinstance(v, torch.Tensor)]


def local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor, else the tensor."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


@dataclass
class StepHooks:
    """Module hooks that tell the tracker what the model is doing, and report progress.

    The lm_head's pre-hook marks the logits and loss; a gradient hook on the lm_head's input marks
    the end of the loss's backward; decoder layers report forward and backward progress.
    (Recomputation under activation checkpointing is marked by the checkpoint's own context, see
    :func:`memest.trace._model.enable_checkpointing`.)
    """

    tracker: StorageTracker
    layers: list[Any]
    head: Any
    tick: Callable[[str], None]

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        tracker = self.tracker
        handles = []

        def layer_pre(module: Any, args: Any) -> None:
            self.tick("forward")

        def layer_post(module: Any, args: Any, output: Any) -> None:
            out = output[0] if isinstance(output, tuple) else output
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(lambda grad: self.tick("backward"))

        def head_pre(module: Any, args: Any) -> None:
            if tracker.phase == "backward":
                return
            tracker.kind = Kind.LOGITS
            hidden = args[0] if args else None
            if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
                hidden.register_hook(lambda grad: setattr(tracker, "kind", Kind.WORKSPACE))

        for layer in self.layers:
            handles.append(layer.register_forward_pre_hook(layer_pre))
            handles.append(layer.register_forward_hook(layer_post))
        handles.append(self.head.register_forward_pre_hook(head_pre))
        try:
            yield
        finally:
            for h in handles:
                h.remove()


def check_supported(t: TrainingConfig) -> None:
    """Raise for settings the trace does not simulate.

    Raises:
        InputError: QLoRA, CPU offload, chunked loss, tensor/pipeline/context/expert parallelism,
            or ZeRO-1.
    """
    par = t.parallelism
    if t.method.value == "qlora":
        raise InputError("--finetune qlora cannot be traced: bitsandbytes NF4 kernels have no meta implementation; "
                         "trace --finetune lora for the adapters and activations")
    if t.offload.value != "none":
        raise InputError(f"--offload {t.offload.value} cannot be traced (host memory is outside the simulation)")
    if t.loss != "default":
        raise InputError(f"--loss {t.loss} cannot be traced: transformers computes the full cross-entropy; "
                         "trace with --loss default")
    for name in ("tp", "pp", "cp", "ep"):
        if getattr(par, name) > 1:
            raise InputError(f"--{name} {getattr(par, name)} cannot be traced: the trace simulates data-parallel "
                             "sharding (FSDP2 / ZeRO-2/3) only; drop --" + name)
    if par.zero_stage == 1:
        raise InputError("--zero-stage 1 cannot be traced: FSDP2 shards gradients too; trace --zero-stage 2 or 3")


def run_step(model: Any, t: TrainingConfig, tracker: StorageTracker, recipe: TraceRecipe, *, device: str,
             tick: Callable[[str], None], layers: list[Any], head: Any) -> list[str]:
    """Run the warm-up and one traced training step; returns notes on what was simulated.

    Args:
        model: The model (parameters already tracked as weights).
        t: The training job.
        tracker: The active tracker's owner (entered by this function).
        recipe: The precision recipe.
        device: Where inputs are made (``meta``, or ``cpu`` under FakeTensorMode).
        tick: Progress callback (``forward`` / ``backward`` / ``optimizer``).
        layers: The decoder layers.
        head: The lm_head module.
    """
    notes: list[str] = []
    trainable = [p for p in model.parameters() if p.requires_grad]
    b, s = t.micro_batch_size, t.seq_len
    micro_batches = min(t.grad_accum_steps, 2)
    hooks = StepHooks(tracker, layers, head, tick)
    autocast = (lambda: AutocastEmulation(recipe.autocast)) if recipe.autocast else contextlib.nullcontext
    with tracker, hooks.installed():
        tracker.enter_phase("setup", Kind.OPTIMIZER_STATES)
        if recipe.flat_master:
            opt: Any = FlatMasterOptimizer(trainable, t.optimizer)
        else:
            opt = make_optimizer(trainable, t.optimizer)
        for p in trainable:
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        tracker.retag(optimizer_state_tensors(opt), Kind.OPTIMIZER_STATES, "optimizer state")
        tracker.ignore(step_counters(opt))
        tracker.reset_peak()

        for _ in range(micro_batches):
            start = tracker.enter_phase("forward", Kind.ACTIVATIONS)
            ids = torch.zeros((b, s), dtype=torch.long, device=device)
            tracker.retag([ids], Kind.ACTIVATIONS, "input ids")
            with autocast():
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            tracker.retag_freed_since(start, Kind.ACTIVATIONS, Kind.WORKSPACE)
            tracker.enter_phase("backward", Kind.LOGITS)
            (loss / t.grad_accum_steps).backward()
            del loss
            tracker.retag([local(p.grad) for p in trainable if p.grad is not None], Kind.GRADIENTS, "gradient")
        tracker.enter_phase("optimizer", Kind.WORKSPACE)
        tick("optimizer")
        opt.step()
        tracker.retag(optimizer_state_tensors(opt), Kind.OPTIMIZER_STATES, "optimizer state")
        # FSDP2's lazy init re-creates padded shards on ranks whose shard is short: settle them as weights
        tracker.retag([local(p) for p in model.parameters()], Kind.WEIGHTS, "parameter")
        opt.zero_grad(set_to_none=True)
    if t.grad_accum_steps > 2:
        notes.append(f"{t.grad_accum_steps} micro-batches: traced 2 (later ones repeat the second)")
    return notes
