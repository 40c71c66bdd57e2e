"""CANDOR core stage: brute-force agreement, chance levels fixed by theory, closed forms."""
import numpy as np
import pandas as pd
import pytest

import robustbench_fm
from robustbench_fm.core import stats
from robustbench_fm.methods.candor import bootstrap
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
    # no finding at all (a dataset=pool lists none of its own): one line naming the setting, not a KeyError
    with pytest.raises(ValueError, match=r"^candor: no finding to score \(stage.findings is empty.*"
                                         r"stage.findings=\[pneumothorax\]$"):
        robustbench_fm.evaluate("candor", feats, man, finding=[])
    with pytest.raises(ValueError, match=r"^candor: no finding to score"):  # at plan time, before any image is read
        candor.check_manifest(man, [])


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


def test_queries_are_the_positives_of_a_sample_of_all_images_of_the_group():
    """candor.md "Implementation": "The queries are the positives in a random sample of at most 4,000
    images of each matched group". The sample is drawn from every image of the group, labelled for
    the finding or not, once for all findings: finding ``a`` is labelled on 290 of 1,000 images
    (its positives are ``b``'s), ``b`` on all of them. Drawing from a's labelled images alone (the
    old rule) gives a ~70 queries (200 of its 290 labelled images) and b ~20."""
    rng = np.random.default_rng(12)
    n = 1000
    b = (rng.random(n) < 0.1).astype(float)
    a = np.where((b == 1) | (np.arange(n) >= n - 190), b, np.nan)  # unlabelled for a: NaN
    man = make_manifest(b).assign(a=a, b=b)
    feats = rng.normal(size=(n, 8))
    res = robustbench_fm.evaluate("candor", feats, man, finding=["a", "b"], k=3, bank_size=50, max_group_sample=200,
                                  n_boot=0)
    per = res.per_sample
    queries = {f: set(per.loc[per["finding"] == f, "sample_id"]) for f in ("a", "b")}
    assert queries["a"] == queries["b"]  # one sample per group, drawn before any label is read
    sample = man["sample_id"].to_numpy()[candor.draw_sample(np.arange(n), 200, candor.group_rng(42, "g"))]
    assert queries["a"] == set(sample[b[np.isin(man["sample_id"], sample)] == 1])
    # hypergeometric: 200 of 1,000 images, ~100 positives -> 20 ± 3.8 queries; the old rule: ~69
    assert 5 <= len(queries["a"]) <= 40
    pooled = res.summary.set_index(["finding", "acq_group"])
    assert pooled.loc[("a", candor.POOLED), "n_queries"] == len(queries["a"])
    assert pooled.loc[("a", candor.POOLED), "n_pos"] == b.sum()  # the banks still use all positives


def test_default_margin_auroc_interval_is_the_percentile_of_reranked_resamples():
    """candor.md "Reporting": "An interval is the 95% interval of the same resamples". The default
    interval is the percentile interval of the AUROC re-ranked in each resample of the group's
    patients (not the linear approximation): an independent brute force (margin scores by plain
    loops, sklearn's weighted AUROC for every resample's patient multiplicities) gives the same
    numbers. Another matched group (its patients outside the row) changes nothing: the row resamples
    only the patients of the images it scores."""
    from sklearn.metrics import roc_auc_score

    assert candor.PARAMS().auroc_bootstrap == "exact"
    rng = np.random.default_rng(13)
    n = 120
    labels = (rng.random(n) < 0.35).astype(float)
    feats = rng.normal(size=(n, 6)) + 0.7 * labels[:, None]
    man = make_manifest(labels, patients=[f"p{i // 3:03d}" for i in range(n)])
    other = make_manifest((rng.random(400) < 0.5).astype(float), ["h"] * 400, [f"q{i:03d}" for i in range(400)])
    other["sample_id"] = "o" + other["sample_id"]
    both = pd.concat([man, other], ignore_index=True)
    feats_both = np.vstack([feats, rng.normal(size=(400, 6))])
    k, n_boot = 3, 300
    res = robustbench_fm.evaluate("candor", feats_both, both, finding="finding", k=k, bank_size=30, n_boot=n_boot)
    row = res.summary.set_index("acq_group").loc["g"]
    # brute force: margin of every labelled image of g against the group's banks, self excluded
    x = feats / np.linalg.norm(feats, axis=1, keepdims=True)
    pos, neg = np.flatnonzero(labels == 1), np.flatnonzero(labels == 0)
    _, bank_pos, bank_neg = candor.draw_group(np.arange(n), pos, neg, 30, 4000, candor.group_rng(42, "g"))

    def c(i, bank):
        return np.mean(sorted((x[i] @ x[j] for j in bank if j != i), reverse=True)[:k])

    images = np.r_[pos, neg]
    margin = np.array([c(i, bank_pos) - c(i, bank_neg) for i in images])
    y = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    assert row["margin_auroc"] == pytest.approx(roc_auc_score(y, margin), abs=1e-9)
    codes = stats.cluster_codes(man["patient_id"].to_numpy()[images])
    patients = np.arange(codes.max() + 1)  # the stage's global codes of g's patients are the first ones
    counts = np.concatenate(list(stats.cluster_count_chunks(
        len(patients), n_boot, bootstrap.patient_set_rng(42, patients), max_draws=max(bootstrap.BOOT_CHUNK,
                                                                                          64 * len(patients)))))
    reps = [roc_auc_score(y, margin, sample_weight=w[codes]) if w[codes][y == 1].sum() and w[codes][y == 0].sum()
            else np.nan for w in counts]
    lo, hi = stats.percentile_ci(reps)
    assert row["margin_auroc_ci_low"] == pytest.approx(lo, abs=1e-9)
    assert row["margin_auroc_ci_high"] == pytest.approx(hi, abs=1e-9)
    assert row["margin_auroc_sd"] == pytest.approx(np.nanstd(reps, ddof=1), abs=1e-9)
    linear = robustbench_fm.evaluate("candor", feats_both, both, finding="finding", k=k, bank_size=30,
                                     n_boot=n_boot, auroc_bootstrap="linear").summary.set_index("acq_group").loc["g"]
    assert linear["margin_auroc_ci_low"] != pytest.approx(lo, abs=1e-6)  # the approximation is an option


def test_a_group_row_of_three_query_patients_gets_no_interval_but_a_note():
    """The bootstrap draws as many patients as the group's queries have, from those patients only, not
    every patient of the manifest: here 3 query patients (2,003 in the manifest), fewer than
    core.stats.MIN_CLUSTERS = 5, so the row gets no ± and no interval (a bootstrap of 3 patients has 10
    distinct resamples) and a note naming the cluster column; the other group keeps its interval."""
    e = np.eye(4)
    pos = np.array([e[0], e[0] + 0.1 * e[1], e[2] + 0.01 * e[3]])  # two close positives, one beside a negative
    neg = np.array([e[2], e[2] + 0.02 * e[1], e[3], e[3] + 0.01 * e[1]])
    rng = np.random.default_rng(14)
    big = rng.normal(size=(2000, 4))
    feats = np.vstack([pos, neg, big])
    labels = np.r_[np.ones(3), np.zeros(4), (rng.random(2000) < 0.5)]
    groups = ["g"] * 7 + ["h"] * 2000
    man = make_manifest(labels, groups)
    res = robustbench_fm.evaluate("candor", feats, man, finding="finding", k=1, bank_size=3, n_boot=400)
    row = res.summary.set_index("acq_group").loc["g"]
    assert row["n_queries"] == 3 and row["d"] == pytest.approx(1 / 3)
    assert np.isnan(row["d_sd"]) and np.isnan(row["d_ci_low"]) and np.isnan(row["d_all_ci_high"])
    assert np.isfinite(row["margin_auroc_ci_low"])  # the margin scores all 7 images of the group: 7 patients
    assert row["note"].startswith("no interval or p-value: 3 distinct values of 'patient_id'")
    other = res.summary.set_index("acq_group").loc["h"]
    assert other["note"] == "" and other["d_ci_low"] < other["d"] < other["d_ci_high"]


def _label_free_aurocs(n_pos, n_neg, k, reps, d=32):
    """Margin AUROC and its recorded chance bound of ``reps`` label-free cohorts (Gaussian features,
    one matched group, banks holding every image)."""
    n = n_pos + n_neg
    man = pd.DataFrame({"sample_id": [f"s{i}" for i in range(n)], "patient_id": [f"p{i}" for i in range(n)],
                        "acq_group": "g", "f": np.r_[np.ones(n_pos), np.zeros(n_neg)]})
    rows = [candor.run(np.random.default_rng(r).normal(size=(n, d)).astype(np.float32), man, "f", k=k,
                       n_boot=0).summary.iloc[0] for r in range(reps)]
    return np.array([r["margin_auroc"] for r in rows]), {r["margin_chance_low"] for r in rows}


@pytest.mark.parametrize("k, bound", [(5, 0.0), (1, 0.5 - 1 / 12 - 1 / 12)])
def test_margin_auroc_chance_bound_holds_under_label_free_features(k, bound):
    """Issue 42 item 8: with 12 positives and 12 negatives every image sits in its own bank and meets
    n - 1 of its class, so label-free features score below 0.5 (simulated 0.421 +- 0.011 at k = 5,
    0.457 at k = 1, 200 cohorts each); the recorded bound 1/2 - k/n+ - k/n- (stage.margin_chance_low)
    lies below the mean and 0.5 above it."""
    auroc, recorded = _label_free_aurocs(12, 12, k, 200)
    assert len(recorded) == 1 and recorded.pop() == pytest.approx(bound)
    mean, se = auroc.mean(), auroc.std() / np.sqrt(len(auroc))
    assert bound <= mean - 2 * se and mean + 2 * se < 0.5, (mean, se)


def test_margin_chance_low_by_hand():
    """The bound of a 45 vs 255 group with banks of 45 (every positive in R+, 45 of 255 negatives in
    R-): 1/2 - (5/45)(45/45 + 45/255) = 1/2 - 5/45 - 5/255; small groups clip at 0; the pooled row is
    the query-weighted mean of its groups'."""
    assert candor.margin_chance_low(5, 45, 45, 45, 45, 255) == pytest.approx(0.5 - 5 / 45 - 5 / 255)
    assert candor.margin_chance_low(5, 12, 12, 12, 12, 12) == 0.0
    assert candor.margin_chance_low(5, 4000, 4000, 4000, 4000, 9000) == pytest.approx(0.5 - 5 / 4000 - 5 / 9000)
    n = 300
    man = pd.DataFrame({"sample_id": [f"s{i}" for i in range(n)], "patient_id": [f"p{i}" for i in range(n)],
                        "acq_group": np.where(np.arange(n) < 150, "a", "b"),
                        "f": np.r_[np.ones(45), np.zeros(105), np.ones(30), np.zeros(120)]})
    rows = candor.run(np.random.default_rng(0).normal(size=(n, 16)), man, "f", k=5, n_boot=0).summary
    rows = rows.set_index("acq_group")
    want = {"a": 0.5 - 5 / 45 - 5 / 105, "b": 0.5 - 5 / 30 - 5 / 120}
    for g, v in want.items():
        assert rows.loc[g, "margin_chance_low"] == pytest.approx(v)
    w = rows.loc[["a", "b"], "n_queries"].to_numpy(float)
    assert rows.loc[candor.POOLED, "margin_chance_low"] == pytest.approx(w @ list(want.values()) / w.sum())
    excluded = candor.run(np.random.default_rng(0).normal(size=(n, 16)), man, "f", k=5, n_boot=0,
                          exclude_patient=True).summary
    assert excluded["margin_chance_low"].isna().all()


def test_neighbour_paths_give_identical_results(monkeypatch):
    """Issue 44 item 4: the shared pass (matrix held; or, with ``MATRIX_BYTES`` 0, the tile pass) and
    the exact searches give the same summary, per-sample rows and items, bit for bit, on a shape
    that sends questions down every branch: a 3% finding (its banks of 9 too sparse for the
    shortlist: read off the matrix), a 50% finding (first hits), D_all on all negatives. Features
    with exactly four ones scaled by 1/2 make every similarity a multiple of 1/4, so the float
    additions are exact in any order."""
    from robustbench_fm.methods.candor import shortlist

    rng = np.random.default_rng(21)
    n = 600
    feats = np.zeros((n, 12), np.float32)
    for row in feats:
        row[rng.choice(12, 4, replace=False)] = 0.5
    man = make_manifest(rng.random(n) < 0.5, np.where(np.arange(n) < 300, "a", "b"))
    man["rare"] = 0.0
    for group in ("a", "b"):
        man.loc[rng.choice(np.flatnonzero(man["acq_group"] == group), 9, replace=False), "rare"] = 1.0
    params = dict(finding=["finding", "rare"], k=4, bank_size=100, max_group_sample=200, n_boot=20)
    runs = {path: robustbench_fm.evaluate("candor", feats, man, neighbour_path=path, **params)
            for path in ("auto", "shortlist", "exact")}
    monkeypatch.setattr(shortlist, "MATRIX_BYTES", 0)
    runs["tiles"] = robustbench_fm.evaluate("candor", feats, man, neighbour_path="shortlist", **params)
    for path, res in runs.items():
        pd.testing.assert_frame_equal(res.summary, runs["exact"].summary, check_exact=True, obj=path)
        pd.testing.assert_frame_equal(res.per_sample, runs["exact"].per_sample, check_exact=True, obj=path)
        pd.testing.assert_frame_equal(res.items, runs["exact"].items, check_exact=True, obj=path)
    assert (runs["exact"].per_sample["finding"] == "rare").sum() >= 2
    with pytest.raises(ValueError, match="neighbour_path='fast' is not one of auto, shortlist, exact"):
        robustbench_fm.evaluate("candor", feats, man, neighbour_path="fast", **params)


def test_auto_path_follows_the_shape():
    """``group_path("auto")``: 12 findings at 2–30% over 8,000 images (the chest shape) share the
    pass (4.6× fewer similarities than the exact searches); one finding over 50,000 images goes
    exact (5× fewer); the shortlist is as wide as its widest first scan (at most ``shortlist``)."""
    def job(n, prevalence, bank=4000, sample=4000):
        pos, neg = np.arange(int(n * prevalence)), np.arange(int(n * prevalence), n)
        size = min(bank, len(pos), len(neg))
        return (0, pos, neg, pos, neg, None, pos[:int(sample * prevalence)], pos[:size], neg[:size])

    chest = [job(8000, p) for p in np.linspace(0.02, 0.30, 12)]
    assert candor.group_path("auto", 8000, chest) == "shortlist"
    assert candor.group_path("auto", 50000, [job(50000, 0.5)]) == "exact"
    assert candor.group_path("exact", 8000, chest) == "exact"
    # widest first scan within 256: the 9.6% finding's banks of 770, ⌈4 · 5 · 8000 / 770⌉ = 208
    assert candor.shortlist_size(256, 5, 8000, chest) == 208
    assert candor.shortlist_size(256, 5, 8000, [job(8000, 0.5)]) == 40


def test_groups_scored_side_by_side_equal_groups_scored_in_turn(monkeypatch):
    """Issue 44 (speed5): on the CPU with several torch threads the matched groups are scored side by side,
    a thread each (as many at a time as there are threads and as the matrices' memory allows, the rest in
    turn), each group's rows resampling
    their AUROC beside the others; every table equals the one-group-after-another run bit for bit, and the
    run whose AUROC resamples are all taken by the bootstrap afterwards."""
    import threading

    import torch

    rng = np.random.default_rng(29)
    n = 5 * 240
    groups = np.repeat(["a", "b", "c", "d", "e"], 240)
    man = make_manifest(rng.random(n) < 0.25, groups, [f"p{i // 2:05d}" for i in range(n)])
    man["other"] = (rng.random(n) < 0.4) * 1.0
    feats = rng.normal(size=(n, 12)) + man[["finding"]].to_numpy() * 0.4
    params = dict(k=3, bank_size=60, max_group_sample=150, n_boot=40)
    findings = ["finding", "other"]
    seen = []
    real = candor._score_group
    monkeypatch.setattr(candor, "_score_group",
                        lambda *a: (seen.append((threading.current_thread().name, torch.get_num_threads())),
                                    real(*a))[1])
    torch.set_num_threads(1)  # the module's fixture restores the threads
    in_turn = candor.run(feats, man, findings, **params)
    assert {name for name, _ in seen} == {threading.current_thread().name}
    seen.clear()
    torch.set_num_threads(2)
    side_by_side = candor.run(feats, man, findings, **params)
    names = [name for name, _ in seen]
    assert sum(name.startswith("candor_group") for name in names) == 8  # 4 groups × 2 findings in the pool
    assert names[-2:] == [threading.current_thread().name] * 2 and seen[-1][1] == 2  # the 5th: all threads
    assert all(threads == 1 for name, threads in seen if name.startswith("candor_group"))
    monkeypatch.setattr(candor, "group_aurocs", lambda *a: None)  # every AUROC resample in the bootstrap
    afterwards = candor.run(feats, man, findings, **params)
    for other in (side_by_side, afterwards):
        for table in ("summary", "per_sample", "items"):
            assert getattr(other, table).equals(getattr(in_turn, table)), table
    assert in_turn.summary["margin_auroc_sd"].notna().sum() >= 10  # group and pooled rows carry intervals
    seen.clear()
    monkeypatch.setattr(candor, "SIDE_BY_SIDE_BYTES", 1)  # no room for two groups' matrices: one at a time
    capped = candor.run(feats, man, findings, **params)
    assert {name for name, _ in seen} == {threading.current_thread().name} and all(t == 2 for _, t in seen)
    assert capped.items.equals(in_turn.items)
