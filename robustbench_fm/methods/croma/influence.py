"""The candidates' share of CRoMa's sampling variance: each slide's influence as a neighbour on the
median CRoMa, so that the paired comparisons between encoders redraw the slides in both roles
(issue 58 item 3; docs/comparisons.md "Both roles of a patient").

CRoMa_i = (d_OS − d_SO) / (d_OS + d_SO) depends on the m nearest SO and OS candidates of other
slides (croma.md §2.7, conventions A.7); resampling the anchors' slides with those candidates fixed
leaves their role out. A slide p's influence on the median M of the CRoMa_i is taken through the
smoothed median (the kernel-weighted mean shift of the values near it, φ_h the Gaussian kernel with
Silverman's bandwidth over the CRoMa_i, :func:`robustbench_fm.core.stats.smoothed_density`):

    δ_p = Σ_i φ_h(CRoMa_i − M) · (CRoMa_i − CRoMa_i^(−p)) / Σ_i φ_h(CRoMa_i − M),

over the anchors i of other slides, CRoMa_i^(−p) with p's tiles left out of both candidate sets
(exact: the m + e nearest of each type are searched, e the most tiles one slide has). It is kept
per half of the anchors' slides (:func:`robustbench_fm.core.stats.cluster_halves`), as CANDOR's
(:mod:`robustbench_fm.methods.candor.influence`). Both CRoMa_i and CRoMa_i^(−p) come from this one
search, so a shift is never a rounding difference between two searches. The search's first lists (the
4m nearest of each type) are the stage's scope pass's where that pass computed the same products
(:func:`shares_products`; :func:`robustbench_fm.methods.croma.stage.prepare`'s ``bank_lists``), so
the influence then costs no second similarity pass (issue 57).
"""
from __future__ import annotations

import numpy as np
import torch

from ...core.neighbors import means_without_each, pair_without
from ...core.stats import smoothed_density

#: anchor rows per similarity block
BLOCK = 1024
#: the smallest edge of a product whose float32 entries another pass may hand over as this search's own
#: (:func:`shares_products`): MKL's float32 GEMM rounds an entry the same whatever the product's shape
#: once both its edges are beyond ~15 (measured, MKL 2024.2 on AMD EPYC, AVX512, d = 16 to 1,536), and
#: otherwise not (a product with ≤ 13 rows or columns takes another kernel)
SHARED_MIN_EDGE = 64


def shares_products(n: int, block_size: int) -> bool:
    """Whether the scope pass's float32 products (tiles of ``block_size`` rows and columns over the ``n``
    rows of a scope without identical rows) may stand for this search's (:data:`BLOCK` anchors × all
    ``n`` rows): every edge of either is at least :data:`SHARED_MIN_EDGE`."""
    edges = (min(n, block_size), n % block_size or block_size, min(n, BLOCK), n % BLOCK or BLOCK)
    return min(edges) >= SHARED_MIN_EDGE


def _typed_lists(x: torch.Tensor, anchors: np.ndarray, labels, confs, groups, width: int):
    """The ``width`` largest similarities of each anchor (rows ``anchors`` of the scope) to its SO
    candidates (same label, other confounder value) and to its OS candidates (the other way round),
    other groups (slides) only, descending, −inf past the candidates, with their rows: one product
    per block of anchors serves both types. Returns ((SO sims, SO rows), (OS sims, OS rows))."""
    lab, con, grp = (torch.as_tensor(a, device=x.device) for a in (labels, confs, groups))
    out = {True: ([], []), False: ([], [])}
    for start in range(0, len(anchors), BLOCK):
        at = torch.as_tensor(anchors[start:start + BLOCK], device=x.device)
        s = x[at] @ x.T
        same_l = lab[at, None] == lab[None, :]
        same_c = con[at, None] == con[None, :]
        other = grp[at, None] != grp[None, :]
        for so, typed in ((True, same_l & ~same_c), (False, ~same_l & same_c)):
            v, i = torch.topk(torch.where(typed & other, s, -torch.inf), width, dim=1)
            out[so][0].append(v.cpu().numpy().astype(np.float64))
            out[so][1].append(i.cpu().numpy())
    return tuple((np.concatenate(out[so][0]), np.concatenate(out[so][1])) for so in (True, False))


def search_widths(n: int, m: int, clusters) -> tuple[int, int]:
    """(the first search's width, the full width) of :func:`_typed_means` for ``n`` rows and the
    rows' cluster codes ``clusters``: the 4m nearest, and the m + e nearest (e: the most rows one
    cluster has), at most n."""
    full = min(n, m + int(np.bincount(clusters).max()))
    return min(full, 4 * m), full


def _given_lists(x: torch.Tensor, typed: tuple, width: int, m: int, labels, confs, groups):
    """:func:`_typed_lists` of every row at ``width`` from lists already searched (``typed``: the
    scope pass's ((SO sims, rows), (OS sims, rows)), descending, at least ``width`` + 1 wide, read
    off the same products). Which of equally similar candidates ``torch.topk`` keeps follows its own
    order; it counts only where the tie straddles the m-th / (m + 1)-th or the ``width``-th /
    (``width`` + 1)-th place (which clusters are among the m nearest, which candidates are searched:
    within the list, equal similarities sum alike whatever their order). Such rows are searched again
    as :func:`_typed_lists` searches them, in products of at least :data:`SHARED_MIN_EDGE` rows (the
    same entries, :func:`shares_products`; other rows fill a short product and are dropped)."""
    if min(sims.shape[1] for sims, _ in typed) <= width:
        raise ValueError(f"croma influence: the lists handed over need width + 1 = {width + 1} columns, they have "
                         f"{min(sims.shape[1] for sims, _ in typed)}; search them with typed_width={width + 1}")
    n = len(typed[0][0])
    tied = np.zeros(n, bool)
    for sims, _ in typed:
        for c in (m, width):
            tied |= np.isfinite(sims[:, c]) & (sims[:, c - 1] == sims[:, c])
    out = [(sims[:, :width].copy(), rows[:, :width].copy()) for sims, rows in typed]
    tied = np.flatnonzero(tied)
    for start in range(0, len(tied), BLOCK):
        at = tied[start:start + BLOCK]
        fill = np.setdiff1d(np.arange(n), at)[:max(0, min(n, SHARED_MIN_EDGE) - len(at))]
        for (sims, rows), (again, where) in zip(out, _typed_lists(x, np.r_[at, fill], labels, confs, groups, width)):
            sims[at], rows[at] = again[:len(at)], where[:len(at)]
    return out


def _typed_means(x: torch.Tensor, labels, confs, groups, clusters, m: int, typed: tuple | None = None):
    """For every row and each type (SO, OS): the mean similarity of its m nearest candidates of that
    type, and the means with each cluster among them left out
    (:func:`~robustbench_fm.core.neighbors.means_without_each`).

    Exact at a fraction of the widest search: the 4m nearest are searched first, and only the rows
    where one cluster holds so many of them that fewer than m would remain are searched again with
    the m + e nearest (e: the most rows one cluster has). ``typed``: the first search's lists already
    found (:func:`_given_lists`)."""
    n = len(labels)
    width, full = search_widths(n, m, clusters)
    first = _typed_lists(x, np.arange(n), labels, confs, groups, width) if typed is None else \
        _given_lists(x, typed, width, m, labels, confs, groups)
    found = [means_without_each(sims, clusters[rows], np.isfinite(sims), m, clusters) for sims, rows in first]
    redo = np.unique(np.concatenate([at[np.isnan(without)] for _, at, _, without in found])) if width < full \
        else np.zeros(0, np.int64)
    if not len(redo):
        return found
    # a cluster filled the short list of these rows: both types from the full width
    again = [means_without_each(sims, clusters[rows], np.isfinite(sims), m, clusters[redo])
             for sims, rows in _typed_lists(x, redo, labels, confs, groups, full)]
    out = []
    for (means, at, who, without), (_, at2, who2, without2) in zip(found, again):
        keep = ~np.isin(at, redo)
        out.append((means, np.r_[at[keep], redo[at2]], np.r_[who[keep], who2], np.r_[without[keep], without2]))
    return out


def median_influence(features: np.ndarray, labels, confs, groups, clusters, halves, m: int,
                     typed: tuple | None = None) -> np.ndarray:
    """δ_p (module doc) of every cluster of one scope on the median CRoMa of its units, per half of the
    anchors' clusters: (2, n_clusters). ``features``: the scope's unit-norm rows; ``labels``,
    ``confs``, ``groups``: its codes; ``clusters``: the bootstrap clusters' codes (0..n−1) of its rows,
    ``halves`` their halves (:func:`robustbench_fm.core.stats.cluster_halves` of the cluster ids).
    ``typed``: the scope pass's SO and OS lists of every row, at least the first search's width + 1
    wide (:func:`search_widths`; :func:`~robustbench_fm.methods.croma.knn.scope_neighbours`'s
    ``typed_width``), whose similarities are the products this module's search would compute: the
    search then reads them instead of a second pass over the scope."""
    clusters = np.asarray(clusters, np.int64)
    n_clusters = int(clusters.max()) + 1
    x = torch.as_tensor(np.ascontiguousarray(features))
    so, os_ = _typed_means(x, labels, confs, groups, clusters, m, typed)

    def margin(sim_so, sim_os):
        d_so, d_os = 1.0 - sim_so, 1.0 - sim_os
        with np.errstate(invalid="ignore", divide="ignore"):
            return (d_os - d_so) / (d_os + d_so)

    value = margin(so[0], os_[0])
    rows, p, new_so, new_os = pair_without(so, os_, n_clusters)
    shift = value[rows] - margin(new_so, new_os)
    finite = value[np.isfinite(value)]
    out = np.zeros((2, n_clusters))
    if not len(finite):
        return out
    density = smoothed_density(finite)
    near = density(finite - np.median(finite)).sum()
    if not near > 0:
        return out
    weight = np.where(np.isfinite(shift), density(value[rows] - np.median(finite)) * np.nan_to_num(shift), 0.0)
    half = np.asarray(halves)[rows]
    for h in (0, 1):
        out[h] = np.bincount(p, weights=np.where(half == h, weight, 0.0), minlength=n_clusters) / near
    return out

