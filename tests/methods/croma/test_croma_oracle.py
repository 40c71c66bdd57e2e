"""Agreement with the reference package croma 1.0.1 (the oracle) on synthetic cohorts, designs
``all`` and ``paired_2x2``, float32 and float64: RI, support, k, F(0), both kNN balanced
accuracies, the confounder's k*, the undefined-unit causes (per unit and their fractions) and the
RI median / Q / LTM identical; MaRI, τ, CRoMa, Q, LTM, the MaRI distribution, the spreads (both
designs), the m sweep's croma_auc / croma_min / croma_delta and every per-sample value within 1e-6
(the sweep's range and the tails at another alpha: test_croma_sweep_fields.py)."""
import warnings

import numpy as np
import pandas as pd
import pytest
from croma import RI, CRoMa, MaRI
from croma.metrics import neighbors as reference_neighbors
from croma.metrics.base import BaseRobustnessIndex
from croma.metrics.neighbors import _select_k_from_balanced_accuracy
from croma.metrics.pairs import normalize_manifest, resolve_manifest_subsets
from croma_cohorts import cohort, quartets, reference_manifest

from robustbench_fm import evaluate
from robustbench_fm.methods.croma import stage

#: per-sample columns for paired comparisons (stage docstring)
PAIRING_COLUMNS = ["n_so", "n_typed", "so_weight", "typed_weight", "cluster", "croma_bank_0", "croma_bank_1"]

GRID = list(stage.DEFAULT_K_GRID)
reference_bacc = reference_neighbors._balanced_accuracy_by_k_from_prepared_neighbors

COHORTS = {
    "2x2 float32": lambda: cohort(seed=1, tiles_per_slide=15),
    "3x3 float32": lambda: cohort(n_labels=3, n_confs=3, slides_per_cell=2, tiles_per_slide=12, seed=3),
    "2x3 tiny float64 (fetch cap)": lambda: cohort(n_confs=3, slides_per_cell=2, tiles_per_slide=6, seed=4,
                                                   dtype=np.float64),
    "paired float32": lambda: quartets(seed=0, tiles_per_cell=20),
    "paired float64": lambda: quartets(seed=5, tiles_per_cell=20, dtype=np.float64),
}


def reference(x, manifest, design, k_grid, m_sweep=None):
    """The oracle's RI, MaRI, CRoMa, and both kNN accuracies at its k (its own neighbour cache);
    with ``m_sweep``, also the confounder's k* over the grid and CRoMa at m = 1..m_sweep, as
    croma's benchmark (scripts/bench/benchmark.py) computes them from the same functions."""
    ref = reference_manifest(manifest)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ri = RI.compute(x, ref, confounder_column="site", k_candidates=k_grid, evaluation_design=design)
        mari = MaRI.compute(x, ref, confounder_column="site", k_candidates=k_grid, evaluation_design=design)
        cr = CRoMa.compute(x, ref, confounder_column="site", evaluation_design=design, m=5, alpha=0.10)
        by_m = (CRoMa.compute(x, ref, confounder_column="site", evaluation_design=design,
                              m=list(range(1, m_sweep + 1)), alpha=0.10) if m_sweep else None)
    df = normalize_manifest(ref, confounder_column="site", source="oracle")
    ks = sorted(set(k_grid) | {ri.k})
    if design == "all":
        caches = [BaseRobustnessIndex._prepare_all_rows_neighbor_cache(features=x, df=df, k_values=ks)]
    else:
        caches = BaseRobustnessIndex._prepare_paired_subset_neighbor_cache(
            features=x, subsets=resolve_manifest_subsets(df), k_values=ks)
    bacc = {name: np.mean([reference_bacc(getattr(c, name), c.neigh_idx, c.valid_counts, [ri.k])[ri.k]
                           for c in caches if ri.k < len(c.labels)]) for name in ("labels", "centers")}
    if design == "all":
        usable = [k for k in k_grid if k < len(caches[0].labels)]
        conf_curve = reference_bacc(caches[0].centers, caches[0].neigh_idx, caches[0].valid_counts, usable)
    else:
        conf_curve = BaseRobustnessIndex._knn_balanced_accuracy_by_k_from_prepared_subsets(
            prepared_subsets=caches, target="confounder", k_values=k_grid, warn_context="oracle")
    bacc["selected_k_confounder"] = _select_k_from_balanced_accuracy(k_values=k_grid, scores=conf_curve)
    return ri, mari, cr, bacc, by_m


def benchmark_sweep(by_m) -> tuple[float, float, float]:
    """croma_auc, croma_min, croma_delta as croma's benchmark derives them from its m sweep
    (scripts/bench/benchmark.py: trapezoid over m divided by the sweep's width, finite minimum,
    last minus first)."""
    ms = sorted(by_m)
    curve = [by_m[m].value for m in ms]
    return (float(np.trapezoid(curve, ms) / (ms[-1] - ms[0])), float(min(c for c in curve if np.isfinite(c))),
            float(curve[-1] - curve[0]))


def run_ours(x, manifest, design, **params):
    """Float32 goes through the public API; float64 calls the stage directly, because
    ``evaluate`` casts features to float32 (and validates paired manifests as one row per sample)."""
    if x.dtype == np.float32 and design == "all":
        return evaluate("croma", x, manifest, design=design, **params)
    return stage.run(x, manifest, design=design, **params)


@pytest.mark.parametrize("name", list(COHORTS))
def test_agrees_with_reference(name):
    x, manifest = COHORTS[name]()
    design = "paired_2x2" if "paired" in name else "all"
    res = run_ours(x, manifest, design)
    row = res.summary.iloc[0]
    ri, mari, cr, bacc, by_m = reference(x, manifest, design, GRID, m_sweep=int(row["m_sweep"]))

    assert row["k"] == ri.k and row["ri"] == ri.value and row["support"] == ri.support
    assert row["f0"] == cr.f0
    assert row["bio_knn_bacc"] == bacc["labels"] and row["conf_knn_bacc"] == bacc["centers"]
    for ours, theirs in (("mari", mari.value), ("tau", mari.tau), ("croma", cr.value), ("q_alpha", cr.q_alpha),
                         ("ltm", cr.ltm_alpha)):
        assert row[ours] == pytest.approx(theirs, abs=1e-6), ours
    assert row["n"] == len(cr.sample_values)

    ps = res.per_sample
    src = cr.occurrence_source_indices  # manifest row of each reference unit
    np.testing.assert_allclose(ps["croma"].to_numpy()[src], cr.sample_values_aligned, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(ps["ri"].to_numpy()[ri.occurrence_source_indices], ri.sample_values_aligned)
    np.testing.assert_allclose(ps["mari"].to_numpy()[mari.occurrence_source_indices], mari.sample_values_aligned,
                               rtol=0, atol=1e-6)
    # issue 42: every further field croma reports, against croma's own values
    assert row["selected_k_confounder"] == bacc["selected_k_confounder"]
    assert (row["ss_undefined_frac"], row["oo_undefined_frac"], row["mixed_undefined_frac"]) == (
        ri.ss_dominated_undefined_frac, ri.oo_dominated_undefined_frac, ri.mixed_undefined_frac)
    assert (row["ri_median"], row["ri_q_alpha"]) == (ri.median_value, ri.q_alpha)
    # the tail mean is summed in sorted order (row-order free), croma's in manifest order: an ulp apart at most
    assert row["ri_ltm"] == pytest.approx(ri.ltm_alpha, rel=0, abs=1e-15)
    for ours, theirs in (("mari_median", mari.median_value), ("mari_q_alpha", mari.q_alpha),
                         ("mari_ltm", mari.ltm_alpha)):
        assert row[ours] == pytest.approx(theirs, abs=1e-6), ours
    assert row["m_sweep"] == min(20, len(by_m)) and sorted(by_m) == list(range(1, int(row["m_sweep"]) + 1))
    for ours, theirs in zip(("croma_auc", "croma_min", "croma_delta"), benchmark_sweep(by_m)):
        assert row[ours] == pytest.approx(theirs, abs=1e-6), ours
    assert by_m[5].value == cr.value  # the sweep's m = 5 is the headline
    codes = ps["undefined"].map({"": 0, "ss_dominated": 1, "oo_dominated": 2, "mixed": 3}).to_numpy()
    np.testing.assert_array_equal(codes[ri.occurrence_source_indices], ri.sample_undefined_types)
    np.testing.assert_array_equal(mari.sample_undefined_types, ri.sample_undefined_types)
    assert row["reason"] == "" and row["n_undefined_m1"] == 0
    end = int(row["m_sweep"])  # below 20 only where a unit has fewer candidates (croma's 1..20 sweep refuses)
    assert row["m_range"] == (f"1..{end}" if end == 20 else
                              f"1..{end} of 1..20 asked (a unit has only {end} cross-group SO or OS candidates)")
    # issue 54: the spreads under both designs (croma writes 0.0 under "all": one scope, one pooled value)
    assert row["croma_std"] == pytest.approx(cr.std, abs=1e-6)
    assert row["ri_std"] == pytest.approx(ri.std, abs=1e-15)
    assert row["mari_std"] == pytest.approx(mari.std, abs=1e-6)
    if design == "paired_2x2":
        assert row["n_subsets"] == cr.n_pairs
        assert row["ri_std"] > 0 and row["mari_std"] > 0 and row["croma_std"] > 0
        assert list(ps.columns) == ["sample_id", "subset", "croma", "d_so", "d_os", "ri", "mari", "undefined",
                                    *PAIRING_COLUMNS]
    else:
        assert ri.std == mari.std == cr.std == 0.0 == row["ri_std"] == row["mari_std"] == row["croma_std"]
        assert list(ps.columns) == ["sample_id", "croma", "d_so", "d_os", "ri", "mari", "undefined", *PAIRING_COLUMNS]


@pytest.mark.parametrize("k", [3, 71])
def test_fixed_k_agrees_with_reference(k):
    """k fixed (the median-k protocol), including a k beyond the tiny subsets' cross-group pools."""
    x, manifest = quartets(seed=3, tiles_per_cell=20)
    ri, mari, _, bacc, _ = reference(x, manifest, "paired_2x2", [k])
    row = stage.run(x, manifest, design="paired_2x2", k=k).summary.iloc[0]
    assert row["k"] == k and row["ri"] == ri.value and row["support"] == ri.support
    assert row["mari"] == pytest.approx(mari.value, abs=1e-6) and row["tau"] == pytest.approx(mari.tau, abs=1e-6)
    assert row["bio_knn_bacc"] == bacc["labels"] and row["conf_knn_bacc"] == bacc["centers"]


def test_selection_curve_and_pinned_tau_agree():
    x, manifest = cohort(seed=6, tiles_per_slide=15)
    ref = reference_manifest(manifest)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mari = MaRI.compute(x, ref, confounder_column="site", k_candidates=GRID, tau=0.5)
    df = normalize_manifest(ref, confounder_column="site", source="oracle")
    cache = BaseRobustnessIndex._prepare_all_rows_neighbor_cache(features=x, df=df, k_values=GRID)
    curve = reference_bacc(cache.labels, cache.neigh_idx, cache.valid_counts, GRID)
    res = evaluate("croma", x, manifest, tau=0.5)
    assert res.params["bio_knn_bacc_by_k"] == {str(k): v for k, v in curve.items()}
    assert res.summary["mari"][0] == pytest.approx(mari.value, abs=1e-6) and res.summary["tau"][0] == 0.5


def test_device_and_block_size_do_not_change_numbers():
    x, manifest = cohort(seed=7, n_confs=3, tiles_per_slide=10)
    a = stage.run(x, manifest, device="cpu")
    b = stage.run(x, manifest, device="cpu", block_size=29)
    pd.testing.assert_frame_equal(a.summary, b.summary, check_exact=False, rtol=1e-6, atol=1e-6)
    pd.testing.assert_frame_equal(a.per_sample, b.per_sample, check_exact=False, rtol=1e-6, atol=1e-6)
