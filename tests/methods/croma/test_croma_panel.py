"""Panel analyses: median-k protocol, Pareto frontier, mean ranks, m / α sensitivity, rank
agreement (croma.md §3.3–3.4, Tables 7–9; conventions A.5 "Protocols")."""
import warnings

import numpy as np
import pandas as pd
import pytest
from croma import CRoMa
from croma_cohorts import cohort, reference_manifest

from robustbench_fm.methods.croma import panel, stage


def encoders():
    """Three 'encoders' of the same 240 rows: the label signal weakens from e1 to e3."""
    out = {}
    for i, shift in enumerate((0.9, 0.5, 0.2)):
        x, manifest = cohort(slides_per_cell=4, tiles_per_slide=15, label_shift=shift, seed=11 + i, shuffle=False)
        out[f"e{i + 1}"] = x
    return out, manifest


@pytest.mark.parametrize("k_stars, expected", [([11, 21, 5, 71], 11), ([3], 3), ([1, 9, 5], 5), ([7, 7, 61], 7)])
def test_median_k_is_the_lower_median(k_stars, expected):
    assert panel.median_k(k_stars) == expected


@pytest.fixture(scope="module")
def features():
    return encoders()


def test_median_k_protocol_scores_every_encoder_at_the_shared_k(features):
    feats, manifest = features
    table = panel.evaluate_panel(feats, manifest)
    shared = panel.median_k(table["k_star"])
    assert (table["k"] == shared).all() and list(table["encoder"]) == ["e1", "e2", "e3"]
    for name, x in feats.items():
        alone = stage.run(x, manifest, k=shared).summary.iloc[0]
        row = table.set_index("encoder").loc[name]
        assert row["k_star"] == stage.run(x, manifest).summary["k"][0]
        for col in ("ri", "mari", "tau", "croma", "ltm", "bio_knn_bacc", "conf_knn_bacc"):
            assert row[col] == pytest.approx(alone[col], abs=1e-12), (name, col)
    k_star = panel.evaluate_panel(feats, manifest, protocol="k-star")
    assert (k_star["k"] == k_star["k_star"]).all()


def test_pareto_front_rings_the_undominated():
    table = pd.DataFrame({"encoder": list("ABCDE"), "croma": [0.20, 0.20, 0.16, 0.10, 0.16],
                          "ltm": [-0.11, -0.20, -0.05, -0.30, -0.05]})
    # B is dominated by A (equal median, worse tail); D by everyone; C and E tie and both survive
    assert panel.pareto_front(table).tolist() == [True, False, True, False, True]
    ranks = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": [3.0, 1.0, 3.5]})
    assert panel.pareto_front(ranks, "a", "b", maximize=False).tolist() == [True, True, False]


def test_mean_ranks_average_within_benchmark_ranks():
    b1 = pd.DataFrame({"encoder": ["x", "y", "z", "only1"], "croma": [0.3, 0.1, 0.1, 0.9],
                       "ltm": [-0.1, -0.3, -0.2, 0]})
    b2 = pd.DataFrame({"encoder": ["z", "y", "x"], "croma": [0.5, 0.4, 0.2], "ltm": [-0.4, -0.1, -0.2]})
    out = panel.mean_ranks({"b1": b1, "b2": b2}).set_index("encoder")
    assert list(out.index) == ["x", "y", "z"]  # encoders present in every benchmark
    assert out["croma_rank_b1"].tolist() == [1.0, 2.5, 2.5] and out["croma_rank_b2"].tolist() == [3.0, 2.0, 1.0]
    assert out["mean_croma_rank"].tolist() == [2.0, 2.25, 1.75]
    assert out["mean_ltm_rank"].tolist() == [1.5, 2.0, 2.5]
    assert out["pareto"].tolist() == [True, False, True]


def test_sweeps_match_the_stage_and_the_reference(features):
    feats, manifest = features
    preps = panel.prepare_panel(feats, manifest, m=20)
    by_m, by_alpha = panel.sweeps(preps)
    assert len(by_m) == 3 * 20 and len(by_alpha) == 3 * 3
    x = feats["e2"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = CRoMa.compute(x, reference_manifest(manifest), confounder_column="site", m=[1, 5, 20])
    for m in (1, 5, 20):
        ours = by_m[(by_m.encoder == "e2") & (by_m.m == m)].iloc[0]
        assert ours["croma"] == pytest.approx(ref[m].value, abs=1e-6)
        assert ours["ltm"] == pytest.approx(ref[m].ltm_alpha, abs=1e-6) and ours["f0"] == ref[m].f0
    for alpha in (0.05, 0.20):
        row = stage.run(x, manifest, alpha=alpha).summary.iloc[0]
        ours = by_alpha[(by_alpha.encoder == "e2") & (by_alpha.alpha == alpha)].iloc[0]
        assert ours["ltm"] == pytest.approx(row["ltm"], abs=1e-12)


def test_sensitivity_tables():
    ms = np.arange(1, 21)
    # four encoders; their order flips between m = 1 and m = 20 only for the last two
    by_m = pd.DataFrame([{"encoder": e, "m": m, "croma": base + (0.02 * m if e == "d" else 0)}
                         for e, base in zip("abcd", (0.3, 0.2, -0.1, -0.15)) for m in ms])
    row = panel.m_sensitivity(by_m)
    assert row["n"] == 4 and row["rho_m1_m5"] == pytest.approx(0.8) and row["rho_m1_m20"] == pytest.approx(0.4)
    assert (row["n_negative_min"], row["n_negative_max"]) == (1, 2)
    by_alpha = pd.DataFrame({"encoder": list("abc") * 3, "alpha": np.repeat([0.05, 0.10, 0.20], 3),
                             "ltm": [-.3, -.2, -.1, -.2, -.1, -.05, -.1, -.15, -.02]})
    row = panel.alpha_sensitivity(by_alpha)
    assert row["rho_a0.05_a0.1"] == pytest.approx(1.0) and row["rho_a0.1_a0.2"] == pytest.approx(0.5)


def test_rank_agreement_within_and_across_benchmarks():
    table = pd.DataFrame({"encoder": list("abcd"), "ri": [.9, .8, .7, .6], "mari": [.95, .85, .75, .65],
                          "croma": [.1, .2, .3, .4]})
    assert panel.metric_agreement(table) == pytest.approx({"n": 4, "rho_ri_mari": 1.0, "rho_croma_ri": -1.0,
                                                           "rho_croma_mari": -1.0})
    other = pd.DataFrame({"encoder": list("dcbx"), "croma": [.5, .4, .3, .9]})
    out = panel.benchmark_agreement({"one": table, "two": other})
    assert out.to_dict("records") == [{"a": "one", "b": "two", "n": 3, "rho": pytest.approx(1.0)}]


def reference_typed_ranks(x, manifest):
    """Brute force of the reference's Table 12 definition (croma's typed_neighbor_rank_experiment.py):
    sort each row's cosine distances (stable), drop self, and read the 1-indexed position of the
    first cross-slide SO / OS sample; same-slide samples before it count."""
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    dist = 1.0 - unit @ unit.T
    lab, con, grp = (pd.factorize(manifest[c])[0] for c in ("bio_label", "site", "slide_id"))
    out = np.full((len(x), 2), np.nan)
    for i in range(len(x)):
        order = [j for j in np.argsort(dist[i], kind="stable") if j != i]
        for t, typed in enumerate(((lab == lab[i]) & (con != con[i]), (lab != lab[i]) & (con == con[i]))):
            hits = [pos for pos, j in enumerate(order, start=1) if typed[j] and grp[j] != grp[i]]
            out[i, t] = hits[0] if hits else np.nan
    return out


def test_typed_ranks_equal_the_reference_positions_among_all_other_samples():
    """Table 12: same-slide tiles ahead of the nearest typed candidate count, so on
    60 tiles per slide the ranks are far above a cross-slide-only count."""
    from robustbench_fm.methods.croma.panel import typed_ranks

    x, manifest = cohort(slides_per_cell=3, tiles_per_slide=60, slide_shift=1.0, seed=1, dtype=np.float64)
    got = typed_ranks(x, manifest, block_size=97, device="cpu")
    ref = reference_typed_ranks(x, manifest)
    np.testing.assert_array_equal(got[["rank_so", "rank_os"]].to_numpy(), ref)
    np.testing.assert_array_equal(got["rank_typed"], ref.min(axis=1))
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    sim = unit @ unit.T
    grp, lab, con = (manifest[c].to_numpy() for c in ("slide_id", "bio_label", "site"))
    cross_only = [(sim[i][grp != grp[i]] > sim[i][(grp != grp[i]) & (lab == lab[i]) & (con != con[i])].max()).sum() + 1
                  for i in range(len(x))]
    assert np.median(got["rank_so"]) > np.median(cross_only) + 20  # the same-slide shell counts


def test_typed_ranks_do_not_depend_on_row_order_and_ties_take_the_min_rank():
    from robustbench_fm.methods.croma.panel import typed_ranks

    _, manifest = cohort(slides_per_cell=2, tiles_per_slide=8, seed=3, dtype=np.float64)
    rng = np.random.default_rng(3)  # unit rows of four ±0.5 entries: every cosine is an exact multiple of 1/4
    x = np.zeros((len(manifest), 8))
    for row in x:
        row[rng.choice(8, 4, replace=False)] = rng.choice([-0.5, 0.5], 4)
    got = typed_ranks(x, manifest, device="cpu")
    perm = np.random.default_rng(0).permutation(len(x))
    again = typed_ranks(x[perm], manifest.iloc[perm].reset_index(drop=True), device="cpu").set_index("sample_id")
    pd.testing.assert_frame_equal(again.loc[got["sample_id"]].reset_index(), got)
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    dist = 1.0 - unit @ unit.T
    lab, con, grp = (manifest[c].to_numpy() for c in ("bio_label", "site", "slide_id"))
    for i in range(len(x)):  # competition (min) rank: 1 + other samples strictly closer, whatever their row
        typed = (lab == lab[i]) & (con != con[i]) & (grp != grp[i])
        others = np.arange(len(x)) != i
        if dist[i][typed].min() == 0:  # the reference drops the anchor (d_SO = 0)
            assert np.isnan(got.at[i, "rank_so"])
            continue
        assert got.at[i, "rank_so"] == (dist[i][others] < dist[i][typed].min()).sum() + 1


def reference_defined(x, manifest):
    """The anchors croma's typed_neighbor_rank_experiment.py keeps, transcribed: float32 rows
    scaled by ``1 / (norm + 1e-12)``, D = 1 − X Xᵀ, nearest cross-slide SO / OS distances, and
    ``defined = np.isfinite(os_d / so_d) & (so_d > 0)``."""
    X = x.astype(np.float32)
    X = X / (np.linalg.norm(X, axis=1, keepdims=True) + 1e-12)
    D = 1.0 - X @ X.T
    lab, con, grp = (pd.factorize(manifest[c])[0] for c in ("bio_label", "site", "slide_id"))
    valid = (grp[:, None] != grp[None, :]) & ~np.eye(len(x), dtype=bool)
    so = valid & (lab[:, None] == lab[None, :]) & (con[:, None] != con[None, :])
    os_ = valid & (lab[:, None] != lab[None, :]) & (con[:, None] == con[None, :])
    so_d = np.where(so.any(1), np.where(so, D, np.inf).min(1), np.nan)
    os_d = np.where(os_.any(1), np.where(os_, D, np.inf).min(1), np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.isfinite(os_d / so_d) & (so_d > 0)


def test_typed_ranks_drop_anchors_whose_nearest_so_match_is_at_distance_zero():
    """the reference drops anchors with d_SO = 0 (a copy of the anchor under the
    other confounder value); so do the typed ranks (NaN in every column, out of the medians).
    Rows of four ±0.5 entries have norm 1 exactly, so the reference's float32 distances between
    copies are exactly 0 and its kept set is well defined."""
    from robustbench_fm.methods.croma.panel import typed_ranks

    _, manifest = cohort(slides_per_cell=2, tiles_per_slide=8, seed=5, dtype=np.float64)
    rng = np.random.default_rng(5)
    x = np.zeros((len(manifest), 8))
    for row in x:
        row[rng.choice(8, 4, replace=False)] = rng.choice([-0.5, 0.5], 4)
    site = manifest["site"].to_numpy()
    a, b = np.flatnonzero((manifest["bio_label"] == "class0").to_numpy() & (site == "centre0"))[:5], \
        np.flatnonzero((manifest["bio_label"] == "class0").to_numpy() & (site == "centre1"))[:5]
    x[b] = x[a]  # five SO copies: each of these ten anchors has d_SO = 0
    keep = reference_defined(x, manifest)
    assert (~keep).sum() >= 10 and not keep[a].any() and not keep[b].any()
    got = typed_ranks(x, manifest, block_size=13, device="cpu")
    np.testing.assert_array_equal(got["rank_so"].notna().to_numpy(), keep)
    assert (got["rank_os"].notna() == got["rank_so"].notna()).all()
    assert (got["rank_typed"].notna() == got["rank_so"].notna()).all()
