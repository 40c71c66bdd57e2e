"""MaRI at extreme τ and CRoMa on a collapsed embedding, against croma 1.0.1 (issue 42 item 3).

* A subnormal τ (5e-324): every weight exp(−d/τ) underflows and even d/τ overflows in float64;
  croma keeps the ratio in extended-precision log space, so MaRI is winner-take-all (1 where the
  nearest typed neighbour is SO, 0 where it is OS), finite for every unit with a typed neighbour.
* A small τ (k = 2, τ = 1e-3, croma's own fixture): the weights are subnormal and the ratio is
  sigmoid(1) to the last bit, as croma computes it.
* The arithmetic on the same neighbour lists equals croma's ``_score_all_k_from_neighbors`` bit
  for bit per unit (and to 1e-16 pooled) at ordinary, small and subnormal τ.
* A collapsed embedding: CRoMa is refused with its reason in the summary row, RI and MaRI are
  reported, equal to croma's (whose CRoMa call raises).
"""
import warnings

import numpy as np
import pandas as pd
import pytest
from croma import RI, CRoMa, MaRI
from croma.metrics.mari import MarginAwareRobustnessIndex
from croma_cohorts import cohort, reference_manifest

from robustbench_fm.methods.croma import stage

SUBNORMAL_TAU = float(np.nextafter(0.0, 1.0))  # 5e-324


def staircase(tiles=4):
    """Cells on 2-d directions 0°, 10°, 20°, 30° = (A, c1), (A, c2), (B, c1), (B, c2), ``tiles``
    copies each, every tile its own slide. At k = 3 + 8 every unit's top-k holds its SO cell at
    10° and, for the two outer cells, its OS cell at 20°: the nearest typed neighbour is always
    SO, so MaRI → 1 as τ → 0 for every unit (RI = 64/96 = 2/3 whatever τ)."""
    cells = [("A", "c1", 0), ("A", "c2", 10), ("B", "c1", 20), ("B", "c2", 30)]
    rows, labels, sites = [], [], []
    for label, site, deg in cells:
        rows += [(np.cos(np.radians(deg)), np.sin(np.radians(deg)))] * tiles
        labels += [label] * tiles
        sites += [site] * tiles
    n = len(rows)
    manifest = pd.DataFrame({"sample_id": [f"u{i:02d}" for i in range(n)], "bio_label": labels, "site": sites,
                             "slide_id": [f"g{i:02d}" for i in range(n)]})
    return np.array(rows), manifest


def reference_mari(x, manifest, k, tau, design="all"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MaRI.compute(x, reference_manifest(manifest), confounder_column="site", k_candidates=[k], tau=tau,
                            evaluation_design=design, warn_tau=False)


@pytest.mark.parametrize("design", ["all", "paired_2x2"])
def test_subnormal_tau_is_winner_take_all_as_croma(design):
    x, manifest = staircase()
    if design == "paired_2x2":
        manifest = manifest.assign(subset="pair")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = stage.run(x, manifest, k=11, m=1, tau=SUBNORMAL_TAU, design=design, device="cpu")
        auto = stage.run(x, manifest, k=11, m=1, design=design, device="cpu").summary.iloc[0]
    row, ps = res.summary.iloc[0], res.per_sample
    assert row["support"] == 1.0 and row["ri"] == 2 / 3
    assert auto["mari"] < 0.99  # at an ordinary τ the OS neighbours weigh in
    assert row["mari"] == 1.0 and (ps["mari"] == 1.0).all()  # closed form: the nearest typed is SO
    ref = reference_mari(x, manifest, 11, SUBNORMAL_TAU, design)
    assert ref.value == row["mari"]
    np.testing.assert_array_equal(ps["mari"].to_numpy()[ref.occurrence_source_indices], ref.sample_values_aligned)
    assert (row["mari_median"], row["mari_q_alpha"], row["mari_ltm"]) == (1.0, 1.0, 1.0)


def test_subnormal_tau_on_a_random_cohort_equals_croma():
    """Both SO- and OS-won units: per-unit values in {0, 1} (closed form: the type of the nearest
    typed neighbour), finite wherever a typed neighbour exists, and croma's to the bit."""
    x, manifest = cohort(slides_per_cell=3, tiles_per_slide=8, seed=11, dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = stage.run(x, manifest, k=7, tau=SUBNORMAL_TAU, device="cpu")
    ps, row = res.per_sample, res.summary.iloc[0]
    defined = ps["undefined"] == ""
    assert ps.loc[defined, "mari"].notna().all() and ps.loc[~defined, "mari"].isna().all()
    assert set(ps.loc[defined, "mari"]) == {0.0, 1.0}
    ref = reference_mari(x, manifest, 7, SUBNORMAL_TAU)
    np.testing.assert_array_equal(ps["mari"].to_numpy(), ref.sample_values_aligned)
    assert row["mari"] == ref.value and row["support"] == ref.support


def test_small_tau_fixture_is_exact():
    """croma's fixture (its tests/test_mari_tau_limits.py): the query's SO and OS neighbours at
    0.744 and 0.745, k = 2, τ = 1e-3. Both weights are subnormal; MaRI = 1/(1 + e^−1) to 1e-15,
    equal to croma's value; the old log-sum-exp was 1.2e-14 off."""
    x = np.array([[1.0, 0.0], [0.256, np.sqrt(1.0 - 0.256**2)], [0.255, -np.sqrt(1.0 - 0.255**2)], [0.0, 1.0]])
    manifest = pd.DataFrame({"sample_id": ["query", "so", "os", "far"], "bio_label": ["A", "A", "B", "B"],
                             "site": ["V1", "V2", "V1", "V2"], "slide_id": ["g0", "g1", "g2", "g3"]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = stage.run(x, manifest, k=2, m=1, tau=1e-3, on_short="skip", device="cpu")
    ref = reference_mari(x, manifest, 2, 1e-3)
    query = res.per_sample["mari"][0]
    assert query == pytest.approx(1 / (1 + np.exp(-1)), rel=0, abs=1e-15)
    assert query == ref.sample_values_aligned[0]
    # the other units' values are subnormal (e.g. 2.9e-309): an ulp of distance moves their last digits
    np.testing.assert_allclose(res.per_sample["mari"].to_numpy(), ref.sample_values_aligned, rtol=0, atol=1e-15)
    assert res.summary["mari"][0] == pytest.approx(ref.value, rel=0, abs=1e-15)


@pytest.mark.parametrize("tau", [None, 1e-3, 2e-5, SUBNORMAL_TAU])
@pytest.mark.parametrize("design", ["all", "paired_2x2"])
def test_mari_arithmetic_is_croma_on_the_same_lists(tau, design):
    """Our neighbour lists fed to croma's own scoring (``_score_all_k_from_neighbors``): per-unit
    MaRI identical to the bit (linear and log-space units alike), pooled within 1e-16."""
    from croma_cohorts import quartets

    if design == "all":
        x, manifest = cohort(slides_per_cell=3, tiles_per_slide=10, seed=5, dtype=np.float64)
    else:
        x, manifest = quartets(seed=2, tiles_per_cell=15, dtype=np.float64)
    k = 9
    prep = stage.prepare(x, manifest, k=k, design=design, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row, ps, _ = stage.score(prep, k, tau=tau)
    theirs, so_total, os_total = [], 0.0, 0.0
    log_so, log_os = np.longdouble(-np.inf), np.longdouble(-np.inf)
    for s in prep.scopes:
        entry = MarginAwareRobustnessIndex._score_all_k_from_neighbors(
            labels=s.labels, centers=s.confs, neigh_idx=s.nb.idx, neigh_dist=s.nb.dist, valid_counts=s.nb.count,
            k_values=[k], tau=row["tau"])[k]
        theirs.append(pd.Series(entry.sample_scores, index=s.rows))
        so_total, os_total = so_total + entry.so_evidence.sum(), os_total + entry.os_evidence.sum()
        log_so, log_os = np.logaddexp(log_so, entry.log_so_total), np.logaddexp(log_os, entry.log_os_total)
    per_unit = pd.concat(theirs).sort_index().to_numpy()
    np.testing.assert_array_equal(ps["mari"].to_numpy(), per_unit)
    if so_total + os_total >= np.finfo(float).tiny:
        pooled = so_total / (so_total + os_total)
    else:
        pooled = float(np.exp(log_so - np.logaddexp(log_so, log_os)))
    assert row["mari"] == pytest.approx(pooled, rel=2.3e-16, abs=0)
    assert np.isfinite(ps["mari"][ps["undefined"] == ""]).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("jitter", [0.0, 1e-3])
def test_collapsed_embedding_refuses_croma_and_reports_ri_and_mari(dtype, jitter):
    """All rows identical (up to a jitter below the dtype's resolution): every margin
    denominator is exactly 0. croma 1.0.1 raises "zero margin denominator" in its CRoMa call and
    scores RI and MaRI; the stage does the same in one row: CRoMa's fields NaN with the reason,
    RI and MaRI reported. Every candidate ties at distance 0, so the top-k is the tie rule's
    (sample_id order; croma's is sklearn's arbitrary order, so its RI may differ): RI equals that
    brute force, and τ falls back to 0.2 with MaRI = RI on both sides."""
    _, manifest = cohort(slides_per_cell=2, tiles_per_slide=10)
    rng = np.random.default_rng(0)
    base = rng.standard_normal(24)
    eps = np.finfo(dtype).eps
    x = (base + jitter * eps * rng.standard_normal((len(manifest), 24))).astype(dtype)  # rounding-level spread
    with pytest.warns(RuntimeWarning, match="CRoMa not computed"):
        res = stage.run(x, manifest, device="cpu")
    row = res.summary.iloc[0]
    assert "\n" not in row["reason"] and row["reason"].startswith("CRoMa not computed (RI and MaRI are): 80/80 "
                                                                  "units have a zero margin denominator")
    for key in ("croma", "f0", "q_alpha", "ltm", "croma_auc", "croma_min", "croma_delta"):
        assert np.isnan(row[key]), key
    assert res.per_sample["croma"].isna().all()
    assert stage.zero_margin_tolerance(dtype, 24) == pytest.approx(4 * eps * np.sqrt(24))
    ref_manifest = reference_manifest(manifest)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ri = RI.compute(x, ref_manifest, confounder_column="site", k_candidates=list(stage.DEFAULT_K_GRID))
        mari = MaRI.compute(x, ref_manifest, confounder_column="site", k_candidates=list(stage.DEFAULT_K_GRID))
    k = int(row["k"])
    ids, slides = manifest["sample_id"].to_numpy(), manifest["slide_id"].to_numpy()
    labels, sites = manifest["bio_label"].to_numpy(), manifest["site"].to_numpy()
    n_so = n_typed = 0
    for i in range(len(manifest)):
        cands = [j for j in np.argsort(ids) if slides[j] != slides[i]][:k]
        so = sum(labels[j] == labels[i] and sites[j] != sites[i] for j in cands)
        os_ = sum(labels[j] != labels[i] and sites[j] == sites[i] for j in cands)
        n_so, n_typed = n_so + so, n_typed + so + os_
    assert row["ri"] == n_so / n_typed
    assert row["tau"] == mari.tau == 0.2 and row["mari"] == row["ri"] and mari.value == ri.value
    with pytest.raises(RuntimeError, match="80/80 sample.* zero margin denominator"):  # the reference's refusal
        CRoMa.compute(x, ref_manifest, confounder_column="site")
