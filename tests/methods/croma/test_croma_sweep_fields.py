"""The CRoMa summary's m-sweep fields and RI / MaRI tails said as croma 1.0.1 says them (issue 54,
items 16-17), checked against the reference package field by field as test_croma_oracle.py does:

* the RI / MaRI tails (``ri_q_alpha``, ``ri_ltm``, ``mari_q_alpha``, ``mari_ltm``) stay at croma's
  fixed α = 0.10 whatever the stage's ``alpha``, which sets CRoMa's ``q_alpha`` / ``ltm`` only;
* ``ri_std`` / ``mari_std`` / ``croma_std`` are in the summary under ``design="all"`` too (0.0, as croma
  writes them);
* a sweep that ends before ``m_sweep`` says so in the row (``m_range``) and warns;
* duplicate rows whose nearest SO and OS candidates are copies (croma refuses at m = 1, "zero margin
  denominator") are counted (``n_undefined_m1``) and warned about."""
import re
import warnings

import numpy as np
import pytest
from croma import RI, CRoMa, MaRI
from croma_cohorts import cohort, quartets, reference_manifest
from test_croma_duplicates import duplicated

from robustbench_fm.methods.croma import stage


def _reference(x, manifest, design, **croma_kwargs):
    ref = reference_manifest(manifest)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ri = RI.compute(x, ref, confounder_column="site", k_candidates=list(stage.DEFAULT_K_GRID),
                        evaluation_design=design)
        mari = MaRI.compute(x, ref, confounder_column="site", k_candidates=list(stage.DEFAULT_K_GRID),
                            evaluation_design=design)
        cr = CRoMa.compute(x, ref, confounder_column="site", evaluation_design=design, **croma_kwargs)
    return ri, mari, cr


def _run(x, manifest, **params):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = stage.run(x, manifest, device="cpu", **params)
    return res.summary.iloc[0], [str(w.message) for w in caught]


@pytest.mark.parametrize("design", ["all", "paired_2x2"])
def test_ri_and_mari_tails_stay_at_croma_fixed_alpha(design):
    x, manifest = (cohort(seed=1, tiles_per_slide=15) if design == "all"
                   else quartets(seed=5, tiles_per_cell=20, dtype=np.float64))
    row, _ = _run(x, manifest, design=design, alpha=0.2)
    ri, mari, cr = _reference(x, manifest, design, m=5, alpha=0.2)
    # CRoMa's tail follows alpha (croma's --croma-alpha) ...
    assert row["q_alpha"] == pytest.approx(cr.q_alpha, abs=1e-6) and row["ltm"] == pytest.approx(cr.ltm_alpha, abs=1e-6)
    # ... RI's and MaRI's stay at croma's 0.10, which differs from the 0.2 tail
    assert row["ri_q_alpha"] == ri.q_alpha and row["ri_ltm"] == pytest.approx(ri.ltm_alpha, rel=0, abs=1e-15)
    assert row["mari_q_alpha"] == pytest.approx(mari.q_alpha, abs=1e-6)
    assert row["mari_ltm"] == pytest.approx(mari.ltm_alpha, abs=1e-6)
    values = np.sort(ri.sample_values)
    assert ri.q_alpha == np.percentile(values, 10) != np.percentile(values, 20)
    assert stage.RI_TAIL_ALPHA == 0.10


def test_spreads_are_zero_under_design_all_as_croma_writes_them():
    x, manifest = cohort(seed=1, tiles_per_slide=15)
    row, _ = _run(x, manifest)
    ri, mari, cr = _reference(x, manifest, "all", m=5)
    assert (row["ri_std"], row["mari_std"], row["croma_std"]) == (ri.std, mari.std, cr.std) == (0.0, 0.0, 0.0)
    assert "n_subsets" not in row.index  # a paired-only field


def test_a_short_m_sweep_says_its_range_in_the_row():
    """2 slides of 6 tiles per cell: every unit has 12 cross-group SO and OS candidates, so the
    sweep ends at m = 12; croma's benchmark (m = 1..20) refuses this cohort."""
    x, manifest = cohort(slides_per_cell=2, tiles_per_slide=6, seed=2, dtype=np.float64)
    row, caught = _run(x, manifest)
    assert row["m_sweep"] == 12
    assert row["m_range"] == "1..12 of 1..20 asked (a unit has only 12 cross-group SO or OS candidates)"
    assert any("the m sweep ends at m = 12, not m_sweep = 20: a unit has only 12" in w and "m_range" in w
               for w in caught)
    with pytest.raises(RuntimeError):
        _reference(x, manifest, "all", m=list(range(1, 21)))
    _, _, by_m = _reference(x, manifest, "all", m=list(range(1, 13)))
    curve = [by_m[m].value for m in range(1, 13)]
    assert row["croma_auc"] == pytest.approx(np.trapezoid(curve, range(1, 13)) / 11, abs=1e-9)
    assert row["croma_min"] == pytest.approx(min(curve), abs=1e-9)
    assert row["croma_delta"] == pytest.approx(curve[-1] - curve[0], abs=1e-9)
    full, caught = _run(*cohort(seed=1, tiles_per_slide=15))
    assert full["m_range"] == "1..20" and not any("m sweep ends" in w for w in caught)
    asked, _ = _run(x, manifest, m_sweep=8)  # a sweep the user shortened ends where asked
    assert asked["m_range"] == "1..8" and asked["m_sweep"] == 8


def _nearest_copies(x, manifest) -> np.ndarray:
    """Units with an identical row among their cross-group SO candidates and another among their
    OS candidates: their m = 1 margin is 0/0."""
    lab, con, grp = (manifest[c].to_numpy() for c in ("bio_label", "site", "slide_id"))
    same = (x[:, None, :] == x[None, :, :]).all(axis=2) & (grp[:, None] != grp[None, :])
    so = (lab[:, None] == lab[None, :]) & (con[:, None] != con[None, :])
    os_ = (lab[:, None] != lab[None, :]) & (con[:, None] == con[None, :])
    return (same & so).any(axis=1) & (same & os_).any(axis=1)


def _median_at_m1(x, manifest) -> float:
    """CRoMa(m = 1) by brute force: copies at distance exactly 0, the undefined units left out."""
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    dist = np.where((x[:, None, :] == x[None, :, :]).all(axis=2), 0.0, np.clip(1 - unit @ unit.T, 0, 2))
    lab, con, grp = (manifest[c].to_numpy() for c in ("bio_label", "site", "slide_id"))
    cross = grp[:, None] != grp[None, :]
    so = cross & (lab[:, None] == lab[None, :]) & (con[:, None] != con[None, :])
    os_ = cross & (lab[:, None] != lab[None, :]) & (con[:, None] == con[None, :])
    d_so, d_os = np.where(so, dist, np.inf).min(axis=1), np.where(os_, dist, np.inf).min(axis=1)
    with np.errstate(invalid="ignore"):
        c = (d_os - d_so) / (d_os + d_so)
    return float(np.median(c[np.isfinite(c)]))


@pytest.mark.parametrize("seed", [0, 1])
def test_units_undefined_at_m1_are_counted_where_croma_refuses(seed):
    x, manifest = duplicated(np.float64, seed=seed)
    row, caught = _run(x, manifest)
    want = int(_nearest_copies(x, manifest).sum())
    assert want > 0 and row["n_undefined_m1"] == want
    assert any(f"{want}/{len(x)} units have a zero margin denominator at m = 1" in w and "n_undefined_m1" in w
               for w in caught)
    with pytest.raises(RuntimeError, match="m=1: .* zero margin denominator") as err:
        _reference(x, manifest, "all", m=list(range(1, 21)))
    # croma counts only the copies its float arithmetic puts at exactly 0: some of ours, never more
    theirs = int(re.search(r"(\d+)/\d+ sample\(s\) have a zero margin denominator", str(err.value)).group(1))
    assert 0 < theirs <= want
    # m >= 2 has no such unit here: croma scores it, and the sweep's end and headline agree with it
    _, _, by_m = _reference(x, manifest, "all", m=list(range(2, 21)))
    assert row["croma"] == pytest.approx(by_m[5].value, abs=1e-9)
    assert row["croma_delta"] == pytest.approx(by_m[20].value - _median_at_m1(x, manifest), abs=1e-9)


def test_no_duplicates_no_undefined_units():
    row, caught = _run(*cohort(seed=1, tiles_per_slide=15))
    assert row["n_undefined_m1"] == 0 and not any("zero margin denominator" in w for w in caught)
