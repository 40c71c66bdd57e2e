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


def _typed_means(x: torch.Tensor, labels, confs, groups, clusters, m: int, same_label: bool):
    """For every row: the mean similarity of its m nearest candidates of one type (SO: same label,
    other confounder value; OS: the other way round), other groups (slides) only, and the means with
    each cluster among them left out (:func:`~robustbench_fm.core.neighbors.means_without_each`)."""
    n = len(labels)
    width = min(n, m + int(np.bincount(clusters).max()))
    lab, con, grp = (torch.as_tensor(a, device=x.device) for a in (labels, confs, groups))
    sims, rows = [], []
    for start in range(0, n, BLOCK):
        stop = min(start + BLOCK, n)
        s = x[start:stop] @ x.T
        same_l = lab[start:stop, None] == lab[None, :]
        same_c = con[start:stop, None] == con[None, :]
        typed = (same_l & ~same_c) if same_label else (~same_l & same_c)
        typed &= grp[start:stop, None] != grp[None, :]
        v, at = torch.topk(torch.where(typed, s, torch.full_like(s, -torch.inf)), width, dim=1)
        sims.append(v.cpu().numpy().astype(np.float64))
        rows.append(at.cpu().numpy())
    sims, rows = np.concatenate(sims), np.concatenate(rows)
    return means_without_each(sims, clusters[rows], np.isfinite(sims), m, clusters)


def median_influence(features: np.ndarray, labels, confs, groups, clusters, halves, m: int) -> np.ndarray:
    """δ_p (module doc) of every cluster of one scope on the median CRoMa of its units, per half of the
    anchors' clusters: (2, n_clusters). ``features``: the scope's unit-norm rows; ``labels``,
    ``confs``, ``groups``: its codes; ``clusters``: the bootstrap clusters' codes (0..n−1) of its rows,
    ``halves`` their halves (:func:`robustbench_fm.core.stats.cluster_halves` of the cluster ids)."""
    clusters = np.asarray(clusters, np.int64)
    n_clusters = int(clusters.max()) + 1
    x = torch.as_tensor(np.ascontiguousarray(features))
    so = _typed_means(x, labels, confs, groups, clusters, m, True)
    os_ = _typed_means(x, labels, confs, groups, clusters, m, False)

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

