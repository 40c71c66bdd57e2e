"""CANDOR's shortlist (methods/candor/shortlist.py): every way it answers gives the brute force's
c(x), bit for bit where the similarities are exact; copies of a vector tie exactly."""
import numpy as np
import pytest
import torch

from robustbench_fm.core import neighbors
from robustbench_fm.core.neighbors import l2_normalize, mean_topk_similarity
from robustbench_fm.methods.candor import shortlist as csl
from robustbench_fm.methods.candor import stage as candor
from robustbench_fm.methods.candor.shortlist import Shortlist


def test_the_shortlist_and_its_matrix_limits_are_candors():
    """Issue 56 item 5: CANDOR's shortlist and the limits of its held matrix live in
    methods/candor/shortlist.py; core.neighbors keeps the engine it is built on and holds neither, so
    a test that still patched ``core.neighbors.MATRIX_BYTES`` fails instead of silently testing nothing."""
    for name in ("Shortlist", "MATRIX_BYTES", "MATRIX_TILE"):
        assert not hasattr(neighbors, name), name
    assert Shortlist.__module__ == "robustbench_fm.methods.candor.shortlist"
    assert candor.Shortlist is Shortlist and candor.MATRIX_BYTES == csl.MATRIX_BYTES == 1 << 30
    assert csl.MATRIX_TILE == 512  # issue 57: 53% of the products at 8,000 rows instead of 62.5%


def brute_mean_topk(x, queries, cands, k):
    sims = x[queries].astype(np.float64) @ x[cands].astype(np.float64).T
    sims[queries[:, None] == cands[None, :]] = -np.inf
    return np.sort(sims, axis=1)[:, ::-1][:, :k].mean(axis=1)


@pytest.mark.parametrize("size", [0, 3, 40, 1000])
def test_shortlist_answers_every_subset_exactly(size):
    """The first k shortlist members in R are R's k nearest; short lists fall back to exact search."""
    rng = np.random.default_rng(1)
    x = l2_normalize(rng.normal(size=(400, 10)))
    rows = np.sort(rng.choice(400, 250, replace=False))
    shortlist = Shortlist(torch.as_tensor(x), rows, size=size, block_size=37)
    for frac in (0.02, 0.3, 1.0):  # rare subsets force the fallback, common ones do not
        cands = np.sort(rng.choice(rows, max(6, int(frac * len(rows))), replace=False))
        queries = rng.choice(rows, 60, replace=False)
        np.testing.assert_allclose(shortlist.mean_topk(queries, cands, 5),
                                   brute_mean_topk(x, queries, cands, 5), rtol=0, atol=1e-6)
        np.testing.assert_allclose(shortlist.mean_topk(queries, cands, 5),
                                   mean_topk_similarity(torch.as_tensor(x), queries, cands, 5), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="shortlist's rows"):
        shortlist.mean_topk(np.setdiff1d(np.arange(400), rows)[:1], rows, 5)


@pytest.mark.parametrize("n, block_size, d", [(257, 64, 7), (97, 256, 1000), (513, 256, 384)])
def test_copies_of_a_vector_get_bitwise_equal_scores(n, block_size, d):
    """Issue 42 item 7: rows with the same bytes are one vector (``distinct_rows``); given their
    ids, the shortlist and the exact search compute products between distinct vectors, so every
    copy gets the very same c(x) (bitwise), equal to a float64 brute force on the distinct vectors
    (a vector and itself: exactly 1). Without ``vectors`` (the old path) 97 copy groups of these
    cases differed in the last bits (BLAS rounds each output position its own way)."""
    from robustbench_fm.core.neighbors import distinct_rows

    rng = np.random.default_rng(n + d)
    base = rng.normal(size=(20, d)).astype(np.float32)
    vid = rng.integers(0, 20, size=n)
    unit = l2_normalize(base[vid])
    first, vectors = distinct_rows(unit)
    assert len(first) == len(np.unique(vid)) == len(set(zip(vid, vectors)))  # the same partition
    assert (unit[first[vectors]] == unit).all()
    x = torch.as_tensor(unit)
    rows, bank = np.arange(n), np.sort(rng.choice(n, size=n // 3, replace=False))
    ref_unit = base.astype(np.float64) / np.linalg.norm(base.astype(np.float64), axis=1, keepdims=True)
    sims = ref_unit @ ref_unit.T
    np.fill_diagonal(sims, 1.0)
    ref = np.array([np.sort([sims[vid[i], vid[j]] for j in bank if j != i])[::-1][:5].mean() for i in rows])
    in_bank = np.isin(rows, bank)
    for got in (Shortlist(x, rows, 8, block_size, vectors=vectors).mean_topk(rows, bank, 5),
                Shortlist(x, rows, 256, block_size, vectors=vectors).mean_topk(rows, bank, 5),
                mean_topk_similarity(x, rows, bank, 5, block_size, vectors=vectors)):
        np.testing.assert_allclose(got, ref, atol=1e-6)
        for v in np.unique(vid):
            for member in (True, False):
                same = got[(vid == v) & (in_bank == member)]
                assert len(np.unique(same)) <= 1, (v, member, same)


def exact_unit_rows(n, d, rng):
    """Rows with exactly four ones scaled by 1/2: unit norm, every similarity a multiple of 1/4, so
    any order of the float additions gives the same bits."""
    x = np.zeros((n, d), np.float32)
    for row in x:
        row[rng.choice(d, 4, replace=False)] = 0.5
    return x


def test_shortlist_paths_give_identical_means(monkeypatch):
    """Issue 44: every way a :class:`Shortlist` answers gives the same c(x), bit for bit: read off
    the held matrix (a candidate set too sparse for the shortlist), the first hits in the shortlist,
    the matrix for the rows whose scan finds fewer than k, and, with the matrix not held
    (``MATRIX_BYTES`` 0), the tile pass with exact searches for short rows. Equal to the brute force."""
    rng = np.random.default_rng(3)
    x = exact_unit_rows(500, 12, rng)
    rows = np.sort(rng.choice(500, 400, replace=False))
    held = Shortlist(torch.as_tensor(x), rows, size=80, block_size=64)
    assert held.matrix is not None
    answered = {"matrix": [], "hits": []}  # rows each way answered, per call
    for name, method in (("matrix", "_matrix_means"), ("hits", "_first_hits")):
        real = getattr(Shortlist, method)
        monkeypatch.setattr(Shortlist, method, lambda self, local, *a, _real=real, _n=name: (
            answered[_n].append(len(local)), _real(self, local, *a))[1])
    monkeypatch.setattr(csl, "MATRIX_BYTES", 0)
    tiles = Shortlist(torch.as_tensor(x), rows, size=80, block_size=64)
    assert tiles.matrix is None
    with_zero = rows[x[rows, 0] > 0]  # a set the rows without coordinate 0 meet late in their lists
    for cands, queries in ((np.sort(rng.choice(rows, 8, replace=False)), rng.choice(rows, 200, replace=False)),
                           (np.sort(rng.choice(rows, 400, replace=False)), rng.choice(rows, 200, replace=False)),
                           (with_zero, rows[x[rows, 0] == 0])):
        want = brute_mean_topk(x, queries, cands, 5)
        for shortlist in (held, tiles):
            np.testing.assert_array_equal(shortlist.mean_topk(queries, cands, 5), want)
    assert 200 in answered["matrix"]  # the sparse set: every row off the matrix
    assert any(0 < n < (x[rows, 0] == 0).sum() for n in answered["matrix"])  # rows short after their first hits
    assert answered["hits"]


def test_row_parallel_pieces_give_the_same_shortlist(monkeypatch):
    """Issue 44: the shortlist's bookkeeping runs in row pieces on threads with torch's intra-op
    threads off (:func:`neighbors.row_parallel`); the shortlist and every c(x) equal those of one
    piece, bit for bit, and the thread count in force is restored after."""
    rng = np.random.default_rng(5)
    x = torch.as_tensor(exact_unit_rows(300, 12, rng))
    rows = np.sort(rng.choice(300, 250, replace=False))
    queries = rng.choice(rows, 120, replace=False)
    sets = [np.sort(rng.choice(rows, n, replace=False)) for n in (6, 60, 250)]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        whole = Shortlist(x, rows, size=40, block_size=64)
        want = [whole.mean_topk(queries, cands, 5) for cands in sets]
        pieces = []
        real = neighbors.row_parallel
        monkeypatch.setattr(csl, "row_parallel", lambda fn, n, device, rows=7: (
            pieces.append(-(-n // rows)), real(fn, n, device, rows))[1])
        split = Shortlist(x, rows, size=40, block_size=64)
        got = [split.mean_topk(queries, cands, 5) for cands in sets]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    assert max(pieces) > 10  # the work was split
    assert torch.equal(split.values, whole.values) and torch.equal(split.members, whole.members)
    for g, w, cands in zip(got, want, sets):
        np.testing.assert_array_equal(g, w)
        np.testing.assert_array_equal(g, brute_mean_topk(x.numpy(), queries, cands, 5))


def test_cpu_first_hits_and_column_reads_equal_the_tensor_ways(monkeypatch):
    """Issue 44: on the CPU the shortlist's first hits run in numpy (a running count of members) and a
    sparse set asked about most rows is read down the matrix's columns (:func:`neighbors.topk_columns`);
    both give the tensor ways' sums and means bit for bit, and the brute force."""
    rng = np.random.default_rng(7)
    x = exact_unit_rows(600, 14, rng)
    rows = np.sort(rng.choice(600, 560, replace=False))
    sl = Shortlist(torch.as_tensor(x), rows, size=60, block_size=128)
    assert sl.matrix is not None
    for n_cands in (60, 200, 560):
        cands = np.sort(rng.choice(rows, n_cands, replace=False))
        local = sl._local(rng.choice(rows, 300, replace=False))
        in_np = np.zeros(600, bool)
        in_np[cands] = True
        for width in (20, 60):
            sums, found = sl._first_hits(local, in_np, 5, width)
            t_sums, t_found = sl._first_hits(torch.as_tensor(local), torch.as_tensor(in_np), 5, width)
            np.testing.assert_array_equal(found, t_found)
            np.testing.assert_array_equal(sums[found == 5], t_sums[found == 5])
    cands = np.sort(rng.choice(rows, 100, replace=False))  # first scan wider than the shortlist: the matrix
    everyone = rng.permutation(rows)
    keyed = []
    real_keyed = neighbors.topk_columns_keyed
    monkeypatch.setattr(csl, "topk_columns_keyed", lambda *a: (keyed.append(a[0].shape), real_keyed(*a))[1])
    by_keys = sl._matrix_means(sl._local(everyone), sl._local(cands), 5)
    assert keyed and keyed[0][0] == 100  # the candidates' rows, by keys (candor4)
    monkeypatch.setattr(csl, "topk_columns_keyed", lambda *a: None)  # declined: the tensor way
    columns = []
    real = neighbors.topk_columns
    monkeypatch.setattr(csl, "topk_columns", lambda *a: (columns.append(a[0].shape), real(*a))[1])
    by_columns = sl._matrix_means(sl._local(everyone), sl._local(cands), 5)
    np.testing.assert_array_equal(by_keys, by_columns)
    assert columns and columns[0][0] == 112  # 100 candidates' rows padded to blocks of 16
    monkeypatch.setattr(csl, "COLUMN_BLOCK", 10**6)  # too few blocks: the rows' way
    by_rows = sl._matrix_means(sl._local(everyone), sl._local(cands), 5)
    np.testing.assert_array_equal(by_columns, by_rows)
    np.testing.assert_array_equal(by_columns, brute_mean_topk(x, everyone, cands, 5))
    np.testing.assert_array_equal(sl.mean_topk(everyone, cands, 5), by_columns)


def test_keyed_shortlist_equals_the_topk_rows_shortlist(monkeypatch):
    """Issue 44 (candor4): on the CPU the held matrix's shortlist comes from :func:`neighbors.topk_rows_keyed`;
    its values equal :func:`topk_rows`' bitwise and every c(x) it answers equals the brute force."""
    rng = np.random.default_rng(13)
    x = exact_unit_rows(700, 14, rng)
    rows = np.sort(rng.choice(700, 650, replace=False))
    used = []
    real = neighbors.topk_rows_keyed
    monkeypatch.setattr(csl, "topk_rows_keyed", lambda *a: (used.append(a[0].shape), real(*a))[1])
    keyed = Shortlist(torch.as_tensor(x), rows, size=40, block_size=128)
    assert used
    monkeypatch.setattr(csl, "topk_rows_keyed", lambda *a: None)
    plain = Shortlist(torch.as_tensor(x), rows, size=40, block_size=128)
    assert torch.equal(keyed.values, plain.values)
    sims = torch.as_tensor(x)[keyed.members].mul(torch.as_tensor(x)[rows][:, None]).sum(-1)
    torch.testing.assert_close(sims, keyed.values)  # the members hold the values
    for n in (30, 200, 650):
        cands = np.sort(rng.choice(rows, n, replace=False))
        queries = rng.permutation(rows)
        np.testing.assert_array_equal(keyed.mean_topk(queries, cands, 5), plain.mean_topk(queries, cands, 5))
        np.testing.assert_array_equal(keyed.mean_topk(queries, cands, 5), brute_mean_topk(x, queries, cands, 5))


def test_held_matrix_shortlist_keeps_its_members_positions_without_a_search(monkeypatch):
    """Issue 44 (speed5): a shortlist read off the held matrix keeps its members' positions in ``rows``
    (the matrix's columns) instead of searching ``rows`` for them: the same positions as the search, in
    the narrow dtype, and the first hits and c(x) they give equal the brute force; a shortlist without
    the matrix still searches once."""
    rng = np.random.default_rng(19)
    x = exact_unit_rows(500, 12, rng)
    rows = np.sort(rng.choice(500, 460, replace=False))
    searched = []
    real = np.searchsorted
    sl = Shortlist(torch.as_tensor(x), rows, size=30, block_size=128)
    assert sl.matrix is not None and sl._positions_np is not None
    monkeypatch.setattr(csl.np, "searchsorted", lambda *a, **k: (searched.append(a[1].shape), real(*a, **k))[1])
    positions = sl._positions
    assert not searched  # taken with the shortlist, not searched for
    assert positions.dtype == np.int16
    np.testing.assert_array_equal(positions, real(rows, sl.members.numpy()))
    np.testing.assert_array_equal(rows[positions], sl.members.numpy())
    monkeypatch.setattr(csl.np, "searchsorted", real)
    cands = np.sort(rng.choice(rows, 200, replace=False))
    queries = rng.permutation(rows)
    np.testing.assert_array_equal(sl.mean_topk(queries, cands, 5), brute_mean_topk(x, queries, cands, 5))
    monkeypatch.setattr(csl, "MATRIX_BYTES", 0)  # no matrix held: the positions are searched once
    tiled = Shortlist(torch.as_tensor(x), rows, size=30, block_size=128)
    assert tiled.matrix is None and tiled._positions_np is None
    np.testing.assert_array_equal(rows[tiled._positions], tiled.members.numpy())  # its own members (ties may
    assert torch.equal(tiled.values, sl.values)  # order equal values otherwise), the same values
    np.testing.assert_array_equal(tiled.mean_topk(queries, cands, 5), brute_mean_topk(x, queries, cands, 5))
