"""Resampling statistics shared by the stages."""
from __future__ import annotations

import numpy as np
import pandas as pd


def cluster_bootstrap_ratio(numer: np.ndarray, denom: np.ndarray, clusters, n_boot: int,
                            rng: np.random.Generator, max_draws: int = 2_000_000) -> np.ndarray:
    """Bootstrap distribution of Σnumer / Σdenom resampling whole clusters with replacement.

    With ``denom`` = 1 per unit this is the clustered bootstrap of a mean (e.g. the discordance
    rate over queries, clustered by patient, candor.md "Reporting"). Each resample draws as many
    clusters as there are, uniformly with replacement (``rng.integers``), and sums their
    per-cluster totals; resamples are drawn in chunks of at most ``max_draws`` cluster draws.
    Returns ``n_boot`` values.
    """
    codes, _ = pd.factorize(pd.Series(clusters), sort=True)
    n_clusters = int(codes.max()) + 1 if len(codes) else 0
    if n_clusters == 0:
        return np.full(n_boot, np.nan)
    num = np.bincount(codes, weights=np.asarray(numer, float), minlength=n_clusters)
    den = np.bincount(codes, weights=np.asarray(denom, float), minlength=n_clusters)
    out = np.empty(n_boot)
    chunk = max(1, max_draws // n_clusters)
    for start in range(0, n_boot, chunk):
        draws = rng.integers(0, n_clusters, size=(min(chunk, n_boot - start), n_clusters), dtype=np.int32)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[start:start + len(draws)] = num[draws].sum(axis=1) / den[draws].sum(axis=1)
    return out


def summarize_bootstrap(boot: np.ndarray, level: float = 0.95) -> dict:
    """± value (SD over resamples) and the percentile interval at ``level``."""
    boot = boot[np.isfinite(boot)]
    if len(boot) < 2:
        return {"sd": np.nan, "ci_low": np.nan, "ci_high": np.nan}
    lo, hi = np.percentile(boot, [50 * (1 - level), 100 - 50 * (1 - level)])
    return {"sd": float(boot.std(ddof=1)), "ci_low": float(lo), "ci_high": float(hi)}


def cluster_count_chunks(n_clusters: int, n_boot: int, rng: np.random.Generator,
                         max_draws: int = 4_000_000):
    """Cluster multiplicities of ``n_boot`` bootstrap resamples, yielded as int32 matrices
    (resamples × clusters) of at most ``max_draws`` entries.

    Each resample draws ``n_clusters`` clusters uniformly with replacement (``rng.integers``);
    one matrix serves every statistic of a stage, so statistics computed from the same rows are
    resampled jointly (candor.md "Reporting": patients resampled across findings and groups).
    """
    chunk = max(1, max_draws // max(n_clusters, 1))
    for start in range(0, n_boot, chunk):
        size = min(chunk, n_boot - start)
        draws = rng.integers(0, n_clusters, size=(size, n_clusters))
        flat = (draws + np.arange(size)[:, None] * n_clusters).ravel()
        yield np.bincount(flat, minlength=size * n_clusters).reshape(size, n_clusters).astype(np.int32)


class ResampledRatio:
    """Σ numer / Σ denom over units under cluster multiplicities (the clustered bootstrap of a
    rate when ``denom`` is 1 per unit). ``numer`` may hold several columns sharing the units."""

    def __init__(self, codes: np.ndarray, numer: np.ndarray, denom: np.ndarray | None = None):
        self.clusters, inv = np.unique(np.asarray(codes), return_inverse=True)
        numer = np.asarray(numer, float).reshape(len(inv), -1)
        denom = np.ones(len(inv)) if denom is None else np.asarray(denom, float)
        self.totals = np.stack([np.bincount(inv, weights=c, minlength=len(self.clusters))
                                for c in (*numer.T, denom)], 1)

    def sums(self, counts: np.ndarray) -> np.ndarray:
        """(resamples × (columns + 1)): the resampled Σ numer of each column, then Σ denom."""
        return counts[:, self.clusters].astype(np.float64) @ self.totals

    @staticmethod
    def ratio(sums: np.ndarray) -> np.ndarray:
        """Ratios from :meth:`sums` (summed over several units' sets to pool them)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return sums[:, :-1] / sums[:, -1:]

    def __call__(self, counts: np.ndarray) -> np.ndarray:
        """(resamples × columns) ratios for the multiplicities ``counts`` (resamples × clusters)."""
        return self.ratio(self.sums(counts))


class ResampledAUROC:
    """AUROC of ``scores`` for ``labels`` (1 positive, 0 negative) with every unit weighted by its
    cluster's multiplicity: Σ_{i pos, j neg} w_i w_j ([s_i > s_j] + ½[s_i = s_j]) / (Σ w_i Σ w_j).

    The negatives are sorted once; a resample then costs one cumulative sum over the negatives'
    weights and one gather at each positive's rank (ties counted half). Integer multiplicities
    keep every sum exact.
    """

    def __init__(self, scores: np.ndarray, labels: np.ndarray, codes: np.ndarray):
        scores, labels, codes = np.asarray(scores, float), np.asarray(labels), np.asarray(codes)
        pos = labels == 1
        order = np.argsort(scores[~pos], kind="stable")
        neg_scores = scores[~pos][order]
        self.neg_codes, self.pos_codes = codes[~pos][order], codes[pos]
        self.lo = np.searchsorted(neg_scores, scores[pos], "left")
        self.hi = np.searchsorted(neg_scores, scores[pos], "right")
        self.untied = bool((self.lo == self.hi).all())

    def __call__(self, counts: np.ndarray) -> np.ndarray:
        """One AUROC per row of ``counts`` (resamples × clusters); NaN when a class has no weight."""
        # int32 is exact while Σ multiplicity × cumulated weight stays below 2**31
        cum = np.zeros((len(counts), len(self.neg_codes) + 1), np.int32 if len(self.neg_codes) < 2**22 else np.int64)
        np.cumsum(counts[:, self.neg_codes], axis=1, out=cum[:, 1:])
        wp = counts[:, self.pos_codes]
        below = cum[:, self.lo]
        twice_u = 2 * (wp * below).sum(axis=1, dtype=np.int64) if self.untied else \
            (wp * (below + cum[:, self.hi])).sum(axis=1, dtype=np.int64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return twice_u / (2.0 * wp.sum(axis=1, dtype=np.int64) * cum[:, -1])


class LinearizedAUROC:
    """The AUROC's first-order expansion under cluster multiplicities m:
    AUC + Σ_c (m_c − 1) ψ_c with ψ_c = Σ_{pos i ∈ c} (V10_i − AUC)/n₊ + Σ_{neg j ∈ c} (V01_j − AUC)/n₋,
    V10 / V01 the placement values (DeLong et al. 1988; clustered: Obuchowski 1997). Its bootstrap
    SD is the clustered DeLong standard error; a resample costs one pass over the clusters instead
    of :class:`ResampledAUROC`'s pass over every unit with a cumulative sum."""

    def __init__(self, scores: np.ndarray, labels: np.ndarray, codes: np.ndarray):
        scores, labels, codes = np.asarray(scores, float), np.asarray(labels), np.asarray(codes)
        pos = labels == 1
        sp, sn = np.sort(scores[pos]), np.sort(scores[~pos])
        v10 = (np.searchsorted(sn, scores[pos], "left") + np.searchsorted(sn, scores[pos], "right")) / (2 * len(sn))
        v01 = (2 * len(sp) - np.searchsorted(sp, scores[~pos], "left")
               - np.searchsorted(sp, scores[~pos], "right")) / (2 * len(sp))
        self.auc = float(v10.mean()) if len(sn) and len(sp) else np.nan
        influence = np.empty(len(scores))
        influence[pos], influence[~pos] = (v10 - self.auc) / len(sp), (v01 - self.auc) / max(len(sn), 1)
        self.clusters, inv = np.unique(codes, return_inverse=True)
        self.psi = np.bincount(inv, weights=influence, minlength=len(self.clusters))

    def __call__(self, counts: np.ndarray) -> np.ndarray:
        """One linearised AUROC per row of ``counts`` (resamples × clusters)."""
        return self.auc + (counts[:, self.clusters].astype(np.float64) - 1) @ self.psi
