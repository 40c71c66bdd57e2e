"""The banks' share of CANDOR's sampling variance: each patient's influence as a bank member on D and
D_all, so that the paired comparisons between encoders redraw the banks' patients too (issue 58
item 3; docs/comparisons.md "Both roles of a patient").

A query's discordance depends on other patients: its k nearest positives and negatives in R±_s (D)
or among all candidates of s (D_all). Resampling the patients of the queries with the banks fixed
leaves that second role out, and the paired bootstrap came out too narrow (variance ratio 1.2–1.45
under the null, ``python scripts/calibrate_compare.py``). D is a share of indicators 1{DM(x) > 0},
a step: a patient's images flip a query or not, and the square of its flip count is mostly the
noise of its own flips (its expectation, the first-order Hoeffding term, is what the variance
needs). So the step is smoothed, 1{DM > 0} ≈ Φ(DM / h) (h: Silverman's bandwidth over the row's
DM values, :func:`robustbench_fm.core.stats.smoothed_density`), and a patient p's influence as a
bank member is

    Δ̃_p = Σ_q φ_h(DM_q) · (DM_q − DM_q^(−p)),

over the queries q of other patients, DM_q^(−p) being q's margin once p's images have left both
candidate sets (c± the mean of the k nearest that remain: exact, from a top-(k + e) search, e the
most images one patient has among the candidates; c and c^(−p) both from that one search, so a
shift is never a rounding difference between two searches). It is kept per half of the queries'
patients (:func:`robustbench_fm.core.stats.cluster_halves`): the product of a patient's influences
on the two halves estimates its squared influence without that noise
(:func:`robustbench_fm.core.stats.paired_bootstrap` ``bank``).
"""
from __future__ import annotations

import numpy as np
import torch

from ...core.neighbors import has_copies, means_without_each, pair_without, plain_topks, topk_similarity
from ...core.stats import smoothed_density
from .shortlist import Shortlist


def influence_reach(queries: np.ndarray, cands: np.ndarray, k: int, clusters: np.ndarray,
                    exclude_patient: bool = False, drops: np.ndarray | None = None) -> int:
    """How many nearest candidates :func:`without_each` searches: k + e, e the most a query can lose (itself,
    its drop and, with ``exclude_patient``, its patient's images) plus the most one other patient holds (at most
    the candidates available)."""
    per = np.bincount(clusters[cands], minlength=int(clusters.max()) + 1) if len(cands) else np.zeros(1, int)
    extra = 1 + int(drops is not None) + int(per.max()) * (2 if exclude_patient else 1)
    return min(k + extra, len(cands) - int(np.isin(queries, cands).any()))


class Searches:
    """One task's exact searches kept for its influence (issue 57): the stage's D_all search of the queries
    among all positives / negatives also keeps the k + e nearest :func:`without_each` will ask (``wider``),
    from the same tiles of products (:func:`~robustbench_fm.core.neighbors.plain_topks`), so that the influence
    reads it instead of a second pass over the same products. Each k's result is the one a search for it
    alone returns (ties included). Only the plain torch search is kept: where candidates share vectors or
    faiss searches, every request searches anew."""

    def __init__(self):
        self._found: dict[tuple[bytes, bytes, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def topk(self, feats: torch.Tensor, queries: np.ndarray, cands: np.ndarray, reach: int, block_size: int,
             backend: str, vectors: np.ndarray | None, wider: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`~robustbench_fm.core.neighbors.topk_similarity` (``reach`` nearest), kept from an earlier
        request's pass when it took this one too, else searched (with the ``wider`` nearest besides, kept)."""
        queries, cands = np.asarray(queries, np.int64), np.asarray(cands, np.int64)
        if backend != "torch" or has_copies(vectors, np.r_[queries, cands]):
            return topk_similarity(feats, queries, cands, reach, block_size, backend=backend, vectors=vectors)
        key = (queries.tobytes(), cands.tobytes())
        found = self._found.get((*key, reach))
        if found is not None:
            return found
        wider = min(wider, len(cands) - int(np.isin(queries, cands).any()))  # at most the candidates available
        if wider <= reach:
            return topk_similarity(feats, queries, cands, reach, block_size, backend=backend, vectors=vectors)
        found, self._found[(*key, wider)] = plain_topks(feats, queries, cands, (reach, wider), block_size)
        return found


def without_each(feats: torch.Tensor, queries: np.ndarray, cands: np.ndarray, k: int, clusters: np.ndarray,
                 exclude_patient: bool = False, drops: np.ndarray | None = None, block_size: int = 4096,
                 backend: str = "torch", vectors: np.ndarray | None = None, shortlist: Shortlist | None = None,
                 searches: Searches | None = None):
    """c(x) of every query on ``cands`` (the mean similarity of its k nearest, itself, its drop and,
    with ``exclude_patient``, its patient's images left out) and c(x) without each other patient among
    those k (:func:`robustbench_fm.core.neighbors.means_without_each`'s result). ``shortlist``: the
    group's :class:`~robustbench_fm.methods.candor.shortlist.Shortlist` the stage scored from, which answers the
    k + e nearest without a second similarity pass (default path only: no patient exclusion, no drops);
    ``searches``: the task's kept exact searches (:class:`Searches`), read where they hold these queries and
    candidates (no patient exclusion, no drops)."""
    queries, cands = np.asarray(queries, np.int64), np.asarray(cands, np.int64)
    reach = influence_reach(queries, cands, k, clusters, exclude_patient, drops)
    if not len(queries) or reach < k:
        return np.full(len(queries), np.nan), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    if shortlist is not None and not exclude_patient and drops is None:
        _, found = shortlist.mean_topk(queries, cands, reach, neighbours=True)
        rows, sims = found.rows, found.sims.astype(np.float64)
    else:
        if searches is not None and not exclude_patient and drops is None:
            values, at = searches.topk(feats, queries, cands, reach, block_size, backend, vectors)
        else:
            values, at = topk_similarity(feats, queries, cands, reach, block_size, backend=backend, vectors=vectors)
        sims, rows = values.cpu().numpy().astype(np.float64), cands[at.cpu().numpy()]
    who, own = clusters[np.maximum(rows, 0)], clusters[queries]
    alive = (rows != queries[:, None]) & (rows >= 0)
    if exclude_patient:
        alive &= who != own[:, None]
    if drops is not None:
        alive &= rows != np.asarray(drops)[:, None]
    return means_without_each(sims, who, alive, k, own)


def bank_influence(feats: torch.Tensor, queries: np.ndarray, cand_pos: np.ndarray, cand_neg: np.ndarray, k: int,
                   clusters: np.ndarray, halves: np.ndarray, exclude_patient: bool = False,
                   drops: np.ndarray | None = None, block_size: int = 4096, backend: str = "torch",
                   vectors: np.ndarray | None = None, shortlist: Shortlist | None = None,
                   memo: dict | None = None, searches: Searches | None = None) -> np.ndarray:
    """Δ̃_p (module doc) of every patient (``clusters`` codes) for the discordance of ``queries``
    against the positive candidates ``cand_pos`` and the negative ``cand_neg`` (R±_s for D, all
    positives / negatives for D_all; ``drops``: the equal-size control's dropped negative per query),
    split by the half of the queries' patients (``halves``, 0/1 per feature row): (2, n_clusters),
    row h the influence on the queries of half h. A removal that leaves fewer than k candidates
    counts nothing.

    ``memo``: a dict shared by the calls about the same ``queries`` (and the other arguments), e.g. D's and
    D_all's of one task whose positive bank holds every positive: a candidate set already answered
    (without drops) is not searched again, its :func:`without_each` reused (the same values); ``searches``:
    the task's kept exact searches (:class:`Searches`)."""
    n_clusters = int(clusters.max()) + 1

    def side(cands, side_drops):
        if memo is None or side_drops is not None:
            return without_each(feats, queries, cands, k, clusters, exclude_patient, side_drops, block_size, backend,
                                vectors, shortlist, searches)
        key = np.asarray(cands, np.int64).tobytes()
        if key not in memo:
            memo[key] = without_each(feats, queries, cands, k, clusters, exclude_patient, None, block_size, backend,
                                     vectors, shortlist, searches)
        return memo[key]

    pos, neg = side(cand_pos, None), side(cand_neg, drops)
    dm = neg[0] - pos[0]
    density = smoothed_density(dm)
    q, p, new_pos, new_neg = pair_without(pos, neg, n_clusters)
    shift = dm[q] - (new_neg - new_pos)  # how much nearer discordance p's images put the query
    weight = np.where(np.isfinite(shift), density(dm[q]) * np.nan_to_num(shift), 0.0)
    half = np.asarray(halves)[np.asarray(queries, np.int64)[q]]
    return np.stack([np.bincount(p, weights=np.where(half == h, weight, 0.0), minlength=n_clusters)
                     for h in (0, 1)])


def item_shares(influence: np.ndarray, item_clusters: np.ndarray) -> np.ndarray:
    """Each item's share of its patient's ``influence``: Δ_p / (p's items among ``item_clusters``),
    so that the items of p sum to Δ_p (a patient without items in the row loses its share)."""
    item_clusters = np.asarray(item_clusters, np.int64)
    n = np.bincount(item_clusters, minlength=len(influence))
    return influence[item_clusters] / n[item_clusters]
