"""Exact duplicate feature rows tie exactly: inside one matrix product two
bitwise-identical candidate rows can get different similarities, so the scope pass computes the
products between distinct vectors only and expands them (methods/croma/knn.py, "Identical rows
are one vector"). The neighbour lists, RI and MaRI then equal a brute force of the documented
rule (similarity descending, then sample_id) for every row order, in float32 and float64."""
import numpy as np
import pytest
import torch
from croma_cohorts import cohort

from robustbench_fm.core.neighbors import l2_normalize
from robustbench_fm.methods.croma import stage
from robustbench_fm.methods.croma.knn import scope_neighbours, tie_keys

K = 6


def duplicated(dtype, seed=0):
    """A quantised cohort (3 decimals: the products are not exact in binary) in which 120 of 320
    rows are copies of other rows, most of them in another slide, cell or both."""
    x, manifest = cohort(slides_per_cell=4, tiles_per_slide=20, dim=48, seed=seed, dtype=np.float64)
    x = np.round(x * 1000) / 1000
    rng = np.random.default_rng(seed)
    src = rng.choice(len(x), 60, replace=False)
    x[rng.choice(np.setdiff1d(np.arange(len(x)), src), 120, replace=False)] = np.repeat(x[src], 2, axis=0)
    return x.astype(dtype), manifest


def brute_force(x, manifest, k):
    """Neighbour lists (sample ids) and pooled RI / MaRI at k: each distinct vector pair's
    similarity computed once (float64 on the unit rows; 1 between copies), candidates of other slides sorted by
    (similarity descending, sample_id); τ = median typed-slot cosine distance."""
    unit = l2_normalize(x, dtype=None).astype(np.float64)
    vectors, vid = np.unique(unit, axis=0, return_inverse=True)
    between = vectors @ vectors.T
    np.fill_diagonal(between, 1.0)  # a vector and itself: cosine exactly 1
    sims = between[vid.ravel()][:, vid.ravel()]
    lab, con, grp, ids = (manifest[c].to_numpy() for c in ("bio_label", "site", "slide_id", "sample_id"))
    lists, so, dist = [], [], []
    for i in range(len(x)):
        cand = np.flatnonzero(grp != grp[i])
        top = cand[np.lexsort((ids[cand], -sims[i, cand]))][:k]
        lists.append(ids[top])
        typed = (lab[top] == lab[i]) != (con[top] == con[i])
        so += list((lab[top] == lab[i])[typed])
        dist += list(np.clip(1 - sims[i, top], 0, 2)[typed])
    so, dist = np.array(so), np.array(dist)
    w = np.exp(-dist / np.median(dist))
    return np.array(lists), so.mean(), w[so].sum() / w.sum()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_duplicate_rows_tie_exactly_for_every_row_order(dtype):
    x, manifest = duplicated(dtype)
    want_lists, want_ri, want_mari = brute_force(x, manifest, K)
    assert len(np.unique(x, axis=0)) == len(x) - 120
    first = None
    for seed in range(4):
        perm = np.random.default_rng(seed).permutation(len(x)) if seed else np.arange(len(x))
        xp, mp = x[perm], manifest.iloc[perm].reset_index(drop=True)
        lab, con, grp = (np.unique(mp[c].to_numpy(), return_inverse=True)[1] for c in ("bio_label", "site", "slide_id"))
        nb = scope_neighbours(torch.as_tensor(l2_normalize(xp, dtype=None)), lab, con, grp, K, 3, block_size=37,
                              tie_key=tie_keys(mp["sample_id"]))
        got = mp["sample_id"].to_numpy()[nb.idx]
        np.testing.assert_array_equal(got, want_lists[perm])
        summary = stage.run(xp, mp, k=K, device="cpu", block_size=64).summary.iloc[0]
        assert summary["ri"] == want_ri
        assert summary["mari"] == pytest.approx(want_mari, rel=1e-6 if dtype == np.float32 else 1e-12)
        if first is None:
            first = summary
        assert summary["ri"] == first["ri"] and summary["mari"] == first["mari"]  # bitwise, every order
        assert summary["tau"] == first["tau"] and summary["croma"] == first["croma"]


def test_identical_rows_get_identical_distances():
    """Every row of a vector sees the same distance to each candidate, whatever the tiles."""
    x, manifest = duplicated(np.float32, seed=1)
    lab, con, grp = (np.unique(manifest[c].to_numpy(), return_inverse=True)[1]
                     for c in ("bio_label", "site", "slide_id"))
    nb = scope_neighbours(torch.as_tensor(l2_normalize(x)), lab, con, grp, 20, 3, block_size=29,
                          tie_key=tie_keys(manifest["sample_id"]))
    pos = {tuple(r): i for i, r in enumerate(x)}
    rep = np.array([pos[tuple(r)] for r in x])  # each row's last identical row
    for i in range(len(x)):
        d = dict(zip(rep[nb.idx[i]], nb.dist[i]))
        for j, dj in zip(rep[nb.idx[i]], nb.dist[i]):
            assert d[j] == dj
