"""Exact cosine k-nearest neighbours by blocked matrix products (torch; GPU when present).

Features are L2-normalised first (DESIGN.md, Conventions), so cosine similarity is the inner
product. Memory is bounded by ``block_size`` query rows × ``cand_block`` candidates at a time.

:class:`Shortlist` serves many neighbour questions about one set of images (the 12 findings'
banks of one matched group) from a single similarity pass; :func:`topk_similarity` answers one
question directly, and with ``backend="faiss"`` (the ``[gpu]`` extra) delegates the search to
an exact faiss inner-product index for very large candidate sets.
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
                    block_size: int = 4096, cand_block: int = 65536, backend: str = "torch"
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest cosine similarities of each query among the candidates, self excluded.

    ``feats`` is the unit-norm matrix (on the compute device); ``query_rows`` and ``cand_rows``
    index into it. A query that is itself a candidate never counts as its own neighbour.
    Queries are processed ``block_size`` at a time and candidates ``cand_block`` at a time (the
    running top-k is merged across candidate blocks), so memory is bounded by
    ``block_size × cand_block`` similarities whatever the set sizes.
    Returns (similarities [Q, k] sorted descending, candidate positions [Q, k]) on the device.
    ``backend="faiss"`` gives the same neighbours from an exact faiss index (ties may be broken
    differently; the similarities agree to float tolerance).
    """
    query_rows = np.asarray(query_rows, dtype=np.int64)
    cand_rows = np.asarray(cand_rows, dtype=np.int64)
    available = len(cand_rows) - int(np.isin(query_rows, cand_rows).any())
    if available < k:
        raise ValueError(f"k={k} exceeds the {available} candidates available")
    if backend == "faiss":
        return _faiss_topk(feats, query_rows, cand_rows, k)
    if backend != "torch":
        raise ValueError(f"neighbour backend '{backend}' is not one of torch, faiss")
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


def _faiss_topk(feats: torch.Tensor, query_rows: np.ndarray, cand_rows: np.ndarray, k: int):
    """Exact inner-product search with faiss (GPU index when faiss-gpu and CUDA are present)."""
    try:
        import faiss
    except ImportError:
        raise ImportError("neighbour backend 'faiss' needs faiss: pip install 'robustbench_fm[gpu]' "
                          "(faiss-gpu-cu12) or faiss-cpu") from None
    x = feats.detach().float().cpu().numpy()
    index = faiss.IndexFlatIP(x.shape[1])
    if feats.device.type == "cuda" and hasattr(faiss, "StandardGpuResources"):
        index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), feats.device.index or 0, index)
    index.add(np.ascontiguousarray(x[cand_rows]))
    # one extra neighbour covers the query itself when it is a candidate
    sims, pos = index.search(np.ascontiguousarray(x[query_rows]), min(k + 1, len(cand_rows)))
    own = cand_rows[pos.clip(min=0)] == query_rows[:, None]
    sims = np.where(own | (pos < 0), -np.inf, sims)
    order = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    values = np.take_along_axis(sims, order, 1)
    return (torch.as_tensor(values, device=feats.device),
            torch.as_tensor(np.take_along_axis(pos, order, 1), device=feats.device))


def mean_topk_similarity(feats: torch.Tensor, query_rows, cand_rows, k: int,
                         block_size: int = 4096, backend: str = "torch") -> np.ndarray:
    """c(x) = (1/k) Σ_{z ∈ N_k(x; R)} <g(x), g(z)> for every query (candor.md, Eq. 1 for c±)."""
    values, _ = topk_similarity(feats, query_rows, cand_rows, k, block_size, backend=backend)
    return values.double().mean(dim=1).cpu().numpy()


class Shortlist:
    """The ``size`` most similar members of ``rows`` for every member of ``rows`` (self excluded).

    One blocked pass (``block_size`` rows × all of ``rows`` similarities at a time) stores each
    row's shortlist sorted by similarity. The k nearest members of any candidate subset R ⊆ rows
    are then the first k shortlist entries that belong to R; a row whose shortlist holds fewer
    than k members of R is answered by an exact search against R (:func:`topk_similarity`), so
    :meth:`mean_topk` always equals :func:`mean_topk_similarity`. CANDOR asks 6 such questions
    per finding and matched group (c± on the banks and on all images, and the margin of every
    image), for 12 findings, about the same images: one pass replaces 72.
    """

    def __init__(self, feats: torch.Tensor, rows, size: int = 256, block_size: int = 4096,
                 backend: str = "torch"):
        self.feats, self.backend, self.block_size = feats, backend, block_size
        self.rows = np.sort(np.asarray(rows, dtype=np.int64))
        n, device = len(self.rows), feats.device
        self.size = max(0, min(size, n - 1))
        x = feats[torch.as_tensor(self.rows, device=device)]
        starts = list(range(0, n, block_size))
        best: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(starts)
        # The similarity matrix is symmetric: block (i, j) serves row block i and, transposed,
        # row block j, so only the blocks on and above the diagonal are multiplied.
        for bi, i in enumerate(starts):
            xi = x[i:i + block_size]
            for bj in range(bi, len(starts)):
                j = starts[bj]
                sims = xi @ x[j:j + block_size].T
                if bi == bj:
                    sims.fill_diagonal_(float("-inf"))
                best[bi] = self._merge(best[bi], sims, j)
                if bi != bj:
                    best[bj] = self._merge(best[bj], sims.T, i)
        self.values = torch.cat([b[0] for b in best]) if best else torch.empty((0, 0), device=device)
        members = torch.cat([b[1] for b in best]) if best else torch.empty((0, 0), dtype=torch.long, device=device)
        self.members = torch.as_tensor(self.rows, device=device)[members]

    def _merge(self, current, sims: torch.Tensor, offset: int):
        """Running top-``size`` (values, local column indices) of a row block after one more
        column block of similarities starting at column ``offset``."""
        v, i = torch.topk(sims, min(self.size, sims.shape[1]), dim=1)
        i = i + offset
        if current is not None:
            merged = torch.cat([current[0], v], 1)
            v, at = torch.topk(merged, min(self.size, merged.shape[1]), dim=1)
            i = torch.gather(torch.cat([current[1], i], 1), 1, at)
        return v, i

    def _local(self, query_rows: np.ndarray) -> np.ndarray:
        at = np.searchsorted(self.rows, query_rows)
        if (at >= len(self.rows)).any() or (self.rows[at.clip(max=len(self.rows) - 1)] != query_rows).any():
            raise ValueError("Shortlist.mean_topk: every query must be one of the shortlist's rows")
        return at

    def mean_topk(self, query_rows, cand_rows, k: int, scan_factor: float = 4.0) -> np.ndarray:
        """c(x) = (1/k) Σ_{z ∈ N_k(x; R)} <g(x), g(z)> with R = ``cand_rows`` ⊆ ``rows``,
        the query itself never its own neighbour (candor.md, Eq. 1).

        The first ``scan_factor · k · |rows| / |R|`` shortlist entries are scanned (enough for k
        members of R when neighbours are spread like R), then the whole shortlist for rows still
        short of k, then an exact search for the rest.
        """
        query_rows = np.asarray(query_rows, dtype=np.int64)
        cand_rows = np.asarray(cand_rows, dtype=np.int64)
        out = np.full(len(query_rows), np.nan)
        device = self.feats.device
        in_r = torch.zeros(self.feats.shape[0], dtype=torch.bool, device=device)
        in_r[torch.as_tensor(cand_rows, device=device)] = True
        positions = self._local(query_rows)
        todo = np.arange(len(query_rows))
        first = int(np.ceil(scan_factor * k * len(self.rows) / max(len(cand_rows), 1)))
        for width in sorted({min(first, self.size), self.size}):
            if len(todo) == 0 or width < k:
                continue
            local = torch.as_tensor(positions[todo], device=device)
            sums, found = self._first_hits(local, in_r, k, width)
            done = found == k
            out[todo[done]] = sums[done] / k
            todo = todo[~done]
        if len(todo):
            out[todo] = mean_topk_similarity(self.feats, query_rows[todo], cand_rows, k,
                                             self.block_size, self.backend)
        return out

    def _first_hits(self, local: torch.Tensor, in_r: torch.Tensor, k: int, width: int):
        """Sum (float64) of the first k shortlist similarities within ``width`` that belong to R,
        and how many were found (≤ k). The k earliest members are the k largest scores
        ``member × (width − position)``."""
        hit = in_r[self.members[local, :width]]
        rank = torch.arange(width, 0, -1, dtype=torch.int32 if width > 32767 else torch.int16,
                            device=hit.device)
        score, at = torch.topk(hit.to(rank.dtype) * rank, k, dim=1)
        taken = score > 0
        values = torch.gather(self.values[local, :width], 1, at).double()
        sums = torch.where(taken, values, 0.0).sum(dim=1)
        return sums.cpu().numpy(), taken.sum(dim=1).cpu().numpy()
