"""Failure detection on frozen features (candor.md "Baselines", "Discordance and Head Errors",
Table 3 "Detection", Ablation (3)).

For one finding, the ``head`` of :mod:`robustbench_fm.methods.heads.stage` (same rows, training and
operating point) errs on a test row when its prediction at the operating point differs from the
label. Each detector scores every drawn test row (:mod:`robustbench_fm.methods.heads.failure`):

* ``msp``, ``max_logit``, ``energy``: confidence computed from the head's logit (its output),
  not from its decision at the operating point (identical AUROCs for a binary head up to float
  ties; ``confidence_max_diff`` reports their largest gap);
* ``ensemble``: disagreement of ``n_members`` = 5 heads (the head itself and ``n_members`` − 1
  more, seeds seed+1, …), the standard deviation of their probabilities;
* ``mahalanobis``: class-conditional Gaussians with shared covariance on the standardised
  training features;
* ``knn``: distance to the ``knn_k``-th nearest training feature (Sun et al. 2022, k = 50);
* ``impurity``: r(x, F) of :func:`robustbench_fm.methods.candor.impurity.neighbourhood_impurity` with the
  ``k`` = 5 nearest labelled training rows of the query's matched group (``group_col``);
* ``dm_proxy``: DM with the head's prediction in place of the label, against equal-size
  positive / negative banks (≤ ``bank_size``) of the group's training rows, drawn as CANDOR
  draws its banks (seed, group).

With ``train_on`` (e.g. ``mimic_cxr`` on ``dataset=chest_pool``) the head is trained on that
site's training rows, its operating point fixed on that site's validation rows, and every site's
drawn test rows are scored (:func:`cross_site_rows`), one stratum per site (``site_col``); the
ensemble, Mahalanobis and k-NN reference is the same training rows, and r's candidate set and
the DM proxy's banks are the training rows in the query's view (``view_col``): nothing of a
test site enters any reference.

Every detector is scored on the same rows: the drawn test rows where all scores are finite (a
matched group with too few training rows for the neighbour scores drops out). With
``stratify_col`` (e.g. ``site``) each value of that column is a further stratum beside
``__all__``. Per stratum and detector: AUROC of detecting the errors with its patient-clustered
95% interval, the paired bootstrap difference against ``msp`` (same resamples) with its interval
and two-sided p-value, and the Benjamini-Hochberg q-value over every (stratum, detector) of this
run (a family spanning several runs is re-corrected by the table builder).

``summary`` columns: finding, stratum, method, auroc, auroc_ci_low, auroc_ci_high, diff_vs_msp,
diff_ci_low, diff_ci_high, p_value, q_value, confidence_max_diff, n, n_errors, reason.
``per_sample`` columns: sample_id, finding, stratum, label, logit, pred, error and one column per
detector.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from scipy.special import expit
from sklearn.metrics import roc_auc_score

from ...core.devices import resolve_device
from ...core.errors import InvalidSetting
from ...core.neighbors import l2_normalize
from ...core.results import Results
from ...core.stats import bh_adjust, bootstrap_aurocs, bootstrap_p, few_clusters, percentile_ci
from ..candor.impurity import neighbourhood_impurity
from ..candor.stage import draw_group, group_rng
from .failure import CONFIDENCE, confidence_scores, dm_proxy, ensemble_disagreement, knn_distance, mahalanobis
from .fit import fit_finding
from .params import ErrorDetectionParams
from .rows import HeadRows, draw_first, draw_rows
from .train import train_head

PARAMS = ErrorDetectionParams

METHODS = (*CONFIDENCE, "ensemble", "mahalanobis", "knn", "impurity", "dm_proxy")
SUMMARY_COLUMNS = ["finding", "stratum", "method", "auroc", "auroc_ci_low", "auroc_ci_high", "diff_vs_msp",
                   "diff_ci_low", "diff_ci_high", "p_value", "q_value", "confidence_max_diff", "n", "n_errors",
                   "reason", "note"]
ALL = "__all__"


def check_params(**params) -> ErrorDetectionParams:
    """The heads' checks plus the detectors' own (one line each;
    :class:`~robustbench_fm.methods.heads.params.ErrorDetectionParams`)."""
    return PARAMS.parse(params)


def _dm_proxy_scores(features, manifest, finding, fit, test, pred, groups, bank_size, k, seed, device):
    feats = torch.as_tensor(l2_normalize(features), device=resolve_device(device))
    y = manifest[finding].to_numpy()
    out = np.full(len(test), np.nan)
    for group in np.unique(groups[test]):
        train = fit.train[groups[fit.train] == group]
        pos, neg = train[y[train] == 1], train[y[train] == 0]
        if min(len(pos), len(neg)) < k:
            continue
        _, bank_pos, bank_neg = draw_group(train, pos, neg, bank_size, len(train), group_rng(seed, group))
        at = groups[test] == group
        out[at] = dm_proxy(feats, pred[at], test[at], bank_pos, bank_neg, k)
    return out


def detector_scores(features, manifest, finding, fit, n_members, knn_k, k, bank_size, group_col, seed,
                    device, train_options) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Per drawn test row: every detector's error score; also (logit, prediction). A test row's
    r and DM proxy use the training rows (``fit.train``) with its value of ``group_col`` (the
    matched group; the view when training on another site)."""
    test, train = fit.test, fit.train
    y = manifest[finding].to_numpy()
    logit, pred = fit.scores(features, test)
    scores = confidence_scores(logit)  # from the outputs, not the decision
    members = [expit(logit)] + [expit(train_head(features[train], y[train], seed=seed + m, device=device,
                                                 **train_options).logits(features[test]))
                                for m in range(1, n_members)]
    scores["ensemble"] = ensemble_disagreement(np.stack(members))
    scaler = fit.head.scaler
    standard = [scaler(torch.as_tensor(features[r], device=fit.head.device)).double().cpu().numpy()
                for r in (train, test)]
    scores["mahalanobis"] = mahalanobis(standard[0], y[train], standard[1])
    scores["knn"] = knn_distance(features[train], features[test], knn_k, device)
    groups = (manifest[group_col].astype(str).to_numpy() if group_col in manifest.columns
              else np.full(len(manifest), ALL))
    both = np.concatenate([train, test])
    r = neighbourhood_impurity(features[both], y[both], np.arange(len(both)) < len(train), groups[both], k,
                               device)
    scores["impurity"] = r[len(train):]
    scores["dm_proxy"] = _dm_proxy_scores(features, manifest, finding, fit, test, pred, groups, bank_size, k,
                                          seed, device)
    return pd.DataFrame(scores)[list(METHODS)], logit, pred


def cross_site_rows(manifest: pd.DataFrame, rows: HeadRows, train_on: str, site_col: str, max_train: int,
                    max_test: int, seed: int) -> HeadRows:
    """The rows of the cross-site study (candor.md "Discordance and Head Errors"): training and
    validation rows of site ``train_on`` only (its ≤ ``max_train`` stable-hash training rows),
    test rows the ≤ ``max_test`` stable-hash test rows of every site (the splits of
    :func:`~robustbench_fm.methods.heads.rows.head_splits`, carved per site where a site has none).
    The paper's "tested on at most 20,000 images of its domain" is read per test site."""
    sites = manifest[site_col].astype(str).to_numpy()
    if not (sites == train_on).any():
        raise InvalidSetting(f"error_detection: train_on='{train_on}' names no row of column '{site_col}' "
                         f"(sites: {', '.join(sorted(set(sites)))}); set stage.params.train_on to one of them")
    ids = manifest["sample_id"].astype(str).to_numpy()
    home = sites == train_on
    train = draw_first(np.flatnonzero(home & (rows.split == "train")), ids, max_train, seed)
    val = np.flatnonzero(home & (rows.split == "val"))
    test = np.sort(np.concatenate([draw_first(np.flatnonzero((sites == s) & (rows.split == "test")), ids, max_test,
                                              seed) for s in pd.unique(sites)]))
    return HeadRows(train=train, val=val, test=test, test_all=np.flatnonzero(rows.split == "test"), split=rows.split)


def _stratum_rows(finding, stratum, error, scores: pd.DataFrame, clusters, n_boot, seed) -> list[dict]:
    base = dict(finding=finding, stratum=stratum, n=len(error), n_errors=int(error.sum()), reason="",
                note=few_clusters(len(np.unique(clusters))) if n_boot else "")
    if len(np.unique(error)) < 2:
        return [dict(base, method=m, reason="no errors or no correct predictions among these rows")
                for m in METHODS]
    matrix = scores.to_numpy().T
    aurocs = [float(roc_auc_score(error, s)) for s in matrix]
    boot = bootstrap_aurocs(error, matrix, clusters, n_boot, seed) if n_boot else np.full((0, len(matrix)), np.nan)
    ref = METHODS.index("msp")
    conf = [aurocs[METHODS.index(m)] for m in CONFIDENCE]
    rows = []
    for j, method in enumerate(METHODS):
        diff = boot[:, j] - boot[:, ref]
        lo, hi = percentile_ci(boot[:, j])
        dlo, dhi = percentile_ci(diff)
        rows.append(dict(base, method=method, auroc=aurocs[j], auroc_ci_low=lo, auroc_ci_high=hi,
                         diff_vs_msp=aurocs[j] - aurocs[ref], diff_ci_low=dlo, diff_ci_high=dhi,
                         p_value=np.nan if method in CONFIDENCE else bootstrap_p(diff),
                         confidence_max_diff=float(max(conf) - min(conf))))
    return rows


def run(features: np.ndarray, manifest: pd.DataFrame, finding: str,
        params: ErrorDetectionParams | None = None, **kw) -> Results:
    """Every detector's AUROC for the errors of the ``head`` of ``finding`` (module doc); ``params``:
    :class:`~robustbench_fm.methods.heads.params.ErrorDetectionParams`."""
    p = PARAMS.parse(params, **kw)
    head, n_members, knn_k, k, bank_size, group_col = p.head, p.n_members, p.knn_k, p.k, p.bank_size, p.group_col
    stratify_col, max_train, max_test, seed, cluster_col = p.stratify_col, p.max_train, p.max_test, p.seed, \
        p.cluster_col
    n_boot, device = p.n_boot, p.device
    train_options = dict(kind=head, epochs=p.epochs, lr=p.lr, weight_decay=p.weight_decay, batch_size=p.batch_size,
                         hidden=p.hidden)
    params = {"finding": finding, **{n: v for n, v in p.to_dict().items() if n != "device"}}
    needed = [p.site_col, p.view_col] if p.train_on is not None else []
    for col in [finding] + ([stratify_col] if stratify_col else []) + needed:
        if col not in manifest.columns:
            raise InvalidSetting(f"error_detection: manifest has no column '{col}'; add it or change the setting")
    rows = draw_rows(manifest, max_train, max_test, seed, cluster_col, p.val_fraction, p.test_fraction)
    if p.train_on is not None:
        rows = cross_site_rows(manifest, rows, p.train_on, p.site_col, max_train, max_test, seed)
        group_col, stratify_col = p.view_col, stratify_col or p.site_col
    fit = fit_finding(features, manifest, finding, rows, seed=seed, sensitivity=p.sensitivity,
                      cluster_col=cluster_col, n_boot=0, device=device, head=head,
                      **{o: v for o, v in train_options.items() if o != "kind"})
    if fit.head is None:
        summary = pd.DataFrame([dict(finding=finding, stratum=ALL, method=m, n=0, n_errors=0,
                                     reason=fit.summary["reason"]) for m in METHODS])
        return Results(summary=summary.reindex(columns=SUMMARY_COLUMNS), per_sample=None, params=params)
    scores, logit, pred = detector_scores(features, manifest, finding, fit, n_members, knn_k, k, bank_size,
                                          group_col, seed, device, train_options)
    test = fit.test
    label = manifest[finding].to_numpy()[test]
    strata = manifest[stratify_col].astype(str).to_numpy()[test] if stratify_col else np.full(len(test), ALL)
    per = pd.DataFrame({"sample_id": manifest["sample_id"].to_numpy()[test], "finding": finding,
                        "stratum": strata, "label": label, "logit": logit, "pred": pred,
                        "error": pred != (label == 1)})
    per = pd.concat([per, scores], axis=1)
    clusters = manifest[cluster_col if cluster_col in manifest.columns else "sample_id"].astype(str).to_numpy()[test]
    finite = np.isfinite(scores.to_numpy()).all(axis=1)
    parts = [(ALL, finite)] + ([(s, finite & (strata == s)) for s in sorted(set(strata))] if stratify_col else [])
    summary = pd.DataFrame([row for stratum, at in parts for row in _stratum_rows(
        finding, stratum, per["error"].to_numpy()[at], scores[at], clusters[at], n_boot, seed)])
    summary = summary.reindex(columns=SUMMARY_COLUMNS)
    tested = summary["p_value"].notna()
    if tested.any():
        summary.loc[tested, "q_value"] = bh_adjust(summary.loc[tested, "p_value"])[0]
    return Results(summary=summary, per_sample=per, params=params,
                   items=_items(per, scores, clusters, parts))


def _items(per: pd.DataFrame, scores: pd.DataFrame, clusters: np.ndarray, parts) -> pd.DataFrame:
    """The scored test rows of every (stratum, detector) in long form, for paired comparisons between
    encoders (``Results.items``): the detector's score and whether the head erred, and the row's patient.
    The test rows are the same for every encoder; each encoder's head makes its own errors."""
    frames = []
    for stratum, at in parts:
        for method in METHODS:
            frames.append(pd.DataFrame({"sample_id": per["sample_id"].to_numpy()[at], "finding": per["finding"].iloc[0],
                                        "stratum": stratum, "method": method,
                                        "score": scores[method].to_numpy(float)[at],
                                        "error": per["error"].to_numpy(float)[at], "cluster": clusters[at]}))
    return pd.concat(frames, ignore_index=True)
