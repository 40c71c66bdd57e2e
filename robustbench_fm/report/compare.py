"""Our paper tables beside the published numbers: ours, published, difference, and a flag where
the difference exceeds the published value's interval.

Matching rule (a :class:`~robustbench_fm.core.tables.PaperTable` against ``paper/published/``):

1. **Table**: the PaperTable's name ``<paper>[_v<k>]_table<N>[_<suffix>]`` names the published
   table (:func:`robustbench_fm.paper.published.parse_table_name`; CANDOR without a version is
   v4). Other names (e.g. ``croma_pareto``) have no published counterpart and are not compared.
2. **Column**: a frame column is compared when its header equals a published ``column`` exactly
   (builders use the printed headers: ``AUROC Head``, ``D_all``, ``F(0)``, ``LTM10``).
3. **Row**: the row-label column is the text column whose values name the most published rows.
   A value names a published row when equal to it, or through the alias map
   ``paper/published/aliases.csv`` (registry name -> the paper's model name, e.g.
   ``uni2_h`` -> ``UNI2-h`` in CRoMa, ``UNI2`` in CANDOR).
4. **Section**: if another text column (``group_by`` first) holds published section labels, a
   row's section must match: equal (case-insensitive), or equal to one " / "-separated part of it
   (``WORD (in domain)`` matches ``WORD (in domain) / Frozen foundation models``). Without such
   a column a (row, column) pair must be unique in the published table; pairs printed in several
   sections (SPAR Table 1's two cohorts) are then left out as ambiguous.
5. **Scale**: our numbers are compared on the published ``value`` scale, i.e. percentages as
   fractions (the published files already divide printed percentages by 100).

Interval: ``published ± tolerance`` with tolerance = half a unit in the printed last digit
(``0.5 * 10**-decimals``: 0.410 -> ±0.0005, 31.4% -> ±0.0005, 86 -> ±0.5) plus, where the paper
prints a spread beside the value (a ``<column>_sd`` cell, SPAR Table 2), 1.96 times that standard
deviation (a normal 95% interval). No published table prints a confidence interval column; the
CIs stated in the text (``*_text_numbers.csv``) are not table cells and are not matched.
A cell is flagged ``outside`` when ``|ours - published| > tolerance``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..core.atomic import write_text_atomic
from ..core.results import to_markdown as frame_markdown
from ..core.tables import PaperTable
from ..paper import published
from ..paper.published import aliases

COMPARE_COLUMNS = ["table", "section", "row", "column", "ours", "published", "difference", "tolerance",
                   "interval_low", "interval_high", "outside", "unit"]
#: z of a two-sided normal 95% interval around a value printed with its standard deviation
Z95 = 1.959963984540054


def _text_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if not pd.api.types.is_numeric_dtype(frame[c])]


def _section_match(ours: str, section: str) -> bool:
    ours = ours.strip().lower()
    return ours == section.lower() or ours in (p.strip().lower() for p in section.split(" / "))


def compare_table(table: PaperTable) -> pd.DataFrame:
    """Every cell of ``table`` that has a published counterpart (module docstring) with ours,
    the published value, the difference and its interval; empty when nothing matches."""
    ref = published.parse_table_name(table.name)
    if ref is None:
        return pd.DataFrame(columns=COMPARE_COLUMNS)
    paper, version, number = ref
    cells = published.table(paper, number, version)
    values = cells[~cells["column"].str.endswith("_sd")]
    sd = cells[cells["column"].str.endswith("_sd")].set_index(["section", "row", "column"])["value"]
    frame = table.frame.reset_index(drop=True)
    alias = aliases().get(paper, {})
    rows, sections = set(values["row"]), set(values["section"]) - {""}

    def label(v) -> str:
        return alias.get(str(v), str(v))

    text = _text_columns(frame)
    hits = {c: frame[c].map(lambda v: label(v) in rows).sum() for c in text}
    if not hits or max(hits.values()) == 0:
        return pd.DataFrame(columns=COMPARE_COLUMNS)
    row_col = max(hits, key=hits.get)
    candidates = ([table.group_by] if table.group_by in text else []) + [c for c in text if c != row_col]
    section_col = next((c for c in candidates if c != row_col and frame[c].map(
        lambda v: any(_section_match(str(v), s) for s in sections)).any()), None)
    value_cols = [c for c in frame.columns if c in set(values["column"])]
    out = []
    for _, r in frame.iterrows():
        name = label(r[row_col])
        for col in value_cols:
            ours = pd.to_numeric(pd.Series([r[col]]), errors="coerce").iloc[0]
            match = values[(values["row"] == name) & (values["column"] == col)]
            if section_col is not None:
                match = match[match["section"].map(lambda s: _section_match(str(r[section_col]), s))]
            if len(match) != 1 or pd.isna(ours) or pd.isna(match["value"].iloc[0]):
                continue
            cell = match.iloc[0]
            tol = 0.5 * 10.0 ** -int(cell["decimals"])
            spread = sd.get((cell["section"], cell["row"], f"{col}_sd"), np.nan)
            tol += Z95 * spread if not pd.isna(spread) else 0.0
            diff = float(ours) - float(cell["value"])
            out.append({"table": table.name, "section": cell["section"], "row": cell["row"], "column": col,
                        "ours": float(ours), "published": float(cell["value"]), "difference": diff,
                        "tolerance": tol, "interval_low": cell["value"] - tol, "interval_high": cell["value"] + tol,
                        "outside": bool(abs(diff) > tol * (1 + 1e-9)), "unit": cell["unit"]})
    return pd.DataFrame(out, columns=COMPARE_COLUMNS)


def compare_tables(tables: list[PaperTable]) -> pd.DataFrame:
    """:func:`compare_table` of every table, concatenated."""
    parts = [p for p in (compare_table(t) for t in tables) if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=COMPARE_COLUMNS)


#: the columns of compare.md, with how each prints (the last, unnamed one flags cells outside the interval)
MARKDOWN_COLUMNS = {"section": str, "row": str, "column": str, "ours": "{:.4g}".format,
                    "published": "{:.4g}".format, "difference": "{:+.4f}".format, "±": "{:.4g}".format,
                    "": lambda outside: "**outside**" if outside else ""}


def to_markdown(cmp: pd.DataFrame) -> str:
    """One markdown table per paper table: ours, published, difference; cells outside the
    published interval marked **outside**, with a count line."""
    if cmp.empty:
        return "No cell of these tables has a published counterpart.\n"
    parts = []
    for name, rows in cmp.groupby("table", sort=False):
        shown = rows.rename(columns={"tolerance": "±", "outside": ""})
        shown = pd.DataFrame({col: shown[col].map(fmt) for col, fmt in MARKDOWN_COLUMNS.items()})
        parts += [f"### {name}", "",
                  f"{len(rows)} cells compared, {int(rows['outside'].sum())} outside the published interval.", "",
                  frame_markdown(shown)]
    return "\n".join(parts)


def write_compare(tables: list[PaperTable], out_dir: str | Path) -> pd.DataFrame:
    """``compare.csv`` (numbers as numbers) and ``compare.md`` in ``out_dir``; returns the frame."""
    cmp = compare_tables(tables)
    out_dir = Path(out_dir)
    write_text_atomic(out_dir / "compare.csv", cmp.to_csv(index=False))
    write_text_atomic(out_dir / "compare.md", to_markdown(cmp))
    return cmp
