"""Exact blocked top-k against a brute-force reference, with self-exclusion and block merging."""
import numpy as np
import pytest
import torch

from robustbench_fm.core.neighbors import Shortlist, l2_normalize, mean_topk_similarity, topk_similarity


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
