"""The transformers model a trace runs: built from the config on the meta device, adapted to the job.

Building follows :mod:`memest.sources.meta` (the families' builder): ``AutoConfig.for_model`` on the raw
config, the class its ``architectures`` names when it is a head for the spec's task (else the task's auto
class: ``AutoModelForCausalLM``, ``AutoModelForMaskedLM``; encoder-decoder models are refused), instantiated under
``torch.device("meta")`` with an explicit dtype, and remote code only when the user allows it.
LoRA goes through PEFT's ``get_peft_model`` exactly as a fine-tuning script calls it; activation
checkpointing through the model's own ``activation_checkpointing_enable`` (transformers 5;
``gradient_checkpointing_enable`` before), which wraps every decoder layer in
``torch.utils.checkpoint`` with ``use_reentrant=False``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from memest.errors import InputError, MissingDependencyError, UnsupportedArchitectureError
from memest.lora_targets import peft_target_modules
from memest.sources.config import HFConfig
from memest.spec import ModelSpec

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a memest dtype name.

    Raises:
        InputError: not a floating dtype the trace can build a model in.
    """
    key = name.strip().lower().removeprefix("torch.")
    if key not in DTYPES:
        raise InputError(f"the trace builds models in fp32, fp16 or bf16, not {name!r}")
    return DTYPES[key]


TASK_CLASSES = {
    "causal_lm": ("AutoModelForCausalLM", ("ForCausalLM", "LMHeadModel")),
    "masked_lm": ("AutoModelForMaskedLM", ("ForMaskedLM",)),
}
"""The tasks the trace runs (memest's :data:`~memest.spec.TaskKind`): the transformers auto class of each and
the class-name suffixes of ``architectures`` entries that build such a head."""


def model_class(cfg: HFConfig, config: Any, task: str) -> Any:
    """The transformers class the trace builds for ``task``: the config's first ``architectures`` entry
    when transformers has it and it is a head for that task (``BertForMaskedLM``, ``LlamaForCausalLM``),
    else the task's auto class — what the analytic estimate's spec was derived from.

    Raises:
        UnsupportedArchitectureError: an encoder-decoder model, or a task the trace does not run.
    """
    import transformers

    if task == "seq2seq" or getattr(config, "is_encoder_decoder", False):
        raise UnsupportedArchitectureError(
            f"{cfg.name!r} is an encoder-decoder model ({cfg.model_type}): {{trace}} runs decoder-only and masked-LM "
            "models only, not encoder-decoder ones yet; drop {trace} and use the analytic estimate", field="trace"
        )
    if task not in TASK_CLASSES:
        raise UnsupportedArchitectureError(
            f"{cfg.name!r} ({cfg.model_type}) is a {task} model: {{trace}} runs causal and masked language models "
            "only; drop {trace} and use the analytic estimate", field="trace"
        )
    auto, suffixes = TASK_CLASSES[task]
    arch = cfg.architecture
    cls = getattr(transformers, arch, None) if arch else None
    if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel) and arch.endswith(suffixes):
        return cls
    return getattr(transformers, auto)


def build(cfg: HFConfig, dtype: torch.dtype, attn_implementation: str, *, task: str = "causal_lm",
          trust_remote_code: bool = False) -> tuple[Any, str]:
    """The transformers model of ``cfg`` for ``task`` on the meta device, and the attention implementation used.

    A class without SDPA attention is built with ``eager``, as transformers runs it everywhere.

    Args:
        cfg: The model's config.json.
        dtype: Parameter dtype.
        attn_implementation: ``sdpa`` or ``eager`` (transformers' names).
        task: The spec's task (``causal_lm`` or ``masked_lm``; see :func:`model_class`).
        trust_remote_code: Allow a model_type transformers does not know to run its own code.

    Raises:
        UnsupportedArchitectureError: transformers cannot build this config (its message cut to one line),
            or the trace does not run its task.
    """
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = cfg.model_type
    if model_type not in CONFIG_MAPPING:
        raise UnsupportedArchitectureError(
            f"model_type {model_type!r} of {cfg.name!r} is unknown to transformers {transformers.__version__}; "
            "the trace runs transformers' own model classes only"
        )
    raw = {k: v for k, v in cfg.raw.items() if k not in ("model_type", "auto_map")}
    try:
        config = AutoConfig.for_model(model_type, **raw)
    except Exception as exc:
        raise UnsupportedArchitectureError(
            f"transformers cannot read the {cfg.what} ({model_type}) for the trace: {_one_line(exc)}"
        ) from exc
    cls = model_class(cfg, config, task)
    try:
        return _instantiate(cls, config, dtype, attn_implementation, trust_remote_code), attn_implementation
    except Exception as exc:
        if attn_implementation != "sdpa" or "scaled_dot_product_attention" not in str(exc):
            raise UnsupportedArchitectureError(
                f"transformers cannot build {cfg.name!r} ({model_type}) as {cls.__name__} for the trace: "
                f"{_one_line(exc)}"
            ) from exc
    # the class has no SDPA attention (bloom's ALiBi, gemma2's soft-capping, gpt-oss's sinks): transformers
    # runs it with eager attention on a GPU too
    try:
        return _instantiate(cls, config, dtype, "eager", trust_remote_code), "eager"
    except Exception as exc:
        raise UnsupportedArchitectureError(
            f"transformers cannot build {cfg.name!r} ({model_type}) as {cls.__name__} for the trace: {_one_line(exc)}"
        ) from exc


ONE_LINE = 300
"""Most characters of an exception's message an error quotes (transformers' can list every config class)."""


def _one_line(exc: BaseException) -> str:
    """``Type: first line of the message``, cut to :data:`ONE_LINE` characters."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if len(text) > ONE_LINE:
        text = text[:ONE_LINE - 1] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _instantiate(cls: Any, config: Any, dtype: torch.dtype, attn_implementation: str, trust_remote_code: bool) -> Any:
    with torch.device("meta"):
        if cls.__name__.startswith("AutoModel"):
            return cls.from_config(config, dtype=dtype, attn_implementation=attn_implementation,
                                   trust_remote_code=trust_remote_code)
        return cls._from_config(config, dtype=dtype, attn_implementation=attn_implementation)


def decoder_layers(model: Any) -> list[Any]:
    """The repeated decoder blocks of a transformers model (the biggest ModuleList of blocks)."""
    best: list[Any] = []
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > len(best):
            best = list(module)
    return best


def lm_head(model: Any) -> Any:
    """The output projection module (``get_output_embeddings``)."""
    head = model.get_output_embeddings()
    if head is None:
        raise UnsupportedArchitectureError(f"{type(model).__name__} has no output embeddings to trace the logits of")
    return head


def lora_targets(spec: ModelSpec, targets: str) -> list[str]:
    """The module names PEFT should target for memest's ``--lora-targets``.

    ``attention``: the last names of the attention projections of the spec's layers (a longer
    suffix, ``attn.c_proj``, where an MLP linear shares the last name); ``all-linear``: those of
    every linear projection of a layer; otherwise the comma-separated names as given
    (:func:`memest.lora_targets.peft_target_modules`).
    """
    names = peft_target_modules(spec, targets)
    if not names:
        raise InputError(f"{{lora_targets}} {targets!r} matches no linear layer of {spec.name}", field="lora_targets")
    return names


def apply_lora(model: Any, targets: list[str], rank: int, task: str = "causal_lm") -> Any:
    """``peft.get_peft_model`` with a LoRA adapter of ``rank`` on ``targets`` (PEFT defaults otherwise).

    ``task_type="CAUSAL_LM"`` for a causal LM, as fine-tuning scripts pass it; none for a masked LM
    (PEFT has no masked-LM task type; its ``PeftModelForCausalLM`` needs ``prepare_inputs_for_generation``).

    PEFT's defaults matter for memory: ``lora_alpha`` 8, ``lora_dropout`` 0 (no dropout module),
    and ``autocast_adapter_dtype=True``, which keeps the adapters in float32 when the base
    model is bf16/fp16 (peft ``tuners_utils.BaseTuner._cast_adapter_dtype``).

    Raises:
        MissingDependencyError: peft is not installed.
    """
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise MissingDependencyError("tracing LoRA needs peft; install with: pip install peft") from exc
    with torch.device("meta"):
        task_type = "CAUSAL_LM" if task == "causal_lm" else None
        return get_peft_model(model, LoraConfig(r=rank, target_modules=targets, task_type=task_type))


def enable_checkpointing(model: Any, recompute_context: Any) -> None:
    """Activation checkpointing of every decoder layer, through the model's own switch.

    Args:
        model: The transformers model.
        recompute_context: A context-manager factory entered around each layer's recomputation
            in backward (``torch.utils.checkpoint``'s ``context_fn``, second element), so the
            tracker knows the rebuilt tensors are activations. transformers 5 checkpoints
            ``forward``, inside the module's hooks, so hooks cannot tell.
    """
    kwargs = {"use_reentrant": False, "context_fn": lambda: (contextlib.nullcontext(), recompute_context())}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers < 5
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


@contextlib.contextmanager
def data_dependent_answers() -> Iterator[None]:
    """Answer the data-dependent questions transformers asks of real tensors, as real inputs would.

    Meta tensors have no values, so ``bool(tensor)`` fails. The questions and the answers a real
    batch of unpacked sequences gives:

    - ``masking_utils.find_packed_sequence_indices`` (are several sequences packed in one row?
      asked when training without a cache or an attention mask): no, ``None``.
    """
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original
