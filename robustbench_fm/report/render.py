"""Write a :class:`~robustbench_fm.report.tables.PaperTable` as markdown, LaTeX and CSV.

CSV keeps full-precision numbers; markdown and LaTeX round to ``table.decimals`` and mark, per
column in ``table.best`` (and per ``group_by`` block), the best value bold and the second
underlined (ties share the mark). Columns and rows keep the frame's order, which builders set to
the paper's; LaTeX right-aligns numeric columns and rules off the ``group_by`` blocks.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..core.atomic import write_text_atomic
from .tables import PaperTable


def ranks(table: PaperTable) -> pd.DataFrame:
    """1 for the best, 2 for the second value of every ``best`` column (0 elsewhere)."""
    out = pd.DataFrame(0, index=table.frame.index, columns=table.frame.columns)
    blocks = table.frame.groupby(table.group_by, sort=False).groups.values() if table.group_by \
        else [table.frame.index]
    for col, direction in table.best.items():
        for idx in blocks:
            values = pd.to_numeric(table.frame.loc[idx, col], errors="coerce").dropna()
            order = np.unique(values)[::-1] if direction == "max" else np.unique(values)
            for rank, value in enumerate(order[:2], start=1):
                out.loc[values.index[values == value], col] = rank
    return out


def _cell(value, decimals: int, na_rep: str = "") -> str:
    """``value`` as printed: floats to ``decimals`` places, missing values (NaN, NA, None) as ``na_rep``."""
    if value is None or value is pd.NA:
        return na_rep
    if isinstance(value, (float, np.floating)):
        return na_rep if pd.isna(value) else f"{value:.{decimals}f}"
    return str(value)


def to_markdown(table: PaperTable) -> str:
    marks = ranks(table)
    cols = [str(c) for c in table.frame.columns]
    lines = ([f"**{table.caption}**", ""] if table.caption else []) + [
        "| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for i, row in table.frame.iterrows():
        cells = []
        for col, value in row.items():
            text, rank = _cell(value, table.decimals, table.na_rep), marks.at[i, col]
            cells.append(f"**{text}**" if rank == 1 else f"<u>{text}</u>" if rank == 2 else text)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _tex_escape(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#")):
        text = text.replace(a, b)
    return text


def to_latex(table: PaperTable) -> str:
    marks = ranks(table)
    cols = list(table.frame.columns)
    align = "".join("r" if pd.api.types.is_numeric_dtype(table.frame[c]) else "l" for c in cols)
    lines = [r"\begin{tabular}{" + align + "}", r"\toprule",
             " & ".join(_tex_escape(str(c)) for c in cols) + r" \\", r"\midrule"]
    block = None
    for i, row in table.frame.iterrows():
        if table.group_by and block is not None and row[table.group_by] != block:
            lines.append(r"\midrule")  # the paper's rule between blocks (e.g. benchmarks, sections)
        block = row[table.group_by] if table.group_by else None
        cells = []
        for col, value in row.items():
            text, rank = _tex_escape(_cell(value, table.decimals, table.na_rep)), marks.at[i, col]
            cells.append(rf"\textbf{{{text}}}" if rank == 1 else rf"\underline{{{text}}}" if rank == 2 else text)
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
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
