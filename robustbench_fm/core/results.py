"""Results of one stage: ``summary`` (one row per encoder × task × statistic set) and, for
per-sample methods, ``per_sample`` (one row per query/anchor), ``items`` (what paired comparisons
read) and ``neighbours`` (the neighbourhoods the stage scored)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from tabulate import DataRow, TableFormat

from .atomic import write_atomic, write_text_atomic


def cell_text(value, floatfmt: str = ".3f", na_rep: str = "") -> str:
    """``value`` as every table of this package prints it: floats (Python or NumPy) as ``floatfmt``,
    missing values (NaN, NA, None) as ``na_rep``, anything else as ``str``."""
    if value is None or value is pd.NA:
        return na_rep
    if isinstance(value, (float, np.floating)):
        return na_rep if pd.isna(value) else format(value, floatfmt)
    return str(value)


def _rule(widths, aligns) -> str:
    return "|" + "|".join("---" for _ in widths) + "|"


#: GitHub pipe table as this package prints it: cells unpadded, a plain ``|---|`` rule under the header
PIPE = TableFormat(lineabove=None, linebelowheader=_rule, linebetweenrows=None, linebelow=None,
                   headerrow=DataRow("|", "|", "|"), datarow=DataRow("|", "|", "|"), padding=1,
                   with_header_hide=None)
#: how a rank of :func:`robustbench_fm.report.render.ranks` marks a markdown cell: 1 bold, 2 underlined
MARKS = {1: "**{}**", 2: "<u>{}</u>"}


def to_markdown(df: pd.DataFrame, floatfmt: str = ".3f", na_rep: str = "",
                marks: pd.DataFrame | None = None) -> str:
    """``df`` as a GitHub-markdown table (pandas ``DataFrame.to_markdown``, i.e. tabulate): cells as
    :func:`cell_text` (strings printed as they are), a cell whose ``marks`` value is 1 bold and 2
    underlined (:data:`MARKS`; ``marks`` is aligned with ``df`` by position)."""
    text = df.map(lambda v: cell_text(v, floatfmt, na_rep))
    if marks is not None:
        text = pd.DataFrame([[MARKS.get(rank, "{}").format(cell) for cell, rank in zip(*row)]
                             for row in zip(text.to_numpy(), marks.to_numpy())], columns=df.columns)
    table = text.to_markdown(index=False, tablefmt=PIPE, stralign=None, numalign=None, disable_numparse=True)
    return table + "\n"


#: columns that name a summary row, in the order :func:`not_scored` names them
ROW_KEYS = ("encoder", "dataset", "finding", "target", "acq_group", "stratum", "method", "test_set")
POOLED_GROUPS = ("__pooled__", "pooled")


def without_interval(summary: pd.DataFrame) -> list[str]:
    """One line per summary row that carries a ``note`` (scored, but its interval left blank: e.g.
    fewer than :data:`robustbench_fm.core.stats.MIN_CLUSTERS` patients), named as :func:`not_scored`
    names rows."""
    return not_scored(summary, "note")


def not_scored(summary: pd.DataFrame, column: str = "reason") -> list[str]:
    """One line per summary row that carries a ``reason`` (why the stage left it blank), e.g.
    ``planted_blur, planted, marker, group AP: fewer than k+1=6 positives or negatives (...)``.
    A ``target`` equal to its finding is not repeated; the pooled group reads ``all groups``."""
    if summary.empty or column not in summary.columns:
        return []
    reason = summary[column].astype("string").fillna("").str.strip()
    lines = []
    for (_, row), why in zip(summary[reason != ""].iterrows(), reason[reason != ""]):
        parts = []
        for col in ROW_KEYS:
            value = row.get(col)
            if value is None or value is pd.NA or (isinstance(value, float) and pd.isna(value)) or str(value) == "":
                continue
            value = str(value)
            if col == "target" and value == str(row.get("finding")):
                continue
            if col == "acq_group":
                value = "all groups" if value in POOLED_GROUPS else f"group {value}"
            parts.append(value)
        lines.append(f"{', '.join(parts)}: {why}")
    return lines


#: a run folder's notes: what the run did differently from the default for some inputs (one per
#: line), listed under the report's "Notes" (e.g. SPAR volumes whose spacing fell back to the 224 frame)
NOTES_FILE = "notes.txt"


def write_notes(out_dir: str | Path, notes: list[str]) -> None:
    """Add ``notes`` (one line each, each kept once) to ``out_dir``'s :data:`NOTES_FILE`."""
    if not notes:
        return
    lines = list(dict.fromkeys([*read_notes(out_dir), *(" ".join(str(n).split()) for n in notes)]))
    write_text_atomic(Path(out_dir) / NOTES_FILE, "".join(f"{line}\n" for line in lines))


def read_notes(out_dir: str | Path) -> list[str]:
    """The run folder's notes (:func:`write_notes`); [] when it has none."""
    path = Path(out_dir) / NOTES_FILE
    return [line for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def without_single_group_pools(summary: pd.DataFrame) -> pd.DataFrame:
    """``summary`` without the pooled (``__pooled__``) rows that merely copy their only matched
    group's row: a pool is shown only where it pools two or more groups."""
    if summary.empty or "acq_group" not in summary.columns:
        return summary
    pooled = summary["acq_group"].astype(str) == POOLED_GROUPS[0]
    keys = [c for c in ("encoder", "dataset", "finding", "target") if c in summary.columns]
    if not pooled.any() or not keys:
        return summary
    groups = summary[~pooled].groupby(keys, dropna=False).size()
    single = summary[keys].apply(tuple, axis=1).map(lambda k: groups.get(k if len(keys) > 1 else k[0], 0) == 1)
    return summary[~(pooled & single)].reset_index(drop=True)


@dataclass
class Results:
    """What a stage returns; ``save(dir)`` writes summary/per-sample parquet and a markdown table.
    ``items``: a stage's per-item table for paired comparisons between encoders when ``per_sample``
    does not hold every item (CANDOR: the margin's scored images besides the queries), saved as
    ``items.parquet`` (``methods.Pairing.table``). ``neighbours``: the neighbours each query's scores
    averaged, as the stage found them (CANDOR: ``methods.candor.stage.NEIGHBOUR_COLUMNS``), saved as
    ``neighbours.parquet`` (docs/neighbourhoods.md)."""

    summary: pd.DataFrame
    per_sample: pd.DataFrame | None = None
    params: dict = field(default_factory=dict)
    items: pd.DataFrame | None = None
    neighbours: pd.DataFrame | None = None

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_atomic(directory / "summary.parquet", lambda f: self.summary.to_parquet(f, index=False))
        if self.per_sample is not None:
            write_atomic(directory / "per_sample.parquet",
                         lambda f: self.per_sample.to_parquet(f, index=False))
        if self.items is not None:
            write_atomic(directory / "items.parquet", lambda f: self.items.to_parquet(f, index=False))
        if self.neighbours is not None:
            write_atomic(directory / "neighbours.parquet", lambda f: self.neighbours.to_parquet(f, index=False))
        write_text_atomic(directory / "summary.md", to_markdown(self.summary))
        write_text_atomic(directory / "params.json", json.dumps(self.params, indent=2, default=str))
        return directory
