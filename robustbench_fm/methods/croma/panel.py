"""Panel-level CRoMa analyses across encoders and benchmarks (croma.md §2.7, §3.3–3.4,
Appendix A.2, A.3, A.6; conventions A.5 "Protocols").

* :func:`evaluate_panel`: every encoder's neighbour pass once, then the **median-k protocol**
  (k = lower median of the per-encoder k*, ``sorted(k*)[(M−1)//2]``, shared by all encoders for
  RI, MaRI, τ and the kNN accuracies) or ``k-star`` (each encoder at its own k*).
* :func:`pareto_front`: the upper-right frontier in the (median CRoMa, LTM₁₀) plane (Figure 3):
  an encoder is dominated when another is at least as good on both axes and better on one.
* :func:`mean_ranks`: rank encoders within each benchmark (1 = best, ties averaged), then average
  the ranks over benchmarks (Figure 5), with the frontier of the mean ranks.
* :func:`sweeps` + :func:`m_sensitivity` / :func:`alpha_sensitivity`: CRoMa at m = 1..20 and
  LTM_α at α ∈ {0.05, 0.10, 0.20} from one typed search per encoder, and the Spearman
  correlations of the induced rankings (Tables 8 and 7).
* :func:`metric_agreement` and :func:`benchmark_agreement`: Spearman correlations among RI, MaRI
  and CRoMa within a benchmark (Table 9) and of median CRoMa across benchmarks.
* :func:`typed_ranks`: the position, among all other samples (same-slide ones included) ordered
  by cosine distance, of each unit's nearest cross-slide SO match and OS distractor (Table 12,
  Appendix A.4; the reference's ``typed_neighbor_rank_experiment.py``).

Tables are plain DataFrames with an ``encoder`` column (the stage's summaries with an ``encoder``
column added, as the app writes them, work as they are).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import torch
from scipy.stats import rankdata

from ...core.devices import resolve_device
from ...core.neighbors import l2_normalize
from ...core.stats import spearman
from . import stage as croma
from .knn import distinct_rows
from .params import CromaParams

PROTOCOLS = ("median-k", "k-star")


def median_k(k_stars) -> int:
    """The lower median of the per-encoder k*: sorted(k*)[(M−1)//2], always a grid value."""
    ks = sorted(int(k) for k in k_stars)
    if not ks:
        raise ValueError("median_k: no k* given; evaluate at least one encoder")
    return ks[(len(ks) - 1) // 2]


def prepare_panel(features: Mapping[str, object], manifest: pd.DataFrame, **params) -> dict[str, croma.Prepared]:
    """One neighbour pass per encoder (``params``: those of :func:`robustbench_fm.methods.croma.stage.prepare`)."""
    if not features:
        raise ValueError("croma panel: no encoder features given; pass {encoder name: (N, D) features}")
    return {name: croma.prepare(x, manifest, **params) for name, x in features.items()}


def evaluate_panel(features: Mapping[str, object], manifest: pd.DataFrame, protocol: str = "median-k",
                   m: int = CromaParams.m, alpha: float = CromaParams.alpha, tau: float | None = CromaParams.tau,
                   on_short: str = CromaParams.on_short, **params) -> pd.DataFrame:
    """One summary row per encoder under the median-k or k-star protocol, with ``k_star`` (the
    encoder's own k*) next to the operating ``k``. ``params`` go to the stage's ``prepare``."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"croma panel: protocol={protocol!r} is unknown; use one of {', '.join(PROTOCOLS)}")
    if params.get("k") is not None:
        raise ValueError("croma panel: k is set by the protocol; drop k=")
    preps = prepare_panel(features, manifest, m=m, on_short=on_short, **params)
    k_star = {name: croma.select_k(prep)[0] for name, prep in preps.items()}
    shared = median_k(k_star.values()) if protocol == "median-k" else None
    rows = []
    for name, prep in preps.items():
        row, _, _ = croma.score(prep, shared or k_star[name], m=m, alpha=alpha, tau=tau, on_short=on_short)
        rows.append({"encoder": name, "k_star": k_star[name], **row})
    return pd.DataFrame(rows)


def pareto_front(table: pd.DataFrame, x: str = "croma", y: str = "ltm", maximize: bool = True) -> pd.Series:
    """True for the encoders no other encoder dominates in the (x, y) plane (higher is better when
    ``maximize``, lower otherwise, e.g. for ranks)."""
    pts = table[[x, y]].to_numpy(dtype=float) * (1 if maximize else -1)
    if np.isnan(pts).any():
        raise ValueError(f"pareto_front: NaN in columns {x!r}/{y!r}; drop the encoders without a value")
    at_least = (pts[:, None, :] >= pts[None, :, :]).all(axis=2)
    better = (pts[:, None, :] > pts[None, :, :]).any(axis=2)
    dominated = (at_least & better).any(axis=0)
    return pd.Series(~dominated, index=table.index, name="pareto")


def mean_ranks(benchmarks: Mapping[str, pd.DataFrame], columns=("croma", "ltm")) -> pd.DataFrame:
    """Per-benchmark ranks (1 = highest value, ties averaged) of each column and their mean over
    the benchmarks, for the encoders present in all of them, with the frontier of the mean ranks
    (croma.md §3.4, Figure 5)."""
    shared = set.intersection(*(set(t["encoder"]) for t in benchmarks.values()))
    if not shared:
        raise ValueError("mean_ranks: no encoder appears in every benchmark")
    out = pd.DataFrame({"encoder": sorted(shared)})
    for col in columns:
        ranks = []
        for bench, table in benchmarks.items():
            t = table.set_index("encoder").loc[out["encoder"]]
            out[f"{col}_rank_{bench}"] = rankdata(-t[col].to_numpy(dtype=float))
            ranks.append(out[f"{col}_rank_{bench}"])
        out[f"mean_{col}_rank"] = np.mean(ranks, axis=0)
    out["pareto"] = pareto_front(out, *(f"mean_{c}_rank" for c in columns[:2]), maximize=False)
    return out


def sweeps(preps: Mapping[str, croma.Prepared], ms=range(1, 21), alphas=(0.05, 0.10, 0.20),
           headline_m: int = CromaParams.m) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(by m: encoder, m, croma, croma_std, f0, q_alpha, ltm at α = 0.10; by α: encoder, alpha,
    f0, q_alpha, ltm of CRoMa(m = ``headline_m``)), all from each encoder's one typed search
    (prepare with m ≥ max(ms))."""
    by_m = [croma.croma_by_m(prep, ms).assign(encoder=name) for name, prep in preps.items()]
    by_alpha = [croma.croma_by_m(prep, [headline_m], a).assign(encoder=name, alpha=a)
                for name, prep in preps.items() for a in alphas]
    return (pd.concat(by_m, ignore_index=True),
            pd.concat(by_alpha, ignore_index=True)[["encoder", "alpha", "f0", "q_alpha", "ltm"]])


def _rho(wide: pd.DataFrame, a, b) -> float:
    return spearman(wide[a], wide[b])


def m_sensitivity(by_m: pd.DataFrame, pairs=((1, 5), (5, 20), (1, 20))) -> dict:
    """Table 8 row: Spearman ρ of the median-CRoMa rankings between radii, and the range of the
    number of confounder-dominant encoders (CRoMa < 0) over the sweep."""
    wide = by_m.pivot(index="encoder", columns="m", values="croma")
    negative = (wide < 0).sum(axis=0)
    return {"n": len(wide), **{f"rho_m{a}_m{b}": _rho(wide, a, b) for a, b in pairs},
            "n_negative_min": int(negative.min()), "n_negative_max": int(negative.max())}


def alpha_sensitivity(by_alpha: pd.DataFrame, pairs=((0.05, 0.10), (0.10, 0.20), (0.05, 0.20))) -> dict:
    """Table 7 row: Spearman ρ of the LTM_α rankings between tail fractions."""
    wide = by_alpha.pivot(index="encoder", columns="alpha", values="ltm")
    return {"n": len(wide), **{f"rho_a{a:g}_a{b:g}": _rho(wide, a, b) for a, b in pairs}}


def metric_agreement(table: pd.DataFrame) -> dict:
    """Table 9 row: Spearman ρ of RI vs MaRI, CRoMa vs RI and CRoMa vs MaRI over the encoders."""
    return {"n": len(table), "rho_ri_mari": _rho(table, "ri", "mari"), "rho_croma_ri": _rho(table, "croma", "ri"),
            "rho_croma_mari": _rho(table, "croma", "mari")}


def benchmark_agreement(benchmarks: Mapping[str, pd.DataFrame], column: str = "croma") -> pd.DataFrame:
    """Pairwise Spearman ρ of ``column`` between benchmarks over their shared encoders."""
    names = list(benchmarks)
    rows = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            merged = benchmarks[a][["encoder", column]].merge(benchmarks[b][["encoder", column]], on="encoder")
            rows.append(dict(a=a, b=b, n=len(merged), rho=_rho(merged, f"{column}_x", f"{column}_y")))
    return pd.DataFrame(rows, columns=["a", "b", "n", "rho"])


def typed_ranks(features, manifest: pd.DataFrame, label_col: str = "bio_label", confounder_col: str = "site",
                exclude_col: str = "slide_id", block_size: int = 2048, device="auto") -> pd.DataFrame:
    """Per unit: ``rank_so`` / ``rank_os`` = the 1-indexed position of its nearest SO match / OS
    distractor among **all other samples** ordered by cosine distance, and ``rank_typed`` = the
    smaller of the two (the first typed neighbour); NaN for an anchor the reference leaves out
    (below, "Defined anchors"). One blocked pass over the similarity matrix (design ``all``).

    Paper (Table 12): "Median SO and OS ranks summarize [...] the rank of the nearest
    cross-confounder biological match and same-confounder biological distractor [...] the first SO
    or OS neighbour occurs at a median rank of ≈149 among 20,400 candidates". The reference
    (croma's ``typed_neighbor_rank_experiment.py``) sorts every sample's distances, drops self,
    and takes the column of the first SO / OS candidate: SO and OS candidates are cross-slide
    (same-slide ones are never typed, conventions A.3), but **same-slide samples ahead of them
    count towards the position** ("among 20,400 candidates"), so the rank is 1 + the number of
    other samples, of any slide, strictly closer than the nearest typed candidate.

    Tie rule: the reference sorts with a stable argsort, so samples tied with the nearest typed
    candidate count when their row comes first; here they never count (the competition "min"
    rank), which makes the rank independent of row order and equal to the reference's wherever
    no other sample ties with the nearest typed one (untied data).

    Defined anchors: as the reference (``defined = np.isfinite(croma) & (so_d >
    0)``: an anchor needs an SO and an OS candidate and a nearest SO match at a positive cosine
    distance), an anchor without either type, or whose nearest SO match is at distance 0, gets NaN
    in all three columns and so drops out of the medians. Identical rows are at distance exactly 0
    (cosine set to 1, whatever the rounding of their product); the reference computes that
    distance in float32 and keeps such an anchor when the rounding happens to leave it positive."""

    x_np = l2_normalize(features, "croma: features", dtype=None)
    vid = torch.as_tensor(distinct_rows(x_np)[1])
    x = torch.as_tensor(x_np).to(resolve_device(device))
    vid = vid.to(x.device)
    codes = [torch.as_tensor(pd.factorize(croma._strings(manifest, c, p))[0], device=x.device)
             for c, p in ((label_col, "label_col"), (confounder_col, "confounder_col"), (exclude_col, "exclude_col"))]
    lab, con, grp = codes
    ranks = np.full((len(x), 2), np.nan)
    for lo in range(0, len(x), block_size):
        hi = min(lo + block_size, len(x))
        sim = x[lo:hi] @ x.T
        sim[vid[lo:hi, None] == vid[None, :]] = 1.0  # identical rows: cosine exactly 1
        rows = torch.arange(hi - lo, device=x.device)
        sim[rows, rows + lo] = -torch.inf  # self is never a candidate nor ahead of one
        other = grp[lo:hi, None] != grp[None, :]
        same_lab, same_con = lab[lo:hi, None] == lab[None, :], con[lo:hi, None] == con[None, :]
        nearest = [sim.masked_fill(~(typed & other), -torch.inf).max(dim=1).values
                   for typed in (same_lab & ~same_con, ~same_lab & same_con)]
        defined = torch.isfinite(nearest[0]) & torch.isfinite(nearest[1]) & (nearest[0] < 1)  # d_SO > 0
        for t in range(2):
            closer = (sim > nearest[t][:, None]).sum(dim=1).double() + 1  # every other sample, same slide included
            ranks[lo:hi, t] = torch.where(defined, closer, torch.nan).cpu().numpy()
    return pd.DataFrame({"sample_id": manifest["sample_id"].astype(str).to_numpy(), "rank_so": ranks[:, 0],
                         "rank_os": ranks[:, 1], "rank_typed": np.fmin(ranks[:, 0], ranks[:, 1])})
