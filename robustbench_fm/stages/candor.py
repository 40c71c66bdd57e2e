"""CANDOR core: chance-calibrated neighbourhood discordance (candor.md, "The CANDOR Framework",
"Implementation", "Reporting", "Baselines").

For one binary finding F and each matched group s (``group_col``):

* queries: the positives inside a seeded random sample of at most ``max_group_sample`` labelled
  images of s;
* banks R+_s and R−_s: n = min(bank_size, #positives, #negatives) images drawn once (seed) from
  all positives / negatives of s; a query that is in R+_s is removed from it (it then meets n−1
  positives, chance level ≤ 1/2 + k/n, candor.md "The Discordance Rate and Its Chance Level");
* c±(x) = mean cosine similarity of the k nearest in R±_s; DM(x) = c−(x) − c+(x) (Eq. 1);
  x is discordant iff DM(x) > 0 (ties are concordant);
* D_s = share of discordant queries; D_all with all positives / all negatives of s as candidates,
  the query excluded ("Unequal Candidate Sets": above 1/2 even on label-independent features);
* margin AUROC: every labelled image of s scored by c+ − c− against the banks, each image
  excluded from the bank holding it ("Baselines");
* ± and 95% interval: 1,000 bootstrap resamples of the queries clustered by patient, banks
  fixed ("Reporting").

Several findings (``finding`` as a list) are scored together: the similarities of a matched
group's labelled images are computed once and shared by every finding's banks and queries.

Groups are pooled weighted by their number of queries (D and D_all as ratios of sums, the margin
AUROC as the query-weighted mean of group AUROCs). A group that cannot be scored (fewer than
k + 1 images in a bank) gets a row with its ``reason`` and is left out of the pool.

``summary`` columns: finding, acq_group (``"__pooled__"`` for the pool), n_queries, n_pos, n_neg,
bank_size, k, d, d_sd, d_ci_low, d_ci_high, d_all, margin_auroc, reason.
``per_sample`` columns: sample_id, finding, acq_group, c_pos, c_neg, dm, discordant, c_pos_all,
c_neg_all, dm_all, discordant_all.
"""
from __future__ import annotations

import zlib

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import roc_auc_score

from ..devices import resolve_device
from ..neighbors import Shortlist, l2_normalize
from ..results import Results
from ..stats import cluster_bootstrap_ratio, summarize_bootstrap

POOLED = "__pooled__"
#: ``run`` takes a list of findings and scores them from one similarity pass per matched group.
MULTI_FINDING = True
PER_SAMPLE_COLUMNS = ["sample_id", "finding", "acq_group", "c_pos", "c_neg", "dm", "discordant",
                      "c_pos_all", "c_neg_all", "dm_all", "discordant_all"]


def group_rng(seed: int, group: str) -> np.random.Generator:
    """One generator per matched group, so a group's draws do not depend on the other groups."""
    return np.random.default_rng([seed, zlib.crc32(str(group).encode())])


def draw_group(pos: np.ndarray, neg: np.ndarray, bank_size: int, max_group_sample: int,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Queries (positives of the ≤ max_group_sample sample) and the equal-size banks R+, R−."""
    labelled = np.sort(np.concatenate([pos, neg]))
    sample = labelled if len(labelled) <= max_group_sample else np.sort(
        rng.choice(labelled, size=max_group_sample, replace=False))
    queries = sample[np.isin(sample, pos)]
    n = min(bank_size, len(pos), len(neg))
    bank_pos = np.sort(rng.choice(pos, size=n, replace=False))
    bank_neg = np.sort(rng.choice(neg, size=n, replace=False))
    return queries, bank_pos, bank_neg


def _score_group(shortlist: Shortlist, pos, neg, queries, bank_pos, bank_neg, k):
    """c± of the queries on the banks and on all images, and the margin AUROC of every labelled
    image (the queries' c± on the banks are read off the margin's terms)."""
    everyone = np.concatenate([pos, neg])
    m_pos, m_neg = shortlist.mean_topk(everyone, bank_pos, k), shortlist.mean_topk(everyone, bank_neg, k)
    at = np.searchsorted(pos, queries)  # queries are positives, pos is sorted
    c_pos, c_neg = m_pos[at], m_neg[at]
    # a full bank is the set of all positives (negatives): then D_all's scores are D's
    c_pos_all = c_pos if len(bank_pos) == len(pos) else shortlist.mean_topk(queries, pos, k)
    c_neg_all = c_neg if len(bank_neg) == len(neg) else shortlist.mean_topk(queries, neg, k)
    auroc = roc_auc_score(np.r_[np.ones(len(pos)), np.zeros(len(neg))], m_pos - m_neg)
    return c_pos, c_neg, c_pos_all, c_neg_all, float(auroc)


def check_params(k: int = 5, bank_size: int = 4000, max_group_sample: int = 4000, n_boot: int = 1000,
                 **_) -> None:
    """Refuse inconsistent options before any heavy work (one line each)."""
    if k < 1:
        raise ValueError(f"candor: k={k} must be at least 1")
    if bank_size < k + 1:
        raise ValueError(f"candor: bank_size={bank_size} must exceed k={k} (a query in R+ meets "
                         f"bank_size-1 positives); raise bank_size or lower k")
    if max_group_sample < 1:
        raise ValueError(f"candor: max_group_sample={max_group_sample} must be at least 1")
    if n_boot < 0:
        raise ValueError(f"candor: n_boot={n_boot} must be 0 or more")


def run(features: np.ndarray, manifest: pd.DataFrame, finding: str | list[str], k: int = 5,
        bank_size: int = 4000, max_group_sample: int = 4000, seed: int = 42, group_col: str = "acq_group",
        cluster_col: str = "patient_id", n_boot: int = 1000, device="auto", block_size: int = 4096,
        shortlist: int = 256, backend: str = "torch") -> Results:
    """Discordance of the positives of ``finding`` (one column or a list) per matched group and
    pooled (see module doc).

    All findings of a matched group are scored from one :class:`~robustbench_fm.neighbors.Shortlist`
    of its labelled images (``shortlist`` nearest per image; exact whatever its size);
    ``block_size`` bounds the similarity rows held at once, ``backend="faiss"`` sends the exact
    fallback searches to faiss.
    """
    findings = [finding] if isinstance(finding, str) else list(finding)
    check_params(k=k, bank_size=bank_size, max_group_sample=max_group_sample, n_boot=n_boot)
    for col in (*findings, group_col, cluster_col):
        if col not in manifest.columns:
            raise ValueError(f"candor: manifest has no column '{col}'; "
                             f"add it or set {'finding' if col in findings else col}=<column>")
    feats = torch.as_tensor(l2_normalize(features), device=resolve_device(device))
    labels = {f: manifest[f].to_numpy(dtype=float) for f in findings}
    groups = manifest[group_col].astype(str).to_numpy()
    clusters = manifest[cluster_col].astype(str).to_numpy()
    sample_ids = manifest["sample_id"].to_numpy()
    rows = {f: [] for f in findings}
    per_sample, pooled_parts = [], {f: [] for f in findings}
    for group in sorted(pd.unique(groups)):
        in_group = groups == group
        labelled = np.flatnonzero(in_group & np.any([np.isin(labels[f], (0, 1)) for f in findings], axis=0))
        group_shortlist = None
        for f in findings:
            pos = np.flatnonzero(in_group & (labels[f] == 1))
            neg = np.flatnonzero(in_group & (labels[f] == 0))
            row = dict(finding=f, acq_group=group, n_queries=0, n_pos=len(pos), n_neg=len(neg),
                       bank_size=min(bank_size, len(pos), len(neg)), k=k, d=np.nan, d_sd=np.nan,
                       d_ci_low=np.nan, d_ci_high=np.nan, d_all=np.nan, margin_auroc=np.nan, reason="")
            rows[f].append(row)
            if min(len(pos), len(neg)) < k + 1:
                row["reason"] = (f"fewer than k+1={k + 1} positives or negatives "
                                 f"({len(pos)} positives, {len(neg)} negatives)")
                continue
            queries, bank_pos, bank_neg = draw_group(pos, neg, bank_size, max_group_sample,
                                                     group_rng(seed, group))
            if len(queries) == 0:
                row["reason"] = "no positive in the sampled images"
                continue
            if group_shortlist is None:
                group_shortlist = Shortlist(feats, labelled, shortlist, block_size, backend)
            c_pos, c_neg, c_pos_all, c_neg_all, auroc = _score_group(
                group_shortlist, pos, neg, queries, bank_pos, bank_neg, k)
            disc, disc_all = (c_neg - c_pos) > 0, (c_neg_all - c_pos_all) > 0
            boot = cluster_bootstrap_ratio(disc, np.ones(len(disc)), clusters[queries], n_boot,
                                           np.random.default_rng(seed))
            ci = summarize_bootstrap(boot)
            row.update(n_queries=len(queries), d=float(disc.mean()), d_sd=ci["sd"], d_ci_low=ci["ci_low"],
                       d_ci_high=ci["ci_high"], d_all=float(disc_all.mean()), margin_auroc=auroc)
            per_sample.append(pd.DataFrame({
                "sample_id": sample_ids[queries], "finding": f, "acq_group": group,
                "c_pos": c_pos, "c_neg": c_neg, "dm": c_neg - c_pos, "discordant": disc,
                "c_pos_all": c_pos_all, "c_neg_all": c_neg_all, "dm_all": c_neg_all - c_pos_all,
                "discordant_all": disc_all}))
            pooled_parts[f].append((queries, disc, disc_all, auroc, len(pos), len(neg)))
        del group_shortlist
    summary = pd.DataFrame([r for f in findings for r in
                            [*rows[f], _pooled_row(f, k, pooled_parts[f], clusters, n_boot, seed)]])
    summary["bank_size"] = summary["bank_size"].astype("Int64")
    per = pd.concat(per_sample, ignore_index=True) if per_sample else pd.DataFrame(columns=PER_SAMPLE_COLUMNS)
    if len(findings) > 1:
        per = per.sort_values("finding", kind="stable", key=lambda c: c.map(findings.index),
                              ignore_index=True)
    params = dict(finding=finding, k=k, bank_size=bank_size, max_group_sample=max_group_sample,
                  seed=seed, group_col=group_col, cluster_col=cluster_col, n_boot=n_boot)
    return Results(summary=summary, per_sample=per, params=params)


def _pooled_row(finding, k, parts, clusters, n_boot, seed) -> dict:
    """Groups pooled by number of queries; the bootstrap resamples patients across groups."""
    row = dict(finding=finding, acq_group=POOLED, n_queries=0, n_pos=0, n_neg=0, bank_size=pd.NA,
               k=k, d=np.nan, d_sd=np.nan, d_ci_low=np.nan, d_ci_high=np.nan, d_all=np.nan,
               margin_auroc=np.nan, reason="")
    if not parts:
        row["reason"] = "no matched group could be scored"
        return row
    queries = np.concatenate([p[0] for p in parts])
    disc = np.concatenate([p[1] for p in parts])
    disc_all = np.concatenate([p[2] for p in parts])
    sizes = np.array([len(p[0]) for p in parts], float)
    boot = cluster_bootstrap_ratio(disc, np.ones(len(disc)), clusters[queries], n_boot,
                                   np.random.default_rng(seed))
    ci = summarize_bootstrap(boot)
    row.update(n_queries=len(queries), n_pos=sum(p[4] for p in parts), n_neg=sum(p[5] for p in parts),
               d=float(disc.mean()), d_sd=ci["sd"], d_ci_low=ci["ci_low"],
               d_ci_high=ci["ci_high"], d_all=float(disc_all.mean()),
               margin_auroc=float(np.average([p[3] for p in parts], weights=sizes)))
    return row
