"""Rich tables that fit the width they are printed at, without cutting a cell.

A column is a :func:`name_col` (a term, a model, a device: kept on one line), a :func:`number_col`
(right aligned, kept on one line) or :func:`prose_col` (wrapped at spaces). rich narrows a table that
is too wide by shrinking its widest wrappable columns, so only prose shrinks. :class:`Narrowest`
offers a table in several layouts, widest first, and prints the first whose names and numbers whole
and prose's words (up to :data:`PROSE_WORD` characters) fit the console; when none does, the last with
every column folding (a word too long for its column continues on the next line): a cell is never cut
short with an ellipsis. rich is imported only when a table is built."""

from __future__ import annotations

from typing import Any

UNBOUNDED = 1 << 16
"""Columns a layout is measured in, so that its widths are not clamped to the console's."""

PROSE_WORD = 20
"""Characters of a prose word a layout must fit whole; a longer one (a dotted identifier, a URL) may fold."""


def name_col(header: str, style: str | None = None) -> Any:
    """A column of names (terms, models, devices): one line each."""
    from rich.table import Column

    return Column(header, style=style, no_wrap=True, overflow="fold")


def number_col(header: str) -> Any:
    """A right-aligned column of numbers: one line each."""
    from rich.table import Column

    return Column(header, justify="right", no_wrap=True, overflow="fold")


def prose_col(header: str, style: str | None = None) -> Any:
    """A column of words, wrapped at spaces (a word longer than the column folds)."""
    from rich.table import Column

    return Column(header, style=style, overflow="fold")


def new_table(*columns: Any, **table_options: Any) -> Any:
    """A rich ``Table`` of ``columns`` (:func:`name_col`, :func:`number_col`, :func:`prose_col`); ``table_options``
    go to ``rich.table.Table`` (title, box, show_edge, ...)."""
    from rich.table import Table

    return Table(*columns, **table_options)


def minimum_width(console: Any, options: Any, renderable: Any) -> int:
    """Columns ``renderable`` needs to print no name or number on two lines and no word in two pieces:
    a table's names and numbers whole, its prose's longest words (up to :data:`PROSE_WORD`), its padding
    and borders; a group's widest member."""
    from rich.console import Group
    from rich.measure import Measurement
    from rich.table import Table

    options = options.update_width(UNBOUNDED)
    if isinstance(renderable, Group):
        return max((minimum_width(console, options, r) for r in renderable.renderables), default=0)
    if isinstance(renderable, Table):
        # rich's own per-column measurement (padding included) and border width
        widths = [renderable._measure_column(console, options, column) for column in renderable.columns]
        paddings = [renderable._get_padding_width(n) for n in range(len(renderable.columns))]
        return renderable._extra_width + sum(m.maximum if c.no_wrap else min(m.minimum, PROSE_WORD + pad)
                                             for m, c, pad in zip(widths, renderable.columns, paddings))
    return Measurement.get(console, options, renderable).minimum


def _fold_everything(renderable: Any) -> None:
    from rich.console import Group
    from rich.table import Table

    if isinstance(renderable, Group):
        for r in renderable.renderables:
            _fold_everything(r)
    elif isinstance(renderable, Table):
        for column in renderable.columns:
            column.no_wrap = False


class Narrowest:
    """The first of ``layouts`` (widest first) whose :func:`minimum_width` fits the console, else the
    last with every column folding."""

    def __init__(self, *layouts: Any) -> None:
        if not layouts:
            raise ValueError("Narrowest needs at least one layout")
        self.layouts = layouts

    def choose(self, console: Any, options: Any) -> Any:
        """The layout printed at ``options.max_width``."""
        for layout in self.layouts:
            if minimum_width(console, options, layout) <= options.max_width:
                return layout
        _fold_everything(self.layouts[-1])
        return self.layouts[-1]

    def __rich_console__(self, console: Any, options: Any) -> Any:
        yield self.choose(console, options)

    def __rich_measure__(self, console: Any, options: Any) -> Any:
        from rich.measure import Measurement

        return Measurement.get(console, options, self.choose(console, options))
