"""The CANDOR paper's figures from plain result tables (candor.md Figures 2-3, candor_v1.md Figure 2b).

Inputs are DataFrames with one row per (encoder, task), as the long-format collector pivots them:

* Figure 2 (:func:`positives_figure`): ``n`` (positive queries), ``d``, ``d_all`` and optionally
  ``encoder``: D_all falls with the number of positives (unequal candidate sets), D does not
  ("Unequal Candidate Sets"; the paper reports Spearman -0.883 and -0.084 over 132 combinations);
* v1 Figure 2b (:func:`collapse_figure`): ``task``, ``encoder``, ``d``: the collapse rate per
  task, one marker per encoder, with the chance level 1/2;
* Figure 3 (:func:`retention_figure`): ``encoder``, ``d``, ``retention``: retention against D.

Each ``*_figure`` draws on a fresh :class:`matplotlib.figure.Figure`; each ``plot_*`` writes
``<stem>.png`` and ``<stem>.pdf`` (:func:`robustbench_fm.paper.figures.save_figure`) and returns the paths.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullFormatter

from ...core.stats import spearman
from ...paper.figures import require_columns, save_figure

CHANCE = 0.5
MARKERS = "os^vD<>pP*Xh"
#: y-limits of the rate axes: 0 and 1 drawn whole, not clipped at the frame
RATE_LIMITS = (-0.05, 1.05)
#: D and D_all sit this factor left and right of their number of positives (log axis)
OFFSET = 1.08
#: encoders sit this factor apart around their number of positives (log axis), so none hides another
DODGE = 1.035
#: points labelled with their encoder's name up to this many per measure
MAX_LABELS = 12




def _error_bars(ax, x, df: pd.DataFrame, col: str, colour) -> None:
    """Each point's 95% interval (``<col>_ci_low`` / ``_ci_high``, where the frame has them) as a
    vertical bar in its colour."""
    if f"{col}_ci_low" not in df.columns:
        return
    lo, hi, y = (df[c].to_numpy(float) for c in (f"{col}_ci_low", f"{col}_ci_high", col))
    ok = np.isfinite(lo) & np.isfinite(hi) & np.isfinite(y)
    colours = np.broadcast_to(np.asarray(colour, dtype=object), y.shape)
    for xi, yi, l_, h_, c in zip(np.asarray(x, float)[ok], y[ok], lo[ok], hi[ok], colours[ok]):
        ax.errorbar(xi, yi, yerr=[[yi - l_], [h_ - yi]], fmt="none", ecolor=c, elinewidth=0.9, capsize=2, zorder=2)


def _rate_axis(ax, label: str) -> None:
    """0 to 1 with a margin, the chance level 1/2 dashed."""
    ax.axhline(CHANCE, ls="--", color="k", lw=0.8)
    ax.annotate("chance 1/2", (1, CHANCE), xycoords=("axes fraction", "data"), xytext=(-3, 3),
                textcoords="offset points", ha="right", va="bottom", fontsize=7)
    ax.set_ylim(*RATE_LIMITS)
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.set_ylabel(label)


def positives_figure(df: pd.DataFrame) -> Figure:
    """D (filled circles) and D_all (open triangles, shifted right) against the number of positive
    queries (log axis), one colour per encoder (encoders side by side, each point with its 95%
    interval where the frame has one), each point labelled with its encoder where there
    are few; Spearman ρ of each measure in the legend where it is defined (3 or more distinct
    points); chance 1/2 dashed (candor.md Figure 2)."""
    require_columns(df, ("n", "d", "d_all"), "D vs positives")
    encoders = list(dict.fromkeys(df["encoder"].astype(str))) if "encoder" in df.columns else [""]
    colours = {e: f"C{k % 10}" for k, e in enumerate(encoders)}
    fig = Figure(figsize=(6.5, 4.2))
    ax = fig.add_subplot()
    n = df["n"].astype(float)
    shown = []
    for col, label, marker, shift in (("d_all", "$D_{all}$ (all candidates)", "^", OFFSET),
                                      ("d", "$D$ (equal sets)", "o", 1 / OFFSET)):
        enc = df["encoder"].astype(str) if "encoder" in df.columns else pd.Series("", index=df.index)
        colour = enc.map(colours)
        # encoders side by side around their number of positives, so none hides another's markers
        x = n * shift * DODGE ** (enc.map({e: k for k, e in enumerate(encoders)}) - (len(encoders) - 1) / 2)
        _error_bars(ax, x, df, col, colour)
        ax.scatter(x, df[col], s=28, marker=marker, zorder=3, linewidths=1.2,
                   facecolors="none" if col == "d_all" else colour, edgecolors=colour)
        rho = spearman(n, df[col])
        shown.append(Line2D([], [], ls="", marker=marker, color="0.3", mfc="none" if col == "d_all" else "0.3",
                            label=label if np.isnan(rho) else f"{label}: Spearman ρ = {rho:.3f}"))
        if col == "d" and len(df) <= MAX_LABELS and encoders != [""]:
            for x_, y, name in zip(x, df[col], enc):
                ax.annotate(name, (x_, y), xytext=(-5, 0), textcoords="offset points", ha="right", va="center",
                            fontsize=7, color=colours[name])
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    if n.nunique() == 1:  # one number of positives: room for the labels on its left, one tick
        ax.set_xlim(n.iloc[0] / 4, n.iloc[0] * 2)
        ax.set_xticks([n.iloc[0]])
    _rate_axis(ax, "discordance rate")
    ax.set_xlabel("number of positive queries")
    ax.legend(handles=shown, fontsize=8, loc="upper left")  # get_legend(): the measures and their ρ
    fig.tight_layout()
    if encoders != [""]:  # a figure legend, so the tight bounding box of the saved file holds it
        box = ax.get_position()
        fig.legend(handles=[Line2D([], [], ls="", marker="s", color=colours[e], label=e) for e in encoders],
                   fontsize=7, loc="upper left", bbox_to_anchor=(box.x1 + 0.01, box.y1), title="encoder",
                   title_fontsize=7)
    return fig


def collapse_figure(df: pd.DataFrame) -> Figure:
    """Collapse rate D per task (x: the tasks, in order), one marker and colour per encoder, the
    encoders side by side within ±0.3 of their task, chance 1/2 dashed (candor_v1.md Figure 2b)."""
    require_columns(df, ("task", "encoder", "d"), "collapse per task")
    tasks = list(dict.fromkeys(df["task"]))
    encoders = sorted(df["encoder"].astype(str).unique())
    width = 0.6 / max(len(encoders), 1)
    fig = Figure(figsize=(max(4.5, 0.9 * len(tasks) + 2.5), 4))
    ax = fig.add_subplot()
    for k, encoder in enumerate(encoders):
        rows = df[df["encoder"].astype(str) == encoder]
        x = np.array([tasks.index(t) for t in rows["task"]], float) + (k - (len(encoders) - 1) / 2) * width
        _error_bars(ax, x, rows, "d", f"C{k % 10}")
        ax.scatter(x, rows["d"], marker=MARKERS[k % len(MARKERS)], color=f"C{k % 10}", label=encoder, zorder=3)
    ax.set_xticks(range(len(tasks)), tasks, rotation=30, ha="right")
    ax.set_xlim(-0.5, len(tasks) - 0.5)
    ax.set_xlabel("task")
    _rate_axis(ax, "collapse rate $D$")
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1), title="encoder", title_fontsize=7)
    fig.tight_layout()
    return fig


def retention_figure(df: pd.DataFrame) -> Figure:
    """Retention against D, one labelled point per encoder, Spearman ρ in the title (candor.md Figure 3)."""
    require_columns(df, ("encoder", "d", "retention"), "retention vs D")
    fig = Figure(figsize=(5, 4))
    ax = fig.add_subplot()
    ax.scatter(df["d"], df["retention"], color="C0")
    for _, row in df.iterrows():
        ax.annotate(str(row["encoder"]), (row["d"], row["retention"]), fontsize=7, xytext=(4, 3),
                    textcoords="offset points")
    rho = spearman(df["d"], df["retention"])
    if not np.isnan(rho):  # no ρ from fewer than 3 distinct points
        ax.set_title(f"Spearman ρ = {rho:.2f}", fontsize=9)
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


def report_figures(results, long, stages: set, add, metrics, notes: list) -> None:
    """CANDOR Figures 2-3 (candor.md) and v1 Figure 2b for a run's report
    (the contract: :func:`robustbench_fm.report.html.figures`)."""
    if "candor" not in stages:
        return
    candor = metrics(long, "candor")
    candor = candor[~candor["task"].astype(str).str.contains("__")].copy()  # not the pools across tasks
    several = candor["dataset"].nunique() > 1
    candor["task"] = (candor["dataset"] + "/" + candor["task"]) if several else candor["task"]
    if len(candor):
        add("candor_positives: D and D_all against the number of positives (CANDOR Figure 2)",
            plot_positives, candor)
    if candor["task"].nunique() > 1:  # with one task the positives figure already shows each encoder's D
        add("candor_collapse: collapse rate per task, one marker per encoder (CANDOR v1 Figure 2b)",
            plot_collapse, candor)
    if "retention" in stages:
        ret = metrics(long, "retention").groupby("encoder")["retention"].mean()
        both = candor.groupby("encoder")["d"].mean().to_frame().join(ret, how="inner").reset_index()
        add("candor_retention: retention against D (CANDOR Figure 3)", plot_retention, both)
