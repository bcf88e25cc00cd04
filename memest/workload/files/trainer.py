"""HF TrainingArguments as YAML / JSON: trl recipes (``trl sft --config``) and alignment-handbook recipes.

Keys read (transformers ``training_args.py``; trl ``trainer/sft_config.py`` and ``trainer/model_config.py``):
``model_name_or_path``; ``use_peft``, ``load_in_4bit`` (QLoRA), ``lora_r``, ``lora_dropout``,
``lora_target_modules``; ``per_device_train_batch_size``, ``gradient_accumulation_steps``; ``bf16`` / ``fp16``
and ``torch_dtype``; ``gradient_checkpointing``; ``optim``; ``max_length`` / ``max_seq_length``;
``use_liger_kernel``; ``attn_implementation``; ``deepspeed`` (a JSON path, read relative to the recipe's
folder, or an inline mapping); ``fsdp`` / ``fsdp_config``.

Precision: the parameters are loaded at the dtype the recipe names (:data:`LOAD_DTYPE_KEYS`: the
alignment-handbook's and trl's ``ModelArguments.torch_dtype``, trl's ``ModelConfig.dtype`` since v0.25,
``SFTConfig.model_init_kwargs``), else at ``from_pretrained``'s default, fp32 (transformers 4.57). A 16-bit
load makes every parameter, a LoRA's frozen base included, 16-bit: memest's ``bf16`` recipe (pure 16-bit; PEFT's
adapters stay fp32, :mod:`memest.estimate.training.lora`). Otherwise ``bf16`` / ``fp16`` run ``torch.autocast``
over the fp32 parameters (``amp``); under FSDP (``fsdp``) accelerate's ``MixedPrecision(param_dtype=bf16)`` over
fp32 shards (``fsdp2``); under DeepSpeed DeepSpeed's (:mod:`memest.workload.files`). Neither switch: fp32, except
that trl's configs turn ``bf16`` on when neither is given (``__post_init__``: ``self.bf16 = not (self.fp16) if
self.bf16 is None``). A QLoRA base is NF4 whatever the load dtype. The stack is ``trl`` when the recipe has keys
of trl's configs (:data:`TRL_KEYS`), else ``hf-trainer``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memest.errors import InputError
from memest.workload.config import AttnImplementation, FsdpStrategy, Loss, Method, Offload, Optimizer, Precision, Stack
from memest.workload.files._common import Found, Include, lookup, typed

NAME = "HF TrainingArguments / trl recipe YAML or JSON (model_name_or_path, per_device_train_batch_size)"
MARKERS = frozenset({"model_name_or_path", "per_device_train_batch_size", "output_dir", "learning_rate", "optim",
                     "gradient_checkpointing", "max_length", "max_seq_length", "num_train_epochs", "dataset_name",
                     "use_peft", "lr_scheduler_type"})
"""Keys only TrainingArguments-style recipes have (a DeepSpeed JSON shares ``bf16`` and
``gradient_accumulation_steps``)."""
TRL_KEYS = frozenset({"max_length", "max_seq_length", "packing", "dataset_text_field", "dataset_kwargs",
                      "dataset_num_proc", "dataset_name", "dataset_mixture", "use_peft", "lora_r",
                      "lora_target_modules", "load_in_4bit", "model_revision", "completion_only_loss",
                      "assistant_only_loss", "beta", "max_prompt_length", "activation_offloading"})
"""Keys of trl's ``SFTConfig`` / ``DPOConfig``, ``ModelConfig`` and ``ScriptArguments`` that TrainingArguments lacks."""
READS = ("model_name_or_path", "use_peft", "load_in_4bit", "lora_r", "lora_dropout", "lora_target_modules",
         "per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "fp16", "torch_dtype", "dtype",
         "model_init_kwargs.torch_dtype", "model_init_kwargs.dtype",
         "gradient_checkpointing", "gradient_checkpointing_kwargs.use_reentrant", "optim", "max_length",
         "max_seq_length", "packing", "use_liger_kernel", "attn_implementation", "deepspeed", "fsdp",
         "fsdp_config.activation_checkpointing", "torch_compile", "activation_offloading")
IGNORED = {
    "load_in_8bit": ("int8 base weights under LoRA; memest keeps the base at its storage dtype", False),
    "fsdp_config.forward_prefetch": ("one more unit's parameters gathered ahead in forward", False),
}
"""Memory-relevant keys memest does not model -> (what they size, the default)."""

OPTIM: dict[str, Optimizer] = {
    "adamw_torch": Optimizer.ADAMW, "adamw_torch_fused": Optimizer.ADAMW_FUSED, "adamw_hf": Optimizer.ADAMW,
    "adamw_apex_fused": Optimizer.ADAMW_FUSED, "adamw_8bit": Optimizer.ADAMW8BIT,
    "adamw_bnb_8bit": Optimizer.ADAMW8BIT, "paged_adamw_8bit": Optimizer.PAGED_ADAMW8BIT,
    "paged_adamw_32bit": Optimizer.PAGED_ADAMW32BIT, "paged_adamw": Optimizer.PAGED_ADAMW32BIT, "adafactor": Optimizer.ADAFACTOR,
    "lion_32bit": Optimizer.LION, "paged_lion_32bit": Optimizer.LION, "sgd": Optimizer.SGD,
}
"""transformers ``OptimizerNames`` (``training_args.py``) -> memest's optimizer: the same states per parameter
(``paged_adamw_8bit`` / ``paged_adamw_32bit``: bitsandbytes' states of tensors >= 1e5 elements in CUDA managed
memory, outside the allocator; the Trainer's ``sgd`` is torch SGD without momentum; the paged Lion is read as
``lion``, its states counted on the allocator)."""
ATTN = {"sdpa": AttnImplementation.SDPA, "flash_attention_2": AttnImplementation.FLASH_ATTENTION_2,
        "eager": AttnImplementation.EAGER}
_FSDP = {"full_shard": FsdpStrategy.FULL_SHARD, "shard_grad_op": FsdpStrategy.SHARD_GRAD_OP,
         "hybrid_shard": FsdpStrategy.HYBRID_SHARD, "no_shard": FsdpStrategy.NO_SHARD}
_HALF = ("bfloat16", "float16", "bf16", "fp16")
LOAD_DTYPE_KEYS = ("torch_dtype", "dtype", "model_init_kwargs.torch_dtype", "model_init_kwargs.dtype")
"""Where a recipe names the dtype ``from_pretrained`` loads the model at, the first found: alignment-handbook
``ModelArguments.torch_dtype`` (trl before v0.25 ``ModelConfig.torch_dtype``), trl ``ModelConfig.dtype``
(``trl/trainer/model_config.py`` at f2cd57710, passed as ``dtype=model_args.dtype`` by ``trl/scripts/sft.py``),
``SFTConfig.model_init_kwargs`` (``torch_dtype``, or ``dtype`` in newer trl). ``auto`` loads the checkpoint's
stored dtype."""


def detect(doc: Any, text: str) -> bool:
    """Whether ``doc`` is a TrainingArguments-style recipe: a mapping with one of :data:`MARKERS`."""
    return isinstance(doc, dict) and bool(MARKERS & set(doc))


def read(path: Path, doc: dict[str, Any]) -> Found:
    """The settings a TrainingArguments / trl recipe implies."""
    r = Recipe(path, doc)
    r.name_model("model_name_or_path")
    trl = bool(TRL_KEYS & set(doc))
    r.put("stack", Stack.TRL if trl else Stack.HF_TRAINER, "model_name_or_path")
    peft = r.flag("use_peft")
    method = (Method.QLORA if r.flag("load_in_4bit") else Method.LORA) if peft else Method.FULL
    r.mode(method, "use_peft")
    if peft:
        r.integer("lora_r", "lora_rank")
        r.number("lora_dropout", "lora_dropout")
        r.targets("lora_target_modules")
    if "beta" in doc or "max_prompt_length" in doc:  # DPOConfig / ORPOConfig keys
        r.notes.append(f"{path.name}: a preference-optimization recipe (beta, max_prompt_length) may hold a frozen "
                       "reference model and scores chosen and rejected sequences; memest estimates one sequence "
                       "per micro-batch row of the policy's training only")
    r.integer("per_device_train_batch_size", "micro_batch_size")
    r.integer("gradient_accumulation_steps", "grad_accum_steps")
    r.integer("max_length" if "max_length" in doc else "max_seq_length", "seq_len")
    r.checkpointing("gradient_checkpointing")
    r.optimizer("optim")
    r.attention("attn_implementation")
    if r.flag("use_liger_kernel"):
        r.put("loss", Loss.FUSED, "use_liger_kernel")
    if r.flag("torch_compile"):  # TrainingArguments.torch_compile: the Trainer wraps the model in torch.compile
        r.put("torch_compile", True, "torch_compile")
    if r.flag("activation_offloading"):  # trl SFTConfig: trl/models/activation_offloading.py, torchtune's
        r.put("activation_offloading", True, "activation_offloading")  # get_act_offloading_ctx_manager, copied
    fsdp = r.fsdp("fsdp")
    fsdp_config = doc.get("fsdp_config")
    if isinstance(fsdp_config, dict) and fsdp_config.get("activation_checkpointing") is True:
        r.put("recompute", "full", "fsdp_config.activation_checkpointing")
    r.precision(method, default_bf16=trl, sharded=fsdp)
    r.deepspeed("deepspeed")
    return r.found()


class Recipe:
    """A recipe's keys read into settings, with where each was read (shared by the HF Trainer-based formats)."""

    def __init__(self, path: Path, doc: dict[str, Any]) -> None:
        self.path, self.doc = path, doc
        self.values: dict[str, Any] = {}
        self.origins: dict[str, str] = {}
        self.notes: list[str] = []
        self.includes: list[Include] = []
        self.model: str | None = None

    def found(self) -> Found:
        return Found(self.values, self.notes, self.model, self.origins, tuple(self.includes))

    def put(self, setting: str, value: Any, key: str) -> None:
        self.values[setting], self.origins[setting] = value, key

    def get(self, key: str) -> Any:
        """The value at ``key`` (dotted for a nested one: ``model.lora_rank``), or None."""
        return lookup(self.doc, key)

    def name_model(self, key: str) -> None:
        value = self.get(key)
        if value is not None:
            self.model = str(typed(self.path, key, value, str, "a Hub id or a model folder"))
            self.origins["model"] = key

    def flag(self, key: str) -> bool:
        value = self.get(key)
        return False if value is None else bool(typed(self.path, key, value, bool, "true or false"))

    def integer(self, key: str, setting: str) -> None:
        value = self.get(key)
        if value is not None:
            self.put(setting, typed(self.path, key, value, int, "an integer"), key)

    def number(self, key: str, setting: str) -> None:
        value = self.get(key)
        if value is not None:
            self.put(setting, float(typed(self.path, key, value, (int, float), "a number")), key)

    def mode(self, method: Method, key: str) -> None:
        if method is Method.FULL:
            self.values["train"] = True
            if key in self.doc:
                self.origins["train"] = key
        else:
            self.put("finetune", method, key)

    def targets(self, key: str) -> None:
        value = self.get(key)
        if value is None:
            return
        if isinstance(value, str):
            self.put("lora_targets", "all-linear" if value in ("all-linear", "all") else value, key)
            return
        items = typed(self.path, key, value, list, "a list of module names or \"all-linear\"")
        for item in items:
            typed(self.path, key, item, str, "a list of module names")
        self.put("lora_targets", ",".join(items), key)

    def checkpointing(self, key: str) -> None:
        """``key`` given: full recompute when true, none when false (trl's configs default it to true, the
        HF Trainer's to false: a recipe's false must win over the trl stack's default)."""
        if self.get(key) is not None:
            self.put("recompute", "full" if self.flag(key) else "none", key)

    def optimizer(self, key: str) -> None:
        value = self.get(key)
        if value is None:
            return
        name = str(typed(self.path, key, value, str, "an optimizer name (transformers OptimizerNames)"))
        if name.lower() in OPTIM:
            self.put("optimizer", OPTIM[name.lower()], key)
        else:
            self.notes.append(f"{self.path.name}: {key} {name} is not an optimizer memest models (it models "
                              f"{', '.join(OPTIM)}); the stack's default optimizer is used")

    def attention(self, key: str) -> None:
        value = self.get(key)
        if value is None:
            return
        name = str(typed(self.path, key, value, str, "sdpa, flash_attention_2 or eager"))
        if name in ATTN:
            self.put("attn_implementation", ATTN[name], key)
        else:
            self.notes.append(f"{self.path.name}: {key} {name} is not modelled (memest models sdpa, "
                              "flash_attention_2 and eager); the stack's default is used")

    def fsdp(self, key: str) -> bool:
        """The Trainer's ``fsdp`` option (``"full_shard auto_wrap"``, a list, or ``offload``); True when set."""
        value = self.get(key)
        if value in (None, "", [], False):
            return False
        words = value.split() if isinstance(value, str) else typed(self.path, key, value, list, "FSDP options")
        words = [str(w).lower() for w in words]
        strategy = next((_FSDP[w] for w in words if w in _FSDP), None)
        if strategy is None:
            raise InputError(f"{{config}} {self.path}: {key} is {value!r}; expected full_shard, shard_grad_op, "
                             "hybrid_shard or no_shard (with auto_wrap / offload)", field="config")
        self.put("fsdp", strategy, key)
        if "offload" in words:
            self.put("offload", Offload.PARAMS, key)
        return True

    def precision(self, method: Method, *, default_bf16: bool, sharded: bool) -> None:
        bf16, fp16 = self.get("bf16"), self.get("fp16")
        if isinstance(bf16, str) and bf16 == "auto":  # axolotl: bf16 when the device has it
            bf16 = True
        if bf16 is not None:
            typed(self.path, "bf16", bf16, bool, "true or false")
        if fp16 is not None:
            typed(self.path, "fp16", fp16, bool, "true or false")
        half = bool(bf16) or bool(fp16) or (bf16 is None and fp16 is None and default_bf16)
        key = "fp16" if fp16 else "bf16" if bf16 is not None else "bf16 (not given: trl turns it on)"
        dtype_key = next((k for k in LOAD_DTYPE_KEYS if self.get(k) is not None), None)
        dtype = None
        if dtype_key is not None:
            dtype = str(typed(self.path, dtype_key, self.get(dtype_key), str,
                              "bfloat16, float16, float32 or auto")).lower()
            if dtype == "auto":
                self.notes.append(f"{self.path.name}: {dtype_key} auto loads the checkpoint's stored dtype; memest "
                                  "takes it as 16-bit (most Hub checkpoints are bf16): for an fp32 checkpoint pass "
                                  "the precision recipe")
        if method is not Method.QLORA and (dtype in _HALF or dtype == "auto"):
            self.put("precision", Precision.BF16, dtype_key)  # every parameter loaded 16-bit: pure 16-bit
            if half and method is Method.LORA:
                self.notes.append(f"{self.path.name}: {key} autocasts over the 16-bit frozen base ({dtype_key} "
                                  f"{dtype}); memest counts its casts of the fp32 adapters' inputs as PEFT's fp32 "
                                  "copies (an upper bound)")
        elif half:
            self.put("precision", Precision.FSDP2 if sharded else Precision.AMP, key)
        elif bf16 is not None or fp16 is not None:
            self.put("precision", Precision.FP32, key)

    def deepspeed(self, key: str) -> None:
        value = self.get(key)
        if value in (None, "", False):
            return
        if isinstance(value, dict):
            self.includes.append(Include(None, value, key))
            return
        self.includes.append(Include(str(typed(self.path, key, value, str, "a DeepSpeed JSON path or mapping")),
                                     key=key))
