"""The CRoMa paper's figures from plain result tables (croma.md Figures 3–6 and 9).

Inputs are DataFrames, one row per sample or per encoder:

* ``per_sample``: encoder, croma, d_so, d_os (the ``croma`` stage's per-sample table with an
  ``encoder`` column added);
* ``summary``: encoder, croma (median CRoMa), ltm (LTM₁₀) and, for Figure 6, apd and/or
  apd_id / apd_ood (the ``shortcut`` stage's APD per test set);
* ``probe`` (Figure 6's top row): encoder, test_set (id / ood), replicate, cramers_v, accuracy
  (the ``shortcut`` stage's per-sample table with an ``encoder`` column added).

Each ``*_figure`` function draws on a fresh :class:`matplotlib.figure.Figure` (no pyplot, no
global backend change; PNG and PDF are rendered by the Agg / PDF canvases) and each ``plot_*``
function writes ``<stem>.png`` and ``<stem>.pdf`` atomically and returns their paths.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from scipy.stats import gaussian_kde, spearmanr, t

from ...paper.figures import require_columns, save_figure
from .params import CONTROLS

APD_COLUMNS = {"apd": "APD", "apd_id": "APD (in-domain)", "apd_ood": "APD (out-of-domain)"}
#: APD column -> the shortcut stage's test_set it summarises
TEST_SETS = {"apd_id": "id", "apd_ood": "ood"}


def pareto_frontier(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Upper-right Pareto frontier (croma.md §3.3, Figure 3): point i is on it unless another
    point is at least as good on both axes and strictly better on one."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    dominated = ((x[None, :] >= x[:, None]) & (y[None, :] >= y[:, None])
                 & ((x[None, :] > x[:, None]) | (y[None, :] > y[:, None]))).any(axis=1)
    return ~dominated


def ridgeline_figure(per_sample: pd.DataFrame, value_col: str = "croma", overlap: float = 0.7) -> Figure:
    """Per-sample CRoMa density per encoder, one ridge each, ordered by median (highest on top);
    dashed line at 0 and the confounder-dominant side (< 0) shaded (croma.md Figure 4). Densities
    are Gaussian KDEs (Scott's bandwidth), each scaled to the same peak height."""
    require_columns(per_sample, ("encoder", value_col), "ridgeline")
    medians = per_sample.groupby("encoder")[value_col].median().sort_values()
    grid = np.linspace(-1, 1, 400)
    fig = Figure(figsize=(6, 0.45 * len(medians) + 1.2))
    ax = fig.add_subplot()
    ax.axvspan(-1, 0, color="0.9", zorder=0)
    for level, encoder in enumerate(medians.index):
        values = per_sample.loc[per_sample["encoder"] == encoder, value_col].to_numpy(float)
        if np.ptp(values) > 0:
            density = gaussian_kde(values)(grid)
        else:
            density = np.exp(-0.5 * ((grid - values[0]) / 0.01) ** 2)
        ridge = level + density / density.max() * (1 + overlap)
        ax.fill_between(grid, level, ridge, alpha=0.6, zorder=2 * len(medians) - 2 * level, label=encoder)
        ax.plot(grid, ridge, color="k", lw=0.6, zorder=2 * len(medians) - 2 * level + 1)
    ax.axvline(0, ls="--", color="k", lw=0.8, zorder=2 * len(medians) + 2)
    ax.set_yticks(np.arange(len(medians)) + 0.2, medians.index)
    ax.set_xlim(-1, 1)
    ax.set_xlabel("per-sample CRoMa")
    return fig


def pareto_figure(summary: pd.DataFrame, frontier: list[str] | None = None, x_col: str = "croma",
                  y_col: str = "ltm") -> Figure:
    """Median CRoMa against LTM₁₀, one labelled point per encoder; frontier points ringed,
    dominated ones shaded (croma.md Figures 3, 14, 15; Figure 5 is :func:`mean_rank_figure`).
    ``frontier`` names the frontier encoders; ``None`` computes it with :func:`pareto_frontier`."""
    require_columns(summary, ("encoder", x_col, y_col), "pareto")
    on = (summary["encoder"].isin(frontier).to_numpy() if frontier is not None
          else pareto_frontier(summary[x_col], summary[y_col]))
    fig = Figure(figsize=(5.5, 4.5))
    ax = fig.add_subplot()
    ax.scatter(summary[x_col][~on], summary[y_col][~on], color="0.6", alpha=0.5, label="dominated")
    ax.scatter(summary[x_col][on], summary[y_col][on], color="C0", label="Pareto frontier")
    ax.scatter(summary[x_col][on], summary[y_col][on], s=220, facecolors="none", edgecolors="C0", lw=1.5)
    for _, row in summary.iterrows():
        ax.annotate(str(row["encoder"]), (row[x_col], row[y_col]), fontsize=7, xytext=(4, 3),
                    textcoords="offset points")
    ax.set_xlabel("median CRoMa")
    ax.set_ylabel("LTM$_{10}$ (worst-decile mean)")
    ax.legend(fontsize=8, loc="lower right")
    return fig


def mean_rank_figure(ranks: pd.DataFrame, benchmarks: list[str] | None = None, x_col: str = "mean_croma_rank",
                     y_col: str = "mean_ltm_rank") -> Figure:
    """Figure 5 (croma.md §3.4): each encoder's mean rank by median CRoMa (x) against its mean
    rank by LTM₁₀ (y) across the tile benchmarks, rank 1 = best; both axes inverted so that
    better ranks lie toward the upper-right corner; frontier points (``pareto`` column, from
    :func:`robustbench_fm.methods.croma.panel.mean_ranks`) ringed, dominated ones shaded."""
    require_columns(ranks, ("encoder", x_col, y_col, "pareto"), "mean ranks")
    on = ranks["pareto"].to_numpy(bool)
    fig = Figure(figsize=(5.5, 4.5))
    ax = fig.add_subplot()
    ax.scatter(ranks[x_col][~on], ranks[y_col][~on], color="0.6", alpha=0.5, label="dominated")
    ax.scatter(ranks[x_col][on], ranks[y_col][on], color="C0", label="Pareto frontier")
    ax.scatter(ranks[x_col][on], ranks[y_col][on], s=220, facecolors="none", edgecolors="C0", lw=1.5)
    for _, row in ranks.iterrows():
        ax.annotate(str(row["encoder"]), (row[x_col], row[y_col]), fontsize=7, xytext=(4, 3),
                    textcoords="offset points")
    ax.invert_xaxis()
    ax.invert_yaxis()
    over = f" over {', '.join(benchmarks)}" if benchmarks else ""
    ax.set_xlabel(f"mean median-CRoMa rank{over} (1 = highest)")
    ax.set_ylabel("mean LTM$_{10}$ rank (1 = mildest tail)")
    ax.legend(fontsize=8, loc="lower left")
    return fig


def hdr_outline(x, y, mass: float = 0.75, grid: int = 160) -> list[np.ndarray]:
    """Closed polygons bounding the highest-density region that holds ``mass`` of the points
    (x, y): the region where a Gaussian KDE (Scott's bandwidth) exceeds the level that the
    ⌈mass·n⌉ densest points are above (midway to the next point's density; Hyndman 1996), traced
    on a ``grid`` × ``grid`` lattice padded so every contour closes. Returns one (n, 2) vertex
    array per connected piece."""
    import contourpy

    pts = np.vstack([np.asarray(x, float), np.asarray(y, float)])
    if pts.shape[1] < 3 or np.linalg.matrix_rank(pts - pts.mean(axis=1, keepdims=True)) < 2:
        raise ValueError("hdr outline: needs at least 3 points not on one line")
    kde = gaussian_kde(pts)
    dens = np.sort(kde(pts))
    need = int(np.ceil(mass * len(dens)))
    level = float(dens[0] / 2 if need >= len(dens) else (dens[-need] + dens[-need - 1]) / 2)
    pad = 4 * np.sqrt(np.diag(kde.covariance))
    xs = np.linspace(pts[0].min() - pad[0], pts[0].max() + pad[0], grid)
    ys = np.linspace(pts[1].min() - pad[1], pts[1].max() + pad[1], grid)
    gx, gy = np.meshgrid(xs, ys)
    density = kde(np.vstack([gx.ravel(), gy.ravel()])).reshape(gx.shape)
    return [line for line in contourpy.contour_generator(gx, gy, density).lines(level) if len(line) > 2]


def typed_distance_figure(per_sample: pd.DataFrame, mass: float = 0.75) -> Figure:
    """The typed-distance plane (croma.md Figure 9): d_SO (x) against d_OS (y) on log axes, one
    point per sample coloured by encoder, an outline around the ``mass`` (75%) highest-density
    region of each encoder's cloud (computed in log space, :func:`hdr_outline`), filled larger
    markers at each encoder's medians, and the diagonal d_OS = d_SO (CRoMa = 0; above it biology
    dominates)."""
    require_columns(per_sample, ("encoder", "d_so", "d_os"), "typed-distance plane")
    if ((per_sample["d_so"] <= 0) | (per_sample["d_os"] <= 0)).any():
        raise ValueError("typed-distance plane: d_so and d_os must be positive for log axes")
    fig = Figure(figsize=(5.5, 5))
    ax = fig.add_subplot()
    for k, (encoder, rows) in enumerate(per_sample.groupby("encoder", sort=True)):
        ax.scatter(rows["d_so"], rows["d_os"], s=4, alpha=0.3, color=f"C{k % 10}", label=str(encoder))
        ax.scatter([rows["d_so"].median()], [rows["d_os"].median()], s=80, color=f"C{k % 10}",
                   edgecolors="k", zorder=3)
        if len(rows) >= 3 and np.ptp(np.log10(rows["d_so"])) > 0 and np.ptp(np.log10(rows["d_os"])) > 0:
            for poly in hdr_outline(np.log10(rows["d_so"]), np.log10(rows["d_os"]), mass):
                ax.plot(10 ** poly[:, 0], 10 ** poly[:, 1], color=f"C{k % 10}", lw=1.2, zorder=2)
    lo = float(per_sample[["d_so", "d_os"]].min().min()) / 1.5
    hi = float(per_sample[["d_so", "d_os"]].max().max()) * 1.5
    ax.plot([lo, hi], [lo, hi], ls="--", color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("$d^{SO}_m$ (cross-centre, same biology)")
    ax.set_ylabel("$d^{OS}_m$ (same centre, other biology)")
    ax.legend(fontsize=7, markerscale=3)
    return fig


def _accuracy_panel(ax, probe: pd.DataFrame, test_set: str) -> None:
    """Balanced-test probe accuracy against the training set's Cramér's V, one dashed curve per
    encoder with 95% t-intervals over the replicates (Figure 6, top row)."""
    rows = probe[probe["test_set"] == test_set]
    for k, (encoder, part) in enumerate(rows.groupby("encoder", sort=True)):
        stats = part.groupby("cramers_v")["accuracy"].agg(["mean", "std", "count"]).sort_index()
        half = t.ppf(0.975, np.maximum(stats["count"] - 1, 1)) * stats["std"].fillna(0) / np.sqrt(stats["count"])
        ax.errorbar(stats.index.to_numpy(float), stats["mean"].to_numpy(float), yerr=half.to_numpy(float), ls="--",
                    marker="o", ms=3, lw=1, capsize=2, color=f"C{k % 10}", label=str(encoder))
    ax.set_xlabel("Cramér's V (centre–label association in training)")
    ax.set_ylabel("balanced-test accuracy")
    ax.set_xlim(-0.03, 1.03)


def croma_apd_figure(summary: pd.DataFrame, x_col: str = "croma", probe: pd.DataFrame | None = None) -> Figure:
    """Median CRoMa against APD, one labelled point per encoder and one panel per APD column
    present (apd, apd_id, apd_ood), Spearman ρ in each title and dashed lines at CRoMa = 0 and
    APD = 0 (croma.md Figure 6, Table 11). With ``probe`` a top row is added above each apd_id /
    apd_ood panel: the probe's balanced-test accuracy as the training set's centre–label Cramér's V
    rises from 0 to 1, per encoder, with 95% t-intervals over the replicates."""
    cols = [c for c in APD_COLUMNS if c in summary.columns]
    require_columns(summary, ("encoder", x_col), "croma-vs-apd")
    if not cols:
        raise ValueError(f"croma-vs-apd: no APD column (one of {', '.join(APD_COLUMNS)}); add the shortcut "
                         "stage's APD per encoder")
    if probe is not None:
        require_columns(probe, ("encoder", "test_set", "cramers_v", "accuracy"), "croma-vs-apd probe")
    top = probe is not None
    fig = Figure(figsize=(4.5 * len(cols), 8 if top else 4))
    for k, col in enumerate(cols):
        ax = fig.add_subplot(2 if top else 1, len(cols), len(cols) * top + k + 1)
        ax.scatter(summary[x_col], summary[col], color="C0")
        for _, row in summary.iterrows():
            ax.annotate(str(row["encoder"]), (row[x_col], row[col]), fontsize=7, xytext=(4, 3),
                        textcoords="offset points")
        ax.axvline(0, ls="--", color="0.5", lw=0.8)
        ax.axhline(0, ls="--", color="0.5", lw=0.8)
        rho = spearmanr(summary[x_col], summary[col]).statistic if len(summary) > 2 else np.nan
        ax.set_title(f"{APD_COLUMNS[col]}: Spearman ρ = {rho:.2f}", fontsize=9)
        ax.set_xlabel("median CRoMa")
        ax.set_ylabel(APD_COLUMNS[col])
        if top and col in TEST_SETS:
            upper = fig.add_subplot(2, len(cols), k + 1)
            _accuracy_panel(upper, probe, TEST_SETS[col])
            upper.set_title(APD_COLUMNS[col].replace("APD", "probe accuracy"), fontsize=9)
            if k == 0:
                upper.legend(fontsize=6)
    if top:
        fig.subplots_adjust(hspace=0.35)
    return fig


def plot_ridgeline(per_sample: pd.DataFrame, stem: str | Path) -> list[Path]:
    """Figure 4 to ``<stem>.png`` / ``.pdf``."""
    return save_figure(ridgeline_figure(per_sample), stem)


def plot_pareto(summary: pd.DataFrame, stem: str | Path, frontier: list[str] | None = None) -> list[Path]:
    """Figures 3, 14, 15 to ``<stem>.png`` / ``.pdf``."""
    return save_figure(pareto_figure(summary, frontier), stem)


def plot_mean_ranks(ranks: pd.DataFrame, stem: str | Path, benchmarks: list[str] | None = None) -> list[Path]:
    """Figure 5 to ``<stem>.png`` / ``.pdf``."""
    return save_figure(mean_rank_figure(ranks, benchmarks), stem)


def plot_typed_distances(per_sample: pd.DataFrame, stem: str | Path) -> list[Path]:
    """Figure 9 to ``<stem>.png`` / ``.pdf``."""
    return save_figure(typed_distance_figure(per_sample), stem)


def plot_croma_vs_apd(summary: pd.DataFrame, stem: str | Path, probe: pd.DataFrame | None = None) -> list[Path]:
    """Figure 6 (with its top row when ``probe`` is given) to ``<stem>.png`` / ``.pdf``."""
    return save_figure(croma_apd_figure(summary, probe=probe), stem)


def report_figures(results, long, stages: set, add, metrics, notes: list) -> None:
    """CRoMa Figures 3-6 and 9 (croma.md) for a run's report
    (the contract: :func:`robustbench_fm.report.html.figures`)."""
    if "croma" not in stages:
        return
    summary = metrics(long, "croma")
    per_sample = results.per_sample("croma")
    if "shortcut" in stages:
        apd = long[(long["stage"] == "shortcut") & (long["metric"] == "apd")]
        apd = apd.assign(col=apd["group"].map(lambda g: f"apd_{g}" if g in ("id", "ood") else "apd"))
        summary = summary.merge(apd.pivot_table(index="encoder", columns="col", values="value").reset_index(),
                                on="encoder", how="left")
    for dataset, rows in summary.groupby("dataset", sort=False):
        pathology = rows[~rows["encoder"].isin(CONTROLS)]  # the paper's planes leave the control out
        if len(pathology):
            add(f"croma_pareto_{dataset}: median CRoMa against LTM10 of the pathology encoders on {dataset} "
                "(CRoMa Figures 3, 14, 15)", plot_pareto, pathology)
        if any(c in rows for c in APD_COLUMNS):
            add(f"croma_apd_{dataset}: CRoMa against APD on {dataset} (CRoMa Figure 6)",
                plot_croma_vs_apd, rows)
    for dataset, rows in (per_sample.groupby("dataset", sort=False) if len(per_sample) else []):
        add(f"croma_ridgeline_{dataset}: per-sample CRoMa on {dataset} (CRoMa Figure 4)",
            plot_ridgeline, rows)
        add(f"croma_typed_{dataset}: typed-distance plane on {dataset} (CRoMa Figure 9)",
            plot_typed_distances, rows)
