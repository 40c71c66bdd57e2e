"""Exact distance ties at the k boundary: candidates at the same cosine distance
are taken in sample_id order, so RI, MaRI, τ, support, k* and the kNN accuracies do not depend on
the manifest's row order (the reference leaves such ties to sklearn's unstable argpartition)."""
import numpy as np
import pandas as pd
import pytest
from croma_cohorts import cohort

from robustbench_fm.methods.croma import stage

EXACT = ["ri", "tau", "k", "support", "croma", "f0", "q_alpha", "bio_knn_bacc", "conf_knn_bacc", "n"]


def quantised(seed=3):
    """Unit rows of four ±0.5 entries among 8: every cosine is an exact multiple of 1/4, so most
    units have many candidates tied at their k-th distance."""
    _, manifest = cohort(slides_per_cell=3, tiles_per_slide=10, seed=seed, dtype=np.float64)
    rng = np.random.default_rng(seed)
    x = np.zeros((len(manifest), 8))
    for row in x:
        row[rng.choice(8, 4, replace=False)] = rng.choice([-0.5, 0.5], 4)
    return x, manifest


def brute_force_ri(x, manifest, k):
    """Pooled RI at k with the documented tie rule: cross-slide candidates sorted by (cosine
    distance, sample_id)."""
    dist = 1 - x @ x.T  # rows are unit vectors already; exact for these entries
    lab, con, grp, ids = (manifest[c].to_numpy() for c in ("bio_label", "site", "slide_id", "sample_id"))
    n_so = n_os = 0
    for i in range(len(x)):
        cand = np.flatnonzero(grp != grp[i])
        top = cand[np.lexsort((ids[cand], dist[i, cand]))][:k]
        n_so += int(((lab[top] == lab[i]) & (con[top] != con[i])).sum())
        n_os += int(((lab[top] != lab[i]) & (con[top] == con[i])).sum())
    return n_so / (n_so + n_os)


@pytest.mark.parametrize("k", [3, 11])
def test_ri_follows_the_sample_id_tie_rule(k):
    x, manifest = quantised()
    dist = 1 - x @ x.T
    grp = manifest["slide_id"].to_numpy()
    kth = [np.sort(dist[i, grp != grp[i]]) for i in range(len(x))]
    assert sum(d[k - 1] == d[k] for d in kth) > len(x) / 2  # most units have a tie across their k boundary
    got = stage.run(x, manifest, k=k, device="cpu").summary["ri"][0]
    assert got == brute_force_ri(x, manifest, k)


def test_scores_do_not_depend_on_row_order_under_ties():
    x, manifest = quantised()
    first = stage.run(x, manifest, device="cpu", block_size=16)
    for seed in (0, 1):
        perm = np.random.default_rng(seed).permutation(len(x))
        again = stage.run(x[perm], manifest.iloc[perm].reset_index(drop=True), device="cpu", block_size=16)
        for col in EXACT:
            assert again.summary[col][0] == first.summary[col][0], col
        for col in ("mari", "ltm"):  # sums over the units in another order: equal to rounding
            assert again.summary[col][0] == pytest.approx(first.summary[col][0], rel=1e-12), col
        mine = again.per_sample.set_index("sample_id").loc[first.per_sample["sample_id"]].reset_index()
        pd.testing.assert_frame_equal(mine, first.per_sample, check_exact=False, rtol=1e-12)
