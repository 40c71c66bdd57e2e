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
