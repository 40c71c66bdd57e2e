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
                    block_size: int = 4096, cand_block: int = 65536) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest cosine similarities of each query among the candidates, self excluded.

    ``feats`` is the unit-norm matrix (on the compute device); ``query_rows`` and ``cand_rows``
    index into it. A query that is itself a candidate never counts as its own neighbour.
    Queries are processed ``block_size`` at a time and candidates ``cand_block`` at a time (the
    running top-k is merged across candidate blocks), so memory is bounded by
    ``block_size × cand_block`` similarities whatever the set sizes.
    Returns (similarities [Q, k] sorted descending, candidate positions [Q, k]) on the device.
    """
    query_rows = np.asarray(query_rows, dtype=np.int64)
    cand_rows = np.asarray(cand_rows, dtype=np.int64)
    available = len(cand_rows) - int(np.isin(query_rows, cand_rows).any())
    if available < k:
        raise ValueError(f"k={k} exceeds the {available} candidates available")
    device = feats.device
    # Position of each query inside the candidate set (-1 when absent), to mask self-matches.
    order = np.argsort(cand_rows, kind="stable")
    at = np.searchsorted(cand_rows[order], query_rows).clip(max=len(cand_rows) - 1)
    self_pos = np.where(cand_rows[order][at] == query_rows, order[at], -1)
    values, indices = [], []
    for qs in range(0, len(query_rows), block_size):
        q = feats[torch.as_tensor(query_rows[qs:qs + block_size], device=device)]
        sp = torch.as_tensor(self_pos[qs:qs + block_size], device=device)
        best_v = best_i = None
        for cs in range(0, len(cand_rows), cand_block):
            sims = q @ feats[torch.as_tensor(cand_rows[cs:cs + cand_block], device=device)].T
            local = sp - cs
            hit = (local >= 0) & (local < sims.shape[1])
            if bool(hit.any()):
                sims[torch.nonzero(hit).squeeze(1), local[hit]] = float("-inf")
            v, i = torch.topk(sims, min(k, sims.shape[1]), dim=1)
            i = i + cs
            if best_v is not None:
                v, j = torch.topk(torch.cat([best_v, v], 1), k, dim=1)
                i = torch.gather(torch.cat([best_i, i], 1), 1, j)
            best_v, best_i = v, i
        values.append(best_v)
        indices.append(best_i)
    if not values:
        empty = torch.empty((0, k), device=device)
        return empty, empty.long()
    return torch.cat(values), torch.cat(indices)


def mean_topk_similarity(feats: torch.Tensor, query_rows, cand_rows, k: int,
                         block_size: int = 4096) -> np.ndarray:
    """c(x) = (1/k) Σ_{z ∈ N_k(x; R)} <g(x), g(z)> for every query (candor.md, Eq. 1 for c±)."""
    values, _ = topk_similarity(feats, query_rows, cand_rows, k, block_size)
    return values.double().mean(dim=1).cpu().numpy()
