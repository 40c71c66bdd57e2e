"""The CANDOR paper's figures from plain result tables (candor.md Figures 2-3, candor_v1.md Figure 2b).

Inputs are DataFrames with one row per (encoder, task), as the long-format collector pivots them:

* Figure 2 (:func:`positives_figure`): ``n`` (positive queries), ``d`` and ``d_all``: D_all
  falls with the number of positives (unequal candidate sets), D does not ("Unequal Candidate
  Sets"; the paper reports Spearman -0.883 and -0.084 over 132 combinations);
* v1 Figure 2b (:func:`collapse_figure`): ``task``, ``encoder``, ``d``: the collapse rate per
  task, one marker per encoder, with the chance level 1/2;
* Figure 3 (:func:`retention_figure`): ``encoder``, ``d``, ``retention``: retention against D.

Each ``*_figure`` draws on a fresh :class:`matplotlib.figure.Figure`; each ``plot_*`` writes
``<stem>.png`` and ``<stem>.pdf`` (:func:`.croma_plots.save_figure`) and returns the paths.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from scipy.stats import spearmanr

from .croma_plots import _require, save_figure

CHANCE = 0.5
MARKERS = "os^vD<>pP*Xh"


def _rho(x, y) -> float:
    """Spearman's ρ, NaN with fewer than 3 points or a constant axis (no ranking to correlate)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(spearmanr(x, y).statistic)


def positives_figure(df: pd.DataFrame) -> Figure:
    """D and D_all against the number of positive queries (log axis), one point per
    (encoder, task), Spearman ρ of each in the legend, chance 1/2 dashed (candor.md Figure 2)."""
    _require(df, ("n", "d", "d_all"), "D vs positives")
    fig = Figure(figsize=(5.5, 4))
    ax = fig.add_subplot()
    for col, label, colour in (("d_all", "$D_{all}$ (unequal sets)", "C3"), ("d", "$D$ (equal sets)", "C0")):
        ax.scatter(df["n"], df[col], s=14, color=colour, alpha=0.8,
                   label=f"{label}: Spearman ρ = {_rho(df['n'], df[col]):.3f}")
    ax.axhline(CHANCE, ls="--", color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_ylim(0, 1)
    ax.set_xlabel("number of positive queries")
    ax.set_ylabel("discordance rate")
    ax.legend(fontsize=8, loc="lower left")
    return fig


def collapse_figure(df: pd.DataFrame) -> Figure:
    """Collapse rate D per task, one marker per encoder, chance 1/2 dashed (candor_v1.md Figure 2b)."""
    _require(df, ("task", "encoder", "d"), "collapse per task")
    tasks = list(dict.fromkeys(df["task"]))
    fig = Figure(figsize=(max(4.5, 0.9 * len(tasks) + 2.5), 4))
    ax = fig.add_subplot()
    for k, (encoder, rows) in enumerate(df.groupby("encoder", sort=True)):
        x = np.array([tasks.index(t) for t in rows["task"]], float) + (k % 5 - 2) * 0.05
        ax.scatter(x, rows["d"], marker=MARKERS[k % len(MARKERS)], color=f"C{k % 10}", label=str(encoder))
    ax.axhline(CHANCE, ls="--", color="k", lw=0.8)
    ax.set_xticks(range(len(tasks)), tasks, rotation=30, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel("collapse rate $D$")
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def retention_figure(df: pd.DataFrame) -> Figure:
    """Retention against D, one labelled point per encoder, Spearman ρ in the title (candor.md Figure 3)."""
    _require(df, ("encoder", "d", "retention"), "retention vs D")
    fig = Figure(figsize=(5, 4))
    ax = fig.add_subplot()
    ax.scatter(df["d"], df["retention"], color="C0")
    for _, row in df.iterrows():
        ax.annotate(str(row["encoder"]), (row["d"], row["retention"]), fontsize=7, xytext=(4, 3),
                    textcoords="offset points")
    ax.set_title(f"Spearman ρ = {_rho(df['d'], df['retention']):.2f}", fontsize=9)
    ax.set_xlabel("collapse rate $D$")
    ax.set_ylabel("retention (cosine)")
    return fig


def plot_positives(df: pd.DataFrame, stem: str | Path) -> list[Path]:
    """Figure 2 to ``<stem>.png`` / ``.pdf``."""
    return save_figure(positives_figure(df), stem)


def plot_collapse(df: pd.DataFrame, stem: str | Path) -> list[Path]:
    """v1 Figure 2b to ``<stem>.png`` / ``.pdf``."""
    return save_figure(collapse_figure(df), stem)


def plot_retention(df: pd.DataFrame, stem: str | Path) -> list[Path]:
    """Figure 3 to ``<stem>.png`` / ``.pdf``."""
    return save_figure(retention_figure(df), stem)
