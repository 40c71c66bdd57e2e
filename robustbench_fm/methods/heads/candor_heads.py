"""CANDOR discordance joined with the linear head's errors, per sample (candor.md "Discordance and
Head Errors", Table 4; candor_v1.md Table 4).

For one encoder and a list of findings (declared ``multi_finding``):

1. :func:`robustbench_fm.methods.candor.stage.run` scores the findings (positive queries, banks R±_s of
   each matched group, seed ``seed``);
2. the ``head`` of :mod:`robustbench_fm.methods.heads.stage` is trained per finding on the shared rows
   and scores the validation split and the *whole* test split (``in_sample`` marks the ≤
   ``max_test`` drawn test rows every head is compared on);
3. every labelled validation / test row is placed against the same banks CANDOR drew (same
   draw, :func:`~robustbench_fm.methods.candor.stage.draw_group`): c± = mean cosine similarity of its k
   nearest in R±_s (itself excluded), DM = c− − c+. A positive is ``discordant`` iff DM > 0 (for
   CANDOR's queries this is CANDOR's own flag); a negative is ``near_pos`` ("nearer to the
   positives on average") iff c+ > c−, i.e. its discordance with the roles of the banks exchanged
   (Ablation (7)). Rows of a group whose banks hold ≤ k images get no flag.

``per_sample`` columns (per finding): sample_id, patient_id (``cluster_col``: the bootstrap
cluster of the cross-encoder tables), finding, split, acq_group, label, prob, logit,
pred (NaN for CANDOR queries outside the validation / test splits), in_sample, query, c_pos,
c_neg, dm, discordant, near_pos. CANDOR queries of every split are kept, so the consensus blind
set can span all positives.
``summary`` columns: finding, auroc, auroc_ci_low, auroc_ci_high, val_auroc, threshold, d (CANDOR's
pooled D), n_queries, miss_discordant, miss_other, n_discordant, n_other, fpr_near, fpr_far,
n_near, n_far (rates over the whole test split), n (labelled test rows), reason.
The cross-encoder analyses (Mantel-Haenszel difference, combination rules, oracle, consensus)
are built from these rows by :mod:`robustbench_fm.methods.heads.tables`. On ``dataset=chest_pool``
(the five chest sites as one manifest) the heads are trained once on the pooled chest domain: one
stable-hash draw of ≤ 25,000 training and ≤ 20,000 test rows for the whole domain, the same for
every encoder (candor.md "Implementation", Table 4), while CANDOR's matched groups stay site x view.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ...core.devices import resolve_device
from ...core.neighbors import l2_normalize, mean_topk_similarity
from ...core.results import Results
from ..candor import stage as candor
from .fit import fit_finding
from .params import CandorHeadsParams
from .rows import draw_rows

PARAMS = CandorHeadsParams

PER_SAMPLE_COLUMNS = ["sample_id", "patient_id", "finding", "split", "acq_group", "label", "prob", "logit", "pred",
                      "in_sample", "query", "c_pos", "c_neg", "dm", "discordant", "near_pos"]


def check_params(**params) -> CandorHeadsParams:
    """CANDOR's and the heads' checks (one line each;
    :class:`~robustbench_fm.methods.heads.params.CandorHeadsParams`)."""
    return PARAMS.parse(params)


def bank_similarities(feats: torch.Tensor, manifest: pd.DataFrame, finding: str, rows: np.ndarray, k: int,
                      bank_size: int, max_group_sample: int, seed: int,
                      group_col: str) -> tuple[np.ndarray, np.ndarray]:
    """(c+, c−) of ``rows`` against CANDOR's banks of their matched group (NaN where a bank is too small)."""
    labels = manifest[finding].to_numpy(dtype=float)
    groups = manifest[group_col].astype(str).to_numpy()
    c_pos, c_neg = np.full(len(rows), np.nan), np.full(len(rows), np.nan)
    for group in np.unique(groups[rows]):
        in_group = groups == group
        pos, neg = np.flatnonzero(in_group & (labels == 1)), np.flatnonzero(in_group & (labels == 0))
        if min(len(pos), len(neg)) < k + 1:
            continue
        _, bank_pos, bank_neg = candor.draw_group(np.flatnonzero(in_group), pos, neg, bank_size, max_group_sample,
                                                  candor.group_rng(seed, group))
        at = groups[rows] == group
        c_pos[at] = mean_topk_similarity(feats, rows[at], bank_pos, k)
        c_neg[at] = mean_topk_similarity(feats, rows[at], bank_neg, k)
    return c_pos, c_neg


def _rate(flags: np.ndarray) -> float:
    return float(flags.mean()) if len(flags) else np.nan


def _finding_rows(features, feats, manifest, finding, rows, candor_res, head_options, candor_options):
    fit = fit_finding(features, manifest, finding, rows, **head_options)
    y = manifest[finding].to_numpy(dtype=float)
    labelled = np.isin(y, (0.0, 1.0))
    scored = np.sort(np.concatenate([rows.val, rows.test_all]))
    scored = scored[labelled[scored]]
    queries = candor_res.per_sample[candor_res.per_sample["finding"] == finding]
    position = pd.Series(np.arange(len(manifest)), index=manifest["sample_id"].astype(str))
    query_rows = position[queries["sample_id"].astype(str)].to_numpy()
    every = np.union1d(scored, query_rows)
    cluster_col = head_options["cluster_col"]
    patients = manifest[cluster_col if cluster_col in manifest.columns else "sample_id"].astype(str).to_numpy()
    per = pd.DataFrame({"sample_id": manifest["sample_id"].to_numpy()[every], "patient_id": patients[every],
                        "finding": finding,
                        "split": rows.split[every], "acq_group": manifest[candor_options["group_col"]].astype(str)
                        .to_numpy()[every], "label": y[every]})
    per["prob"] = per["logit"] = np.nan
    per["pred"] = pd.array([pd.NA] * len(every), dtype="boolean")
    if fit.head is not None:
        at = np.isin(every, scored)
        fitted = fit.per_sample(features, manifest, rows.split, every[at])
        per.loc[at, "prob"], per.loc[at, "logit"] = fitted["prob"].to_numpy(), fitted["logit"].to_numpy()
        per.loc[at, "pred"] = fitted["pred"].to_numpy()
    per["in_sample"] = np.isin(every, rows.test)
    per["query"] = np.isin(every, query_rows)
    c_pos, c_neg = bank_similarities(feats, manifest, finding, every, **candor_options)
    from_candor = queries.set_index("sample_id")[["c_pos", "c_neg"]]
    q = per["query"].to_numpy()
    c_pos[q] = from_candor.loc[per.loc[q, "sample_id"], "c_pos"].to_numpy()
    c_neg[q] = from_candor.loc[per.loc[q, "sample_id"], "c_neg"].to_numpy()
    per["c_pos"], per["c_neg"], per["dm"] = c_pos, c_neg, c_neg - c_pos
    known = np.isfinite(per["dm"].to_numpy())
    per["discordant"] = pd.array(np.where(known & (per["label"] == 1), per["dm"] > 0, None), dtype="boolean")
    per["near_pos"] = pd.array(np.where(known & (per["label"] == 0), per["dm"] < 0, None), dtype="boolean")
    return fit, per[PER_SAMPLE_COLUMNS]


def _summary_row(finding, fit, per, candor_summary) -> dict:
    test = per[(per["split"] == "test") & per["pred"].notna()]
    pos, neg = test[test["label"] == 1], test[test["label"] == 0]
    miss = ~pos["pred"].astype(bool).to_numpy()
    fp = neg["pred"].astype(bool).to_numpy()
    disc = pos["discordant"].fillna(False).to_numpy(bool)
    other = pos["discordant"].notna().to_numpy() & ~disc
    near = neg["near_pos"].fillna(False).to_numpy(bool)
    far = neg["near_pos"].notna().to_numpy() & ~near
    pooled = candor_summary[(candor_summary["finding"] == finding) & (candor_summary["acq_group"] == candor.POOLED)]
    return dict(finding=finding, auroc=fit.summary["auroc"], auroc_ci_low=fit.summary["auroc_ci_low"],
                auroc_ci_high=fit.summary["auroc_ci_high"], val_auroc=fit.summary["val_auroc"],
                threshold=fit.summary["threshold"], d=float(pooled["d"].iloc[0]) if len(pooled) else np.nan,
                n_queries=int(pooled["n_queries"].iloc[0]) if len(pooled) else 0,
                miss_discordant=_rate(miss[disc]), miss_other=_rate(miss[other]), n_discordant=int(disc.sum()),
                n_other=int(other.sum()), fpr_near=_rate(fp[near]), fpr_far=_rate(fp[far]), n_near=int(near.sum()),
                n_far=int(far.sum()), n=len(test), reason=fit.summary["reason"])


def run(features: np.ndarray, manifest: pd.DataFrame, finding: str | list[str],
        params: CandorHeadsParams | None = None, **kw) -> Results:
    """CANDOR and the head of every finding on the same rows, joined per sample (module doc);
    ``params``: :class:`~robustbench_fm.methods.heads.params.CandorHeadsParams`."""
    p = PARAMS.parse(params, **kw)
    findings = [finding] if isinstance(finding, str) else list(finding)
    params = {"finding": finding, **{n: v for n, v in p.to_dict().items() if n != "device"}}
    c = p.candor_params()
    candor_res = candor.run(features, manifest, findings, k=c.k, bank_size=c.bank_size,
                            max_group_sample=c.max_group_sample, seed=c.seed, group_col=c.group_col,
                            cluster_col=c.cluster_col, n_boot=c.n_boot, device=c.device)
    rows = draw_rows(manifest, p.max_train, p.max_test, p.seed, p.cluster_col, p.val_fraction, p.test_fraction)
    feats = torch.as_tensor(l2_normalize(features), device=resolve_device(p.device))
    head_options = dict(head=p.head, seed=p.seed, sensitivity=p.sensitivity, cluster_col=p.cluster_col,
                        n_boot=p.n_boot, device=p.device, epochs=p.epochs, lr=p.lr, weight_decay=p.weight_decay,
                        batch_size=p.batch_size, hidden=p.hidden)
    candor_options = dict(k=c.k, bank_size=c.bank_size, max_group_sample=c.max_group_sample, seed=c.seed,
                          group_col=c.group_col)
    summaries, per_samples = [], []
    for f in findings:
        fit, per = _finding_rows(features, feats, manifest, f, rows, candor_res, head_options, candor_options)
        summaries.append(_summary_row(f, fit, per, candor_res.summary))
        per_samples.append(per)
    return Results(summary=pd.DataFrame(summaries), per_sample=pd.concat(per_samples, ignore_index=True),
                   params=params)
