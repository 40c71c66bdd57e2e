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
search, so a shift is never a rounding difference between two searches.
"""
from __future__ import annotations

import numpy as np
import torch

from ...core.neighbors import means_without_each, pair_without
from ...core.stats import smoothed_density

#: anchor rows per similarity block
BLOCK = 1024


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


def _typed_means(x: torch.Tensor, labels, confs, groups, clusters, m: int):
    """For every row and each type (SO, OS): the mean similarity of its m nearest candidates of that
    type, and the means with each cluster among them left out
    (:func:`~robustbench_fm.core.neighbors.means_without_each`).

    Exact at a fraction of the widest search: the 4m nearest are searched first, and only the rows
    where one cluster holds so many of them that fewer than m would remain are searched again with
    the m + e nearest (e: the most rows one cluster has)."""
    n = len(labels)
    full = min(n, m + int(np.bincount(clusters).max()))
    width = min(full, 4 * m)
    found = [means_without_each(sims, clusters[rows], np.isfinite(sims), m, clusters)
             for sims, rows in _typed_lists(x, np.arange(n), labels, confs, groups, width)]
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


def median_influence(features: np.ndarray, labels, confs, groups, clusters, halves, m: int) -> np.ndarray:
    """δ_p (module doc) of every cluster of one scope on the median CRoMa of its units, per half of the
    anchors' clusters: (2, n_clusters). ``features``: the scope's unit-norm rows; ``labels``,
    ``confs``, ``groups``: its codes; ``clusters``: the bootstrap clusters' codes (0..n−1) of its rows,
    ``halves`` their halves (:func:`robustbench_fm.core.stats.cluster_halves` of the cluster ids)."""
    clusters = np.asarray(clusters, np.int64)
    n_clusters = int(clusters.max()) + 1
    x = torch.as_tensor(np.ascontiguousarray(features))
    so, os_ = _typed_means(x, labels, confs, groups, clusters, m)

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

