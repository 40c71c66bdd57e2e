"""The statistics every stage shares: one home for each (candor.md "Reporting": patient-clustered
bootstrap with 1,000 resamples, 95% percentile intervals, BH FDR control at 0.05).

* resamples: :func:`cluster_codes` (the clusters' order), :func:`cluster_count_chunks` (the cluster
  multiplicities of every resample, drawn once and shared by every statistic of a stage);
* resampled sums: :func:`cluster_totals` (per-cluster totals) and :func:`resampled_sums` (their sums
  over cluster resamples; multinomial over the distinct totals when they are few);
* resampled statistics: :func:`cluster_bootstrap_ratio` and :class:`ResampledRatio` (a rate, from its
  own draws or from shared multiplicities), :class:`ResampledAUROC` (the AUROC, exact),
  :class:`LinearizedAUROC` (its placement-value expansion);
* the AUROC with its interval: :func:`bootstrap_aurocs` (several scores on shared resamples, so
  their differences are paired) and :func:`auroc_with_ci`;
* intervals and tests on the replicates: :func:`percentile_ci`, :func:`summarize_bootstrap`,
  :func:`bootstrap_p`;
* multiple testing: :func:`bh_adjust` (Benjamini-Hochberg);
* stratified risk difference: :func:`mantel_haenszel_rd` (Mantel-Haenszel with Sato's variance);
* rank agreement: :func:`spearman` (Spearman's ρ with one NaN policy for every table and figure);
* the floor under every interval: :data:`MIN_CLUSTERS` clusters (:func:`few_clusters`: the row's note);
* paired comparisons between encoders (issue 46): :func:`paired_bootstrap` (a metric of several
  encoders on the same items and the same cluster resamples: mean, ratio, median, AUROC, weighted
  strata), :func:`paired_difference`, :func:`holm_adjust` (Holm's step-down family-wise correction);
* a family of encoders compared at once (issue 58): :func:`max_t_family` (every pair's studentized
  difference, the single-step max-T bootstrap: simultaneous intervals and family-wise adjusted p-values
  that agree with each other) and :func:`rank_intervals` (each encoder's simultaneous rank interval).
"""
from __future__ import annotations

import zlib

import numpy as np
import pandas as pd

#: candor.md "Reporting": every family of p-values is corrected with BH FDR control at 0.05.
FDR_ALPHA = 0.05


def cluster_codes(clusters) -> np.ndarray:
    """Integer code of each unit's cluster, the clusters ordered by their ids read as strings (the
    column order of :func:`cluster_count_chunks`' multiplicities)."""
    return pd.factorize(pd.Series(np.asarray(clusters).astype(str)), sort=True)[0]


def cluster_totals(codes, values) -> tuple[np.ndarray, np.ndarray]:
    """(the sorted distinct cluster codes, their totals): the per-cluster sums of every column of
    ``values`` (units × columns, or one value per unit)."""
    clusters, inv = np.unique(np.asarray(codes), return_inverse=True)
    values = np.asarray(values, np.float64).reshape(len(inv), -1)
    return clusters, np.stack([np.bincount(inv, weights=c, minlength=len(clusters)) for c in values.T], 1)


#: cluster draws per chunk of :func:`resampled_sums`' multiplicities (counted in cache; 64 resamples at least)
RESAMPLE_CHUNK = 262_144
#: the most columns of totals :func:`resampled_sums` looks for repeated rows in (the multinomial path)
MULTINOMIAL_COLUMNS = 6


def resampled_sums(totals: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot × columns) sums of the rows of ``totals`` (clusters × columns: each cluster's totals)
    over ``n_boot`` cluster-bootstrap resamples, each drawing as many clusters as there are,
    uniformly with replacement.

    A resampled sum depends on the draws only through how many land on clusters of each distinct
    row of totals ("type"), and those numbers are multinomial: n_clusters draws over the types with
    probabilities (clusters of the type) / n_clusters. When there are few types (at most a quarter
    of the clusters, e.g. a discordance count, its D_all count and the number of queries of each
    patient; looked for in up to :data:`MULTINOMIAL_COLUMNS` columns) the sums are drawn that way
    (``rng.multinomial``: one draw per type and resample, the same distribution as drawing every
    cluster). Otherwise the clusters are drawn
    (``rng.integers``), counted per resample (``bincount``, chunks of about :data:`RESAMPLE_CHUNK`
    draws) and the multiplicities multiply the totals. Both sum in float64, exactly for integer
    totals."""
    totals = np.asarray(totals, np.float64)
    n_clusters, n_cols = totals.shape
    if n_clusters == 0 or n_boot == 0:
        return np.full((n_boot, n_cols), np.nan)
    if n_cols <= MULTINOMIAL_COLUMNS:  # wider totals rarely repeat: not worth sorting them into types
        types, sizes = np.unique(totals, axis=0, return_counts=True)
        if 4 * len(types) <= n_clusters:
            return rng.multinomial(n_clusters, sizes / n_clusters, size=n_boot).astype(np.float64) @ types
    out = np.empty((n_boot, n_cols))
    chunk = max(64, RESAMPLE_CHUNK // n_clusters)  # no skinny matrix products
    for start in range(0, n_boot, chunk):
        size = min(chunk, n_boot - start)
        draws = rng.integers(0, n_clusters, size=(size, n_clusters))
        flat = (draws + np.arange(size)[:, None] * n_clusters).ravel()
        counts = np.bincount(flat, minlength=size * n_clusters).reshape(size, n_clusters)
        out[start:start + size] = counts.astype(np.float64) @ totals
    return out


def cluster_bootstrap_ratio(numer: np.ndarray, denom: np.ndarray, clusters, n_boot: int,
                            rng: np.random.Generator) -> np.ndarray:
    """Bootstrap distribution of Σnumer / Σdenom resampling whole clusters with replacement.

    With ``denom`` = 1 per unit this is the clustered bootstrap of a mean (e.g. the discordance
    rate over queries, clustered by patient, candor.md "Reporting"); all NaN from fewer than
    :data:`MIN_CLUSTERS` clusters (see :func:`few_clusters`). Each resample draws as many
    clusters as there are, uniformly with replacement, and sums their per-cluster totals
    (:func:`cluster_totals`, :func:`resampled_sums`; clusters in sorted order). Returns ``n_boot``
    values (NaN without clusters).
    """
    codes, _ = pd.factorize(pd.Series(clusters), sort=True)
    if len(codes) == 0 or codes.max() + 1 < MIN_CLUSTERS:  # no interval from fewer than MIN_CLUSTERS clusters
        return np.full(n_boot, np.nan)
    _, totals = cluster_totals(codes, np.c_[np.asarray(numer, float), np.asarray(denom, float)])
    sums = resampled_sums(totals, n_boot, rng)
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums[:, 0] / sums[:, 1]


def percentile_ci(values, level: float = 0.95) -> tuple[float, float]:
    """The percentile interval at ``level`` of the finite replicates (numpy's linear percentiles
    50(1 − level) and 100 − 50(1 − level)); NaN when fewer than two are finite."""
    values = np.asarray(values, np.float64)
    values = values[np.isfinite(values)]
    if len(values) < 2:
        return np.nan, np.nan
    lo, hi = np.percentile(values, [50 * (1 - level), 100 - 50 * (1 - level)])
    return float(lo), float(hi)


def summarize_bootstrap(boot: np.ndarray, level: float = 0.95) -> dict:
    """± value (SD over the finite resamples, ddof 1) and the :func:`percentile_ci` at ``level``."""
    boot = np.asarray(boot, np.float64)
    boot = boot[np.isfinite(boot)]
    lo, hi = percentile_ci(boot, level)
    return {"sd": float(boot.std(ddof=1)) if len(boot) >= 2 else np.nan, "ci_low": lo, "ci_high": hi}


def bootstrap_p(diffs) -> float:
    """Two-sided bootstrap p-value of a paired difference being 0, from its finite replicates d:
    min(1, 2·(min(#(d ≤ 0), #(d ≥ 0)) + 1) / (B + 1)); NaN without replicates."""
    d = np.asarray(diffs, np.float64)
    d = d[np.isfinite(d)]
    if len(d) == 0:
        return np.nan
    return float(min(1.0, 2 * (min((d <= 0).sum(), (d >= 0).sum()) + 1) / (len(d) + 1)))


def cluster_count_chunks(n_clusters: int, n_boot: int, rng: np.random.Generator,
                         max_draws: int = 4_000_000):
    """Cluster multiplicities of ``n_boot`` bootstrap resamples, yielded as int32 matrices
    (resamples × clusters) of at most ``max_draws`` entries.

    Each resample draws ``n_clusters`` clusters uniformly with replacement (``rng.integers``);
    one matrix serves every statistic of a stage, so statistics computed from the same rows are
    resampled jointly (candor.md "Reporting": patients resampled across findings and groups).
    """
    for draws in cluster_draw_chunks(n_clusters, n_boot, rng, max_draws):
        yield count_draws(draws, n_clusters)


def cluster_draw_chunks(n_clusters: int, n_boot: int, rng: np.random.Generator, max_draws: int = 4_000_000):
    """The draws behind :func:`cluster_count_chunks`: (resamples × n_clusters) cluster codes drawn
    uniformly with replacement, in the same chunks from the same generator calls, for a caller that
    counts them (:func:`count_draws`) elsewhere, e.g. in another thread while the next chunk is drawn."""
    chunk = max(1, max_draws // max(n_clusters, 1))
    for start in range(0, n_boot, chunk):
        yield rng.integers(0, n_clusters, size=(min(chunk, n_boot - start), n_clusters))


def count_draws(draws: np.ndarray, n_clusters: int) -> np.ndarray:
    """Each resample's cluster multiplicities (int32, resamples × n_clusters) from its draws."""
    size = len(draws)
    flat = (draws + np.arange(size)[:, None] * n_clusters).ravel()
    return np.bincount(flat, minlength=size * n_clusters).reshape(size, n_clusters).astype(np.int32)


class ResampledRatio:
    """Σ numer / Σ denom over units under cluster multiplicities (the clustered bootstrap of a
    rate when ``denom`` is 1 per unit). ``numer`` may hold several columns sharing the units. The
    same per-cluster totals (:func:`cluster_totals`) as :func:`cluster_bootstrap_ratio`, for
    statistics that share one matrix of multiplicities (:func:`cluster_count_chunks`) with others."""

    def __init__(self, codes: np.ndarray, numer: np.ndarray, denom: np.ndarray | None = None):
        numer = np.asarray(numer, float).reshape(len(np.asarray(codes)), -1)
        denom = np.ones(len(numer)) if denom is None else np.asarray(denom, float)
        self.clusters, self.totals = cluster_totals(codes, np.c_[numer, denom])

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


#: bytes, counted at 8 a value, of the (clusters × resamples) multiplicities :class:`ResampledAUROC`'s segment form
#: works on at once (in cache); more resamples are taken that many at a time (at least :data:`SEGMENT_ROWS`)
SEGMENT_BYTES = 5 << 19
SEGMENT_ROWS = 8


class ResampledAUROC:
    """AUROC of ``scores`` for ``labels`` (1 positive, 0 negative) with every unit weighted by its
    cluster's multiplicity: Σ_{i pos, j neg} w_i w_j ([s_i > s_j] + ½[s_i = s_j]) / (Σ w_i Σ w_j).

    The negatives are sorted once; positive i meets the negatives ranked below ``lo_i`` (smaller
    scores) and, counted half, those ranked in ``[lo_i, hi_i)`` (ties), so
    2U = Σ_i w_i (C(lo_i) + C(hi_i)), C(r) the summed weight of the negatives ranked below r.
    Two ways to a resample, the same integers:

    * per unit: one cumulative sum over the negatives' weights and one gather at each positive's
      rank (ties counted half);
    * segments (the resamples taken as many at a time as their clusters' multiplicities, clusters ×
      resamples, fit in :data:`SEGMENT_BYTES`): the negatives' ranks are cut at every
      ``lo_i`` and ``hi_i``; a sparse
      product gives each segment's negative weight for every resample at once, their cumulative sum
      C at each cut, and a second sparse product each cut's positive weight (the positives with
      ``lo_i`` or ``hi_i`` there), so 2U = Σ_cuts (positive weight) × C: work per negative and per
      positive rather than per resample and unit, on the clusters' columns (:meth:`columns`) that
      estimators over the same clusters share.

    Integer multiplicities keep every sum exact (int32/int64 per unit; segments in float32 while the
    total weight stays below 2**23, else float64 below 2**26, the per-unit form taking over beyond), so
    every way gives the same bits.
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
        self.clusters = np.unique(codes)
        self._segments = None  # (negatives per segment, positives per cut), built once used

    def segment_rows(self) -> int:
        """Resamples the segment form takes at a time: as many as fit :data:`SEGMENT_BYTES`."""
        return max(SEGMENT_ROWS, SEGMENT_BYTES // (8 * max(len(self.clusters), 1)))

    def segment_form(self, counts: np.ndarray) -> bool:
        """Whether all of ``counts`` (resamples × clusters) is taken at once in the segment form,
        so that its :meth:`columns` can be shared."""
        return 0 < len(counts) <= self.segment_rows() and len(self.clusters) > 0

    def columns(self, counts: np.ndarray, dtype=np.float32) -> np.ndarray:
        """The multiplicities of this estimator's clusters, (clusters × resamples) float32 (float64 for
        the sums that float32 cannot hold, :meth:`_by_segments`): the same for every estimator over the
        same clusters (pass them to ``__call__`` to share them)."""
        return np.ascontiguousarray(counts[:, self.clusters].T, dtype=dtype)

    def _build_segments(self):
        from scipy import sparse

        n_neg, n_clusters = len(self.neg_codes), len(self.clusters)
        cuts = np.unique(np.r_[self.lo, self.hi, n_neg])  # segment s: negatives ranked in [cuts[s-1], cuts[s])
        neg = sparse.csr_array((np.ones(n_neg, np.float32), (np.searchsorted(cuts, np.arange(n_neg), "right"),
                                                             np.searchsorted(self.clusters, self.neg_codes))),
                               shape=(len(cuts), n_clusters))
        pos_cluster = np.searchsorted(self.clusters, self.pos_codes)
        at = np.r_[np.searchsorted(cuts, self.lo), np.searchsorted(cuts, self.hi)]
        pos = sparse.csr_array((np.ones(len(at), np.float32), (at, np.r_[pos_cluster, pos_cluster])),
                               shape=(len(cuts), n_clusters))
        self._segments = neg, pos  # float32 ones: the products keep the columns' dtype
        return self._segments

    def __call__(self, counts: np.ndarray, columns: np.ndarray | None = None) -> np.ndarray:
        """One AUROC per row of ``counts`` (resamples × clusters); NaN when a class has no weight.
        ``columns``: :meth:`columns` of these counts, when already taken (:meth:`segment_form`)."""
        if len(self.clusters) and len(counts):
            rows = self.segment_rows()
            if columns is not None and len(counts) <= rows:
                return self._exact(counts, columns)
            return np.concatenate([self._exact(counts[r0:r0 + rows], self.columns(counts[r0:r0 + rows]))
                                   for r0 in range(0, len(counts), rows)])
        return self._per_unit(counts)

    def _exact(self, counts: np.ndarray, x: np.ndarray) -> np.ndarray:
        """The segment form on the columns ``x`` of ``counts``, in float64 where float32 could round
        and per unit where float64 could (:meth:`_by_segments`)."""
        out = self._by_segments(x)
        if out is None and x.dtype == np.float32:
            out = self._by_segments(self.columns(counts, np.float64))
        return self._per_unit(counts) if out is None else out

    def _by_segments(self, x: np.ndarray) -> np.ndarray | None:
        """The segment form on the columns ``x`` (clusters × resamples, float32 or float64); None where
        a sum could leave the exact integers of ``x``'s dtype. The segments' and cuts' sums are taken in
        ``x``'s dtype (float32: half the bytes of float64), exact while the total weight stays below
        2**23 (float32 holds every integer below 2**24); the cumulative sum (torch's: it releases the
        GIL, so estimators run in parallel threads) and 2U in float64, exact below 2**51."""
        import torch

        neg, pos = self._segments or self._build_segments()
        if x.dtype != neg.dtype:
            neg, pos = neg.astype(x.dtype), pos.astype(x.dtype)
        # (cuts × resamples): negative weight ranked below each cut
        below = torch.cumsum(torch.from_numpy(neg @ x), 0, dtype=torch.float64).numpy()
        at_cuts = (pos @ x).astype(np.float64)  # each positive counted at lo_i and at hi_i
        w_pos, w_neg = at_cuts.sum(axis=0) / 2, below[-1]
        if (w_pos + w_neg).max() >= (2**23 if x.dtype == np.float32 else 2**26):  # 2U ≤ (w_pos + w_neg)² / 2
            return None
        twice_u = np.einsum("ij,ij->j", at_cuts, below)
        with np.errstate(invalid="ignore", divide="ignore"):
            return twice_u / (2.0 * w_pos * w_neg)

    def _per_unit(self, counts: np.ndarray) -> np.ndarray:
        """The per-unit form: a cumulative sum over the negatives' weights, gathered at the positives."""
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


def bootstrap_aurocs(labels, scores, clusters, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, m) AUROCs of the m rows of ``scores`` for binary ``labels`` (1 positive) on the same
    clustered resamples (candor.md "Reporting": 1,000 resamples clustered by patient).

    A resample draws as many clusters as there are, uniformly with replacement, from
    ``np.random.default_rng(seed)`` (:func:`cluster_count_chunks`; clusters in :func:`cluster_codes`
    order); a unit then counts as many times as its cluster was drawn and the AUROC is the weighted
    Mann-Whitney statistic, ties counted ½ (:class:`ResampledAUROC`). The scores share the
    resamples, so differences between them are paired. A resample without positives or negatives
    gives NaN; so does every resample from fewer than :data:`MIN_CLUSTERS` clusters."""
    scores = np.atleast_2d(np.asarray(scores, np.float64))
    out = np.full((n_boot, len(scores)), np.nan)
    codes = cluster_codes(clusters)
    if n_boot == 0 or not len(codes) or codes.max() + 1 < MIN_CLUSTERS:  # no interval from too few clusters
        return out
    aurocs = [ResampledAUROC(score, labels, codes) for score in scores]
    start = 0
    for counts in cluster_count_chunks(int(codes.max()) + 1 if len(codes) else 0, n_boot,
                                       np.random.default_rng(seed)):
        for j, auroc in enumerate(aurocs):
            out[start:start + len(counts), j] = auroc(counts)
        start += len(counts)
    return out


def auroc_with_ci(labels, score, clusters, n_boot: int = 1000, seed: int = 42, level: float = 0.95) -> dict:
    """``auroc`` of ``score`` for binary ``labels`` (sklearn's ``roc_auc_score``) with the percentile
    interval (``auroc_ci_low``, ``auroc_ci_high``) of its clustered bootstrap (:func:`bootstrap_aurocs`;
    NaN with ``n_boot`` = 0). All NaN when a class is missing."""
    from sklearn.metrics import roc_auc_score

    labels = np.asarray(labels)
    if len(np.unique(labels)) < 2:
        return dict(auroc=np.nan, auroc_ci_low=np.nan, auroc_ci_high=np.nan)
    lo, hi = percentile_ci(bootstrap_aurocs(labels, score, clusters, n_boot, seed)[:, 0], level) if n_boot \
        else (np.nan, np.nan)
    return dict(auroc=float(roc_auc_score(labels, score)), auroc_ci_low=lo, auroc_ci_high=hi)


def bh_adjust(p_values, alpha: float = FDR_ALPHA) -> tuple[np.ndarray, np.ndarray]:
    """Benjamini-Hochberg adjusted p-values (step-up: p_(i) m / i made monotone from the largest,
    capped at 1; ``scipy.stats.false_discovery_control``) and the rejections at FDR level ``alpha``
    (adjusted p ≤ alpha)."""
    from scipy import stats

    p = np.asarray(p_values, float)
    if len(p) == 0:
        return p, np.zeros(0, bool)
    adjusted = stats.false_discovery_control(p, method="bh")
    return adjusted, adjusted <= alpha


def mantel_haenszel_rd(a1, n1, a0, n0) -> dict:
    """Mantel-Haenszel risk difference over strata with Sato's variance (candor.md "Discordance and
    Head Errors": the miss rates of discordant and other positives, stratified by encoder × finding).

    Stratum i has n1_i exposed units with a1_i events and n0_i unexposed units with a0_i events,
    T_i = n1_i + n0_i. Then
      RD_MH = Σ (a1_i n0_i − a0_i n1_i)/T_i  /  Σ n1_i n0_i / T_i.
    Its variance is Sato's estimator (T. Sato, "On the variance estimator for the Mantel-Haenszel
    risk difference", Biometrics 45:1323-1324, 1989), the Greenland-Robins (1985) estimator
    corrected to be consistent both for many sparse strata and for few large ones (Rothman,
    Greenland & Lash, Modern Epidemiology, 3rd ed., ch. 15):
      Var = (RD_MH Σ P_i + Σ Q_i) / (Σ n1_i n0_i / T_i)²,
      P_i = (n1_i² a0_i − n0_i² a1_i + n1_i n0_i (n0_i − n1_i)/2) / T_i²,
      Q_i = (a1_i (n0_i − a0_i) + a0_i (n1_i − a1_i)) / (2 T_i).
    Strata missing either group carry no information and are dropped. Returns ``rd``, ``var``,
    ``se`` and ``n_strata`` (the informative strata)."""
    a1, n1, a0, n0 = (np.asarray(v, np.float64) for v in (a1, n1, a0, n0))
    keep = (n1 > 0) & (n0 > 0)
    a1, n1, a0, n0 = a1[keep], n1[keep], a0[keep], n0[keep]
    t = n1 + n0
    weight = (n1 * n0 / t).sum()
    if weight == 0:
        return dict(rd=np.nan, var=np.nan, se=np.nan, n_strata=0)
    rd = ((a1 * n0 - a0 * n1) / t).sum() / weight
    p = (n1 ** 2 * a0 - n0 ** 2 * a1 + n1 * n0 * (n0 - n1) / 2) / t ** 2
    q = (a1 * (n0 - a0) + a0 * (n1 - a1)) / (2 * t)
    var = (rd * p.sum() + q.sum()) / weight ** 2
    return dict(rd=float(rd), var=float(var), se=float(np.sqrt(max(var, 0.0))), n_strata=int(keep.sum()))


def spearman(x, y) -> float:
    """Spearman's ρ of two equally long sequences (``scipy.stats.spearmanr``), with one NaN policy:
    pairs where either value is NaN are left out, and the result is NaN when fewer than 3 distinct
    (x, y) points remain (two points always give ±1) or either side is constant (no ranking to
    correlate). Used by the CRoMa tables
    (Tables 7-9, 11) and the CANDOR figures."""
    from scipy.stats import spearmanr

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"spearman: expected two 1-D sequences of one length, got shapes {x.shape} and {y.shape}")
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y = x[keep], y[keep]
    if len(set(zip(x.tolist(), y.tolist()))) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(spearmanr(x, y).statistic)


# --- the floor under every interval, and paired comparisons between encoders (issue 46) -------------------------

#: the fewest clusters (patients, slides, volumes) an interval or a p-value is given from: with fewer, a cluster
#: bootstrap has too few distinct resamples to mean anything (one cluster gives an interval of width 0)
MIN_CLUSTERS = 5


def few_clusters(n_clusters: int, column: str | None = None) -> str:
    """'' when ``n_clusters`` ≥ :data:`MIN_CLUSTERS`; else the one line a row carries instead of an
    interval, naming the cluster column and the fix."""
    if n_clusters >= MIN_CLUSTERS:
        return ""
    name = f"'{column}'" if column else "the cluster column"
    return (f"no interval or p-value: {n_clusters} distinct value{'s' if n_clusters != 1 else ''} of {name} "
            f"(at least {MIN_CLUSTERS} clusters are needed); give {name} the real patients, or leave it out so "
            f"that each image is its own cluster")


def holm_adjust(p_values) -> np.ndarray:
    """Holm's step-down adjusted p-values (Holm 1979) of one family: sorted ascending,
    p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) p_(j)), m the number of finite p-values (NaN stays NaN).
    Rejecting p̃ ≤ α controls the family-wise error rate at α under any dependence."""
    p = np.asarray(p_values, np.float64)
    out = np.full(p.shape, np.nan)
    finite = np.flatnonzero(np.isfinite(p))
    if not len(finite):
        return out
    order = finite[np.argsort(p[finite], kind="stable")]
    m = len(order)
    out[order] = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    return out


#: what a paired metric summarises over its items: a mean of values, a ratio of sums, a median, an AUROC
PAIRED_KINDS = ("mean", "ratio", "median", "auroc")


class _Strata:
    """One encoder's items of one comparison unit, split into strata (e.g. matched groups pooled with
    fixed weights); a resample's statistic is Σ_s w_s x_s / Σ_s w_s over the strata whose x_s is finite
    (one stratum: x itself)."""

    def __init__(self, kind: str, codes, values, other, strata, weights, bank=None, halves=None,
                 n_clusters: int = 0):
        self.kind, self.weights = kind, weights
        self.parts, self.bank = [], []
        for s in range(len(weights)):
            at = strata == s
            v = values[at]
            o = None if other is None else other[at]
            keep = np.isfinite(v) if kind != "ratio" else np.isfinite(v) & np.isfinite(o)
            if kind == "auroc":
                keep &= np.isin(o, (0, 1))
            self.bank.append(None if bank is None else
                             _bank_part(kind, codes[at], v, o, keep, bank[0][at], bank[1][at], halves[at], n_clusters))
            c, v = codes[at][keep], v[keep]
            o = None if o is None else o[keep]
            if kind in ("mean", "ratio"):
                self.parts.append(ResampledRatio(c, v, o))
            elif kind == "auroc":
                self.parts.append(ResampledAUROC(v, o, c) if 0 < (o == 1).sum() < len(o) else None)
            else:
                order = np.argsort(v, kind="stable")
                self.parts.append((v[order], c[order]))

    def __call__(self, counts: np.ndarray) -> np.ndarray:
        """(resamples,) values of the statistic under the cluster multiplicities ``counts``."""
        x = np.stack([self._one(part, counts) for part in self.parts], 1)
        w = np.where(np.isfinite(x), self.weights, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(w.sum(1) > 0, (np.nan_to_num(x) * w).sum(1) / w.sum(1), np.nan)

    def _one(self, part, counts: np.ndarray) -> np.ndarray:
        if part is None:
            return np.full(len(counts), np.nan)
        if self.kind in ("mean", "ratio"):
            return part(counts)[:, 0]
        if self.kind == "auroc":
            return part(counts)
        values, codes = part
        if not len(values):
            return np.full(len(counts), np.nan)
        cum = np.cumsum(counts[:, codes], axis=1, dtype=np.int64)
        n = cum[:, -1:]
        # the median of the items repeated by their multiplicities: the mean of the (n − 1)//2-th and n//2-th
        lo = (cum <= (n - 1) // 2).sum(axis=1)
        hi = (cum <= n // 2).sum(axis=1)
        out = (values[np.minimum(lo, len(values) - 1)] + values[np.minimum(hi, len(values) - 1)]) / 2
        return np.where(n[:, 0] > 0, out, np.nan)


def smoothed_density(values):
    """The Gaussian kernel density of the finite ``values`` as a function (Silverman's rule-of-thumb
    bandwidth, 0.9 min(SD, IQR / 1.349) n^(−1/5)); one that returns 0 where they have no spread. It
    smooths a step (an indicator, a median) so that a small shift of a value has an expected effect
    (:mod:`robustbench_fm.methods.candor.influence`)."""
    values = np.asarray(values, np.float64)
    values = values[np.isfinite(values)]
    if len(values) < 2:
        return lambda x: np.zeros(np.shape(x))
    iqr = np.subtract(*np.percentile(values, [75, 25]))
    sd = values.std(ddof=1)
    h = 0.9 * (min(sd, iqr / 1.349) if iqr > 0 else sd) * len(values) ** -0.2
    if not h > 0:
        return lambda x: np.zeros(np.shape(x))
    return lambda x: np.exp(-0.5 * (np.asarray(x, np.float64) / h) ** 2) / (h * np.sqrt(2 * np.pi))


def cluster_halves(ids) -> np.ndarray:
    """A fixed split of clusters into two halves (0 / 1 per entry of ``ids``, from the CRC-32 of the
    id's text): the same for every encoder and run, so that a cluster's influence on the items of
    one half times its influence on the other estimates its squared influence without its noise
    (:func:`paired_bootstrap` ``bank``)."""
    return np.array([zlib.crc32(str(i).encode()) & 1 for i in np.asarray(ids, object)], np.int8)


def _bank_part(kind, codes, values, other, keep, share0, share1, halves, n_clusters):
    """One stratum's cluster vectors for the bank term of :func:`paired_bootstrap`: the influences on
    each half's items (n_clusters,) in the statistic's units divided by √(f(1 − f)) (f: the half-0
    share of the items' weight), the whole influence, and each cluster's influence through its own
    items (the query role: (S_p − θ N_p) / N for ``mean`` / ``ratio``; 0 for a ``median``)."""
    if kind not in ("mean", "ratio", "median"):
        return None
    weight = (np.ones(len(values)) if kind != "ratio" else np.nan_to_num(other)) * keep
    total = weight.sum()
    if total <= 0:
        return None
    f = weight[halves == 0].sum() / total
    split = np.sqrt(f * (1 - f))
    if not split > 0:
        return None
    scale = total if kind in ("mean", "ratio") else 1.0
    l0 = np.bincount(codes, weights=np.nan_to_num(share0), minlength=n_clusters) / scale
    l1 = np.bincount(codes, weights=np.nan_to_num(share1), minlength=n_clusters) / scale
    query = np.zeros(n_clusters)
    if kind in ("mean", "ratio"):
        numer = np.where(keep, np.nan_to_num(values), 0.0)
        query = np.bincount(codes, weights=numer - numer.sum() / total * weight, minlength=n_clusters) / total
    return l0 / split, l1 / split, l0 + l1, query


def _bank_covariance(stats: list, n_encoders: int) -> np.ndarray:
    """The covariance (E × E) the banks' roles add to the encoders' statistics (:func:`paired_bootstrap`
    ``bank``): Σ_p h_p^a h_p^b estimated without the noise of a cluster's own squared influence, as the
    product of its influences on the two halves, plus both cross terms with the query role; projected
    onto the positive semi-definite matrices (negative eigenvalues set to 0)."""
    rows = []
    for st in stats:
        w = np.asarray(st.weights, float)
        live = [i for i, b in enumerate(st.bank) if b is not None and w[i] > 0]
        if not live:
            return np.zeros((n_encoders, n_encoders))
        norm = w[live].sum()
        rows.append([sum(w[i] / norm * st.bank[i][j] for i in live) for j in range(4)])
    a0, a1, full, query = (np.stack([r[j] for r in rows]) for j in range(4))
    cov = 0.5 * (a0 @ a1.T + a1 @ a0.T) + query @ full.T + full @ query.T
    vals, vecs = np.linalg.eigh((cov + cov.T) / 2)
    return (vecs * np.clip(vals, 0, None)) @ vecs.T


def paired_bootstrap(kind: str, values, clusters, n_boot: int = 1000, seed: int = 42, other=None, strata=None,
                     weights=None, bank=None) -> tuple[np.ndarray, np.ndarray]:
    """Estimates and paired bootstrap replicates of one metric for several encoders scored on the
    same items (issue 46: "a paired bootstrap that resamples the same clusters for both encoders in
    every resample").

    ``values``: (encoders × items), what ``kind`` summarises: ``mean`` the values' mean, ``ratio``
    Σ values / Σ ``other`` (e.g. RI = Σ n_SO / Σ n_typed), ``median`` their median, ``auroc`` the
    AUROC of the values as scores for the 0/1 labels ``other`` (ties ½). ``other`` is one row shared
    by all encoders or one row per encoder. A NaN value leaves that item out for that encoder only,
    as the stage's own summary does. ``strata`` (one code per item) with ``weights`` (one per
    stratum, fixed) makes the statistic the weighted mean of the strata's (a pooled margin AUROC: the
    groups' AUROCs weighted by their queries); without them all items are one stratum.

    ``bank``: (share₀, share₁), each encoders × items: every item's share of its cluster's influence
    on the statistic through the *other* items' values, on the items of clusters of half 0 / half 1
    (:func:`cluster_halves`; a patient's images as bank members of the other queries:
    :mod:`robustbench_fm.methods.candor.influence`; ``mean`` / ``ratio``: in the numerator's units,
    ``median``: the statistic's). Resampling the items leaves that role out; each resample then adds
    a Gaussian draw (seeded) whose covariance over the encoders is that role's
    (:func:`_bank_covariance`): the delta method's two-role variance of a two-sample U-statistic, with
    the product of a cluster's influences on the two halves (an unbiased estimate of its squared
    influence, where the square of the whole would add the noise of its own flips) and the cross
    term with the query role. Items with a NaN value but a share (a bank member that is no query)
    still put their cluster into the resampling.

    A resample draws as many clusters as there are, uniformly with replacement
    (:func:`cluster_count_chunks` from ``np.random.default_rng(seed)``; clusters in
    :func:`cluster_codes` order), and every encoder is evaluated on the same multiplicities, so the
    difference of two encoders' replicates is their paired bootstrap. The estimate is the statistic
    with every cluster counted once. Returns (estimates (encoders,), replicates (n_boot × encoders))."""
    if kind not in PAIRED_KINDS:
        raise ValueError(f"paired_bootstrap: kind '{kind}' is not one of {', '.join(PAIRED_KINDS)}")
    values = np.atleast_2d(np.asarray(values, np.float64))
    codes = cluster_codes(clusters)
    n_items = values.shape[1]
    if other is not None:
        other = np.asarray(other, np.float64)
        other = np.broadcast_to(other, values.shape) if other.ndim == 1 else other
    strata = np.zeros(n_items, np.int64) if strata is None else pd.factorize(np.asarray(strata), sort=True)[0]
    weights = np.ones(int(strata.max()) + 1 if n_items else 1) if weights is None else np.asarray(weights, float)
    n_clusters = int(codes.max()) + 1 if n_items else 0
    halves = None
    if bank is not None:
        bank = [np.broadcast_to(np.asarray(b, np.float64), values.shape) for b in bank]
        halves = cluster_halves(np.asarray(clusters, object))
    stats = [_Strata(kind, codes, v, None if other is None else other[e], strata, weights,
                     None if bank is None else (bank[0][e], bank[1][e]), halves, n_clusters)
             for e, v in enumerate(values)]
    ones = np.ones((1, n_clusters), np.int32)
    estimates = np.array([s(ones)[0] for s in stats]) if n_clusters else np.full(len(stats), np.nan)
    reps = np.full((n_boot, len(stats)), np.nan)
    start = 0
    if n_clusters:
        for counts in cluster_count_chunks(n_clusters, n_boot, np.random.default_rng(seed),
                                           max_draws=max(1_000_000, 64 * n_clusters)):
            for e, s in enumerate(stats):
                reps[start:start + len(counts), e] = s(counts)
            start += len(counts)
        if bank is not None and n_boot:
            vals, vecs = np.linalg.eigh(_bank_covariance(stats, len(stats)))
            rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0])
            reps += (rng.standard_normal((n_boot, len(stats))) * np.sqrt(np.clip(vals, 0, None))) @ vecs.T
    return estimates, reps


def paired_difference(estimates: np.ndarray, reps: np.ndarray, a: int, b: int, n_clusters: int,
                      level: float = 0.95) -> dict:
    """Encoder ``a`` minus encoder ``b`` from :func:`paired_bootstrap`'s output: ``difference``, the
    percentile interval of the paired replicates (``ci_low``, ``ci_high``) and the two-sided
    :func:`bootstrap_p`; interval and p are NaN from fewer than :data:`MIN_CLUSTERS` clusters."""
    diff = reps[:, a] - reps[:, b]
    if n_clusters < MIN_CLUSTERS or not len(diff):
        lo = hi = p = np.nan
    else:
        (lo, hi), p = percentile_ci(diff, level), bootstrap_p(diff)
    return dict(difference=float(estimates[a] - estimates[b]), ci_low=lo, ci_high=hi, p=p)


# --- a family of encoders compared at once: max-T simultaneous intervals and rank intervals (issue 58) ------------

#: the family-wise error rate of a family of pairwise comparisons (docs/comparisons.md)
FAMILY_ALPHA = 0.05


def max_t_critical(t_max: np.ndarray, alpha: float = FAMILY_ALPHA) -> float:
    """The critical value of the max-T test from the bootstrap maxima ``t_max`` (finite ones): the
    ⌊α(B + 1)⌋-th largest, so that |t| > c exactly when the adjusted p of :func:`max_t_family`,
    (1 + #(T* ≥ |t|)) / (B + 1), is at most ``alpha``. NaN without enough replicates (α(B + 1) < 1)."""
    t = np.sort(np.asarray(t_max, np.float64)[np.isfinite(t_max)])
    k = int(np.floor(alpha * (len(t) + 1) + 1e-9))  # #(T* >= |t|) may be at most k - 1
    if k < 1 or k > len(t):
        return np.nan
    return float(t[len(t) - k])


def max_t_family(estimates, reps, n_clusters: int, alpha: float = FAMILY_ALPHA, level: float = 0.95) -> dict:
    """Every pair (a, b), a < b, of the E encoders of one family from :func:`paired_bootstrap`'s
    output (``estimates`` (E,), ``reps`` (B × E) on shared cluster resamples): the single-step
    studentized max-T procedure of Romano & Wolf (2005, "Exact and approximate stepdown methods for
    multiple hypothesis testing", JASA 100: the single-step form) on the paired bootstrap, as Mogstad,
    Romano, Shaikh & Wilhelm (2024, "Inference for ranks", Review of Economic Studies 91) build
    simultaneous intervals for all pairwise differences.

    With d̂_ab = θ̂_a − θ̂_b, its replicates d*_ab and their SD s_ab, each resample's statistic is
    T*_b = max_ab |d*_ab − d̂_ab| / s_ab over the pairs with s_ab > 0, and c is the critical value of
    those maxima (:func:`max_t_critical`). Per pair: ``difference`` d̂_ab, ``se`` s_ab, the simultaneous
    interval ``sim_low``/``sim_high`` = d̂_ab ∓ c s_ab (all pairs' intervals hold together with
    probability ``level`` = 1 − α), the adjusted p ``p_adj`` = (1 + #(T* ≥ |d̂_ab| / s_ab)) / (B + 1)
    (p_adj ≤ α exactly when the simultaneous interval excludes 0, so decisions and intervals never
    disagree; its resolution 1/(B + 1) does not shrink with the number of pairs, unlike Holm's on
    bootstrap p-values, whose smallest value is E(E − 1)/2 · 2/(B + 1)), and the unadjusted
    percentile interval ``ci_low``/``ci_high`` and two-sided bootstrap p ``p`` (:func:`bootstrap_p`)
    of that pair alone. A pair with s_ab = 0 has p_adj 1 when d̂_ab = 0 and is left out of the
    maximum. Everything but ``difference`` is NaN from fewer than :data:`MIN_CLUSTERS` clusters.
    Returns arrays over the pairs in ``itertools.combinations`` order, with ``pairs`` (a, b) and
    ``critical`` c."""
    estimates = np.asarray(estimates, np.float64)
    reps = np.asarray(reps, np.float64).reshape(-1, len(estimates))
    n_enc = len(estimates)
    a_idx, b_idx = np.triu_indices(n_enc, 1)
    n_pairs = len(a_idx)
    diff = estimates[a_idx] - estimates[b_idx]
    out = {"pairs": list(zip(a_idx.tolist(), b_idx.tolist())), "difference": diff, "critical": np.nan}
    nan = np.full(n_pairs, np.nan)
    for key in ("se", "ci_low", "ci_high", "p", "sim_low", "sim_high", "p_adj"):
        out[key] = nan.copy()
    if n_clusters < MIN_CLUSTERS or not len(reps) or not n_pairs:
        return out
    d_star = reps[:, a_idx] - reps[:, b_idx]  # B × pairs
    for j, (a, b) in enumerate(zip(a_idx, b_idx)):  # each pair alone: its percentile interval and p
        alone = paired_difference(estimates, reps, a, b, n_clusters, level)
        out["ci_low"][j], out["ci_high"][j], out["p"][j] = alone["ci_low"], alone["ci_high"], alone["p"]
    finite = np.isfinite(d_star)
    n_fin = finite.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n_fin > 0, np.where(finite, d_star, 0).sum(0) / np.maximum(n_fin, 1), np.nan)
        var = np.where(finite, (d_star - mean) ** 2, 0).sum(0) / np.maximum(n_fin - 1, 1)
    se = np.where(n_fin >= 2, np.sqrt(var), np.nan)
    se = np.where(np.isfinite(diff), se, np.nan)
    out["se"] = se
    live = np.isfinite(se) & (se > 0)
    if live.any():
        t_star = np.abs(d_star[:, live] - diff[live]) / se[live]
        t_star = np.where(np.isfinite(t_star), t_star, -np.inf)
        t_max = t_star.max(1)
        t_max = t_max[np.isfinite(t_max)]
        crit = max_t_critical(t_max, alpha)
        out["critical"] = crit
        t_obs = np.abs(diff[live]) / se[live]
        # (1 + #(T* >= t)) / (B + 1), by a sorted search of the maxima
        ordered = np.sort(t_max)
        exceed = len(ordered) - np.searchsorted(ordered, t_obs, side="left")
        out["p_adj"][live] = np.minimum(1.0, (1 + exceed) / (len(ordered) + 1))
        out["sim_low"][live] = diff[live] - crit * se[live]
        out["sim_high"][live] = diff[live] + crit * se[live]
    flat = np.isfinite(se) & (se == 0) & (diff == 0)
    out["p_adj"][flat], out["sim_low"][flat], out["sim_high"][flat] = 1.0, 0.0, 0.0
    return out


def rank_intervals(n_encoders: int, pairs, better) -> tuple[np.ndarray, np.ndarray]:
    """Each encoder's simultaneous rank interval (1 = best) from the decisions of one family of
    simultaneous pairwise tests (Mogstad et al. 2024, "Inference for ranks", §3: the rank of encoder i
    is at least 1 + #(encoders significantly better than i) and at most E − #(encoders significantly
    worse than i); with the pairwise intervals of :func:`max_t_family`, which hold together with
    probability 1 − α, all encoders' rank intervals hold together with at least that probability).
    ``pairs``: (a, b) index pairs; ``better``: per pair, the index of the significantly better encoder
    or −1. Returns (rank_low, rank_high)."""
    beaten = np.zeros(n_encoders, np.int64)  # encoders significantly better than i
    beats = np.zeros(n_encoders, np.int64)   # encoders significantly worse than i
    for (a, b), w in zip(pairs, better):
        if w < 0:
            continue
        loser = b if w == a else a
        beats[w] += 1
        beaten[loser] += 1
    return 1 + beaten, n_encoders - beats
