"""Patient-clustered bootstrap of AUROCs (candor.md "Reporting": 1,000 resamples clustered by
patient; 95% percentile interval).

A resample draws as many clusters as there are, uniformly with replacement; a row then counts as
many times as its cluster was drawn. The AUROC of a resample is the weighted Mann-Whitney
statistic (ties count 1/2), computed for every resample at once from the rows sorted by score.
Several scores of the same rows (``scores`` of shape (m, N)) share the resamples, so differences
between them are paired.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def resample_weights(clusters, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot, N) multiplicity of each row in each clustered resample."""
    codes, _ = pd.factorize(pd.Series(np.asarray(clusters).astype(str)), sort=True)
    n_clusters = int(codes.max()) + 1
    draws = rng.integers(0, n_clusters, size=(n_boot, n_clusters))
    flat = (draws + np.arange(n_boot)[:, None] * n_clusters).ravel()
    counts = np.bincount(flat, minlength=n_boot * n_clusters).reshape(n_boot, n_clusters)
    return counts[:, codes].astype(np.float64)


def weighted_auroc(labels, score, weights: np.ndarray) -> np.ndarray:
    """AUROC of ``score`` for binary ``labels`` under each row of ``weights`` (B, N); ties 1/2.
    A resample without positives or negatives gives NaN."""
    labels = np.asarray(labels) == 1
    score = np.asarray(score, np.float64)
    order = np.argsort(score, kind="stable")
    s, y, w = score[order], labels[order], np.atleast_2d(weights)[:, order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])  # first row of each tie block
    wp = np.add.reduceat(w * y, starts, axis=1)
    wn = np.add.reduceat(w * ~y, starts, axis=1)
    below = np.cumsum(wn, axis=1) - wn  # negative weight strictly below each block
    with np.errstate(invalid="ignore", divide="ignore"):
        return (wp * (below + 0.5 * wn)).sum(axis=1) / (wp.sum(axis=1) * wn.sum(axis=1))


def bootstrap_aurocs(labels, scores, clusters, n_boot: int, seed: int, chunk: int = 100) -> np.ndarray:
    """(n_boot, m) AUROCs of the m score rows on shared clustered resamples (module doc)."""
    scores = np.atleast_2d(np.asarray(scores, np.float64))
    rng = np.random.default_rng(seed)
    out = np.empty((n_boot, len(scores)))
    for start in range(0, n_boot, chunk):
        w = resample_weights(clusters, min(chunk, n_boot - start), rng)
        for j, score in enumerate(scores):
            out[start:start + len(w), j] = weighted_auroc(labels, score, w)
    return out


def percentile_ci(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The percentile interval of the finite values (NaN when fewer than two)."""
    values = values[np.isfinite(values)]
    if len(values) < 2:
        return np.nan, np.nan
    lo, hi = np.percentile(values, [50 * (1 - level), 100 - 50 * (1 - level)])
    return float(lo), float(hi)


def bootstrap_p(diffs: np.ndarray) -> float:
    """Two-sided bootstrap p-value of a paired difference being 0:
    min(1, 2·min(#(d ≤ 0) + 1, #(d ≥ 0) + 1) / (B + 1))."""
    d = diffs[np.isfinite(diffs)]
    if len(d) == 0:
        return np.nan
    return float(min(1.0, 2 * (min((d <= 0).sum(), (d >= 0).sum()) + 1) / (len(d) + 1)))


def auroc_with_ci(labels, score, clusters, n_boot: int = 1000, seed: int = 42) -> dict:
    """AUROC of ``score`` and its clustered-bootstrap 95% interval."""
    from sklearn.metrics import roc_auc_score

    labels = np.asarray(labels)
    if len(np.unique(labels)) < 2:
        return dict(auroc=np.nan, auroc_ci_low=np.nan, auroc_ci_high=np.nan)
    lo, hi = percentile_ci(bootstrap_aurocs(labels, score, clusters, n_boot, seed)[:, 0]) if n_boot else (np.nan,) * 2
    return dict(auroc=float(roc_auc_score(labels, score)), auroc_ci_low=lo, auroc_ci_high=hi)
