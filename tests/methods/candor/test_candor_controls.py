"""CANDOR chance levels (Lemma 1, "Unequal Candidate Sets"), the controls that should move D to
or away from chance, and the patient-clustered bootstrap of D, D_all and the margin AUROC."""
import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr
from sklearn.metrics import roc_auc_score

import robustbench_fm
from robustbench_fm.core import stats
from robustbench_fm.methods.candor import stage as candor

PREVALENCES = (0.1, 0.2, 0.3, 0.4, 0.5)
K, BANK = 5, 100



def null_cohort(seed, n_groups=4, group_size=1500, dim=8):
    """Features independent of 5 findings of different prevalence, several matched groups."""
    rng = np.random.default_rng(seed)
    n = n_groups * group_size
    man = pd.DataFrame({"sample_id": [f"s{i:05d}" for i in range(n)],
                        "patient_id": [f"p{i:05d}" for i in range(n)],
                        "acq_group": np.repeat([f"g{g}" for g in range(n_groups)], group_size)})
    for p in PREVALENCES:
        man[f"f{p}"] = np.concatenate([rng.permutation(np.r_[np.ones(round(p * group_size)),
                                                             np.zeros(group_size - round(p * group_size))])
                                       for _ in range(n_groups)])
    return rng.normal(size=(n, dim)), man


def in_positive_bank(man, per, finding, seed=42):
    """Whether each per-sample query is a member of its group's R+ (the stage's seeded draw)."""
    inside = np.zeros(len(per), bool)
    y = man[finding].to_numpy()
    ids = man["sample_id"].to_numpy()
    for group in man["acq_group"].unique():
        g = (man["acq_group"] == group).to_numpy()
        _, bank_pos, _ = candor.draw_group(np.flatnonzero(g), np.flatnonzero(g & (y == 1)),
                                           np.flatnonzero(g & (y == 0)), BANK, 4000, candor.group_rng(seed, group))
        inside |= per["sample_id"].isin(ids[bank_pos]).to_numpy()
    return inside


@pytest.fixture(scope="module")
def null_runs():
    feats, man = null_cohort(seed=3)
    findings = [f"f{p}" for p in PREVALENCES]
    runs = {eq: robustbench_fm.evaluate("candor", feats, man, finding=findings, k=K, bank_size=BANK, n_boot=0,
                                        equal_size=eq) for eq in (False, True)}
    return man, findings, runs


def test_d_is_one_half_and_d_all_rises_with_the_odds(null_runs):
    """Lemma 1: queries outside R+ sit at 1/2 for every prevalence; those inside at most 1/2 + k/n.
    With all images as candidates D_all > 1/2, increasing with n−/n+ ("Unequal Candidate Sets")."""
    man, findings, runs = null_runs
    per = runs[False].per_sample
    pooled = runs[False].summary.set_index(["finding", "acq_group"])
    d_all = []
    for f in findings:
        rows = per[per["finding"] == f]
        inside = in_positive_bank(man, rows, f)
        outside = rows["discordant"].to_numpy()[~inside]
        assert abs(outside.mean() - 0.5) < 4 * np.sqrt(0.25 / len(outside)), f
        assert rows["discordant"].to_numpy()[inside].mean() < 0.5 + K / BANK + 4 * np.sqrt(0.25 / inside.sum())
        d_all.append(pooled.loc[(f, candor.POOLED), "d_all"])
    odds = [(1 - p) / p for p in PREVALENCES]
    assert min(d_all[:-1]) > 0.5 + 4 * np.sqrt(0.25 / 600)
    assert spearmanr(odds, d_all).statistic > 0.8


def test_equal_size_gives_chance_for_queries_inside_the_positive_bank(null_runs):
    man, findings, runs = null_runs
    per = runs[True].per_sample
    for f in findings:
        rows = per[per["finding"] == f]
        inside = in_positive_bank(man, rows, f)
        assert inside.sum() == 4 * BANK  # every group's bank holds BANK of the queries
        assert abs(rows["discordant"].to_numpy()[inside].mean() - 0.5) < 4 * np.sqrt(0.25 / inside.sum()), f
        assert abs(rows["discordant"].mean() - 0.5) < 4 * np.sqrt(0.25 / len(rows)), f
    # equal_size only touches the queries inside R+
    base = runs[False].per_sample
    for f in findings:
        a, b = base[base["finding"] == f], per[per["finding"] == f]
        outside = ~in_positive_bank(man, a, f)
        np.testing.assert_array_equal(a["c_neg"].to_numpy()[outside], b["c_neg"].to_numpy()[outside])


def signal_cohort(seed=0, n=2400, shift=1.5):
    rng = np.random.default_rng(seed)
    man = pd.DataFrame({"sample_id": [f"s{i:05d}" for i in range(n)],
                        "patient_id": [f"p{i // 2:05d}" for i in range(n)],
                        "acq_group": np.where(np.arange(n) % 2 == 0, "a", "b"),
                        "finding": (rng.random(n) < 0.15) * 1.0})
    feats = rng.normal(size=(n, 8))
    feats[:, 0] += shift * man["finding"].to_numpy()
    return feats, man


def test_shuffled_labels_remove_a_real_signal():
    """Shuffling within matched groups: D back at 1/2, D_all still far above it."""
    feats, man = signal_cohort()
    real = robustbench_fm.evaluate("candor", feats, man, finding="finding", n_boot=0).summary.iloc[-1]
    shuffled = robustbench_fm.evaluate("candor", feats, man, finding="finding", n_boot=0,
                                       shuffle_labels=True).summary.iloc[-1]
    se = np.sqrt(0.25 / shuffled["n_queries"])
    assert real["d"] < 0.3 and real["margin_auroc"] > 0.75
    assert abs(shuffled["d"] - 0.5) < 4 * se + K / 150  # every query is in its R+ of ~180 positives
    assert shuffled["d_all"] > 0.75 and abs(shuffled["margin_auroc"] - 0.5) < 0.06
    # the permutation keeps every group's numbers of positives and negatives
    rows = robustbench_fm.evaluate("candor", feats, man, finding="finding", n_boot=0, shuffle_labels=True).summary
    base = robustbench_fm.evaluate("candor", feats, man, finding="finding", n_boot=0).summary
    pd.testing.assert_series_equal(rows["n_pos"], base["n_pos"])


def test_negative_queries_exchange_the_roles():
    """The queries become the negatives; the margin AUROC, symmetric in the roles, moves only
    through the other draw of the banks."""
    feats, man = signal_cohort()
    pos = robustbench_fm.evaluate("candor", feats, man, finding="finding", n_boot=0).summary.iloc[-1]
    neg = robustbench_fm.evaluate("candor", feats, man, finding="finding", n_boot=0, queries="negative")
    row = neg.summary.iloc[-1]
    assert row["n_pos"] == pos["n_neg"] and row["n_neg"] == pos["n_pos"]
    assert row["margin_auroc"] == pytest.approx(pos["margin_auroc"], abs=0.02)
    assert set(neg.per_sample["sample_id"]) <= set(man["sample_id"][man["finding"] == 0])
    assert row["d"] < 0.5


def test_excluding_the_patient_removes_twin_neighbours():
    """Label-independent features, two identical images per patient sharing the label: the twin is
    always the nearest positive (k = 1), so D_all collapses; without the patient both return to chance."""
    rng = np.random.default_rng(4)
    n = 2000
    feats = np.repeat(rng.normal(size=(n // 2, 8)), 2, axis=0)
    man = pd.DataFrame({"sample_id": [f"s{i:05d}" for i in range(n)],
                        "patient_id": [f"p{i // 2:05d}" for i in range(n)], "acq_group": "g",
                        "finding": np.repeat(rng.random(n // 2) < 0.3, 2) * 1.0})
    twin = robustbench_fm.evaluate("candor", feats, man, finding="finding", k=1, n_boot=0).summary.iloc[-1]
    alone = robustbench_fm.evaluate("candor", feats, man, finding="finding", k=1, n_boot=0,
                                    exclude_patient=True).summary.iloc[-1]
    assert twin["d_all"] == 0 and twin["margin_auroc"] > 0.8
    se = np.sqrt(0.25 / alone["n_queries"])
    assert abs(alone["d"] - 0.5) < 4 * se + 1 / 550  # every query is in its R+ of ~600 positives
    assert alone["d_all"] > 0.5 and abs(alone["margin_auroc"] - 0.5) < 0.05


def test_unmatched_banks_let_the_acquisition_separate_the_labels():
    """Within each group the label carries no signal, but prevalence and features differ between
    the groups: matched D is at chance, pooled banks make positives look concordant."""
    rng = np.random.default_rng(5)
    n = 2400
    group = np.where(np.arange(n) < n // 2, "siteA|AP", "siteB|PA")
    feats = rng.normal(size=(n, 8))
    feats[group == "siteA|AP", 0] += 3.0
    labels = np.where(group == "siteA|AP", rng.random(n) < 0.5, rng.random(n) < 0.1) * 1.0
    man = pd.DataFrame({"sample_id": [f"s{i:05d}" for i in range(n)], "patient_id": [f"p{i}" for i in range(n)],
                        "acq_group": group, "finding": labels})
    matched = robustbench_fm.evaluate("candor", feats, man, finding="finding", n_boot=0).summary.iloc[-1]
    pooled = robustbench_fm.evaluate("candor", feats, man, finding="finding", n_boot=0, unmatched=True)
    row = pooled.summary.iloc[-1]
    assert abs(matched["d"] - 0.5) < 0.06
    assert row["d"] < matched["d"] - 0.1
    assert row["n_queries"] == matched["n_queries"]  # the same queries, other banks


def test_bootstrap_is_seeded_and_covers_every_metric():
    feats, man = signal_cohort(n=800)
    runs = [robustbench_fm.evaluate("candor", feats, man, finding="finding", n_boot=200, seed=s).summary
            for s in (1, 1, 2)]
    cols = [f"{m}_{s}" for m in candor.METRICS for s in ("sd", "ci_low", "ci_high")]
    pd.testing.assert_frame_equal(runs[0], runs[1])
    assert (runs[0][cols].to_numpy() != runs[2][cols].to_numpy()).any()
    for m in candor.METRICS:
        assert (runs[0][f"{m}_ci_low"] <= runs[0][m]).all() and (runs[0][m] <= runs[0][f"{m}_ci_high"]).all()
        assert (runs[0][f"{m}_sd"] > 0).all()


def test_resampled_auroc_is_the_weighted_auroc():
    """Unit weights give sklearn's AUROC (with ties); integer multiplicities give sklearn's
    sample-weighted AUROC, exactly."""
    rng = np.random.default_rng(6)
    scores = rng.integers(0, 15, 300) / 4.0          # many ties
    labels = (rng.random(300) < 0.4) * 1
    codes = rng.integers(0, 120, 300)                 # clusters holding several units
    auroc = stats.ResampledAUROC(scores, labels, codes)
    ones = np.ones((1, 120), np.int32)
    assert auroc(ones)[0] == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
    counts = next(stats.cluster_count_chunks(120, 5, np.random.default_rng(0)))
    for row, value in zip(counts, auroc(counts)):
        assert value == pytest.approx(roc_auc_score(labels, scores, sample_weight=row[codes]), abs=1e-12)
        assert row.sum() == 120
    ratio = stats.ResampledRatio(codes, labels)(counts)[:, 0]
    np.testing.assert_allclose(ratio, counts[:, codes] @ labels / counts[:, codes].sum(axis=1))


def delong_se(scores, labels):
    """DeLong's standard error of the AUROC from the placement values (independent units)."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    cmp = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    v10, v01 = cmp.mean(axis=1), cmp.mean(axis=0)
    return np.sqrt(v10.var(ddof=1) / len(pos) + v01.var(ddof=1) / len(neg))


@pytest.mark.parametrize("method", [stats.ResampledAUROC, stats.LinearizedAUROC])
def test_clustered_auroc_bootstrap_follows_theory(method):
    """Independent units: bootstrap SD ≈ DeLong SE. Every unit duplicated within its patient: the
    same resamples give the same SD exactly. Duplicates counted as separate patients: SD / √2."""
    rng = np.random.default_rng(8)
    n = 600
    labels = (rng.random(n) < 0.4) * 1
    scores = rng.normal(size=n) + 0.8 * labels
    boot = lambda s, y, c, n_c: np.concatenate(  # noqa: E731
        [method(s, y, c)(w) for w in stats.cluster_count_chunks(n_c, 2000, np.random.default_rng(1))])
    single = boot(scores, labels, np.arange(n), n)
    twins = boot(np.tile(scores, 2), np.tile(labels, 2), np.tile(np.arange(n), 2), n)
    separate = boot(np.tile(scores, 2), np.tile(labels, 2), np.arange(2 * n), 2 * n)
    assert single.std() == pytest.approx(delong_se(scores, labels), rel=0.1)
    np.testing.assert_allclose(twins, single, rtol=0, atol=1e-12)
    assert separate.std() == pytest.approx(single.std() / np.sqrt(2), rel=0.1)
    assert np.mean(single) == pytest.approx(roc_auc_score(labels, scores), abs=3 * single.std() / np.sqrt(2000))


def test_linear_and_exact_auroc_intervals_agree_in_the_stage():
    feats, man = signal_cohort(n=1200)
    lin, exact = (robustbench_fm.evaluate("candor", feats, man, finding="finding", n_boot=400,
                                          auroc_bootstrap=m).summary for m in ("linear", "exact"))
    pd.testing.assert_frame_equal(lin.drop(columns=[c for c in lin if c.startswith("margin_auroc_")]),
                                  exact.drop(columns=[c for c in exact if c.startswith("margin_auroc_")]))
    np.testing.assert_allclose(lin["margin_auroc_sd"], exact["margin_auroc_sd"], rtol=0.15)
    np.testing.assert_allclose(lin["margin_auroc_ci_low"], exact["margin_auroc_ci_low"], atol=0.01)
