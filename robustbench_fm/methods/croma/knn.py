"""CRoMa's scope pass: one symmetric pass of the shared neighbour engine
(:mod:`robustbench_fm.core.neighbors`) feeds every CRoMa-stage statistic (croma.md §2.3–2.4;
croma_conventions.md A.1, A.3, A.7).

For one neighbourhood scope (all rows, or one 2×2 subset) the cosine similarities are computed
in tiles (GPU when the features live there), each tile on or above the diagonal once, reduced for
its rows and, transposed, for its columns, into running lists of

* the ``kmax`` nearest **cross-group** neighbours of every unit (self and every candidate sharing
  the unit's group removed *before* the top-k; conventions A.3), with their cosine distances.
  k-selection over the whole grid, both kNN balanced accuracies, RI, MaRI and τ read prefixes of
  this one list;
* the ``m`` nearest cross-group **SO** and **OS** candidates over the whole scope (A.7), found by
  a top-m inside each label × confounder cell of a tile followed by a merge of the typed cells, so
  the cost does not depend on how far away the typed candidates are (the reference's growing
  search degenerates to a full sort when cells are nearly separable; conventions F.16).

**Identical rows are one vector.** Inside one matrix product, two
bitwise-identical candidate rows can get different similarities (the BLAS kernel rounds each
output position its own way), so a tie rule on the products never sees their tie. The pass
therefore deduplicates the scope's unit rows first (byte-identical rows, −0 read as +0), computes
the products between the *distinct* vectors only, each pair of distinct vectors in exactly one
tile, and expands every tile to the member rows by indexing: every row sharing a vector gets the
very same similarity to every candidate, and identical candidates tie exactly, at cosine exactly
1 (distance exactly 0, whatever the rounding of the vector's own product). Distinct vectors
are sorted by their bytes and member rows by ``tie_key``, so the tiles, and hence every
similarity, are a function of the scope's content alone, never of the manifest's row order.
Tiles hold about ``block_size`` member rows per side (one vector with more members than that is
expanded ``block_size`` rows at a time); without duplicates the pass is the plain blocked product.
Memory: two ``block_size²`` tiles plus the lists (scope size × (kmax + 2m) values).

**Tie rule** (the reference leaves it to sklearn's unstable argpartition, so RI / MaRI
/ the kNN votes may differ from it where cosine similarities tie exactly, e.g. quantised or
duplicated features): candidates at the same similarity are ordered by ``tie_key`` (the scope's
sample ids in sorted order, :func:`tie_keys`), smaller first, both inside the lists and at the
kmax boundary. The pass keeps :data:`TIE_SLOTS` slots more than kmax; a row whose extra slots
all tie with its kmax-th takes, among all its candidates at that similarity (the same products
recomputed), those with the smallest keys. Every list therefore depends on the features and the sample ids alone,
never on the manifest's row order: it equals a brute force of "similarity descending, then
sample id" on these similarities. What the lists feed is row-order free too except the kNN
majority votes: a vote tie goes to the smallest label code, and codes follow croma's first
appearance in the manifest (conventions A.5), so ``bio_knn_bacc`` / ``conf_knn_bacc`` and hence
k* may change with the row order where votes tie (even k, or more than two classes), by design.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...core.neighbors import RunningTopK, Transposer, cosine_distance


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
    #: with ``typed_width``: ((SO similarities, SO rows), (OS similarities, OS rows)), each (n, typed_width),
    #: similarities (float64) descending, −inf and row −1 past the candidates; rows in the scope's order
    typed: tuple | None = None


class _TypedLists:
    """Running ``m`` largest SO and OS similarities of every row (rows in processing order),
    updated tile by tile: inside each (anchor cell, candidate cell) block of the tile that is SO or
    OS a top-m of the candidate cell's columns, then a merge of the typed cells into the rows of the
    anchor cell (conventions A.2). ``indices``: the lists also keep the candidates' columns
    (processing positions; −1 where absent)."""

    def __init__(self, cell: np.ndarray, n_conf: int, m: int, like: torch.Tensor, indices: bool = False):
        n, self.m, self.cell = len(cell), m, cell
        n_cells = int(cell.max()) + 1
        lab, con = np.arange(n_cells) // n_conf, np.arange(n_cells) % n_conf
        self.so_cells = [[c for c in range(n_cells) if lab[c] == lab[a] and con[c] != con[a]] for a in range(n_cells)]
        self.os_cells = [[c for c in range(n_cells) if lab[c] != lab[a] and con[c] == con[a]] for a in range(n_cells)]
        self.so = torch.full((n, m), float("-inf"), dtype=like.dtype, device=like.device)
        self.os = torch.full((n, m), float("-inf"), dtype=like.dtype, device=like.device)
        self.indices = indices
        if indices:
            self.so_i = torch.full((n, m), -1, dtype=torch.long, device=like.device)
            self.os_i = torch.full((n, m), -1, dtype=torch.long, device=like.device)
        self.device = like.device
        self._columns: dict[tuple[int, int], tuple] = {}

    def _cells_of(self, c0: int, c1: int):
        """(column permutation or None when the cells are already sorted, {cell: (lo, hi)})."""
        if (c0, c1) not in self._columns:
            cells = self.cell[c0:c1]
            perm = None
            if (np.diff(cells) < 0).any():
                order = np.argsort(cells, kind="stable")
                perm, cells = torch.as_tensor(order, device=self.device), cells[order]
            present = np.unique(cells)
            lo, hi = np.searchsorted(cells, present), np.searchsorted(cells, present, side="right")
            self._columns[(c0, c1)] = perm, dict(zip(present.tolist(), zip(lo.tolist(), hi.tolist())))
        return self._columns[(c0, c1)]

    def update(self, r0: int, r1: int, c0: int, c1: int, sims: torch.Tensor) -> None:
        """Merge the (group-masked) tile rows r0:r1 × columns c0:c1 into the typed lists."""
        perm, ranges = self._cells_of(c0, c1)
        if perm is not None:
            sims = sims[:, perm]
        rows_cells = self.cell[r0:r1]
        for a in np.unique(rows_cells).tolist():
            at = np.flatnonzero(rows_cells == a)
            local = slice(int(at[0]), int(at[-1]) + 1) if at[-1] - at[0] + 1 == len(at) else \
                torch.as_tensor(at, device=self.device)
            rows = slice(r0 + local.start, r0 + local.stop) if isinstance(local, slice) else local + r0
            block = sims[local]
            lists = ((self.so, self.so_cells[a], self.so_i if self.indices else None),
                     (self.os, self.os_cells[a], self.os_i if self.indices else None))
            for running, cells, running_i in lists:
                found = [(torch.topk(block[:, lo:hi], min(self.m, hi - lo), dim=1), lo)
                         for c, (lo, hi) in ((c, ranges[c]) for c in cells if c in ranges)]
                if not found:
                    continue
                merged = torch.topk(torch.cat([running[rows], *(top.values for top, _ in found)], 1), self.m, dim=1)
                running[rows] = merged.values
                if running_i is not None:
                    cols = [top.indices + lo for top, lo in found]
                    if perm is not None:
                        cols = [perm[c] for c in cols]
                    running_i[rows] = torch.gather(torch.cat([running_i[rows], *(c + c0 for c in cols)], 1), 1,
                                                   merged.indices)


class _Farthest:
    """Running least similar other row of every row (before group masking); among rows equally
    far, the one with the largest tie key (the last in the tie rule's order)."""

    def __init__(self, key: torch.Tensor, like: torch.Tensor):
        self.key = key
        self.v = torch.full((len(key),), float("inf"), dtype=like.dtype, device=like.device)
        self.k = torch.full((len(key),), -1, dtype=torch.long, device=like.device)
        self.i = torch.zeros(len(key), dtype=torch.long, device=like.device)

    def update(self, r0: int, r1: int, c0: int, c1: int, sims: torch.Tensor) -> None:
        v = torch.min(sims, dim=1).values
        keyed = torch.where(sims == v[:, None], self.key[None, c0:c1], -1)
        k, i = torch.max(keyed, dim=1)
        better = (v < self.v[r0:r1]) | ((v == self.v[r0:r1]) & (k > self.k[r0:r1]))
        self.v[r0:r1] = torch.where(better, v, self.v[r0:r1])
        self.k[r0:r1] = torch.where(better, k, self.k[r0:r1])
        self.i[r0:r1] = torch.where(better, i + c0, self.i[r0:r1])


#: slots kept beyond kmax: a tie across the kmax boundary is settled inside them while it has
#: fewer than this many candidates beyond the boundary (else the candidates are recomputed)
TIE_SLOTS = 9


def tie_keys(sample_ids) -> np.ndarray:
    """Each unit's position in the sorted sample ids of its scope: the order of candidates that tie."""
    ids = np.asarray(sample_ids).astype(str)
    key = np.empty(len(ids), dtype=np.int64)
    key[np.argsort(ids, kind="stable")] = np.arange(len(ids))
    return key


def distinct_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each distinct vector, each row's vector id): rows are the same vector when
    their bytes are (after −0 → +0); vector ids follow the sorted bytes, so they do not depend on
    the row order."""
    flat = np.ascontiguousarray(x + x.dtype.type(0))  # −0 + 0 = +0
    _, first, vid = np.unique(flat.view(np.dtype((np.void, flat.dtype.itemsize * flat.shape[1]))).ravel(),
                              return_index=True, return_inverse=True)
    return first, vid.ravel()


def _canonical_codes(codes: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Integer codes renumbered by the smallest tie key among each code's rows: the same partition,
    numbered independently of the row order."""
    codes = np.asarray(codes, dtype=np.int64)
    smallest = np.full(int(codes.max()) + 1, np.iinfo(np.int64).max)
    np.minimum.at(smallest, codes, key)
    rank = np.empty(len(smallest), dtype=np.int64)
    rank[np.argsort(smallest, kind="stable")] = np.arange(len(smallest))
    return rank[codes]


def _vector_order(x: np.ndarray, cell: np.ndarray, groups: np.ndarray, key: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(a row of each distinct vector, each row's vector id), vector ids ordered by the (cell,
    group) of the vector's smallest-key row and then by its bytes: rows without duplicates come in
    (cell, group) order, so a tile's columns hold few cells (contiguous ranges, no reordering),
    and nothing depends on the row order."""
    first, vid = distinct_rows(x)
    by_vector = np.lexsort((key, vid))
    lead = by_vector[np.searchsorted(vid[by_vector], np.arange(len(first)))]  # each vector's smallest-key row
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.lexsort((np.arange(len(first)), groups[lead], cell[lead]))] = np.arange(len(first))
    out_first = np.empty(len(first), dtype=np.int64)
    out_first[rank] = first
    return out_first, rank[vid]


def _blocks(counts: np.ndarray, block_size: int) -> list[tuple[int, int]]:
    """Consecutive vector-id ranges holding at most ``block_size`` member rows each (a vector with
    more members is a block of its own)."""
    if (counts == 1).all():
        return [(u, min(u + block_size, len(counts))) for u in range(0, len(counts), block_size)]
    out, u0, rows = [], 0, 0
    for u, c in enumerate(counts.tolist()):
        if rows and rows + c > block_size:
            out.append((u0, u))
            u0, rows = u, 0
        rows += c
    out.append((u0, len(counts)))
    return out


def _canonical(sim: np.ndarray, idx: np.ndarray, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's slots ordered by (similarity descending, tie key ascending); absent slots last."""
    k = np.where(idx >= 0, key[np.maximum(idx, 0)], np.iinfo(np.int64).max)
    order = np.lexsort((k, -sim), axis=1) if sim.size else np.zeros(sim.shape, dtype=np.int64)
    return np.take_along_axis(sim, order, 1), np.take_along_axis(idx, order, 1)


class _DistinctPass:
    """The tiles of the pass: products between distinct vectors (``vectors``, sorted), each pair of
    vector blocks once, expanded to member rows (processing order = rows by vector id, then tie key)."""

    def __init__(self, vectors: torch.Tensor, vid: np.ndarray, block_size: int):
        self.vectors, self.block_size = vectors, block_size
        counts = np.bincount(vid, minlength=len(vectors))
        start = np.r_[0, np.cumsum(counts)]
        self.blocks = [(u0, u1, int(start[u0]), int(start[u1])) for u0, u1 in _blocks(counts, block_size)]
        self.block_of = np.repeat(np.arange(len(self.blocks)), [u1 - u0 for u0, u1, _, _ in self.blocks])
        self.vid = torch.as_tensor(vid, device=vectors.device)

    def chunks(self, p0: int, p1: int) -> list[tuple[int, int]]:
        return [(r, min(r + self.block_size, p1)) for r in range(p0, p1, self.block_size)]

    def product(self, a: int, b: int) -> torch.Tensor:
        """Similarities of vector block ``a`` (rows) × block ``b`` (columns), a ≤ b."""
        (u0, u1, _, _), (v0, v1, _, _) = self.blocks[a], self.blocks[b]
        sims = self.vectors[u0:u1] @ self.vectors[v0:v1].T
        if a == b:
            sims.fill_diagonal_(1.0)  # a vector and itself: cosine exactly 1, distance exactly 0
        return sims

    def expand(self, sims: torch.Tensor, a: int, b: int, r0: int, r1: int, c0: int, c1: int) -> torch.Tensor:
        """The product's values for member rows r0:r1 × member columns c0:c1."""
        (u0, u1, _, _), (v0, v1, _, _) = self.blocks[a], self.blocks[b]
        if r1 - r0 == u1 - u0 and c1 - c0 == v1 - v0:  # no duplicates in either block
            return sims
        return sims[self.vid[r0:r1] - u0][:, self.vid[c0:c1] - v0]

    def tiles(self):
        """(r0, r1, c0, c1, sims, serves_columns) for every member tile; ``serves_columns``: the
        transposed tile also serves rows c0:c1 (off-diagonal vector blocks)."""
        for a, (_, _, p0, p1) in enumerate(self.blocks):
            for b in range(a, len(self.blocks)):
                q0, q1 = self.blocks[b][2:]
                sims = self.product(a, b)
                for r0, r1 in self.chunks(p0, p1):
                    for c0, c1 in self.chunks(q0, q1):
                        yield r0, r1, c0, c1, self.expand(sims, a, b, r0, r1, c0, c1), a != b

    def strips(self, rows: np.ndarray):
        """(q0, q1, sims) per vector block: the similarities of the member rows ``rows``
        (processing positions, all in one vector block) to member columns q0:q1, from the same
        products as :meth:`tiles` (recomputed) in the same roles, so the values are the same."""
        vids = self.vid[torch.as_tensor(rows, device=self.vid.device)]
        a = int(self.block_of[int(vids[0])])
        u0 = self.blocks[a][0]
        for b, (v0, _, q0, q1) in enumerate(self.blocks):
            part = self.product(a, b)[vids - u0] if b >= a else self.product(b, a).T[vids - u0]
            yield q0, q1, part[:, self.vid[q0:q1] - v0]


def _settle_boundary_ties(sim_out: np.ndarray, proc: np.ndarray, kmax: int, tiles: _DistinctPass,
                          groups: torch.Tensor, key: np.ndarray, far: np.ndarray | None,
                          far_in: np.ndarray | None = None) -> None:
    """Rows whose kmax-th similarity is shared by every extra slot (more tied candidates than the
    lists hold): the slots at that similarity become the candidates at exactly that similarity
    with the smallest tie keys (in place, first kmax slots). Where the tie ends inside the extra
    slots, every tied candidate is in the list and the tie-key sort has already placed them.
    Rare: many exact ties only (quantised or duplicated features)."""
    t = sim_out[:, kmax - 1]
    full = sim_out[:, -1] == t  # the tie may go on past the list
    if far_in is not None:
        full |= far_in  # the farthest sample's slot was emptied: the list's end says nothing
    tied = np.flatnonzero(np.isfinite(t) & (sim_out[:, kmax] == t) & full)
    if not len(tied):
        return
    device = groups.device
    block = tiles.block_of[tiles.vid.cpu().numpy()[tied]]
    for a in np.unique(block):
        rows_a = tied[block == a]
        for part in (rows_a[i:i + tiles.block_size] for i in range(0, len(rows_a), tiles.block_size)):
            rows = torch.as_tensor(part, device=device)
            t = torch.as_tensor(sim_out[part, kmax - 1], device=device).to(tiles.vectors.dtype)
            hits: list[list[np.ndarray]] = [[] for _ in part]
            for q0, q1, sims in tiles.strips(part):
                at_t = (sims == t[:, None]) & (groups[rows][:, None] != groups[None, q0:q1])  # self: same group
                if far is not None:
                    cols = torch.arange(q0, q1, device=device)
                    at_t &= cols[None, :] != torch.as_tensor(far[part], device=device)[:, None]
                j, c = (v.cpu().numpy() for v in torch.nonzero(at_t, as_tuple=True))
                for jj in np.unique(j):
                    hits[jj].append(c[j == jj] + q0)
            for jj, r in enumerate(part):
                above = int((sim_out[r, :kmax] > sim_out[r, kmax - 1]).sum())
                cand = np.concatenate(hits[jj]) if hits[jj] else np.zeros(0, dtype=np.int64)
                take = cand[np.argsort(key[cand], kind="stable")][:kmax - above]
                proc[r, above:above + len(take)] = take
                sim_out[r, above:above + len(take)] = sim_out[r, kmax - 1]


def scope_neighbours(feats: torch.Tensor, labels: np.ndarray, confs: np.ndarray, groups: np.ndarray,
                     kmax: int, m: int, block_size: int = 4096, tie_key: np.ndarray | None = None,
                     typed_width: int = 0) -> ScopeNeighbours:
    """Cross-group top-``kmax`` lists and per-type ``m`` nearest distances of one scope.

    ``feats``: unit-norm rows of the scope (torch, on the compute device; float64 stays float64,
    conventions A.1); ``labels``, ``confs``, ``groups``: integer codes per row. Reproduces the
    reference's neighbour fetch exactly, including its one quirk: when a unit's cross-group pool
    is no larger than ``kmax`` the reference fetches all but one row, so the unit never sees its
    single farthest other sample (conventions A.3, "tiny-N edge case"); the same sample is removed
    here (among equally far ones, the last in the tie rule's order). ``tie_key``: one integer per
    row ordering candidates that tie (module doc; default: the row position). ``typed_width``: also
    keep every row's ``typed_width`` nearest SO and OS candidates with their rows (``typed``; the
    influence's search, :mod:`~robustbench_fm.methods.croma.influence`), read off the same tiles;
    only where the scope has no identical rows (else ``typed`` is None: copies' similarities are
    set to exactly 1 here, not taken from a product).
    """
    n = len(labels)
    key_in = np.arange(n) if tie_key is None else np.asarray(tie_key, dtype=np.int64)
    labels, confs, groups = (_canonical_codes(c, key_in) for c in (labels, confs, groups))
    n_conf = int(confs.max()) + 1
    cell = labels * n_conf + confs
    first, vid_in = _vector_order(feats.cpu().numpy(), cell, groups, key_in)
    order = np.lexsort((key_in, vid_in))  # processing order: by vector, then tie key
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.arange(n)
    device = feats.device
    vectors = feats[torch.as_tensor(first, device=device)] + 0.0
    tiles = _DistinctPass(vectors, vid_in[order], block_size)
    key = key_in[order]
    grp = torch.as_tensor(groups[order], device=device)
    group_size = np.bincount(groups)
    drop_farthest = bool((n - group_size[groups] <= kmax).any())
    best = RunningTopK(n, min(kmax + TIE_SLOTS + int(drop_farthest), n), vectors, filled=True)
    keep = typed_width > 0 and len(first) == n
    typed = _TypedLists(cell[order], n_conf, max(m, typed_width) if keep else m, vectors, indices=keep)
    far = _Farthest(torch.as_tensor(key, device=device), vectors) if drop_farthest else None
    at_groups = groups[order]
    transposed = Transposer()
    for r0, r1, c0, c1, sims, both in tiles.tiles():
        if far is not None:
            far.update(r0, r1, c0, c1, sims)
            if both:
                far.update(c0, c1, r0, r1, sims.T)
        # self and same group; the rows come in (cell, group) order, so most tiles share no group
        if np.intersect1d(at_groups[r0:r1], at_groups[c0:c1]).size:
            sims.masked_fill_(grp[r0:r1, None] == grp[None, c0:c1], float("-inf"))
        best.update(r0, sims, c0)
        typed.update(r0, r1, c0, c1, sims)
        if both:  # the transposed tile as a contiguous copy (core.neighbors.Transposer)
            cols = transposed(sims)
            best.update(c0, cols, r0)
            typed.update(c0, c1, r0, r1, cols)
    best_v, best_i = best.result()
    far_i, far_in = None, None
    if far is not None:
        hit = best_i == far.i[:, None]
        best_v, far_i, far_in = best_v.masked_fill(hit, float("-inf")), far.i.cpu().numpy(), hit.any(1).cpu().numpy()
    sim_out = best_v.double().cpu().numpy()
    proc = np.where(np.isfinite(sim_out), best_i.cpu().numpy(), -1)
    sim_out, proc = _canonical(sim_out, proc, key)
    if sim_out.shape[1] > kmax:  # extra slots all tied with the kmax-th: the boundary cut was arbitrary
        _settle_boundary_ties(sim_out, proc, kmax, tiles, grp, key, far_i, far_in)
        sim_out, proc = sim_out[:, :kmax], proc[:, :kmax]
    valid = np.isfinite(sim_out)
    idx = np.where(valid, order[np.maximum(proc, 0)], -1)
    if idx.shape[1] < kmax:
        pad = kmax - idx.shape[1]
        idx, sim_out = np.pad(idx, ((0, 0), (0, pad)), constant_values=-1), np.pad(
            sim_out, ((0, 0), (0, pad)), constant_values=-np.inf)
    lists = None
    if keep:  # processing positions -> scope rows, rows -1 where no candidate
        lists = tuple((v[inverse], np.where(np.isfinite(v), order[i], -1)[inverse])
                      for v, i in ((t.double().cpu().numpy(), j.cpu().numpy())
                                   for t, j in ((typed.so, typed.so_i), (typed.os, typed.os_i))))
    return ScopeNeighbours(idx=idx[inverse], dist=cosine_distance(sim_out, feats.dtype)[inverse],
                           count=valid.sum(axis=1)[inverse],
                           so_dist=cosine_distance(typed.so[:, :m].double().cpu().numpy(), feats.dtype)[inverse],
                           os_dist=cosine_distance(typed.os[:, :m].double().cpu().numpy(), feats.dtype)[inverse],
                           typed=lists)
