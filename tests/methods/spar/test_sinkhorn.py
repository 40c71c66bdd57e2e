"""Level 2 permutation layer (spar.md Sections 3.1-3.2): Sinkhorn, smoothed loss, Hungarian."""
import itertools

import numpy as np
import torch

from robustbench_fm.methods.spar.sinkhorn import hungarian, permutation_loss, sinkhorn


def test_sinkhorn_is_doubly_stochastic():
    scores = torch.randn(4, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    p = sinkhorn(scores, tau=0.3, n_iters=200)
    assert torch.allclose(p.sum(-1), torch.ones(4, 16, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(p.sum(-2), torch.ones(4, 16, dtype=torch.float64), atol=1e-5)
    p20 = sinkhorn(scores * 0.3)  # the paper's 20 iterations at a score scale heads reach
    assert torch.allclose(p20.sum(-1), torch.ones(4, 16, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(p20.sum(-2), torch.ones(4, 16, dtype=torch.float64), atol=1e-5) and (p20 >= 0).all()


def test_hungarian_recovers_a_known_permutation_from_noisy_sinkhorn_scores():
    rng = np.random.default_rng(1)
    perms = np.stack([rng.permutation(16) for _ in range(3)])
    scores = torch.from_numpy(np.eye(16)[perms] * 2.0 + rng.normal(0, 0.3, (3, 16, 16)))
    assert np.array_equal(hungarian(sinkhorn(scores).numpy()), perms)


def test_hungarian_matches_brute_force_on_small_matrices():
    rng = np.random.default_rng(2)
    m = rng.random((5, 5))
    best = max(itertools.permutations(range(5)), key=lambda q: m[np.arange(5), q].sum())
    assert tuple(hungarian(m[None])[0]) == best


def test_smoothed_loss_is_the_closed_form_and_ignores_absent_slots():
    n, eps = 4, 0.1
    p = torch.full((1, n, n), 1.0 / n)
    cells = torch.tensor([[2, 0, 3, 1]])
    present = torch.tensor([[True, True, False, True]])
    assert torch.isclose(permutation_loss(p, cells, present, eps), torch.tensor(np.log(n), dtype=torch.float32))
    hard = torch.eye(n)[cells]  # the exact permutation: only the smoothed mass is penalised
    want = -(eps / n) * (n - 1) * np.log(1e-9)
    assert torch.isclose(permutation_loss(hard, cells, present, eps), torch.tensor(want, dtype=torch.float32),
                         rtol=1e-5)
    changed = cells.clone()
    changed[0, 2] = 1  # the absent slot's target does not matter
    assert permutation_loss(hard, changed, present, eps) == permutation_loss(hard, cells, present, eps)


def _sinkhorn_knopp(k: np.ndarray, row_sums: np.ndarray, col_sums: np.ndarray, n_iters: int) -> np.ndarray:
    """Independent Sinkhorn-Knopp scaling of a positive matrix to given marginals (numpy)."""
    u, v = np.ones(k.shape[0]), np.ones(k.shape[1])
    for _ in range(n_iters):
        u = row_sums / (k @ v)
        v = col_sums / (k.T @ u)
    return u[:, None] * k * v[None]


def test_sinkhorn_over_present_rows_ignores_absent_slots():
    """Inference normalisation (spar.md 3.1 Level 2, missing slots ignored): the k present rows of
    exp(S / tau) scaled to row sums 1 and column sums k / n (an independent Sinkhorn-Knopp), absent
    rows zero, and nothing an absent row scores changes the present rows."""
    rng = np.random.default_rng(4)
    scores = torch.from_numpy(rng.normal(0, 0.3, (2, 16, 16)))
    present = torch.zeros(2, 16, dtype=torch.bool)
    present[0, [0, 3, 5, 9, 12]] = True
    present[1, :7] = True
    p = sinkhorn(scores, tau=0.3, n_iters=50, present=present).numpy()
    for i in range(2):
        rows = present[i].numpy()
        k = int(rows.sum())
        want = _sinkhorn_knopp(np.exp(scores[i].numpy()[rows] / 0.3), np.ones(k), np.full(16, k / 16), 50)
        np.testing.assert_allclose(p[i][rows], want, rtol=1e-9, atol=1e-12)
        assert (p[i][~rows] == 0).all()
        np.testing.assert_allclose(p[i][rows].sum(1), 1.0, atol=1e-6)
    changed = scores.clone()
    changed[~present] = torch.from_numpy(rng.normal(0, 5.0, (int((~present).sum()), 16)))
    assert np.array_equal(sinkhorn(changed, 0.3, 50, present).numpy(), p)
