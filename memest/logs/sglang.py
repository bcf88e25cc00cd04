"""SGLang's start-up log (the scheduler's TP0 lines).

Lines read: ``server_args=ServerArgs(model_path='...', tp_size=1, mem_fraction_static=0.88, ...)``;
``Load weight begin. avail mem=78.81 GB`` and ``Load weight end. ... avail mem=63.72 GB[, mem
usage=15.09 GB]`` (the weights: the printed usage, else the drop in free memory); ``KV Cache is
allocated. [#tokens: N, ]K size: X GB, V size: Y GB``; ``max_total_num_tokens=N, ...,
context_len=L``. SGLang's 'GB' is bytes / 2^30.
"""

from __future__ import annotations

import re
from typing import Any

from memest.logs._text import GAP, NUMBER, count_figure, first, keep, line_of, nbytes, size_figure
from memest.logs.record import EngineLog, Logged

FIGURE_LINES = ("Load weight end", "KV Cache is allocated", "max_total_num_tokens=")
"""The lines of figures named when a log has none of them."""

MARKERS = (r"server_args=ServerArgs\(", r"Load weight begin\.", r"KV Cache is allocated\.", r"max_total_num_tokens=",
           r"sglang\.launch_server")

SIZE = rf"{NUMBER}\s*(GB|GiB)"

SERVER_ARGS: dict[str, str] = {
    "tp_size": "tp", "pp_size": "pp", "mem_fraction_static": "mem_fraction_static", "context_length": "max_model_len",
    "kv_cache_dtype": "kv_cache_dtype", "chunked_prefill_size": "chunked_prefill_size",
    "max_running_requests": "max_running_requests", "page_size": "page_size", "quantization": "quantization",
}
"""server_args fields -> memest's setting names."""


def detect(text: str) -> bool:
    """True when ``text`` is an SGLang log."""
    return any(re.search(m, text) for m in MARKERS)


def _value(raw: str) -> Any:
    raw = raw.strip()
    if raw in ("None", ""):
        return None
    if raw[0] in "'\"":
        return raw.strip("'\"")
    if raw in ("True", "False"):
        return raw == "True"
    try:
        return float(raw) if "." in raw else int(raw)
    except ValueError:
        return raw


def _server_args(text: str) -> tuple[dict[str, Any], str | None]:
    m = first(r"server_args=ServerArgs\((.*)", text)  # to the end of the line: excerpts cut it short
    if m is None:
        return {}, None
    args = {k: _value(v.rstrip(")")) for k, v in re.findall(r"\b(\w+)=('[^']*'|\"[^\"]*\"|[^,]+)", m.group(1))}
    settings = {name: args[key] for key, name in SERVER_ARGS.items() if args.get(key) is not None}
    if args.get("dtype") not in (None, "auto"):
        settings["dtype"] = args["dtype"]
    return settings, args.get("model_path")


def parse(text: str) -> EngineLog:
    """The job and the figures of an SGLang start-up log."""
    settings, model = _server_args(text)
    figures: dict[str, Logged | None] = {}
    usage = size_figure(rf"Load weight end\.{GAP}mem usage={SIZE}", text)
    begin, end = first(rf"Load weight begin\.{GAP}avail mem={SIZE}", text), first(rf"Load weight end\.{GAP}avail mem={SIZE}", text)
    if usage is None and begin is not None and end is not None:
        usage = Logged(nbytes(begin.group(1), begin.group(2)) - nbytes(end.group(1), end.group(2)), "bytes",
                       f"{line_of(text, begin)} / {line_of(text, end)}")
    figures["weights"] = usage
    figures["k_size"] = size_figure(rf"KV Cache is allocated\.{GAP}K size: {SIZE}", text)
    figures["v_size"] = size_figure(rf"KV Cache is allocated\.{GAP}V size: {SIZE}", text)
    figures["kv_cache_tokens"] = (count_figure(rf"max_total_num_tokens={NUMBER}", text, "tokens")
                                  or count_figure(rf"KV Cache is allocated\.{GAP}#tokens: {NUMBER}", text, "tokens"))
    figures["context_len"] = count_figure(rf"max_total_num_tokens={GAP}context_len={NUMBER}", text, "tokens")
    return EngineLog(engine="sglang", format="SGLang", model=model, settings=settings, figures=keep(figures))
