"""RI, MaRI, τ, kNN balanced accuracy and the CRoMa tail statistics, computed from the
neighbour lists of :mod:`robustbench_fm.methods.croma.knn` (croma.md, "Method"; croma_conventions.md A.4–A.7).

Every function takes one scope's lists (rows = evaluation units of that scope) and integer
codes in the scope's order of first appearance (``pd.factorize``), which fixes the vote
tie-break of A.5.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
    truth = codes[used]
    support = np.bincount(truth, minlength=n_classes)
    for pos in range(max(ks)):
        live = pos < nb.count
        np.add.at(votes, (rows[live], codes[nb.idx[live, pos]]), 1)
        if pos + 1 in wanted and used.any():
            scores[pos + 1] = balanced_accuracy(truth, votes[used].argmax(axis=1), support)
    return {k: scores[k] for k in ks if k in scores}


def balanced_accuracy(truth: np.ndarray, pred: np.ndarray, support: np.ndarray) -> float:
    """sklearn's ``balanced_accuracy_score`` (the mean recall over the classes present in
    ``truth``, in class order, the same divisions and mean, so the same bits) without its input
    checks, which cost more than the vote counting; ``support``: ``np.bincount(truth)``."""
    hits = np.bincount(truth[truth == pred], minlength=len(support))
    present = support > 0
    return float(np.mean(hits[present] / support[present]))


def typed_slots(labels: np.ndarray, confs: np.ndarray, nb: ScopeNeighbours, k: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SO and OS masks of each unit's first min(k, available) neighbour slots (conventions A.2)
    and the slots' cosine distances."""
    so, os_, _, _, dist = slot_types(labels, confs, nb, k)
    return so, os_, dist


def slot_types(labels: np.ndarray, confs: np.ndarray, nb: ScopeNeighbours, k: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """SO, OS, SS and OO masks of each unit's first min(k, available) neighbour slots
    (conventions A.2; SS = same label and centre, OO = other label and centre, the uninformative
    types) and the slots' cosine distances."""
    idx = nb.idx[:, :k]
    live = np.arange(idx.shape[1])[None, :] < np.minimum(nb.count, k)[:, None]
    safe = np.where(live, idx, 0)
    same_label = labels[safe] == labels[:, None]
    same_conf = confs[safe] == confs[:, None]
    return (live & same_label & ~same_conf, live & ~same_label & same_conf, live & same_label & same_conf,
            live & ~same_label & ~same_conf, nb.dist[:, :k])


#: the undefined-unit causes of croma 1.0.1 (``RobustnessResult.sample_undefined_types``: 0 defined,
#: 1 SS-dominated, 2 OO-dominated, 3 mixed), as the per-sample column ``undefined`` writes them
UNDEFINED = ("", "ss_dominated", "oo_dominated", "mixed")


def undefined_causes(so: np.ndarray, os_: np.ndarray, ss: np.ndarray, oo: np.ndarray) -> np.ndarray:
    """Why a unit has no RI / MaRI (conventions A.4; croma.md Figure 1b: fixed-k metrics can be
    undefined), as croma 1.0.1 labels it: 0 defined (a typed neighbour in its top-k); 1 more SS
    than OO neighbours (same-label-same-centre dominated); 2 more OO than SS
    (other-label-other-centre dominated); 3 mixed (as many of each, or no neighbour at all)."""
    n_ss, n_oo = ss.sum(axis=1), oo.sum(axis=1)
    cause = np.where(n_ss > n_oo, 1, np.where(n_oo > n_ss, 2, 3))
    return np.where((so | os_).any(axis=1), 0, cause)


def count_share(so: np.ndarray, os_: np.ndarray) -> tuple[np.ndarray, float]:
    """Per-unit RI_i = n_SO/(n_SO + n_OS) (NaN without a typed neighbour) and the pooled
    RI = Σ n_SO / Σ (n_SO + n_OS) (0.5 without any; conventions A.4), from the slot masks."""
    n_so, n_typed = so.sum(axis=1), so.sum(axis=1) + os_.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_unit = np.where(n_typed > 0, n_so / n_typed, np.nan)
    total = int(n_typed.sum())
    return per_unit, float(n_so.sum() / total) if total else 0.5


#: below this an evidence total is summed in log space (float64's smallest normal number, as croma 1.0.1)
TINY = float(np.finfo(np.float64).tiny)


@dataclass
class Evidence:
    """MaRI's typed evidence of some units (conventions A.6): per unit Σ_SO w and Σ_OS w with
    w = exp(−d/τ) (float64), and where needed the same totals in log space (``np.longdouble``)."""

    so: np.ndarray
    os: np.ndarray
    typed: np.ndarray   # the unit has a typed neighbour
    log_so: np.ndarray  # log totals where a unit's linear total underflows, else -inf
    log_os: np.ndarray
    masks: tuple[np.ndarray, np.ndarray]  # the SO and OS slot masks, the slots' distances and τ:
    dist: np.ndarray                      # the pooled log path recomputes every unit's log totals
    tau: float


def _log_totals(so: np.ndarray, os_: np.ndarray, dist: np.ndarray, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """log Σ_SO w and log Σ_OS w per row, as croma 1.0.1 takes them where the linear sums vanish:
    log w = −d/τ in extended precision (finite for any τ > 0, subnormal included), summed with
    logaddexp in slot order; −inf without a typed slot."""
    logw = -np.asarray(dist, dtype=np.longdouble) / np.longdouble(tau)
    with np.errstate(invalid="ignore"):  # inf distances of absent slots are masked out
        return (np.logaddexp.reduce(np.where(so, logw, -np.inf), axis=1),
                np.logaddexp.reduce(np.where(os_, logw, -np.inf), axis=1))


def evidence(so: np.ndarray, os_: np.ndarray, dist: np.ndarray, tau: float) -> Evidence:
    """MaRI's evidence per unit from its slot masks and distances (conventions A.6), with
    croma 1.0.1's arithmetic: w = exp(−d/τ) in float64, summed over the slots in distance order
    (a running sum, as croma's cumulative sums), so each unit's totals are croma's bits on the same
    distances; where a unit's Σw underflows (τ tiny against its distances) its totals are also
    kept in log space (:func:`_log_totals`)."""
    dist = np.asarray(dist, dtype=np.float64)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        w = np.exp(-dist / tau)
    n = len(dist)
    so_w, os_w = np.zeros(n), np.zeros(n)
    for j in range(dist.shape[1]):  # slot by slot: the running sum's order
        so_w += np.where(so[:, j], w[:, j], 0.0)
        os_w += np.where(os_[:, j], w[:, j], 0.0)
    typed = (so | os_).any(axis=1)
    log_so, log_os = np.full(n, -np.inf, dtype=np.longdouble), np.full(n, -np.inf, dtype=np.longdouble)
    low = typed & ~(so_w + os_w >= TINY)
    if low.any():
        log_so[low], log_os[low] = _log_totals(so[low], os_[low], dist[low], tau)
    return Evidence(so_w, os_w, typed, log_so, log_os, (so, os_), dist, float(tau))


def _log_share(log_so, log_os) -> float:
    """SO share from log totals (croma 1.0.1's ``_ratio_from_log_evidence``): 0.5 when the
    denominator is not finite."""
    total = np.logaddexp(log_so, log_os)
    return float(np.exp(log_so - total)) if np.isfinite(total) else 0.5


def so_share(ev: Evidence) -> np.ndarray:
    """Per-unit MaRI_i = Σ_SO w / Σ_{SO∪OS} w; NaN without a typed neighbour; in log space
    where the linear total underflows (conventions A.6)."""
    out = np.full(len(ev.so), np.nan)
    total = ev.so + ev.os
    linear = ev.typed & (total >= TINY)
    out[linear] = ev.so[linear] / total[linear]
    low = ev.typed & ~linear
    if low.any():
        log_total = np.logaddexp(ev.log_so[low], ev.log_os[low])
        with np.errstate(invalid="ignore"):
            share = np.exp(ev.log_so[low] - log_total)
        out[low] = np.where(np.isfinite(log_total), share, 0.5).astype(np.float64)
    return out


def pooled_share(parts: list[Evidence]) -> float:
    """Pooled MaRI = Σ_units Σ_SO w / Σ_units Σ_{SO∪OS} w over the units of all ``parts``
    (conventions A.6); 0.5 without any typed neighbour; in log space when the pooled total
    underflows. The unit totals are summed in sorted order, so the value does not depend on
    the order of the units."""
    typed = np.concatenate([p.typed for p in parts])
    if not typed.any():
        return 0.5
    so = float(np.sort(np.concatenate([p.so for p in parts])).sum())
    os_ = float(np.sort(np.concatenate([p.os for p in parts])).sum())
    if so + os_ >= TINY:
        return so / (so + os_)
    logs = [_log_totals(*p.masks, p.dist, p.tau) for p in parts]
    return _log_share(np.logaddexp.reduce(np.sort(np.concatenate([lo for lo, _ in logs]))),
                      np.logaddexp.reduce(np.sort(np.concatenate([lo for _, lo in logs]))))


def spread(values) -> float:
    """Population standard deviation (ddof = 0) of per-subset values: croma 1.0.1's ``std`` of
    ``pair_values`` (RI, MaRI: the subsets' pooled values; CRoMa: their medians)."""
    return float(np.std(np.asarray(values, dtype=float)))


def distribution(values: np.ndarray, alpha: float) -> tuple[float, float, float]:
    """(median, Q_α, LTM_α) of the defined per-unit RI or MaRI values (croma 1.0.1's
    ``median_value``, ``q_alpha``, ``ltm_alpha``: the same tail rule as CRoMa's, conventions A.4
    and A.7); NaN when no unit is defined."""
    v = np.sort(values[np.isfinite(values)])
    if v.size == 0:
        return np.nan, np.nan, np.nan
    _, q, ltm = tail(v, alpha)
    return float(np.median(v)), q, ltm


def sweep_summary(ms, curve) -> tuple[float, float, float]:
    """(croma_auc, croma_min, croma_delta) of the CRoMa curve over the m sweep, as croma's
    benchmark reports them (its ``scripts/bench/benchmark.py``; croma.md A.3): the trapezoid
    area of value(m) over m divided by the sweep's width (the value itself for a single m), the
    smallest finite value, and value(last m) − value(first m) (0 for a single m)."""
    ms, curve = np.asarray(ms, dtype=float), np.asarray(curve, dtype=float)
    finite = curve[np.isfinite(curve)]
    low = float(finite.min()) if finite.size else np.nan
    if len(ms) < 2:
        return (float(curve[0]) if len(curve) else np.nan), low, 0.0
    return float(np.trapezoid(curve, ms) / (ms[-1] - ms[0])), low, float(curve[-1] - curve[0])


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
