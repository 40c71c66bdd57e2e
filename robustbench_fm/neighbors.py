"""Exact cosine k-nearest neighbours by blocked matrix products (torch; GPU when present).

Features are L2-normalised first (DESIGN.md, Conventions), so cosine similarity is the inner
product. Memory is bounded by ``block_size`` query rows × all candidates at a time.
"""
from __future__ import annotations

import numpy as np
import torch


def l2_normalize(x: np.ndarray, source: str = "features") -> np.ndarray:
    """Rows scaled to unit length; NaN/Inf and zero rows are refused (they have no direction)."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"{source}: expected a 2-D (N, D) matrix, got shape {x.shape}")
    bad = ~np.isfinite(x).all(axis=1)
    if bad.any():
        raise ValueError(f"{source}: row {int(np.flatnonzero(bad)[0])} holds NaN/Inf "
                         f"({int(bad.sum())} rows); re-extract those features")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    zero = norms[:, 0] == 0
    if zero.any():
        raise ValueError(f"{source}: row {int(np.flatnonzero(zero)[0])} is a zero vector "
                         f"({int(zero.sum())} rows); cosine similarity is undefined for it")
    return x / norms


def topk_similarity(feats: torch.Tensor, query_rows: np.ndarray, cand_rows: np.ndarray, k: int,
                    block_size: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest cosine similarities of each query among the candidates, self excluded.

    ``feats`` is the unit-norm matrix (on the compute device); ``query_rows`` and ``cand_rows``
    index into it. A query that is itself a candidate never counts as its own neighbour.
    Returns (similarities [Q, k] sorted descending, candidate positions [Q, k]) on the device.
    """
    query_rows = np.asarray(query_rows, dtype=np.int64)
    cand_rows = np.asarray(cand_rows, dtype=np.int64)
    n_self = np.isin(query_rows, cand_rows)
    if len(cand_rows) - int(n_self.any()) < k:
        raise ValueError(f"k={k} exceeds the {len(cand_rows) - int(n_self.any())} candidates available")
    device = feats.device
    cands = feats[torch.as_tensor(cand_rows, device=device)]
    # Position of each query inside the candidate set (-1 when absent), to mask self-matches.
    pos_of = {int(r): i for i, r in enumerate(cand_rows)}
    self_pos = np.array([pos_of.get(int(r), -1) for r in query_rows], dtype=np.int64)
    values, indices = [], []
    for start in range(0, len(query_rows), block_size):
        q = torch.as_tensor(query_rows[start:start + block_size], device=device)
        sims = feats[q] @ cands.T
        sp = torch.as_tensor(self_pos[start:start + block_size], device=device)
        has = sp >= 0
        if bool(has.any()):
            sims[torch.nonzero(has).squeeze(1), sp[has]] = float("-inf")
        v, i = torch.topk(sims, k, dim=1, largest=True, sorted=True)
        values.append(v)
        indices.append(i)
    if not values:
        empty = torch.empty((0, k), device=device)
        return empty, empty.long()
    return torch.cat(values), torch.cat(indices)


def mean_topk_similarity(feats: torch.Tensor, query_rows, cand_rows, k: int,
                         block_size: int = 4096) -> np.ndarray:
    """c(x) = (1/k) Σ_{z ∈ N_k(x; R)} <g(x), g(z)> for every query (candor.md, Eq. for c±)."""
    values, _ = topk_similarity(feats, query_rows, cand_rows, k, block_size)
    return values.double().mean(dim=1).cpu().numpy()
