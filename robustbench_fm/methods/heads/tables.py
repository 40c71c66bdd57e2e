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

from ...core.stats import FDR_ALPHA, bh_adjust, mantel_haenszel_rd
from ...core.tables import PaperTable, SweepResults
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


def _rates(pred: pd.DataFrame, labels: pd.Series, sets: dict[str, pd.Index]) -> dict[str, float]:
    """Miss rate on each positive set / FP rate on the negatives, mean over the columns."""
    out = {}
    for name, index in sets.items():
        rows = pred.loc[pred.index.intersection(index)]
        positive = name != "FP rate Negatives"
        hits = rows.to_numpy(bool)
        out[name] = float(np.mean((~hits if positive else hits).mean(axis=0))) if len(rows) else np.nan
    return out


def candor_table4(results: SweepResults) -> list[PaperTable]:
    """candor.md Table 4: six rules combining the panel's heads, miss rates on the blind positives
    of the test sample ("263") and of the whole test split ("33,770"), on all test-sample positives
    ("All") and the FP rate on the test-sample negatives. Column headers are the published ones;
    the caption gives this sweep's counts."""
    per = results.per_sample(STAGE)
    if per.empty:
        return []
    key = _key(per)
    blind = blind_flags(per[per["split"] == "test"]).set_index(key)
    blind_idx = blind.index[blind["blind"]]
    first = per.drop_duplicates(key).set_index(key)
    test = first[first["split"] == "test"]
    sample = test[test["in_sample"]]
    sets = {"Miss rate 263": blind_idx.intersection(sample.index[sample["query"] & (sample["label"] == 1)]),
            "Miss rate 33,770": blind_idx.intersection(test.index[test["label"] == 1]),
            "Miss rate All": sample.index[sample["label"] == 1],
            "FP rate Negatives": sample.index[sample["label"] == 0]}
    rules = rule_predictions(per)
    n = per["encoder"].nunique()
    labels = {"single": f"Single head (mean of {n})", "chosen": "Head chosen on validation",
              "majority": "Majority vote", "mean_prob": f"Mean probability of {n} heads",
              "stacked": "Stacked logistic regression", "or": "OR rule"}
    frame = pd.DataFrame([{"Rule": label, **_rates(rules[name], first["label"], sets)}
                          for name, label in labels.items() if len(rules[name])])
    counts = ", ".join(f"{name.split(' ', 2)[-1]}: n = {len(idx)}" for name, idx in sets.items())
    caption = (f"Six rules that combine the {n} heads (candor.md Table 4); miss rate on positives and FP rate "
               f"on negatives ({counts}).")
    return [PaperTable("candor_table4", frame, caption,
                       best={c: "min" for c in frame.columns if c != "Rule"})]


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


def head_error_strata(per: pd.DataFrame) -> pd.DataFrame:
    """Per encoder × (dataset,) finding on the whole test split: misses among discordant and other
    positives, false positives among negatives nearer to the positives and the others."""
    test = per[(per["split"] == "test") & per["pred"].notna()].copy()
    test["miss"] = (test["label"] == 1) & ~test["pred"].astype(bool)
    test["fp"] = (test["label"] == 0) & test["pred"].astype(bool)
    strata = [c for c in ("encoder", "dataset", "finding") if c in test.columns]

    def counts(g: pd.DataFrame) -> pd.Series:
        disc, near = g["discordant"], g["near_pos"]
        d, o = disc.eq(True).fillna(False), disc.eq(False).fillna(False)
        nr, fr = near.eq(True).fillna(False), near.eq(False).fillna(False)
        return pd.Series({"a1": g["miss"][d].sum(), "n1": d.sum(), "a0": g["miss"][o].sum(), "n0": o.sum(),
                          "fp_near": g["fp"][nr].sum(), "n_near": nr.sum(), "fp_far": g["fp"][fr].sum(),
                          "n_far": fr.sum()})

    return test.groupby(strata, sort=True).apply(counts, include_groups=False).reset_index()


def candor_head_errors(results: SweepResults) -> list[PaperTable]:
    """candor.md "Discordance and Head Errors": miss rates of discordant vs other positives, the
    Mantel-Haenszel difference stratified by encoder × finding (Sato's variance,
    :func:`robustbench_fm.core.stats.mantel_haenszel_rd`) and FP rates of negatives nearer to the positives
    vs the others; one row per encoder and a pooled row."""
    per = results.per_sample(STAGE)
    if per.empty:
        return []
    strata = head_error_strata(per)
    rows = []
    for encoder, s in list(strata.groupby("encoder", sort=True)) + [("All encoders", strata)]:
        mh = mantel_haenszel_rd(s["a1"], s["n1"], s["a0"], s["n0"])
        rows.append({"Encoder": encoder, "Miss rate discordant": s["a1"].sum() / s["n1"].sum(),
                     "Miss rate other": s["a0"].sum() / s["n0"].sum(), "MH difference": mh["rd"],
                     "MH SE (Sato)": mh["se"], "FP rate nearer": s["fp_near"].sum() / s["n_near"].sum(),
                     "FP rate other": s["fp_far"].sum() / s["n_far"].sum(), "Strata": mh["n_strata"]})
    frame = pd.DataFrame(rows)
    return [PaperTable("candor_head_errors", frame,
                       "Head errors and discordance on the test split: miss rates of discordant and other positives, "
                       "Mantel-Haenszel risk difference stratified by encoder x finding (Sato 1989 variance), "
                       "FP rates of negatives nearer to the positives (c+ > c-) and the others.")]


def candor_failure_detection(results: SweepResults) -> list[PaperTable]:
    """candor.md "Discordance and Head Errors": mean AUROC of each error detector over the
    (encoder, dataset, finding, stratum) combinations, and how often it is significantly better or
    worse than MSP after BH-FDR over all combinations of the sweep (family per detector)."""
    summ = results.summaries("error_detection")
    if summ.empty:
        return []
    summ = summ[summ["auroc"].notna()]
    rows = []
    for method, s in summ.groupby("method", sort=False):
        row = {"Detector": method, "Mean AUROC": s["auroc"].mean(), "Combinations": len(s)}
        if s["p_value"].notna().any():
            tested = s[s["p_value"].notna()]
            significant = bh_adjust(tested["p_value"], FDR_ALPHA)[1]
            row.update({"Better than MSP": int((significant & (tested["diff_vs_msp"] > 0)).sum()),
                        "Worse than MSP": int((significant & (tested["diff_vs_msp"] < 0)).sum())})
        rows.append(row)
    return [PaperTable("candor_failure_detection", pd.DataFrame(rows),
                       "Detecting head errors: mean AUROC over combinations; significant differences from MSP "
                       "after BH-FDR at 0.05 (paired clustered bootstrap).", best={"Mean AUROC": "max"})]

