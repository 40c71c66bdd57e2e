"""Neighbourhood impurity r(x, F) (candor.md "Derived Measures: Neighborhood Impurity", Eq. 5).

r(x, F) = 1 − |2 p̂_k(x, F) − 1|, where p̂_k(x, F) is the share of positives for F among the k
nearest (cosine) labelled training-split images of x's matched group. It needs no label of x:
r = 0 when the k neighbours agree, r = 1 when they split evenly.
"""
from __future__ import annotations

import numpy as np
import torch

from ...core.devices import resolve_device
from ...core.neighbors import l2_normalize, topk_similarity


def neighbourhood_impurity(features: np.ndarray, labels, is_train, groups, k: int = 5,
                           device="auto") -> np.ndarray:
    """r(x, F) for every row (module doc). Candidates: rows with ``is_train`` and a 0/1 label in
    the row's group (``groups``); a candidate row never counts as its own neighbour. Rows of a
    group with at most k candidates get NaN."""
    labels = np.asarray(labels, np.float64)
    is_train, groups = np.asarray(is_train, bool), np.asarray(groups).astype(str)
    feats = torch.as_tensor(l2_normalize(features), device=resolve_device(device))
    out = np.full(len(labels), np.nan)
    candidate = is_train & np.isin(labels, (0.0, 1.0))
    for group in np.unique(groups):
        rows = np.flatnonzero(groups == group)
        cands = rows[candidate[rows]]
        if len(cands) <= k:
            continue
        _, pos = topk_similarity(feats, rows, cands, k)
        p_hat = labels[cands][pos.cpu().numpy()].mean(axis=1)
        out[rows] = 1.0 - np.abs(2.0 * p_hat - 1.0)
    return out
