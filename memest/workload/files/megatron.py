"""A Megatron-LM launch line (``torchrun ... pretrain_gpt.py --flags``) in a shell script or text file.

Flags read (``megatron/training/arguments.py``): ``--tensor-model-parallel-size``,
``--pipeline-model-parallel-size``, ``--context-parallel-size``, ``--expert-model-parallel-size``,
``--sequence-parallel`` (off at tensor parallelism 1: "Disabling sequence parallelism because tensor model
parallelism is disabled"), ``--micro-batch-size``, ``--global-batch-size`` (gradient accumulation: global /
(micro x data-parallel degree)), ``--seq-length``, ``--bf16`` / ``--fp16`` (bf16 / fp16 parameters with fp32
``main_grad`` and master weights; neither: fp32), ``--use-distributed-optimizer`` (master weights and Adam
states sharded over the data-parallel ranks: ZeRO-1), ``--recompute-granularity`` (``full``, ``selective``)
and the older ``--recompute-activations`` (selective), ``--optimizer`` (``adam``; ``sgd`` with
``--sgd-momentum`` 0.9 by default); and the launcher's ``--nproc_per_node`` x ``--nnodes`` (torchrun) as the
device count when the parallel degrees divide it.

The architecture is given by flags (``--num-layers``, ``--hidden-size``, ...), not by a model name: the model
is passed as MODEL (a Hub id or config.json of that architecture).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memest.workload.config import Framework, Optimizer, Precision, Recompute, Stack
from memest.workload.files import _shell
from memest.workload.files._common import Found

NAME = "a Megatron-LM launch line ('torchrun ... pretrain_gpt.py --flags')"
COMMAND = True
"""A script with a ``pretrain_*.py`` launch line (which need not parse as YAML)."""
READS = ("tensor-model-parallel-size", "pipeline-model-parallel-size", "context-parallel-size",
         "expert-model-parallel-size", "sequence-parallel", "micro-batch-size", "global-batch-size", "seq-length",
         "bf16", "fp16", "use-distributed-optimizer", "recompute-granularity", "recompute-activations",
         "optimizer", "nproc_per_node", "nnodes")
IGNORED = {
    "num-layers-per-virtual-pipeline-stage": ("interleaved pipeline stages (more micro-batches in flight)", None),
    "num-virtual-stages-per-pipeline-rank": ("interleaved pipeline stages (more micro-batches in flight)", None),
    "fp8-format": ("fp8 linears (low-precision activations)", None),
    "cpu-offloading": ("activations and weights offloaded to host memory", False),
    "optimizer-cpu-offload": ("optimizer states in host memory", False),
    "recompute-num-layers": ("the layers recomputed per stage (--recompute-method block: only that many)", None),
    "moe-layer-recompute": ("MoE layers recomputed", False),
    "decoder-first-pipeline-num-layers": ("uneven pipeline stages", None),
    "decoder-last-pipeline-num-layers": ("uneven pipeline stages", None),
}
"""Memory-relevant flags memest does not model -> (what they size, Megatron-LM's default)."""
_ARCHITECTURE = ("num-layers", "hidden-size", "num-attention-heads", "ffn-hidden-size", "num-query-groups")


_LAUNCHERS = re.compile(r"(^|/)(python[\d.]*|torchrun|deepspeed|torch\.distributed\.(run|launch))$")


def _launch(words: list[str], i: int) -> int:
    """The index after a ``pretrain_*.py`` script at ``i`` (Megatron-LM's entry points) run by a launcher
    (python, torchrun, ``python -m torch.distributed.run``; not a ``[ -f pretrain_gpt.py ]`` test), else -1."""
    if re.search(r"(^|/)pretrain_\w+\.py$", words[i]) and any(_LAUNCHERS.search(w) for w in words[:i]):
        return i + 1
    return -1


def detect(doc: Any, text: str) -> bool:
    """Whether the file holds a Megatron-LM launch line."""
    return not isinstance(doc, dict) and _shell.find(text, _launch) is not None


def document(path: Path, doc: Any, text: str) -> Any:
    """The launch line's flags (:class:`_shell.Flags`), the launcher's (torchrun's) among them."""
    flags = _shell.find(text, _launch)
    assert flags is not None
    for name in ("nproc_per_node", "nproc-per-node", "nnodes"):
        if name in flags.before:
            flags.setdefault(name.replace("-", "_"), flags.before[name])
    return flags


def key_lines(text: str, doc: Any) -> dict[str, int]:
    """The line each flag is written on."""
    return _shell.flag_lines(text, doc) if isinstance(doc, _shell.Flags) else {}


def read(path: Path, doc: dict[str, Any]) -> Found:
    """The training settings the launch line implies."""
    program = getattr(doc, "program", "pretrain_gpt.py")
    values: dict[str, Any] = {"train": True, "stack": Stack.MEGATRON, "framework": Framework.MEGATRON}
    origins: dict[str, str] = {}
    notes: list[str] = []

    def put(setting: str, value: Any, key: str) -> None:
        values[setting], origins[setting] = value, key

    def integer(key: str) -> int | None:
        return _shell.integer(path, key, doc[key]) if key in doc else None

    degrees = {"tp": 1, "pp": 1, "cp": 1}
    for key, setting in (("tensor-model-parallel-size", "tp"), ("pipeline-model-parallel-size", "pp"),
                         ("context-parallel-size", "cp"), ("expert-model-parallel-size", "ep")):
        value = integer(key)
        if value is not None:
            put(setting, value, key)
            degrees[setting] = value
    if doc.get("sequence-parallel") and degrees["tp"] > 1:  # Megatron-LM turns it off at tp 1 (arguments.py)
        put("sequence_parallel", True, "sequence-parallel")
    micro = integer("micro-batch-size")
    if micro is not None:
        put("micro_batch_size", micro, "micro-batch-size")
    seq = integer("seq-length")
    if seq is not None:
        put("seq_len", seq, "seq-length")
    precision = Precision.MIXED if doc.get("bf16") else Precision.FP16 if doc.get("fp16") else Precision.FP32
    put("precision", precision, "bf16" if doc.get("bf16") else "fp16" if doc.get("fp16") else program)
    if doc.get("use-distributed-optimizer"):
        put("zero_stage", 1, "use-distributed-optimizer")
    granularity = doc.get("recompute-granularity")
    if granularity in ("full", "selective"):
        put("recompute", Recompute(granularity), "recompute-granularity")
    elif doc.get("recompute-activations"):
        put("recompute", Recompute.SELECTIVE, "recompute-activations")
    optimizer = str(doc.get("optimizer", "adam"))
    if optimizer == "sgd":
        momentum = _shell.number(path, "sgd-momentum", doc.get("sgd-momentum", "0.9"))
        put("optimizer", Optimizer.SGD_MOMENTUM if momentum > 0 else Optimizer.SGD, "optimizer")
    elif optimizer != "adam":
        notes.append(f"{path.name}: --optimizer {optimizer} is not modelled (memest models adam and sgd); the "
                     "stack's Adam is used")
    per_node, nodes = doc.get("nproc_per_node"), doc.get("nnodes", "1")
    launched = None
    if isinstance(per_node, str) and per_node.isdigit() and isinstance(nodes, str) and nodes.isdigit():
        launched = (int(per_node), int(nodes))
    data_parallel(path, put, notes, degrees, launched, micro, integer("global-batch-size"),
                  starts="the launcher starts", gpus_key="nproc_per_node", total_key="global-batch-size",
                  total_words="--global-batch-size", micro_words="micro-batch-size")
    if isinstance(doc, _shell.Flags):
        notes += _shell.blocked_note(path, doc)
    shape = [f"--{k} {doc[k]}" for k in _ARCHITECTURE if k in doc]
    if shape:
        notes.append(f"{path.name}: the architecture is given by flags ({', '.join(shape)}), not read: memest "
                     "estimates the MODEL passed (a Hub id or config.json of that architecture)")
    return Found(values, notes, None, origins)


def data_parallel(path: Path, put: Callable[[str, Any, str], None], notes: list[str], degrees: dict[str, int],
                  launched: tuple[int, int] | None, micro: int | None, total: int | None, *, starts: str,
                  gpus_key: str, total_key: str, total_words: str, micro_words: str) -> None:
    """The device count and the accumulation steps of a Megatron job (Megatron-LM, NeMo): ``launched`` =
    (processes per node, nodes) is the device count when tp x pp x cp divides it (else a note); the global
    batch accumulates ``total / (micro x dp)`` micro-batches, dp = devices / (tp x pp x cp)
    (``megatron/training/arguments.py``: ``data_parallel_size = world_size // (tp * pp * cp)``;
    ``num_microbatches = global_batch_size // (micro_batch_size * data_parallel_size)``), when it divides
    (else a note: accumulation as given)."""
    group = degrees["tp"] * degrees["pp"] * degrees["cp"]
    gpus = None
    if launched is not None:
        per_node, nodes = launched
        if (per_node * nodes) % group == 0:
            gpus = per_node * nodes
            put("gpus", gpus, gpus_key)
        else:
            notes.append(f"{path.name}: {starts} {per_node} x {nodes} = {per_node * nodes} processes, not a "
                         f"multiple of tp x pp x cp = {group}; pass the job's gpus")
    if total is not None and micro is not None:
        if gpus is not None and total % (micro * (gpus // group)) == 0:
            put("grad_accum_steps", total // (micro * (gpus // group)), total_key)
        else:
            notes.append(f"{path.name}: {total_words} {total} accumulates {total} / ({micro_words} {micro} "
                         "x the data-parallel degree) micro-batches; memest uses grad_accum_steps as given")
