"""Write a :class:`~robustbench_fm.report.tables.PaperTable` as markdown, LaTeX and CSV.

CSV keeps full-precision numbers; markdown and LaTeX round to ``table.decimals`` and mark, per
column in ``table.best`` (and per ``group_by`` block), the best value bold and the second
underlined (ties share the mark). Columns and rows keep the frame's order, which builders set to
the paper's; LaTeX right-aligns numeric columns and rules off the ``group_by`` blocks. Markdown goes
through the package's one table helper (:func:`robustbench_fm.core.results.to_markdown`, pandas
``to_markdown``), LaTeX through pandas ``Styler.to_latex``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..core.atomic import write_text_atomic
from ..core.results import to_markdown as frame_markdown
from ..core.tables import PaperTable


def ranks(table: PaperTable) -> pd.DataFrame:
    """1 for the best, 2 for the second value of every ``best`` column (0 elsewhere)."""
    out = pd.DataFrame(0, index=table.frame.index, columns=table.frame.columns)
    blocks = table.frame.groupby(table.group_by, sort=False).groups.values() if table.group_by \
        else [table.frame.index]
    for col, direction in table.best.items():
        for idx in blocks:
            values = pd.to_numeric(table.frame.loc[idx, col], errors="coerce").dropna()
            values = values[~values.index.isin(table.unranked)]  # reference rows: shown, never marked
            order = np.unique(values)[::-1] if direction == "max" else np.unique(values)
            for rank, value in enumerate(order[:2], start=1):
                out.loc[values.index[values == value], col] = rank
    return out


def to_markdown(table: PaperTable) -> str:
    """The table as GitHub markdown (:func:`robustbench_fm.core.results.to_markdown`), its caption
    in bold above it."""
    caption = f"**{table.caption}**\n\n" if table.caption else ""
    return caption + frame_markdown(table.frame, f".{table.decimals}f", table.na_rep, ranks(table))


#: how a rank of :func:`ranks` marks a LaTeX cell (Styler's ``command: --rwrap`` gives ``\command{cell}``)
LATEX_MARKS = {1: "textbf: --rwrap;", 2: "underline: --rwrap;"}


def to_latex(table: PaperTable) -> str:
    r"""A booktabs ``tabular`` through pandas ``Styler.to_latex``: cells escaped for LaTeX, floats to
    ``table.decimals`` places, numeric columns right-aligned, the :func:`ranks` marks as
    ``\textbf`` / ``\underline``, a ``\midrule`` between ``group_by`` blocks and the caption as a
    comment line above."""
    frame = table.frame.reset_index(drop=True)
    marks = ranks(table).reset_index(drop=True)
    styler = (frame.style.hide(axis="index")
              .format(precision=table.decimals, na_rep=table.na_rep, escape="latex")
              .format_index(escape="latex", axis=1)
              .apply(lambda _: marks.map(lambda r: LATEX_MARKS.get(r, "")), axis=None))
    align = "".join("r" if pd.api.types.is_numeric_dtype(frame[c]) else "l" for c in frame.columns)
    lines = styler.to_latex(hrules=True, column_format=align).splitlines()
    if table.group_by:  # the paper's rule between blocks (e.g. benchmarks, sections); Styler has no option for it
        body = lines.index(r"\midrule") + 1  # the first row's line: Styler writes one line per row
        block = frame[table.group_by].tolist()
        for i in reversed(range(1, len(block))):
            if block[i] != block[i - 1]:
                lines.insert(body + i, r"\midrule")
    if table.caption:
        lines = [r"% " + table.caption] + lines
    return "\n".join(lines) + "\n"


def render(table: PaperTable, out_dir: str | Path) -> list[Path]:
    """Write ``<name>.md``, ``<name>.tex`` and ``<name>.csv`` into ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{table.name}.{ext}" for ext in ("md", "tex", "csv")]
    write_text_atomic(paths[0], to_markdown(table))
    write_text_atomic(paths[1], to_latex(table))
    write_text_atomic(paths[2], table.frame.to_csv(index=False))
    return paths
