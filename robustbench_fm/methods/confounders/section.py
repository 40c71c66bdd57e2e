"""The confounder scan's part of a report, "What the neighbourhoods follow" (its ``Method(report_section=...)``;
:func:`robustbench_fm.report.html.sections`): one sentence per encoder naming the column its neighbourhoods
follow most against the strongest finding ("follow `site` (0.62 [0.58, 0.66]) more than `pneumothorax` (0.18
[0.15, 0.21])"), and the scan table: one row per column, one column per encoder (score [95% CI]).

"More than" is said where the two 95% intervals do not overlap, "about as much as" where they do; without
intervals (too few patients, ``n_boot=0``) the point scores are compared and the sentence says so. This is a
reading aid, not a test (docs/methods/confounders.md)."""
from __future__ import annotations

import pandas as pd

TITLE = "What the neighbourhoods follow"
STAGE = "confounders"


def _shown(row) -> str:
    """```column` (score [low, high])`` or ``(score)`` without an interval."""
    if pd.notna(row["score_ci_low"]) and pd.notna(row["score_ci_high"]):
        return f"`{row['column']}` ({row['score']:.2f} [{row['score_ci_low']:.2f}, {row['score_ci_high']:.2f}])"
    return f"`{row['column']}` ({row['score']:.2f})"


def _above(a, b) -> bool | None:
    """a's interval lies above b's (True), below it (False), they overlap (None); point scores without one."""
    if pd.isna(a["score_ci_low"]) or pd.isna(b["score_ci_low"]):
        return a["score"] > b["score"] if a["score"] != b["score"] else None
    if a["score_ci_low"] > b["score_ci_high"]:
        return True
    return False if b["score_ci_low"] > a["score_ci_high"] else None


def sentence(encoder: str, rows: pd.DataFrame) -> str:
    """What one encoder's neighbourhoods follow (module doc), from its scored summary rows."""
    rows = rows.sort_values("score", ascending=False, kind="stable")
    meta, found = rows[rows["kind"] != "finding"], rows[rows["kind"] == "finding"]
    bare = " (no intervals: point scores)" if rows["score_ci_low"].isna().any() else ""
    if meta.empty or found.empty:
        top = rows.iloc[:2]
        rest = f", then {_shown(top.iloc[1])}" if len(top) > 1 else ""
        return f"{encoder}: its neighbourhoods follow {_shown(top.iloc[0])} most{rest}{bare}."
    m, f = meta.iloc[0], found.iloc[0]
    order = _above(m, f)
    if order is None:
        return (f"{encoder}: its neighbourhoods follow {_shown(m)} about as much as {_shown(f)} (the 95% intervals "
                f"overlap){bare}.")
    if order:
        return f"{encoder}: its neighbourhoods follow {_shown(m)} more than {_shown(f)}{bare}."
    return (f"{encoder}: its neighbourhoods follow {_shown(f)} more than any other column (the strongest: "
            f"{_shown(m)}){bare}.")


def _cell(row) -> str:
    if pd.isna(row["score"]):
        return ""
    if pd.isna(row["score_ci_low"]):
        return f"{row['score']:.3f}"
    return f"{row['score']:.3f} [{row['score_ci_low']:.3f}, {row['score_ci_high']:.3f}]"


def scan_table(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per (dataset, column) scored: kind, values, chance, then each encoder's score [95% CI]; the
    columns followed most (mean score over the encoders) first; ``binning`` where a column was binned."""
    rows = summary[summary["score"].notna()].copy()
    encoders = list(dict.fromkeys(rows["encoder"].astype(str)))
    rows["cell"] = [_cell(r) for _, r in rows.iterrows()]
    keys = ["dataset", "column"]
    first = rows.groupby(keys, sort=False).agg(kind=("kind", "first"), values=("n_values", "max"),
                                               chance=("chance", "first"), binning=("binning", "first"),
                                               mean=("score", "mean"))
    cells = rows.pivot_table(index=keys, columns="encoder", values="cell", aggfunc="first", sort=False)
    table = first.join(cells[encoders]).sort_values(["mean"], ascending=False, kind="stable").reset_index()
    table = table.drop(columns="mean").fillna({e: "" for e in encoders})
    if table["dataset"].nunique() <= 1:
        table = table.drop(columns="dataset")
    if (table["binning"].fillna("") == "").all():
        table = table.drop(columns="binning")
    else:
        table = table[[c for c in table.columns if c != "binning"] + ["binning"]]
    return table


def scan_section(results) -> tuple[str, list[str], pd.DataFrame] | None:
    """The report's "What the neighbourhoods follow" from a run's or sweep's results
    (:class:`~robustbench_fm.core.tables.SweepResults`); None where no scan row was scored."""
    summary = results.summaries(STAGE)
    if summary.empty or "score" not in summary.columns or summary["score"].notna().sum() == 0:
        return None
    scored = summary[summary["score"].notna()]
    several = scored["dataset"].nunique() > 1
    lines = [sentence(f"{encoder} on {dataset}" if several else str(encoder), rows)
             for (dataset, encoder), rows in scored.groupby(["dataset", "encoder"], sort=False)]
    return TITLE, lines, scan_table(summary)
