"""vLLM's serve settings: a ``vllm serve --config`` YAML, or a ``vllm serve MODEL --flags`` command line in a
shell script or text file (``python -m vllm.entrypoints.openai.api_server --model MODEL ...`` too).

The YAML's keys are the long CLI flags, with dashes or underscores (``vllm/utils/argparse_utils.py``
``FlexibleArgumentParser``: each key becomes ``--key``, and the parser takes ``_`` for ``-``). Keys read
(``vllm/engine/arg_utils.py`` ``EngineArgs``): ``model`` (or the command's positional model),
``tensor_parallel_size`` (``-tp``), ``pipeline_parallel_size`` (``-pp``), ``data_parallel_size`` (``-dp``),
``max_model_len``, ``gpu_memory_utilization``, ``max_num_seqs``, ``max_num_batched_tokens``,
``kv_cache_dtype``, ``quantization`` (``-q``), ``dtype``, ``enforce_eager``, ``block_size``. The job is
serving on vLLM over tp x pp x dp devices. A command's ``--config FILE`` is read too, its keys giving way
to the command's flags ("command line > config file values > defaults", ``docs/configuration/serve_args.md``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from memest.workload.config import Engine
from memest.workload.files import _shell
from memest.workload.files._common import Found, Include
from memest.workload.files._common import key_lines as _doc_lines

NAME = "a vLLM serve YAML or a 'vllm serve MODEL --flags' command line"
COMMAND = True
"""Besides a YAML, a script with a ``vllm serve`` line (which need not parse as YAML)."""
MARKERS = frozenset({"tensor_parallel_size", "pipeline_parallel_size", "max_model_len", "gpu_memory_utilization",
                     "max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype", "enforce_eager", "served_model_name",
                     "uvicorn_log_level", "enable_prefix_caching", "swap_space", "distributed_executor_backend"})
"""Keys of ``vllm serve`` that no training recipe has (with dashes or underscores)."""
READS = ("model", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "max_model_len",
         "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype", "quantization",
         "dtype", "enforce_eager", "block_size")
_IGNORED = {
    "cpu_offload_gb": ("weights kept in host memory", 0),
    "kv_cache_memory_bytes": ("a KV cache of a fixed size, in place of gpu_memory_utilization's", None),
    "num_gpu_blocks_override": ("a KV cache of a fixed number of blocks", None),
    "speculative_config": ("a draft model's weights and KV cache", None),
    "enable_lora": ("LoRA adapters' weights and the profiling run's LoRA buffers", False),
    "enable_expert_parallel": ("experts split over tp x dp devices instead of tensor-parallel", False),
    "limit_mm_per_prompt": ("the multimodal items of the profiling run", None),
    "cuda_graph_sizes": ("the batch sizes captured as CUDA graphs", None),
    "compilation_config": ("the compiled graphs and the CUDA graphs captured", None),
}
IGNORED = _IGNORED | {key.replace("_", "-"): what for key, what in _IGNORED.items()}
"""Memory-relevant keys memest does not model -> (what they size, vLLM's default), spelled both ways."""
_ALIASES = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size", "dp": "data_parallel_size",
            "q": "quantization"}
"""vLLM's short flags (``EngineArgs.add_cli_args``: ``"--tensor-parallel-size", "-tp"``, ...)."""
_DTYPES = {"auto": "auto", "half": "fp16", "float16": "fp16", "bfloat16": "bf16", "float": "fp32",
           "float32": "fp32"}
"""vLLM ``--dtype`` choices (``ModelDType``) -> memest's weight dtype."""
_KV = {"auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2", "bfloat16": "bf16",
       "float16": "fp16"}
_QUANT = {"awq": "awq", "awq_marlin": "awq", "gptq": "gptq", "gptq_marlin": "gptq", "fp8": "fp8", "mxfp4": "mxfp4"}
"""vLLM ``--quantization`` methods -> memest's (the Marlin kernels run the same AWQ / GPTQ weights); other
methods (``compressed-tensors``, ``modelopt``, ...) name a checkpoint's own ``quantization_config``, which
memest reads from the checkpoint."""


def _human(value: str) -> str | int:
    """vLLM's ``--max-model-len`` as it reads it (``vllm/engine/arg_utils.py`` ``human_readable_int``, 0.10):
    lowercase suffixes decimal (``25.6k`` = 25,600), uppercase binary (``32K`` = 32 x 1024); else as written."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value.strip())
    if not match:
        return value
    scale = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
             "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[match.group(2)]
    return int(float(match.group(1)) * scale)


def _serve(words: list[str], i: int) -> int:
    """The index after ``vllm serve`` or ``-m vllm.entrypoints.openai.api_server`` at ``i``, else -1."""
    if words[i] == "vllm" and i + 1 < len(words) and words[i + 1] == "serve":
        return i + 2
    if words[i] == "-m" and i + 1 < len(words) and words[i + 1] == "vllm.entrypoints.openai.api_server":
        return i + 2
    return -1


def detect(doc: Any, text: str) -> bool:
    """Whether the file holds vLLM serve settings: a mapping with one of :data:`MARKERS`, or a ``vllm serve``
    command line."""
    if isinstance(doc, dict):
        return bool(MARKERS & {str(k).replace("-", "_") for k in doc})
    return _shell.find(text, _serve) is not None


def document(path: Path, doc: Any, text: str) -> Any:
    """The mapping :func:`read` reads: the YAML's, or the command line's flags (:class:`_shell.Flags`)."""
    if isinstance(doc, dict):
        return doc
    flags = _shell.find(text, _serve)
    if flags is not None and flags.positional:
        flags["model"] = flags.positional[0]
    return flags


def key_lines(text: str, doc: Any) -> dict[str, int]:
    """Each key's line: the YAML's, or the line each flag is written on."""
    return _shell.flag_lines(text, doc) if isinstance(doc, _shell.Flags) else _doc_lines(text, doc)


def read(path: Path, doc: dict[str, Any]) -> Found:
    """The serving settings the file implies."""
    values: dict[str, Any] = {"serve": True, "engine": Engine.VLLM}
    keys = {_ALIASES.get(str(k).replace("-", "_"), str(k).replace("-", "_")): k for k in doc}
    first = next(iter(doc), "model")
    origins: dict[str, str] = {"serve": first, "engine": first}
    notes: list[str] = []

    def put(setting: str, value: Any, name: str) -> None:
        values[setting], origins[setting] = value, keys[name]

    model = None
    if "model" in keys:
        model = str(doc[keys["model"]])
        origins["model"] = keys["model"]
    degrees = {}
    for name, setting in (("tensor_parallel_size", "tp"), ("pipeline_parallel_size", "pp"),
                          ("data_parallel_size", "dp")):
        if name in keys:
            degrees[setting] = _shell.integer(path, keys[name], doc[keys[name]])
            put(setting, degrees[setting], name)
    if degrees:
        gpus = degrees.get("tp", 1) * degrees.get("pp", 1) * degrees.get("dp", 1)
        values["gpus"], origins["gpus"] = gpus, keys[next(n for n in ("tensor_parallel_size", "pipeline_parallel_size",
                                                                        "data_parallel_size") if n in keys)]
    for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size"):
        if name in keys:
            value = doc[keys[name]]
            if name == "max_model_len" and isinstance(value, str):
                value = _human(value)
            put(name, _shell.integer(path, keys[name], value), name)
    if "gpu_memory_utilization" in keys:
        put("gpu_memory_utilization", _shell.number(path, keys["gpu_memory_utilization"],
                                                    doc[keys["gpu_memory_utilization"]]), "gpu_memory_utilization")
    if "enforce_eager" in keys:
        put("enforce_eager", _shell.boolean(path, keys["enforce_eager"], doc[keys["enforce_eager"]]), "enforce_eager")
    for name, table, setting in (("dtype", _DTYPES, "dtype"), ("kv_cache_dtype", _KV, "kv_cache_dtype"),
                                 ("quantization", _QUANT, "quantization")):
        if name not in keys or doc[keys[name]] is None:
            continue
        given = str(doc[keys[name]]).lower()
        if given in table:
            put(setting, table[given], name)
        elif name != "quantization" or given in ("bitsandbytes", "gguf"):
            notes.append(f"{path.name}: {keys[name]} {given} is not modelled (memest models {', '.join(table)}); "
                         f"the engine's default is used")
    if isinstance(doc, _shell.Flags):
        notes += _shell.blocked_note(path, doc)
    config = doc.get("config") if isinstance(doc, _shell.Flags) else None
    includes = (Include(str(config), key="config", yields=True),) if isinstance(config, str) else ()
    return Found(values, notes, model, origins, includes)
