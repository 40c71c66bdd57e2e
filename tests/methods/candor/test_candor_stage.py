"""CANDOR core stage: brute-force agreement, chance levels fixed by theory, closed forms."""
import numpy as np
import pandas as pd
import pytest

import robustbench_fm
from robustbench_fm.core import stats
from robustbench_fm.methods.candor import stage as candor


def make_manifest(labels, groups=None, patients=None):
    n = len(labels)
    return pd.DataFrame({
        "sample_id": [f"s{i:05d}" for i in range(n)],
        "patient_id": patients if patients is not None else [f"p{i:05d}" for i in range(n)],
        "acq_group": groups if groups is not None else ["g"] * n,
        "finding": np.asarray(labels, float),
    })


def brute_force_dm(feats, manifest, k, bank_size, max_group_sample, seed):
    """Independent reference: float64 numpy, full similarity matrices, explicit loops."""
    x = feats.astype(np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    labels = manifest["finding"].to_numpy()
    out = {}
    for group in sorted(manifest["acq_group"].unique()):
        g = manifest["acq_group"].to_numpy() == group
        pos, neg = np.flatnonzero(g & (labels == 1)), np.flatnonzero(g & (labels == 0))
        queries, bank_pos, bank_neg = candor.draw_group(np.flatnonzero(g), pos, neg, bank_size, max_group_sample,
                                                        candor.group_rng(seed, group))
        for q in queries:
            cp = [x[q] @ x[j] for j in bank_pos if j != q]
            cn = [x[q] @ x[j] for j in bank_neg if j != q]
            out[manifest["sample_id"][q]] = np.mean(sorted(cn)[-k:]) - np.mean(sorted(cp)[-k:])
    return out


def test_brute_force_reference_agrees_on_every_query():
    rng = np.random.default_rng(0)
    labels = rng.random(700) < 0.3
    groups = np.where(rng.random(700) < 0.5, "site_a|PA", "site_b|AP")
    feats = rng.normal(size=(700, 16)) + 0.6 * labels[:, None] * rng.normal(size=16)
    man = make_manifest(labels, groups)
    res = robustbench_fm.evaluate("candor", feats, man, finding="finding", k=5, bank_size=120,
                                  max_group_sample=250, n_boot=50)
    ref = brute_force_dm(feats, man, k=5, bank_size=120, max_group_sample=250, seed=42)
    per = res.per_sample.set_index("sample_id")
    assert set(per.index) == set(ref)
    np.testing.assert_allclose(per.loc[list(ref), "dm"].to_numpy(), list(ref.values()), atol=2e-6)
    assert (per["discordant"] == (per["dm"] > 0)).all()


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_label_independent_features_sit_at_chance(seed):
    """Lemma 1: on features independent of the label D = 1/2 (within 4 standard errors)."""
    rng = np.random.default_rng(seed)
    n = 3000
    feats = rng.normal(size=(n, 32))
    labels = rng.permutation(np.r_[np.ones(n // 3), np.zeros(n - n // 3)])
    res = robustbench_fm.evaluate("candor", feats, make_manifest(labels), finding="finding",
                                  bank_size=1000, n_boot=200, seed=seed)
    pooled = res.summary.set_index("acq_group").loc[candor.POOLED]
    se = np.sqrt(0.25 / pooled["n_queries"])
    assert abs(pooled["d"] - 0.5) < 4 * se
    assert abs(pooled["margin_auroc"] - 0.5) < 0.05
    assert pooled["d_sd"] == pytest.approx(se, rel=0.3)


def test_d_all_exceeds_chance_and_grows_with_odds():
    """'Unequal candidate sets': D_all > 1/2 under H0, increasing with n−/n+."""
    rng = np.random.default_rng(7)
    d_all = []
    for n_neg in (600, 2400, 9600):
        n_pos = 300
        feats = rng.normal(size=(n_pos + n_neg, 32))
        labels = np.r_[np.ones(n_pos), np.zeros(n_neg)]
        res = robustbench_fm.evaluate("candor", feats, make_manifest(labels), finding="finding",
                                      bank_size=4000, max_group_sample=20000, n_boot=10)
        pooled = res.summary.iloc[-1]
        assert abs(pooled["d"] - 0.5) < 4 * np.sqrt(0.25 / n_pos)
        d_all.append(pooled["d_all"])
    assert d_all[0] > 0.5 + 4 * np.sqrt(0.25 / 300)
    assert d_all[0] < d_all[1] < d_all[2]


def test_separated_classes_give_zero_discordance_and_perfect_auroc():
    rng = np.random.default_rng(1)
    centre = np.zeros(8)
    centre[0] = 1
    pos = centre + 0.05 * rng.normal(size=(50, 8))
    neg = -centre + 0.05 * rng.normal(size=(80, 8))
    feats = np.vstack([pos, neg])
    res = robustbench_fm.evaluate("candor", feats, make_manifest(np.r_[np.ones(50), np.zeros(80)]),
                                  finding="finding", n_boot=100)
    pooled = res.summary.iloc[-1]
    assert pooled["d"] == 0 and pooled["d_all"] == 0 and pooled["margin_auroc"] == 1.0
    assert pooled["d_ci_low"] == pooled["d_ci_high"] == 0
    # queries are all positives; each meets n−1 = 49 positives and 50 of the 80 negatives
    assert pooled["n_queries"] == 50 and res.summary.iloc[0]["bank_size"] == 50


def test_pooled_rate_weights_groups_by_queries_and_short_groups_are_reported():
    rng = np.random.default_rng(3)
    feats = rng.normal(size=(1000, 8))
    labels = np.r_[np.ones(300), np.zeros(600), np.ones(3), np.zeros(97)]
    groups = ["big"] * 900 + ["tiny"] * 100
    res = robustbench_fm.evaluate("candor", feats, make_manifest(labels, groups), finding="finding",
                                  n_boot=20)
    s = res.summary.set_index("acq_group")
    assert "fewer than k+1" in s.loc["tiny", "reason"] and np.isnan(s.loc["tiny", "d"])
    assert s.loc[candor.POOLED, "d"] == s.loc["big", "d"]
    assert s.loc[candor.POOLED, "n_queries"] == 300
    assert list(res.summary.columns[:2]) == ["finding", "acq_group"]
    for col in ["acq_group", "n_queries", "bank_size", "d", "d_sd", "d_ci_low", "d_ci_high",
                "d_all", "margin_auroc"]:
        assert col in res.summary.columns


def test_clustered_bootstrap_matches_binomial_theory():
    """200 patients × 10 images with one shared outcome: SD = sqrt(p(1-p)/200), not /2000."""
    rng = np.random.default_rng(5)
    outcome = np.repeat(rng.random(200) < 0.5, 10).astype(float)
    patients = np.repeat(np.arange(200), 10)
    clustered = stats.cluster_bootstrap_ratio(outcome, np.ones(2000), patients, 2000, rng)
    naive = stats.cluster_bootstrap_ratio(outcome, np.ones(2000), np.arange(2000), 2000, rng)
    p = outcome.mean()
    assert clustered.std() == pytest.approx(np.sqrt(p * (1 - p) / 200), rel=0.1)
    assert naive.std() == pytest.approx(np.sqrt(p * (1 - p) / 2000), rel=0.1)
    ci = stats.summarize_bootstrap(clustered)
    assert ci["ci_low"] < p < ci["ci_high"]


def test_seed_determinism_and_feature_validation():
    rng = np.random.default_rng(9)
    feats = rng.normal(size=(300, 8))
    man = make_manifest(rng.random(300) < 0.4)
    a = robustbench_fm.evaluate("candor", feats, man, finding="finding", n_boot=50)
    b = robustbench_fm.evaluate("candor", feats, man, finding="finding", n_boot=50)
    pd.testing.assert_frame_equal(a.summary, b.summary)
    pd.testing.assert_frame_equal(a.per_sample, b.per_sample)
    bad = feats.copy()
    bad[4] = np.nan
    with pytest.raises(ValueError, match="row 4 holds NaN"):
        robustbench_fm.evaluate("candor", bad, man, finding="finding")
    with pytest.raises(ValueError, match="no column 'pneumothorax'"):
        robustbench_fm.evaluate("candor", feats, man, finding="pneumothorax")


def test_findings_scored_together_equal_findings_scored_alone():
    """One shared shortlist per group gives exactly the per-finding results (tiny shortlist:
    most answers come from the exact fallback; large: from the shortlist)."""
    rng = np.random.default_rng(11)
    n = 600
    feats = rng.normal(size=(n, 12))
    man = make_manifest(rng.random(n) < 0.3, np.where(rng.random(n) < 0.5, "a", "b"))
    man["other"] = np.where(rng.random(n) < 0.1, np.nan, (rng.random(n) < 0.05) * 1.0)
    params = dict(k=3, bank_size=100, max_group_sample=300, n_boot=30)
    alone = [robustbench_fm.evaluate("candor", feats, man, finding=f, **params) for f in ("finding", "other")]
    for size in (2, 256):
        both = robustbench_fm.evaluate("candor", feats, man, finding=["finding", "other"], shortlist=size,
                                       **params)
        pd.testing.assert_frame_equal(both.summary, pd.concat([a.summary for a in alone], ignore_index=True),
                                      check_exact=False, atol=1e-9)
        pd.testing.assert_frame_equal(both.per_sample, pd.concat([a.per_sample for a in alone], ignore_index=True),
                                      check_exact=False, atol=1e-6)
