"""Exact blocked top-k against a brute-force reference, with self-exclusion and block merging."""
import numpy as np
import pytest
import torch

from robustbench_fm.core import neighbors
from robustbench_fm.core.neighbors import (
    RunningTopK,
    SameGroupMask,
    cosine_distance,
    hand_over,
    l2_normalize,
    symmetric_tiles,
    topk_rows,
    topk_similarity,
)


@pytest.mark.parametrize("block_size, cand_block", [(4096, 65536), (7, 13), (1, 5)])
def test_blocked_topk_equals_brute_force(block_size, cand_block):
    rng = np.random.default_rng(0)
    x = l2_normalize(rng.normal(size=(300, 12)))
    queries = rng.choice(300, 40, replace=False)
    cands = np.sort(rng.choice(300, 120, replace=False))
    v, i = topk_similarity(torch.as_tensor(x), queries, cands, 5, block_size, cand_block)
    sims = x[queries] @ x[cands].T
    sims[queries[:, None] == cands[None, :]] = -np.inf
    ref_i = np.argsort(-sims, axis=1, kind="stable")[:, :5]
    np.testing.assert_allclose(v.numpy(), np.take_along_axis(sims, ref_i, 1), rtol=0, atol=1e-6)
    assert (cands[i.numpy()] != queries[:, None]).all()


def test_k_larger_than_candidates_is_refused():
    x = torch.as_tensor(l2_normalize(np.eye(6, dtype=np.float32)))
    with pytest.raises(ValueError, match="k=5 exceeds the 4 candidates"):
        topk_similarity(x, np.array([0]), np.arange(5), 5)


def test_zero_rows_are_refused():
    with pytest.raises(ValueError, match="row 1 is a zero vector"):
        l2_normalize(np.array([[1.0, 0.0], [0.0, 0.0]]))


def test_faiss_backend_agrees_with_torch():
    rng = np.random.default_rng(2)
    x = torch.as_tensor(l2_normalize(rng.normal(size=(500, 16))))
    queries, cands = rng.choice(500, 50, replace=False), np.sort(rng.choice(500, 300, replace=False))
    v_t, _ = topk_similarity(x, queries, cands, 7)
    v_f, i_f = topk_similarity(x, queries, cands, 7, backend="faiss")
    np.testing.assert_allclose(v_f.numpy(), v_t.numpy(), rtol=0, atol=1e-5)
    assert (cands[i_f.numpy()] != queries[:, None]).all()
    with pytest.raises(ValueError, match="backend 'annoy'"):
        topk_similarity(x, queries, cands, 7, backend="annoy")


def test_l2_normalize_dtype_choices_and_exact_rows():
    rng = np.random.default_rng(3)
    x64 = rng.normal(size=(20, 7))
    # float64 on request (retention) and kept when asked to keep (CRoMa, conventions A.1)
    for out in (l2_normalize(x64, dtype=np.float64), l2_normalize(x64, dtype=None)):
        assert out.dtype == np.float64
        np.testing.assert_array_equal(out, x64 / np.sqrt((x64 ** 2).sum(axis=1, keepdims=True)))
    # the default and "keep" turn anything but float64 into float32
    assert l2_normalize(x64).dtype == np.float32
    for other in (x64.astype(np.float16), np.arange(1, 15).reshape(7, 2)):
        out = l2_normalize(other, dtype=None)
        assert out.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(out.astype(np.float64), axis=1), 1.0, rtol=0, atol=1e-6)
    assert l2_normalize(np.array([[3.0, 4.0]]), dtype=None).tolist() == [[0.6, 0.8]]
    with pytest.raises(ValueError, match=r"^croma: features: row 2 holds NaN/Inf \(1 rows\)"):
        l2_normalize(np.r_[x64[:2], [[np.inf] * 7]], "croma: features", dtype=None)
    with pytest.raises(ValueError, match="expected a 2-D"):
        l2_normalize(np.ones(3))


@pytest.mark.parametrize("block_bytes", [8, 1000, 64 << 20])
def test_l2_normalize_in_blocks_and_in_place_gives_the_bits_of_one_division(block_bytes, monkeypatch):
    """Issue 31 item 7: rows checked and measured block by block, and a handed-over matrix scaled
    in place, give exactly ``x / np.linalg.norm(x, axis=1)``; a matrix not handed over is left
    alone, and the first bad row is found across blocks."""
    from robustbench_fm.core import neighbors  # the module, to set its block size

    monkeypatch.setattr(neighbors, "NORMALIZE_BLOCK_BYTES", block_bytes)
    rng = np.random.default_rng(11)
    for dtype in (np.float32, np.float64):
        x = (rng.normal(size=(257, 33)) * rng.uniform(0.01, 100.0, (257, 1))).astype(dtype)
        want = x / np.linalg.norm(x, axis=1, keepdims=True)
        before = x.copy()
        copied = l2_normalize(x, dtype=None)
        np.testing.assert_array_equal(copied, want)
        np.testing.assert_array_equal(x, before)  # not handed over: untouched
        owned = x.copy()
        scaled = l2_normalize(hand_over(owned), dtype=None)
        assert np.shares_memory(scaled, owned) and type(scaled) is np.ndarray
        np.testing.assert_array_equal(owned, want)
    # handed over in another dtype: a new matrix in the asked dtype, the float64 one untouched
    x64 = rng.normal(size=(9, 4))
    out = l2_normalize(hand_over(x64.copy()))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, (x64.astype(np.float32) / np.linalg.norm(x64.astype(np.float32), axis=1,
                                                                                 keepdims=True)))
    bad = rng.normal(size=(40, 3))
    bad[[17, 30]] = np.nan
    with pytest.raises(ValueError, match=r"^features: row 17 holds NaN/Inf \(2 rows\)"):
        l2_normalize(bad)
    bad[[17, 30]] = 0.0
    with pytest.raises(ValueError, match=r"^features: row 17 is a zero vector \(2 rows\)"):
        l2_normalize(bad)


def test_cosine_distance_is_one_minus_similarity_in_the_feature_precision():
    sims = np.array([[0.1, 1.0 + 1e-7, -1.5, -np.inf]])
    d32 = cosine_distance(sims, np.float32)
    assert d32.dtype == np.float64
    assert d32[0, 0] == np.float64(np.float32(1) - np.float32(0.1)) != 1 - 0.1  # float32 subtraction
    assert d32[0, 1] == 0.0 and d32[0, 2] == 2.0 and d32[0, 3] == np.inf  # clipped to [0, 2]; absent slot
    d64 = cosine_distance(sims, torch.float64)
    assert d64[0, 0] == 1 - 0.1 and d64[0, 3] == np.inf
    np.testing.assert_array_equal(cosine_distance(sims, torch.float32), d32)


def test_topk_with_candidate_tiles_narrower_than_k_and_float64():
    rng = np.random.default_rng(4)
    x = l2_normalize(rng.normal(size=(60, 5)), dtype=np.float64)
    queries, cands = np.arange(0, 60, 3), np.arange(1, 60, 2)
    v, i = topk_similarity(torch.as_tensor(x), queries, cands, 6, block_size=4, cand_block=2)
    sims = x[queries] @ x[cands].T
    sims[queries[:, None] == cands[None, :]] = -np.inf
    assert v.dtype == torch.float64
    np.testing.assert_allclose(v.numpy(), -np.sort(-sims, axis=1)[:, :6], rtol=0, atol=1e-15)
    # the indices name those similarities (numpy's and torch's float64 matmuls may differ by an ulp on
    # some CPUs: the kernels sum the 5 products in another order)
    np.testing.assert_allclose(np.take_along_axis(sims, i.numpy(), 1), v.numpy(), rtol=0, atol=1e-15)


def test_symmetric_tiles_cover_the_upper_triangle_once():
    x = torch.as_tensor(l2_normalize(np.random.default_rng(5).normal(size=(23, 4)), dtype=np.float64))
    full, seen = (x @ x.T).numpy(), np.zeros((23, 23), int)
    for a0, a1, b0, b1, sims in symmetric_tiles(x, 5):
        assert a0 <= b0
        np.testing.assert_allclose(sims.numpy(), full[a0:a1, b0:b1], rtol=0, atol=1e-15)
        seen[a0:a1, b0:b1] += 1
    block = np.arange(23) // 5  # each pair of row blocks once, the lower one first
    np.testing.assert_array_equal(seen, (block[:, None] <= block[None, :]).astype(int))


@pytest.mark.parametrize("block_size", [3, 8, 100])
@pytest.mark.parametrize("filled", [False, True])
def test_running_topk_with_same_group_mask_equals_brute_force(block_size, filled):
    """The symmetric pass as CRoMa runs it: every candidate of the row's group (self included)
    removed before the top-k; groups need not be contiguous."""
    rng = np.random.default_rng(6)
    n, k = 31, 9
    x = l2_normalize(rng.normal(size=(n, 6)), dtype=np.float64)
    groups = rng.integers(0, 5, n)
    best = RunningTopK(n, k, torch.as_tensor(x), filled=filled)
    mask = SameGroupMask(groups)
    for a0, a1, b0, b1, sims in symmetric_tiles(torch.as_tensor(x), block_size):
        mask.apply(sims, a0, a1, b0, b1)
        best.update(a0, sims, b0)
        if b0 != a0:
            best.update(b0, sims.T, a0)
    v, i = (t.numpy() for t in best.result())
    ref = x @ x.T
    ref[groups[:, None] == groups[None, :]] = -np.inf
    np.testing.assert_allclose(v, -np.sort(-ref, axis=1)[:, :k], rtol=0, atol=1e-15)
    finite = np.isfinite(v)
    at = np.where(finite, i, 0)
    np.testing.assert_allclose(np.take_along_axis(ref, at, 1)[finite], v[finite], rtol=0, atol=1e-15)
    assert (groups[at] != groups[:, None])[finite].all()


def test_filled_lists_mark_absent_slots():
    x = torch.eye(3, dtype=torch.float64)
    best = RunningTopK(3, 5, x, filled=True)
    for a0, _, b0, _, sims in symmetric_tiles(x, 2):
        best.update(a0, sims, b0)
        if a0 != b0:
            best.update(b0, sims.T, a0)
    v, i = best.result()
    assert v.shape == i.shape == (3, 5)
    assert (v[:, :3].sum(1) == 1).all() and torch.isinf(v[:, 3:]).all() and (i[:, 3:] == -1).all()
    assert RunningTopK(3, 2, x).result()[0].shape == (3, 0)  # nothing seen, nothing kept


@pytest.mark.parametrize("width, k", [(1000, 5), (1000, 60), (997, 40), (61, 7), (5000, 256), (300, 299)])
def test_topk_rows_gives_the_values_of_torch_topk(width, k):
    """The chunk prefilter keeps torch.topk's values bitwise (many ties: values on a grid of 1/64,
    a −inf per row as the masked diagonal) and column indices that hold them."""
    rng = np.random.default_rng(width + k)
    sims = torch.as_tensor(np.round(rng.normal(size=(50, width)) * 8) / 64, dtype=torch.float32)
    sims[torch.arange(50), torch.as_tensor(rng.integers(0, width, 50))] = float("-inf")
    values, cols = topk_rows(sims, k)
    assert torch.equal(values, torch.topk(sims, k, dim=1).values)
    assert torch.equal(torch.gather(sims, 1, cols), values)
    assert all(len(set(row.tolist())) == k for row in cols)  # k distinct columns per row


def test_row_parallel_keeps_the_pieces_order():
    """:func:`neighbors.row_parallel` returns the pieces' results in row order, covering every row once."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out = neighbors.row_parallel(lambda r0, r1: (r0, r1), 23, torch.device("cpu"), rows=5)
    finally:
        torch.set_num_threads(threads)
    assert out == [(0, 5), (5, 10), (10, 15), (15, 20), (20, 23)]


@pytest.mark.parametrize("rows, width, k, block", [(160, 300, 5, 16), (96, 50, 5, 16), (64, 40, 5, 16),
                                                   (800, 130, 7, 8), (48, 20, 3, 4)])
def test_topk_columns_gives_the_values_of_torch_topk_down_the_rows(rows, width, k, block):
    """Issue 44: the block-maximum prefilter down the rows keeps torch.topk(dim=0)'s values bitwise
    (ties on a grid of 1/64, a −inf per column as a masked diagonal) and row indices that hold them;
    with fewer than k blocks it is torch.topk itself."""
    rng = np.random.default_rng(rows + width)
    sims = torch.as_tensor(np.round(rng.normal(size=(rows, width)) * 8) / 64, dtype=torch.float32)
    sims[torch.as_tensor(rng.integers(0, rows, width)), torch.arange(width)] = float("-inf")
    values, at = neighbors.topk_columns(sims, k, block)
    assert torch.equal(values, torch.topk(sims, k, dim=0).values)
    assert torch.equal(torch.gather(sims, 0, at), values)
    assert all(len(set(col.tolist())) == k for col in at.T)  # k distinct rows per column


@pytest.mark.parametrize("rows, width, k", [(50, 1000, 5), (50, 1000, 60), (40, 997, 40), (30, 5000, 256),
                                            (64, 8003, 208), (3, 2000, 1)])
def test_topk_rows_keyed_gives_the_values_of_torch_topk(rows, width, k):
    """Issue 44 (candor4): the threshold-and-keys selection of the shortlist keeps torch.topk's values
    bitwise (ties on a grid of 1/64, −0 and +0, a −inf per row as the masked diagonal, columns that are
    no multiple of the chunks), in columns that hold them, k distinct per row, equal values by ascending
    column; where it does not pay it declines (None)."""
    rng = np.random.default_rng(rows + width + k)
    sims = np.round(rng.normal(size=(rows, width)) * 8) / 64
    sims[rng.random(sims.shape) < 0.01] = -0.0
    sims = sims.astype(np.float32)
    sims[np.arange(rows), rng.integers(0, width, rows)] = -np.inf
    values, cols = neighbors.topk_rows_keyed(sims, k)
    want = torch.topk(torch.as_tensor(sims), k, dim=1).values.numpy()
    assert values.dtype == np.float32
    np.testing.assert_array_equal(values, want)
    np.testing.assert_array_equal(np.take_along_axis(sims, cols, 1), values)
    assert all(len(set(row.tolist())) == k for row in cols)
    ties = values[:, 1:] == values[:, :-1]
    assert (cols[:, 1:][ties] > cols[:, :-1][ties]).all()
    assert neighbors.topk_rows_keyed(sims[:, :40], 5) is None  # chunks of fewer than 4 columns: declined


def test_topk_rows_keyed_keeps_the_sign_of_zero_and_negative_values():
    """The keys' order is the floats' order, negatives and −inf included; the values come back bitwise."""
    rng = np.random.default_rng(17)
    row = np.full((2, 2000), -np.inf, np.float32)
    row[:, :40] = [1.0, 0.25] * 2 + [0.0] * 3 + [-0.0] * 3 + list(-rng.random(30))
    row = row[:, rng.permutation(2000)]
    values, cols = neighbors.topk_rows_keyed(row, 20)
    np.testing.assert_array_equal(values, np.sort(row, axis=1)[:, ::-1][:, :20])
    np.testing.assert_array_equal(np.take_along_axis(row, cols, 1).view(np.int32), values.view(np.int32))
    assert (values[:, 10:] < 0).all()  # past the 4 positives and the 6 zeros: the negatives, in order


def test_symmetric_matrix_strips_and_workspace_give_the_same_bits(monkeypatch):
    """Issue 44 (candor4): the transposed tiles copied in strips, into a reused workspace, give the matrix
    of one copy per tile bit for bit (symmetric, equal to the tiles' products); a workspace of another
    dtype or too small is not used."""
    rng = np.random.default_rng(11)
    x = torch.as_tensor(l2_normalize(rng.normal(size=(300, 16))))
    monkeypatch.setattr(neighbors, "TRANSPOSE_ROWS", 10**6)
    whole = neighbors.symmetric_matrix(x, 64)
    monkeypatch.setattr(neighbors, "TRANSPOSE_ROWS", 7)
    workspace = torch.full((400, 400), 3.0)
    strips = neighbors.symmetric_matrix(x, 64, workspace)
    assert strips.data_ptr() == workspace.data_ptr()
    assert torch.equal(strips, whole) and torch.equal(strips, strips.T)
    for a0, a1, b0, b1, tile in symmetric_tiles(x, 64):
        assert torch.equal(strips[a0:a1, b0:b1], tile)
    for unfit in (torch.zeros(10, 10), torch.zeros((300, 300), dtype=torch.float64)):
        other = neighbors.symmetric_matrix(x, 64, unfit)
        assert other.data_ptr() != unfit.data_ptr() and torch.equal(other, whole)


def test_row_parallel_reuses_one_pool_of_threads(monkeypatch):
    """Issue 44 (candor4): :func:`neighbors.row_parallel` runs its pieces on one lasting pool (no threads
    started per call); the pieces still come back in row order."""
    import threading

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = [neighbors.row_parallel(lambda r0, r1: (r0, threading.get_ident()), 40, torch.device("cpu"), rows=5)
                for _ in range(3)]
    finally:
        torch.set_num_threads(threads)
    assert [[r0 for r0, _ in call] for call in seen] == [list(range(0, 40, 5))] * 3
    idents = {ident for call in seen for _, ident in call}
    assert threading.get_ident() not in idents and len(idents) <= 2
    pool = neighbors._row_pool(2)
    assert neighbors._row_pool(2) is pool
    monkeypatch.setattr(neighbors.os, "getpid", lambda: -1)  # as in a forked child: a pool of its own
    assert neighbors._row_pool(2) is not pool


@pytest.mark.parametrize("rows, width, k", [(567, 300, 5), (160, 100, 5), (100, 37, 5), (801, 333, 7), (81, 50, 5)])
def test_topk_columns_keyed_gives_the_values_of_torch_topk_down_the_rows(rows, width, k):
    """Issue 44 (candor4): the keyed selection down the rows keeps torch.topk(dim=0)'s values bitwise
    (ties on a grid of 1/64, a −inf per column, rows that are no multiple of the chunks, a column
    slice of a wider block) and row indices that hold them, k distinct per column."""
    rng = np.random.default_rng(rows + width)
    wide = (np.round(rng.normal(size=(rows, 2 * width)) * 8) / 64).astype(np.float32)
    wide[rng.integers(0, rows, 2 * width), np.arange(2 * width)] = -np.inf
    sims = wide[:, width // 2:width // 2 + width]  # not contiguous, as row_parallel hands it
    values, at = neighbors.topk_columns_keyed(sims, k)
    np.testing.assert_array_equal(values, torch.topk(torch.as_tensor(sims), k, dim=0).values.numpy())
    np.testing.assert_array_equal(np.take_along_axis(sims, at, 0), values)
    assert all(len(set(col.tolist())) == k for col in at.T)
    assert values.flags.c_contiguous
    assert neighbors.topk_columns_keyed(sims[:60], 5) is None  # chunks of fewer than 4 rows: declined


def test_means_without_each_equals_leaving_each_cluster_out_by_brute_force():
    """Issue 58: a cluster's neighbour role. For every row and every other cluster among its k nearest,
    the mean of the k nearest once that cluster's entries are gone equals a fresh top-k without them."""
    from robustbench_fm.core.neighbors import means_without_each, pair_without

    rng = np.random.default_rng(0)
    q, n, k = 40, 60, 4
    sims_all = rng.normal(size=(q, n))
    who_all = rng.integers(0, 12, n)
    own = rng.integers(0, 12, q)
    width = k + np.bincount(who_all).max()
    order = np.argsort(-sims_all, axis=1)[:, :width]
    sims, who = np.take_along_axis(sims_all, order, 1), who_all[order]
    alive = rng.random((q, width)) > 0.1
    means, rows, clusters, without = means_without_each(sims, who, alive, k, own)
    seen = set()
    for i in range(q):
        live = sims[i][alive[i]]
        assert means[i] == pytest.approx(np.sort(live)[::-1][:k].mean(), abs=1e-12) if len(live) >= k else \
            np.isnan(means[i])
        top = [c for c, a in zip(who[i], alive[i]) if a][:k]
        for c in set(top) - {own[i]}:
            kept = sims[i][alive[i] & (who[i] != c)]
            at = np.flatnonzero((rows == i) & (clusters == c))
            assert len(at) == 1
            assert without[at[0]] == pytest.approx(np.sort(kept)[::-1][:k].mean(), abs=1e-12)
            seen.add((i, c))
    assert seen == set(zip(rows.tolist(), clusters.tolist()))  # and no other pairs
    # two lists of the same rows joined: the other mean unchanged where the cluster is not among its k
    other = means_without_each(sims, (who + 1) % 12, alive, k, own)
    r, c, a, b = pair_without((means, rows, clusters, without), other, 12)
    for ri, ci, ai, bi in zip(r, c, a, b):
        in_a = np.flatnonzero((rows == ri) & (clusters == ci))
        in_b = np.flatnonzero((other[1] == ri) & (other[2] == ci))
        assert ai == pytest.approx(without[in_a[0]] if len(in_a) else means[ri])
        assert bi == pytest.approx(other[3][in_b[0]] if len(in_b) else other[0][ri])
