"""SPAR-Bench figures from plain result tables (spar.md Tables 1, 2 and 5 drawn as plots).

Input: a DataFrame with one row per (configuration, probe[, cohort]) with columns ``encoder``
(the configuration, e.g. ``RadDINO-MLP``), ``probe``, ``accuracy`` and ``chance`` (the
probe's chance accuracy, 1 / number of answers), optionally ``majority`` (the majority-class
rate, drawn dotted beside chance) and ``prior`` (the question-only prior, drawn dash-dotted
where it is above both: distance in canonical anatomy), and for :func:`domain_figure` ``cohort``;
:func:`probe_table` makes it from the spar stage's summary.

* :func:`probe_bars_figure`: per-probe accuracy bars, one bar per configuration, the probe's
  chance level as a dashed line across its bars ("Probes that ask for a comparison within the
  slice stay at chance");
* :func:`domain_figure`: in-domain (WORD) against zero-shot (TotalSegmentator) accuracy, one
  point per (configuration, probe), diagonal and chance levels ("High In-Domain Scores Can
  Reflect Canonical Anatomy").
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ...paper.figures import require_columns, save_figure

MARKERS = "os^vDP*Xh<>p"


def probe_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The spar stage's summary rows (``label``, ``finding``, ``organ``, ``accuracy``, ``chance``,
    ``eval_dataset``, ``dataset``, one row per seed) -> one row per (configuration, probe, cohort):
    ``encoder`` (the configuration label), ``probe``, ``accuracy`` (mean over seeds), ``chance``,
    ``cohort`` (the evaluation dataset), ``in_domain`` (cohort = the training dataset) and, where the
    summary has them, ``majority`` and ``prior`` (means over seeds).
    Level 1/2 rows (no accuracy), per-organ rows and the macro average are left out."""
    require_columns(summary, ("finding", "accuracy", "chance", "eval_dataset"), "SPAR probe table")
    rows = summary[summary["accuracy"].notna() & (summary["finding"].astype(str) != "macro")]
    if "organ" in rows:
        rows = rows[rows["organ"].astype(str) == "all"]
    name = rows["label"] if "label" in rows else rows["encoder"]
    rows = rows.assign(encoder=name.astype(str), probe=rows["finding"].astype(str),
                       cohort=rows["eval_dataset"].astype(str))
    extra = {k: (k, "mean") for k in ("majority", "prior") if k in rows}
    out = rows.groupby(["encoder", "probe", "cohort"], sort=False).agg(
        accuracy=("accuracy", "mean"), chance=("chance", "first"), **extra).reset_index()
    trained = set(rows["dataset"].astype(str)) if "dataset" in rows else set()
    return out.assign(in_domain=out["cohort"].isin(trained))


def probe_bars_figure(df: pd.DataFrame, title: str = "") -> Figure:
    """Grouped bars: x = probe, one bar per configuration; dashed chance line per probe, dotted
    majority class and dash-dotted question-only prior where given (the prior only where it is
    above both, so a bar must clear it)."""
    require_columns(df, ("encoder", "probe", "accuracy", "chance"), "SPAR probe bars")
    probes = list(dict.fromkeys(df["probe"]))
    encoders = list(dict.fromkeys(df["encoder"]))
    width = 0.8 / len(encoders)
    fig = Figure(figsize=(max(5.0, 1.2 * len(probes) + 2.5), 4))
    ax = fig.add_subplot()
    table = df.set_index(["probe", "encoder"])["accuracy"]
    for k, encoder in enumerate(encoders):
        heights = [table.get((p, encoder), np.nan) for p in probes]
        ax.bar(np.arange(len(probes)) - 0.4 + (k + 0.5) * width, heights, width, color=f"C{k % 10}",
               label=str(encoder))
    chance = df.groupby("probe", sort=False)["chance"].first()
    majority = df.groupby("probe", sort=False)["majority"].mean() if "majority" in df else None
    prior = df.groupby("probe", sort=False)["prior"].mean() if "prior" in df else None
    drawn = False
    for i, p in enumerate(probes):
        ax.hlines(chance[p], i - 0.45, i + 0.45, colors="k", linestyles="--", lw=1,
                  label="chance" if i == 0 else None)
        if majority is not None and np.isfinite(majority[p]):
            ax.hlines(majority[p], i - 0.45, i + 0.45, colors="0.4", linestyles=":", lw=1.2,
                      label="majority class" if i == 0 else None)
        floor = max(chance[p], majority[p] if majority is not None and np.isfinite(majority[p]) else 0.0)
        if prior is not None and np.isfinite(prior[p]) and prior[p] > floor + 0.005:
            ax.hlines(prior[p], i - 0.45, i + 0.45, colors="k", linestyles="-.", lw=1.2,
                      label="question-only prior" if not drawn else None)
            drawn = True
    ax.set_xticks(range(len(probes)), probes, rotation=20, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def domain_figure(df: pd.DataFrame, in_domain: str, zero_shot: str) -> Figure:
    """Accuracy in cohort ``in_domain`` (x) against cohort ``zero_shot`` (y), one point per
    (configuration, probe), marker per probe; diagonal (no loss) and each probe's chance level."""
    require_columns(df, ("encoder", "probe", "accuracy", "chance", "cohort"), "SPAR in-domain vs zero-shot")
    wide = df.pivot_table(index=["encoder", "probe"], columns="cohort", values="accuracy").reset_index()
    for cohort in (in_domain, zero_shot):
        if cohort not in wide.columns:
            raise ValueError(f"SPAR in-domain vs zero-shot: no rows of cohort '{cohort}' "
                             f"(cohorts: {', '.join(map(str, df['cohort'].unique()))})")
    chance = df.groupby("probe", sort=False)["chance"].first()
    fig = Figure(figsize=(5, 5))
    ax = fig.add_subplot()
    for k, (probe, rows) in enumerate(wide.groupby("probe", sort=False)):
        ax.scatter(rows[in_domain], rows[zero_shot], marker=MARKERS[k % len(MARKERS)], color=f"C{k % 10}",
                   label=f"{probe} (chance {chance[probe]:.2f})")
        ax.axhline(chance[probe], color=f"C{k % 10}", ls=":", lw=0.8)
    ax.plot([0, 1], [0, 1], ls="--", color="k", lw=0.8)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel(f"accuracy, {in_domain}")
    ax.set_ylabel(f"accuracy, {zero_shot}")
    ax.legend(fontsize=7)
    return fig


def plot_probe_bars(df: pd.DataFrame, stem: str | Path, title: str = "") -> list[Path]:
    """Per-probe bars to ``<stem>.png`` / ``.pdf``."""
    return save_figure(probe_bars_figure(df, title), stem)


def plot_domain(df: pd.DataFrame, stem: str | Path, in_domain: str, zero_shot: str) -> list[Path]:
    """In-domain vs zero-shot to ``<stem>.png`` / ``.pdf``."""
    return save_figure(domain_figure(df, in_domain, zero_shot), stem)


def report_figures(results, long, stages: set, add, metrics, notes: list) -> None:
    """SPAR Tables 1/5 and Section 4 (spar.md) for a run's report
    (the contract: :func:`robustbench_fm.report.html.figures`)."""
    if "spar" not in stages:
        return
    try:
        probes = probe_table(results.summaries("spar"))
    except ValueError as exc:
        notes.append(f"SPAR figures not drawn: {exc}")
        probes = pd.DataFrame()
    for cohort, rows in (probes.groupby("cohort", sort=False) if len(probes) else []):
        kind = "in domain" if rows["in_domain"].iloc[0] else "zero-shot"
        add(f"spar_probes_{cohort}: per-probe accuracy on {cohort} ({kind}) with chance levels "
            "(SPAR Tables 1/5)", plot_probe_bars, rows, title=f"{cohort} ({kind})")
    home = sorted(set(probes.loc[probes["in_domain"], "cohort"])) if len(probes) else []
    for away in (sorted(set(probes.loc[~probes["in_domain"], "cohort"])) if home else []):
        add(f"spar_domain_{away}: in-domain ({home[0]}) against zero-shot ({away}) accuracy (SPAR Section 4)",
            plot_domain, probes, in_domain=home[0], zero_shot=away)
