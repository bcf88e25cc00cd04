"""torchtitan's training log (``torchtitan/train.py`` / ``trainer.py`` and ``components/metrics.py``).

Lines read (torchtitan v0.2.0, 2025-10, and the 2024-2025 versions that print the same text):

- ``build_device_memory_monitor``: ``CUDA capacity: NVIDIA H200 with 139.81GiB memory`` (the device and
  its total memory; ``XPU capacity`` on Intel);
- ``Building llama3 8B with TransformerModelArgs(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8,
  vocab_size=128256, multiple_of=1024, ffn_dim_multiplier=1.3, norm_eps=1e-05, rope_theta=500000, ...,
  max_seq_len=8192, ...)`` (older: ``ModelArgs(...)``): the shapes of a llama2 / llama3 model, turned
  into a config.json (:func:`llama_config`) so a flavor no catalog names (``debugmodel``) is estimated too;
- ``Model llama3 8B size: 8,030,261,248 total parameters``: the model and flavor
  (:data:`FLAVORS` names the catalog entry of torchtitan's flavors);
- ``Building 1-D device mesh with ['dp_shard'], [8]`` or ``Building device mesh with parallelism: pp=1,
  dp_replicate=1, dp_shard=8, cp=1, tp=1, ep=1``: the parallel degrees;
- ``Applied selective activation checkpointing to the model`` / ``full`` / ``FullAC`` / ``none``, ``Applied
  FSDP / HSDP / DDP to the model``;
- ``Trainer is initialized with local batch size 8, global batch size 64, gradient accumulation steps 1,
  sequence length 2048, ...`` (older: ``Training starts at step 1, with local batch size 1, global batch
  size 8, sequence length 2048, ...``): micro_batch_size, grad_accum_steps, seq_len (the data-parallel
  degree from global / (local x accumulation) where no mesh line is printed);
- ``CUDA memory usage for model: 3.77GiB(4.77%)``: reserved once the sharded model is built;
- ``step: 10  loss: ... memory: 49.66GiB(52.28%) ...``: ``device_mem_stats.max_reserved_gib``, the peak
  of ``reserved_bytes.all.peak`` since the previous logged step (``DeviceMemoryMonitor.get_peak_stats``,
  reset after each log line): the largest of them is the run's peak reserved.

GiB here is 2^30 (``DeviceMemoryMonitor._to_gib``).
"""

from __future__ import annotations

import re
from typing import Any

from memest.logs._text import GAP, NUMBER, first, keep, last, line_of, nbytes, number, size_figure
from memest.logs.record import EngineLog, Logged

FIGURE_LINES = ("step: N  loss: ...  memory: X GiB(Y%)", "memory usage for model")
"""The lines of figures named when a log has none of them."""

MARKERS = (r"\[titan\]", r"torchtitan", rf"\bstep:\s*\d+\s+loss:{GAP}memory:\s*[0-9.]+GiB\(",
           rf"(?:CUDA|XPU|ROCM) capacity: {GAP} with [0-9.]+GiB memory")

FLAVORS: dict[str, str] = {"llama3 8B": "meta-llama/Llama-3.1-8B", "llama3 70B": "meta-llama/Llama-3.1-70B",
                           "llama3 405B": "meta-llama/Llama-3.1-405B", "llama2 7B": "meta-llama/Llama-2-7b-hf",
                           "llama2 13B": "meta-llama/Llama-2-13b-hf", "llama2 70B": "meta-llama/Llama-2-70b-hf"}
"""torchtitan's model flavors (``torchtitan/models/llama3/__init__.py`` ``llama3_configs``, llama2 likewise)
-> the Hub model of the same shapes."""

RECOMPUTE = {"selective": "selective_op", "full": "full", "fullac": "full", "none": "none"}
"""``Applied {mode} activation checkpointing`` -> memest's recompute. torchtitan's 'selective' is either
``selective_ac_option = "op"`` (its llama3 8B / 70B configs) or every N-th layer checkpointed whole (its
debug config: ``'2'``); the log does not say which: memest takes 'op' and says so."""


def detect(text: str) -> bool:
    """True when ``text`` is a torchtitan log."""
    return any(re.search(m, text) for m in MARKERS)


def ffn_hidden(dim: int, multiple_of: int, ffn_dim_multiplier: float | None) -> int:
    """torchtitan's FeedForward width (``models/llama3/model/model.py``: ``int(2 * 4 * dim / 3)``, times
    ``ffn_dim_multiplier``, rounded up to ``multiple_of``)."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def _args(text: str) -> dict[str, str]:
    return dict(re.findall(r"\b(\w+)=([^,()]+)", text))


def llama_config(args: dict[str, str]) -> dict[str, Any] | None:
    """A llama config.json of torchtitan's printed ``TransformerModelArgs`` (None when a shape is missing)."""
    try:
        dim, layers, heads = int(args["dim"]), int(args["n_layers"]), int(args["n_heads"])
        vocab = int(args["vocab_size"])
    except (KeyError, ValueError):
        return None
    kv = args.get("n_kv_heads", "None")
    multiplier = args.get("ffn_dim_multiplier", "None")
    config: dict[str, Any] = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": dim, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": heads if kv == "None" else int(kv), "vocab_size": vocab,
        "intermediate_size": ffn_hidden(dim, int(args.get("multiple_of", "256")),
                                        None if multiplier == "None" else float(multiplier)),
        "tie_word_embeddings": False, "torch_dtype": "float32",
    }
    for key, name, kind in (("max_seq_len", "max_position_embeddings", int), ("norm_eps", "rms_norm_eps", float),
                            ("rope_theta", "rope_theta", float)):
        if key in args:
            config[name] = kind(args[key])
    return config


def _parallelism(text: str) -> dict[str, int]:
    """The parallel degrees of the device-mesh line."""
    degrees: dict[str, int] = {}
    mesh = last(r"Building device mesh with parallelism: ([^\n]*)", text)
    if mesh is not None:
        degrees = {k: int(v) for k, v in re.findall(r"\b(\w+)=(\d+)", mesh.group(1))}
    else:
        old = last(r"Building \d+-D device mesh with \[([^\]]*)\], \[([^\]]*)\]", text)
        if old is not None:
            names = [n.strip(" '\"") for n in old.group(1).split(",")]
            dims = [int(d) for d in old.group(2).split(",")]
            degrees = dict(zip(names, dims, strict=False))
    out: dict[str, int] = {}
    dp = degrees.get("dp_replicate", 1) * degrees.get("dp_shard", degrees.get("dp", 1))
    for name, value in (("dp", dp), ("tp", degrees.get("tp", 1)), ("pp", degrees.get("pp", 1)),
                        ("cp", degrees.get("cp", 1))):
        if degrees and value > 1:
            out[name] = value
    if degrees.get("dp_replicate", 1) > 1 and degrees.get("dp_shard", 1) > 1:
        out["dp_shard"] = degrees["dp_shard"]
    if degrees:
        out["gpus"] = max(1, dp) * degrees.get("tp", 1) * degrees.get("pp", 1) * degrees.get("cp", 1)
    return out


COLOR = re.compile(r"\x1b?\[\d+(?:;\d+)*m")
"""torchtitan's terminal colors (``utils.Color``: ``\033[31m``), which logs pasted without the escape byte keep
as ``[31m``."""


def parse(text: str) -> EngineLog:
    """The job and the figures of a torchtitan training log (rank 0's lines)."""
    text = COLOR.sub("", text)
    settings: dict[str, Any] = _parallelism(text)
    notes: list[str] = []
    assumed: list[str] = []
    init = first(r"(?:Trainer is initialized with|Training starts at step \d+, with) local batch size (\d+), "
                 r"global batch size (\d+)(?:, gradient[ _]accumulation[ _]steps:? (\d+))?, sequence length (\d+)", text)
    if init is not None:
        local, global_, accum = int(init.group(1)), int(init.group(2)), int(init.group(3) or 1)
        settings.update(micro_batch_size=local, seq_len=int(init.group(4)))
        if accum > 1:
            settings["grad_accum_steps"] = accum
        if "dp" not in settings and global_ > local * accum:
            settings["dp"] = settings["gpus"] = global_ // (local * accum)
    ac = last(r"Applied (\w+) activation checkpointing to the model", text)
    if ac is not None and ac.group(1).lower() in RECOMPUTE:
        settings["recompute"] = RECOMPUTE[ac.group(1).lower()]
        if ac.group(1).lower() == "selective":
            notes.append("torchtitan's log does not say which selective checkpointing ran ('op', its 8B / 70B "
                         "configs, or every N-th layer, its debug config): memest estimates 'op'")
            assumed.append("recompute")
    elif ac is None and init is not None:
        settings["recompute"] = "none"
    if first(r"Applied DDP to the model", text) and settings.get("gpus", 1) > 1:
        notes.append("torchtitan applied DDP: memest estimates its stack's FSDP2 recipe over the same devices")
    model = first(r"Model (\S+ \S+?) size: [0-9,]+ total parameters", text)
    built = first(r"Building (\w+) (\S+) with (?:Transformer)?ModelArgs\((.{0,4000})\)", text)
    config = llama_config(_args(built.group(3))) if built is not None and built.group(1) in ("llama2", "llama3") else None
    name = model.group(1) if model else (f"{built.group(1)} {built.group(2)}" if built else None)
    capacity = first(rf"(?:CUDA|XPU|ROCM) capacity: (.{{1,200}}?) with {NUMBER}(GiB) memory", text)
    figures: dict[str, Logged | None] = {
        "init_reserved": size_figure(rf"memory usage for model: {NUMBER}(GiB)", text),
        "peak_reserved": _peak(text),
    }
    return EngineLog(engine="torchtitan", format="torchtitan", model=FLAVORS.get(name or "", name),
                     gpu=capacity.group(1).strip() if capacity else None,
                     device_total_bytes=nbytes(capacity.group(2), capacity.group(3)) if capacity else None,
                     settings=settings, figures=keep(figures), training=True, model_config=config,
                     notes=tuple(notes), assumed=tuple(assumed))


def _peak(text: str) -> Logged | None:
    """The largest ``memory: X GiB(Y%)`` of the training steps' lines (not the validation steps')."""
    best: tuple[float, re.Match[str]] | None = None
    for m in re.finditer(rf"(?<!validate )step:\s*\d+\s+loss:{GAP}memory:\s*{NUMBER}GiB\(", text):
        value = number(m.group(1))
        if best is None or value > best[0]:
            best = (value, m)
    if best is None:
        return None
    return Logged(nbytes(best[1].group(1), "GiB"), "bytes", line_of(text, best[1]))
