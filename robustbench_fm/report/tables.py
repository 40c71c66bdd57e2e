"""Paper tables from a finished sweep: the contract between collectors, builders and renderers.

A *builder* turns a sweep's results into one or more :class:`PaperTable` in a paper's layout
(rows, columns, which columns mark their best value). Builders are the functions a method's
table module lists in ``TABLES`` (the module a registered method names in ``tables``; e.g.
:mod:`robustbench_fm.methods.candor.tables`), imported on use. An experiment lists
the tables its collect step writes in ``report.tables``; :func:`build_tables` runs them on a sweep
and :func:`robustbench_fm.report.render.render` writes markdown, LaTeX and CSV.

Builders read the sweep through :class:`SweepResults` only, so they work the same on a sweep
folder, on a run folder and on synthetic results written by tests.
"""
from __future__ import annotations

import difflib
import importlib
from pathlib import Path
from typing import Callable

from .. import methods
from ..core.errors import UnknownName
from ..core.tables import PaperTable, SweepResults
from .render import render

Builder = Callable[[SweepResults], list[PaperTable]]


def _builders() -> dict[str, object]:
    """table name -> the module defining it: every ``TABLES`` of the methods' table modules
    (:func:`robustbench_fm.methods.table_modules`), imported now."""
    out: dict[str, object] = {}
    for name in methods.table_modules():
        module = importlib.import_module(name)
        for table in module.TABLES:
            out.setdefault(table, module)
    return out


def names() -> list[str]:
    """Every table name a method declares."""
    return sorted(_builders())


def get(name: str) -> Builder:
    """The builder of table ``name``; an unknown name fails with the close ones."""
    builders = _builders()
    if name not in builders:
        known = sorted(builders)
        close = difflib.get_close_matches(name, known, n=3)
        raise UnknownName(f"unknown table '{name}'" + (f"; did you mean {', '.join(close)}?" if close else
                                                    f"; known tables: {', '.join(known)}"))
    return getattr(builders[name], name)


def build_tables(names, results: SweepResults, out_dir: str | Path) -> list[Path]:
    """Build and render the named tables into ``out_dir``; returns the written files."""

    written = []
    for name in names:
        for table in get(name)(results):
            written += render(table, out_dir)
    return written
