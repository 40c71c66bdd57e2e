"""Discordant-set overlap (hypergeometric tail, ΔJ, BH) and the consensus blind set."""
from itertools import combinations
from math import comb

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from robustbench_fm.core.stats import bh_adjust
from robustbench_fm.methods.candor.sets import (
    blind_set_summary,
    consensus_blind_set,
    expected_jaccard,
    overlap_pvalue,
    overlap_test,
    pairwise_overlaps,
)


def test_hypergeometric_tail_matches_scipy_and_a_hand_count():
    # n=10 queries, |A|=4, |B|=3, overlap 3: P[X>=3] = C(4,3)C(6,0)/C(10,3) = 4/120
    assert overlap_pvalue(10, 4, 3, 3) == pytest.approx(4 / 120, abs=1e-12)
    # overlap >= 0 is certain
    assert overlap_pvalue(10, 4, 3, 0) == pytest.approx(1.0)
    for n, a, b, x in [(50, 10, 20, 7), (200, 40, 35, 12), (30, 5, 5, 0)]:
        assert overlap_pvalue(n, a, b, x) == pytest.approx(stats.hypergeom(n, a, b).sf(x - 1))
    res = overlap_test(np.array([1, 1, 1, 1, 0, 0, 0, 0, 0, 0], bool), np.array([1, 1, 1, 0, 0, 0, 0, 0, 0, 0], bool))
    assert (res["overlap"], res["size_a"], res["size_b"]) == (3, 4, 3)
    assert res["jaccard"] == pytest.approx(3 / 4) and res["p_value"] == pytest.approx(4 / 120)


def test_expected_jaccard_equals_brute_force_enumeration():
    n, a_size, b_size = 7, 3, 4
    a = set(range(a_size))
    jac = [len(a & set(b)) / len(a | set(b)) for b in combinations(range(n), b_size)]
    assert len(jac) == comb(n, b_size)
    assert expected_jaccard(n, a_size, b_size) == pytest.approx(np.mean(jac), abs=1e-12)
    assert expected_jaccard(5, 0, 0) == 0.0 and expected_jaccard(5, 5, 5) == pytest.approx(1.0)


def test_delta_j_is_zero_in_expectation_for_independent_sets():
    rng = np.random.default_rng(0)
    n, a_size, b_size = 60, 15, 25
    deltas = []
    for _ in range(1500):
        a, b = np.zeros(n, bool), np.zeros(n, bool)
        a[rng.choice(n, a_size, replace=False)] = True
        b[rng.choice(n, b_size, replace=False)] = True
        deltas.append(overlap_test(a, b)["delta_j"])
    se = np.std(deltas) / np.sqrt(len(deltas))
    assert abs(np.mean(deltas)) < 4 * se
    assert np.std(deltas) > 0.02  # the test could fail: ΔJ does vary


def test_bh_matches_scipy_and_a_hand_case():
    p = np.array([0.01, 0.04, 0.03, 0.20])
    adjusted, rejected = bh_adjust(p)
    # sorted 0.01,0.03,0.04,0.20 -> 0.04,0.0533,0.0533,0.20 (step-up minimum)
    assert adjusted == pytest.approx([0.04, 0.04 * 4 / 3, 0.04 * 4 / 3, 0.20])
    assert rejected.tolist() == [True, False, False, False]
    q = np.random.default_rng(1).uniform(size=30) ** 3
    assert bh_adjust(q)[0] == pytest.approx(stats.false_discovery_control(q))


def _per_sample(rng, n=300):
    """Three encoders on two findings: e1 and e2 share a latent 'hard' set, e3 is independent."""
    rows = []
    for finding in ("edema", "fracture"):
        hard = rng.uniform(size=n) < 0.3
        for enc in ("e1", "e2", "e3"):
            own = rng.uniform(size=n) < 0.3
            disc = (hard & (rng.uniform(size=n) < 0.9)) | (own & (rng.uniform(size=n) < 0.2)) if enc != "e3" else own
            rows.append(pd.DataFrame({"encoder": enc, "finding": finding, "sample_id": [f"s{i}" for i in range(n)],
                                      "discordant": disc}))
    return pd.concat(rows, ignore_index=True)


def test_pairwise_overlaps_find_the_shared_pair_and_correct_per_family():
    pairs = pairwise_overlaps(_per_sample(np.random.default_rng(2)))
    assert len(pairs) == 2 * 3
    shared = pairs[(pairs.encoder_a == "e1") & (pairs.encoder_b == "e2")]
    assert (shared["p_value"] < 1e-10).all() and (shared["delta_j"] > 0.3).all() and shared["significant"].all()
    indep = pairs[pairs.encoder_b == "e3"]
    assert indep["delta_j"].abs().max() < 0.1
    for _, fam in pairs.groupby("finding"):
        assert fam["p_adj"].to_numpy() == pytest.approx(stats.false_discovery_control(fam["p_value"].to_numpy()))
    # a missing query of one encoder drops out of that encoder's pairs only
    ps = _per_sample(np.random.default_rng(2))
    ps = ps.drop(ps.index[(ps.encoder == "e3") & (ps.sample_id == "s0")])
    pairs2 = pairwise_overlaps(ps)
    assert set(pairs2.loc[pairs2.encoder_b == "e3", "n"]) == {299}
    assert set(pairs2.loc[pairs2.encoder_b == "e2", "n"]) == {300}


def test_consensus_blind_set_is_a_strict_majority():
    # panel of 4: a sample is blind with 3 or 4 discordant encoders, not with 2 (a tie)
    disc = {"a": [1, 1, 1, 1], "b": [1, 1, 1, 0], "c": [1, 1, 0, 0], "d": [1, 0, 0, 0]}
    rows = [dict(encoder=f"e{j}", finding="edema", sample_id=s, discordant=bool(v))
            for s, values in disc.items() for j, v in enumerate(values)]
    rows.append(dict(encoder="e0", finding="edema", sample_id="e", discordant=True))  # scored by one encoder
    blind = consensus_blind_set(pd.DataFrame(rows)).set_index("sample_id")
    assert blind["n_discordant"].to_dict() == {"a": 4, "b": 3, "c": 2, "d": 1, "e": 1}
    assert blind["blind"].to_dict() == {"a": True, "b": True, "c": False, "d": False, "e": False}
    assert (blind["panel"] == 4).all() and blind.loc["e", "n_encoders"] == 1
    summary = blind_set_summary(blind.reset_index()).set_index("finding")
    assert summary.loc["edema", "n_blind"] == 2 and summary.loc["edema", "blind_share"] == pytest.approx(0.4)
    assert summary.loc["Pooled", "n_scored_by_all"] == 4
