"""What every paper's figures share (the ``plots`` modules of :mod:`robustbench_fm.methods` and the
reports' heat maps, :mod:`robustbench_fm.report.comparisons`): the columns a figure needs, checked in one line, and a
:class:`matplotlib.figure.Figure` written as PNG and PDF.

A module of the leaf layer :mod:`robustbench_fm.paper`, which the methods and the reports both read
(tests/test_layers.py): it imports matplotlib, the standard library and :mod:`robustbench_fm.core` only."""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.atomic import write_atomic

if TYPE_CHECKING:  # a figure is drawn by the caller; writing one needs only its savefig
    import pandas as pd
    from matplotlib.figure import Figure

#: the formats :func:`save_figure` writes, in order, and the PNG's resolution
FORMATS = ("png", "pdf")
DPI = 150


def require_columns(df: pd.DataFrame, columns: Iterable[str], what: str) -> None:
    """The table of figure ``what`` holds every column of ``columns`` and at least one row: else a
    one-line ``ValueError`` naming the missing columns and those present, or the empty table."""
    columns = tuple(columns)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{what}: columns {', '.join(missing)} missing (present: {', '.join(map(str, df.columns))}); "
                         f"pass a table with {', '.join(columns)}")
    if df.empty:
        raise ValueError(f"{what}: the table is empty; nothing to plot")


def save_figure(fig: Figure, stem: str | Path) -> list[Path]:
    """Write ``fig`` as ``<stem>.png`` (150 dpi) and ``<stem>.pdf``, each atomically; returns both paths."""
    stem = Path(stem)
    paths = []
    for fmt in FORMATS:
        path = stem.with_name(f"{stem.name}.{fmt}")
        write_atomic(path, lambda f, fmt=fmt: fig.savefig(f, format=fmt, dpi=DPI, bbox_inches="tight"))
        paths.append(path)
    return paths
