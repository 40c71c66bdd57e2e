"""Exact blocked top-k against a brute-force reference, with self-exclusion and block merging."""
import numpy as np
import pytest
import torch

from robustbench_fm.neighbors import l2_normalize, topk_similarity


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
