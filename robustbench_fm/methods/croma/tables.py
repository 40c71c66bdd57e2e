"""The CRoMa paper's tables and figures from a finished sweep (croma.md §2.7, §3, Appendix A).

The panel they read is the collect step's: every benchmark's encoders re-scored from the jobs'
stored features at one operating k (:func:`~robustbench_fm.methods.croma.rescore.croma_panel`;
the protocols, the k policy and the saved folder are described in
:mod:`~robustbench_fm.methods.croma.rescore`). The paper's row labels come from
:mod:`~robustbench_fm.methods.croma.labels`.

Table frames use the published CSVs' exact row labels (``Model`` / ``Benchmark`` / ``Metric``
column; ``section`` first where the paper repeats row labels across panels) and column headers.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ...core.atomic import write_text_atomic
from ...core.errors import UserError
from ...core.stats import spearman
from ...core.tables import PaperTable, SweepResults
from .labels import BENCHMARKS, label
from .params import CONTROLS
from .rescore import PANEL_DIR, Panel, benchmark_groups, croma_panel, panel_manifest, typed_rank_medians

#: the three tile benchmarks Figure 5 averages ranks over (croma.md §3.4)
TILE_BENCHMARKS = ("pathorob_camelyon", "pathorob_tcga4x4", "pathorob_tolkach")
TABLES = ["croma_table3", "croma_table4", "croma_table5", "croma_table7", "croma_table8", "croma_table9",
          "croma_table10", "croma_table11", "croma_table12", "croma_table13", "croma_table14", "croma_figures"]

#: published column -> panel summary column (Δ = MaRI − RI)
SCORE_COLUMNS = {"bio bacc": "bio_knn_bacc", "conf bacc": "conf_knn_bacc", "RI": "ri", "MaRI": "mari",
                 "Δ": None, "CRoMa": "croma", "F(0)": "f0", "LTM10": "ltm", "support": "support"}
#: bold = best per score column (captions: conf bacc and Δ are diagnostics)
BEST = {"bio bacc": "max", "RI": "max", "MaRI": "max", "CRoMa": "max", "F(0)": "min", "LTM10": "max",
        "support": "max"}


# ----------------------------------------------------------------------------- layouts
def _ordered(frame: pd.DataFrame) -> pd.DataFrame:
    """Pathology encoders by CRoMa (highest first), then the natural-image controls."""
    control = frame["encoder"].isin(CONTROLS)
    return pd.concat([frame[~control].sort_values("croma", ascending=False, kind="stable"),
                      frame[control]], ignore_index=True)


def _score_frame(rows: pd.DataFrame, slide: bool = False) -> pd.DataFrame:
    out = pd.DataFrame({"Model": [label(e, slide) for e in rows["encoder"]]})
    for col, source in SCORE_COLUMNS.items():
        out[col] = (rows["mari"] - rows["ri"]).to_numpy() if source is None else rows[source].to_numpy()
    return out


def _benchmark_rows(results: SweepResults, key: str) -> dict[str, pd.DataFrame]:
    summary = croma_panel(results).summary
    rows = summary[summary["benchmark"] == key]
    if rows.empty:
        raise UserError(f"croma tables: the sweep {results.root} has no {BENCHMARKS.get(key, key)} ({key}) "
                         f"results; benchmarks present: {', '.join(sorted(summary['benchmark'].unique()))}")
    return {str(f): _ordered(g) for f, g in rows.groupby("finding", sort=False)}


def _score_table(results: SweepResults, key: str, name: str, caption: str) -> list[PaperTable]:
    """Tables 3, 4, 5 and 13: one row per encoder at the panel's median k (one table per finding)."""
    tables = []
    per_finding = _benchmark_rows(results, key)
    for finding, rows in per_finding.items():
        how = rows["k_policy"].iloc[0] if "k_policy" in rows else f"k = {int(rows['k'].iloc[0])}"
        tables.append(PaperTable(name if len(per_finding) == 1 else f"{name}_{finding}", _score_frame(rows),
                                 f"{caption} Shared operating point: {how} (label: {finding}). {F0_NOTE}", BEST))
    return tables


#: croma.md Eq. 12 writes F(0) = P[CRoMa_m(i) < 0]; the reference (croma 1.0.1) and this package count ≤ 0
F0_NOTE = "F(0) = share of samples with CRoMa <= 0 (croma 1.0.1; the paper's Eq. 12 writes < 0)."


def croma_table3(results: SweepResults) -> list[PaperTable]:
    """Table 3: robustness on Camelyon (median-k)."""
    return _score_table(results, "pathorob_camelyon", "croma_table3", "Table 3: robustness on Camelyon.")


def croma_table4(results: SweepResults) -> list[PaperTable]:
    """Table 4: robustness on TCGA-4x4 (median-k)."""
    return _score_table(results, "pathorob_tcga4x4", "croma_table4", "Table 4: robustness on TCGA-4x4.")


def croma_table5(results: SweepResults) -> list[PaperTable]:
    """Table 5: robustness on Tolkach-ESCA (median-k)."""
    return _score_table(results, "pathorob_tolkach", "croma_table5", "Table 5: robustness on Tolkach-ESCA.")


def croma_table13(results: SweepResults) -> list[PaperTable]:
    """Table 13: robustness on the paired TCGA-2x2 design (median-k)."""
    return _score_table(results, "pathorob_tcga2x2", "croma_table13",
                        "Table 13: robustness on TCGA-2x2 (paired quartets).")


def croma_table14(results: SweepResults) -> list[PaperTable]:
    """Table 14: slide encoders on PCaBiop, (a) cancer detection and (b) ISUP grading (pairs),
    each encoder at its own k*; conf bacc is the maximum over the k grid (A.12)."""
    sections = {"pcabiop-binary": "(a) Cancer detection", "pcabiop-isup": "(b) ISUP grading"}
    summary = croma_panel(results).summary
    parts = []
    for key, section in sections.items():
        rows = summary[summary["benchmark"] == key]
        if rows.empty:
            continue
        rows = rows.sort_values("croma", ascending=False, kind="stable")
        frame = _score_frame(rows.assign(conf_knn_bacc=rows["conf_knn_bacc_max"]), slide=True).drop(columns="Δ")
        frame.insert(0, "section", section)
        frame.insert(2, "k⋆", rows["k"].to_numpy())
        parts.append(frame)
    if not parts:
        raise UserError(f"croma_table14: the sweep {results.root} has no PCaBiop results (dataset pcabiop, "
                         "view binary or isup); run experiment=croma_pcabiop")
    return [PaperTable("croma_table14", pd.concat(parts, ignore_index=True),
                       "Table 14: slide-level encoders on PCaBiop (a) and PCaBiop-ISUP (b), each at its own k*.",
                       {c: d for c, d in BEST.items() if c != "Δ"}, group_by="section")]


def _pathology(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[~frame["encoder"].isin(CONTROLS)]


def _benchmark_label(key: str, table: str) -> str:
    special = {("croma_table8", "pathorob_tcga4x4"): "TCGA (4×4)", ("croma_table9", "pathorob_tcga4x4"): "TCGA 4x4"}
    return special.get((table, key), BENCHMARKS.get(key, key))


def _per_benchmark(frame: pd.DataFrame, row) -> pd.DataFrame:
    """One row per benchmark: ``row(benchmark, part)`` on the benchmark's pathology rows of its first
    finding (Tables 7–9 rank the encoders of one task per benchmark)."""
    return pd.DataFrame([row(key, part[part["finding"] == part["finding"].iloc[0]])
                         for key, part in _pathology(frame).groupby("benchmark", sort=True)])


def croma_table7(results: SweepResults) -> list[PaperTable]:
    """Table 7: Spearman ρ between the LTM_α rankings of the pathology encoders (A.2)."""
    from .panel import alpha_sensitivity  # lazy: imports torch

    def row(key, part):
        r = alpha_sensitivity(part)
        return {"Benchmark": _benchmark_label(key, "croma_table7"), "ρ(0.05,0.10)": r["rho_a0.05_a0.1"],
                "ρ(0.10,0.20)": r["rho_a0.1_a0.2"], "ρ(0.05,0.20)": r["rho_a0.05_a0.2"]}
    return [PaperTable("croma_table7", _per_benchmark(croma_panel(results).by_alpha, row),
                       "Table 7: rank stability of LTM_α across α.", decimals=2)]


def croma_table8(results: SweepResults) -> list[PaperTable]:
    """Table 8: Spearman ρ between the median-CRoMa rankings at m = 1, 5, 20 (A.3); NaN where a
    benchmark's cells are too small for m = 20."""
    from .panel import m_sensitivity  # lazy: imports torch

    def row(key, part):
        pairs = tuple(p for p in ((1, 5), (5, 20), (1, 20)) if set(p) <= set(part["m"]))
        r = m_sensitivity(part, pairs=pairs)
        return {"Benchmark": _benchmark_label(key, "croma_table8"), "n": r["n"],
                **{f"ρ(m={a},m={b})": r.get(f"rho_m{a}_m{b}", np.nan) for a, b in ((1, 5), (5, 20), (1, 20))}}
    return [PaperTable("croma_table8", _per_benchmark(croma_panel(results).by_m, row),
                       "Table 8: rank stability of median CRoMa across m.")]


def croma_table9(results: SweepResults) -> list[PaperTable]:
    """Table 9: Spearman ρ between RI, MaRI and CRoMa over the pathology encoders (median-k)."""
    from .panel import metric_agreement  # lazy: imports torch

    def row(key, part):
        r = metric_agreement(part)
        return {"Benchmark": _benchmark_label(key, "croma_table9"), "RI vs MaRI": r["rho_ri_mari"],
                "CRoMa vs RI": r["rho_croma_ri"], "CRoMa vs MaRI": r["rho_croma_mari"]}
    return [PaperTable("croma_table9", _per_benchmark(croma_panel(results).summary, row),
                       "Table 9: rank agreement of RI, MaRI and CRoMa.", decimals=2)]


TCGA_SITE = "TCGA"  # Tolkach-ESCA's held-out TCGA cohort: medical_center VALSET3_TCGA


def _sample_sites(results: SweepResults, key: str, per_sample: pd.DataFrame) -> pd.Series:
    """sample_id -> site (medical_center) of benchmark ``key``: the per-sample ``site`` column when
    the results carry one, else the rows' site in the benchmark's manifest (rebuilt from its config)."""
    if "site" in per_sample.columns:
        return per_sample.drop_duplicates("sample_id").set_index("sample_id")["site"].astype(str)
    group = benchmark_groups(results)[key]
    manifest = panel_manifest(results, group["cfg"], group["entries"]).drop_duplicates("sample_id")
    return manifest.set_index("sample_id")["site"].astype(str)


def croma_table10(results: SweepResults) -> list[PaperTable]:
    """Table 10: median CRoMa (m=5) on Tolkach-ESCA and on its TCGA extension, and the boost.

    Reading (croma.md A.7: "we re-scored a larger Tolkach-ESCA cohort that adds the held-out TCGA
    cases"; Table 10's Tolkach-ESCA column differs from Table 5's, e.g. Midnight-12k 0.60 vs 0.58):
    ONE CRoMa run (the median-k panel of a Tolkach-ESCA benchmark whose rows include the
    VALSET3_TCGA cases, e.g. a croma job on the larger cohort), whose per-sample values are then
    split by cohort: "Tolkach-ESCA" = median per-sample CRoMa over the rows of the original cohorts
    (every site other than TCGA), "TCGA extension" = median over the TCGA rows. "Boost" =
    median(r on TCGA rows) / median(r on original rows) with r = d_OS/d_SO, the per-sample typed
    distances of the same run (rows with undefined or non-finite r left out). Pathology encoders
    by boost (highest first), then the natural-image control in its own section. The default
    Tolkach view (``tolkach_esca_reduced``, no TCGA rows) cannot give this table."""
    per_sample = croma_panel(results).per_sample
    chosen = None
    for key in sorted(k for k in per_sample["benchmark"].unique() if str(k).startswith("pathorob_tolkach")):
        part = per_sample[per_sample["benchmark"] == key]
        part = part[part["finding"] == part["finding"].iloc[0]]
        sites = part["sample_id"].map(_sample_sites(results, key, part))
        tcga = sites.str.contains(TCGA_SITE, na=False)
        if tcga.any() and (~tcga & sites.notna()).any():
            chosen = (key, part.assign(_tcga=tcga.to_numpy()))
            break
    if chosen is None:
        raise UserError(f"croma_table10: the sweep {results.root} has no Tolkach-ESCA CRoMa results with both the "
                         f"original cohorts and the held-out TCGA cases (site {TCGA_SITE}); the default view "
                         "(tolkach_esca_reduced) has no TCGA rows: score the larger cohort (tolkach_esca.csv)")
    key, part = chosen
    r = part["d_os"] / part["d_so"].where(part["d_so"] > 0)
    part = part.assign(_r=r.where(np.isfinite(r)))
    rows = []
    for encoder, g in part.groupby("encoder", sort=False):
        orig, tcga = g[~g["_tcga"]], g[g["_tcga"]]
        rows.append({"encoder": encoder, "Tolkach-ESCA": orig["croma"].median(),
                     "TCGA extension": tcga["croma"].median(),
                     "Boost": tcga["_r"].median() / orig["_r"].median()})
    frame = pd.DataFrame(rows)
    control = frame["encoder"].isin(CONTROLS)
    frame = pd.concat([frame[~control].sort_values("Boost", ascending=False, kind="stable"), frame[control]],
                      ignore_index=True)
    frame.insert(0, "section", np.where(frame["encoder"].isin(CONTROLS), "natural-image control",
                                        "pathology encoders"))
    frame.insert(1, "Model", [label(e) for e in frame.pop("encoder")])
    return [PaperTable("croma_table10", frame,
                       "Table 10: median CRoMa (m=5) on the original Tolkach-ESCA cohorts and on the held-out TCGA "
                       f"cases of one run ({key}), and the boost in median d_OS/d_SO (TCGA / original).",
                       group_by="section", decimals=2)]


def croma_table12(results: SweepResults) -> list[PaperTable]:
    """Table 12: typed-neighbour ranks on Camelyon: pooled CRoMa and the median (over anchors) rank
    of each anchor's nearest SO match and OS distractor among all other samples, same-slide ones
    included (the reference's definition, :func:`robustbench_fm.methods.croma.panel.typed_ranks`).
    The caption gives the paper's "Pooled across the 20 encoders, the first SO or OS neighbour
    occurs at a median rank of ≈149 among 20,400 candidates", read as the median over every anchor
    of every pathology encoder of min(rank SO, rank OS)."""
    key = "pathorob_camelyon"
    rows = _benchmark_rows(results, key)
    finding, summary = next(iter(rows.items()))
    ranks = typed_rank_medians(results, key).set_index("encoder").loc[summary["encoder"]]
    frame = pd.DataFrame({"Model": [label(e) for e in summary["encoder"]], "CRoMa": summary["croma"].to_numpy(),
                          "median rank SO": ranks["rank_so"].to_numpy(), "median rank OS": ranks["rank_os"].to_numpy()})
    first = _pathology(pd.read_parquet(results.root / PANEL_DIR / f"typed_first_{key}.parquet"))
    pooled = (f" Pooled across the {first['encoder'].nunique()} pathology encoders, the first SO or OS neighbour "
              f"occurs at a median rank of {first['rank_typed'].median():g} among {int(first['candidates'].iloc[0]):,} "
              "candidates (paper: about 149 among 20,400).") if len(first) else ""
    return [PaperTable("croma_table12", frame,
                       f"Table 12: typed-neighbour ranks on Camelyon (label: {finding}).{pooled}", decimals=2)]


def _apd(results: SweepResults) -> pd.DataFrame:
    """encoder, benchmark, apd_id, apd_ood from the sweep's shortcut summaries."""
    shortcut = results.summaries("shortcut")
    if shortcut.empty:
        raise UserError(f"croma_table11: the sweep {results.root} has no shortcut results; "
                         "run experiment=croma_shortcut")
    wide = shortcut.pivot_table(index=["encoder", "dataset"], columns="test_set", values="apd").reset_index()
    wide.columns = [c if c in ("encoder", "dataset") else f"apd_{c}" for c in wide.columns]
    return wide.rename(columns={"dataset": "benchmark"})


def croma_table11(results: SweepResults) -> list[PaperTable]:
    """Table 11: Spearman ρ between CRoMa / RI / MaRI (median-k, ri rows) and APD_ID / APD_OOD over
    the pathology encoders, per benchmark and pooled over all encoder-benchmark pairs."""
    summary = croma_panel(results).summary
    merged = _pathology(_apd(results).merge(summary, on=["encoder", "benchmark"]))
    rows = []
    for test_set, section in (("id", "APD_ID"), ("ood", "APD_OOD")):
        for metric, col in (("CRoMa", "croma"), ("RI", "ri"), ("MaRI", "mari")):
            row = {"section": section, "Metric": metric}
            for key in ("pathorob_camelyon", "pathorob_tcga4x4", "pathorob_tolkach"):
                part = merged[merged["benchmark"] == key]
                ok = part.dropna(subset=[f"apd_{test_set}"]) if f"apd_{test_set}" in part else part.iloc[:0]
                row[BENCHMARKS[key]] = spearman(ok[col], ok[f"apd_{test_set}"]) if len(ok) else np.nan
            pooled = merged.dropna(subset=[f"apd_{test_set}"]) if f"apd_{test_set}" in merged else merged.iloc[:0]
            row["pooled"] = spearman(pooled[col], pooled[f"apd_{test_set}"]) if len(pooled) else np.nan
            rows.append(row)
    return [PaperTable("croma_table11", pd.DataFrame(rows),
                       "Table 11: Spearman ρ of robustness metrics with downstream shortcut susceptibility (APD).",
                       decimals=2)]


# ----------------------------------------------------------------------------- figures
def figure5_ranks(panel: Panel) -> tuple[pd.DataFrame, list[str]]:
    """Figure 5's mean ranks (:func:`robustbench_fm.methods.croma.panel.mean_ranks`): the pathology
    encoders (controls left out) ranked by median CRoMa and by LTM10 within each tile benchmark of
    the sweep (first finding), averaged over those benchmarks; and the benchmarks used. Paper
    (§3.4, Figure 5): "Each of the 3 tile benchmarks ranks the 20 pathology encoders by median
    CRoMa [...] and by worst-decile mean LTM10 [...] The axes show the mean rank across
    benchmarks". A sweep holding fewer tile benchmarks averages over those it holds."""
    from .panel import mean_ranks  # lazy: imports torch

    present = [k for k in TILE_BENCHMARKS if k in set(panel.summary["benchmark"])]
    benches = {}
    for key in present:
        rows = _pathology(panel.summary[panel.summary["benchmark"] == key])
        benches[BENCHMARKS[key]] = rows[rows["finding"] == rows["finding"].iloc[0]]
    return (mean_ranks(benches) if benches else pd.DataFrame()), [BENCHMARKS[k] for k in present]


def croma_figures(results: SweepResults) -> list[PaperTable]:
    """Figures 3/4/9 (and 6 with shortcut results) per benchmark into ``<sweep>/figures/``:
    ridgeline of per-sample CRoMa, median–tail Pareto plane of the pathology encoders (the
    natural-image control left out, as in the paper's Figures 3, 14, 15), typed-distance plane with
    75% outlines, CRoMa against APD with the probe-accuracy top row; and Figure 5 (mean median-CRoMa
    rank against mean LTM10 rank over the sweep's tile benchmarks, ``croma_figure5_mean_ranks``,
    with its ranks as CSV). Returns no table."""
    from . import plots as cp  # lazy: imports matplotlib

    panel = croma_panel(results)
    out = results.root / "figures"
    ranks, used = figure5_ranks(panel)
    if len(ranks):
        ranks = ranks.assign(Model=[label(e) for e in ranks["encoder"]])
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "croma_figure5_mean_ranks.csv", ranks.to_csv(index=False))
        cp.plot_mean_ranks(ranks.assign(encoder=ranks["Model"]), out / "croma_figure5_mean_ranks", benchmarks=used)
    shortcut = results.summaries("shortcut")
    probes = results.per_sample("shortcut")
    for key, summary in panel.summary.groupby("benchmark", sort=True):
        finding = summary["finding"].iloc[0]
        slide = key.startswith("pcabiop")
        summary = summary[summary["finding"] == finding].assign(
            encoder=lambda f: [label(e, slide) for e in f["encoder"]])
        per_sample = panel.per_sample[(panel.per_sample["benchmark"] == key) & (panel.per_sample["finding"] == finding)]
        per_sample = per_sample.assign(encoder=[label(e, slide) for e in per_sample["encoder"]])
        cp.plot_ridgeline(per_sample.dropna(subset=["croma"]), out / f"{key}_ridgeline")
        cp.plot_pareto(summary[~summary["encoder"].isin([label(c) for c in CONTROLS])], out / f"{key}_pareto")
        typed = per_sample[(per_sample["d_so"] > 0) & (per_sample["d_os"] > 0)]
        cp.plot_typed_distances(typed, out / f"{key}_typed_distances")
        if not shortcut.empty and key in set(shortcut["dataset"]):
            apd = _apd(results)
            apd = apd[apd["benchmark"] == key].assign(encoder=lambda f: [label(e) for e in f["encoder"]])
            probe = probes[probes["dataset"] == key].assign(encoder=lambda f: [label(e) for e in f["encoder"]])
            cp.plot_croma_vs_apd(summary[["encoder", "croma"]].merge(apd, on="encoder"), out / f"{key}_croma_vs_apd",
                                 probe=probe)
    return []
