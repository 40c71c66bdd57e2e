"""Spearman and slope tests of the CANDOR association analyses against scipy and planted cases."""
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from robustbench_fm.methods.candor.ranks import (
    association_family,
    correct_family,
    rank_correlation,
    slope_test,
    spearman,
)


def test_spearman_and_slope_agree_with_scipy():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=40), rng.normal(size=40)
    y[:20] += x[:20]
    rho, p, n = spearman(x, y)
    ref = stats.spearmanr(x, y)
    assert (rho, p, n) == (pytest.approx(ref.statistic), pytest.approx(ref.pvalue), 40)
    res, ref = slope_test(x, y), stats.linregress(x, y)
    assert res["slope"] == pytest.approx(ref.slope) and res["p"] == pytest.approx(ref.pvalue)
    x[3] = np.nan  # dropped pairwise
    assert spearman(x, y)[2] == 39 and slope_test(x, y)["n"] == 39


def test_planted_monotone_rankings():
    frame = pd.DataFrame({"d": [0.2, 0.3, 0.4, 0.5, 0.6], "auroc": [0.9, 0.8, 0.7, 0.65, 0.6]})
    assert rank_correlation(frame, "auroc", "d")["rho"] == pytest.approx(-1.0)
    # per-group ρ then mean: +1 in one finding, −1 in the other -> 0
    two = pd.DataFrame({"finding": ["a"] * 4 + ["b"] * 4, "x": [1, 2, 3, 4] * 2, "y": [1, 2, 3, 4, 4, 3, 2, 1]})
    res = rank_correlation(two, "x", "y", by="finding")
    assert res["rho"] == pytest.approx(0.0) and res["n"] == 2
    # an exact line has slope 2 and p ~ 0; a flat x has no slope
    assert slope_test([1, 2, 3, 4], [3, 5, 7, 9])["slope"] == pytest.approx(2.0)
    assert np.isnan(slope_test([1, 1, 1], [1, 2, 3])["slope"])


def test_association_family_is_bh_corrected_together():
    rng = np.random.default_rng(1)
    encs = [f"e{i}" for i in range(8)]
    d = np.linspace(0.25, 0.48, 8)
    enc = pd.DataFrame({"encoder": encs, "d": d, "d_all": d + 0.45, "head_auroc": 0.9 - d,
                        "release_year": rng.integers(2020, 2026, 8), "objective": ["ssl"] * 7 + ["none"],
                        "retention": 0.5 + d, "retention_std": rng.uniform(size=8)})
    combos = pd.DataFrame([dict(encoder=e, finding=f, d=d[i] + rng.normal(0, 0.01), n_pos=n,
                                d_all=1 - n / 2000 + rng.normal(0, 0.001), head_auroc=0.9 - d[i])
                           for i, e in enumerate(encs) for f, n in (("a", 300), ("b", 900), ("c", 1500))])
    out = association_family(enc, combos).set_index("quantity")
    assert out.loc["head AUROC vs D (encoders)", "statistic"] == pytest.approx(-1.0)
    assert out.loc["D_all vs D (encoders)", "statistic"] == pytest.approx(1.0)
    assert out.loc["D_all vs number of positives (combinations)", "statistic"] < -0.8
    assert out.loc["D vs release year (trained encoders)", "n"] == 7
    assert out.loc["retention vs D (trained encoders)", "statistic"] == pytest.approx(1.0)
    assert out.loc["retention vs D (trained encoders)", "n"] == 7
    slopes = out[out["kind"] == "slope"]
    assert (slopes.loc["D_all vs number of positives, slope (combinations)", "statistic"]
            == pytest.approx(-1 / 2000, rel=0.05))
    ref = correct_family(out.reset_index())
    has_p = out["p"].notna().to_numpy()
    assert out["p_bh"].to_numpy()[has_p] == pytest.approx(stats.false_discovery_control(out["p"].to_numpy()[has_p]))
    assert ref["significant"].tolist() == out["significant"].tolist()


def test_too_few_encoders_get_no_p_value_and_a_note():
    """With n = 3 a perfect ranking has p = 0 (scipy), which read as significant."""
    from robustbench_fm.methods.candor.ranks import MIN_TEST_N

    assert MIN_TEST_N == 5
    enc = pd.DataFrame({"encoder": ["a", "b", "c"], "d": [0.2, 0.3, 0.4], "d_all": [0.6, 0.7, 0.8],
                        "head_auroc": [0.9, 0.8, 0.7], "objective": ["ssl", "ssl", "synthetic"],
                        "release_year": [2021, 2022, np.nan]})
    combos = pd.DataFrame([dict(encoder=e, finding=f, d=0.3, d_all=1 - n / 2000, n_pos=n, head_auroc=0.8)
                           for e in "abc" for f, n in (("x", 100), ("y", 300), ("z", 900))])
    out = association_family(enc, combos).set_index("quantity")
    for test in ("head AUROC vs D (encoders)", "D_all vs D (encoders)"):
        assert np.isnan(out.loc[test, "p"]) and not out.loc[test, "significant"]
        assert out.loc[test, "note"] == "too few encoders (n = 3) for a rank test"
        assert out.loc[test, "statistic"] == pytest.approx(1.0 if test.startswith("D_all") else -1.0)
    assert out.loc["D vs release year (trained encoders)", "note"] == "too few encoders (n = 2) for a slope test"
    assert out.loc["head AUROC vs -D (per finding, mean)", "note"] == "too few encoders (n = 3) for a rank test"
    # 9 combinations are enough units for the tests over combinations
    assert out.loc["D_all vs number of positives (combinations)", "note"] == ""
    assert out.loc["D_all vs number of positives (combinations)", "p"] < 0.05
