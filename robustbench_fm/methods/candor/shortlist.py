"""CANDOR's shortlist: one symmetric pass over a matched group's labelled images answers every
neighbour question the stage asks about them (candor.md Eq. 1; one pass for the 72 questions of
12 findings).

:class:`Shortlist` keeps, for every member of ``rows``, its ``size`` most similar members; the k
nearest of any candidate subset R ⊆ rows are the first k entries that belong to R, or, where the
list is too short, are read off the held similarity matrix or found by an exact search; a c(x)
does not depend on the branch that answered it. It is built on the engine of
:mod:`robustbench_fm.core.neighbors`, whose names its docstrings use unqualified (the symmetric
pass, :class:`RunningTopK`, :func:`topk_rows` and the keyed top-k, the products between distinct
vectors, so copies tie exactly). :mod:`~robustbench_fm.methods.candor.stage` builds one per
matched group (:func:`~robustbench_fm.methods.candor.stage.shortlist_size`,
:func:`~robustbench_fm.methods.candor.stage.group_path`) and
:mod:`~robustbench_fm.methods.candor.influence` reads the same one.
"""
from __future__ import annotations

import numpy as np
import torch

from ...core.neighbors import (
    COLUMN_BLOCK,
    Neighbours,
    RunningTopK,
    distinct_product,
    has_copies,
    mean_topk_similarity,
    representatives,
    row_parallel,
    spans,
    symmetric_matrix,
    symmetric_tiles,
    topk_columns,
    topk_columns_keyed,
    topk_means,
    topk_rows,
    topk_rows_keyed,
    vector_blocks,
)

#: bytes of a group's whole similarity matrix a :class:`Shortlist` may hold (:func:`symmetric_matrix`);
#: a larger group is shortlisted tile by tile without it
MATRIX_BYTES = 1 << 30


#: the tile of a held matrix on the CPU (:class:`Shortlist`; ``block_size`` when smaller): the tiles on and above
#: the diagonal of m row blocks make (m + 1) / 2m of the products; 2,048 against 4,096 at 8,000 rows: ~8% less
#: time, 512 against 2,048 (53% of the products instead of 62.5%): 0.82–0.88 s instead of 0.94–1.07 s on one
#: thread (AMD EPYC, AVX-512; 256 and 384 no faster), the same bits (each entry is the same dot product)
MATRIX_TILE = 512


def _numpy_dtype(dtype: torch.dtype):
    return np.float64 if dtype == torch.float64 else np.float32


def _position_dtype(n_rows: int):
    """The narrowest integer dtype of a position among ``n_rows`` rows (int16 or int32): a quarter or
    half of the int64 rows to read per scan."""
    return np.int16 if n_rows <= 2**15 else np.int32


class Shortlist:
    """The ``size`` most similar members of ``rows`` for every member of ``rows`` (self excluded).

    One blocked symmetric pass (:func:`symmetric_tiles`, ``block_size`` × ``block_size`` tiles on
    and above the diagonal) stores each row's shortlist sorted by similarity. The k nearest members
    of any candidate subset R ⊆ rows are then the first k shortlist entries that belong to R.
    CANDOR asks 6 such questions per finding and matched group (c± on the banks and on all images,
    and the margin of every image), for 12 findings, about the same images: one pass replaces 72.

    When the whole similarity matrix fits in :data:`MATRIX_BYTES` (8,000 rows: 256 MB) it is held
    (``matrix``, assembled from the pass's tiles, diagonal −inf) and each row's shortlist is taken
    from it (:func:`topk_rows`); a set R too sparse for the shortlist (its first scan wider than
    ``size``) and a row whose scan finds fewer than k members of R are then read off the matrix:
    every similarity comes from the same products, so a c(x) does not depend on the branch that
    answered it. A larger group is shortlisted tile by tile (:class:`RunningTopK`) and a short row
    is answered by an exact search against R (:func:`topk_similarity`). Either way
    :meth:`mean_topk` equals :func:`mean_topk_similarity`.
    """

    def __init__(self, feats: torch.Tensor, rows, size: int = 256, block_size: int = 4096,
                 backend: str = "torch", vectors: np.ndarray | None = None, workspace: torch.Tensor | None = None):
        self.feats, self.backend, self.block_size, self.vectors = feats, backend, block_size, vectors
        self.rows = np.sort(np.asarray(rows, dtype=np.int64))
        n, device = len(self.rows), feats.device
        self.size = max(0, min(size, n - 1))
        self.matrix = None  # the whole similarity matrix (diagonal −inf) when held
        self._positions_np = None  # the members' positions in rows (:attr:`_positions`), once known
        if has_copies(vectors, self.rows):
            self.values, self.members = self._distinct_pass(np.asarray(vectors))
            return
        x = feats[torch.as_tensor(self.rows, device=device)]
        if n * n * x.element_size() <= MATRIX_BYTES:
            tile = min(block_size, MATRIX_TILE) if device.type == "cpu" else block_size
            self.matrix = symmetric_matrix(x, tile, workspace).fill_diagonal_(float("-inf"))
            parts = row_parallel(lambda r0, r1: self._top_rows(r0, r1), n, device)
            self.values = torch.cat([v for v, _ in parts]) if parts else x.new_empty((0, self.size))
            members = torch.cat([i for _, i in parts]) if parts else torch.empty((0, self.size), dtype=torch.long,
                                                                                 device=device)
            self.members = torch.as_tensor(self.rows, device=device)[members]
            if device.type == "cpu":  # the positions in rows are the matrix's columns (no search for them)
                self._positions_np = members.numpy().astype(_position_dtype(n))
            return
        best = RunningTopK(n, self.size, x)
        for a0, _, b0, _, sims in symmetric_tiles(x, block_size):
            if a0 == b0:
                sims.fill_diagonal_(float("-inf"))
            best.update(a0, sims, b0)
            if a0 != b0:
                best.update(b0, sims.T, a0)
        self.values, members = best.result()
        self.members = torch.as_tensor(self.rows, device=device)[members]

    def _top_rows(self, r0: int, r1: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The shortlist of the held matrix's rows r0:r1: :func:`topk_rows_keyed` on the CPU (the same
        values as :func:`topk_rows`, a fraction of its time), else :func:`topk_rows`."""
        if self.matrix.device.type == "cpu":
            keyed = topk_rows_keyed(self.matrix[r0:r1].numpy(), self.size)
            if keyed is not None:
                return torch.from_numpy(keyed[0]), torch.from_numpy(keyed[1])
        return topk_rows(self.matrix[r0:r1], self.size)

    def _distinct_pass(self, vectors: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The symmetric pass over distinct vectors (module doc): rows ordered by vector id, cut into
        blocks of whole vectors, each pair of blocks' product computed once (a vector and itself:
        1; the diagonal block's lower triangle copied from its upper one, so every similarity is
        symmetric bitwise), expanded to member rows, each row itself masked; (values, member rows) in
        ``rows`` order."""
        device, width = self.feats.device, self.block_size
        order = np.argsort(vectors[self.rows], kind="stable")
        ids = vectors[self.rows][order]
        rep = representatives(vectors)
        blocks = vector_blocks(ids, width)
        best = RunningTopK(len(self.rows), self.size, self.feats)
        for a, (p0, p1) in enumerate(blocks):
            a_ids = np.unique(ids[p0:p1])
            for q0, q1 in blocks[a:]:
                b_ids = np.unique(ids[q0:q1])
                sims = distinct_product(self.feats, rep, a_ids, b_ids)
                if q0 == p0:  # one entry per pair of vectors, as off the diagonal: sim(u, v) == sim(v, u)
                    sims = torch.triu(sims) + torch.triu(sims, 1).T
                for r0, r1 in spans(p0, p1, width):
                    rsel = torch.as_tensor(np.searchsorted(a_ids, ids[r0:r1]), device=device)
                    for c0, c1 in spans(q0, q1, width):
                        part = sims[rsel][:, torch.as_tensor(np.searchsorted(b_ids, ids[c0:c1]), device=device)]
                        if r0 == c0:
                            part.fill_diagonal_(float("-inf"))
                        best.update(r0, part, c0)
                        if q0 != p0:
                            best.update(c0, part.T, r0)
        values, members = best.result()
        back = torch.as_tensor(np.argsort(order, kind="stable"), device=device)
        proc_rows = torch.as_tensor(self.rows[order], device=device)
        return values[back], proc_rows[members[back]]

    def _local(self, query_rows: np.ndarray) -> np.ndarray:
        at = np.searchsorted(self.rows, query_rows)
        if (at >= len(self.rows)).any() or (self.rows[at.clip(max=len(self.rows) - 1)] != query_rows).any():
            raise ValueError("Shortlist.mean_topk: every query must be one of the shortlist's rows")
        return at

    def mean_topk(self, query_rows, cand_rows, k: int, scan_factor: float = 4.0, neighbours: bool = False
                  ) -> np.ndarray | tuple[np.ndarray, Neighbours]:
        """c(x) = (1/k) Σ_{z ∈ N_k(x; R)} <g(x), g(z)> with R = ``cand_rows`` ⊆ ``rows``,
        the query itself never its own neighbour (candor.md, Eq. 1).

        The first ``scan_factor · k · |rows| / |R|`` shortlist entries are scanned (enough for k
        members of R when neighbours are spread like R), then the whole shortlist for rows still
        short of k, then the held matrix or an exact search for the rest; with the matrix held, an
        R whose first scan is wider than the shortlist is read off the matrix for every row.

        ``neighbours``: also return the :class:`Neighbours` each c(x) averaged, read out of the
        branch that answered the row (the same entries its sum took; the c(x) are unchanged).
        """
        query_rows = np.asarray(query_rows, dtype=np.int64)
        cand_rows = np.asarray(cand_rows, dtype=np.int64)
        out = np.full(len(query_rows), np.nan)
        found = Neighbours.empty(len(query_rows), k, _numpy_dtype(self.feats.dtype)) if neighbours else None
        device = self.feats.device
        if device.type == "cpu":
            in_r = np.zeros(self.feats.shape[0], bool)
            in_r[cand_rows] = True
        else:
            in_r = torch.zeros(self.feats.shape[0], dtype=torch.bool, device=device)
            in_r[torch.as_tensor(cand_rows, device=device)] = True
        positions = self._local(query_rows)
        todo = np.arange(len(query_rows))
        first = self.scan_width(k, len(self.rows), len(cand_rows), scan_factor)
        widths = sorted({min(first, self.size), self.size})
        if self.matrix is not None and first > self.size:
            widths = []  # R too sparse for the shortlist: every row read off the matrix
        for width in widths:
            if len(todo) == 0 or width < k:
                continue
            local = positions[todo] if device.type == "cpu" else torch.as_tensor(positions[todo], device=device)
            if neighbours:
                parts = row_parallel(lambda r0, r1: self._first_hits(local[r0:r1], in_r, k, width, True), len(local),
                                     device)
            else:
                parts = row_parallel(lambda r0, r1: self._first_hits(local[r0:r1], in_r, k, width), len(local), device)
            sums, hits = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
            done = hits == k
            out[todo[done]] = sums[done] / k
            if neighbours:
                taken = Neighbours(np.concatenate([p[2] for p in parts]), np.concatenate([p[3] for p in parts]))
                found.put(todo[done], taken.take(done))
            todo = todo[~done]
        if len(todo) and self.matrix is not None:
            if neighbours:
                out[todo], rest = self._matrix_means(positions[todo], self._local(cand_rows), k, True)
                found.put(todo, rest)
            else:
                out[todo] = self._matrix_means(positions[todo], self._local(cand_rows), k)
        elif len(todo):
            if neighbours:
                out[todo], rest = topk_means(self.feats, query_rows[todo], cand_rows, k, self.block_size, self.backend,
                                             self.vectors)
                found.put(todo, rest)
            else:
                out[todo] = mean_topk_similarity(self.feats, query_rows[todo], cand_rows, k,
                                                 self.block_size, self.backend, self.vectors)
        return (out, found) if neighbours else out

    @staticmethod
    def scan_width(k: int, n_rows: int, n_cands: int, scan_factor: float = 4.0) -> int:
        """Shortlist entries :meth:`mean_topk` scans first for k members of a candidate set of
        ``n_cands`` among ``n_rows``: ``scan_factor · k · n_rows / n_cands``."""
        return int(np.ceil(scan_factor * k * n_rows / max(n_cands, 1)))

    def _matrix_means(self, local: np.ndarray, cand_local: np.ndarray, k: int, neighbours: bool = False):
        """c(x) of the rows ``local`` on the rows ``cand_local`` read off the held matrix (its
        diagonal −inf: a row is never its own neighbour), ``block_size`` rows at a time; the mean
        of the k largest in float64, as :func:`mean_topk_similarity` takes it. ``neighbours``:
        (c(x), the :class:`Neighbours` each mean took)."""
        device = self.matrix.device
        if len(cand_local) - int(np.isin(local, cand_local).any()) < k:
            raise ValueError(f"k={k} exceeds the candidates available")
        # the matrix is symmetric bitwise: the candidates' rows, read at the query columns, are the
        # queries' rows at the candidate columns (|R| × n copied instead of |queries| × n)
        n, r, b = len(self.rows), len(cand_local), COLUMN_BLOCK
        if len(local) * 4 >= n and device.type == "cpu" and int(np.sqrt(r / max(k, 1))) >= 4:
            # most rows, on the CPU: every column's top k down the candidates' rows by keys
            cand_np = self.matrix.index_select(0, torch.as_tensor(cand_local)).numpy()
            parts = row_parallel(lambda c0, c1: topk_columns_keyed(cand_np[:, c0:c1], k), n, device)
            if all(part is not None for part in parts):
                every = torch.cat([torch.from_numpy(values).double().mean(dim=0) for values, _ in parts])
                means = every[torch.as_tensor(local)].numpy()
                if not neighbours:
                    return means
                values = np.concatenate([v for v, _ in parts], axis=1)[:, local].T
                at = np.concatenate([i for _, i in parts], axis=1)[:, local].T
                return means, Neighbours(self.rows[cand_local[at]], np.ascontiguousarray(values))
        if len(local) * 4 >= n and r >= k * b:  # most rows: every column's top k down the candidates' rows
            blocks = -(-r // b)
            cand_rows = self.matrix.new_full((blocks * b, n), float("-inf"))
            torch.index_select(self.matrix, 0, torch.as_tensor(cand_local, device=device), out=cand_rows[:r])
            if not neighbours:
                every = torch.cat(row_parallel(lambda c0, c1: topk_columns(cand_rows[:, c0:c1], k, b)[0].double().mean(
                    dim=0), n, device))
                return every[torch.as_tensor(local, device=device)].cpu().numpy()

            def columns(c0: int, c1: int):
                values, at = topk_columns(cand_rows[:, c0:c1], k, b)
                return values.double().mean(dim=0), values, at

            parts = row_parallel(columns, n, device)
            pick = torch.as_tensor(local, device=device)
            means = torch.cat([m for m, _, _ in parts])[pick].cpu().numpy()
            values = torch.cat([v for _, v, _ in parts], dim=1)[:, pick].T.cpu().numpy()
            at = torch.cat([i for _, _, i in parts], dim=1)[:, pick].T.cpu().numpy()
            return means, Neighbours(self.rows[cand_local[at]], np.ascontiguousarray(values))
        # a few rows: their own entries at the candidate columns, gathered straight off the matrix (the very
        # values of the candidates' rows at their columns, the matrix being symmetric bitwise), instead of a
        # copy of the candidates' |R| × n rows
        if device.type == "cpu":
            matrix_np = self.matrix.numpy()

            def rows_at(r0: int, r1: int) -> torch.Tensor:
                return torch.from_numpy(matrix_np[np.ix_(local[r0:r1], cand_local)])
        else:
            local_t, cand_t = torch.as_tensor(local, device=device), torch.as_tensor(cand_local, device=device)

            def rows_at(r0: int, r1: int) -> torch.Tensor:
                return self.matrix.index_select(0, local_t[r0:r1]).index_select(1, cand_t)

        def means(r0: int, r1: int) -> torch.Tensor:
            return topk_rows(rows_at(r0, r1), k)[0].double().mean(dim=1)

        if not neighbours:
            return torch.cat(row_parallel(means, len(local), device)).cpu().numpy()

        def means_and_rows(r0: int, r1: int):
            values, at = topk_rows(rows_at(r0, r1), k)
            return values.double().mean(dim=1), values, at

        parts = row_parallel(means_and_rows, len(local), device)
        at = torch.cat([i for _, _, i in parts]).cpu().numpy()
        return (torch.cat([m for m, _, _ in parts]).cpu().numpy(),
                Neighbours(self.rows[cand_local[at]], torch.cat([v for _, v, _ in parts]).cpu().numpy()))

    def _first_hits(self, local, in_r, k: int, width: int, neighbours: bool = False):
        """Sum (float64) of the first k shortlist similarities within ``width`` that belong to R,
        and how many were found (≤ k); ``neighbours``: then also those k entries' rows and values
        (rows −1 where fewer than k were found). On a GPU (tensors) the k earliest members are the k largest
        scores ``member × (width − position)``; on the CPU (numpy arrays, no per-op thread barrier)
        the members' flat positions (one ``flatnonzero`` over the entries' membership in R, read through
        the members' positions in ``rows``, :attr:`_positions`) give each row's first k. Either way the k
        values are summed in list order (largest first)."""
        if isinstance(local, np.ndarray):
            hit = in_r[self.rows][self._positions[local, :width]]  # R's members among the entries
            at = np.flatnonzero(hit)  # (row, entry) of every member in list order, row by row
            counts = np.bincount(at // width, minlength=len(local))
            found = np.minimum(counts, k)
            sums = np.zeros(len(local))
            done = np.flatnonzero(found == k)
            if neighbours:
                taken = Neighbours.empty(len(local), k, self._values_np.dtype)
            if len(done):
                first = at[(np.cumsum(counts) - counts)[done][:, None] + np.arange(k)]  # each row's first k
                raw = self._values_np[local[done][:, None], first % width]
                values = raw.astype(np.float64)
                total = values[:, 0].copy()
                for j in range(1, k):
                    total += values[:, j]
                sums[done] = total
                if neighbours:
                    taken.put(done, Neighbours(self._members_np[local[done][:, None], first % width], raw))
            return (sums, found, *taken) if neighbours else (sums, found)
        hit = in_r[self.members[local, :width]]
        rank = torch.arange(width, 0, -1, dtype=torch.int32 if width > 32767 else torch.int16,
                            device=hit.device)
        score, at = torch.topk(hit.to(rank.dtype) * rank, k, dim=1)
        taken = score > 0
        raw = torch.gather(self.values[local, :width], 1, at)
        values = raw.double()
        sums = torch.where(taken, values, 0.0).sum(dim=1)
        if neighbours:  # a row short of k is not taken (its rows here are of no use)
            rows = torch.gather(self.members[local, :width], 1, at)
            return sums.cpu().numpy(), taken.sum(dim=1).cpu().numpy(), rows.cpu().numpy(), raw.cpu().numpy()
        return sums.cpu().numpy(), taken.sum(dim=1).cpu().numpy()

    @property
    def _members_np(self) -> np.ndarray:
        return self.members.numpy()

    @property
    def _positions(self) -> np.ndarray:
        """The shortlist's members as positions in ``rows`` (:func:`_position_dtype`): the held
        matrix's columns, else searched once."""
        if self._positions_np is None:
            self._positions_np = np.searchsorted(self.rows, self._members_np).astype(_position_dtype(len(self.rows)))
        return self._positions_np

    @property
    def _values_np(self) -> np.ndarray:
        return self.values.numpy()
