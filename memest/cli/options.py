"""The workload flags shared by ``memest hf``, ``calibrate``, ``plan`` and ``sweep``.

Each flag is a setting declared once, as field metadata on the workload dataclasses
(:mod:`memest.workload.settings`); this module turns them into typer options
(:data:`WORKLOAD_OPTIONS`) and setting names into flags (:func:`flag_name`, :func:`cli_message`).
:func:`workload_options` adds them to a typer command's signature and hands the command a built
:class:`JobOptions` instead, so every command parses the same flags the same way.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from memest.api import checkpoint_params, gguf_tensors
from memest.devices import Device
from memest.errors import InputError, MemestError
from memest.planning.sweep import SWEEPABLE, parse_size
from memest.spec import ModelSpec
from memest.workload import Engine, Method, Workload, resolve
from memest.workload.resolve import check_scope
from memest.workload.settings import Setting, cli_flag, enum_of, settings

PANELS = {"model": "Model", "training": "Training (--train / --finetune)", "serving": "Serving (--serve)",
          "parallelism": "Parallelism and devices"}
"""The help panel of each setting group (:data:`memest.workload.settings.GROUPS`)."""


def flag_name(name: str) -> str:
    """The CLI flag of a setting keyword (``micro_batch_size`` -> ``--micro-batch-size``)."""
    return cli_flag(name)


def cli_message(exc: BaseException) -> str:
    """An error's message as the CLI prints it: the settings a :class:`MemestError` names as flags."""
    return exc.render(flag_name) if isinstance(exc, MemestError) else str(exc)


def _help(s: Setting) -> str:
    return InputError(s.help, field=s.name).render(flag_name)


def _size(name: str, text: Any) -> int:
    """A size flag's value: an integer, or one with a k (x 1024) or M suffix (:func:`memest.planning.sweep.parse_size`,
    the parser of ``memest sweep``'s ranges). A bad one is a ValueError typer reports as the flag's bad value."""
    if isinstance(text, int):
        return text
    try:
        return int(text)  # 0 or -5 too: the checks of the workload name them with their fix
    except ValueError:
        pass
    try:
        return parse_size(str(text), name)
    except InputError as exc:  # typer's message names the flag already: the reason alone, without its name
        raise ValueError(exc.template.replace(f"{{{name}}} ", "", 1)) from None


def _option(s: Setting) -> tuple[Any, Any]:
    """The typer annotation and default of a setting."""
    kind = s.type
    if s.default is None and type(None) not in typing.get_args(kind):
        kind = kind | None
    decl = flag_name(s.name) + (f"/{flag_name(s.off)}" if s.off else "")
    kw: dict[str, Any] = {}
    if enum_of(kind) is not None:
        kw["case_sensitive"] = False
        if s.choices:  # a part of the enum: the others are refused with the setting's fix
            kw["metavar"] = f"<{'|'.join(s.choices)}>"
    if s.bounds is not None:
        kw["min"], kw["max"] = s.bounds
    if s.name in SWEEPABLE:  # 4k as memest sweep reads it: one parser for both
        kw["parser"] = functools.partial(_size, s.name)
        kw["metavar"] = "<int|4k>"
    elif kind in (bool | None, bool):  # a switch (and its --no- form): no value follows it, whatever typer shows
        kw["metavar"] = ""
    option = typer.Option(decl, help=_help(s), rich_help_panel=PANELS[s.group], **kw)
    return Annotated[kind, option], s.default


WORKLOAD_OPTIONS: dict[str, tuple[Any, Any]] = {name: _option(s) for name, s in settings().items()}
"""Every setting as a typer option: name -> (annotation, default), generated from the settings'
declarations (:func:`memest.workload.settings.settings`)."""


def _scope(scope: str) -> dict[str, tuple[str, str]]:
    return {n: (s.what, s.fix) for n, s in settings().items() if s.scope == scope}


SERVING_ONLY: dict[str, tuple[str, str]] = _scope("serving")
"""Settings only serving reads: name -> (what it sets, the fix when training)."""
TRAINING_ONLY: dict[str, tuple[str, str]] = _scope("training")
"""Settings only training and fine-tuning read."""
METHOD_ONLY: dict[str, tuple[Method, ...]] = {n: tuple(Method(m) for m in s.methods)
                                              for n, s in settings().items() if s.methods}
"""Training settings only some methods read (--train trains every weight: no adapters)."""
ENGINE_ONLY: dict[str, Engine | tuple[Engine, ...]] = {
    n: tuple(Engine(e) for e in s.engine) if isinstance(s.engine, tuple) else Engine(s.engine)
    for n, s in settings().items() if s.engine}
"""Serving settings only one engine (or some: llama.cpp and Ollama share theirs) reads."""


def _check_scope(values: dict[str, Any], mode: str) -> None:
    """Refuse flags the chosen mode, method or engine would ignore (:func:`memest.workload.resolve.check_scope`)."""
    check_scope(values, mode)


@dataclass(frozen=True, slots=True)
class JobOptions:
    """The parsed workload flags, before the model is known."""

    values: dict[str, Any]

    @property
    def trust_remote_code(self) -> bool:
        """--trust-remote-code."""
        return bool(self.values["trust_remote_code"])

    @property
    def revision(self) -> str | None:
        """--revision."""
        return self.values["revision"]

    @property
    def gpu(self) -> str | None:
        """The --gpu name as given, or None when it was not.

        Raises:
            InputError: an empty name (``--gpu ""``).
        """
        return resolve.gpu_name(self.values)

    @property
    def device(self) -> Device:
        """The --gpu device, or the default.

        Raises:
            InputError: an empty name.
            UnknownDeviceError: unknown name.
        """
        return resolve.device(self.values)

    @property
    def device_given(self) -> bool:
        """True when --gpu was passed."""
        return self.gpu is not None

    @property
    def headroom(self) -> float:
        """--headroom, checked.

        Raises:
            InputError: not in [0, 1).
        """
        return resolve.headroom(self.values)

    def given_flags(self) -> dict[str, str]:
        """The workload flags that differ from their defaults, as ``memest hf`` would take them:
        flag -> value (an empty value for a switch such as ``--train`` or ``--keep-grads``), in
        :data:`WORKLOAD_OPTIONS` order; what the --config files say is left to them."""
        return resolve.flags_beyond_files(self.values)

    def workload(self, spec: ModelSpec) -> Workload:
        """The workload for ``spec`` (:func:`memest.workload.resolve.resolve`).

        Raises:
            InputError: conflicting modes, a flag the mode (method, engine) does not read, or
                --gpus not divisible by the parallel degrees.
        """
        _check_scope(self.values, resolve.mode_of(self.values))  # a module function: tests bypass it
        return resolve.resolve(self.values, spec, self.device, scope=False,
                               checkpoint_params=checkpoint_params(self.values, spec),
                               gguf_tensors=gguf_tensors(self.values))


def workload_options(func: Callable[..., Any], *, refuse_typed: bool = True,
                     raw: tuple[str, ...] = ()) -> Callable[..., Any]:
    """Give a typer command every workload flag; it receives them as ``job: JobOptions``.

    The command's own parameters come first in ``--help``; it must declare ``job: JobOptions``.
    With ``refuse_typed``, a flag typed on the command line that the job would not read is refused
    even at its default value (:func:`memest.workload.resolve.check_scope`); ``memest sweep`` infers
    the mode from its ranges later and checks then. ``raw`` names flags the command parses itself (a sweep's
    ranges), kept as typed.
    """
    sig = inspect.signature(func, eval_str=True)
    own = [p for p in sig.parameters.values() if p.name != "job"]
    shared = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=ann, default=default)
        for name, (ann, default) in WORKLOAD_OPTIONS.items()
    ]

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        ctx = kwargs.pop("memest_context")
        job = JobOptions({name: kwargs.pop(name) for name in WORKLOAD_OPTIONS})
        typed = {name for name in WORKLOAD_OPTIONS  # a flag typed at its default value is still refused
                 if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")}
        try:
            if job.values["config"]:  # the --config files fill the flags not typed (one typed at its default wins)
                job = JobOptions(resolve.complete({n: job.values[n] for n in typed if n not in raw})
                                 | {n: job.values[n] for n in raw})
            if refuse_typed:
                check_scope(job.values, resolve.mode_of(job.values), given_names=typed)
            return func(job=job, **kwargs)
        except MemestError as exc:  # the library names settings; a command's user knows them as flags
            if exc.field is None:
                raise
            raise exc.named(flag_name) from exc

    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD else p
              for p in own]
    context = inspect.Parameter("memest_context", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
    wrapper.__signature__ = sig.replace(parameters=[*params, *shared, context])  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in (*params, *shared, context)}
    return wrapper


RANGE_HELP = "A sweep: A..B (powers of two), A..B:+STEP, A..B:xFACTOR or a list A,B,C; k = 1024 (1k..128k)."


def ranged_workload_options(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """As :func:`workload_options`, with the flags ``names`` taken as strings that may hold a range
    (``memest sweep --seq-len 1k..128k``). ``job.values`` holds each such string, or None when the
    flag was not given; the command parses them.

    Raises:
        ValueError: a name is not a workload option (a programming error).
    """
    from typing import get_args

    for name in names:
        if name not in WORKLOAD_OPTIONS:
            raise ValueError(f"ranged flag {name!r} is not a workload option")

    def ranged(param: inspect.Parameter) -> inspect.Parameter:
        info = get_args(WORKLOAD_OPTIONS[param.name][0])[1]
        option = typer.Option(flag_name(param.name), help=f"{info.help} {RANGE_HELP}",
                              rich_help_panel=info.rich_help_panel)
        return param.replace(annotation=Annotated[str | None, option], default=None)

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        wrapper = workload_options(func, refuse_typed=False, raw=names)
        sig = inspect.signature(wrapper)
        params = [ranged(p) if p.name in names else p for p in sig.parameters.values()]
        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return decorate
