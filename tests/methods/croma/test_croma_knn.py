"""CRoMa's scope pass on the shared engine against a float64 brute force (croma_conventions.md
A.1, A.3, A.7): cross-group top-k lists and distances, typed m-nearest distances, the tiny-N
quirk, whatever the tile size."""
import numpy as np
import pytest
import torch
from croma_cohorts import cohort

from robustbench_fm.core.neighbors import l2_normalize
from robustbench_fm.methods.croma.knn import scope_neighbours


def codes(manifest):
    return [np.unique(manifest[c].to_numpy(), return_inverse=True)[1] for c in ("bio_label", "site", "slide_id")]


@pytest.mark.parametrize("block_size", [4096, 13, 4])
def test_scope_lists_equal_brute_force(block_size):
    x, manifest = cohort(slides_per_cell=3, tiles_per_slide=7, dim=10, seed=3, dtype=np.float64)
    lab, con, grp = codes(manifest)
    unit = l2_normalize(x, dtype=None)
    kmax, m = 11, 4
    nb = scope_neighbours(torch.as_tensor(unit), lab, con, grp, kmax, m, block_size)
    dist = np.clip(1 - unit @ unit.T, 0, 2)
    cross = grp[:, None] != grp[None, :]
    for i in range(len(x)):
        pool = np.flatnonzero(cross[i])
        want = np.sort(dist[i, pool])[:kmax]
        np.testing.assert_allclose(nb.dist[i], want, rtol=0, atol=1e-15)
        assert nb.count[i] == kmax and (grp[nb.idx[i]] != grp[i]).all()
        np.testing.assert_allclose(dist[i, nb.idx[i]], nb.dist[i], rtol=0, atol=1e-15)
        so = pool[(lab[pool] == lab[i]) & (con[pool] != con[i])]
        os_ = pool[(lab[pool] != lab[i]) & (con[pool] == con[i])]
        np.testing.assert_allclose(nb.so_dist[i], np.sort(dist[i, so])[:m], rtol=0, atol=1e-15)
        np.testing.assert_allclose(nb.os_dist[i], np.sort(dist[i, os_])[:m], rtol=0, atol=1e-15)


def test_tiny_scope_drops_the_farthest_sample_and_pads():
    """Cross-group pool (6) no larger than kmax (8): the unit's single farthest other sample is
    never seen (conventions A.3, tiny-N edge case; it only matters when it is cross-group); the
    rest of the list is padded with −1 / inf."""
    x, manifest = cohort(slides_per_cell=1, tiles_per_slide=2, dim=5, seed=1, dtype=np.float64)
    lab, con, grp = codes(manifest)
    unit = l2_normalize(x, dtype=None)
    nb = scope_neighbours(torch.as_tensor(unit), lab, con, grp, 8, 1, block_size=3)
    dist = np.clip(1 - unit @ unit.T, 0, 2)
    dropped = 0
    for i in range(len(x)):
        others = np.flatnonzero(np.arange(len(x)) != i)
        farthest = others[np.argmax(dist[i, others])]
        pool = [j for j in others if grp[j] != grp[i] and j != farthest]
        dropped += grp[farthest] != grp[i]
        c = len(pool)
        assert nb.count[i] == c and c in (5, 6)
        assert set(nb.idx[i, :c]) == set(pool) and (nb.idx[i, c:] == -1).all() and np.isinf(nb.dist[i, c:]).all()
        np.testing.assert_allclose(nb.dist[i, :c], np.sort(dist[i, pool]), rtol=0, atol=1e-15)
    assert dropped > 0  # the quirk really removed a cross-group candidate somewhere


@pytest.mark.parametrize("block_size", [4096, 13])
def test_typed_width_keeps_the_typed_candidates_with_their_rows(block_size):
    """``typed_width`` (issue 57: the influence's first search read off the scope pass): each row's
    typed_width nearest SO and OS candidates of other groups, similarities descending with their rows
    (−inf / −1 past the candidates), the pass's float32 products; the m nearest distances unchanged.
    None where the scope has identical rows."""
    x, manifest = cohort(slides_per_cell=2, tiles_per_slide=7, dim=10, seed=3)  # float32
    lab, con, grp = codes(manifest)
    unit = torch.as_tensor(l2_normalize(x))
    width, m = 25, 4
    plain = scope_neighbours(unit, lab, con, grp, 11, m, block_size)
    nb = scope_neighbours(unit, lab, con, grp, 11, m, block_size, typed_width=width)
    assert plain.typed is None
    np.testing.assert_array_equal(nb.so_dist, plain.so_dist)
    np.testing.assert_array_equal(nb.os_dist, plain.os_dist)
    sims = (unit.double() @ unit.double().T).numpy()
    for (got, rows), same_lab in zip(nb.typed, (True, False)):
        assert got.shape == rows.shape == (len(x), width)
        for i in range(len(x)):
            pool = np.flatnonzero((grp != grp[i]) & ((lab == lab[i]) == same_lab) & ((con == con[i]) != same_lab))
            n = min(width, len(pool))
            assert (np.diff(got[i, :n]) <= 0).all() and len(set(rows[i, :n])) == n and set(rows[i, :n]) <= set(pool)
            np.testing.assert_allclose(got[i, :n], np.sort(sims[i, pool])[::-1][:n], rtol=0, atol=1e-6)
            np.testing.assert_allclose(sims[i, rows[i, :n]], got[i, :n], rtol=0, atol=1e-6)
            assert np.isneginf(got[i, n:]).all() and (rows[i, n:] == -1).all()
    assert any(len(row[row >= 0]) < width for row in nb.typed[0][1])  # some rows have fewer than width
    x[2] = x[9]
    assert scope_neighbours(torch.as_tensor(l2_normalize(x)), lab, con, grp, 11, m, block_size,
                            typed_width=width).typed is None
