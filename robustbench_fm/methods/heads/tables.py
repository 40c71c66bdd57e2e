"""CANDOR's cross-encoder head tables, built from ``SweepResults.per_sample("candor_heads")`` and
``summaries("error_detection")`` (candor.md "Discordance and Head Errors", Table 4, Ablation (3);
candor_v1.md Table 4). The lead's ``tables_candor`` re-exports these builders.

Sets (every set is keyed by dataset, finding and sample_id; rows need every encoder's head):

* *blind*: a positive discordant under a strict majority of the encoders
  (:func:`robustbench_fm.methods.candor.sets.consensus_blind_set`);
* Table 4 "263": blind positives among the CANDOR queries of the drawn test sample; "33,770":
  blind positives of the whole test split (discordance against CANDOR's banks); "All": every
  positive of the drawn test sample; "Negatives": every negative of the drawn test sample;
* v1 Table 4: n+ and Blind over CANDOR's positive queries of every split; Scored = blind queries
  of the drawn test sample; Single = mean over heads of the miss rate on Scored; Best = the
  oracle selector's miss rate (an image is missed only if every head misses it).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import sparse

from ... import encoders
from ...core.stats import (
    FDR_ALPHA,
    ResampledRatio,
    bh_adjust,
    cluster_codes,
    cluster_count_chunks,
    mantel_haenszel_rd,
)
from ...core.tables import PaperTable, SweepResults
from ...paper.published import table as published_table
from ...paper.published import text_numbers
from ..candor.sets import consensus_blind_set
from . import combine

TABLES = ["candor_table4", "candor_v1_consensus", "candor_head_errors", "candor_failure_detection"]
STAGE = "candor_heads"
#: candor_v1.md Table 4 row labels.
FINDING_LABELS = {"pleural_effusion": "Pleural effusion", "atelectasis": "Atelectasis",
                  "enlarged_cardiomediastinum": "Enl. cardiomed.", "cardiomegaly": "Cardiomegaly",
                  "edema": "Edema", "lung_opacity": "Lung opacity", "consolidation": "Consolidation",
                  "pneumothorax": "Pneumothorax", "fracture": "Fracture", "pneumonia": "Pneumonia",
                  "lung_lesion": "Lung lesion", "pleural_other": "Pleural other"}


def _key(per: pd.DataFrame) -> list[str]:
    return [c for c in ("dataset", "finding", "sample_id") if c in per.columns]


def blind_flags(per: pd.DataFrame) -> pd.DataFrame:
    """``blind`` per (dataset, finding, sample_id) of the positives with a discordance flag."""

    pos = per[(per["label"] == 1) & per["discordant"].notna()]
    return consensus_blind_set(pos.assign(discordant=pos["discordant"].astype(bool)))


def _wide(per: pd.DataFrame, split: str, column: str) -> pd.DataFrame:
    """(dataset, finding, sample_id) × encoder matrix of ``column`` on ``split``, complete rows only."""
    part = per[(per["split"] == split) & per["pred"].notna()]
    if part.empty:
        return pd.DataFrame(index=pd.MultiIndex.from_tuples([], names=_key(per)))
    return part.pivot_table(index=_key(part), columns="encoder", values=column, aggfunc="first").dropna()


def _task_rows(frame: pd.DataFrame, task: list[str], keys) -> pd.DataFrame:
    """The rows of ``frame`` whose ``task`` levels equal ``keys``."""
    keys = keys if isinstance(keys, tuple) else (keys,)
    if frame.empty:
        return frame
    mask = np.all([frame.index.get_level_values(t) == k for t, k in zip(task, keys)], axis=0)
    return frame[mask]


def rule_predictions(per: pd.DataFrame, sensitivity: float = 0.8) -> dict[str, pd.DataFrame]:
    """Test predictions of every rule, one column per head for the single heads
    (:mod:`robustbench_fm.methods.heads.combine`), fitted per (dataset, finding) on validation."""
    pred, prob = _wide(per, "test", "pred").astype(bool), _wide(per, "test", "prob")
    val_prob = _wide(per, "val", "prob")
    labels = per.drop_duplicates(_key(per)).set_index(_key(per))["label"]
    out = {name: [] for name in ("single", "chosen", "majority", "mean_prob", "stacked", "or")}
    task = [c for c in ("dataset", "finding") if c in pred.index.names]
    for keys, p in pred.groupby(level=task, sort=True):
        pr = prob.loc[p.index, p.columns]
        vp = _task_rows(val_prob, task, keys)
        vp = vp[p.columns] if set(p.columns) <= set(vp.columns) else vp.iloc[:0]
        vy = labels.loc[vp.index].to_numpy()
        out["single"].append(p)
        out["majority"].append(pd.DataFrame({"rule": combine.majority_vote(p.to_numpy())}, index=p.index))
        out["or"].append(pd.DataFrame({"rule": combine.or_rule(p.to_numpy())}, index=p.index))
        if len(np.unique(vy)) < 2:
            continue
        chosen = p.columns[combine.choose_on_validation(vp.to_numpy(), vy)]
        out["chosen"].append(pd.DataFrame({"rule": p[chosen].to_numpy()}, index=p.index))
        out["mean_prob"].append(pd.DataFrame(
            {"rule": combine.mean_probability(vp.to_numpy(), vy, pr.to_numpy(), sensitivity)}, index=p.index))
        out["stacked"].append(pd.DataFrame(
            {"rule": combine.stacked_logistic(vp.to_numpy(), vy, pr.to_numpy(), sensitivity)}, index=p.index))
    return {k: pd.concat(v) if v else pd.DataFrame() for k, v in out.items()}


#: Table 4's rules: key -> (our row label, the paper's printed row label); the oracle selector is
#: candor_v1.md's "Best (of 11)" (an upper bound that needs the label, not a rule).
RULES = {"single": ("Single head (mean of {n})", "Single head (mean of 11)"),
         "chosen": ("Head chosen on validation", "Head chosen on validation"),
         "majority": ("Majority vote", "Majority vote"),
         "mean_prob": ("Mean probability of {n} heads", "Mean probability of 11 heads"),
         "stacked": ("Stacked logistic regression", "Stacked logistic regression"),
         "or": ("OR rule", "OR rule"),
         "oracle": ("Oracle selector (candor_v1.md)", None)}
SET_COLUMNS = ["Miss rate 263", "Miss rate 33,770", "Miss rate All", "FP rate Negatives"]
#: published values of Table 4 that only the text states (candor.md, candor_v1.md): (column, rule) -> quantity
_TEXT_VALUES = {("Miss rate 263", "oracle"): ("v1", "oracle selector miss rate on the 263"),
                ("Miss rate 263 ±", "or"): ("v4", "OR rule miss rate on the 263, bootstrap sd (±)"),
                ("Miss rate 263 ±", "chosen"):
                    ("v4", "head chosen on validation: miss rate on the 263, bootstrap sd (±)")}


def published_text(version: str, quantity: str) -> float:
    """A CANDOR number stated in the text (paper/published/candor_text_numbers.csv)."""
    t = text_numbers()
    hit = t[(t["paper"] == "candor") & (t["version"] == version) & (t["quantity"] == quantity)]
    return float(hit["value"].iloc[0]) if len(hit) else np.nan


def _boot_settings(results: SweepResults) -> tuple[int, int]:
    """(n_boot, seed) of the sweep's stage (CANDOR's 1,000 resamples and seed 42 by default)."""
    cfg = results.config
    params = (cfg.get("stage", {}) or {}).get("params", {}) if cfg is not None else {}
    params = params or {}
    return int(params.get("n_boot", 1000) or 0), int(params.get("seed", 42))


def table4_errors(per: pd.DataFrame, sensitivity: float = 0.8) -> tuple[pd.DataFrame, dict[str, pd.Index]]:
    """Table 4 on ONE test sample (candor.md "Discordance and Head Errors": "Every rule is scored on
    the same 20,000 test images, since all heads are tested on this sample").

    Returns (errors, sets): ``errors`` has one row per test row (dataset, finding, sample_id) that
    every rule scores and one column per rule of :data:`RULES`: 1 where the rule errs (a miss on a
    positive, a false positive on a negative), the single head's column the mean over the heads;
    the oracle errs only where every head errs. ``sets`` are the rows of each column of
    :data:`SET_COLUMNS` (each a subset of ``errors``' rows): "263" the positive CANDOR queries of
    the drawn test sample that are discordant under a strict majority of the encoders; "33,770"
    the positives of the whole test split discordant under a majority; "All" / "Negatives" every
    positive / negative of the drawn test sample."""
    key = _key(per)
    rules = rule_predictions(per, sensitivity)
    single = rules["single"]
    if single.empty:
        return pd.DataFrame(columns=list(RULES)), {c: pd.Index([]) for c in SET_COLUMNS}
    common = single.index
    for name in ("chosen", "majority", "mean_prob", "stacked", "or"):
        common = common.intersection(rules[name].index) if len(rules[name]) else common[:0]
    first = per.drop_duplicates(key).set_index(key)
    label = first.loc[common, "label"].to_numpy() == 1
    heads = single.loc[common].to_numpy(bool)
    wrong = heads != label[:, None]
    errors = pd.DataFrame({"single": wrong.mean(axis=1), "oracle": wrong.all(axis=1).astype(float)}, index=common)
    for name in ("chosen", "majority", "mean_prob", "stacked", "or"):
        errors[name] = (rules[name].loc[common, "rule"].to_numpy(bool) != label).astype(float)
    errors = errors[list(RULES)]
    blind = blind_flags(per[per["split"] == "test"]).set_index(key)
    blind_idx = blind.index[blind["blind"]]
    rows = first.loc[common]
    sample = rows[rows["in_sample"].astype(bool)]
    queries = sample.index[sample["query"].astype(bool) & (sample["label"] == 1)]
    sets = {"Miss rate 263": blind_idx.intersection(queries),
            "Miss rate 33,770": blind_idx.intersection(rows.index[rows["label"] == 1]),
            "Miss rate All": sample.index[sample["label"] == 1],
            "FP rate Negatives": sample.index[sample["label"] == 0]}
    return errors, sets


def clustered_rates(errors: pd.DataFrame, sets: dict[str, pd.Index], patients: pd.Series, n_boot: int,
                    seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rates, sd): per set (rows) and rule (columns) the error rate and its ± (candor.md
    "Reporting": the standard deviation over ``n_boot`` bootstrap resamples clustered by patient).
    Every set and rule is resampled jointly: each resample draws the patients of the rows of
    ``sets`` with replacement (:func:`robustbench_fm.core.stats.cluster_count_chunks`, seed
    ``seed``), and a row counts as often as its patient is drawn."""
    rates = pd.DataFrame({name: errors.loc[idx].mean() if len(idx) else pd.Series(np.nan, errors.columns)
                          for name, idx in sets.items()}).T
    sd = pd.DataFrame(np.nan, index=rates.index, columns=rates.columns)
    every = pd.Index([]).append([idx for idx in sets.values()]).unique() if sets else pd.Index([])
    if n_boot < 2 or len(every) == 0:
        return rates, sd
    codes = pd.Series(cluster_codes(patients.loc[every].to_numpy()), index=every)
    resampled = {name: ResampledRatio(codes.loc[idx].to_numpy(), errors.loc[idx].to_numpy())
                 for name, idx in sets.items() if len(idx)}
    boot = {name: [] for name in resampled}
    for counts in cluster_count_chunks(int(codes.max()) + 1, n_boot, np.random.default_rng(seed)):
        for name, ratio in resampled.items():
            boot[name].append(ratio(counts))
    for name, parts in boot.items():
        sd.loc[name] = np.nanstd(np.concatenate(parts), axis=0, ddof=1)
    return rates, sd


def _patients(per: pd.DataFrame) -> pd.Series:
    key = _key(per)
    first = per.drop_duplicates(key).set_index(key)
    col = "patient_id" if "patient_id" in first.columns else None
    return first[col].astype(str) if col else pd.Series(first.index.get_level_values("sample_id"), index=first.index)


def candor_table4(results: SweepResults) -> list[PaperTable]:
    """candor.md Table 4: six rules that combine the panel's heads and candor_v1.md's oracle
    selector, all scored on the same test rows (:func:`table4_errors`): miss rates on the
    majority-discordant positives of the drawn test sample ("263") and of the whole test split
    ("33,770"), on every positive of the drawn test sample ("All"), FP rate on its negatives;
    each with its ± (:func:`clustered_rates`, patients resampled). ``Published as`` is the
    paper's row label, and ``<column> published`` the paper's value (Table 4, or the text for the
    oracle and the ± of the OR rule and the chosen head)."""
    per = results.per_sample(STAGE)
    if per.empty:
        return []
    errors, sets = table4_errors(per)
    n_boot, seed = _boot_settings(results)
    rates, sd = clustered_rates(errors, sets, _patients(per), n_boot, seed)
    n = per["encoder"].nunique()
    published = published_table("candor", 4, "v4")
    rows = []
    for name, (label, printed) in RULES.items():
        row = {"Rule": label.format(n=n), "Published as": printed or ""}
        for col in SET_COLUMNS:
            row[col], row[f"{col} ±"] = rates.loc[col, name], sd.loc[col, name]
        for col in SET_COLUMNS:
            hit = published[(published["row"] == printed) & (published["column"] == col)] if printed else []
            row[f"{col} published"] = float(hit["value"].iloc[0]) if len(hit) else np.nan
        for (col, rule), (version, quantity) in _TEXT_VALUES.items():
            if rule == name:
                row[f"{col} published"] = published_text(version, quantity)
        rows.append(row)
    frame = pd.DataFrame(rows)
    counts = ", ".join(f"{name.split(' ', 2)[-1]}: n = {len(idx)}" for name, idx in sets.items())
    caption = (f"Six rules that combine the {n} heads and the oracle selector (candor.md Table 4; candor_v1.md "
               f"Table 4 'Best'), all scored on the same {len(errors)} test rows; miss rate on positives and FP rate "
               f"on negatives ({counts}); ± = SD over {n_boot} resamples of the patients; published values beside "
               "ours (paper: 263 and 33,770 positives, 11 heads).")
    return [PaperTable("candor_table4", frame, caption, best={c: "min" for c in SET_COLUMNS})]


def candor_v1_consensus(results: SweepResults) -> list[PaperTable]:
    """candor_v1.md Table 4: chest consensus blind set per finding and pooled."""
    per = results.per_sample(STAGE)
    if per.empty:
        return []
    key = _key(per)
    queries = per[per["query"] & (per["label"] == 1)]
    blind = blind_flags(queries).set_index(key)
    first = per.drop_duplicates(key).set_index(key)
    pred = _wide(per, "test", "pred").astype(bool)
    in_sample = first.index[first["in_sample"]]
    scored = pred.loc[pred.index.intersection(blind.index[blind["blind"]]).intersection(in_sample)]
    rows = []
    for finding, b in list(blind.groupby(level="finding", sort=True)) + [("Pooled", blind)]:
        s = scored if finding == "Pooled" else scored[scored.index.get_level_values("finding") == finding]
        misses = ~s.to_numpy(bool)
        rows.append({"Finding": FINDING_LABELS.get(finding, finding), "n+": len(b), "Blind": float(b["blind"].mean()),
                     "Scored": len(s), "Single": float(misses.mean(axis=0).mean()) if len(s) else np.nan,
                     "Best": float(misses.all(axis=1).mean()) if len(s) else np.nan})
    frame = pd.DataFrame(rows)
    body = frame[frame["Finding"] != "Pooled"].sort_values("Single", ascending=False, kind="stable")
    frame = pd.concat([body, frame[frame["Finding"] == "Pooled"]], ignore_index=True)
    n = per["encoder"].nunique()
    caption = (f"Chest consensus blind set (candor_v1.md Table 4): n+ and Blind span CANDOR's positive queries; "
               f"Single (mean of {n} heads) and Best (oracle selector) on the Scored blind positives of the test "
               f"sample.")
    return [PaperTable("candor_v1_consensus", frame, caption)]


#: the MH strata of candor.md "Discordance and Head Errors": "Stratified by encoder and finding"
MH_STRATA = ("encoder", "finding")


def _test_rows(per: pd.DataFrame) -> pd.DataFrame:
    test = per[(per["split"] == "test") & per["pred"].notna()].copy()
    test["miss"] = (test["label"] == 1) & ~test["pred"].astype(bool)
    test["fp"] = (test["label"] == 0) & test["pred"].astype(bool)
    test["disc"] = test["discordant"].eq(True).fillna(False).astype(bool)
    test["other"] = test["discordant"].eq(False).fillna(False).astype(bool)
    test["near"] = test["near_pos"].eq(True).fillna(False).astype(bool)
    test["far"] = test["near_pos"].eq(False).fillna(False).astype(bool)
    return test


def head_error_strata(per: pd.DataFrame) -> pd.DataFrame:
    """Per encoder × finding (the paper's strata, :data:`MH_STRATA`; a sweep's sites are pooled
    within a stratum) on the whole test split: misses among discordant (a1 of n1) and other (a0 of
    n0) positives, false positives among negatives nearer to the positives and the others."""
    test = _test_rows(per)
    strata = [c for c in MH_STRATA if c in test.columns]
    g = test.assign(a1=test["miss"] & test["disc"], a0=test["miss"] & test["other"],
                    fp_near=test["fp"] & test["near"], fp_far=test["fp"] & test["far"])
    out = g.groupby(strata, sort=True).agg(a1=("a1", "sum"), n1=("disc", "sum"), a0=("a0", "sum"), n0=("other", "sum"),
                                           fp_near=("fp_near", "sum"), n_near=("near", "sum"),
                                           fp_far=("fp_far", "sum"), n_far=("far", "sum"))
    return out.reset_index()


def mh_bootstrap_sd(per: pd.DataFrame, n_boot: int, seed: int) -> dict[str, float]:
    """± of the Mantel-Haenszel difference per encoder and for all encoders ("All encoders"): the SD
    over ``n_boot`` resamples of the test split's patients (candor.md "Reporting"; the paper's
    0.136 ± 0.002). One resample draws the patients with replacement and recounts every stratum's
    a1, n1, a0, n0 from the drawn patients' rows (a patient's rows count as often as it is drawn,
    jointly across encoders and findings)."""
    test = _test_rows(per)
    test = test[test["disc"] | test["other"]]
    if n_boot < 2 or test.empty:
        return {}
    patients = test["patient_id"] if "patient_id" in test.columns else test["sample_id"]
    codes = cluster_codes(patients.astype(str).to_numpy())
    strata = test.groupby(list(MH_STRATA), sort=True).ngroup().to_numpy()
    n_strata, n_patients = int(strata.max()) + 1, int(codes.max()) + 1
    values = np.stack([test["miss"] & test["disc"], test["disc"], test["miss"] & test["other"], test["other"]],
                      1).astype(float)
    cols = (4 * strata[:, None] + np.arange(4)[None, :]).ravel()
    counts_matrix = sparse.csr_matrix((values.ravel(), (np.repeat(codes, 4), cols)),
                                      shape=(n_patients, 4 * n_strata))
    encoder_of = test.groupby(list(MH_STRATA), sort=True)["encoder"].first().to_numpy()
    groups = {e: encoder_of == e for e in np.unique(encoder_of)} | {"All encoders": np.ones(n_strata, bool)}
    boot = {name: [] for name in groups}
    for draws in cluster_count_chunks(n_patients, n_boot, np.random.default_rng(seed)):
        totals = np.asarray((counts_matrix.T @ draws.T.astype(np.float64))).T.reshape(len(draws), n_strata, 4)
        for t in totals:
            for name, at in groups.items():
                boot[name].append(mantel_haenszel_rd(t[at, 0], t[at, 1], t[at, 2], t[at, 3])["rd"])
    return {name: float(np.nanstd(v, ddof=1)) for name, v in boot.items()}


def candor_head_errors(results: SweepResults) -> list[PaperTable]:
    """candor.md "Discordance and Head Errors": miss rates of discordant vs other positives on the
    whole test split, the Mantel-Haenszel difference stratified by encoder × finding (Sato's
    variance, :func:`robustbench_fm.core.stats.mantel_haenszel_rd`, and the patient-clustered
    bootstrap ±, :func:`mh_bootstrap_sd`) and FP rates of negatives nearer to the positives vs the
    others; one row per encoder and a pooled row with the published values beside ours."""
    per = results.per_sample(STAGE)
    if per.empty:
        return []
    strata = head_error_strata(per)
    n_boot, seed = _boot_settings(results)
    sd = mh_bootstrap_sd(per, n_boot, seed)
    rows = []
    for encoder, s in list(strata.groupby("encoder", sort=True)) + [("All encoders", strata)]:
        mh = mantel_haenszel_rd(s["a1"], s["n1"], s["a0"], s["n0"])
        rows.append({"Encoder": encoder, "Miss rate discordant": s["a1"].sum() / s["n1"].sum(),
                     "Miss rate other": s["a0"].sum() / s["n0"].sum(), "MH difference": mh["rd"],
                     "MH ±": sd.get(encoder, np.nan), "MH SE (Sato)": mh["se"],
                     "FP rate nearer": s["fp_near"].sum() / s["n_near"].sum(),
                     "FP rate other": s["fp_far"].sum() / s["n_far"].sum(), "Strata": mh["n_strata"]})
    published = {"Encoder": "Published (candor.md)",
                 "Miss rate discordant": published_text("v4", "chest test split: miss rate of linear heads on "
                                                              "discordant positives"),
                 "Miss rate other": published_text("v4", "chest test split: miss rate of linear heads on other "
                                                         "(non-discordant) positives"),
                 "MH difference": published_text("v4", "Mantel-Haenszel difference of miss rates (discordant "
                                                       "minus other positives)"),
                 "MH ±": published_text("v4", "Mantel-Haenszel difference, bootstrap sd (±)"),
                 "FP rate nearer": published_text("v4", "false positive rate of test negatives nearer to the "
                                                        "positives"),
                 "FP rate other": published_text("v4", "false positive rate of the other test negatives")}
    frame = pd.DataFrame(rows + [published])
    return [PaperTable("candor_head_errors", frame,
                       "Head errors and discordance on the test split: miss rates of discordant and other positives, "
                       "Mantel-Haenszel risk difference stratified by encoder x finding (± = SD over the resamples of "
                       "the patients; Sato 1989 SE beside it), FP rates of negatives nearer to the positives (c+ > c-) "
                       "and the others; the paper's values in the last row (11 encoders, 5 chest sites).")]


#: candor.md "Discordance and Head Errors" (and Ablation (3)): quantity -> (our statistic, published quantity)
FAILURE_QUANTITIES = [
    ("Combinations (encoder x finding x test site)", "chest: encoder x finding x test-site combinations"),
    ("r: mean AUROC", "chest: mean AUROC of neighborhood impurity r for head errors"),
    ("Confidence: mean AUROC (same images)", "chest: mean AUROC of confidence for head errors"),
    ("Confidence significantly better than r (FDR)", "combinations where confidence significantly better than r"),
    ("Confidence significantly worse than r (FDR)", "combinations where confidence significantly worse than r"),
    ("Deep ensemble: mean AUROC", "chest: mean AUROC of deep ensemble for head errors"),
    ("k-NN distance: mean AUROC", "chest: mean AUROC of k-NN distance for head errors"),
    ("Mahalanobis distance: mean AUROC", "chest: mean AUROC of Mahalanobis distance for head errors"),
    ("DM proxy: mean AUROC (trained encoders)", "DM_g with head prediction as label: mean AUROC for head errors"),
    ("MSP on the DM proxy's images: mean AUROC", "maximum softmax probability on the same images"),
]
_CONFIDENCE_AGREEMENT = ("Largest AUROC gap among MSP, max logit, energy",
                         "max AUROC difference among MSP/max-logit/energy, chest (printed 10^{-6})")


def _untrained(encoder: str) -> bool:
    """True for an encoder with random weights (objective "none", e.g. the random ViT-L)."""
    try:
        return encoders.get(encoder).objective == "none"
    except KeyError:
        return False


def candor_failure_detection(results: SweepResults) -> list[PaperTable]:
    """candor.md "Discordance and Head Errors", the chest failure-detection study, in the paper's
    numbers: over the combinations of encoder × finding × test site (the per-site strata of
    ``error_detection`` with ``train_on``; ``__all__`` when a run has no strata) with every
    detector scored, the mean AUROC of r, confidence (MSP), the deep ensemble, k-NN distance and
    Mahalanobis distance; how often confidence is significantly better / worse than r after BH-FDR
    at 0.05 over those combinations (the paired clustered-bootstrap p of r against MSP); the DM
    proxy and MSP over the trained encoders (the paper: "the 10 trained encoders", i.e. without
    the random ViT-L); the largest gap among the three confidence AUROCs (Ablation (3)). The
    published value sits beside ours."""
    summ = results.summaries("error_detection")
    if summ.empty:
        return []
    summ = summ[summ["auroc"].notna()]
    if (summ["stratum"] != "__all__").any():
        summ = summ[summ["stratum"] != "__all__"]
    keys = [c for c in ("encoder", "dataset", "finding", "stratum") if c in summ.columns]
    wide = summ.pivot_table(index=keys, columns="method", values="auroc", aggfunc="first")
    wide = wide.dropna(subset=[m for m in ("msp", "impurity") if m in wide.columns])
    r = summ[summ["method"] == "impurity"].set_index(keys).loc[wide.index]
    tested = r[r["p_value"].notna()]
    significant = bh_adjust(tested["p_value"], FDR_ALPHA)[1] if len(tested) else np.zeros(0, bool)
    trained = np.array([not _untrained(e) for e in wide.index.get_level_values("encoder")], bool)
    proxy = wide[trained]

    def mean(frame, method):
        return float(frame[method].mean()) if method in frame.columns and len(frame) else np.nan

    ours = [len(wide), mean(wide, "impurity"), mean(wide, "msp"),
            int((significant & (tested["diff_vs_msp"] < 0).to_numpy()).sum()),
            int((significant & (tested["diff_vs_msp"] > 0).to_numpy()).sum()),
            mean(wide, "ensemble"), mean(wide, "knn"), mean(wide, "mahalanobis"),
            mean(proxy.dropna(subset=["dm_proxy"]) if "dm_proxy" in proxy else proxy, "dm_proxy"),
            mean(proxy.dropna(subset=["dm_proxy"]) if "dm_proxy" in proxy else proxy, "msp")]
    rows = [{"Quantity": q, "Ours": v, "Published": published_text("v4", pq)}
            for (q, pq), v in zip(FAILURE_QUANTITIES, ours)]
    gap = summ.set_index(keys).loc[wide.index, "confidence_max_diff"] if "confidence_max_diff" in summ else []
    rows.append({"Quantity": _CONFIDENCE_AGREEMENT[0], "Ours": float(np.nanmax(gap)) if len(gap) else np.nan,
                 "Published": published_text("v4", _CONFIDENCE_AGREEMENT[1])})
    frame = pd.DataFrame(rows)
    frame["Ours"] = pd.Series([row["Ours"] for row in rows], dtype=object)  # counts print as integers
    return [PaperTable("candor_failure_detection", frame,
                       "Detecting the errors of heads trained on MIMIC-CXR on the 5 chest sites (candor.md "
                       "'Discordance and Head Errors'): mean AUROCs over the encoder x finding x test-site "
                       "combinations, significant differences of r from confidence after BH-FDR at 0.05 (paired "
                       "patient-clustered bootstrap), the DM proxy over the trained encoders; published beside ours.",
                       decimals=4)]
