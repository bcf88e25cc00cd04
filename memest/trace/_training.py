"""One training step as a fine-tuning script runs it, on meta tensors, under the tracker.

The step is the steady state a measurement reads after warm-up (DESIGN.md, "Measuring (calibrate)"): the
optimizer states exist before it starts (they are created by one step on zero gradients, after
which the peak is reset, as ``torch.cuda.reset_peak_memory_stats`` would be), then
``grad_accum_steps`` micro-batches (two at most: every later one repeats the second) of forward
with the loss inside the model (``labels=``, as the HF Trainer calls it; the ModelOutput with the
logits is dropped before backward, as ``Trainer.compute_loss`` does), backward, then
``optimizer.step()`` and ``zero_grad(set_to_none=True)``.

The framework that runs the step is the analytic estimate's (:func:`memest.workload.resolve_framework`):

| framework | gradients | optimizer | reference code |
|---|---|---|---|
| pytorch | ``param.grad`` made in backward, freed by ``zero_grad(set_to_none=True)`` (kept with ``set_grads_to_none=False``) | torch optimizer on the parameters | HF Trainer, torchtune |
| ddp | as pytorch, plus bucket buffers covering every trained parameter | as pytorch | ``DistributedDataParallel(gradient_as_bucket_view=False)`` |
| deepspeed (ZeRO 0) | 16-bit ``param.grad``, copied to fp32 and flattened at the step, then freed | fused Adam on an fp32 flat master | ``deepspeed/runtime/fp16/fused_optimizer.py`` (FP16_Optimizer, bf16 too: DeepSpeed 0.19.5) |
| fsdp | sharded, at ``reduce_dtype`` | torch optimizer on the shards | FSDP2 ``fully_shard`` (see ``_distributed``) |

Precision recipes (the names of :class:`memest.workload.Precision`): ``fp32`` and ``bf16`` keep
parameters, gradients and torch optimizer states in that dtype; ``amp`` keeps fp32 parameters and
runs the forward under (emulated) autocast bf16; ``mixed`` / ``fp16`` keep 16-bit parameters under
DeepSpeed's fp32 master; ``fsdp2`` (and ZeRO-2/3) shard fp32 parameters with bf16 gathered compute
copies. ``--optimizer adamw`` is torch AdamW with ``foreach=True`` (one ``exp_avg_sq.sqrt()``
temporary for all parameters of a dtype), ``adamw_fused`` and DeepSpeed's optimizer the fused
kernel (no temporary; its step counters on the device).

LoRA (PEFT ``get_peft_model``): the frozen base at the recipe's parameter dtype, the adapters as
PEFT keeps them (fp32 when the base is 16-bit); the framework and optimizer as above over the
adapters.
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
from memest.workload import Framework, Optimizer, Precision, TrainingConfig, resolve_framework

ADAM_BETAS = (0.9, 0.999)


@dataclass(frozen=True, slots=True)
class TraceRecipe:
    """How a precision recipe runs.

    Attributes:
        param_dtype: dtype of the model's parameters.
        autocast: Autocast dtype of the forward, or None.
        flat_master: True for the 16-bit recipes whose fp32 master DeepSpeed keeps.
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


def make_optimizer(params: list[torch.Tensor], optimizer: Optimizer) -> torch.optim.Optimizer:
    """The torch optimizer memest's ``--optimizer`` names.

    ``adamw`` is forced to ``foreach=True``: torch picks the foreach implementation by default only
    for CUDA tensors (``torch/optim/optimizer.py`` ``_default_to_fused_or_foreach``), so the meta run
    keeps the same temporaries as a GPU run. ``adamw_fused`` runs the fused kernel's meta
    implementation (see :func:`fused_kernels_on_meta`).

    Raises:
        InputError: an optimizer whose kernels have no meta implementation (8-bit, Lion).
    """
    if optimizer is Optimizer.ADAMW:
        return torch.optim.AdamW(params, lr=1e-5, betas=ADAM_BETAS, foreach=True)
    if optimizer is Optimizer.ADAMW_FUSED:
        return torch.optim.AdamW(params, lr=1e-5, betas=ADAM_BETAS, fused=True)
    if optimizer is Optimizer.SGD:
        return torch.optim.SGD(params, lr=1e-3, foreach=True)
    if optimizer is Optimizer.SGD_MOMENTUM:
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True)
    if optimizer is Optimizer.ADAFACTOR:
        return torch.optim.Adafactor(params, lr=1e-3, foreach=True)
    raise InputError(
        f"{{optimizer}} {optimizer.value} cannot be traced (its kernels come from bitsandbytes or an external "
        "package with no meta implementation); trace with adamw, adamw_fused, adafactor, sgd or sgd_momentum",
        field="optimizer"
    )


@contextlib.contextmanager
def fused_kernels_on_meta() -> Iterator[None]:
    """Let ``fused=True`` optimizers run on meta tensors: torch only checks the device type
    (``torch/optim/adam.py`` ``_device_dtype_check_for_fused``); ``_fused_adamw_`` has a meta kernel."""
    from torch.optim import adam

    original = adam._device_dtype_check_for_fused
    adam._device_dtype_check_for_fused = lambda p, cuda_unsupported=False: None
    try:
        yield
    finally:
        adam._device_dtype_check_for_fused = original


class PyTorchLoop:
    """Plain PyTorch: ``loss.backward()``, ``optimizer.step()``, ``optimizer.zero_grad(set_to_none)``.

    With ``ddp_buckets``, DistributedDataParallel's reducer also holds bucket buffers covering every
    trained parameter at the gradient dtype (``torch/nn/parallel/distributed.py``,
    ``gradient_as_bucket_view=False``): allocated once, kept for the whole run.
    """

    def __init__(self, params: list[torch.Tensor], optimizer: Optimizer, *, set_to_none: bool,
                 ddp_buckets: bool = False) -> None:
        self.params = params
        self.inner = make_optimizer(params, optimizer)
        self.set_to_none = set_to_none
        self.buckets = [torch.empty(sum(local(p).numel() for p in params if p.dtype == d), dtype=d, device=params[0].device)
                        for d in {p.dtype for p in params}] if ddp_buckets else []

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> None:
        self.inner.step()

    def zero_grad(self) -> None:
        self.inner.zero_grad(set_to_none=self.set_to_none)

    def state_tensors(self) -> list[torch.Tensor]:
        return _states(self.inner)

    def gradient_tensors(self) -> list[torch.Tensor]:
        return [local(p.grad) for p in self.params if p.grad is not None] + self.buckets

    def step_counters(self) -> list[torch.Tensor]:
        return _step_counters(self.inner)


class DeepSpeedFp16Optimizer:
    """DeepSpeed's FP16_Optimizer at ZeRO stage 0 (``deepspeed/runtime/fp16/fused_optimizer.py``, v0.19.5),
    one device. It runs bf16 as well as fp16: the engine accumulates gradients in the model dtype since
    v0.17.6 (``engine.py`` ``get_data_types``, ``_do_optimizer_sanity_check``: ``DDP_BFLOAT16``).

    An fp32 flat master of the trained parameters (``fp32_groups_flat``) under the fused Adam;
    ``backward`` is autograd's (16-bit ``param.grad``); ``step`` copies every gradient to fp32
    (``p.grad.to(fp32)``, all before flattening), flattens the copies into the master's ``.grad``,
    drops param.grad, runs the fused Adam, drops the fp32 gradient and copies the master back into the
    parameters; the engine's ``_take_model_step`` then calls ``zero_grad`` (param.grad = None).
    """

    def __init__(self, params: list[torch.Tensor], optimizer: Optimizer) -> None:
        self.params = params
        with torch.no_grad():
            self.master = torch.cat([p.detach().reshape(-1) for p in params]).to(torch.float32)
        self.master.requires_grad_(True)
        # DeepSpeed runs its FusedAdam for adamw (no step temporary)
        self.inner = make_optimizer([self.master], Optimizer.ADAMW_FUSED if optimizer is Optimizer.ADAMW else optimizer)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    @torch.no_grad()
    def step(self) -> None:
        copies = [torch.zeros(p.shape, dtype=torch.float32, device=p.device) if p.grad is None
                  else p.grad.to(torch.float32) for p in self.params]
        self.master.grad = torch.cat([g.reshape(-1) for g in copies])
        del copies
        for p in self.params:
            p.grad = None
        self.inner.step()
        self.master.grad = None
        offset = 0
        for p in self.params:
            n = p.numel()
            p.copy_(self.master[offset:offset + n].view_as(p))
            offset += n

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def state_tensors(self) -> list[torch.Tensor]:
        return [self.master, *_states(self.inner)]

    def gradient_tensors(self) -> list[torch.Tensor]:
        return [p.grad for p in self.params if p.grad is not None]

    def step_counters(self) -> list[torch.Tensor]:
        return _step_counters(self.inner)


def _states(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every non-scalar tensor in an optimizer's state (DTensors as their local shards)."""
    return [local(v) for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0]


def _step_counters(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The 0-dim ``step`` tensors of non-fused, non-capturable groups: CPU scalars on a GPU run."""
    return [local(state["step"]) for group in opt.param_groups if not (group.get("fused") or group.get("capturable"))
            for p in group["params"] if isinstance((state := opt.state.get(p, {})).get("step"), torch.Tensor)]


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
        InputError: QLoRA, LoRA built by litgpt / torchtune, CPU offload, optimizer in backward, activation
            offloading, chunked loss, tensor/pipeline/context/expert parallelism,
            or ZeRO-1.
    """
    par = t.parallelism
    if t.method.value == "qlora":
        raise InputError("{finetune} qlora cannot be traced: bitsandbytes NF4 kernels have no meta implementation; "
                         "trace {finetune} lora for the adapters and activations", field="finetune")
    if t.method.value == "lora" and t.lora_library.value != "peft":
        raise InputError(f"{{lora_library}} {t.lora_library.value} cannot be traced: the trace builds transformers + "
                         "PEFT adapters; trace with {lora_library} peft", field="lora_library")
    if t.offload.value != "none":
        raise InputError(f"{{offload}} {t.offload.value} cannot be traced (host memory is outside the simulation)",
                         field="offload")
    for name in ("optimizer_in_bwd", "activation_offloading"):
        if getattr(t, name):
            raise InputError(f"{{{name}}} cannot be traced (the trace runs the transformers model and a plain "
                             f"optimizer step, not torchtune's hooks); add {{no_{name}}}", field=name)
    if t.loss != "default":
        raise InputError(f"{{loss}} {t.loss} cannot be traced: transformers computes the full cross-entropy; "
                         "trace with {loss} default", field="loss")
    for name in ("tp", "pp", "cp", "ep"):
        if getattr(par, name) > 1:
            raise InputError(f"{{{name}}} {getattr(par, name)} cannot be traced: the trace simulates data-parallel "
                             f"sharding (FSDP2 / ZeRO-2/3) only; drop {{{name}}}", field=name)
    if par.zero_stage == 1:
        raise InputError("{zero_stage} 1 cannot be traced: FSDP2 shards gradients too; trace {zero_stage} 2 or 3",
                         field="zero_stage")
    if resolve_framework(t) is Framework.MEGATRON:
        raise InputError("{framework} megatron cannot be traced (Megatron-LM's model code is not transformers'); "
                         "trace with {framework} deepspeed, pytorch or fsdp", field="framework")


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
    def weight_cast(copy: torch.Tensor) -> None:  # the estimate's workspace.autocast_weights
        tracker.retag([copy], Kind.WORKSPACE, "autocast weight copy")

    autocast = (lambda: AutocastEmulation(recipe.autocast, weight_cast)) if recipe.autocast else contextlib.nullcontext
    framework = resolve_framework(t)
    with tracker, hooks.installed(), fused_kernels_on_meta():
        tracker.enter_phase("setup", Kind.OPTIMIZER_STATES)
        if recipe.flat_master and framework is Framework.DEEPSPEED:
            opt: Any = DeepSpeedFp16Optimizer(trainable, t.optimizer)
            notes.append("DeepSpeed FP16_Optimizer (ZeRO 0, bf16 or fp16): fp32 flat master, fused Adam, fp32 gradient "
                         "copies at the step")
        else:
            opt = PyTorchLoop(trainable, t.optimizer, set_to_none=t.set_grads_to_none,
                              ddp_buckets=framework is Framework.DDP)
            if framework is Framework.DDP:
                notes.append("DDP gradient buckets (gradient_as_bucket_view=False) over every trained parameter")
        for p in trainable:
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad()
        tracker.retag(opt.state_tensors(), Kind.OPTIMIZER_STATES, "optimizer state")
        tracker.retag(opt.gradient_tensors(), Kind.GRADIENTS, "gradient")
        tracker.ignore(opt.step_counters())
        tracker.reset_peak()

        for _ in range(micro_batches):
            start = tracker.enter_phase("forward", Kind.ACTIVATIONS)
            ids = torch.zeros((b, s), dtype=torch.long, device=device)
            tracker.retag([ids], Kind.ACTIVATIONS, "input ids")
            with autocast():
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            tracker.retag_freed_since(start, Kind.ACTIVATIONS, Kind.WORKSPACE)
            tracker.enter_phase("backward", Kind.LOGITS)
            opt.backward(loss / t.grad_accum_steps)
            del loss
            tracker.retag(opt.gradient_tensors(), Kind.GRADIENTS, "gradient")
        tracker.enter_phase("optimizer", Kind.WORKSPACE)
        tick("optimizer")
        opt.step()
        tracker.retag(opt.state_tensors(), Kind.OPTIMIZER_STATES, "optimizer state")
        # FSDP2's lazy init re-creates padded shards on ranks whose shard is short: settle them as weights
        tracker.retag([local(p) for p in model.parameters()], Kind.WEIGHTS, "parameter")
        opt.zero_grad()
    if t.grad_accum_steps > 2:
        notes.append(f"{t.grad_accum_steps} micro-batches: traced 2 (later ones repeat the second)")
    return notes
