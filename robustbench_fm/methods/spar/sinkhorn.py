"""Level 2 permutation layer (spar.md Section 3.1-3.2): Sinkhorn normalisation of a score matrix
into a doubly-stochastic matrix, the smoothed permutation loss, and the Hungarian hard assignment
used at inference."""
from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment


def sinkhorn(scores: torch.Tensor, tau: float = 0.3, n_iters: int = 20) -> torch.Tensor:
    """Doubly-stochastic matrix from scores [B, n, n] (Sinkhorn [22], tau = 0.3, 20 iterations):
    ``exp(scores / tau)`` alternately row- and column-normalised, in the log domain for stability;
    rows index tile slots, columns grid cells."""
    log_p = scores / tau
    for _ in range(n_iters):
        log_p = log_p - torch.logsumexp(log_p, dim=-1, keepdim=True)
        log_p = log_p - torch.logsumexp(log_p, dim=-2, keepdim=True)
    return log_p.exp()


def permutation_loss(p: torch.Tensor, cells: torch.Tensor, present: torch.Tensor,
                     smoothing: float = 0.1) -> torch.Tensor:
    """Smoothed permutation loss (spar.md Section 3.2, eps = 0.1): cross-entropy between each
    present slot's row of the doubly-stochastic ``p`` [B, n, n] and its target cell ``cells``
    [B, n] one-hot smoothed to ``1 - eps + eps/n`` (``eps/n`` elsewhere); absent slots are ignored."""
    n = p.shape[-1]
    target = torch.full_like(p, smoothing / n)
    target.scatter_(-1, cells.unsqueeze(-1), 1.0 - smoothing + smoothing / n)
    row_loss = -(target * p.clamp_min(1e-9).log()).sum(-1)
    mask = present.float()
    return (row_loss * mask).sum() / mask.sum().clamp_min(1.0)


def hungarian(p: np.ndarray) -> np.ndarray:
    """Hard assignment [B, n] (the cell of every slot) maximising the total of ``p`` [B, n, n]
    (Hungarian algorithm [23], scipy's linear_sum_assignment)."""
    out = np.empty(p.shape[:2], dtype=np.int64)
    for i, mat in enumerate(np.asarray(p, dtype=np.float64)):
        rows, cols = linear_sum_assignment(mat, maximize=True)
        out[i, rows] = cols
    return out
