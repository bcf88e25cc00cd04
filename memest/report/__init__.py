"""Rendering: the only place bytes become GiB. Rich tables for people, JSON and Markdown for tools.

One module per result: :mod:`.estimate` (``memest hf``), :mod:`.plan`, :mod:`.sweep`, :mod:`.check`,
:mod:`.trace` (a trace beside its estimate), :mod:`.catalogs` (``memest models`` / ``gpus``); shared:
:mod:`.units` (GiB = 2^30 bytes, always labelled; parameter counts with decimal suffixes, B = 10^9),
:mod:`.tables` (tables that fit the terminal), :mod:`.plot` and :mod:`.trace_plot` (pictures).
The names below are the ones the CLI, the API and the service use.
"""

from memest.report.estimate import (
    describe_model,
    describe_workload,
    gguf_line,
    render,
    rows,
    serving_lines,
    to_dict,
    to_markdown,
)
from memest.report.plan import (
    describe_layout,
    describe_limits,
    describe_settings,
    plan_to_dict,
    plan_to_markdown,
    render_plan,
)
from memest.report.sweep import render_sweep, sweep_to_dict, sweep_to_markdown
from memest.report.units import CONFIRM, count, gib, percent, size, size_label

__all__ = [
    "CONFIRM", "count", "describe_layout", "describe_limits", "describe_model", "describe_settings", "describe_workload",
    "gguf_line", "gib", "percent", "plan_to_dict", "plan_to_markdown", "render", "render_plan", "render_sweep", "rows",
    "serving_lines", "size", "size_label", "sweep_to_dict", "sweep_to_markdown", "to_dict", "to_markdown",
]
