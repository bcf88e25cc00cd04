"""How a workload field declares itself a user-facing setting: :class:`Setting`, :func:`setting` and
:func:`nested`, used by :mod:`memest.workload.config`; :mod:`memest.workload.settings` collects the
declarations into one table."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

MISSING: Any = dataclasses.MISSING

GROUPS = ("model", "training", "serving", "parallelism")
"""Setting groups, in the order help lists them (the CLI's help panels)."""


@dataclass(frozen=True, slots=True)
class Setting:
    """What one user-facing setting is.

    Attributes:
        name: The keyword (``micro_batch_size``); the CLI flag is it with dashes.
        help: One sentence for ``--help``.
        group: One of :data:`GROUPS`.
        scope: ``all``, ``training`` (training and fine-tuning read it) or ``serving``.
        methods: Training methods that read it (values of :class:`~memest.workload.Method`); empty = every one.
        engine: The serving engine that reads it (value of :class:`~memest.workload.Engine`), the
            engines (a tuple of values: llama.cpp and Ollama share theirs), or None.
        default: The value a user gets when they do not give it (``None``: resolved); given to
            :func:`setting` only where it differs from the field's own default.
        what: What it sets, for the refusal "X is a serving setting (what); fix".
        fix: The fix when the other mode is asked (``{name}`` placeholders name other settings).
        off: Keyword of the negative switch of a boolean whose default is True (``keep_grads``).
        bounds: Inclusive (min, max) the CLI enforces while parsing, or None.
        type: The value's type, when the field's annotation is not it (a setting with no field).
        choices: The enum values a user may give, when not every value of its type (``finetune``
            takes lora and qlora, not full: that is ``train``); ``fix`` says what to give instead.
        items: For a comma-separated list (``q_proj,v_proj``, ``10,6``), the type of its items
            (``str``, ``float``): the Python API also takes a list or tuple of them; else None.
        describe: When a job's one-line description shows it: ``always``, ``changed`` (when not at
            the field's default), or None (never).
        planned: Which jobs' planned setups set it in their printed ``memest hf`` commands (``all``,
            ``training``, ``serving``), or empty when the planner does not choose it.
        attr: Where the value lives on the workload: dotted path from the workload
            (``lora.rank``, ``parallelism.tp``); filled in by :func:`settings`.
        field_default: The workload field's own default (filled in by :func:`settings`).
    """

    name: str
    help: str
    group: str
    scope: str = "all"
    methods: tuple[str, ...] = ()
    engine: str | tuple[str, ...] | None = None
    default: Any = None
    what: str = ""
    fix: str = "drop it"
    off: str | None = None
    bounds: tuple[int, int] | None = None
    type: Any = None
    choices: tuple[str, ...] = ()
    items: type | None = None
    describe: str | None = None
    planned: str = ""
    attr: str | None = None
    field_default: Any = None


def setting(default: Any = MISSING, *, default_factory: Any = MISSING, **meta: Any) -> Any:
    """A dataclass field whose metadata declares a user-facing :class:`Setting` (``meta`` are its
    attributes; ``name`` defaults to the field's name, prefixed by its parent's ``prefix``; ``unset``
    is the user's default where it differs from the field's, e.g. None for a value resolved later)."""
    kw: dict[str, Any] = {"metadata": {"setting": meta}}
    if default_factory is not MISSING:
        kw["default_factory"] = default_factory
    else:
        kw["default"] = default
    return dataclasses.field(**kw)


def nested(prefix: str, default_factory: Any) -> Any:
    """A dataclass field holding another settings dataclass, whose settings are named ``prefix + field``."""
    return dataclasses.field(default_factory=default_factory, metadata={"settings_of": prefix})
