"""NeMo launches: a NeMo 2 ``nemo llm pretrain|finetune --factory NAME key=value ...`` line, a NeMo 1
``python megatron_gpt_pretraining.py key=value ...`` (Hydra) line, or a NeMo 1 ``megatron_gpt_config.yaml``.

Read from NVIDIA/NeMo at 8cfedd7203462cb251a914e700e5605444277561 (2025-09, after v2.5.0rc0).

NeMo 2 (``nemo/collections/llm/recipes/``): ``--factory NAME`` (or ``"NAME(num_nodes=2, peft_scheme='lora')"``)
builds the recipe of :data:`FACTORIES`, then each ``key=value`` sets one of its attributes (nemo_run's CLI).
Keys read: ``trainer.devices`` x ``trainer.num_nodes`` (the device count), ``trainer.strategy.``
``tensor_model_parallel_size`` / ``pipeline_model_parallel_size`` / ``context_parallel_size`` /
``expert_model_parallel_size`` / ``sequence_parallel`` (``MegatronStrategy``; the docs' ``sequence_parallelism``
is no argument of it: a note), ``data.micro_batch_size``, ``data.global_batch_size`` (accumulation:
global / (micro x dp), as Megatron-LM), ``data.seq_length``, ``trainer.plugins`` (``bf16_mixed``:
``MegatronMixedPrecision(precision="bf16-mixed", params_dtype=bf16, grad_reduce_in_fp32=True)``, bf16 params
with fp32 ``main_grad`` and master; ``fp16_mixed`` likewise in fp16), ``optim.config.use_distributed_optimizer``
(``distributed_fused_adam_with_cosine_annealing``: True, ZeRO-1 over dp), ``optim.config.optimizer``,
``model.config.recompute_granularity``, and ``peft`` / ``peft.dim`` of a finetune (``llm.peft.LoRA``:
``target_modules`` linear_qkv, linear_proj, linear_fc1, linear_fc2, i.e. every linear of a block;
``dropout`` 0.0). A factory memest does not know: a note naming it, and the keys of the line still read.

NeMo 1 (``examples/nlp/language_modeling/conf/megatron_gpt_config.yaml``, which
``megatron_gpt_pretraining.py`` loads, the line's Hydra overrides on top): ``trainer.devices`` x
``trainer.num_nodes``, ``trainer.precision`` with ``model.megatron_amp_O2`` (``megatron_gpt_model.py``:
O2 keeps bf16 / fp16 params with fp32 main params; without it ``enable_autocast`` runs fp32 params under
``torch.autocast``), ``model.micro_batch_size``, ``model.global_batch_size``, ``model.encoder_seq_length``,
``model.tensor_model_parallel_size``, ``model.pipeline_model_parallel_size``, ``model.context_parallel_size``,
``model.expert_model_parallel_size``, ``model.sequence_parallel``, ``model.activations_checkpoint_granularity``
(``full`` with ``activations_checkpoint_method`` uniform and ``activations_checkpoint_num_layers`` 1: every
layer; other methods or counts: a note), ``model.optim.name`` (``distributed_fused_adam``,
``mcore_distributed_optim``: optimizer states and fp32 main params sharded over dp, ZeRO-1).

The architecture is the factory's model (NeMo 2) or given by ``model.num_layers`` ... (NeMo 1: not read,
the MODEL passed is estimated).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, NamedTuple

from memest.errors import InputError
from memest.workload.config import Framework, Method, Optimizer, Precision, Recompute, Stack
from memest.workload.files import _shell
from memest.workload.files._common import Found
from memest.workload.files._common import key_lines as _doc_lines
from memest.workload.files.megatron import data_parallel

NAME = ("a NeMo launch line ('nemo llm pretrain --factory NAME key=value', 'python megatron_gpt_pretraining.py "
        "key=value') or a NeMo 1 megatron_gpt_config.yaml")
COMMAND = True
"""Besides a YAML, a script with a ``nemo llm`` or ``megatron_gpt_pretraining.py`` line."""
COMMIT = "8cfedd7203462cb251a914e700e5605444277561"
"""The NVIDIA/NeMo commit the defaults below are read from."""


class Factory(NamedTuple):
    """A NeMo 2 recipe's defaults (``nemo/collections/llm/recipes/NAME.py``).

    Attributes:
        model: The Hub model it trains (its ``finetune_recipe``'s ``resume_path``; the pretrain recipe builds the
            same architecture from its config class).
        pretrain: ``pretrain_recipe``'s ``trainer(...)`` parallelism: (tp, pp, virtual pp, cp, sequence_parallel).
        lora_dim: ``finetune_recipe``'s ``recipe.peft.dim`` under ``peft_scheme`` lora / dora.
        full: ``finetune_recipe`` with ``peft_scheme`` none: (tp, pp, num_nodes when not given).
        lora: with lora / dora: (tp, pp, num_nodes when not given).
    """

    model: str
    pretrain: tuple[int, int, int | None, int, bool]
    lora_dim: int
    full: tuple[int, int, int]
    lora: tuple[int, int, int]


FACTORIES = {
    # llama3_8b.py / llama31_8b.py: trainer(tensor_parallelism=1, pipeline_parallelism=1,
    # virtual_pipeline_parallelism=None, context_parallelism=2, sequence_parallelism=False); finetune: lora
    # peft.dim 8, none -> tensor_model_parallel_size 2
    "llama3_8b": Factory("meta-llama/Meta-Llama-3-8B", (1, 1, None, 2, False), 8, (2, 1, 1), (1, 1, 1)),
    "llama31_8b": Factory("meta-llama/Llama-3.1-8B", (1, 1, None, 2, False), 8, (2, 1, 1), (1, 1, 1)),
    # llama3_70b.py / llama31_70b.py: trainer(4, 4, virtual 5, context 2, sequence_parallelism=True); finetune:
    # none -> tp 8, pp 4, num_nodes 4; lora / dora -> peft.dim 16, tp 8, num_nodes 1
    "llama3_70b": Factory("meta-llama/Meta-Llama-3-70B", (4, 4, 5, 2, True), 16, (8, 4, 4), (8, 1, 1)),
    "llama31_70b": Factory("meta-llama/Llama-3.1-70B", (4, 4, 5, 2, True), 16, (8, 4, 4), (8, 1, 1)),
}
"""The NeMo 2 factories memest knows (at :data:`COMMIT`). Every one: ``num_gpus_per_node`` 8, ``num_nodes`` 1
(pretrain), ``plugins=bf16_mixed()``, ``distributed_fused_adam_with_cosine_annealing`` (``use_distributed_optimizer
=True``); pretrain data ``MockDataModule(seq_length=8192, global_batch_size=512, micro_batch_size=1)``; finetune
(``finetune_default.py`` ``default_finetune_recipe``) ``SquadDataModule(seq_length=2048, global_batch_size=128,
micro_batch_size=1)``, packed ``global_batch_size=8``, ``seq_length`` 2048 (4096 packed), context parallelism
1, no sequence parallelism, and under LoRA ``use_distributed_optimizer = False``."""

NEMO1_DEFAULTS = {
    "trainer.devices": 1, "trainer.num_nodes": 1, "trainer.precision": "bf16", "model.micro_batch_size": 4,
    "model.global_batch_size": 8, "model.tensor_model_parallel_size": 1, "model.pipeline_model_parallel_size": 1,
    "model.expert_model_parallel_size": 1, "model.encoder_seq_length": 512, "model.megatron_amp_O2": True,
    "model.sequence_parallel": False, "model.activations_checkpoint_granularity": None,
    "model.optim.name": "fused_adam",
}
"""``megatron_gpt_config.yaml`` (at :data:`COMMIT`) values of the keys read, which ``megatron_gpt_pretraining.py``
(``@hydra_runner(config_path="conf", config_name="megatron_gpt_config")``) runs with unless overridden."""
_NEMO1_CONFIG = "megatron_gpt_config"

IGNORED = {
    "trainer.strategy.virtual_pipeline_model_parallel_size": ("interleaved pipeline stages (more micro-batches in "
                                                              "flight)", None),
    "model.config.recompute_num_layers": ("the layers recomputed per stage (recompute_method block: only that many)",
                                          None),
    "model.config.cpu_offloading": ("activations and weights offloaded to host memory", False),
    "optim.config.optimizer_cpu_offload": ("optimizer states in host memory", False),
    "model.virtual_pipeline_model_parallel_size": ("interleaved pipeline stages (more micro-batches in flight)", None),
    "model.cpu_offloading": ("activations and weights offloaded to host memory", False),
    "model.fp8": ("fp8 linears (low-precision activations)", False),
}
"""Memory-relevant keys memest does not model -> (what they size, NeMo's default)."""
READS = ("trainer.devices", "trainer.num_nodes", "trainer.strategy.tensor_model_parallel_size",
         "trainer.strategy.pipeline_model_parallel_size", "trainer.strategy.context_parallel_size",
         "trainer.strategy.expert_model_parallel_size", "trainer.strategy.sequence_parallel", "data.micro_batch_size",
         "data.global_batch_size", "data.seq_length", "trainer.plugins", "optim.config.use_distributed_optimizer",
         "optim.config.optimizer", "model.config.recompute_granularity", "peft", "peft.dim",
         *(key for key in NEMO1_DEFAULTS if key.startswith("model.")), "trainer.precision",
         "model.context_parallel_size", "model.activations_checkpoint_method",
         "model.activations_checkpoint_num_layers")

_PLUGINS = {"bf16_mixed": Precision.MIXED, "bf16-mixed": Precision.MIXED, "fp16_mixed": Precision.FP16,
            "16-mixed": Precision.FP16, "32": Precision.FP32, "32-true": Precision.FP32}
"""NeMo 2 precision plugins (``recipes/precision/mixed_precision.py``) and ``MegatronMixedPrecision.precision``
values -> memest's recipe (bf16 / fp16 params, fp32 main_grad and master)."""
_FP8_PLUGINS = ("bf16_with_fp8_mixed", "bf16_with_fp8_current_scaling_mixed", "bf16_with_mxfp8_mixed",
                "bf16_with_fp8_subchannel_scaling_mixed", "fp16_with_fp8_mixed")
_NEMO1_HALF = {"bf16": Precision.MIXED, "bf16-mixed": Precision.MIXED, "16": Precision.FP16,
               "16-mixed": Precision.FP16, "32": Precision.FP32, "32-true": Precision.FP32}
_SHARDED_OPTIM = ("distributed_fused_adam", "mcore_distributed_optim")
_ADAM_OPTIM = ("fused_adam", "adam", "adamw", *_SHARDED_OPTIM)
_NEMO2 = re.compile(r"(^|/)nemo$")
_NEMO1 = re.compile(r"(^|/)megatron_gpt_pretraining\.py$")
_OVERRIDE = re.compile(r"^[+~]{0,2}([A-Za-z_][\w.]*)=(.*)$", re.S)
_VALUED = frozenset({"factory", "f", "config-name", "config-path", "cn", "cp", "name", "n"})
"""Options that take a value (nemo_run's ``--factory`` / ``-f``; Hydra's ``--config-name`` / ``-cn``,
``--config-path`` / ``-cp``); every other option is a switch (``-y``, ``--yes``, ``--dryrun``)."""


class Launch(dict[str, Any]):
    """A launch line as the nested keys it sets (the factory's or the YAML's defaults under them).

    Attributes:
        version: 2 (``nemo llm``) or 1 (a NeMo 1 script).
        command: ``pretrain`` / ``finetune`` (NeMo 2), or the script's name.
        factory: The ``--factory`` text as written (None when none).
        options: The line's ``--options`` (no dashes) -> value (True for a switch).
        source: Dotted key -> where its value came from when the line did not set it (``--factory llama3_8b``).
        lines: Dotted key (and each ``source``) -> its line (from 1).
        blocked: The variables the line uses that the script also sets inside a block (see :mod:`._shell`).
        line: The line's first line (from 1).
    """

    version: int = 2
    command: str = ""
    factory: str | None = None
    options: dict[str, Any]
    source: dict[str, str]
    lines: dict[str, int]
    blocked: tuple[str, ...] = ()
    line: int = 0


def _match(words: list[str]) -> tuple[int, int] | None:
    """(NeMo generation, index of the first word after the program) of a NeMo launch, else None."""
    for i, word in enumerate(words):
        if _NEMO2.search(word) and words[i + 1:i + 2] == ["llm"] and words[i + 2:i + 3] in (["pretrain"],
                                                                                          ["finetune"]):
            return 2, i + 3
        if _NEMO1.search(word) and any(re.search(r"(^|/)(python[\d.]*|torchrun)$", w) for w in words[:i]):
            return 1, i + 1
    return None


def _command(text: str) -> tuple[int, list[str], int, int, tuple[str, ...]] | None:
    for number, words, blocked in _shell.commands(text):
        found = _match(words)
        if found is not None:
            return number, words, found[0], found[1], blocked
    return None


def detect(doc: Any, text: str) -> bool:
    """Whether the file is a NeMo launch line, or a NeMo 1 config (``trainer`` and ``model`` mappings, the model
    with Megatron keys)."""
    if isinstance(doc, dict):
        model = doc.get("model")
        return isinstance(doc.get("trainer"), dict) and isinstance(model, dict) and bool(
            {"tensor_model_parallel_size", "encoder_seq_length", "megatron_amp_O2"} & set(model))
    return _command(text) is not None


def _set(doc: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    for part in parents:
        if not isinstance(doc.get(part), dict):
            doc[part] = {} if doc.get(part) is None else {"": doc[part]}
        doc = doc[part]
    if isinstance(doc.get(last), dict):  # trainer.plugins=fp16_mixed over the factory's plugin attributes
        doc[last][""] = value
    else:
        doc[last] = value


def document(path: Path, doc: Any, text: str) -> Any:
    """The launch line as a :class:`Launch` (a NeMo 1 YAML stays as parsed)."""
    if isinstance(doc, dict):
        return doc
    found = _command(text)
    assert found is not None
    number, words, version, after, blocked = found
    out = Launch()
    out.version, out.options, out.source, out.lines = version, {}, {}, {}
    out.command = words[after - 1] if version == 2 else Path(words[after - 1]).name
    overrides: list[tuple[str, str]] = []
    i = after
    while i < len(words):
        word = words[i]
        if word in ("|", "||", "&&", ";", "&") or re.match(r"^\d?[<>]", word):
            break
        if word.startswith("-") and len(word) > 1:
            name, eq, value = word.lstrip("-").partition("=")
            if eq:
                out.options[name] = value
            elif name in _VALUED and i + 1 < len(words):
                out.options[name] = words[i + 1]
                i += 1
            else:
                out.options[name] = True
        else:
            override = _OVERRIDE.match(word)
            if override:
                overrides.append((override.group(1), override.group(2)))
        i += 1
    out.factory = out.options.get("factory", out.options.get("f")) if version == 2 else None
    if isinstance(out.factory, str):
        where = f"--factory {out.factory}"
        out.lines[where] = number
        for key, value in _factory_defaults(path, out.factory, out.command).items():
            _set(out, key, value)
            out.source[key] = where
    if version == 1 and str(out.options.get("config-name", out.options.get("cn", _NEMO1_CONFIG))) == _NEMO1_CONFIG:
        for key, value in NEMO1_DEFAULTS.items():
            _set(out, key, value)
            out.source[key] = f"{_NEMO1_CONFIG}.yaml {key}"
    for key, value in overrides:
        _set(out, key, value)
        out.source.pop(key, None)
        out.lines.setdefault(key, _line_of(text, key + "=", number))
    out.blocked, out.line = blocked, number
    return out


def _line_of(text: str, needle: str, default: int) -> int:
    pattern = re.compile(rf"(?<![\w.]){re.escape(needle)}")
    for number, line in enumerate(text.splitlines(), 1):
        if not line.lstrip().startswith("#") and pattern.search(line):
            return number
    return default


def key_lines(text: str, doc: Any) -> dict[str, int]:
    """The line of each key: a launch line's overrides where written, a YAML's keys where they sit."""
    return dict(doc.lines) if isinstance(doc, Launch) else _doc_lines(text, doc)


def _factory_call(path: Path, factory: str) -> tuple[str, dict[str, Any]]:
    """``NAME`` or ``NAME(key=value, ...)`` -> (NAME, the arguments).

    Raises:
        InputError: arguments that are not literals.
    """
    try:
        call = ast.parse(factory.strip(), mode="eval").body
    except SyntaxError:
        call = None
    if isinstance(call, ast.Name):
        return call.id, {}
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and not call.args:
        try:
            return call.func.id, {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
        except ValueError:
            pass
    raise InputError(f"{{config}} {path}: the NeMo factory {factory!r} is not NAME or NAME(key=value, ...) with "
                     "literal values", field="config")


def _peft_scheme(args: dict[str, Any]) -> str:
    scheme = args.get("peft_scheme", "lora")
    return "none" if scheme is None else str(scheme).lower()


def _factory_defaults(path: Path, factory: str, command: str) -> dict[str, Any]:
    """The keys a known factory's recipe sets (:data:`FACTORIES`), by dotted key; {} for one memest does not know."""
    name, args = _factory_call(path, factory)
    known = FACTORIES.get(name)
    if known is None:
        return {}
    out: dict[str, Any] = {"trainer.devices": args.get("num_gpus_per_node", 8), "trainer.plugins": "bf16_mixed",
                           "optim.config.use_distributed_optimizer": True, "optim.config.optimizer": "adam",
                           "data.micro_batch_size": 1}
    if command == "pretrain":
        tp, pp, vpp, cp, sp = known.pretrain
        out |= {"trainer.num_nodes": args.get("num_nodes", 1), "data.seq_length": 8192, "data.global_batch_size": 512}
    else:
        scheme = _peft_scheme(args)
        packed = bool(args.get("packed_sequence", args.get("performance_mode", False)))
        tp, pp, nodes = known.full if scheme == "none" else known.lora
        vpp, cp, sp = None, 1, False
        out |= {"trainer.num_nodes": args.get("num_nodes") or nodes,
                "data.seq_length": args.get("seq_length") or (4096 if packed else 2048),
                "data.global_batch_size": 8 if packed else 128}
        if scheme in ("lora", "dora"):
            out |= {"peft": scheme, "peft.dim": known.lora_dim, "optim.config.use_distributed_optimizer": False}
    out |= {"trainer.strategy.tensor_model_parallel_size": tp, "trainer.strategy.pipeline_model_parallel_size": pp,
            "trainer.strategy.virtual_pipeline_model_parallel_size": vpp,
            "trainer.strategy.context_parallel_size": cp, "trainer.strategy.sequence_parallel": sp}
    return out


class _Reader:
    """The settings of one NeMo document, with where each was read."""

    def __init__(self, path: Path, doc: dict[str, Any]) -> None:
        self.path, self.doc = path, doc
        self.values: dict[str, Any] = {"stack": Stack.NEMO, "framework": Framework.MEGATRON}
        self.origins: dict[str, str] = {}
        self.notes: list[str] = []
        self.source: dict[str, str] = getattr(doc, "source", {})

    def get(self, key: str) -> Any:
        value: Any = self.doc
        for part in key.split("."):
            if not isinstance(value, dict) or part not in value:
                return None
            value = value[part]
        return value.get("") if isinstance(value, dict) else value

    def where(self, key: str) -> str:
        return self.source.get(key, key)

    def put(self, setting: str, value: Any, key: str) -> None:
        self.values[setting], self.origins[setting] = value, self.where(key)

    def integer(self, key: str) -> int | None:
        value = self.get(key)
        return None if value is None else _shell.integer(self.path, key, value)

    def switch(self, key: str) -> bool:
        value = self.get(key)
        return False if value is None else _shell.boolean(self.path, key, value)


def read(path: Path, doc: dict[str, Any]) -> Found:
    """The training settings a NeMo launch line or NeMo 1 config implies."""
    r = _Reader(path, doc)
    model = None
    if isinstance(doc, Launch) and doc.version == 2:
        model = _nemo2(r, doc)
    else:
        _nemo1(r)
    if isinstance(doc, Launch):
        r.notes += _shell.blocked_note(path, doc)  # type: ignore[arg-type]  # it reads .blocked only
    return Found(r.values, r.notes, model, r.origins)


def _nemo2(r: _Reader, doc: Launch) -> str | None:
    """NeMo 2: the factory's model and mode, then the keys of :data:`READS` it and the line set."""
    model = None
    name, args = _factory_call(r.path, doc.factory) if isinstance(doc.factory, str) else (None, {})
    factory = FACTORIES.get(name) if name else None
    where = f"--factory {doc.factory}"
    if factory is not None:
        model = factory.model
        r.origins["model"] = where
        unread = sorted(set(args) - {"num_nodes", "num_gpus_per_node", "peft_scheme", "seq_length",
                                     "packed_sequence", "performance_mode", "name", "dir"})
        if unread:
            r.notes.append(f"{r.path.name}: --factory {name} arguments {', '.join(unread)} are not read")
        if args.get("performance_mode"):
            r.notes.append(f"{r.path.name}: --factory {name} performance_mode=True changes the recipe further "
                           "(grad_reduce_in_fp32 False, its callbacks): memest reads the recipe without them")
    else:
        read_keys = sorted(k for k in _flat(doc) if k in READS)
        known = ", ".join(sorted(FACTORIES))
        said = f"--factory {name}" if name else "no --factory"
        r.notes.append(f"{r.path.name}: {said} is not a NeMo recipe memest knows (it knows {known}): its defaults "
                       f"are not read, only the line's {', '.join(read_keys) if read_keys else 'keys (none it reads)'}"
                       "; pass MODEL and the rest as flags")
    if doc.command == "pretrain":
        r.values["train"], r.origins["train"] = True, where if name else "pretrain"
    else:
        scheme = str(r.get("peft") or "").lower() if r.get("peft") is not None else \
            (_peft_scheme(args) if factory is not None or "peft_scheme" in args else "")
        if scheme in ("", "lora", "dora"):
            if not scheme:
                r.notes.append(f"{r.path.name}: finetune of a recipe memest does not know: memest assumes LoRA "
                               "(peft_scheme='lora', most NeMo finetune recipes' default)")
            r.values["finetune"], r.origins["finetune"] = Method.LORA, r.where("peft") if r.get("peft") else where
            r.values["lora_targets"], r.origins["lora_targets"] = "all-linear", r.origins["finetune"]
            r.values["lora_dropout"], r.origins["lora_dropout"] = 0.0, r.origins["finetune"]
            dim = r.integer("peft.dim")
            if dim is not None:
                r.put("lora_rank", dim, "peft.dim")
            if scheme == "dora":
                r.notes.append(f"{r.path.name}: peft_scheme dora is estimated as LoRA (DoRA's magnitude vectors "
                               "and its weight-norm activations are not counted)")
        else:
            r.values["train"], r.origins["train"] = True, where
    degrees = _parallel(r, "trainer.strategy.")
    if r.get("trainer.strategy.sequence_parallelism") is not None:
        r.notes.append(f"{r.path.name}: trainer.strategy.sequence_parallelism is no argument of MegatronStrategy "
                       "(its switch is sequence_parallel): not read")
    for key in ("model.config.context_parallel_size", "model.config.tensor_model_parallel_size",
                "model.config.pipeline_model_parallel_size"):
        if r.get(key) is not None:
            r.notes.append(f"{r.path.name}: {key} is set from trainer.strategy when the model is set up: not read "
                           f"(set trainer.strategy.{key.rsplit('.', 1)[1]})")
    micro = r.integer("data.micro_batch_size")
    if micro is not None:
        r.put("micro_batch_size", micro, "data.micro_batch_size")
    seq = r.integer("data.seq_length")
    if seq is not None:
        r.put("seq_len", seq, "data.seq_length")
    plugin = r.get("trainer.plugins.precision") or r.get("trainer.plugins")
    if plugin is not None:
        key = "trainer.plugins.precision" if r.get("trainer.plugins.precision") else "trainer.plugins"
        text = str(plugin)
        if text in _FP8_PLUGINS:
            r.notes.append(f"{r.path.name}: {key} {text}: memest estimates the bf16 recipe (fp8 linears not modelled)")
            text = "fp16_mixed" if text.startswith("fp16") else "bf16_mixed"
        if text not in _PLUGINS:
            r.notes.append(f"{r.path.name}: {key} {text} is not a precision memest knows (it knows "
                           f"{', '.join(_PLUGINS)}); the stack's bf16_mixed is used")
        else:
            r.put("precision", _PLUGINS[text], key)
    if r.switch("optim.config.use_distributed_optimizer"):
        r.put("zero_stage", 1, "optim.config.use_distributed_optimizer")
    _optimizer(r, "optim.config.optimizer", ("adam",))
    _recompute(r, "model.config.recompute_granularity")
    devices, nodes = r.integer("trainer.devices"), r.integer("trainer.num_nodes") or 1
    data_parallel(r.path, r.put, r.notes, degrees, (devices, nodes) if devices else None, micro,
                  r.integer("data.global_batch_size"), starts="trainer.devices x trainer.num_nodes start",
                  gpus_key="trainer.devices", total_key="data.global_batch_size",
                  total_words="data.global_batch_size", micro_words="data.micro_batch_size")
    return model


def _parallel(r: _Reader, prefix: str) -> dict[str, int]:
    """The Megatron parallel degrees under ``prefix`` (NeMo 2 ``trainer.strategy.``: MegatronStrategy's arguments;
    NeMo 1 ``model.``), put as memest's settings, and ``sequence_parallel`` where tensor parallelism is on
    (Megatron ignores it at tp 1). Returns tp / pp / cp (1 where not given) for the data-parallel arithmetic."""
    degrees = {"tp": 1, "pp": 1, "cp": 1}
    for key, setting in (("tensor_model_parallel_size", "tp"), ("pipeline_model_parallel_size", "pp"),
                         ("context_parallel_size", "cp"), ("expert_model_parallel_size", "ep")):
        value = r.integer(prefix + key)
        if value is not None:
            r.put(setting, value, prefix + key)
            degrees[setting] = value
    if r.switch(prefix + "sequence_parallel") and degrees["tp"] > 1:
        r.put("sequence_parallel", True, prefix + "sequence_parallel")
    return degrees

def _nemo1(r: _Reader) -> None:
    """NeMo 1: the ``trainer`` / ``model`` keys of :data:`READS`."""
    r.values["train"], r.origins["train"] = True, getattr(r.doc, "command", "") or "model"
    degrees = _parallel(r, "model.")
    micro = r.integer("model.micro_batch_size")
    if micro is not None:
        r.put("micro_batch_size", micro, "model.micro_batch_size")
    seq = r.integer("model.encoder_seq_length")
    if seq is not None:
        r.put("seq_len", seq, "model.encoder_seq_length")
    precision = r.get("trainer.precision")
    if precision is not None:
        text = str(precision)
        if text not in _NEMO1_HALF:
            raise InputError(f"{{config}} {r.path}: trainer.precision is {precision!r}; expected "
                             f"{', '.join(_NEMO1_HALF)}", field="config")
        half = _NEMO1_HALF[text]
        o2 = r.switch("model.megatron_amp_O2")
        # megatron_gpt_model.py: enable_autocast = not megatron_amp_O2 and autocast_dtype in (fp16, bf16)
        r.put("precision", half if o2 or half is Precision.FP32 else Precision.AMP, "trainer.precision")
    optim = r.get("model.optim.name")
    if optim is not None and str(optim) in _SHARDED_OPTIM:
        r.put("zero_stage", 1, "model.optim.name")
    _optimizer(r, "model.optim.name", _ADAM_OPTIM)
    granularity = r.get("model.activations_checkpoint_granularity")
    _recompute(r, "model.activations_checkpoint_granularity")
    method, layers = r.get("model.activations_checkpoint_method"), r.get("model.activations_checkpoint_num_layers")
    if str(granularity) == "full" and (str(method) != "uniform" or str(layers) not in ("1", "None")):
        r.notes.append(f"{r.path.name}: model.activations_checkpoint_method {method} with "
                       f"activations_checkpoint_num_layers {layers}: memest models full recompute of every layer "
                       "one at a time (method uniform, 1 layer)")
    data_parallel(r.path, r.put, r.notes, degrees, _launched(r), micro, r.integer("model.global_batch_size"),
                  starts="trainer.devices x trainer.num_nodes start", gpus_key="trainer.devices",
                  total_key="model.global_batch_size", total_words="model.global_batch_size",
                  micro_words="model.micro_batch_size")
    shape = [f"model.{k} {r.get('model.' + k)}" for k in ("num_layers", "hidden_size", "num_attention_heads")
             if r.get("model." + k) is not None]
    if shape:
        r.notes.append(f"{r.path.name}: the architecture is given by keys ({', '.join(shape)}), not read: memest "
                       "estimates the MODEL passed (a Hub id or config.json of that architecture)")


def _launched(r: _Reader) -> tuple[int, int] | None:
    devices = r.get("trainer.devices")
    if devices is None or (isinstance(devices, str) and not devices.isdigit()):  # -1 / "auto": every visible one
        return None
    count = r.integer("trainer.devices")
    return (count, r.integer("trainer.num_nodes") or 1) if count and count > 0 else None


def _optimizer(r: _Reader, key: str, adam: tuple[str, ...]) -> None:
    name = r.get(key)
    if name is None or str(name) in adam:
        return  # the stack's fused Adam
    if str(name) == "sgd":
        r.put("optimizer", Optimizer.SGD_MOMENTUM, key)  # Megatron OptimizerConfig.sgd_momentum 0.9
        return
    r.notes.append(f"{r.path.name}: {key} {name} is not modelled (memest models {', '.join(adam)} and sgd); the "
                   "stack's Adam is used")


def _recompute(r: _Reader, key: str) -> None:
    granularity = r.get(key)
    if granularity is None or str(granularity) in ("None", "null"):
        return
    if str(granularity) not in ("full", "selective"):
        raise InputError(f"{{config}} {r.path}: {key} is {granularity!r}; expected full, selective or null",
                         field="config")
    r.put("recompute", Recompute(str(granularity)), key)


def _flat(doc: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in doc.items():
        name = f"{prefix}{key}" if key else prefix.rstrip(".")
        out += _flat(value, name + ".") if isinstance(value, dict) else [name]
    return out
