"""CANDOR's ablation and control tables, each with the paper's number beside ours (candor.md v4,
"Chest Encoders and the Choice of Candidate Sets", "Ablation Studies"; the published values from
:func:`robustbench_fm.paper.published.text_numbers`).

* :func:`candor_box_verified` (``experiment=candor_ablation_box_verified``, stage
  ``candor_box_verified``): ablation (1), D of the box-verified positives and of all positives;
* :func:`candor_unmatched` (``experiment=candor_ablation_unmatched``): ablation (2), matched vs
  pooled candidate sets for every (encoder, finding) combination of atelectasis and cardiomegaly;
* :func:`candor_shuffle` (``experiment=candor_control_shuffle``): medians of D and D_all over the
  combinations with labels shuffled within each matched group (0.498 and 0.996);
* :func:`candor_equal_size` (``experiment=candor_control_equal_size``): ablation (4), removing one
  random negative with each query removed from R+ (an encoder's D changes by at most 0.0004);
* :func:`candor_ties` (``experiment=candor_control_ties``): ablation (4), the share of chest
  queries whose c+ and c− tie (0.002%);
* :func:`candor_v1_lipschitz` (``experiment=candor_v1_lipschitz``, stage ``candor_lipschitz``):
  candor_v1.md's synthetic sweep of class overlap (Proposition 1);
* :func:`candor_objective` (``experiment=candor_v1_objective``): the objective experiment, mean D
  per pretraining objective over its (encoder, finding) cells with a 95% interval.

Every table has a ``..._published`` companion (Quantity, Ours, Published, Where): the number the
paper states and the same quantity computed from the sweep. A combination is one encoder and
one finding, its D pooled over the sweep's datasets (sites) by queries as in Table 2; an
encoder's D is the severity-weighted chest D (:func:`.tables.chest_rate`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from ... import encoders
from ...core.tables import PaperTable, SweepResults
from ...data.manifest import CHEST_FINDINGS
from ...paper.published import text_numbers
from .params import CandorParams
from .tables import POOLED, _candor_rows, chest_rate, paper_name, pool_sites, with_target

TABLES = ["candor_box_verified", "candor_unmatched", "candor_shuffle", "candor_equal_size", "candor_ties",
          "candor_v1_lipschitz", "candor_objective"]
#: the paper's name of the encoder its box-verified sentence names
RAD_DINO = "rad_dino"


def published(where: str, quantity: str, version: str = "v4") -> float:
    """One number of the paper's text (``paper/published/candor_text_numbers.csv``)."""
    rows = text_numbers()
    hit = rows[(rows["paper"] == "candor") & (rows["version"] == version) & (rows["where"] == where)
               & (rows["quantity"] == quantity)]
    if len(hit) != 1:
        raise KeyError(f"published CANDOR {version} number '{where}' / '{quantity}' not found once "
                       f"({len(hit)} matches) in candor_text_numbers.csv")
    return float(hit["value"].iloc[0])


def _comparison(name: str, rows: list[tuple[str, float, float, str]], caption: str) -> PaperTable:
    """A ``<name>_published`` table: (quantity, ours, published, where) rows."""
    frame = pd.DataFrame(rows, columns=["Quantity", "Ours", "Published", "Where"])
    return PaperTable(f"{name}_published", frame, caption=caption, decimals=4)


def job_setting(results: SweepResults, job: str, name: str, default=None):
    """A job's value of ``stage.params.<name>``; when its config omits it, ``default`` or else the
    paper's value (:class:`CandorParams`)."""
    cfg = results.job_config(job)
    value = None if cfg is None else OmegaConf.select(cfg, f"stage.params.{name}", default=None)
    if value is None:
        return getattr(CandorParams, name) if default is None else default
    return value


def _by_setting(results: SweepResults, name: str) -> pd.DataFrame:
    """CANDOR's pooled rows of single tasks, with the job's ``setting`` of ``stage.params.<name>``
    as text (true/false for flags)."""
    rows = _candor_rows(results)
    if rows.empty:
        return rows.assign(setting=pd.Series(dtype=str))
    values = {job: job_setting(results, job, name) for job in rows["job"].unique()}
    text = {job: str(v).lower() if isinstance(v, bool) else str(v) for job, v in values.items()}
    return rows.assign(setting=rows["job"].map(text))


def _combinations(rows: pd.DataFrame, metrics=("d", "d_all")) -> pd.DataFrame:
    """(setting, encoder, finding) combinations of binary findings, pooled over datasets."""
    rows = rows[rows["target"] == rows["finding"]]
    return pool_sites(rows, ["setting", "encoder"], list(metrics))


def candor_box_verified(results: SweepResults) -> list[PaperTable]:
    """Ablation (1): per encoder, D of the boxed positives of each arm (MS-CXR pneumothorax, RSNA
    pneumonia) and D of all the reference's positives of that finding, against the same sets."""
    rows = results.summaries("candor_box_verified")
    if rows.empty:
        return []
    rows = rows[rows["acq_group"].astype(str) == POOLED]
    reference = {job: str(job_setting(results, job, "reference", "mimic_cxr")) for job in rows["job"].unique()}
    rows = rows.assign(role=["all" if arm == reference[job] else "boxed" for arm, job in zip(rows["arm"], rows["job"])])
    columns, out = [], {}
    # the paper's arm first (pneumothorax, boxed, then all its positives), then the other arms
    rows = rows.assign(order=[(f != "pneumothorax", role == "all") for f, role in zip(rows["finding"], rows["role"])])
    rows = rows.sort_values("order", kind="stable")
    for (finding, arm, role), part in rows.groupby(["finding", "arm", "role"], sort=False):
        label = f"{finding} {'all positives' if role == 'all' else 'boxed'} ({arm})"
        columns += [f"{label}: queries", f"{label}: D"]
        for _, r in part.iterrows():
            out.setdefault(r["encoder"], {})[f"{label}: queries"] = r["n_queries"]
            out[r["encoder"]][f"{label}: D"] = r["d"]
    names = list(dict.fromkeys(columns))
    frame = pd.DataFrame([{"Encoder": paper_name(e), **v} for e, v in out.items()], columns=["Encoder", *names])
    tables = [PaperTable("candor_box_verified", frame, caption="Ablation (1): D of the box-verified positives (queries "
                         "of each arm) and of all the reference site's positives, against the reference site's "
                         "candidate sets of the query's view")]
    ms = rows[(rows["arm"] == "ms_cxr") & (rows["finding"] == "pneumothorax")]
    ref = rows[(rows["role"] == "all") & (rows["finding"] == "pneumothorax")]
    where = "Ablation (1) Box-Verified Positives"
    rad = ms[ms["encoder"] == RAD_DINO]
    rad_all = ref[ref["encoder"] == RAD_DINO]
    tables.append(_comparison("candor_box_verified", [
        ("pneumothorax positives with MS-CXR boxes (queries)",
         float(ms["n_queries"].max()) if len(ms) else np.nan,
         published(where, "pneumothorax positives with MS-CXR boxes"), where),
        ("largest D of an encoder on them (paper: every encoder at or below 0.500)",
         float(ms["d"].max()) if len(ms) else np.nan, 0.5, where),
        ("RAD-DINO D on box-verified pneumothorax positives", float(rad["d"].iloc[0]) if len(rad) else np.nan,
         published(where, "RAD-DINO D on box-verified pneumothorax positives"), where),
        ("RAD-DINO D on all pneumothorax positives", float(rad_all["d"].iloc[0]) if len(rad_all) else np.nan,
         published(where, "RAD-DINO D on all pneumothorax positives"), where)],
        caption="Ablation (1): our numbers beside the paper's (Ours: NaN where the sweep lacks the encoder)"))
    return tables


def candor_unmatched(results: SweepResults) -> list[PaperTable]:
    """Ablation (2), removing the matching: per (encoder, finding) combination D with matched
    candidate sets and with sets pooled across sites and views (``unmatched=true``), over the
    sweep's pool of sites; the published summary is over the 22 combinations of the 11 encoders
    with atelectasis and cardiomegaly (mean |ΔD| 0.046, largest 0.123, matched lower in 9)."""
    rows = _by_setting(results, "unmatched")
    if rows.empty or not {"false", "true"} <= set(rows["setting"]):
        return []
    combos = _combinations(rows, ("d",))
    wide = combos.pivot_table(index=["encoder", "finding"], columns="setting", values="d").dropna()
    if wide.empty:
        return []
    diff = wide["true"] - wide["false"]
    frame = pd.DataFrame({"Encoder": [paper_name(e) for e, _ in wide.index], "Finding": [f for _, f in wide.index],
                          "D matched": wide["false"].to_numpy(), "D pooled": wide["true"].to_numpy(),
                          "Pooled − matched": diff.to_numpy()})
    where = "Ablation (2) Removing the Matching"
    n = len(wide)
    return [PaperTable("candor_unmatched", frame, caption="Ablation (2): D with candidate sets matched (site × view) "
                       "and pooled across sites and views, per encoder and finding"),
            _comparison("candor_unmatched", [
                ("combinations", float(n), 22.0, where),
                ("mean |change| in D when pooling", float(diff.abs().mean()),
                 published(where, "mean |change| in D when pooling across sites/views (22 combinations)"), where),
                ("largest |change| in D when pooling", float(diff.abs().max()),
                 published(where, "max change in D when pooling"), where),
                ("combinations where the matched rate is lower", float((diff > 0).sum()),
                 published(where, "combinations (of 22) where matched rate < pooled rate"), where)],
                caption="Ablation (2): our numbers beside the paper's (22 combinations: 11 encoders × atelectasis, "
                        "cardiomegaly)")]


def candor_shuffle(results: SweepResults) -> list[PaperTable]:
    """Label-shuffle control ("Chest Encoders and the Choice of Candidate Sets"): the median over
    the (encoder, finding) combinations of D (equal sets) and D_all (unequal sets), with the labels
    as given and shuffled within each matched group."""
    rows = _by_setting(results, "shuffle_labels")
    if rows.empty:
        return []
    combos = _combinations(rows)
    out = []
    for setting, part in combos.groupby("setting", sort=True):
        out.append({"Labels": "shuffled" if setting == "true" else "as given", "Combinations": len(part),
                    "Median D (equal sets)": float(part["d"].median()),
                    "Median D_all (unequal sets)": float(part["d_all"].median())})
    where = "Chest Encoders and the Choice of Candidate Sets"
    medians = {r["Labels"]: r for r in out}
    shuffled, given = medians.get("shuffled", {}), medians.get("as given", {})
    return [PaperTable("candor_shuffle", pd.DataFrame(out), caption="Label-shuffle control: medians over the "
                       "combinations of D (chance 0.500) and D_all, labels as given and shuffled within each "
                       "matched group"),
            _comparison("candor_shuffle", [
                ("median D, labels shuffled (equal sets)", shuffled.get("Median D (equal sets)", np.nan),
                 published(where, "label-shuffle median rate, equal sets (D)"), where),
                ("median D_all, labels shuffled (unequal sets)", shuffled.get("Median D_all (unequal sets)", np.nan),
                 published(where, "label-shuffle median rate, unequal sets (D_all)"), where),
                ("median D, labels as given", given.get("Median D (equal sets)", np.nan),
                 published(where, "median D over 132 encoder x finding combinations"), where),
                ("median D_all, labels as given", given.get("Median D_all (unequal sets)", np.nan),
                 published(where, "median D_all over 132 encoder x finding combinations"), where)],
                caption="Label-shuffle control: our medians beside the paper's (132 combinations)")]


def _encoder_d(rows: pd.DataFrame) -> pd.DataFrame:
    """(setting, encoder) -> the severity-weighted chest D (or the mean over findings outside chest)."""
    combos = _combinations(rows, ("d",))
    enc = chest_rate(combos, ["setting", "encoder"], ["d"], [])
    if enc.empty:
        enc = combos.groupby(["setting", "encoder"])["d"].mean().reset_index()
    return enc


def candor_equal_size(results: SweepResults) -> list[PaperTable]:
    """Ablation (4), equal-size variant: an encoder's D as run and with one random negative removed
    whenever a query is removed from R+ (``equal_size=true``), and the change."""
    rows = _by_setting(results, "equal_size")
    if rows.empty or not {"false", "true"} <= set(rows["setting"]):
        return []
    enc = _encoder_d(rows).pivot(index="encoder", columns="setting", values="d").dropna()
    combos = _combinations(rows, ("d",)).pivot_table(index=["encoder", "finding"], columns="setting",
                                                      values="d").dropna()
    diff = enc["true"] - enc["false"]
    frame = pd.DataFrame({"Encoder": enc.index.map(paper_name), "D": enc["false"].to_numpy(),
                          "D equal sizes": enc["true"].to_numpy(), "Change": diff.to_numpy()})
    where = "Ablation (4) Varying the Candidate Sets"
    return [PaperTable("candor_equal_size", frame, caption="Ablation (4): an encoder's chest D with a query removed "
                       "from R+ only, and with one random negative removed as well (equal sizes)", decimals=4),
            _comparison("candor_equal_size", [
                ("largest |change| of an encoder's D", float(diff.abs().max()),
                 published(where, "max change in D when also removing one random negative"), where),
                ("largest |change| of a combination's D (encoder × finding)",
                 float((combos["true"] - combos["false"]).abs().max()), np.nan, where)],
                caption="Ablation (4), equal sizes: our change beside the paper's bound")]


def candor_ties(results: SweepResults) -> list[PaperTable]:
    """Ablation (4), ties: the queries whose c+ and c− are equal (DM = 0, counted as concordant),
    per encoder and over all chest queries of the sweep."""
    per = results.per_sample("candor")
    if per.empty:
        return []
    per = with_target(per)
    per = per[per["finding"].isin(CHEST_FINDINGS) & (per["target"] == per["finding"])]
    if per.empty:
        return []
    tie = (per["c_pos"].to_numpy(float) == per["c_neg"].to_numpy(float))
    per = per.assign(tie=tie)
    out = [{"Encoder": paper_name(e), "Queries": len(p), "Ties": int(p["tie"].sum()),
            "Ties (%)": 100 * float(p["tie"].mean())} for e, p in per.groupby("encoder", sort=True)]
    out.append({"Encoder": "All encoders", "Queries": len(per), "Ties": int(tie.sum()),
                "Ties (%)": 100 * float(tie.mean())})
    where = "Ablation (4) Varying the Candidate Sets"
    return [PaperTable("candor_ties", pd.DataFrame(out), caption="Ablation (4): chest queries with c+ = c− (a tie is "
                       "concordant: D counts DM > 0 only)", decimals=4),
            _comparison("candor_ties", [
                ("share of chest queries with c+ = c− (%)", 100 * float(tie.mean()),
                 100 * published(where, "share of chest queries with ties c+ = c-"), where)],
                caption="Ablation (4), ties: our share beside the paper's 0.002%")]


def candor_v1_lipschitz(results: SweepResults) -> list[PaperTable]:
    """candor_v1.md's synthetic sweep of class overlap (:mod:`.synthetic`): per level the D of the
    synthetic features, each head's test error, Lipschitz constant, mean bound L‖z+ − z−‖/2 and
    mean achieved joint margin over the test pairs, and the pairs whose margin exceeds the bound."""
    rows = results.summaries("candor_lipschitz")
    if rows.empty:
        return []
    wide = rows.pivot_table(index=["level", "separation", "d"], columns="head",
                            values=["error", "lipschitz", "mean_bound", "mean_margin", "violations", "n_pairs"])
    wide = wide.reset_index().sort_values("level")
    frame = pd.DataFrame({"Separation": wide["separation"].to_numpy(), "D": wide["d"].to_numpy()})
    for head in ("linear", "shallow"):
        for col, label in (("error", "error"), ("lipschitz", "L"), ("mean_bound", "mean bound"),
                           ("mean_margin", "mean margin"), ("violations", "pairs above bound")):
            frame[f"{head.capitalize()} {label}"] = wide[(col, head)].to_numpy()
    where = "Irreducible per encoder but recoverable across the panel"
    errors = rows.pivot_table(index="level", columns="head", values="error")
    bounds = rows["mean_bound"].astype(float)
    pairs = rows.groupby("head")["n_pairs"].sum()
    return [PaperTable("candor_v1_lipschitz", frame, caption="candor_v1 synthetic sweep of class overlap: D of the "
                       "features, test error, Lipschitz constant L, mean bound L‖z+ − z−‖/2 and mean achieved "
                       "joint margin over the test pairs (a positive and its nearest negative) per head"),
            _comparison("candor_v1_lipschitz", [
                ("test pairs per head", float(pairs.max()), published(where, "synthetic sweep test pairs", "v1"),
                 where),
                ("pairs whose achieved margin exceeds the bound", float(rows["violations"].sum()), 0.0, where),
                *[(f"mean bound of the {head} head, {end} level", float(agg(bounds[rows["head"] == head])),
                   published(where, f"margin bound, {bound} (unit not stated)", "v1"), where)
                  for head in ("linear", "shallow")
                  for end, agg, bound in (("lowest", np.min, "lower"), ("highest", np.max, "upper"))],
                ("linear head error, lowest level", float(errors["linear"].min()), 0.0, where),
                ("linear head error, highest level", float(errors["linear"].max()),
                 published(where, "synthetic sweep linear-head error, max (assumed percent)", "v1"), where),
                ("shallow network error, lowest level", float(errors["shallow"].min()), 0.0, where),
                ("shallow network error, highest level", float(errors["shallow"].max()),
                 published(where, "synthetic sweep shallow-network error, max (assumed percent)", "v1"), where),
                ("levels where the shallow network's error is below the linear head's",
                 float((errors["shallow"] < errors["linear"]).sum()), 0.0, where)],
                caption="candor_v1 synthetic sweep: our numbers beside the paper's (the paper states neither the "
                        "data nor the unit of the bound; module robustbench_fm/methods/candor/synthetic.py)")]


#: the objective experiment's arms in the paper's order, and the paper's words for each
OBJECTIVE_ARMS = {"image-text": "image-text", "ssl": "self-supervised contrastive", "supervised": "supervised"}


def objective_contrast(cells: pd.DataFrame, n_boot: int = 1000, seed: int = 42) -> pd.DataFrame:
    """Per objective arm (``objective`` column): its cells (one D per encoder and finding), the
    mean D and the 95% percentile interval of the mean over ``n_boot`` resamples of the arm's
    cells (candor_v1.md: "44.6 [95% CI: 32.5, 65.2] [...] at six cells per arm"; the paper does
    not name the resampled unit: we resample the cells, the arm's only replicates)."""
    rng = np.random.default_rng(seed)
    out = []
    for arm in [a for a in OBJECTIVE_ARMS if a in set(cells["objective"])]:
        d = cells.loc[cells["objective"] == arm, "d"].to_numpy(float)
        boot = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(axis=1)
        lo, hi = np.percentile(boot, [2.5, 97.5]) if len(d) > 1 else (np.nan, np.nan)
        out.append(dict(objective=arm, encoders=int(cells.loc[cells["objective"] == arm, "encoder"].nunique()),
                        cells=len(d), mean_d=float(d.mean()), ci_low=float(lo), ci_high=float(hi)))
    return pd.DataFrame(out, columns=["objective", "encoders", "cells", "mean_d", "ci_low", "ci_high"])


def _objective(encoder: str) -> str | None:
    try:
        return encoders.get(encoder).objective
    except KeyError:
        return None


def candor_objective(results: SweepResults) -> list[PaperTable]:
    """The objective experiment (candor.md "Chest Encoders and the Choice of Candidate Sets";
    candor_v1.md "Erasure retention is associated with collapse"): encoders of one architecture
    trained on the same images with 3 objectives; per objective (the encoder's registry
    ``objective``) the mean D over its (encoder, finding) cells, each cell's D pooled over the
    sweep's datasets, with :func:`objective_contrast`'s interval. Encoders of other objectives
    (untrained, synthetic) are left out."""
    rows = _candor_rows(results)
    rows = rows[rows["target"] == rows["finding"]]
    if rows.empty:
        return []
    cells = pool_sites(rows, ["encoder"], ["d"])
    cells["objective"] = cells["encoder"].map(_objective)
    arms = objective_contrast(cells[cells["objective"].isin(list(OBJECTIVE_ARMS))])
    if arms.empty:
        return []
    frame = pd.DataFrame({"Objective": arms["objective"].map(OBJECTIVE_ARMS), "Encoders": arms["encoders"],
                          "Cells": arms["cells"], "Mean D": arms["mean_d"], "95% low": arms["ci_low"],
                          "95% high": arms["ci_high"]})
    v4, v1 = "Chest Encoders and the Choice of Candidate Sets", "Erasure retention is associated with collapse"
    compare = []
    for r in arms.itertuples():
        words = OBJECTIVE_ARMS[r.objective]
        compare += [(f"mean D, {words}", r.mean_d, published(v4, f"objective experiment mean D: {words}"), v4),
                    (f"95% low, {words}", r.ci_low,
                     published(v1, f"objective experiment collapse: {words}, 95% CI lower", "v1"), v1),
                    (f"95% high, {words}", r.ci_high,
                     published(v1, f"objective experiment collapse: {words}, 95% CI upper", "v1"), v1)]
    return [PaperTable("candor_objective", frame, caption="The objective experiment: mean D per pretraining "
                       "objective over its (encoder, finding) cells, 95% percentile interval over resampled cells"),
            _comparison("candor_objective", compare, caption="The objective experiment: our numbers beside the "
                        "paper's (2 backbones x 3 findings = 6 cells per objective)")]
