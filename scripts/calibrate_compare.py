"""Calibration of the paired comparisons between encoders under the null (issue 58 item 3): for each
simulated design of tests/fixtures/null_cohorts.py, ``--cohorts`` null cohorts (equally good encoders)
through the public path, features → ``evaluate(stage)`` → ``compare_tables``, and per compared metric
and row type (pooled over the matched groups / per group) the rate of p < 0.05 (unadjusted), of
p_adj ≤ 0.05, the family-wise error (any ``better`` in a family of one metric and row), the coverage
of 0 by the unadjusted 95% interval and by the simultaneous interval (per pair and per family: every
pair's interval at once), each with its binomial standard error over the cohorts. The metrics left
out of comparisons (CANDOR's margin AUROC, CRoMa's RI and MaRI) are measured the way they used to be
compared, the percentile paired bootstrap with Holm (``paired_bootstrap`` + ``paired_difference``),
to document why they are not compared.

    python scripts/calibrate_compare.py --cohorts 300 --out benchmarks/cpu2/calibration.json

It prints the markdown table of docs/comparisons.md ("Calibration") and writes the JSON. One core:
the stages run with one torch thread.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
import null_cohorts as nc  # noqa: E402

ALPHA = 0.05
N_BOOT = 1000
#: CANDOR's stage parameters of every cohort (its bootstrap off: the comparison resamples)
CANDOR_PARAMS = {"n_boot": 0, "device": "cpu"}
#: CRoMa at a fixed k (the panel's median-k protocol fixes k for every encoder) and m = 3 (small slides)
CROMA_PARAMS = {"k": 5, "m": 3, "device": "cpu"}
#: the metrics compared (the new max-T comparisons) and the ones measured the old way, per stage
COMPARED = {"candor": ("d", "d_all"), "croma": ("croma",)}
OLD = {"candor": ("margin_auroc",), "croma": ("ri", "mari")}
POOLED = "__pooled__"
#: the normal 97.5% quantile: a percentile interval's width / (2 Z95) stands for the bootstrap SD
Z95 = 1.959964


def stage_tables(stage: str, manifest: pd.DataFrame, feats: dict, finding: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each encoder's per-item table (the stage's ``Pairing.table``) and summary, concatenated with an
    ``encoder`` column, through ``robustbench_fm.methods.run.evaluate``."""
    from robustbench_fm.methods import method
    from robustbench_fm.methods.run import evaluate

    table = method(stage).pairing.table
    params = CANDOR_PARAMS if stage == "candor" else CROMA_PARAMS
    items, summaries = [], []
    for name, f in feats.items():
        res = evaluate(stage, f, manifest, finding=finding, **params)
        items.append(getattr(res, table).assign(encoder=name))
        summaries.append(res.summary.assign(encoder=name))
    return pd.concat(items, ignore_index=True), pd.concat(summaries, ignore_index=True)


def compare(stage: str, items: pd.DataFrame, summaries: pd.DataFrame | None, n_boot: int, seed: int) -> pd.DataFrame:
    """The pairs table of ``robustbench_fm.report.comparisons.compare_tables``; with ``summaries``, a
    family whose estimates do not reproduce the stage's summary stops the run (its note)."""
    from robustbench_fm.report.comparisons import compare_tables

    found = compare_tables(stage, items, summaries, n_boot=n_boot, seed=seed)
    off = [n for n in found.notes if "do not give the summary's value" in n]
    if off:
        raise RuntimeError(f"{stage}: {off[0]}")
    return found.pairs


def old_pairs(stage: str, items: pd.DataFrame, n_boot: int, seed: int) -> pd.DataFrame:
    """The metrics no longer compared, compared as before issue 58: one paired percentile bootstrap of
    every encoder per (metric, row) (``paired_bootstrap``: patients / slides resampled, the banks and
    kNN graph fixed), each pair's percentile interval and bootstrap p (``paired_difference``), Holm
    within the family. CANDOR's margin AUROC per group and pooled (the groups' AUROCs weighted by their
    queries, as the summary pools them); CRoMa's RI and MaRI (pooled ratios)."""
    from robustbench_fm.core.stats import holm_adjust, paired_bootstrap, paired_difference

    encoders = sorted(items["encoder"].unique())
    by = {e: part.set_index("sample_id") for e, part in items.groupby("encoder")}
    index = by[encoders[0]].index
    first = by[encoders[0]]
    clusters = first["cluster"].astype(str).to_numpy()
    n_clusters = len(np.unique(clusters))
    units = []  # (metric, row, kind, value, other, rows mask, strata, weights)
    if stage == "candor":
        groups = first["acq_group"].astype(str).to_numpy()
        for g in sorted(np.unique(groups)):
            units.append(("margin_auroc", g, "auroc", "margin", "label", groups == g, None, None))
        codes = pd.factorize(groups, sort=True)[0]
        weights = np.bincount(codes, weights=first["query"].astype(float).to_numpy())
        units.append(("margin_auroc", POOLED, "auroc", "margin", "label", np.ones(len(index), bool), codes, weights))
    else:
        units += [("ri", "", "ratio", "n_so", "n_typed", np.ones(len(index), bool), None, None),
                  ("mari", "", "ratio", "so_weight", "typed_weight", np.ones(len(index), bool), None, None)]
    out = []
    for u, (metric, row, kind, value, other, mask, strata, weights) in enumerate(units):
        at = index[mask]
        values = np.stack([by[e].loc[at, value].to_numpy(float) for e in encoders])
        others = np.stack([by[e].loc[at, other].to_numpy(float) for e in encoders])
        n_cl = len(np.unique(clusters[mask])) if row != POOLED else n_clusters
        est, reps = paired_bootstrap(kind, values, clusters[mask], n_boot, (seed, u), other=others,
                                     strata=None if strata is None else strata[mask], weights=weights)
        records = [dict(metric=metric, row=row, encoder_a=a, encoder_b=b,
                        **paired_difference(est, reps, encoders.index(a), encoders.index(b), n_cl))
                   for a, b in combinations(encoders, 2)]
        frame = pd.DataFrame(records)
        frame["p_adj"] = holm_adjust(frame["p"].to_numpy())
        frame["better"] = np.where(frame["p_adj"] <= ALPHA, np.where(frame["difference"] > 0, frame["encoder_a"],
                                                                       frame["encoder_b"]), "")
        out.append(frame)
    return pd.concat(out, ignore_index=True)


def row_type(row: str) -> str:
    """pooled (over the matched groups), group (one matched group's row) or all (CRoMa's one row)."""
    return "pooled" if POOLED in str(row) else ("group" if str(row) else "all")


def tally(pairs: pd.DataFrame, design: str, method: str, cohort: int) -> list[dict]:
    """One record per family (metric, row) of one cohort: its pairs' counts of p < 0.05, p_adj ≤ 0.05,
    intervals covering 0, and whether any pair was declared better or every simultaneous interval
    covered 0."""
    records = []
    sim = "sim_low" in pairs.columns
    for (metric, row), fam in pairs.groupby(["metric", "row"], sort=True):
        ok = fam["p"].notna()
        cover = (fam["ci_low"] <= 0) & (0 <= fam["ci_high"])
        cover_sim = (fam["sim_low"] <= 0) & (0 <= fam["sim_high"]) if sim else pd.Series(np.nan, index=fam.index)
        records.append(dict(design=design, method=method, cohort=cohort, metric=metric, row=str(row),
                            row_type=row_type(row), n_pairs=int(ok.sum()),
                            p05=int((fam["p"] < ALPHA).sum()), padj05=int((fam["p_adj"] <= ALPHA).sum()),
                            cover=int(cover[ok].sum()), cover_sim=int(cover_sim[ok].sum()) if sim else -1,
                            any_better=bool((fam["better"].fillna("").astype(str) != "").any()),
                            family_covered_sim=bool(cover_sim[ok].all()) if sim else False,
                            family_ok=bool(ok.all() and len(fam)),
                            d2=float((fam["difference"][ok] ** 2).sum()),
                            se2=float((((fam["ci_high"] - fam["ci_low"]) / (2 * Z95))[ok] ** 2).sum())))
    return records


def rate(hits: float, n: float) -> dict:
    """A rate with its binomial standard error."""
    r = hits / n if n else float("nan")
    return {"rate": round(r, 4), "se": round(float(np.sqrt(r * (1 - r) / n)) if n else float("nan"), 4),
            "n": int(n)}


def summarise(records: pd.DataFrame) -> list[dict]:
    """Per (design, method, metric, row type): the rates over pairs (p < 0.05, p_adj ≤ 0.05, coverage
    of the unadjusted and simultaneous intervals) and over families (family-wise error: any ``better``;
    every simultaneous interval covering 0), and ``variance_ratio``: the mean squared difference over
    the null pairs (their true variance: the mean difference is 0) over the mean squared bootstrap SD
    (the percentile interval's width / 3.92); above 1 the resamples miss part of the difference's
    variance (for CANDOR: what the fixed banks contribute), and p < 0.05 comes out near
    2 Φ(−1.96 / √ratio). The standard errors are binomial over the counted units
    (pairs of one family share a cohort, so the pairs' errors are somewhat optimistic; the families'
    are exact for independent cohorts)."""
    out = []
    for (design, method, metric, rtype), part in records.groupby(["design", "method", "metric", "row_type"],
                                                                 sort=False):
        part = part[part["family_ok"]]
        n_pairs, n_fam = part["n_pairs"].sum(), len(part)
        compared = bool(part["compared"].iloc[0])
        row = dict(design=design, method=method, metric=metric, row_type=rtype, compared=compared,
                   n_cohorts=int(part["cohort"].nunique()), n_families=int(n_fam), n_pairs=int(n_pairs),
                   p_below_005=rate(part["p05"].sum(), n_pairs), p_adj_le_005=rate(part["padj05"].sum(), n_pairs),
                   fwer=rate(part["any_better"].sum(), n_fam), coverage=rate(part["cover"].sum(), n_pairs),
                   variance_ratio=round(float(part["d2"].sum() / part["se2"].sum()), 3))
        if compared and (part["cover_sim"] >= 0).all():
            row.update(coverage_sim=rate(part["cover_sim"].sum(), n_pairs),
                       family_coverage_sim=rate(part["family_covered_sim"].sum(), n_fam))
        out.append(row)
    return out


def cohort_stats(manifest: pd.DataFrame, croma: bool) -> dict:
    """What one cohort holds: images, clusters (patients / slides), and per matched group the images
    and prevalence (CANDOR)."""
    if croma:
        return {"tiles": len(manifest), "slides": manifest["slide_id"].nunique()}
    by = manifest.groupby("acq_group")
    return {"images": len(manifest), "patients": manifest["patient_id"].nunique(),
            "positives": float(manifest[nc.FINDING].sum()),
            "patients_in_several_groups": float((manifest.groupby("patient_id")["acq_group"].nunique() > 1).mean()),
            **{f"prevalence_{g}": float(v) for g, v in by[nc.FINDING].mean().items()}}


def run_design(design, cohorts: int, n_encoders: int = 3, n_boot: int = N_BOOT, seed0: int = 0,
               old: bool = True, check_summaries: bool = True) -> tuple[pd.DataFrame, dict]:
    """(one record per family and cohort, seconds spent in each step and the cohorts' mean shape) over
    ``cohorts`` null cohorts of ``design`` (a :class:`null_cohorts.Design` or
    :class:`null_cohorts.CromaDesign`); ``check_summaries``: pass the summaries to ``compare_tables``
    (each estimate checked against the stage's own value; the numbers do not change)."""
    croma = isinstance(design, nc.CromaDesign)
    stage, finding = ("croma", "bio_label") if croma else ("candor", nc.FINDING)
    records, seconds, shapes = [], {"cohort": 0.0, "stage": 0.0, "compare": 0.0, "old": 0.0}, []
    for c in range(cohorts):
        seed = seed0 + c
        t0 = time.perf_counter()
        manifest, feats = nc.croma_cohort(design, seed, n_encoders) if croma else nc.cohort(design, seed, n_encoders)
        shapes.append(cohort_stats(manifest, croma))
        t1 = time.perf_counter()
        items, summaries = stage_tables(stage, manifest, feats, finding)
        t2 = time.perf_counter()
        pairs = compare(stage, items, summaries if check_summaries else None, n_boot, seed)
        t3 = time.perf_counter()
        pairs = pairs[pairs["metric"].isin(COMPARED[stage])]
        records += [dict(r, compared=True) for r in tally(pairs, design.name, stage, c)]
        if old:
            records += [dict(r, compared=False) for r in tally(old_pairs(stage, items, n_boot, seed), design.name,
                                                               stage, c)]
        t4 = time.perf_counter()
        for key, dt in zip(seconds, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            seconds[key] += dt
    shape = {k: round(float(v), 3) for k, v in pd.DataFrame(shapes).mean().items()}
    return pd.DataFrame(records), {**seconds, "mean_cohort": shape}


def _cell(r: dict | None) -> str:
    return "" if r is None else f"{r['rate']:.3f} ± {r['se']:.3f}"


def markdown(summary: list[dict], designs: dict[str, str]) -> str:
    """The calibration table of docs/comparisons.md."""
    lines = ["| design | metric | rows | compared | p < 0.05 | p_adj ≤ 0.05 | family-wise error | "
             "95% interval covers 0 | simultaneous interval covers 0 (pair / family) | variance ratio |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        sim = "" if "coverage_sim" not in s else f"{_cell(s['coverage_sim'])} / {_cell(s['family_coverage_sim'])}"
        lines.append(f"| {s['design']} | {s['metric']} | {s['row_type']} ({s['n_families']} families) | "
                     f"{'yes' if s['compared'] else 'no (Holm, percentile)'} | {_cell(s['p_below_005'])} | "
                     f"{_cell(s['p_adj_le_005'])} | {_cell(s['fwer'])} | {_cell(s['coverage'])} | {sim} | "
                     f"{s['variance_ratio']:.2f} |")
    lines.append("")
    lines += [f"- {name}: {text}" for name, text in designs.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cohorts", type=int, default=300)
    ap.add_argument("--designs", default=",".join([d.name for d in nc.DESIGNS] + [nc.CROMA_DESIGN.name]))
    ap.add_argument("--encoders", type=int, default=3)
    ap.add_argument("--n-boot", type=int, default=N_BOOT)
    ap.add_argument("--seed", type=int, default=0, help="the first cohort's seed (cohort c: seed + c)")
    ap.add_argument("--no-old", action="store_true", help="skip the old percentile bootstrap of the metrics not "
                                                          "compared")
    ap.add_argument("--out", default="outputs/bench/calibration.json")
    args = ap.parse_args(argv)
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _main(args)
    finally:
        torch.set_num_threads(threads)


def _main(args) -> dict:
    known = {d.name: d for d in (*nc.DESIGNS, nc.CROMA_DESIGN)}
    chosen = [known[name] for name in args.designs.split(",")]
    load = os.getloadavg()[0]
    start, cpu = time.perf_counter(), time.process_time()
    frames, seconds, shapes = [], {}, {}
    for d in chosen:
        t = time.perf_counter()
        records, parts = run_design(d, args.cohorts, args.encoders, args.n_boot, args.seed, old=not args.no_old)
        frames.append(records)
        shapes[d.name] = parts.pop("mean_cohort")
        seconds[d.name] = {**{k: round(v, 2) for k, v in parts.items()}, "total": round(time.perf_counter() - t, 2),
                           "per_cohort": round((time.perf_counter() - t) / args.cohorts, 4)}
        print(f"{d.name}: {seconds[d.name]}", file=sys.stderr, flush=True)
    summary = summarise(pd.concat(frames, ignore_index=True))
    described = {d.name: d.description for d in chosen}
    table = markdown(summary, described)
    result = {"cohorts": args.cohorts, "encoders": args.encoders, "n_boot": args.n_boot, "alpha": ALPHA,
              "designs": described, "mean_cohort": shapes, "candor_params": CANDOR_PARAMS, "croma_params": CROMA_PARAMS,
              "summary": summary, "seconds": seconds, "wall_seconds": round(time.perf_counter() - start, 1),
              "cpu_seconds": round(time.process_time() - cpu, 1), "load_average_at_start": round(load, 2),
              "cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
              "markdown": table}
    return write_result(args.out, result)


def write_result(out: str, result: dict) -> dict:
    """``result`` as JSON at ``out`` (folders made), its markdown table printed; returns it."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(result["markdown"])
    return result


if __name__ == "__main__":
    main()
