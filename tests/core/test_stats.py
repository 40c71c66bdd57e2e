"""The shared statistics (robustbench_fm/core/stats.py) against independent references: sklearn's
weighted AUROC on resamples drawn here, scipy's percentiles, a BH step-up written out, closed-form
Mantel-Haenszel cases."""
import statistics

import numpy as np
import pytest
from scipy import stats as sps
from sklearn.metrics import roc_auc_score

from robustbench_fm.core import stats


def reference_resamples(codes: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, units) multiplicities: each resample draws every cluster's slot uniformly with
    replacement from default_rng(seed), in one call (no chunks)."""
    n_clusters = int(codes.max()) + 1
    draws = np.random.default_rng(seed).integers(0, n_clusters, size=(n_boot, n_clusters))
    counts = np.stack([np.bincount(row, minlength=n_clusters) for row in draws])
    return counts[:, codes]


def test_cluster_codes_order_clusters_by_their_ids_as_strings():
    assert stats.cluster_codes(["p10", "p9", "p2", "p10"]).tolist() == [0, 2, 1, 0]
    assert stats.cluster_codes(np.array([10, 9, 2])).tolist() == [0, 2, 1]  # "10" < "2" < "9"


def test_count_chunks_do_not_depend_on_the_chunk_size():
    whole = np.concatenate(list(stats.cluster_count_chunks(37, 50, np.random.default_rng(4))))
    small = list(stats.cluster_count_chunks(37, 50, np.random.default_rng(4), max_draws=37 * 7))
    assert [len(c) for c in small] == [7] * 7 + [1]
    np.testing.assert_array_equal(np.concatenate(small), whole)
    np.testing.assert_array_equal(whole, reference_resamples(np.arange(37), 50, 4))
    assert (whole.sum(axis=1) == 37).all()


def test_bootstrap_aurocs_are_sklearns_weighted_aurocs_on_the_same_resamples():
    rng = np.random.default_rng(3)
    n = 240
    patients = np.array([f"p{i}" for i in rng.integers(0, 90, n)])  # uneven clusters, string ids
    labels = (rng.random(n) < 0.35).astype(int)
    scores = np.stack([np.round(rng.normal(size=n) + labels, 1), rng.integers(0, 6, n) / 2.0])  # ties
    boot = stats.bootstrap_aurocs(labels, scores, patients, 300, seed=11)
    assert boot.shape == (300, 2)
    weights = reference_resamples(stats.cluster_codes(patients), 300, 11)
    for b in range(0, 300, 7):
        for j in range(2):
            ref = roc_auc_score(labels, scores[j], sample_weight=weights[b])
            assert boot[b, j] == pytest.approx(ref, abs=1e-12)
    # paired: both columns come from the same resamples (a score against itself differs by 0)
    twice = stats.bootstrap_aurocs(labels, np.stack([scores[0], scores[0]]), patients, 50, seed=11)
    np.testing.assert_array_equal(twice[:, 0], twice[:, 1])
    np.testing.assert_array_equal(twice[:, 0], boot[:50, 0])


def test_bootstrap_auroc_of_a_resample_without_a_class_is_nan():
    # five patients, one holding every positive: a resample that misses it has one class
    labels = np.array([1, 1, 0, 0, 0, 0, 0, 0])
    scores = np.array([0.9, 0.2, 0.5, 0.1, 0.3, 0.4, 0.6, 0.7])
    patients = np.array(["a", "a", "b", "b", "c", "d", "e", "e"])
    boot = stats.bootstrap_aurocs(labels, scores, patients, 300, seed=0)[:, 0]
    weights = reference_resamples(stats.cluster_codes(patients), 300, 0)
    one_class = weights[:, labels == 1].sum(axis=1) == 0
    assert one_class.any() and (~one_class).any()
    assert np.isnan(boot[one_class]).all() and np.isfinite(boot[~one_class]).all()
    full = (weights == 1).all(axis=1)
    np.testing.assert_allclose(boot[full], roc_auc_score(labels, scores), rtol=0, atol=1e-15)


def test_no_interval_from_fewer_than_five_clusters():
    labels, scores, patients = np.array([1, 1, 0, 0]), np.array([0.9, 0.2, 0.5, 0.1]), np.array(["a", "b", "c", "d"])
    assert np.isnan(stats.bootstrap_aurocs(labels, scores, patients, 50, seed=0)).all()
    assert np.isnan(stats.cluster_bootstrap_ratio(np.ones(4), np.ones(4), patients, 50, np.random.default_rng(0))).all()
    out = stats.auroc_with_ci(labels, scores, patients, 50)
    assert out["auroc"] == 0.75 and np.isnan(out["auroc_ci_low"]) and np.isnan(out["auroc_ci_high"])


def test_auroc_with_ci_is_sklearns_auroc_and_the_percentile_interval():
    rng = np.random.default_rng(5)
    labels = (rng.random(400) < 0.3).astype(int)
    score = rng.normal(size=400) + 0.8 * labels
    patients = np.arange(400) // 2
    res = stats.auroc_with_ci(labels, score, patients, n_boot=500, seed=9)
    assert res["auroc"] == roc_auc_score(labels, score)
    weights = reference_resamples(stats.cluster_codes(patients), 500, 9)
    ref = [roc_auc_score(labels, score, sample_weight=w) for w in weights]
    lo, hi = sps.scoreatpercentile(ref, [2.5, 97.5])
    assert (res["auroc_ci_low"], res["auroc_ci_high"]) == pytest.approx((lo, hi), abs=1e-12)
    assert res["auroc_ci_low"] < res["auroc"] < res["auroc_ci_high"]
    no_boot = stats.auroc_with_ci(labels, score, patients, n_boot=0)
    assert no_boot["auroc"] == res["auroc"] and np.isnan([no_boot["auroc_ci_low"], no_boot["auroc_ci_high"]]).all()
    assert np.isnan(list(stats.auroc_with_ci(np.ones(5), np.arange(5.0), np.arange(5)).values())).all()


def test_percentile_interval_closed_form_and_scipy():
    values = np.arange(101.0)  # the p-th linear percentile of 0..100 is p
    assert stats.percentile_ci(values) == pytest.approx((2.5, 97.5), abs=1e-12)
    assert stats.percentile_ci(values, level=0.9) == pytest.approx((5.0, 95.0))
    rng = np.random.default_rng(2)
    draws = rng.normal(size=999)
    assert stats.percentile_ci(draws) == pytest.approx(tuple(sps.scoreatpercentile(draws, [2.5, 97.5])), abs=1e-15)
    with_nan = np.r_[draws, np.nan, np.inf, -np.inf]  # non-finite replicates are left out
    assert stats.percentile_ci(with_nan) == stats.percentile_ci(draws)
    assert np.isnan(stats.percentile_ci(np.array([1.0, np.nan]))).all()
    summary = stats.summarize_bootstrap(with_nan)
    assert summary["sd"] == pytest.approx(statistics.stdev(draws), rel=1e-12)
    assert (summary["ci_low"], summary["ci_high"]) == stats.percentile_ci(draws)
    assert np.isnan(list(stats.summarize_bootstrap(np.array([0.3])).values())).all()


def test_bootstrap_p_hand_cases():
    assert stats.bootstrap_p(np.arange(1.0, 10.0)) == pytest.approx(2 * 1 / 10)  # no d <= 0: 2(0+1)/(9+1)
    assert stats.bootstrap_p(np.array([-1.0, 0.0, 1.0, 2.0, 3.0])) == 1.0  # 2(2+1)/6 = 1
    assert stats.bootstrap_p(np.array([-3.0, 1, 2, 3, 4, 5, 6, np.nan])) == pytest.approx(2 * 2 / 8)
    assert np.isnan(stats.bootstrap_p(np.array([np.nan])))


def reference_bh(p: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """BH written out: adjusted p_(i) = min_{j >= i} p_(j) m / j (capped at 1); rejected: the k
    smallest p-values, k the largest i with p_(i) <= i alpha / m."""
    m = len(p)
    order = np.argsort(p)
    ranked = p[order] * m / np.arange(1, m + 1)
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(1.0, np.minimum.accumulate(ranked[::-1])[::-1])
    below = np.flatnonzero(p[order] <= np.arange(1, m + 1) * alpha / m)
    rejected = np.zeros(m, bool)
    if len(below):
        rejected[order[:below[-1] + 1]] = True
    return adjusted, rejected


def test_bh_closed_form_and_step_up_reference():
    # m = 4: sorted 0.001, 0.012, 0.03, 0.6 -> x4/1, x4/2, x4/3, x4/4 = 0.004, 0.024, 0.04, 0.6
    adjusted, rejected = stats.bh_adjust([0.03, 0.001, 0.6, 0.012])
    np.testing.assert_allclose(adjusted, [0.04, 0.004, 0.6, 0.024], rtol=1e-12)
    assert rejected.tolist() == [True, True, False, True]
    # step-up: 0.04 fails 0.05/2 at rank 1, yet both are rejected as 0.045 <= 2 · 0.05/2 at rank 2
    assert stats.bh_adjust([0.045, 0.04])[1].tolist() == [True, True]
    rng = np.random.default_rng(7)
    for alpha in (0.05, 0.2):
        p = np.r_[rng.uniform(size=40) ** 4, 0.5, 0.5]  # ties too
        adjusted, rejected = stats.bh_adjust(p, alpha)
        ref_adjusted, ref_rejected = reference_bh(p, alpha)
        np.testing.assert_allclose(adjusted, ref_adjusted, rtol=1e-12)
        np.testing.assert_array_equal(rejected, ref_rejected)
        assert 0 < rejected.sum() < len(p)
    empty = stats.bh_adjust([])
    assert len(empty[0]) == 0 and empty[1].dtype == bool


def test_mantel_haenszel_hand_computed_with_an_uninformative_stratum():
    # A: 2/4 vs 1/4, T = 8, weight 4·4/8 = 2; B: 3/6 vs 0/3, T = 9, weight 6·3/9 = 2; C has no unexposed
    res = stats.mantel_haenszel_rd(a1=[2, 3, 5], n1=[4, 6, 7], a0=[1, 0, 0], n0=[4, 3, 0])
    # RD = ((2·4 − 1·4)/8 + (3·3 − 0·6)/9) / (2 + 2) = (0.5 + 1) / 4
    assert res["rd"] == pytest.approx(0.375, abs=1e-15)
    # P_A = (16·1 − 16·2 + 16·0/2)/64 = −1/4, P_B = (36·0 − 9·3 + 18·(−3)/2)/81 = −2/3,
    # Q_A = (2·3 + 1·2)/16 = 1/2, Q_B = (3·3 + 0)/18 = 1/2: Var = (0.375·(−11/12) + 1)/4² = 21/512
    assert res["var"] == pytest.approx(21 / 512, abs=1e-15)
    assert res["se"] == pytest.approx(np.sqrt(21 / 512), abs=1e-15) and res["n_strata"] == 2
    none = stats.mantel_haenszel_rd([1], [3], [0], [0])
    assert np.isnan(none["rd"]) and none["n_strata"] == 0


@pytest.mark.parametrize("n_types", [3, 400])
def test_resampled_sums_have_the_moments_of_drawing_every_cluster(n_types):
    """Σ of n clusters drawn with replacement: mean n·mean(t), variance n·var(t) (population
    variance) per column, covariance likewise. Few distinct totals take the multinomial path,
    many take the drawn-cluster path; both give these moments, integer sums exactly."""
    rng = np.random.default_rng(21)
    n = 500
    first = rng.integers(0, n_types, size=n).astype(float)
    totals = np.c_[first, (first > n_types / 2) * 1.0, np.ones(n)]
    assert (4 * len(np.unique(totals, axis=0)) <= n) == (n_types == 3)  # the multinomial path, or the draws
    sums = stats.resampled_sums(totals, 20000, np.random.default_rng(22))
    assert sums.shape == (20000, 3) and np.array_equal(sums, np.round(sums))
    assert (sums[:, 2] == n).all()  # every resample draws exactly n clusters
    cov = np.cov(totals.T, bias=True) * n
    assert sums.mean(axis=0) == pytest.approx(n * totals.mean(axis=0), rel=0.01)
    np.testing.assert_allclose(np.cov(sums.T)[:2, :2], cov[:2, :2], rtol=0.05)


def test_cluster_bootstrap_ratio_and_resampled_ratio_share_the_cluster_totals():
    """The two clustered-ratio bootstraps sum the same per-cluster totals: with the multiplicities
    of every resample they agree exactly, whichever way the clusters were drawn."""
    rng = np.random.default_rng(23)
    codes = rng.integers(0, 40, 300)
    numer = rng.random(300)
    clusters, totals = stats.cluster_totals(codes, np.c_[numer, np.ones(300)])
    counts = next(stats.cluster_count_chunks(len(clusters), 50, np.random.default_rng(0)))
    via_counts = stats.ResampledRatio(codes, numer)(counts)[:, 0]
    weights = counts[:, np.searchsorted(clusters, codes)]
    np.testing.assert_allclose(via_counts, weights @ numer / weights.sum(axis=1), rtol=1e-12)
    np.testing.assert_allclose(counts @ totals[:, 0] / (counts @ totals[:, 1]), via_counts, rtol=1e-12)
    boot = stats.cluster_bootstrap_ratio(numer, np.ones(300), codes, 4000, np.random.default_rng(1))
    shared = np.concatenate([stats.ResampledRatio(codes, numer)(c)[:, 0]
                             for c in stats.cluster_count_chunks(len(clusters), 4000, np.random.default_rng(2))])
    assert boot.mean() == pytest.approx(shared.mean(), abs=0.002)
    assert boot.std() == pytest.approx(shared.std(), rel=0.05)


def test_spearman_equals_scipy_and_has_one_nan_policy():
    """One Spearman ρ for every table and figure: scipy's value on the complete pairs; pairs with a
    NaN on either side left out; NaN with fewer than 3 pairs or a constant side."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=12), rng.normal(size=12)
    assert stats.spearman(x, y) == pytest.approx(sps.spearmanr(x, y).statistic, abs=1e-15)
    x[[2, 5]], y[7] = np.nan, np.nan
    keep = ~(np.isnan(x) | np.isnan(y))
    assert stats.spearman(x, y) == pytest.approx(sps.spearmanr(x[keep], y[keep]).statistic, abs=1e-15)
    assert stats.spearman([1, 2, 3], [3, 1, 2]) == pytest.approx(-0.5)  # closed form: 1 - 6·6/(3·8)
    assert np.isnan(stats.spearman([1, 2], [2, 1]))  # fewer than 3 pairs
    assert np.isnan(stats.spearman([1, 2, np.nan], [1, 2, 3]))  # 2 complete pairs
    assert np.isnan(stats.spearman([1, 1, 1, 1], [1, 2, 3, 4]))  # constant side: no ranking
    with pytest.raises(ValueError, match="one length"):
        stats.spearman([1, 2, 3], [1, 2])


def per_unit_reference(scores, labels, weights) -> np.ndarray:
    """The weighted Mann-Whitney AUROC written out pair by pair (ties ½), one value per row of
    ``weights`` (resamples × units), as an exact fraction turned into a float at the end."""
    pos, neg = labels == 1, labels == 0
    wins = (scores[pos][:, None] > scores[neg][None, :]) * 2 + (scores[pos][:, None] == scores[neg][None, :])
    out = []
    for w in weights.astype(np.int64):
        twice_u = int(w[pos] @ wins @ w[neg])
        denominator = 2.0 * int(w[pos].sum()) * int(w[neg].sum())
        out.append(twice_u / denominator if denominator else np.nan)
    return np.array(out)


@pytest.mark.parametrize("case", ["ties", "untied", "one_cluster", "all_positive", "all_negative", "singletons"])
def test_resampled_auroc_segment_form_equals_the_per_unit_form_bit_for_bit(case, monkeypatch):
    """Issue 44: the segment form (sparse products over the negatives' rank segments, float64) gives
    the per-unit form's values bit for bit, and both the pairwise reference: ties, uneven clusters,
    one cluster, a class missing, every unit its own cluster; in slices of resamples
    (``SEGMENT_BYTES`` small) and on columns shared between estimators."""
    rng = np.random.default_rng(["ties", "untied", "one_cluster", "all_positive", "all_negative",
                                 "singletons"].index(case))
    n = 120
    codes = {"one_cluster": np.zeros(n, int), "singletons": np.arange(n)}.get(case, rng.integers(0, 40, n))
    labels = {"all_positive": np.ones(n), "all_negative": np.zeros(n)}.get(case, (rng.random(n) < 0.3) * 1.0)
    scores = rng.integers(0, 5, n) / 4.0 if case != "untied" else rng.normal(size=n)
    n_clusters = int(codes.max()) + 1
    counts = np.concatenate(list(stats.cluster_count_chunks(n_clusters, 70, np.random.default_rng(1))))
    counts = np.r_[counts, np.zeros((1, n_clusters), np.int32), np.full((1, n_clusters), 3, np.int32)]
    estimator = stats.ResampledAUROC(scores, labels, codes)
    assert case != "ties" or not estimator.untied
    per_unit = estimator._per_unit(counts)
    np.testing.assert_array_equal(per_unit, per_unit_reference(scores, labels, counts[:, codes]))
    assert estimator.segment_form(counts)
    np.testing.assert_array_equal(estimator(counts), per_unit)
    np.testing.assert_array_equal(estimator(counts, estimator.columns(counts)), per_unit)  # shared columns
    other = stats.ResampledAUROC(-scores, labels, codes)  # another estimator over the same clusters
    np.testing.assert_array_equal(other(counts, estimator.columns(counts)), other._per_unit(counts))
    monkeypatch.setattr(stats, "SEGMENT_BYTES", 0)  # slices of SEGMENT_ROWS resamples
    assert not estimator.segment_form(counts)
    np.testing.assert_array_equal(estimator(counts), per_unit)


def test_resampled_auroc_segment_form_hands_large_sums_to_the_per_unit_form(monkeypatch):
    """Weights so large that a float64 sum could round (total weight ≥ 2**26) are summed per unit, in
    integers, and those a float32 sum could round (≥ 2**23) in float64 segments: the values stay the
    exact ones."""
    scores, labels, codes = np.array([0.1, 0.4, 0.4, 0.9]), np.array([0, 1, 0, 1]), np.array([0, 1, 2, 3])
    counts = np.array([[2**25, 2**25 + 1, 3, 7], [1, 2, 3, 4]], np.int64)
    estimator = stats.ResampledAUROC(scores, labels, codes)
    used = []
    real = stats.ResampledAUROC._per_unit
    monkeypatch.setattr(stats.ResampledAUROC, "_per_unit", lambda self, c: (used.append(len(c)), real(self, c))[1])
    got = estimator(counts[:1])
    assert used == [1]
    w = counts[0].astype(object)  # exact integers
    twice_u = 2 * (w[1] * w[0] + w[3] * (w[0] + w[2])) + w[1] * w[2]
    assert got[0] == twice_u / (2.0 * (w[1] + w[3]) * (w[0] + w[2]))
    used.clear()
    np.testing.assert_array_equal(estimator(counts[1:]), real(estimator, counts[1:]))
    assert used == []
    # between 2**23 and 2**26 (float32 could round a sum, float64 cannot): the float64 segments, exact
    dtypes = []
    by_segments = stats.ResampledAUROC._by_segments
    monkeypatch.setattr(stats.ResampledAUROC, "_by_segments",
                        lambda self, x: (dtypes.append(x.dtype), by_segments(self, x))[1])
    mid = np.array([[2**22 + 1, 2**22 + 3, 2**22 + 5, 7]], np.int64)
    w = mid[0].astype(object)
    twice_u = 2 * (w[1] * w[0] + w[3] * (w[0] + w[2])) + w[1] * w[2]
    assert estimator(mid)[0] == twice_u / (2.0 * (w[1] + w[3]) * (w[0] + w[2]))
    assert dtypes == [np.float32, np.float64] and used == []
    assert estimator(mid * 0 + 3)[0] == real(estimator, mid * 0 + 3)[0] and dtypes[-1] == np.float32


def test_draw_chunks_counted_apart_are_the_count_chunks():
    """Issue 44 (speed5): the draws of :func:`stats.cluster_draw_chunks`, counted by :func:`stats.count_draws`
    (in another thread, chunk by chunk), are :func:`stats.cluster_count_chunks`' multiplicities exactly:
    the same generator calls in the same chunks; every resample draws as many clusters as there are."""
    for n_clusters, n_boot, max_draws in ((7, 50, 30), (300, 1000, 4_000), (1, 3, 10)):
        counted = list(stats.cluster_count_chunks(n_clusters, n_boot, np.random.default_rng(5), max_draws))
        drawn = list(stats.cluster_draw_chunks(n_clusters, n_boot, np.random.default_rng(5), max_draws))
        assert [len(c) for c in counted] == [len(d) for d in drawn] and sum(map(len, drawn)) == n_boot
        for counts, draws in zip(counted, drawn):
            mine = stats.count_draws(draws, n_clusters)
            assert mine.dtype == np.int32 and np.array_equal(mine, counts)
            assert (mine.sum(axis=1) == n_clusters).all()
            np.testing.assert_array_equal(mine[0], np.bincount(draws[0], minlength=n_clusters))
