"""Level 2 permutation layer (spar.md Section 3.1-3.2): Sinkhorn normalisation of a score matrix
into a doubly-stochastic matrix, the smoothed permutation loss, and the Hungarian hard assignment
used at inference, where missing organ slots are ignored (normalisation and matching over the
present slots only)."""
from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment


def sinkhorn(scores: torch.Tensor, tau: float = 0.3, n_iters: int = 20,
             present: torch.Tensor | None = None) -> torch.Tensor:
    """Doubly-stochastic matrix from scores [B, n, n] (Sinkhorn [22], tau = 0.3, 20 iterations):
    ``exp(scores / tau)`` alternately row- and column-normalised, in the log domain for stability;
    rows index tile slots, columns grid cells.

    With ``present`` [B, n] (inference; spar.md 3.1 Level 2 "Missing organ slots are ignored"),
    absent rows are left out of the normalisation and come back as zeros: the k present rows
    each sum to 1 and every column to k / n, so an absent slot cannot move a present one off its
    cell. Without it (training, the paper's 16 x 16 matrix) every row takes part.
    """
    log_p = scores / tau
    if present is None:
        for _ in range(n_iters):
            log_p = log_p - torch.logsumexp(log_p, dim=-1, keepdim=True)
            log_p = log_p - torch.logsumexp(log_p, dim=-2, keepdim=True)
        return log_p.exp()
    keep = torch.as_tensor(present, dtype=torch.bool, device=scores.device)[..., :, None]
    if keep.shape[:-1] != scores.shape[:-1]:
        raise ValueError(f"sinkhorn: present has shape {tuple(keep.shape[:-1])}, the scores "
                         f"{tuple(scores.shape)}; pass one flag per slot [B, n]")
    n = scores.shape[-1]
    col_total = torch.log(keep.sum(-2, keepdim=True).clamp_min(1).to(log_p.dtype) / n)  # [B, 1, 1]
    log_p = log_p.masked_fill(~keep, float("-inf"))
    for _ in range(n_iters):
        log_p = torch.where(keep, log_p - torch.logsumexp(log_p, dim=-1, keepdim=True), float("-inf"))
        log_p = torch.where(keep, log_p - torch.logsumexp(log_p, dim=-2, keepdim=True) + col_total, float("-inf"))
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


def hungarian(p: np.ndarray, present: np.ndarray | None = None) -> np.ndarray:
    """Hard assignment [B, n] (the cell of every slot) maximising the total of ``p`` [B, n, n]
    (Hungarian algorithm [23], scipy's linear_sum_assignment) over the PRESENT slots only.

    spar.md Section 3.1, Level 2: "the Hungarian algorithm [23] producing a hard assignment at
    inference. Missing organ slots are ignored, so permutation is evaluated only over present
    organs." Our reading: the present rows ``present`` [B, n] of the matrix (at inference
    ``sinkhorn(..., present=present)``, normalised over the present rows only) are matched to
    distinct cells (a rectangular k x n assignment), so an absent slot can never take a
    present organ's cell; the absent slots then fill the cells left over in slot order (the rule
    of ``probes.grid_cells`` for their targets), which keeps every row a permutation and does not
    affect the scores (absent slots are not scored). ``present=None`` matches all n slots.
    """
    p = np.asarray(p, dtype=np.float64)
    keep = np.ones(p.shape[:2], bool) if present is None else np.asarray(present, bool)
    if keep.shape != p.shape[:2]:
        raise ValueError(f"hungarian: present has shape {keep.shape}, the score matrices {p.shape}; "
                         "pass one flag per slot [B, n]")
    out = np.empty(p.shape[:2], dtype=np.int64)
    for i, mat in enumerate(p):
        slots = np.flatnonzero(keep[i])
        rows, cols = linear_sum_assignment(mat[slots], maximize=True)
        out[i, slots[rows]] = cols
        absent = np.flatnonzero(~keep[i])
        out[i, absent] = np.setdiff1d(np.arange(p.shape[2]), cols)[: len(absent)]
    return out
