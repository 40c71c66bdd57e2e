"""Which encoder: paired comparisons between encoders, a ranking with ties and the verdict a report
opens with (issue 46; docs/comparisons.md).

Every stage whose :class:`~robustbench_fm.methods.Method` declares a
:class:`~robustbench_fm.methods.Pairing` saves a per-item table (CANDOR: its queries and the margin's
scored images; heads: the test rows; CRoMa: the anchors) in each result folder. The items are the same
for every encoder (same queries and banks, test images, tiles, questions), so two encoders are compared
on the same items: :func:`compare` rebuilds each headline metric from the items of every encoder of a
setting (one dataset, stage and stage parameters) with :func:`robustbench_fm.core.stats.paired_bootstrap`,
which evaluates all of them on the same cluster resamples (patients, slides, volumes), and the
difference of two encoders' replicates is their paired bootstrap. Per pair: the difference, its 95%
percentile interval, the two-sided bootstrap p-value and Holm's adjustment within the family of pairs of
one (setting, metric, finding, row). Items one encoder of a pair lacks (a skipped image) are dropped from
that pair and counted (``n_dropped``). An estimate that does not equal the stage's own summary value is
not compared (``notes``): what is compared is what the tables show.

:func:`rank` orders the encoders of each (setting, metric, finding, row) by the estimate and marks the
*best set*: the best encoder and every encoder not significantly worse than it (Holm-adjusted p ≥ 0.05
or no p-value). :func:`overall` is the mean rank of each encoder over the findings of a sweep and the
number of findings whose best set holds it. :func:`verdict` writes one sentence per finding;
:func:`write` saves ``comparisons.csv``, ``ranking.csv`` and ``ranking_overall.csv`` into a run or sweep
folder (``python -m robustbench_fm rank <folder>`` rebuilds them from finished results).
"""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from omegaconf import OmegaConf

from .. import methods
from ..core.atomic import write_text_atomic
from ..core.stats import MIN_CLUSTERS, holm_adjust, paired_bootstrap, paired_difference
from ..core.tables import SweepResults
from .figures import save_figure

#: the family-wise error rate of a comparison family (Holm), and the best set's threshold
ALPHA = 0.05
#: bootstrap resamples of a comparison (candor.md "Reporting": 1,000)
N_BOOT = 1000
SEED = 42
COLUMNS = ["dataset", "method", "metric", "finding", "row", "encoder_a", "encoder_b", "estimate_a", "estimate_b",
           "difference", "ci_low", "ci_high", "p", "p_holm", "n_items", "n_clusters", "n_dropped", "better",
           "better_is", "setting"]
RANK_COLUMNS = ["dataset", "method", "metric", "finding", "row", "encoder", "estimate", "rank", "in_best_set",
                "best", "gap", "gap_ci_low", "gap_ci_high", "p_holm", "better_is", "setting"]
OVERALL_COLUMNS = ["method", "metric", "encoder", "mean_rank", "n_findings", "n_best"]
FILES = ("comparisons.csv", "ranking.csv", "ranking_overall.csv")
#: what could not be compared, one line each (beside the CSVs, where there is any)
NOTES = "comparisons_notes.txt"
POOLED = "__pooled__"
#: the tolerance of the check that an estimate is the stage's own summary value
SAME = 1e-9


@dataclass
class Comparisons:
    """What :func:`compare` found: the pairs, the ranking, the overall ranking and one note per metric
    that could not be compared (why)."""

    pairs: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=COLUMNS))
    ranking: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=RANK_COLUMNS))
    overall: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=OVERALL_COLUMNS))
    notes: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return self.pairs.empty


def _where(items: pd.DataFrame, where: str) -> pd.Series:
    """The rows a :class:`~robustbench_fm.methods.Paired` ``where`` selects: ``column`` (true values) or
    ``column=value``."""
    if not where:
        return pd.Series(True, index=items.index)
    column, _, value = where.partition("=")
    if column not in items.columns:
        return pd.Series(False, index=items.index)
    if value:
        return items[column].astype(str) == value
    return items[column].fillna(False).astype(bool)


def _setting(results: SweepResults, job: str, cache: dict) -> str:
    """A job's setting: its dataset, stage and stage parameters (jobs of one setting are compared)."""
    if job not in cache:
        cfg = results.job_config(job)
        if cfg is None:
            cache[job] = job
        else:
            stage = OmegaConf.to_container(cfg.get("stage", {}), resolve=False) or {}
            keep = {k: stage.get(k) for k in ("name", "params", "findings")}
            cache[job] = json.dumps({"dataset": OmegaConf.select(cfg, "dataset.name", default=None), **keep},
                                    sort_keys=True, default=str)
    return cache[job]


def _row_label(keys: dict, finding) -> str:
    """A row's name in the output: its row columns other than the finding ("planted", "__pooled__");
    a target equal to its finding is left out."""
    parts = [str(v) for c, v in keys.items() if c != "finding" and not (c == "target" and str(v) == str(finding))]
    return " / ".join(parts)


def _units(items: pd.DataFrame, pairing) -> list[tuple[dict, pd.DataFrame, tuple[str, ...], str]]:
    """(row keys, its items, strata columns, the column whose values weigh equally or "") for every row
    of the items, the pooled rows (``Pairing.pool``: strata are its values) and the mean rows
    (``Pairing.mean_over``: strata are its values, each the pooled row of one of them)."""
    rows = [c for c in pairing.rows if c in items.columns]
    out = []
    for keys, part in (items.groupby(rows, sort=True, dropna=False) if rows else [((), items)]):
        out.append((dict(zip(rows, keys if isinstance(keys, tuple) else (keys,))), part, (), ""))

    def pooled(over: list[str], named: dict, strata: tuple[str, ...], outer: str):
        others = [c for c in rows if c not in over]
        for keys, part in (items.groupby(others, sort=True, dropna=False) if others else [((), items)]):
            if part[over[-1]].nunique() < 2:
                continue
            keys = dict(zip(others, keys if isinstance(keys, tuple) else (keys,)))
            out.append(({c: named.get(c, keys.get(c)) for c in rows}, part, strata, outer))

    if pairing.pool and pairing.pool in rows:
        pooled([pairing.pool], {pairing.pool: pairing.pooled}, (pairing.pool,), "")
        if pairing.mean_over and pairing.mean_over in rows:
            pooled([pairing.pool, pairing.mean_over], {pairing.pool: pairing.pooled, pairing.mean_over: pairing.mean},
                   (pairing.mean_over, pairing.pool), pairing.mean_over)
    return out


def _summary_value(summaries: pd.DataFrame, encoder: str, keys: dict, metric: str) -> float | None:
    """The stage's own summary value of ``metric`` on this row (None where the summary has no such row)."""
    if summaries.empty or metric not in summaries.columns:
        return None
    rows = summaries[summaries["encoder"] == encoder]
    for col, value in keys.items():
        if col in rows.columns:
            rows = rows[rows[col].astype(str) == str(value)]
    return float(rows[metric].iloc[0]) if len(rows) == 1 else None


def _compare_unit(unit: pd.DataFrame, paired, pairing, strata_cols: tuple[str, ...], outer: str,
                  encoders: list[str], seed, n_boot: int) -> tuple[dict, list[dict]]:
    """Estimates of every encoder and one record per pair of encoders for one (metric, row)."""
    if paired.value not in unit.columns or unit[paired.value].isna().all():  # not this metric's row
        return {}, []
    key = [*strata_cols, pairing.item]
    by_enc = {e: part.drop_duplicates(key).set_index(key) for e, part in unit.groupby("encoder", sort=True)}
    encoders = [e for e in encoders if e in by_enc]
    common = None
    for e in encoders:
        common = by_enc[e].index if common is None else common.intersection(by_enc[e].index)
    if common is None:
        return {}, []

    def boot(names: list[str], index: pd.Index, n_boot: int = n_boot):
        first = by_enc[names[0]].loc[index]
        values = np.stack([by_enc[e].loc[index, paired.value].to_numpy(float) for e in names])
        other = np.stack([by_enc[e].loc[index, paired.other].to_numpy(float) for e in names]) if paired.other \
            else None
        strata = weights = None
        if strata_cols and paired.pool_weight:  # strata weighted by their items' pool_weight (equal per outer)
            labels = pd.DataFrame({c: first.index.get_level_values(c).astype(str) for c in strata_cols})
            strata = labels.groupby(list(strata_cols), sort=True).ngroup().to_numpy()
            w = np.bincount(strata, weights=first[paired.pool_weight].astype(float).to_numpy())
            if outer:  # each value of ``outer`` weighs 1: its strata's weights normalised within it
                outer_of = labels.groupby(strata)[outer].first().reindex(range(len(w))).to_numpy()
                within = pd.Series(w).groupby(outer_of).transform("sum").to_numpy()
                w = np.divide(w, within, out=np.zeros_like(w), where=within > 0)
            weights = w
        elif outer:  # the mean row: each value of ``outer`` one stratum of equal weight, its items one set
            strata = pd.factorize(first.index.get_level_values(outer), sort=True)[0]
        clusters = first[pairing.cluster].astype(str).to_numpy()
        est, reps = paired_bootstrap(paired.kind, values, clusters, n_boot, seed, other=other, strata=strata,
                                     weights=weights)
        return est, reps, int(len(np.unique(clusters)))

    full = all(len(by_enc[e].index) == len(common) for e in encoders)
    shared = boot(encoders, common) if full and len(common) else None
    # each encoder's estimate on all of its own items (what its summary shows, checked by the caller)
    estimates = dict(zip(encoders, shared[0])) if shared is not None else \
        {e: boot([e], by_enc[e].index, 0)[0][0] for e in encoders if len(by_enc[e].index)}
    records = []
    for a, b in combinations(encoders, 2):
        if shared is not None:
            index = common
            est, reps, n_clusters = shared
            ia, ib = encoders.index(a), encoders.index(b)
        else:
            index = by_enc[a].index.intersection(by_enc[b].index)
            if not len(index):
                continue
            est, reps, n_clusters = boot([a, b], index)
            ia, ib = 0, 1
        diff = paired_difference(est, reps, ia, ib, n_clusters)
        dropped = len(by_enc[a].index.union(by_enc[b].index)) - len(index)
        records.append(dict(encoder_a=a, encoder_b=b, estimate_a=float(est[ia]), estimate_b=float(est[ib]), **diff,
                            n_items=int(len(index)), n_clusters=n_clusters, n_dropped=int(dropped)))
    return estimates, records


def compare(results: SweepResults, n_boot: int = N_BOOT, seed: int = SEED) -> Comparisons:
    """Paired comparisons of every pair of encoders scored on the same items, for every stage that
    declares a :class:`~robustbench_fm.methods.Pairing` (module doc)."""
    frames, notes, settings = [], [], {}
    for stage in sorted({f.parts[-2] for d in results.job_dirs for f in (d / "results").glob("*/*/*/*")}):
        method = methods.find(stage)
        pairing = method.pairing if method is not None else None
        if pairing is None:
            continue
        items = results._read(stage, f"{pairing.table}.parquet")
        if items.empty or items["encoder"].nunique() < 2:
            continue
        summaries = results.summaries(stage)
        items["setting"] = [_setting(results, j, settings) for j in items["job"]]
        better = {m.name: m.better for m in method.headline}
        for (dataset, setting), part in items.groupby(["dataset", "setting"], sort=True):
            encoders = sorted(part["encoder"].unique())
            if len(encoders) < 2:
                continue
            summ = summaries[(summaries["dataset"] == dataset)] if len(summaries) else summaries
            if len(summ) and "job" in summ.columns:
                summ = summ[[_setting(results, j, settings) == setting for j in summ["job"]]]
            for paired in pairing.metrics:
                chosen = part[_where(part, paired.where)]
                for keys, unit, strata_cols, outer in _units(chosen, pairing):
                    finding = keys.get("finding", "")
                    unit_seed = zlib.crc32(json.dumps([dataset, stage, paired.metric, keys], default=str).encode())
                    estimates, records = _compare_unit(unit, paired, pairing, strata_cols, outer, encoders,
                                                       (seed, unit_seed), n_boot)
                    if not records:
                        continue
                    off = [e for e, v in estimates.items()
                           if (s := _summary_value(summ, e, keys, paired.metric)) is not None
                           and not (np.isnan(s) and np.isnan(v)) and not abs(s - v) <= SAME * max(1, abs(s))]
                    label = _row_label(keys, finding)
                    if off:
                        notes.append(f"{stage} {paired.metric}, {finding} {label}: not compared; the items do not "
                                     f"give the summary's value for {', '.join(off)}")
                        continue
                    for r in records:
                        r.update(dataset=dataset, method=stage, metric=paired.metric, finding=str(finding),
                                 row=label, setting=setting, better_is=better.get(paired.metric, "higher"))
                    frames.append(pd.DataFrame(records))
                    if records[0]["n_clusters"] < MIN_CLUSTERS:
                        n = records[0]["n_clusters"]
                        notes.append(f"{stage} {paired.metric}, {finding} {label}: no interval or p-value: the items "
                                     f"come from {n} cluster{'s' if n != 1 else ''} (patients, slides or volumes; at "
                                     f"least {MIN_CLUSTERS} are needed)")
    if not frames:
        return Comparisons(notes=notes)
    pairs = pd.concat(frames, ignore_index=True)
    family = ["dataset", "setting", "method", "metric", "finding", "row"]
    pairs["p_holm"] = pairs.groupby(family, sort=False)["p"].transform(lambda p: holm_adjust(p.to_numpy()))
    sign = np.where(pairs["better_is"] == "lower", -1.0, 1.0)
    significant = pairs["p_holm"] <= ALPHA
    pairs["better"] = np.where(significant & (sign * pairs["difference"] > 0), pairs["encoder_a"],
                               np.where(significant & (sign * pairs["difference"] < 0), pairs["encoder_b"], ""))
    ranking = rank(pairs)
    pairs = pairs[COLUMNS]
    return Comparisons(pairs, ranking, overall(ranking), notes)


def rank(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per (setting, metric, finding, row): the encoders ordered by their estimate (1 the best; equal
    estimates share the lower rank), the best encoder, each one's gap to it with the paired interval and
    Holm-adjusted p, and the best set: the best and every encoder not significantly worse than it
    (p_holm > :data:`ALPHA`, or no p-value)."""
    if pairs.empty:
        return pd.DataFrame(columns=RANK_COLUMNS)
    family = ["dataset", "setting", "method", "metric", "finding", "row"]
    out = []
    for keys, part in pairs.groupby(family, sort=False):
        lower = part["better_is"].iloc[0] == "lower"
        est = pd.concat([part.set_index("encoder_a")["estimate_a"], part.set_index("encoder_b")["estimate_b"]])
        est = est[~est.index.duplicated()]
        ordered = est.sort_values(ascending=lower, kind="stable")
        ordered = ordered[ordered.notna()]
        if ordered.empty:
            continue
        best = ordered.index[0]
        ranks = (ordered if lower else -ordered).rank(method="min").astype(int)
        for enc, value in ordered.items():
            row = dict(zip(family, keys), encoder=enc, estimate=float(value), rank=int(ranks[enc]), best=best,
                       better_is=part["better_is"].iloc[0])
            if enc == best:
                row.update(gap=0.0, gap_ci_low=0.0, gap_ci_high=0.0, p_holm=np.nan, in_best_set=True)
            else:
                pair = part[((part["encoder_a"] == enc) & (part["encoder_b"] == best))
                            | ((part["encoder_a"] == best) & (part["encoder_b"] == enc))].iloc[0]
                flip = 1.0 if pair["encoder_a"] == enc else -1.0  # gap: this encoder minus the best
                lo, hi = sorted((flip * pair["ci_low"], flip * pair["ci_high"]))
                row.update(gap=flip * pair["difference"], gap_ci_low=lo, gap_ci_high=hi, p_holm=pair["p_holm"],
                           in_best_set=not (pair["p_holm"] <= ALPHA))
            out.append(row)
    return pd.DataFrame(out, columns=RANK_COLUMNS)


def headline_rows(ranking: pd.DataFrame) -> pd.DataFrame:
    """The rows that stand for a whole finding: its pooled rows where it has any (CANDOR's
    ``__pooled__`` over matched groups, and a one-vs-rest ``__mean__``), else all its rows (e.g. each
    SPAR configuration)."""
    if ranking.empty:
        return ranking
    pooled = ranking["row"].astype(str).str.split(" / ").map(lambda p: POOLED in p)
    key = ranking[["dataset", "setting", "method", "metric", "finding"]].astype(str).agg("\x1f".join, axis=1)
    return ranking[pooled | ~key.isin(key[pooled])]


def _first_metric(ranking: pd.DataFrame) -> pd.DataFrame:
    """Per (dataset, setting, method, finding): the rows of the method's first headline metric that was
    compared there (else the first compared metric)."""
    if ranking.empty:
        return ranking
    keep = np.zeros(len(ranking), bool)
    for (_, _, stage, _), part in ranking.groupby(["dataset", "setting", "method", "finding"], sort=False):
        method = methods.find(stage)
        order = [m.name for m in method.headline] if method is not None else []
        metric = min(part["metric"].unique(), key=lambda m: order.index(m) if m in order else len(order))
        keep[ranking.index.get_indexer(part.index[part["metric"] == metric])] = True
    return ranking[keep]


def overall(ranking: pd.DataFrame) -> pd.DataFrame:
    """Each encoder's mean rank over the findings (their headline rows, :func:`headline_rows`) of each
    (method, metric), and the number of findings whose best set holds it."""
    rows = headline_rows(ranking)
    if rows.empty:
        return pd.DataFrame(columns=OVERALL_COLUMNS)
    out = rows.groupby(["method", "metric", "encoder"], sort=True).agg(
        mean_rank=("rank", "mean"), n_findings=("rank", "size"), n_best=("in_best_set", "sum")).reset_index()
    out["n_best"] = out["n_best"].astype(int)
    return out.sort_values(["method", "metric", "mean_rank", "encoder"], kind="stable")[OVERALL_COLUMNS]


def _fmt(x: float) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.3f}"


def _p(p: float) -> str:
    return "n/a" if not np.isfinite(p) else ("< 0.001" if p < 0.001 else f"= {p:.3f}")


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def verdict(comparisons: Comparisons) -> list[str]:
    """One plain sentence per finding (and headline row) on the method's first compared headline
    metric: the best set, and the gap to the nearest encoder outside it (or to the runner-up) with its
    paired interval and Holm-adjusted p."""
    ranking = _first_metric(headline_rows(comparisons.ranking))
    if ranking.empty:
        return []
    lines = []
    n_datasets = ranking["dataset"].nunique()
    n_rows = ranking.groupby(["dataset", "setting", "method", "metric", "finding"])["row"].nunique()
    for (dataset, setting, stage, metric, finding, row), rows in ranking.groupby(
            ["dataset", "setting", "method", "metric", "finding", "row"], sort=False):
        method = methods.find(stage)
        title = method.title if method is not None else stage
        rows = rows.sort_values("rank", kind="stable")
        best = rows[rows["in_best_set"]]["encoder"].tolist()
        rest = rows[~rows["in_best_set"]]
        parts = str(row).split(" / ")
        parts = ["mean over its classes" if p == "__mean__" else p for p in parts]
        shown = " / ".join(p for p in parts if p != POOLED) if POOLED in parts else \
            str(row) if n_rows[(dataset, setting, stage, metric, finding)] > 1 else ""  # a finding's only row
        where = f"{finding}" + (f" ({shown})" if shown else "") + (f" on {dataset}" if n_datasets > 1 else "")
        top = rows.iloc[0]
        text = (f"{where}, {title} {metric} ({top['better_is']} is better): "
                + (f"{best[0]} is best alone ({_fmt(top['estimate'])})" if len(best) == 1 else
                   f"{_names(best)} are indistinguishable (best {top['encoder']} {_fmt(top['estimate'])})"))
        if not rest.empty:
            nxt = rest.iloc[0]
            worse = rest["encoder"].tolist()
            # by how much it falls short of the best, positive whichever way is better
            flip = 1.0 if top["better_is"] == "lower" else -1.0
            lo, hi = sorted((flip * nxt["gap_ci_low"], flip * nxt["gap_ci_high"]))
            text += (f"; {_names(worse)} {'is' if len(worse) == 1 else 'are'} worse: {nxt['encoder']} by "
                     f"{_fmt(flip * nxt['gap'])} (95% CI {_fmt(lo)} to {_fmt(hi)}, Holm p {_p(nxt['p_holm'])})")
        elif len(rows) > 1:
            nxt = rows.iloc[1]
            text += (f"; the gap to {nxt['encoder']} is {_fmt(nxt['gap'])} (95% CI {_fmt(nxt['gap_ci_low'])} "
                     f"to {_fmt(nxt['gap_ci_high'])}, Holm p {_p(nxt['p_holm'])})")
        lines.append(text + ".")
    return lines


def write(folder: str | Path, comparisons: Comparisons) -> list[Path]:
    """``comparisons.csv``, ``ranking.csv`` and ``ranking_overall.csv`` in ``folder`` (nothing when no
    two encoders were compared: stale files of an earlier rebuild are removed)."""
    folder = Path(folder)
    frames = (comparisons.pairs, comparisons.ranking, comparisons.overall)
    out = []
    if comparisons.notes and not comparisons.empty:
        write_text_atomic(folder / NOTES, "".join(f"{line}\n" for line in comparisons.notes))
    else:
        (folder / NOTES).unlink(missing_ok=True)
    for name, frame in zip(FILES, frames):
        path = folder / name
        if comparisons.empty:
            path.unlink(missing_ok=True)
            continue
        write_text_atomic(path, frame.to_csv(index=False))  # full precision: read() gives the same numbers
        out.append(path)
    return out


def read(folder: str | Path) -> Comparisons:
    """The comparisons :func:`write` saved in ``folder`` (empty when there are none)."""
    folder = Path(folder)
    if not (folder / FILES[0]).exists():
        return Comparisons()
    pairs, ranking, overall_ = (pd.read_csv(folder / f, keep_default_na=False, na_values=[""]) for f in FILES)
    for frame in (pairs, ranking, overall_):
        for col in ("finding", "row", "better"):
            if col in frame.columns:
                frame[col] = frame[col].fillna("").astype(str)
    if "in_best_set" in ranking.columns:
        ranking["in_best_set"] = ranking["in_best_set"].astype(str).str.lower() == "true"
    notes = (folder / NOTES).read_text().splitlines() if (folder / NOTES).exists() else []
    return Comparisons(pairs, ranking, overall_, notes)


def build(folder: str | Path, n_boot: int = N_BOOT, seed: int = SEED) -> Comparisons:
    """:func:`compare` the finished results under ``folder`` (a run or a sweep) and :func:`write` them."""
    comparisons = compare(SweepResults(folder), n_boot, seed)
    write(folder, comparisons)
    return comparisons


#: at most this many heat maps in a report (the headline metric of each finding first)
MAX_HEATMAPS = 6


def heatmap_figure(pairs: pd.DataFrame, ranking: pd.DataFrame, title: str):
    """The pairwise differences of one (metric, finding, row): cell (i, j) is encoder i minus encoder j,
    encoders in rank order, the colour signed so that green means the row's encoder is better; a cell
    whose Holm-adjusted p is at most :data:`ALPHA` is marked ``*`` and outlined."""
    order = ranking.sort_values(["rank", "encoder"], kind="stable")["encoder"].tolist()
    lower = pairs["better_is"].iloc[0] == "lower"
    n = len(order)
    diff, star = np.full((n, n), np.nan), np.zeros((n, n), bool)
    for _, p in pairs.iterrows():
        i, j = order.index(p["encoder_a"]), order.index(p["encoder_b"])
        diff[i, j], diff[j, i] = p["difference"], -p["difference"]
        star[i, j] = star[j, i] = p["p_holm"] <= ALPHA
    good = -diff if lower else diff  # > 0: the row's encoder is better
    scale = np.nanmax(np.abs(diff)) if np.isfinite(diff).any() else 1.0
    fig = Figure(figsize=(3.2 + 1.0 * n, 2.4 + 0.75 * n))  # no pyplot: no global figure state
    ax = fig.add_subplot()
    ax.imshow(good, cmap="RdYlGn", vmin=-scale or -1, vmax=scale or 1)
    for i in range(n):
        for j in range(n):
            if i != j and np.isfinite(diff[i, j]):
                ax.text(j, i, f"{diff[i, j]:+.3f}{'*' if star[i, j] else ''}", ha="center", va="center", fontsize=7,
                        fontweight="bold" if star[i, j] else "normal")
    ax.set_xticks(range(n), order, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(n), order, fontsize=8)
    ax.set_xlabel("minus this encoder")
    ax.set_title(title + "\n(row − column; green: the row's encoder is better; * Holm p ≤ 0.05)", fontsize=9)
    fig.tight_layout()
    return fig


def heatmaps(comparisons: Comparisons, folder: Path) -> list[tuple[str, Path]]:
    """Heat maps of the pairwise differences on each finding's headline row and the method's first
    compared headline metric (at most :data:`MAX_HEATMAPS`), written as ``figure_which_<n>.png`` /
    ``.pdf`` in ``folder``; returns (caption, PNG)."""
    ranking = _first_metric(headline_rows(comparisons.ranking))
    if ranking.empty or len(ranking["encoder"].unique()) < 2:
        return []
    pairs = comparisons.pairs
    out = []
    keys = ["dataset", "setting", "method", "metric", "finding", "row"]
    for key, part in ranking.groupby(keys, sort=False):
        method = methods.find(key[2])
        sel = np.logical_and.reduce([pairs[c].astype(str) == str(v) for c, v in zip(keys, key)])
        unit = pairs[sel]
        title = f"{method.title if method else key[2]} {key[3]}: {key[4]}" + \
            (f" ({key[5].replace(POOLED, 'pooled').replace('__mean__', 'mean')})" if key[5] and key[5] != POOLED
             else "")
        fig = heatmap_figure(unit, part, title)
        png = save_figure(fig, folder / f"figure_which_{len(out) + 1}")[0]
        out.append((f"which encoder {len(out) + 1}: paired differences, {title}", png))
        if len(out) == MAX_HEATMAPS:
            break
    return out


def first_metric_rows(comparisons: Comparisons) -> pd.DataFrame:
    """The ranking's headline rows (:func:`headline_rows`) on each finding's first compared headline
    metric, as a report shows them: encoder, estimate, rank, whether it is in the best set and its gap to
    the best with the paired interval and Holm-adjusted p."""
    rows = _first_metric(headline_rows(comparisons.ranking))
    if rows.empty:
        return rows
    show = rows.assign(best_set=np.where(rows["in_best_set"].astype(bool), "yes", ""),
                       row=rows["row"].astype(str).str.replace(POOLED, "pooled", regex=False)
                       .str.replace("__mean__", "mean", regex=False))
    columns = ["method", "metric", "finding", "row", "encoder", "estimate", "rank", "best_set", "gap", "gap_ci_low",
               "gap_ci_high", "p_holm"]
    if show["dataset"].nunique() > 1:
        columns.insert(0, "dataset")
    return show[columns].reset_index(drop=True)
