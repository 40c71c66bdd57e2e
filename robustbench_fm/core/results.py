"""Results of one stage: ``summary`` (one row per encoder × task × statistic set) and, for
per-sample methods, ``per_sample`` (one row per query/anchor)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from .atomic import write_atomic, write_text_atomic


def to_markdown(df: pd.DataFrame, floatfmt: str = ".3f") -> str:
    """A plain GitHub-markdown table (no extra dependency); missing values (NaN, NA, None) blank."""
    def fmt(v):
        if v is None or v is pd.NA:
            return ""
        if isinstance(v, float):
            return "" if pd.isna(v) else format(v, floatfmt)
        return str(v)
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


#: columns that name a summary row, in the order :func:`not_scored` names them
ROW_KEYS = ("encoder", "dataset", "finding", "target", "acq_group", "stratum", "method", "test_set")
POOLED_GROUPS = ("__pooled__", "pooled")


def not_scored(summary: pd.DataFrame) -> list[str]:
    """One line per summary row that carries a ``reason`` (why the stage left it blank), e.g.
    ``planted_blur, planted, marker, group AP: fewer than k+1=6 positives or negatives (...)``.
    A ``target`` equal to its finding is not repeated; the pooled group reads ``all groups``."""
    if summary.empty or "reason" not in summary.columns:
        return []
    reason = summary["reason"].astype("string").fillna("").str.strip()
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
    """What a stage returns; ``save(dir)`` writes summary/per-sample parquet and a markdown table."""

    summary: pd.DataFrame
    per_sample: pd.DataFrame | None = None
    params: dict = field(default_factory=dict)

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_atomic(directory / "summary.parquet", lambda f: self.summary.to_parquet(f, index=False))
        if self.per_sample is not None:
            write_atomic(directory / "per_sample.parquet",
                         lambda f: self.per_sample.to_parquet(f, index=False))
        write_text_atomic(directory / "summary.md", to_markdown(self.summary))
        write_text_atomic(directory / "params.json", json.dumps(self.params, indent=2, default=str))
        return directory
