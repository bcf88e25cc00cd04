"""A real training step as memest's precision recipes, optimizers and LoRA describe it.

Each recipe of :mod:`memest.estimate.training` is run as its table says:

| recipe | model dtype | gradients | fp32 master | optimizer runs on | how |
|---|---|---|---|---|---|
| fp32 | fp32 | fp32 | – | the parameters | plain PyTorch |
| bf16 | bf16 | bf16 | – | the parameters (states bf16) | plain PyTorch |
| amp | fp32 | fp32 | – | the parameters | ``torch.autocast(bf16)`` around the forward (HF Trainer ``bf16=True``) |
| mixed / fp16 | bf16 / fp16 | bf16 / fp16 | yes | the fp32 master copies | :class:`MasterWeightsOptimizer` |
| fsdp2 | fp32 (sharded) | fp32 (sharded) | – | the local shards | FSDP2 ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` |

Optimizers are the torch ones with their defaults on the device (foreach kernels on CUDA, the
per-tensor loop on CPU), bitsandbytes' ``AdamW8bit`` / ``PagedAdamW8bit``, and :class:`Lion`
(lion-pytorch's update, one momentum state). LoRA goes through peft (``get_peft_model``) on the
modules memest's estimator targets, with PEFT's defaults: on a 16-bit base the adapters are fp32
(``autocast_adapter_dtype=True``) and are trained directly, without a master copy; QLoRA quantizes the decoder's linear weights to bitsandbytes
NF4 with double quantization, then prepares it as ``--prepare-kbit-training`` says
(:class:`memest.workload.KbitPrep`): ``trl`` as trl's ``SFTTrainer`` with ``bf16=True`` does
(``peft.prepare_model_for_kbit_training``, the adapters, then trl's ``peft_module_casting_to_bf16``:
norms fp32, embeddings and lm_head back to bf16; forward under ``torch.autocast(bf16)``), ``peft``
``prepare_model_for_kbit_training`` alone (non-quantized weights fp32, no autocast), ``none``
nothing (the forward under bf16 autocast). ``--lora-dropout``, ``--keep-grads`` and ``--target-len`` (seq2seq decoders) are honoured.

The batch is ``micro_batch_size`` sequences of ``seq_len`` random token ids, no padding (no
attention mask is materialised), labels = inputs (the model's own shifted cross-entropy).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from memest.errors import InputError, MissingDependencyError
from memest.lora_targets import ALL_LINEAR, layer_modules
from memest.workload import KbitPrep, Method, Optimizer, Precision, Recompute, TrainingConfig

LEARNING_RATE = 1e-5
"""Any small rate: memory does not depend on it."""


@dataclass(frozen=True, slots=True)
class RecipeDtypes:
    """The torch dtype names a recipe builds the model in and computes in."""

    model: str
    autocast: str | None
    master: bool


RECIPE_DTYPES: dict[Precision, RecipeDtypes] = {
    Precision.FP32: RecipeDtypes("float32", None, False),
    Precision.BF16: RecipeDtypes("bfloat16", None, False),
    Precision.AMP: RecipeDtypes("float32", "bfloat16", False),
    Precision.MIXED: RecipeDtypes("bfloat16", None, True),
    Precision.FP16: RecipeDtypes("float16", None, True),
    Precision.FSDP2: RecipeDtypes("float32", None, False),
}


class Lion:
    """Lion (Chen et al. 2023, lion-pytorch's update): one momentum state per parameter.

    Args:
        params: Tensors to update.
        lr: Learning rate.
        betas: Interpolation and momentum coefficients.
        weight_decay: Decoupled weight decay.
    """

    def __init__(self, params: Any, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0) -> None:
        self.params = [p for p in params]
        self.lr, self.betas, self.weight_decay = lr, betas, weight_decay
        self.state: dict[Any, dict[str, Any]] = {}

    def step(self) -> None:
        """One update of every parameter with a gradient."""
        import torch

        b1, b2 = self.betas
        with torch.no_grad():
            for p in self.params:
                if p.grad is None:
                    continue
                state = self.state.setdefault(p, {"exp_avg": torch.zeros_like(p)})
                exp_avg = state["exp_avg"]
                p.mul_(1 - self.lr * self.weight_decay)
                update = exp_avg.mul(b1).add_(p.grad, alpha=1 - b1).sign_()
                p.add_(update, alpha=-self.lr)
                exp_avg.mul_(b2).add_(p.grad, alpha=1 - b2)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop (or zero) the gradients."""
        for p in self.params:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.zero_()


def make_optimizer(params: list[Any], optimizer: Optimizer, *, device_type: str) -> Any:
    """The optimizer ``--optimizer`` names, over ``params``.

    Raises:
        MissingDependencyError: bitsandbytes is needed and not installed.
        InputError: an 8-bit optimizer off CUDA.
    """
    import torch

    if optimizer is Optimizer.ADAMW:
        return torch.optim.AdamW(params, lr=LEARNING_RATE)
    if optimizer is Optimizer.ADAMW_FUSED:  # the HF Trainer's adamw_torch_fused (CPU kernels from torch 2.4)
        return torch.optim.AdamW(params, lr=LEARNING_RATE, fused=True)
    if optimizer is Optimizer.ADAFACTOR:
        return torch.optim.Adafactor(params, lr=1e-2)
    if optimizer is Optimizer.SGD:
        return torch.optim.SGD(params, lr=LEARNING_RATE)
    if optimizer is Optimizer.SGD_MOMENTUM:
        return torch.optim.SGD(params, lr=LEARNING_RATE, momentum=0.9)
    if optimizer is Optimizer.LION:
        return Lion(params, lr=LEARNING_RATE)
    if device_type != "cuda":
        raise InputError(f"{{optimizer}} {optimizer.value} (bitsandbytes) needs CUDA; use {{device}} cuda",
                         field="optimizer")
    bnb = _bitsandbytes()
    if optimizer is Optimizer.ADAMW8BIT:
        return bnb.optim.AdamW8bit(params, lr=LEARNING_RATE)
    if optimizer is Optimizer.PAGED_ADAMW32BIT:
        return bnb.optim.PagedAdamW32bit(params, lr=LEARNING_RATE)
    return bnb.optim.PagedAdamW8bit(params, lr=LEARNING_RATE)


def _bitsandbytes() -> Any:
    try:
        import bitsandbytes
    except ImportError as exc:
        raise MissingDependencyError("8-bit optimizers and QLoRA need bitsandbytes: pip install bitsandbytes") from exc
    return bitsandbytes


class MasterWeightsOptimizer:
    """16-bit parameters and gradients, an fp32 master copy updated by the optimizer (the
    ``mixed`` / ``fp16`` recipes: DeepSpeed bf16/fp16 optimizer, Megatron ``--bf16``).

    The step goes parameter by parameter: the gradient is upcast into the master's ``.grad``
    (one fp32 gradient alive at a time), the optimizer updates the master, and the 16-bit
    parameter is overwritten with it. Optimizer states live on the masters.

    Args:
        params: The trainable 16-bit parameters.
        make: Builds the inner optimizer for a list of master tensors.
    """

    def __init__(self, params: list[Any], make: Callable[[list[Any]], Any]) -> None:
        import torch

        self.pairs = [(p, torch.nn.Parameter(p.detach().float())) for p in params]
        self.inner = [make([m]) for _, m in self.pairs]

    def step(self) -> None:
        """Update every master from its parameter's gradient, then copy it back."""
        import torch

        for (p, m), opt in zip(self.pairs, self.inner, strict=True):
            if p.grad is None:
                continue
            m.grad = p.grad.float()
            opt.step()
            m.grad = None
            with torch.no_grad():
                p.copy_(m)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop (or zero) the 16-bit gradients."""
        for p, _ in self.pairs:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.zero_()

    def state_tensors(self) -> Iterator[Any]:
        """Master copies and every inner optimizer's state tensors."""
        for (_, m), opt in zip(self.pairs, self.inner, strict=True):
            yield m
            yield from optimizer_state_tensors(opt)


def optimizer_state_tensors(opt: Any) -> Iterator[Any]:
    """Every tensor an optimizer holds as state (masters included for :class:`MasterWeightsOptimizer`)."""
    import torch

    if isinstance(opt, MasterWeightsOptimizer):
        yield from opt.state_tensors()
        return
    state = getattr(opt, "state", {})
    for per_param in state.values():
        for value in per_param.values():
            if isinstance(value, torch.Tensor):
                yield value


def tensors_bytes(tensors: Any) -> int:
    """Bytes of the distinct storages among ``tensors`` (of a DTensor: its local shard's storage).

    A DTensor (FSDP2's sharded parameters, and the masters and optimizer states made from them) is
    a wrapper without storage of its own: reading its storage's pointer raises, so it is unwrapped.
    """
    seen: set[int] = set()
    total = 0
    for t in tensors:
        storage = getattr(t, "_local_tensor", t).untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() == 0:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


# ---- LoRA / QLoRA ----


def lora_target_modules(spec: Any, targets: str) -> list[str] | str:
    """peft ``target_modules`` for ``--lora-targets``: the layer modules memest's estimator counts
    adapters for (``self_attn.q_proj``, ...: :func:`memest.lora_targets.layer_modules`), matched by peft
    as name suffixes; ``all-linear`` as is."""
    if targets == ALL_LINEAR:
        return ALL_LINEAR
    modules = layer_modules(spec, targets)
    if not modules:
        raise InputError(f"{{lora_targets}} {targets!r} matches no linear layer of {spec.name}; "
                         "use attention, all-linear, or module names such as q_proj,v_proj", field="lora_targets")
    return sorted(modules)


def apply_lora(model: Any, spec: Any, t: TrainingConfig) -> Any:
    """Wrap ``model`` with peft LoRA adapters of rank ``t.lora.rank`` on the estimator's targets.

    Raises:
        MissingDependencyError: peft is not installed.
    """
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise MissingDependencyError("{finetune} lora needs peft: pip install peft", field="finetune") from exc
    config = LoraConfig(r=t.lora.rank, lora_alpha=2 * t.lora.rank, lora_dropout=t.lora.dropout, bias="none",
                        target_modules=lora_target_modules(spec, t.lora.targets))
    return get_peft_model(model, config)  # PEFT's default autocast_adapter_dtype: fp32 adapters on a 16-bit base


def quantize_nf4(model: Any, device: Any) -> Any:
    """Replace the decoder's linear layers with bitsandbytes ``Linear4bit`` (NF4, double
    quantization, bf16 compute) and move the model to ``device``, as transformers'
    ``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)``
    loads a checkpoint. The model must be on the CPU; each weight is quantized as it moves.

    Raises:
        MissingDependencyError: bitsandbytes is not installed.
    """
    import torch

    bnb = _bitsandbytes()
    layer_ids = {id(m) for layer in _layers_of(model) for m in layer.modules()}
    for parent in list(model.modules()):
        if id(parent) not in layer_ids:
            continue
        for name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear:
                continue
            q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                  compute_dtype=torch.bfloat16, compress_statistics=True, quant_type="nf4")
            q.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, compress_statistics=True,
                                         quant_type="nf4")
            if child.bias is not None:
                q.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
            setattr(parent, name, q.to(device))
    model.to(device)
    model.is_loaded_in_4bit = True
    return model


def _layers_of(model: Any) -> list[Any]:
    from memest.calibration.models import decoder_layers

    return decoder_layers(model)


# ---- the step ----


@dataclass
class TrainingSession:
    """A model and optimizer ready to step.

    Attributes:
        model: The (possibly wrapped) model.
        optimizer: The optimizer.
        batch: Keyword arguments of the forward.
        grad_accum_steps: Micro-batches per optimizer step.
        set_grads_to_none: ``zero_grad(set_to_none=...)`` after the step (``--keep-grads`` keeps them).
        autocast: torch dtype name for ``torch.autocast``, or None.
        device_type: ``cuda`` or ``cpu``.
        weights_module: The module whose parameters are the weights (before wrappers).
    """

    model: Any
    optimizer: Any
    batch: dict[str, Any]
    grad_accum_steps: int
    set_grads_to_none: bool
    autocast: str | None
    device_type: str
    weights_module: Any

    def warmup(self) -> None:
        """One full step: creates optimizer states, kernels and the cuBLAS workspace."""
        self.step()

    def step(self) -> None:
        """Forward, backward (``grad_accum_steps`` micro-batches), optimizer step, gradients dropped."""
        import contextlib

        import torch

        for _ in range(self.grad_accum_steps):
            ctx = (torch.autocast(self.device_type, dtype=getattr(torch, self.autocast)) if self.autocast
                   else contextlib.nullcontext())
            with ctx:
                out = self.model(**self.batch)
            loss = out.loss if hasattr(out, "loss") else out[0]
            del out  # drop the logits before backward, as the HF Trainer and torchtitan do
            (loss / self.grad_accum_steps).backward()
            del loss
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=self.set_grads_to_none)

    def live_bytes(self) -> int:
        """Bytes of every tensor the job holds between steps: parameters, buffers, optimizer
        states (with masters), the batch."""
        import itertools

        tensors = itertools.chain(
            self.weights_module.parameters(),
            self.weights_module.buffers(),
            optimizer_state_tensors(self.optimizer),
            (v for v in self.batch.values()),
        )
        return tensors_bytes(tensors)

    def static_bytes(self) -> dict[str, int]:
        """Bytes alive between steps: parameters (weights), optimizer states (with the fp32 masters)
        and, of those, the masters alone."""
        from memest.calibration.models import parameter_bytes

        masters = [m for _, m in self.optimizer.pairs] if isinstance(self.optimizer, MasterWeightsOptimizer) else []
        return {"weights": parameter_bytes(self.weights_module),
                "optimizer_states": tensors_bytes(optimizer_state_tensors(self.optimizer)),
                "master_weights": tensors_bytes(masters)}


def training_batch(spec: Any, t: TrainingConfig, vocab_size: int, device: Any) -> dict[str, Any]:
    """Random token ids for the model's task: ``(micro_batch_size, seq_len)`` inputs and labels."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(0)
    shape = (t.micro_batch_size, t.seq_len)
    ids = torch.randint(0, vocab_size, shape, generator=g).to(device)
    if spec.task == "classification":
        return {"input_ids": ids, "labels": torch.zeros(t.micro_batch_size, dtype=torch.long, device=device)}
    if spec.task == "seq2seq":  # the decoder gets --target-len tokens (default: --seq-len)
        target = t.target_len or t.seq_len
        labels = torch.randint(0, vocab_size, (t.micro_batch_size, target), generator=g).to(device)
        return {"input_ids": ids, "labels": labels}
    return {"input_ids": ids, "labels": ids}


def prepare_training(model: Any, spec: Any, t: TrainingConfig, *, device: Any, wrap: Callable[[Any], Any],
                     vocab_size: int) -> TrainingSession:
    """Set up ``model`` (already on ``device`` at the recipe's dtype) for ``t``.

    Args:
        model: The transformers model.
        spec: Its ModelSpec.
        t: The training job.
        device: The torch device.
        wrap: Applies data parallelism (DDP / FSDP2) and returns the module to call.
        vocab_size: Token ids are drawn below this.
    """
    recipe = RECIPE_DTYPES[t.precision]
    if t.recompute is Recompute.FULL:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if getattr(model.config, "use_cache", None):
        model.config.use_cache = False
    prep = t.prepare_kbit_training if t.method is Method.QLORA else KbitPrep.NONE
    if prep is not KbitPrep.NONE:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=t.recompute is Recompute.FULL,
                                                gradient_checkpointing_kwargs={"use_reentrant": False})
    if t.method in (Method.LORA, Method.QLORA):
        model = apply_lora(model, spec, t)
    if prep is KbitPrep.TRL and t.precision is not Precision.FP16 and t.half_dtype != "fp16":
        cast_like_trl(model)
    model.train()
    weights_module = model
    runnable = wrap(model)
    params = [p for p in runnable.parameters() if p.requires_grad]
    if not params:
        raise InputError(f"{spec.name} has no trainable parameter under {{finetune}} {t.method.value}; "
                         "check {lora_targets}", field="finetune")
    import torch

    if recipe.master and any(p.dtype in (torch.bfloat16, torch.float16) for p in params):
        opt: Any = MasterWeightsOptimizer(params, lambda ms: make_optimizer(ms, t.optimizer, device_type=device.type))
    else:
        opt = make_optimizer(params, t.optimizer, device_type=device.type)
    batch = training_batch(spec, t, vocab_size, device)
    autocast = recipe.autocast
    if t.method is Method.QLORA:  # the HF Trainer's bf16=True autocast; PEFT's preparation alone runs without
        autocast = None if prep is KbitPrep.PEFT else "bfloat16"
    return TrainingSession(runnable, opt, batch, t.grad_accum_steps, t.set_grads_to_none, autocast, device.type,
                           weights_module)


def cast_like_trl(model: Any) -> None:
    """trl 0.13 ``peft_module_casting_to_bf16`` (``trl/trainer/utils.py``), which ``SFTTrainer`` applies to
    a 4-bit PEFT model when ``args.bf16``: modules named ``*norm*`` (or LayerNorms) to fp32, fp32
    ``lm_head`` / ``embed_tokens`` / ``wte`` / ``wpe`` back to bf16."""
    import torch

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.LayerNorm) or "norm" in name:
            module.to(torch.float32)
        elif (any(x in name for x in ("lm_head", "embed_tokens", "wte", "wpe"))
              and getattr(module, "weight", None) is not None and module.weight.dtype == torch.float32):
            module.to(torch.bfloat16)


def model_dtype(t: TrainingConfig) -> str:
    """The dtype the model is built in for ``t`` (QLoRA: bf16 before quantization)."""
    return "bfloat16" if t.method is Method.QLORA else RECIPE_DTYPES[t.precision].model
