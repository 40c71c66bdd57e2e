"""One blocked similarity pass that feeds every CRoMa-stage statistic (croma.md §2.3–2.4;
croma_conventions.md A.1, A.3, A.7).

For one neighbourhood scope (all rows, or one 2×2 subset) the cosine similarities are computed
in ``block_size`` × ``block_size`` tiles with a torch matmul (GPU when the features live there);
the matrix is symmetric, so each tile above the diagonal is computed once and reduced for its rows
and, transposed, for its columns. The tiles are merged into running lists of

* the ``kmax`` nearest **cross-group** neighbours of every unit (self and every candidate sharing
  the unit's group removed *before* the top-k; conventions A.3), with their cosine distances.
  k-selection over the whole grid, both kNN balanced accuracies, RI, MaRI and τ read prefixes of
  this one list;
* the ``m`` nearest cross-group **SO** and **OS** candidates over the whole scope (A.7), found by
  a top-m inside each label × confounder cell followed by a merge of the typed cells, so the cost
  does not depend on how far away the typed candidates are (the reference's growing search
  degenerates to a full sort when cells are nearly separable; conventions F.16).

Rows are processed in (cell, group) order so that same-group candidates form a few rectangles
per tile and every cell is a contiguous column range. Memory: one tile of ``block_size²``
similarities plus the lists (scope size × (kmax + 2m) values).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def unit_rows(features: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm, float64 kept as float64 and anything else as float32
    (conventions A.1: distances are computed in the input precision)."""
    x = np.asarray(features)
    if x.ndim != 2:
        raise ValueError(f"croma: features have shape {x.shape}; pass an (N, D) matrix")
    x = x.astype(np.float64 if x.dtype == np.float64 else np.float32, copy=False)
    bad = ~np.isfinite(x).all(axis=1)
    if bad.any():
        raise ValueError(f"croma: features row {int(np.flatnonzero(bad)[0])} holds NaN/Inf "
                         f"({int(bad.sum())} rows); re-extract those features")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if (norms == 0).any():
        raise ValueError(f"croma: features row {int(np.flatnonzero(norms[:, 0] == 0)[0])} is a zero "
                         "vector; cosine distance is undefined for it, drop or re-extract it")
    return x / norms


@dataclass
class ScopeNeighbours:
    """Neighbour lists of one scope, rows in the scope's own order.

    ``idx``/``dist``: the ``kmax`` nearest cross-group candidates by ascending cosine distance
    (``idx`` −1 and ``dist`` inf past ``count``); ``so_dist``/``os_dist``: the ``m`` nearest SO /
    OS cosine distances ascending (inf where fewer than ``m`` exist).
    """

    idx: np.ndarray
    dist: np.ndarray
    count: np.ndarray
    so_dist: np.ndarray
    os_dist: np.ndarray


def _segments(keys: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each run of equal consecutive values."""
    cut = np.flatnonzero(np.diff(keys)) + 1
    bounds = np.r_[0, cut, len(keys)]
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


class _Tiles:
    """Running top lists of one scope, updated tile by tile of the similarity matrix.

    Rows are in (cell, group) order; ``runs`` are the (group, cell) runs of that order, so the
    same-group candidates of a run are a few column ranges (``runs_of_group``)."""

    def __init__(self, x: torch.Tensor, cell: np.ndarray, group: np.ndarray, n_conf: int, kmax: int, m: int,
                 drop_farthest: bool):
        n, self.x, self.m, self.cell = len(cell), x, m, cell
        self.k_keep = min(kmax + int(drop_farthest), n)
        n_cells = int(cell.max()) + 1
        self.cell_ranges = [(int(np.searchsorted(cell, c)), int(np.searchsorted(cell, c, side="right")))
                            for c in range(n_cells)]
        lab, con = np.arange(n_cells) // n_conf, np.arange(n_cells) % n_conf
        self.so_cells = [[c for c in range(n_cells) if lab[c] == lab[a] and con[c] != con[a]] for a in range(n_cells)]
        self.os_cells = [[c for c in range(n_cells) if lab[c] != lab[a] and con[c] == con[a]] for a in range(n_cells)]
        self.runs = _segments(group * n_cells + cell)
        self.run_starts = np.array([r[0] for r in self.runs])
        self.runs_of_group: dict[int, list[tuple[int, int]]] = {}
        for start, end in self.runs:
            self.runs_of_group.setdefault(int(group[start]), []).append((start, end))
        self.run_group = [int(group[start]) for start, _ in self.runs]
        opts = dict(dtype=x.dtype, device=x.device)
        self.best_v = torch.full((n, self.k_keep), float("-inf"), **opts)
        self.best_i = torch.full((n, self.k_keep), -1, dtype=torch.long, device=x.device)
        self.so = torch.full((n, m), float("-inf"), **opts)
        self.os = torch.full((n, m), float("-inf"), **opts)
        self.far_v = torch.full((n,), float("inf"), **opts) if drop_farthest else None
        self.far_i = torch.zeros(n, dtype=torch.long, device=x.device)

    def mask_same_group(self, sims: torch.Tensor, a0: int, a1: int, b0: int, b1: int) -> None:
        """−inf on every (row, column) pair of the tile that shares a group (self included)."""
        first = int(np.searchsorted(self.run_starts, a0, side="right")) - 1
        for (start, end), g in zip(self.runs[first:], self.run_group[first:]):
            if start >= a1:
                break
            r0, r1 = max(start, a0) - a0, min(end, a1) - a0
            for c0, c1 in self.runs_of_group[g]:
                if c0 < b1 and c1 > b0:
                    sims[r0:r1, max(c0, b0) - b0:min(c1, b1) - b0] = float("-inf")

    def track_farthest(self, r0: int, r1: int, c0: int, sims: torch.Tensor) -> None:
        """Running least similar other row (before group masking)."""
        v, i = torch.min(sims, dim=1)
        better = v < self.far_v[r0:r1]
        self.far_v[r0:r1] = torch.where(better, v, self.far_v[r0:r1])
        self.far_i[r0:r1] = torch.where(better, i + c0, self.far_i[r0:r1])

    def update(self, r0: int, r1: int, c0: int, c1: int, sims: torch.Tensor) -> None:
        """Merge the tile rows r0:r1 × columns c0:c1 into the running lists."""
        v, i = torch.topk(sims, min(self.k_keep, c1 - c0), dim=1)
        v, j = torch.topk(torch.cat([self.best_v[r0:r1], v], 1), self.k_keep, dim=1)
        self.best_i[r0:r1] = torch.gather(torch.cat([self.best_i[r0:r1], i + c0], 1), 1, j)
        self.best_v[r0:r1] = v
        tops = {}
        for c, (e0, e1) in enumerate(self.cell_ranges):
            lo, hi = max(e0, c0), min(e1, c1)
            if lo < hi:
                tops[c] = torch.topk(sims[:, lo - c0:hi - c0], min(self.m, hi - lo), dim=1).values
        for a0, a1 in _segments(self.cell[r0:r1]):
            a = int(self.cell[r0 + a0])
            for running, cells in ((self.so, self.so_cells[a]), (self.os, self.os_cells[a])):
                found = [tops[c][a0:a1] for c in cells if c in tops]
                if found:
                    rows = slice(r0 + a0, r0 + a1)
                    running[rows] = torch.topk(torch.cat([running[rows], *found], 1), self.m, dim=1).values


def scope_neighbours(feats: torch.Tensor, labels: np.ndarray, confs: np.ndarray, groups: np.ndarray,
                     kmax: int, m: int, block_size: int = 4096) -> ScopeNeighbours:
    """Cross-group top-``kmax`` lists and per-type ``m`` nearest distances of one scope.

    ``feats``: unit-norm rows of the scope (torch, on the compute device); ``labels``, ``confs``,
    ``groups``: integer codes per row. The similarity matrix is symmetric, so each
    ``block_size`` × ``block_size`` tile above the diagonal is computed once and serves its rows
    and (transposed) its columns. Reproduces the reference's neighbour fetch exactly, including
    its one quirk: when a unit's cross-group pool is no larger than ``kmax`` the reference fetches
    all but one row, so the unit never sees its single farthest other sample (conventions A.3,
    "tiny-N edge case"); the same sample is removed here.
    """
    n = len(labels)
    n_conf = int(confs.max()) + 1
    cell = labels.astype(np.int64) * n_conf + confs
    order = np.lexsort((groups, cell))
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.arange(n)
    x = feats[torch.as_tensor(order, device=feats.device)]
    group_size = np.bincount(groups)
    drop_farthest = bool((n - group_size[groups] <= kmax).any())
    t = _Tiles(x, cell[order], groups[order], n_conf, kmax, m, drop_farthest)
    starts = range(0, n, block_size)
    for a0 in starts:
        a1 = min(n, a0 + block_size)
        for b0 in starts[a0 // block_size:]:
            b1 = min(n, b0 + block_size)
            sims = x[a0:a1] @ x[b0:b1].T
            if drop_farthest:
                t.track_farthest(a0, a1, b0, sims)
                if b0 != a0:
                    t.track_farthest(b0, b1, a0, sims.T)
            t.mask_same_group(sims, a0, a1, b0, b1)
            t.update(a0, a1, b0, b1, sims)
            if b0 != a0:
                t.update(b0, b1, a0, a1, sims.T)
    best_v, best_i = t.best_v, t.best_i
    if drop_farthest:
        best_v = best_v.masked_fill(best_i == t.far_i[:, None], float("-inf"))
        best_v, j = torch.topk(best_v, min(kmax, n), dim=1)
        best_i = torch.gather(best_i, 1, j)
    sim_out = best_v.double().cpu().numpy()
    valid = np.isfinite(sim_out)
    idx = np.where(valid, order[np.where(valid, best_i.cpu().numpy(), 0)], -1)
    if idx.shape[1] < kmax:
        pad = kmax - idx.shape[1]
        idx, sim_out = np.pad(idx, ((0, 0), (0, pad)), constant_values=-1), np.pad(
            sim_out, ((0, 0), (0, pad)), constant_values=-np.inf)
    return ScopeNeighbours(idx=idx[inverse], dist=_distance(sim_out, feats.dtype)[inverse],
                           count=valid.sum(axis=1)[inverse],
                           so_dist=_distance(t.so.double().cpu().numpy(), feats.dtype)[inverse],
                           os_dist=_distance(t.os.double().cpu().numpy(), feats.dtype)[inverse])


def _distance(sims: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """Cosine distance 1 − s in the input precision, clipped to [0, 2] (conventions A.1), as
    float64; −inf similarities (absent slots) become inf."""
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    with np.errstate(invalid="ignore"):
        d = np.clip(np_dtype(1) - sims.astype(np_dtype), 0, 2).astype(np.float64)
    d[~np.isfinite(sims)] = np.inf
    return d
