"""The model a calibration runs: the transformers class of the config, built on the device.

Random weights by default: the config is turned into a transformers ``PretrainedConfig`` and the
model class is instantiated under ``torch.device(device)`` with an explicit dtype, so every
parameter is created on the device at its final dtype (no fp32 copy, no host round trip, no
download). ``checkpoint=`` loads real weights with ``from_pretrained`` instead (network or a
local folder with safetensors).

The class is the config's first ``architectures`` entry when transformers has it, else the auto
class for the model's task (causal LM, masked LM, seq2seq, sequence classification) — the same
choice transformers' own ``from_pretrained`` makes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memest.errors import InputError, MissingDependencyError, UnsupportedArchitectureError
from memest.sources.config import HFConfig
from memest.spec import ModelSpec

_AUTO_BY_TASK = {
    "causal_lm": "AutoModelForCausalLM",
    "masked_lm": "AutoModelForMaskedLM",
    "seq2seq": "AutoModelForSeq2SeqLM",
    "classification": "AutoModelForSequenceClassification",
}

TORCH_DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
                "bfloat16": "bfloat16", "bf16": "bfloat16"}


def import_stack() -> tuple[Any, Any]:
    """torch and transformers, or a MissingDependencyError naming the install command."""
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise MissingDependencyError(
            "memest calibrate runs the model: install torch and transformers (pip install torch transformers)"
        ) from exc
    return torch, transformers


def torch_dtype(name: str) -> Any:
    """The torch dtype of a memest dtype name (``bf16``, ``float32``, ...)."""
    torch, _ = import_stack()
    return getattr(torch, TORCH_DTYPES[name.lower().removeprefix("torch.")])


def model_class(cfg: HFConfig, spec: ModelSpec) -> tuple[Any, Any]:
    """(transformers config object, model class) for ``cfg``.

    Raises:
        UnsupportedArchitectureError: transformers does not know the model_type.
    """
    _, transformers = import_stack()
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if cfg.model_type not in CONFIG_MAPPING:
        raise UnsupportedArchitectureError(
            f"model_type {cfg.model_type!r} is not in transformers {transformers.__version__}; calibrate runs "
            "models transformers implements (upgrade transformers, or pick another model)"
        )
    raw = {k: v for k, v in cfg.raw.items() if k not in ("model_type", "auto_map")}
    config = AutoConfig.for_model(cfg.model_type, **raw)
    cls = getattr(transformers, cfg.architecture, None) if cfg.architecture else None
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        cls = getattr(transformers, _AUTO_BY_TASK.get(spec.task, "AutoModelForCausalLM"))
    return config, cls


def build_model(cfg: HFConfig, spec: ModelSpec, *, device: Any, dtype: Any, attn_implementation: str,
                checkpoint: str | None = None) -> Any:
    """The model on ``device`` at ``dtype``, random weights unless ``checkpoint`` is given.

    Args:
        cfg: The model's config.
        spec: Its ModelSpec (for the task).
        device: A ``torch.device``.
        dtype: A torch dtype for every floating parameter.
        attn_implementation: ``sdpa``, ``eager`` or ``flash_attention_2`` (transformers' names).
        checkpoint: A Hub id or local folder to load real weights from (``from_pretrained``).

    Raises:
        UnsupportedArchitectureError: transformers cannot build it.
    """
    torch, _ = import_stack()
    config, cls = model_class(cfg, spec)
    if checkpoint is not None:
        return cls.from_pretrained(checkpoint, dtype=dtype, device_map=str(device),
                                   attn_implementation=attn_implementation)
    with torch.device(device):
        if hasattr(cls, "from_config") and cls.__name__.startswith("AutoModel"):
            model = cls.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
        else:
            model = cls._from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    return model


WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth")
"""File patterns ``from_pretrained`` loads weights from (safetensors, PyTorch pickles)."""


def check_weights(reference: str) -> None:
    """Refuse ``--weights`` for a reference whose weights cannot be loaded, before anything runs.

    A local folder must hold weight files (:data:`WEIGHT_FILES`); a config file has none; a Hub id
    needs the Hub, or a cached checkpoint when offline.

    Raises:
        InputError: no weights to load.
    """
    from memest.sources.hub import hub_offline

    path = Path(reference).expanduser()
    if path.is_dir():
        if not any(any(path.glob(pattern)) for pattern in WEIGHT_FILES):
            raise InputError(f"{{weights}} loads the checkpoint's weights, but {reference!r} holds no weight files "
                             "(*.safetensors, *.bin); add them, or drop {weights} to run with random ones",
                             field="weights")
        return
    if path.exists():
        raise InputError(f"{{weights}} needs a model folder or a Hub id; {reference!r} is a file (a config holds no "
                         "weights): pass its folder, or drop {weights}", field="weights")
    if hub_offline():
        from huggingface_hub import try_to_load_from_cache

        if not any(isinstance(try_to_load_from_cache(reference, name), str)
                   for name in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                                "pytorch_model.bin.index.json")):
            raise InputError(f"{{weights}} downloads the weights of {reference!r}, but the Hub is offline "
                             "(HF_HUB_OFFLINE) and they are not cached; go online, or drop {weights}", field="weights")


def decoder_layers(model: Any) -> list[Any]:
    """The repeated blocks of a transformers model (the classes in ``_no_split_modules``), in order:
    the units FSDP wraps one by one (accelerate's ``transformer_layer_cls_to_wrap``)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    base = getattr(model, "base_model", model)
    names |= set(getattr(base, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def parameter_bytes(model: Any) -> int:
    """Bytes of the distinct parameter storages of ``model`` on this process (local shards of
    DTensors, quantized storages as stored)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        local = getattr(p, "_local_tensor", p)
        storage = local.untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() == 0:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total
