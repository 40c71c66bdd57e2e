"""The one exact cosine k-nearest-neighbour engine (torch; GPU when present) and the one L2
normaliser, shared by CANDOR (candor.md Eq. 1 and Eq. 5) and CRoMa (croma_conventions.md A.1, A.3).

Features are L2-normalised first (:func:`l2_normalize`), so cosine
similarity is the inner product and cosine distance is ``1 − s`` (:func:`cosine_distance`).
Similarities are computed tile by tile with a matmul and reduced to running top-k lists, so memory
is bounded by one tile whatever the set sizes. The pieces:

* :func:`merge_topk`: the running top-k merge every search uses (one more tile of similarities
  folded into a row block's best-so-far list);
* :func:`topk_similarity`: the k nearest of each query among a candidate subset (bank), the query
  itself excluded, in query × candidate tiles; :func:`mean_topk_similarity` averages it (c(x));
  :func:`topk_means` and CANDOR's ``Shortlist.mean_topk`` ``(neighbours=True)`` also return the
  :class:`Neighbours` each c(x) averaged (CANDOR's ``neighbours.parquet``), by the same ops;
  ``backend="faiss"`` (the ``[gpu]`` extra) sends the search to an exact faiss index instead;
* :func:`symmetric_tiles`, :class:`RunningTopK` and :class:`SameGroupMask`: the symmetric pass
  over one set of rows (each tile on or above the diagonal computed once, serving its rows and,
  transposed, its columns), with self or every candidate sharing the row's group excluded before
  the top-k. CANDOR's shortlist (:class:`robustbench_fm.methods.candor.shortlist.Shortlist`: one
  pass answers the 72 neighbour questions of a matched group; :func:`symmetric_matrix` assembles
  the pass's tiles into the whole matrix when it fits), the confounder scan's graph and CRoMa's
  scope pass (:func:`robustbench_fm.methods.croma.knn.scope_neighbours`) are built on it;
* :func:`topk_rows`: ``torch.topk`` of each row through a chunk-maximum prefilter (the same values,
  a fraction of the comparisons when k is small against the row); on the CPU a held matrix's rows
  and columns are selected by :func:`topk_rows_keyed` / :func:`topk_columns_keyed` instead (a
  threshold from strided chunk maxima, then one sort of integer keys: the same values again, the
  shortlist of an 8,000-row group in ~0.26 s instead of ~0.65 s on one thread).

The engine computes in the dtype of the tensor it is given: float32 for CANDOR, float64 features
stay float64 for CRoMa (conventions A.1; its agreement with the reference is checked in float64).

**Identical rows are one vector** (``vectors``, from :func:`distinct_rows`). Inside one matrix
product two bitwise-identical rows can get different similarities to the same candidate (the BLAS
kernel rounds each output position its own way), so duplicated feature vectors would not tie
exactly. Given each row's vector id, :func:`topk_similarity` and CANDOR's shortlist compute the
products between distinct vectors only, each pair of distinct vectors once per search (a vector
and itself: exactly 1), and expand them to the member rows by indexing: rows sharing a vector get
the very same similarities, so CANDOR's c(x) and margins of copies are bitwise equal (CRoMa's
scope pass, :mod:`robustbench_fm.methods.croma.knn`, does the same). Without duplicates the search
is the plain blocked product.

Ties between equal similarities are broken by ``torch.topk``, whose order among equal values is
unspecified. CANDOR's c(x) and CRoMa's typed distances read only values, which ties cannot change
(conventions A.7); CRoMa's neighbour identities follow the reference, whose ties are arbitrary too
(sklearn's argpartition, conventions A.1). Ties are nonetheless reproducible run to run: each
search's sequence of torch operations (tile widths, merge order, lists started empty or filled
with −inf) is fixed, and changing it may move a tie.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
import torch

from .devices import torch_threads
from .errors import InvalidSetting
from .handover import HandedOver, hand_over  # noqa: F401  (hand_over: importable here)

#: bytes of one block of rows :func:`l2_normalize` checks and measures at a time: its working set
NORMALIZE_BLOCK_BYTES = 64 << 20
#: rows :func:`l2_normalize` measures and :func:`distinct_rows` hashes at a time inside a block, so that their
#: temporaries stay in cache (256 rows of 1,024 floats: 1 MB, 2 MB as uint64): the hash of 88,000 × 1,024 0.09 s
#: instead of 0.36-0.38 s on one thread (AMD EPYC), the same values (each row is reduced on its own)
HASH_ROWS = 256


def l2_normalize(x: np.ndarray, source: str = "features", dtype=np.float32) -> np.ndarray:
    """Rows scaled to unit length in ``dtype`` (``None``: float64 stays float64, anything else
    becomes float32, the reference's "the dtype is kept" of croma_conventions.md A.1).

    NaN/Inf and zero rows are refused (they have no direction); ``source`` names the matrix in
    the message. Rows are checked and measured block by block (:data:`NORMALIZE_BLOCK_BYTES`), so
    the working set beyond the result is one block; a :func:`hand_over` matrix already in ``dtype``
    is scaled in place and returned, anything else into a new matrix. Both give the bits of
    ``x / np.linalg.norm(x, axis=1, keepdims=True)``.
    """
    in_place = isinstance(x, HandedOver)
    x = np.asarray(x)
    x = x.astype(dtype or (np.float64 if x.dtype == np.float64 else np.float32), copy=False)
    if x.ndim != 2:
        raise ValueError(f"{source}: expected a 2-D (N, D) matrix, got shape {x.shape}")
    n = x.shape[0]
    step = max(1, NORMALIZE_BLOCK_BYTES // max(1, x.shape[1] * x.itemsize))
    norms = np.empty((n, 1), dtype=x.dtype)

    def measure(lo: int, hi: int) -> np.ndarray:
        bad = []
        for r0 in range(lo, hi, HASH_ROWS):  # temporaries in cache; each row's norm is reduced alone (the same bits)
            block = x[r0:min(hi, r0 + HASH_ROWS)]
            norms[r0:r0 + len(block)] = np.linalg.norm(block, axis=1, keepdims=True)
            bad.append(r0 + np.flatnonzero(~np.isfinite(block).all(axis=1)))
        return np.concatenate(bad) if bad else np.zeros(0, np.int64)

    bad = np.concatenate(row_parallel(measure, n, _CPU, step) or [np.zeros(0, np.int64)])  # blocks side by side
    n_bad, first_bad = len(bad), (int(bad[0]) if len(bad) else None)
    if n_bad:
        raise InvalidSetting(f"{source}: row {first_bad} holds NaN/Inf ({n_bad} rows); re-extract those features "
                             "or drop those rows")
    zero = norms[:, 0] == 0
    if zero.any():
        first_zero, n_zero = int(np.flatnonzero(zero)[0]), int(zero.sum())
        raise InvalidSetting(f"{source}: row {first_zero} is a zero vector ({n_zero} rows); cosine similarity is "
                         "undefined for it, drop or re-extract it")
    out = x if in_place and x.flags.writeable else np.empty_like(x)
    row_parallel(lambda lo, hi: np.divide(x[lo:hi], norms[lo:hi], out=out[lo:hi]), n, _CPU, step)
    return out


def _exact_distinct(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each distinct row, each row's id) of a small 2-D array, by its bytes (−0 as +0)."""
    flat = np.ascontiguousarray(flat + flat.dtype.type(0))  # −0 + 0 = +0
    _, first, vid = np.unique(flat.view(np.dtype((np.void, flat.dtype.itemsize * flat.shape[1]))).ravel(),
                              return_index=True, return_inverse=True)
    return first.astype(np.int64), vid.ravel().astype(np.int64)


def distinct_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each distinct vector, each row's vector id [N]): rows are one vector when their
    bytes are equal (after −0 → +0). Rows are hashed block by block (:data:`NORMALIZE_BLOCK_BYTES`
    of working set, no copy of the matrix) and rows sharing a hash are compared byte for byte, so a
    hash collision never merges two vectors."""
    x = np.asarray(x)
    flat = x.reshape(len(x), -1)
    if len(x) == 0 or flat.shape[1] == 0 or (flat.dtype.itemsize * flat.shape[1]) % 4:
        return _exact_distinct(flat) if len(x) and flat.shape[1] else (np.zeros(min(1, len(x)), np.int64),
                                                                      np.zeros(len(x), np.int64))
    words = flat.dtype.itemsize * flat.shape[1] // 4
    weights = np.random.default_rng(0).integers(1, 2**62, size=words, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    step = max(1, NORMALIZE_BLOCK_BYTES // (8 * words))
    keys = np.empty(len(x), np.uint64)

    def hash_rows(lo: int, hi: int) -> None:
        for r0 in range(lo, hi, HASH_ROWS):  # temporaries in cache (the same keys: sums modulo 2**64 are exact)
            r1 = min(hi, r0 + HASH_ROWS)
            block = np.ascontiguousarray(flat[r0:r1] + flat.dtype.type(0)).view(np.uint32).astype(np.uint64)
            keys[r0:r1] = (block * weights).sum(axis=1)  # wraps modulo 2**64

    row_parallel(hash_rows, len(x), _CPU, step)  # blocks side by side
    _, first, vid = np.unique(keys, return_index=True, return_inverse=True)
    first, vid = first.astype(np.int64), vid.ravel().astype(np.int64)
    counts = np.bincount(vid)
    if (counts == 1).all():
        return first, vid
    shared = np.flatnonzero(counts > 1)
    members = np.argsort(vid, kind="stable")
    starts = np.r_[0, np.cumsum(counts)]
    next_id = len(first)
    extra_first = []
    for h in shared.tolist():  # rows with one hash: split them by their bytes (a collision becomes new ids)
        rows = members[starts[h]:starts[h + 1]]
        sub_first, sub = _exact_distinct(flat[rows])
        if len(sub_first) > 1:
            new = np.r_[h, next_id + np.arange(len(sub_first) - 1)]
            vid[rows] = new[sub]
            first[h] = rows[sub_first[0]]
            extra_first += rows[sub_first[1:]].tolist()
            next_id += len(sub_first) - 1
    return np.r_[first, np.asarray(extra_first, np.int64)], vid


def has_copies(vectors: np.ndarray | None, rows: np.ndarray) -> bool:
    """Whether two of ``rows`` share a vector id."""
    return vectors is not None and len(np.unique(vectors[rows])) < len(np.unique(rows))


def representatives(vectors: np.ndarray) -> np.ndarray:
    """One row of every vector id (index: the id)."""
    rep = np.empty(int(vectors.max()) + 1 if len(vectors) else 0, np.int64)
    rep[vectors] = np.arange(len(vectors))
    return rep


def distinct_product(feats: torch.Tensor, rep: np.ndarray, a_ids: np.ndarray, b_ids: np.ndarray) -> torch.Tensor:
    """Similarities of the vectors ``a_ids`` (rows) × ``b_ids`` (columns), one product; a vector and
    itself exactly 1 (unit rows)."""
    device = feats.device
    sims = feats[torch.as_tensor(rep[a_ids], device=device)] @ feats[torch.as_tensor(rep[b_ids], device=device)].T
    same = torch.as_tensor(a_ids[:, None] == b_ids[None, :], device=device)
    return sims.masked_fill_(same, 1.0)


def spans(p0: int, p1: int, width: int) -> list[tuple[int, int]]:
    """(start, end) of each piece of at most ``width`` of p0:p1, in order."""
    return [(r, min(r + width, p1)) for r in range(p0, p1, width)]


def vector_blocks(ids: np.ndarray, width: int) -> list[tuple[int, int]]:
    """(start, end) positions of ``ids`` (sorted vector ids, one per member) cut between vectors into
    blocks of at most ``width`` members (a vector with more members is a block of its own)."""
    bounds = runs(ids)
    out, start = [], 0
    for s, e in bounds:
        if s > start and e - start > width:
            out.append((start, s))
            start = s
    if len(ids):
        out.append((start, len(ids)))
    return out


def cosine_distance(sims: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Cosine distance ``1 − s`` of unit vectors, computed in ``dtype`` (the features' precision;
    torch dtypes are accepted) and clipped to [0, 2] as sklearn's ``cosine_distances`` does
    (croma_conventions.md A.1); returned as float64. Non-finite similarities (the −inf of an
    absent slot) become ``inf``."""
    if isinstance(dtype, torch.dtype):
        dtype = np.float64 if dtype == torch.float64 else np.float32
    sims = np.asarray(sims)
    with np.errstate(invalid="ignore"):
        d = np.clip(dtype(1) - sims.astype(dtype), 0, 2).astype(np.float64)
    d[~np.isfinite(sims)] = np.inf
    return d


def merge_topk(current: tuple[torch.Tensor, torch.Tensor] | None, sims: torch.Tensor, offset: int, k: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """A row block's running top-``k`` (values sorted descending, column indices) after one more
    tile ``sims`` whose first column is column ``offset``: the tile's own top-k, then the top-k of
    it and ``current`` (``None`` for the first tile). Lists shorter than ``k`` stay as long as the
    columns seen so far."""
    v, i = torch.topk(sims, min(k, sims.shape[1]), dim=1)
    i = i + offset
    if current is not None:
        merged = torch.cat([current[0], v], 1)
        v, at = torch.topk(merged, min(k, merged.shape[1]), dim=1)
        i = torch.gather(torch.cat([current[1], i], 1), 1, at)
    return v, i


class Transposer:
    """A tile's transpose as a contiguous copy in one reused buffer, for a top-k over the rows a
    symmetric pass's tile also serves (:func:`symmetric_tiles`): on the CPU the top-k of the strided
    view ``sims.T`` is ~4x slower, and a fresh ``.contiguous()`` per tile ~5x slower than this copy
    (page faults). The copy is valid until the next call."""

    def __init__(self):
        self.buffer: torch.Tensor | None = None

    def __call__(self, sims: torch.Tensor) -> torch.Tensor:
        if self.buffer is None or self.buffer.numel() < sims.numel() or self.buffer.dtype != sims.dtype \
                or self.buffer.device != sims.device:
            self.buffer = sims.new_empty(sims.numel())
        return self.buffer[:sims.numel()].view(sims.shape[1], sims.shape[0]).copy_(sims.T)


def symmetric_tiles(x: torch.Tensor, block_size: int) -> Iterator[tuple[int, int, int, int, torch.Tensor]]:
    """``(a0, a1, b0, b1, x[a0:a1] @ x[b0:b1].T)`` for every ``block_size`` tile on or above the
    diagonal of the similarity matrix of ``x``'s rows, row block by row block. The matrix is
    symmetric: the tile serves rows a0:a1 and, transposed, rows b0:b1 (when ``b0 != a0``)."""
    n = len(x)
    starts = range(0, n, block_size)
    for a0 in starts:
        a1 = min(n, a0 + block_size)
        for b0 in starts[a0 // block_size:]:
            b1 = min(n, b0 + block_size)
            yield a0, a1, b0, b1, x[a0:a1] @ x[b0:b1].T


#: rows of a tile :func:`symmetric_matrix` transposes at a time (a strip whose transpose stays in cache)
TRANSPOSE_ROWS = 128


def symmetric_matrix(x: torch.Tensor, block_size: int, workspace: torch.Tensor | None = None) -> torch.Tensor:
    """The similarity matrix of ``x``'s rows assembled from :func:`symmetric_tiles`' products: each
    tile on or above the diagonal computed once, straight into its place (``torch.mm(..., out=)``, the
    same product), its transpose filling the tile below (strips of :data:`TRANSPOSE_ROWS` rows: the
    same copy, ~5× faster than one strided copy of the tile on the CPU), so the matrix holds the very
    products of that pass and is symmetric bitwise. ``workspace``: a tensor of ``x``'s dtype and
    device no longer needed (e.g. the previous group's matrix) whose memory is reused: a fresh
    256 MB matrix costs ~0.15 s of page faults on the CPU before the first product."""
    n = len(x)
    if workspace is not None and workspace.dtype == x.dtype and workspace.device == x.device \
            and workspace.is_contiguous() and workspace.numel() >= n * n:
        full = workspace.view(-1)[:n * n].view(n, n)
    else:
        full = x.new_empty((n, n))
    starts = range(0, n, block_size)
    for a0 in starts:  # symmetric_tiles' products, each written in place (no tile-sized temporary)
        a1 = min(n, a0 + block_size)
        for b0 in starts[a0 // block_size:]:
            b1 = min(n, b0 + block_size)
            tile = full[a0:a1, b0:b1]
            torch.mm(x[a0:a1], x[b0:b1].T, out=tile)
            if a0 != b0:
                for r0 in range(a0, a1, TRANSPOSE_ROWS):
                    r1 = min(a1, r0 + TRANSPOSE_ROWS)
                    full[b0:b1, r0:r1] = full[r0:r1, b0:b1].T
    return full


_CPU = torch.device("cpu")

#: rows per piece of work :func:`row_parallel` hands a thread (few enough pieces to keep each op large)
PARALLEL_ROWS = 1024


def row_parallel(fn: Callable[[int, int], object], n_rows: int, device: torch.device,
                 rows: int = PARALLEL_ROWS) -> list:
    """``[fn(r0, r1) for each piece r0:r1 of 0:n_rows]``. On the CPU the pieces run in as many Python
    threads as torch has intra-op threads, each torch op inside single-threaded: the many small
    bookkeeping ops of a shortlist (top-k, gathers, sums) then cost no OpenMP barrier each, which on a
    loaded machine costs more than the op. Every row's result is computed by the same ops whatever the
    piece it falls in, so the output does not depend on the split; on a GPU it is one piece."""
    if device.type != "cpu" or n_rows <= rows:
        return [fn(0, n_rows)]
    pieces = [(r0, min(n_rows, r0 + rows)) for r0 in range(0, n_rows, rows)]
    with torch_threads(1) as threads:
        if threads == 1:
            return [fn(r0, r1) for r0, r1 in pieces]
        # torch and numpy release the GIL inside their ops
        return list(_row_pool(threads).map(lambda piece: fn(*piece), pieces))


_ROW_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}


def _row_pool(threads: int) -> ThreadPoolExecutor:
    """One lasting pool of ``threads`` Python threads for :func:`row_parallel` per process (a forked
    child, whose copy of the pool has no threads, makes its own): a shortlist hands it dozens of calls
    per group, and starting threads for each cost ~2 ms apiece on a loaded machine. A call made inside
    a piece runs with torch's threads at 1, so it never waits on this pool."""
    key = (os.getpid(), threads)
    if key not in _ROW_POOLS:
        _ROW_POOLS[key] = ThreadPoolExecutor(threads, thread_name_prefix="row_parallel")
    return _ROW_POOLS[key]


def topk_rows(sims: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(sims, k, dim=1)`` (values sorted descending, column indices), through a
    prefilter when it pays: the columns are cut into chunks of c, the k chunks with the largest
    maxima are kept and the top k of their c·k entries taken. Exact for the values: the entries
    ≥ the k-th largest v lie in chunks whose maximum is ≥ v, and the k chunks of largest maxima
    hold at least k such entries, all those > v among them (ties between equal values may pick
    other columns, as ``torch.topk``'s own order among them is unspecified). Rows of ``sims`` must
    hold at least k finite values."""
    r, m = sims.shape
    c = int(np.sqrt(m / max(k, 1)))
    if k == 0 or c < 4:
        return torch.topk(sims, k, dim=1)
    whole = m // c * c
    maxima = sims[:, :whole].reshape(r, whole // c, c).amax(dim=2)
    if whole < m:
        maxima = torch.cat([maxima, sims[:, whole:].amax(dim=1, keepdim=True)], dim=1)
    _, chunks = torch.topk(maxima, k, dim=1, sorted=False)
    cols = (chunks[:, :, None] * c + torch.arange(c, device=sims.device)).reshape(r, -1)
    outside = cols >= m
    values = torch.gather(sims, 1, cols.clamp_(max=m - 1)).masked_fill_(outside, float("-inf"))
    values, at = torch.topk(values, k, dim=1)
    return values, torch.gather(cols, 1, at)


def _ordered_bits(bits: np.ndarray) -> np.ndarray:
    """float32 bit patterns (as int64 of their int32 view) mapped to integers in the floats' order
    (−0 just below +0); the map is its own inverse."""
    return np.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def _first_k_by_keys(values: np.ndarray, group: np.ndarray, index: np.ndarray, n_groups: int, index_bits: int,
                     k: int, groups_first: bool) -> tuple[np.ndarray, np.ndarray]:
    """The k largest float32 ``values`` of each of ``n_groups`` groups (each holding at least k), sorted
    descending with equal values by ascending ``index``, by one sort of int64 keys (group, value in
    descending order, index): values (their very bits) and indices, contiguous, (n_groups, k) with
    ``groups_first`` else (k, n_groups). The selection step of :func:`topk_rows_keyed` (a group is a
    row) and :func:`topk_columns_keyed` (a column)."""
    desc = np.int64(0x7FFFFFFF) - _ordered_bits(values.view(np.int32).astype(np.int64))  # 32 bits
    keys = (group << (32 + index_bits)) | (desc << index_bits) | index
    keys.sort()
    starts = np.r_[0, np.cumsum(np.bincount(group, minlength=n_groups))[:-1]]
    top = keys[starts[:, None] + np.arange(k)] if groups_first else keys[starts + np.arange(k)[:, None]]
    out = _ordered_bits(np.int64(0x7FFFFFFF) - ((top >> index_bits) & 0xFFFFFFFF)).astype(np.int32)
    return out.view(np.float32), top & ((1 << index_bits) - 1)


def topk_rows_keyed(sims: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`topk_rows` of a float32 numpy block on the CPU (values sorted descending, column
    indices; equal values by ascending column), by a threshold and one sort of integer keys.

    The k-th largest maximum t of strided column chunks (:func:`_chunk_threshold`) bounds the row's
    k-th largest value from below, so the row's top k are among its entries ≥ t (typically a few
    more than k). Those entries become one int64 key each, (row, value in
    descending order, column), sorted once; each row's first k keys decode to the very float32
    values (their bits) and columns. None when it does not pay (chunks under 4) or the keys do not fit
    63 bits; the caller then takes :func:`topk_rows`."""
    keyed = _chunk_threshold(sims, k, axis=1)
    if keyed is None:
        return None
    threshold, row_bits, col_bits = keyed
    at = np.flatnonzero(sims >= threshold[:, None])
    rows, cols = np.divmod(at, sims.shape[1])
    return _first_k_by_keys(sims.ravel()[at], rows, cols, sims.shape[0], col_bits, k, groups_first=True)


#: rows per block of :func:`topk_columns`' block maxima
COLUMN_BLOCK = 16


def topk_columns(sims: torch.Tensor, k: int, block: int = COLUMN_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest values of every column of ``sims`` (rows a multiple of ``block``; pad with
    −inf), sorted descending down dim 0, with their row indices: the rows are cut into blocks of
    ``block``, the k blocks with the largest maxima in each column kept and the top k of their
    k·block entries taken (exact for the values, as :func:`topk_rows`' chunks: the entries ≥ the
    column's k-th largest v lie in blocks whose maximum is ≥ v). Columns must hold at least k
    finite values."""
    r, m = sims.shape
    blocks = sims.reshape(r // block, block, m)
    if r // block < k:
        return torch.topk(sims, k, dim=0)
    _, top = torch.topk(blocks.amax(dim=1), k, dim=0, sorted=False)  # (k, m): each column's best blocks
    at = (top[:, None, :] * block + torch.arange(block, device=sims.device)[None, :, None]).reshape(k * block, m)
    values = torch.gather(blocks, 0, top[:, None, :].expand(k, block, m)).reshape(k * block, m)
    values, pick = torch.topk(values.T.contiguous(), k, dim=1)  # along rows of the transposed copy: faster
    return values.T, torch.gather(at, 0, pick.T)


def topk_columns_keyed(sims: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`topk_columns` of a float32 numpy block on the CPU (the k largest values of every column,
    sorted descending down dim 0, (k, m) contiguous, and their row indices), the way
    :func:`topk_rows_keyed` takes rows: strided row chunks' elementwise maxima, each column's k-th
    largest chunk maximum as its threshold, one sort of (column, value descending, row) keys over the
    entries at or above it. None where it does not pay (chunks of fewer than 4 rows) or the keys do
    not fit 63 bits."""
    keyed = _chunk_threshold(sims, k, axis=0)
    if keyed is None:
        return None
    threshold, row_bits, col_bits = keyed
    rows, cols = np.nonzero(sims >= threshold[None, :])
    return _first_k_by_keys(sims[rows, cols], cols, rows, sims.shape[1], row_bits, k, groups_first=False)


def _chunk_threshold(sims: np.ndarray, k: int, axis: int) -> tuple[np.ndarray, int, int] | None:
    """Per row (``axis`` 1) or column (``axis`` 0) of ``sims``, a value at or below its k-th largest
    entry, for :func:`topk_rows_keyed` / :func:`topk_columns_keyed`: the n entries along ``axis`` are
    cut into W = ⌊n/c⌋ strided chunks of c = ⌊√(n/k)⌋ (chunk q: q, q + W, q + 2W, …; the last
    n − cW entries join the first chunks), whose maxima are c elementwise maxima of contiguous slices
    (read in the block's own memory order); the k-th largest chunk maximum t is the threshold (k
    chunks hold a value ≥ t), with the bits a row and a column index take in a key. None when the
    keyed way does not apply: an empty block, k = 0, not float32, keys over 63 bits, or chunks of fewer
    than 4 entries (it does not pay)."""
    r, m = sims.shape
    row_bits, col_bits = max(1, int(r - 1).bit_length()), max(1, int(m - 1).bit_length())
    n = sims.shape[axis]
    c = int(np.sqrt(n / max(k, 1)))
    if r == 0 or m == 0 or k == 0 or row_bits + 32 + col_bits > 63 or sims.dtype != np.float32 or c < 4:
        return None
    width = n // c

    def along(part: slice) -> tuple[slice, ...]:
        return (part, slice(None)) if axis == 0 else (slice(None), part)

    shape = (c, width, m) if axis == 0 else (r, c, width)
    maxima = sims[along(slice(0, width * c))].reshape(shape).max(axis=axis)
    if width * c < n:
        rest = along(slice(0, n - width * c))
        np.maximum(maxima[rest], sims[along(slice(width * c, None))], out=maxima[rest])
    return np.take(np.partition(maxima, width - k, axis=axis), width - k, axis=axis), row_bits, col_bits


class RunningTopK:
    """The ``k`` largest values of every row of a matrix seen one tile at a time, with their column
    indices (the tiles of one pass share their row blocks).

    ``filled``: the lists start as ``k`` slots of (−inf, −1) in one (n, k) pair of tensors updated
    in place, so they are always ``k`` wide, even with fewer than ``k`` columns (absent slots stay
    −inf / −1). Otherwise each row block's list starts empty and holds min(k, columns seen) entries.
    """

    def __init__(self, n: int, k: int, like: torch.Tensor, filled: bool = False):
        self.n, self.k, self.like, self.filled = n, k, like, filled
        self.blocks: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        if filled:
            self.values = torch.full((n, k), float("-inf"), dtype=like.dtype, device=like.device)
            self.indices = torch.full((n, k), -1, dtype=torch.long, device=like.device)

    def update(self, r0: int, sims: torch.Tensor, offset: int) -> None:
        """Fold the tile ``sims`` (rows r0:r0+len(sims), columns from ``offset``) into the lists."""
        if self.filled:
            rows = slice(r0, r0 + sims.shape[0])
            self.values[rows], self.indices[rows] = merge_topk((self.values[rows], self.indices[rows]), sims,
                                                               offset, self.k)
        else:
            self.blocks[r0] = merge_topk(self.blocks.get(r0), sims, offset, self.k)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(values sorted descending, column indices), rows in order."""
        if self.filled:
            return self.values, self.indices
        if not self.blocks:
            return (torch.empty((self.n, 0), dtype=self.like.dtype, device=self.like.device),
                    torch.empty((self.n, 0), dtype=torch.long, device=self.like.device))
        parts = [self.blocks[r0] for r0 in sorted(self.blocks)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def runs(keys: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each run of equal consecutive values of ``keys``."""
    cut = np.flatnonzero(np.diff(keys)) + 1
    bounds = np.r_[0, cut, len(keys)]
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


class SameGroupMask:
    """Excludes every candidate that shares the row's group, the row itself included (CRoMa's
    leave-one-group-out neighbourhoods, croma_conventions.md A.3), from tiles of a symmetric pass.

    ``groups``: one code per row in the pass's row order. The pairs are masked as rectangles, one
    per (run of the row's group) × (run of the same group among the columns), so the cost is small
    when each group's rows are contiguous (sort the rows by group first).
    """

    def __init__(self, groups: np.ndarray):
        self.runs = runs(np.asarray(groups))
        self.run_starts = np.array([r[0] for r in self.runs])
        self.run_group = [int(groups[start]) for start, _ in self.runs]
        self.runs_of_group: dict[int, list[tuple[int, int]]] = {}
        for (start, end), g in zip(self.runs, self.run_group):
            self.runs_of_group.setdefault(g, []).append((start, end))

    def apply(self, sims: torch.Tensor, a0: int, a1: int, b0: int, b1: int) -> None:
        """−inf, in place, on every (row, column) pair of the tile rows a0:a1 × columns b0:b1
        that shares a group."""
        first = int(np.searchsorted(self.run_starts, a0, side="right")) - 1
        for (start, end), g in zip(self.runs[first:], self.run_group[first:]):
            if start >= a1:
                break
            r0, r1 = max(start, a0) - a0, min(end, a1) - a0
            for c0, c1 in self.runs_of_group[g]:
                if c0 < b1 and c1 > b0:
                    sims[r0:r1, max(c0, b0) - b0:min(c1, b1) - b0] = float("-inf")


def topk_similarity(feats: torch.Tensor, query_rows: np.ndarray, cand_rows: np.ndarray, k: int,
                    block_size: int = 4096, cand_block: int = 65536, backend: str = "torch",
                    vectors: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest cosine similarities of each query among the candidates, self excluded.

    ``feats`` is the unit-norm matrix (on the compute device); ``query_rows`` and ``cand_rows``
    index into it. A query that is itself a candidate never counts as its own neighbour.
    Queries are processed ``block_size`` at a time and candidates ``cand_block`` at a time (the
    running top-k is merged across candidate blocks, :func:`merge_topk`), so memory is bounded by
    ``block_size × cand_block`` similarities whatever the set sizes.
    Returns (similarities [Q, k] sorted descending, candidate positions [Q, k]) on the device.
    ``backend="faiss"`` gives the same neighbours from an exact faiss index (ties may be broken
    differently; the similarities agree to float tolerance).
    ``vectors``: the vector id of every row of ``feats`` (:func:`distinct_rows`); where queries or
    candidates share a vector the products are taken between distinct vectors and expanded
    (:func:`_distinct_topk`), so copies get bitwise-equal similarities (the torch backend).
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
    if has_copies(vectors, np.r_[query_rows, cand_rows]):
        return _distinct_topk(feats, query_rows, cand_rows, k, block_size, cand_block, np.asarray(vectors))
    return plain_topks(feats, query_rows, cand_rows, (k,), block_size, cand_block)[0]


def plain_topks(feats: torch.Tensor, query_rows: np.ndarray, cand_rows: np.ndarray, ks, block_size: int = 4096,
                cand_block: int = 65536) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """:func:`topk_similarity`'s plain torch search (no vectors shared) for several k at once: each tile of
    products computed once and folded into one running list per k (:func:`merge_topk`), so every k's result
    is the very one a search for that k alone returns (the same tiles, the same ops, ties included): a caller
    needing the k and the k + e nearest of the same queries pays one product. The caller checks that each k is
    available (:func:`topk_similarity`)."""
    query_rows = np.asarray(query_rows, dtype=np.int64)
    cand_rows = np.asarray(cand_rows, dtype=np.int64)
    device = feats.device
    # Position of each query inside the candidate set (-1 when absent), to mask self-matches.
    order = np.argsort(cand_rows, kind="stable")
    at = np.searchsorted(cand_rows[order], query_rows).clip(max=len(cand_rows) - 1)
    self_pos = np.where(cand_rows[order][at] == query_rows, order[at], -1)
    values, indices = [[] for _ in ks], [[] for _ in ks]
    for qs in range(0, len(query_rows), block_size):
        q = feats[torch.as_tensor(query_rows[qs:qs + block_size], device=device)]
        sp = torch.as_tensor(self_pos[qs:qs + block_size], device=device)
        best = [None] * len(ks)
        for cs in range(0, len(cand_rows), cand_block):
            sims = q @ feats[torch.as_tensor(cand_rows[cs:cs + cand_block], device=device)].T
            local = sp - cs
            hit = (local >= 0) & (local < sims.shape[1])
            if bool(hit.any()):
                sims[torch.nonzero(hit).squeeze(1), local[hit]] = float("-inf")
            best = [merge_topk(b, sims, cs, k) for b, k in zip(best, ks)]
        for j, b in enumerate(best):
            values[j].append(b[0])
            indices[j].append(b[1])
    if not len(query_rows):
        return [(torch.empty((0, k), device=device), torch.empty((0, k), device=device).long()) for k in ks]
    return [(torch.cat(v), torch.cat(i)) for v, i in zip(values, indices)]


def _distinct_topk(feats: torch.Tensor, query_rows: np.ndarray, cand_rows: np.ndarray, k: int, block_size: int,
                   cand_block: int, vectors: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`topk_similarity` with products between distinct vectors: queries and candidates are
    ordered by vector id, cut into blocks of whole vectors, each (query block, candidate block)
    product computed once and expanded to member rows (in chunks of at most ``block_size`` ×
    ``cand_block``); the query itself is masked as a candidate. Copies of a vector therefore read
    the same entries of the same products."""
    device = feats.device
    rep = representatives(vectors)
    q_order = np.argsort(vectors[query_rows], kind="stable")
    c_order = np.argsort(vectors[cand_rows], kind="stable")
    qv, cv = vectors[query_rows][q_order], vectors[cand_rows][c_order]
    c_rows = cand_rows[c_order]
    by_row = np.argsort(c_rows, kind="stable")  # each query's own position among the candidates, or -1
    at = np.searchsorted(c_rows[by_row], query_rows[q_order]).clip(max=max(len(c_rows) - 1, 0))
    self_pos = np.where(c_rows[by_row][at] == query_rows[q_order], by_row[at], -1) if len(c_rows) else \
        np.full(len(query_rows), -1)
    best = RunningTopK(len(query_rows), k, feats)
    for q0, q1 in vector_blocks(qv, block_size):
        q_ids = np.unique(qv[q0:q1])
        for c0, c1 in vector_blocks(cv, cand_block):
            c_ids = np.unique(cv[c0:c1])
            sims = distinct_product(feats, rep, q_ids, c_ids)
            for r0, r1 in spans(q0, q1, block_size):
                rsel = torch.as_tensor(np.searchsorted(q_ids, qv[r0:r1]), device=device)
                for s0, s1 in spans(c0, c1, cand_block):
                    part = sims[rsel][:, torch.as_tensor(np.searchsorted(c_ids, cv[s0:s1]), device=device)]
                    local = self_pos[r0:r1] - s0
                    hit = np.flatnonzero((local >= 0) & (local < s1 - s0))
                    if len(hit):
                        part[torch.as_tensor(hit, device=device), torch.as_tensor(local[hit], device=device)] = \
                            float("-inf")
                    best.update(r0, part, s0)
    values, idx = best.result()
    back = np.empty(len(query_rows), np.int64)
    back[q_order] = np.arange(len(query_rows))
    back_t = torch.as_tensor(back, device=device)
    c_back = torch.as_tensor(c_order, device=device)
    return values[back_t], c_back[idx[back_t]]


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
                         block_size: int = 4096, backend: str = "torch", vectors: np.ndarray | None = None
                         ) -> np.ndarray:
    """c(x) = (1/k) Σ_{z ∈ N_k(x; R)} <g(x), g(z)> for every query (candor.md, Eq. 1 for c±);
    ``vectors``: as for :func:`topk_similarity` (copies get bitwise-equal c(x))."""
    values, _ = topk_similarity(feats, query_rows, cand_rows, k, block_size, backend=backend, vectors=vectors)
    return values.double().mean(dim=1).cpu().numpy()


class Neighbours(NamedTuple):
    """The k nearest candidates a c(x) averaged, per query: ``rows`` (Q × k feature rows, −1 where
    a query found fewer than k) and their ``sims`` (Q × k, descending, in the features' dtype: the
    very values summed)."""

    rows: np.ndarray
    sims: np.ndarray

    @classmethod
    def empty(cls, n: int, k: int, dtype=np.float32) -> Neighbours:
        return cls(np.full((n, k), -1, np.int64), np.full((n, k), np.nan, dtype))

    def take(self, at) -> Neighbours:
        """The rows ``at`` of both arrays (a copy)."""
        return Neighbours(self.rows[at], self.sims[at])

    def put(self, at, other: Neighbours) -> None:
        """``other``'s queries into the rows ``at`` of both arrays, in place."""
        self.rows[at], self.sims[at] = other.rows, other.sims


def topk_means(feats: torch.Tensor, query_rows, cand_rows, k: int, block_size: int = 4096, backend: str = "torch",
               vectors: np.ndarray | None = None) -> tuple[np.ndarray, Neighbours]:
    """:func:`mean_topk_similarity` (the same c(x), by the same ops) with the :class:`Neighbours` it
    averaged: one :func:`topk_similarity`, its candidate positions read back as feature rows."""
    cand_rows = np.asarray(cand_rows, dtype=np.int64)
    values, at = topk_similarity(feats, query_rows, cand_rows, k, block_size, backend=backend, vectors=vectors)
    means = values.double().mean(dim=1).cpu().numpy()
    return means, Neighbours(cand_rows[at.cpu().numpy()], values.cpu().numpy())


# --- a cluster's influence as a neighbour: means of the k nearest with each cluster left out (issue 58) -----------

def means_without_each(sims: np.ndarray, who: np.ndarray, alive: np.ndarray, k: int, own: np.ndarray | None = None):
    """The mean of each row's k nearest (``sims`` (Q × L) in descending order, ``alive`` the entries that
    may count, ``who`` their cluster codes) and, for every cluster among those k other than the row's
    ``own``, the mean of the k nearest once that cluster's entries are left out: the neighbour role
    of a cluster in a kNN mean (:mod:`robustbench_fm.methods.candor.influence`, CRoMa's d_SO / d_OS).
    Exact when L ≥ k + the most entries one cluster has in a row.

    Returns (means (Q,), NaN where fewer than k are alive; pairs: rows (P,), clusters (P,), means
    without the cluster (P,), NaN where fewer than k would remain)."""
    order = np.argsort(~alive, axis=1, kind="stable")  # the live entries first, in their order
    sims, who, alive = (np.take_along_axis(a, order, 1) for a in (sims, who, alive))
    width = sims.shape[1]
    full = alive[:, :k].all(axis=1) if width >= k else np.zeros(len(sims), bool)
    means = np.where(full, np.where(alive, sims, 0.0)[:, :k].sum(axis=1) / k, np.nan)
    rows, clusters, without = [], [], []
    for j in range(min(k, width)):
        p = who[:, j]
        new = full & ~(who[:, :j] == p[:, None]).any(axis=1)  # the first time p is met in the k nearest
        if own is not None:
            new &= p != own
        if not new.any():
            continue
        keep = alive[new] & (who[new] != p[new, None])
        take = keep & (np.cumsum(keep, axis=1) <= k)
        rows.append(np.flatnonzero(new))
        clusters.append(p[new])
        without.append(np.where(take.sum(axis=1) == k, np.where(take, sims[new], 0.0).sum(axis=1) / k, np.nan))
    if not rows:
        return means, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    return means, np.concatenate(rows), np.concatenate(clusters), np.concatenate(without)


def pair_without(a: tuple, b: tuple, n_clusters: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Two :func:`means_without_each` results of the same rows (e.g. a query's positive and negative
    candidates) joined: every (row, cluster) that changes either mean, with both means once the
    cluster is left out (the other mean unchanged where the cluster is not among its k nearest).
    Returns (rows, clusters, mean a without, mean b without)."""
    (ma, ra, pa, wa), (mb, rb, pb, wb) = a, b
    keys = np.unique(np.r_[ra * n_clusters + pa, rb * n_clusters + pb])
    rows, clusters = keys // n_clusters, keys % n_clusters
    new_a, new_b = ma[rows].copy(), mb[rows].copy()
    new_a[np.searchsorted(keys, ra * n_clusters + pa)] = wa
    new_b[np.searchsorted(keys, rb * n_clusters + pb)] = wb
    return rows, clusters, new_a, new_b
