"""Cross-encoder analyses of CANDOR's discordant sets (candor.md "Derived Measures: The Discordant
Set", "Discordance Across Domains", "Reporting"; candor_v1.md Table 4).

* :func:`overlap_test`: for two encoders scored on the same queries, the overlap of their
  discordant sets D_F(g) = {x : F(x) = 1, DM_g(x) > 0}, its hypergeometric upper tail (the
  probability that two random sets of the same sizes share at least this overlap) and the
  Jaccard index in excess of its exact expectation under that null (ΔJ);
* :func:`pairwise_overlaps`: every encoder pair of every task, the p-values of a family corrected
  with Benjamini-Hochberg FDR control at 0.05 ("Reporting");
* :func:`overlap_summary`: per task, the mean ΔJ, the share of pairs above chance and the share
  significant after FDR ("Sig." of Table 3);
* :func:`consensus_blind_set` / :func:`blind_set_summary`: the positives discordant under a strict
  majority of the panel (v1 Table 4 "Blind"; v4 Table 4's 263 and 33,770 positives).
"""
from __future__ import annotations

from itertools import combinations

import numpy as np
import pandas as pd
from scipy import stats

from ...core.stats import FDR_ALPHA, bh_adjust


def overlap_pvalue(n: int, size_a: int, size_b: int, overlap: int) -> float:
    """P[X >= overlap] for X ~ Hypergeometric(population n, size_a marked, size_b drawn)."""
    return float(stats.hypergeom.sf(overlap - 1, n, size_a, size_b))


def expected_jaccard(n: int, size_a: int, size_b: int) -> float:
    """E[|A∩B| / |A∪B|] when B is a uniformly random size_b-subset of the n queries and A is
    fixed of size size_a (exact sum over the hypergeometric support; J = 0 when both are empty)."""
    if size_a + size_b == 0:
        return 0.0
    x = np.arange(max(0, size_a + size_b - n), min(size_a, size_b) + 1)
    pmf = stats.hypergeom.pmf(x, n, size_a, size_b)
    return float(np.sum(pmf * x / (size_a + size_b - x)))


def overlap_test(disc_a: np.ndarray, disc_b: np.ndarray) -> dict:
    """Overlap of two encoders' discordant sets over the same queries (boolean arrays aligned
    on the queries): sizes, overlap, hypergeometric upper-tail p-value, Jaccard J, its null
    expectation E[J] and the excess ΔJ = J − E[J]."""
    a, b = np.asarray(disc_a, bool), np.asarray(disc_b, bool)
    if a.shape != b.shape:
        raise ValueError(f"overlap_test: the two discordance vectors have shapes {a.shape} and {b.shape}; "
                         "align them on the same queries first")
    n, size_a, size_b, overlap = len(a), int(a.sum()), int(b.sum()), int((a & b).sum())
    union = size_a + size_b - overlap
    jaccard = overlap / union if union else 0.0
    expected = expected_jaccard(n, size_a, size_b)
    return dict(n=n, size_a=size_a, size_b=size_b, overlap=overlap,
                expected_overlap=size_a * size_b / n if n else 0.0,
                jaccard=jaccard, expected_jaccard=expected, delta_j=jaccard - expected,
                p_value=overlap_pvalue(n, size_a, size_b, overlap) if n else 1.0)


def _require(frame: pd.DataFrame, columns, what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{what}: per-sample rows lack columns {missing}; pass CANDOR's per_sample rows "
                         "with encoder/finding columns (SweepResults.per_sample('candor'))")


def pairwise_overlaps(per_sample: pd.DataFrame, task_cols=("finding",), id_cols=("sample_id",),
                      family_cols=None, alpha: float = FDR_ALPHA) -> pd.DataFrame:
    """:func:`overlap_test` for every encoder pair of every task (rows grouped by ``task_cols``),
    each pair on the queries both encoders scored (keyed by ``id_cols``). The p-values of each
    family (``family_cols``, default: each task) are BH-corrected: columns ``p_adj``, ``significant``
    and ``above_chance`` (uncorrected p < alpha)."""
    task_cols, id_cols = list(task_cols), list(id_cols)
    family_cols = task_cols if family_cols is None else list(family_cols)
    task_cols += [c for c in family_cols if c not in task_cols]  # a family is a union of tasks
    _require(per_sample, ["encoder", "discordant", *task_cols, *id_cols], "pairwise_overlaps")
    rows = []
    for task, part in per_sample.groupby(task_cols, sort=True, dropna=False):
        wide = part.pivot_table(index=id_cols, columns="encoder", values="discordant", aggfunc="first")
        for enc_a, enc_b in combinations(sorted(wide.columns), 2):
            both = wide[[enc_a, enc_b]].dropna()
            test = overlap_test(both[enc_a].astype(bool).to_numpy(), both[enc_b].astype(bool).to_numpy())
            rows.append({**dict(zip(task_cols, task if isinstance(task, tuple) else (task,))),
                         "encoder_a": enc_a, "encoder_b": enc_b, **test})
    pairs = pd.DataFrame(rows)
    if pairs.empty:
        return pd.DataFrame(columns=[*task_cols, "encoder_a", "encoder_b", "n", "size_a", "size_b", "overlap",
                                     "expected_overlap", "jaccard", "expected_jaccard", "delta_j", "p_value",
                                     "p_adj", "significant", "above_chance"])
    pairs["p_adj"], pairs["significant"] = np.nan, False
    for _, idx in pairs.groupby(family_cols, sort=False, dropna=False).groups.items():
        adjusted, rejected = bh_adjust(pairs.loc[idx, "p_value"], alpha)
        pairs.loc[idx, "p_adj"], pairs.loc[idx, "significant"] = adjusted, rejected
    pairs["significant"] = pairs["significant"].astype(bool)
    pairs["above_chance"] = pairs["p_value"] < alpha
    return pairs


def overlap_summary(pairs: pd.DataFrame, by=("finding",)) -> pd.DataFrame:
    """Per group: number of pairs, mean ΔJ (Table 3 "ΔJ"), share of pairs above chance and share
    significant after FDR (Table 3 "Sig.")."""
    return (pairs.groupby(list(by), sort=True, dropna=False)
            .agg(n_pairs=("delta_j", "size"), delta_j=("delta_j", "mean"),
                 above_chance=("above_chance", "mean"), sig=("significant", "mean"))
            .reset_index())


def consensus_blind_set(per_sample: pd.DataFrame) -> pd.DataFrame:
    """Per (finding, sample_id) of the positive queries: ``n_encoders`` that scored it,
    ``n_discordant`` encoders under which it is discordant, and ``blind`` = discordant under a
    strict majority of the panel (the encoders with any row for that finding), i.e.
    n_discordant > panel/2 (candor_v1.md Table 4 "Blind"; candor.md Table 4). A ``dataset``
    column, when present, is kept in the key."""
    _require(per_sample, ["encoder", "finding", "sample_id", "discordant"], "consensus_blind_set")
    key = [c for c in ("dataset", "finding", "sample_id") if c in per_sample.columns]
    frame = per_sample[[*key, "encoder", "discordant"]].copy()
    frame["discordant"] = frame["discordant"].astype(bool)
    out = (frame.groupby(key, sort=True).agg(n_encoders=("encoder", "nunique"),
                                             n_discordant=("discordant", "sum")).reset_index())
    panel = frame.groupby("finding")["encoder"].nunique()
    out["panel"] = out["finding"].map(panel).astype(int)
    out["n_discordant"] = out["n_discordant"].astype(int)
    out["blind"] = out["n_discordant"] > out["panel"] / 2
    return out


def blind_set_summary(blind: pd.DataFrame) -> pd.DataFrame:
    """Per finding and pooled (``finding="Pooled"``): positive queries, those blind under the
    majority, their share, and the queries scored by the whole panel."""
    def row(part: pd.DataFrame) -> dict:
        return dict(n_queries=len(part), n_blind=int(part["blind"].sum()),
                    blind_share=float(part["blind"].mean()) if len(part) else np.nan,
                    n_scored_by_all=int((part["n_encoders"] == part["panel"]).sum()))

    rows = [{"finding": f, **row(part)} for f, part in blind.groupby("finding", sort=True)]
    rows.append({"finding": "Pooled", **row(blind)})
    return pd.DataFrame(rows)
