"""RI, MaRI, τ, kNN balanced accuracy and the CRoMa tail statistics, computed from the
neighbour lists of :mod:`robustbench_fm.methods.croma.knn` (croma.md, "Method"; croma_conventions.md A.4–A.7).

Every function takes one scope's lists (rows = evaluation units of that scope) and integer
codes in the scope's order of first appearance (``pd.factorize``), which fixes the vote
tie-break of A.5.
"""
from __future__ import annotations

import numpy as np
from scipy.special import logsumexp
from sklearn.metrics import balanced_accuracy_score

from .knn import ScopeNeighbours

#: τ used when no typed neighbour exists or their median distance is 0 (conventions A.6).
TAU_FALLBACK = 0.2


def knn_balanced_accuracy(codes: np.ndarray, nb: ScopeNeighbours, ks: list[int]) -> dict[int, float]:
    """Leave-one-group-out majority-vote kNN balanced accuracy at every k in ``ks``
    (conventions A.5): votes over the first min(k, available) cross-group neighbours, a tie goes
    to the smallest code (first appearance), units without any neighbour are left out, a k where
    no unit votes is absent. One incremental vote count serves the whole grid."""
    n, n_classes = len(codes), int(codes.max()) + 1
    votes = np.zeros((n, n_classes), dtype=np.int64)
    rows = np.arange(n)
    used = nb.count > 0
    wanted = set(ks)
    scores = {}
    for pos in range(max(ks)):
        live = pos < nb.count
        np.add.at(votes, (rows[live], codes[nb.idx[live, pos]]), 1)
        if pos + 1 in wanted and used.any():
            scores[pos + 1] = float(balanced_accuracy_score(codes[used], votes[used].argmax(axis=1)))
    return {k: scores[k] for k in ks if k in scores}


def typed_slots(labels: np.ndarray, confs: np.ndarray, nb: ScopeNeighbours, k: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SO and OS masks of each unit's first min(k, available) neighbour slots (conventions A.2)
    and the slots' cosine distances."""
    idx = nb.idx[:, :k]
    live = np.arange(idx.shape[1])[None, :] < np.minimum(nb.count, k)[:, None]
    safe = np.where(live, idx, 0)
    same_label = labels[safe] == labels[:, None]
    same_conf = confs[safe] == confs[:, None]
    return live & same_label & ~same_conf, live & ~same_label & same_conf, nb.dist[:, :k]


def count_share(so: np.ndarray, os_: np.ndarray) -> tuple[np.ndarray, float]:
    """Per-unit RI_i = n_SO/(n_SO + n_OS) (NaN without a typed neighbour) and the pooled
    RI = Σ n_SO / Σ (n_SO + n_OS) (0.5 without any; conventions A.4), from the slot masks."""
    n_so, n_typed = so.sum(axis=1), so.sum(axis=1) + os_.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_unit = np.where(n_typed > 0, n_so / n_typed, np.nan)
    total = int(n_typed.sum())
    return per_unit, float(n_so.sum() / total) if total else 0.5


def log_evidence(so: np.ndarray, os_: np.ndarray, dist: np.ndarray, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-unit log Σ_SO w and log Σ_OS w with w = exp(−d/τ) (MaRI, conventions A.6); −inf where
    a unit has none. Log space keeps the ratio exact where every weight underflows."""
    logw = -dist / tau
    with np.errstate(divide="ignore"):
        return (logsumexp(np.where(so, logw, -np.inf), axis=1),
                logsumexp(np.where(os_, logw, -np.inf), axis=1))


def so_share(log_so: np.ndarray, log_os: np.ndarray) -> np.ndarray:
    """Σ_SO w / Σ_{SO∪OS} w from log evidence; NaN where there is no typed evidence."""
    total = np.logaddexp(log_so, log_os)
    out = np.full(np.shape(total), np.nan)
    ok = np.isfinite(total)
    out[ok] = np.exp(np.asarray(log_so)[ok] - total[ok])
    return out


def pooled_share(log_so: np.ndarray, log_os: np.ndarray) -> float:
    """Pooled evidence ratio over all units (conventions A.6); 0.5 without any evidence. The
    terms are summed in sorted order, so the value does not depend on the order of the units."""
    value = so_share(logsumexp(np.sort(log_so)), logsumexp(np.sort(log_os)))
    return 0.5 if np.isnan(value) else float(value)


def resolve_tau(typed_distances: np.ndarray) -> tuple[float, str]:
    """Auto τ = median cosine distance of all typed slots at the operating k, pooled over units
    and scopes; 0.2 when there is none or the median is 0 (conventions A.6). Returns (τ, "auto"
    or "fallback")."""
    median = float(np.median(typed_distances)) if typed_distances.size else 0.0
    return (median, "auto") if median > 0 else (TAU_FALLBACK, "fallback")


def croma_values(so_dist: np.ndarray, os_dist: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """d_SO, d_OS (mean of the m nearest typed distances) and CRoMa_i = (d_OS − d_SO)/(d_OS + d_SO)
    (croma.md Eq. for CRoMa; conventions A.7); NaN for a unit short of m candidates of a type."""
    d_so = so_dist[:, :m].mean(axis=1)
    d_os = os_dist[:, :m].mean(axis=1)
    short = ~(np.isfinite(d_so) & np.isfinite(d_os))
    d_so[short], d_os[short] = np.nan, np.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        return d_so, d_os, (d_os - d_so) / (d_os + d_so)


def tail(values: np.ndarray, alpha: float) -> tuple[float, float, float]:
    """F(0) = share ≤ 0, Q_α = numpy linear percentile, LTM_α = mean of values ≤ Q_α (Q_α when
    the tail is empty), over the finite values (conventions A.7), summed in sorted order (the same
    values in any order give the same bits)."""
    v = np.sort(values[np.isfinite(values)])
    if v.size == 0:
        return np.nan, np.nan, np.nan
    q = float(np.percentile(v, 100 * alpha))
    low = v[v <= q]
    return float(np.mean(v <= 0)), q, float(low.mean()) if low.size else q
