"""CRoMa's scope pass: one symmetric pass of the shared neighbour engine
(:mod:`robustbench_fm.core.neighbors`) feeds every CRoMa-stage statistic (croma.md §2.3–2.4;
croma_conventions.md A.1, A.3, A.7).

For one neighbourhood scope (all rows, or one 2×2 subset) the cosine similarities are computed
in ``block_size`` × ``block_size`` tiles (:func:`~robustbench_fm.core.neighbors.symmetric_tiles`;
GPU when the features live there), each tile on or above the diagonal once, reduced for its rows
and, transposed, for its columns, into running lists of

* the ``kmax`` nearest **cross-group** neighbours of every unit (self and every candidate sharing
  the unit's group removed *before* the top-k, :class:`~robustbench_fm.core.neighbors.SameGroupMask`;
  conventions A.3), with their cosine distances. k-selection over the whole grid, both kNN
  balanced accuracies, RI, MaRI and τ read prefixes of this one list;
* the ``m`` nearest cross-group **SO** and **OS** candidates over the whole scope (A.7), found by
  a top-m inside each label × confounder cell followed by a merge of the typed cells, so the cost
  does not depend on how far away the typed candidates are (the reference's growing search
  degenerates to a full sort when cells are nearly separable; conventions F.16).

Rows are processed in (cell, group) order so that same-group candidates form a few rectangles
per tile and every cell is a contiguous column range. Memory: one tile of ``block_size²``
similarities plus the lists (scope size × (kmax + 2m) values).

**Tie rule** (issue 19; the reference leaves it to sklearn's unstable argpartition, so RI / MaRI
/ the kNN votes may differ from it where cosine similarities tie exactly, e.g. quantised
features): candidates at the same similarity are ordered by ``tie_key`` (the scope's sample ids
in sorted order, :func:`tie_keys`), smaller first, both inside the lists and at the kmax
boundary. The pass keeps one slot more than kmax; a row whose extra slot ties with its kmax-th is
re-ranked exhaustively under the rule (rare: exact ties only). Every list therefore depends on
the features and the sample ids alone, never on the manifest's row order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...core.neighbors import RunningTopK, SameGroupMask, cosine_distance, runs, symmetric_tiles


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


class _TypedLists:
    """Running ``m`` largest SO and OS similarities of every row (rows in (cell, group) order, so
    every label × confounder cell is a contiguous column range), updated tile by tile."""

    def __init__(self, x: torch.Tensor, cell: np.ndarray, n_conf: int, m: int):
        n, self.m, self.cell = len(cell), m, cell
        n_cells = int(cell.max()) + 1
        self.cell_ranges = [(int(np.searchsorted(cell, c)), int(np.searchsorted(cell, c, side="right")))
                            for c in range(n_cells)]
        lab, con = np.arange(n_cells) // n_conf, np.arange(n_cells) % n_conf
        self.so_cells = [[c for c in range(n_cells) if lab[c] == lab[a] and con[c] != con[a]] for a in range(n_cells)]
        self.os_cells = [[c for c in range(n_cells) if lab[c] != lab[a] and con[c] == con[a]] for a in range(n_cells)]
        self.so = torch.full((n, m), float("-inf"), dtype=x.dtype, device=x.device)
        self.os = torch.full((n, m), float("-inf"), dtype=x.dtype, device=x.device)

    def update(self, r0: int, r1: int, c0: int, c1: int, sims: torch.Tensor) -> None:
        """Merge the (group-masked) tile rows r0:r1 × columns c0:c1 into the typed lists."""
        tops = {}
        for c, (e0, e1) in enumerate(self.cell_ranges):
            lo, hi = max(e0, c0), min(e1, c1)
            if lo < hi:
                tops[c] = torch.topk(sims[:, lo - c0:hi - c0], min(self.m, hi - lo), dim=1).values
        for a0, a1 in runs(self.cell[r0:r1]):
            a = int(self.cell[r0 + a0])
            for running, cells in ((self.so, self.so_cells[a]), (self.os, self.os_cells[a])):
                found = [tops[c][a0:a1] for c in cells if c in tops]
                if found:
                    rows = slice(r0 + a0, r0 + a1)
                    running[rows] = torch.topk(torch.cat([running[rows], *found], 1), self.m, dim=1).values


class _Farthest:
    """Running least similar other row of every row (before group masking)."""

    def __init__(self, x: torch.Tensor):
        self.v = torch.full((len(x),), float("inf"), dtype=x.dtype, device=x.device)
        self.i = torch.zeros(len(x), dtype=torch.long, device=x.device)

    def update(self, r0: int, r1: int, c0: int, sims: torch.Tensor) -> None:
        v, i = torch.min(sims, dim=1)
        better = v < self.v[r0:r1]
        self.v[r0:r1] = torch.where(better, v, self.v[r0:r1])
        self.i[r0:r1] = torch.where(better, i + c0, self.i[r0:r1])


def tie_keys(sample_ids) -> np.ndarray:
    """Each unit's position in the sorted sample ids of its scope: the order of candidates that tie."""
    ids = np.asarray(sample_ids).astype(str)
    key = np.empty(len(ids), dtype=np.int64)
    key[np.argsort(ids, kind="stable")] = np.arange(len(ids))
    return key


def _canonical(sim: np.ndarray, idx: np.ndarray, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's slots ordered by (similarity descending, tie key ascending); absent slots last."""
    k = np.where(idx >= 0, key[np.maximum(idx, 0)], np.iinfo(np.int64).max)
    order = np.lexsort((k, -sim), axis=1) if sim.size else np.zeros(sim.shape, dtype=np.int64)
    return np.take_along_axis(sim, order, 1), np.take_along_axis(idx, order, 1)


def _exhaustive_row(x: torch.Tensor, r: int, groups: np.ndarray, key: np.ndarray, width: int,
                    farthest: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Row ``r``'s ``width`` nearest cross-group candidates (processing order) under the tie rule."""
    sims = (x[r:r + 1] @ x.T)[0].double().cpu().numpy()
    keep = groups != groups[r]
    if farthest is not None:
        keep[farthest] = False
    cand = np.flatnonzero(keep)
    order = np.lexsort((key[cand], -sims[cand]))[:width]
    sim = np.full(width, -np.inf)
    idx = np.full(width, -1, dtype=np.int64)
    sim[:len(order)], idx[:len(order)] = sims[cand[order]], cand[order]
    return sim, idx


def scope_neighbours(feats: torch.Tensor, labels: np.ndarray, confs: np.ndarray, groups: np.ndarray,
                     kmax: int, m: int, block_size: int = 4096, tie_key: np.ndarray | None = None
                     ) -> ScopeNeighbours:
    """Cross-group top-``kmax`` lists and per-type ``m`` nearest distances of one scope.

    ``feats``: unit-norm rows of the scope (torch, on the compute device; float64 stays float64,
    conventions A.1); ``labels``, ``confs``, ``groups``: integer codes per row. Reproduces the
    reference's neighbour fetch exactly, including its one quirk: when a unit's cross-group pool
    is no larger than ``kmax`` the reference fetches all but one row, so the unit never sees its
    single farthest other sample (conventions A.3, "tiny-N edge case"); the same sample is removed
    here. ``tie_key``: one integer per row ordering candidates that tie (module doc; default: the
    row position).
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
    best = RunningTopK(n, min(kmax + 1 + int(drop_farthest), n), x, filled=True)  # +1: the tie check
    typed = _TypedLists(x, cell[order], n_conf, m)
    mask = SameGroupMask(groups[order])
    far = _Farthest(x) if drop_farthest else None
    for a0, a1, b0, b1, sims in symmetric_tiles(x, block_size):
        if far is not None:
            far.update(a0, a1, b0, sims)
            if b0 != a0:
                far.update(b0, b1, a0, sims.T)
        mask.apply(sims, a0, a1, b0, b1)
        best.update(a0, sims, b0)
        typed.update(a0, a1, b0, b1, sims)
        if b0 != a0:
            best.update(b0, sims.T, a0)
            typed.update(b0, b1, a0, a1, sims.T)
    best_v, best_i = best.result()
    if far is not None:
        best_v = best_v.masked_fill(best_i == far.i[:, None], float("-inf"))
    key = (np.arange(n) if tie_key is None else np.asarray(tie_key, dtype=np.int64))[order]  # processing order
    sim_out = best_v.double().cpu().numpy()
    proc = np.where(np.isfinite(sim_out), best_i.cpu().numpy(), -1)
    sim_out, proc = _canonical(sim_out, proc, key)
    if sim_out.shape[1] > kmax:  # an extra slot tied with the kmax-th: the boundary cut was arbitrary
        tied = np.flatnonzero(np.isfinite(sim_out[:, kmax]) & (sim_out[:, kmax] == sim_out[:, kmax - 1]))
        for r in tied:
            sim_out[r], proc[r] = _exhaustive_row(x, int(r), groups[order], key, sim_out.shape[1],
                                                  None if far is None else int(far.i[r]))
        sim_out, proc = sim_out[:, :kmax], proc[:, :kmax]
    valid = np.isfinite(sim_out)
    idx = np.where(valid, order[np.maximum(proc, 0)], -1)
    if idx.shape[1] < kmax:
        pad = kmax - idx.shape[1]
        idx, sim_out = np.pad(idx, ((0, 0), (0, pad)), constant_values=-1), np.pad(
            sim_out, ((0, 0), (0, pad)), constant_values=-np.inf)
    return ScopeNeighbours(idx=idx[inverse], dist=cosine_distance(sim_out, feats.dtype)[inverse],
                           count=valid.sum(axis=1)[inverse],
                           so_dist=cosine_distance(typed.so.double().cpu().numpy(), feats.dtype)[inverse],
                           os_dist=cosine_distance(typed.os.double().cpu().numpy(), feats.dtype)[inverse])
