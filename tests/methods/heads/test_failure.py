"""Failure detection, LogME, neighbourhood impurity, Mantel-Haenszel and combination rules."""
import numpy as np
import pytest
from heads_data import synthetic
from scipy.stats import multivariate_normal
from sklearn.metrics import roc_auc_score

from robustbench_fm import evaluate
from robustbench_fm.core.stats import mantel_haenszel_rd
from robustbench_fm.methods.candor.impurity import neighbourhood_impurity
from robustbench_fm.methods.heads import combine
from robustbench_fm.methods.heads.failure import confidence_scores, mahalanobis
from robustbench_fm.methods.heads.logme import _spectrum, fit_evidence, log_evidence, logme


def test_confidence_measures_agree_for_a_binary_head():
    rng = np.random.default_rng(0)
    logit = np.r_[rng.normal(scale=3, size=500), 50.0, -60.0]  # saturating logits included
    error = rng.random(len(logit)) < 1 / (1 + np.abs(logit))
    scores = confidence_scores(logit)
    aurocs = [roc_auc_score(error, s) for s in scores.values()]
    assert max(aurocs) - min(aurocs) < 1e-6
    # from the outputs: the textbook MSP of sigma(z), max(sigma, 1 - sigma), ranks the same way where it
    # does not saturate, and -log MSP is exact
    p = 1 / (1 + np.exp(-logit))
    msp = np.maximum(p, 1 - p)
    ok = np.abs(logit) < 30
    np.testing.assert_allclose(np.exp(-scores["msp"][ok]), msp[ok], rtol=1e-12)
    assert roc_auc_score(error[ok], -msp[ok]) == pytest.approx(roc_auc_score(error[ok], scores["msp"][ok]), abs=1e-12)


def test_confidence_measures_of_a_multiclass_head_differ():
    """Three classes whose logits have different spreads: MSP, max logit and energy rank the rows
    differently (candor.md Ablation (3): they may differ on multi-class heads)."""
    from scipy.special import logsumexp, softmax
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(3)
    y = rng.integers(0, 4, 3000)
    x = rng.normal(size=(3000, 6)) + np.eye(4, 6)[y] * np.array([2.5, 1.0, 0.6, 0.3])[y, None] * 1.5
    x[:, 5] *= 1 + 3 * (y == 0)  # a class with wider features: larger logits without more accuracy
    head = LogisticRegression(max_iter=2000).fit(x[:1500], y[:1500])  # a 4-class softmax head
    logits = head.decision_function(x[1500:])
    error = logits.argmax(1) != y[1500:]
    scores = confidence_scores(logits)
    # against the textbook definitions, computed independently
    np.testing.assert_allclose(np.exp(-scores["msp"]), softmax(logits, axis=1).max(1), rtol=1e-10)
    np.testing.assert_allclose(scores["max_logit"], -logits.max(1), rtol=1e-12)
    np.testing.assert_allclose(scores["energy"], -logsumexp(logits, axis=1), rtol=1e-12)
    aurocs = {m: roc_auc_score(error, s) for m, s in scores.items()}
    assert all(a > 0.6 for a in aurocs.values())  # each detects the errors
    assert abs(aurocs["msp"] - aurocs["max_logit"]) > 1e-3 and abs(aurocs["max_logit"] - aurocs["energy"]) > 1e-4


def test_confidence_comes_from_the_logit_not_the_operating_point():
    """The stage's MSP is -log max(sigma(z), 1 - sigma(z)) of the head's logit z, whatever the
    threshold at 0.8 validation sensitivity (it is not 0 here)."""
    x, m = synthetic(n=900, signal=0.7, seed=2)
    res = evaluate("error_detection", x, m, finding="f", n_boot=0, epochs=5, n_members=2, knn_k=10)
    per = res.per_sample
    z = per["logit"].to_numpy()
    p = 1 / (1 + np.exp(-z))
    np.testing.assert_allclose(per["msp"], -np.log(np.maximum(p, 1 - p)), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(per["max_logit"], -np.abs(z) / 2, rtol=1e-12)
    # the operating point is not at logit 0, so the decision-based score would differ
    assert ((z >= 0) != per["pred"].to_numpy()).any()


def test_mahalanobis_matches_a_direct_inverse():
    rng = np.random.default_rng(0)
    train, y, test = rng.normal(size=(200, 5)), rng.integers(0, 2, 200), rng.normal(size=(7, 5))
    mu = np.stack([train[y == 0].mean(0), train[y == 1].mean(0)])
    centred = train - mu[y]
    prec = np.linalg.inv(centred.T @ centred / len(train))
    ref = np.min([np.einsum("ij,jk,ik->i", test - m, prec, test - m) for m in mu], axis=0)
    np.testing.assert_allclose(mahalanobis(train, y, test), ref, rtol=1e-8)


def test_error_detection_stage_on_synthetic_features():
    x, m = synthetic(n=900, signal=0.7, seed=2)
    res = evaluate("error_detection", x, m, finding="f", n_boot=100, epochs=5, n_members=3, knn_k=10)
    s = res.summary.set_index("method")
    assert set(s.index) == {"msp", "max_logit", "energy", "ensemble", "mahalanobis", "knn", "impurity", "dm_proxy"}
    assert s["confidence_max_diff"].max() < 1e-6 and s.loc["msp", "diff_vs_msp"] == 0
    per = res.per_sample
    assert (per["error"] == (per["pred"] != (per["label"] == 1))).all()
    for method in ("knn", "impurity"):
        assert s.loc[method, "auroc"] == pytest.approx(roc_auc_score(per["error"], per[method]))
    assert s["q_value"].dropna().ge(s["p_value"].dropna()).all()


def test_logme_closed_form_and_planted_signal():
    rng = np.random.default_rng(0)
    for n, d in ((40, 10), (10, 40)):  # both Gram sides
        f, y = rng.normal(size=(n, d)), rng.normal(size=(n, 1))
        ref = multivariate_normal(np.zeros(n), np.eye(n) / 2.3 + f @ f.T / 0.7).logpdf(y[:, 0]) / n
        assert log_evidence(*_spectrum(f, y), 0.7, 2.3)[0] == pytest.approx(ref, rel=1e-9)
    f = rng.normal(size=(400, 12))
    y = rng.random(400) < 0.5
    ev, alpha, beta = fit_evidence(f, np.stack([~y, y], 1).astype(float))
    columns = [fit_evidence(f, col[:, None].astype(float))[0][0] for col in (~y, y)]
    np.testing.assert_allclose(ev, columns)  # vectorised over targets = one at a time
    planted = f.copy()
    planted[:, 0] += 2.0 * y
    assert logme(planted, y) > logme(f, y) + 0.1


def test_neighbourhood_impurity_by_brute_force():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 3)).astype(np.float32)
    labels = rng.integers(0, 2, 60).astype(float)
    labels[:5] = np.nan
    is_train, groups = np.arange(60) % 3 != 0, np.where(np.arange(60) < 30, "a", "b")
    r = neighbourhood_impurity(x, labels, is_train, groups, k=5, device="cpu")
    z = x / np.linalg.norm(x, axis=1, keepdims=True)
    for i in range(60):
        cands = [j for j in range(60) if j != i and is_train[j] and groups[j] == groups[i] and not np.isnan(labels[j])]
        nearest = sorted(cands, key=lambda j: -z[i] @ z[j])[:5]
        assert r[i] == pytest.approx(1 - abs(2 * labels[nearest].mean() - 1))


def test_mantel_haenszel_matches_a_hand_computed_table():
    # stratum 1: 4/10 discordant missed, 2/10 others; stratum 2: 3/5 vs 1/15
    res = mantel_haenszel_rd(a1=[4, 3], n1=[10, 5], a0=[2, 1], n0=[10, 15])
    # weights n1 n0 / T = 5 and 3.75; differences 0.2 and 0.6 - 1/15 = 0.5333...
    assert res["rd"] == pytest.approx((5 * 0.2 + 3.75 * (0.6 - 1 / 15)) / 8.75)
    # Sato's variance, term by term
    p = [(100 * 2 - 100 * 4 + 100 * 0 / 2) / 400, (25 * 1 - 225 * 3 + 75 * 10 / 2) / 400]
    q = [(4 * 8 + 2 * 6) / 40, (3 * 14 + 1 * 2) / 40]
    assert res["var"] == pytest.approx((res["rd"] * sum(p) + sum(q)) / 8.75 ** 2)
    one = mantel_haenszel_rd([300], [1000], [200], [1000])  # one big stratum: the binomial variance
    assert one["var"] == pytest.approx(0.3 * 0.7 / 1000 + 0.2 * 0.8 / 1000, rel=1e-9)


def test_combination_rules_on_three_heads():
    pred = np.array([[1, 0, 0], [1, 1, 0], [0, 0, 0], [1, 1, 1], [0, 1, 0]], bool)
    assert combine.majority_vote(pred).tolist() == [False, True, False, True, False]
    assert combine.or_rule(pred).tolist() == [True, True, False, True, True]
    val = np.array([[0.9, 0.2, 0.5], [0.8, 0.3, 0.6], [0.1, 0.9, 0.4], [0.2, 0.8, 0.7]])
    assert combine.choose_on_validation(val, [1, 1, 0, 0]) == 0
    # means 0.533, 0.567, 0.467, 0.567; sensitivity 1 puts the threshold at the lowest positive, 0.533
    assert combine.mean_probability(val, [1, 1, 0, 0], val, 1.0).tolist() == [True, True, False, True]


def test_logme_stage_scores_the_heads_training_draw():
    from robustbench_fm.methods.heads.rows import draw_rows

    x, m = synthetic(n=300, signal=1.0, seed=3)
    m.loc[::7, "f"] = np.nan
    row = evaluate("logme", x, m, finding="f", max_train=120).summary.iloc[0]
    train = draw_rows(m, 120, 1).train
    train = train[m["f"].notna().to_numpy()[train]]
    assert row["n"] == len(train) and row["logme"] == pytest.approx(logme(x[train], m["f"].to_numpy()[train]))
