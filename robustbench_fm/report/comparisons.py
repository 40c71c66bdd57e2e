"""Which encoder: paired comparisons between encoders, simultaneous intervals, rank intervals and the
verdict a report opens with (issues 46 and 58; docs/comparisons.md).

Every stage whose :class:`~robustbench_fm.methods.Method` declares a
:class:`~robustbench_fm.methods.Pairing` saves a per-item table (CANDOR: its queries and the margin's
scored images; heads: the test rows; CRoMa: the anchors) in each result folder. :func:`compare` rebuilds
each compared metric from the items of every encoder of a setting (one dataset, stage and stage
parameters) with :func:`robustbench_fm.core.stats.paired_bootstrap`, which evaluates all of them on the
same cluster resamples (patients, slides, volumes). A *family* is one (setting, metric, finding, row):
all pairs of the encoders scored there on the same items. Each family is tested at once with the
single-step studentized max-T bootstrap (:func:`robustbench_fm.core.stats.max_t_family`): per pair the
difference, its unadjusted 95% percentile interval and bootstrap p (``ci_low``, ``ci_high``, ``p``), the
simultaneous 95% interval (``sim_low``, ``sim_high``) and the family-wise adjusted p (``p_adj``); ``better``
names the better encoder where ``p_adj`` ≤ :data:`ALPHA`, which is exactly where the simultaneous
interval excludes 0. An estimate that does not equal the stage's own summary value is not compared
(``notes``): what is compared is what the tables show. A metric is compared only if its direction is
declared (:class:`~robustbench_fm.methods.Paired` ``better`` or the headline :class:`Metric`) and it is
not declared ``not_compared``; an encoder scored on other items than the family's (an image its job
skipped) keeps its own estimate in the ranking and is not compared (its ``note`` says so).

:func:`rank` orders the encoders of each family by their own estimate, gives each its simultaneous 95%
rank interval (``rank_low``, ``rank_high``: 1 + the encoders significantly better than it, and E − the
encoders significantly worse; :func:`robustbench_fm.core.stats.rank_intervals`) and marks the *best
set*: the encoders no other encoder is significantly better than (``rank_low`` = 1). :func:`overall` is
the mean rank of each encoder over the findings of a sweep and the number of findings whose best set
holds it. :func:`verdict` writes one sentence per finding; :func:`write` saves ``comparisons.csv``,
``ranking.csv`` and ``ranking_overall.csv`` into a run or sweep folder (``python -m robustbench_fm rank
<folder>`` rebuilds them from finished results); :func:`compare_tables` compares in-memory tables
(e.g. the ``items`` of :func:`robustbench_fm.evaluate` for several encoders).
"""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from omegaconf import OmegaConf

from .. import methods
from ..core.atomic import write_text_atomic
from ..core.stats import FAMILY_ALPHA, MIN_CLUSTERS, max_t_family, paired_bootstrap, rank_intervals
from ..core.tables import SweepResults
from ..paper.figures import save_figure

#: the family-wise error rate of a comparison family (max-T), and the best set's threshold
ALPHA = FAMILY_ALPHA
#: bootstrap resamples of a comparison (candor.md "Reporting": 1,000)
N_BOOT = 1000
SEED = 42
COLUMNS = ["dataset", "method", "metric", "finding", "row", "encoder_a", "encoder_b", "estimate_a", "estimate_b",
           "difference", "ci_low", "ci_high", "p", "sim_low", "sim_high", "p_adj", "n_items", "n_clusters", "better",
           "better_is", "setting"]
RANK_COLUMNS = ["dataset", "method", "metric", "finding", "row", "encoder", "estimate", "rank", "rank_low",
                "rank_high", "in_best_set", "best", "gap", "gap_low", "gap_high", "p_adj", "n_items", "n_clusters",
                "better_is", "note", "setting"]
OVERALL_COLUMNS = ["method", "metric", "encoder", "mean_rank", "n_findings", "n_best"]
FILES = ("comparisons.csv", "ranking.csv", "ranking_overall.csv")
#: what could not be compared, one line each (beside the CSVs, where there is any)
NOTES = "comparisons_notes.txt"
POOLED = "__pooled__"
#: the tolerance of the check that an estimate is the stage's own summary value
SAME = 1e-9
FAMILY = ["dataset", "setting", "method", "metric", "finding", "row"]


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


def _item_sets(by_enc: dict, encoders: list[str]) -> tuple[list[str], pd.Index | None]:
    """The encoders a family compares: those scored on the same items as most encoders (ties: the larger
    item set, then the first), and that item set."""
    groups: dict = {}
    for e in encoders:
        groups.setdefault(tuple(sorted(by_enc[e].index.tolist())), []).append(e)
    if not groups:
        return [], None
    items, names = max(groups.items(), key=lambda kv: (len(kv[1]), len(kv[0])))
    return names, by_enc[names[0]].index


def _compare_unit(unit: pd.DataFrame, paired, pairing, strata_cols: tuple[str, ...], outer: str,
                  encoders: list[str], seed, n_boot: int) -> tuple[dict, list[dict], dict, int]:
    """One family (metric, row): every encoder's own estimate (on all of its own items: what its summary
    shows), one record per pair of the encoders scored on the family's items (:func:`_item_sets`) with
    the max-T columns, a note for each encoder that is not compared, and the number of clusters."""
    if paired.value not in unit.columns or unit[paired.value].isna().all():  # not this metric's row
        return {}, [], {}, 0
    key = [*strata_cols, pairing.item]
    by_enc = {e: part.drop_duplicates(key).set_index(key) for e, part in unit.groupby("encoder", sort=True)}
    encoders = [e for e in encoders if e in by_enc and len(by_enc[e].index)]
    if len(encoders) < 2:  # a row only one encoder has (e.g. SPAR's finetuned rows of one backbone)
        return {}, [], {}, 0

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
        bank = [np.stack([by_enc[e].loc[index, f"{paired.bank}_{h}"].to_numpy(float) for e in names])
                for h in (0, 1)] if paired.bank else None
        est, reps = paired_bootstrap(paired.kind, values, clusters, n_boot, seed, other=other, strata=strata,
                                     weights=weights, bank=bank)
        return est, reps, int(len(np.unique(clusters)))

    compared, index = _item_sets(by_enc, encoders)
    est, reps, n_clusters = boot(compared, index) if len(compared) >= 2 else (None, None, 0)
    estimates = dict(zip(compared, est)) if est is not None else {}
    for e in encoders:  # each encoder's own estimate, on all of its own items
        if e not in estimates:
            estimates[e] = boot([e], by_enc[e].index, 0)[0][0]
    notes = {}
    for e in encoders:
        if e in compared and len(compared) >= 2:
            continue
        own = by_enc[e].index
        missing, extra = len(index.difference(own)), len(own.difference(index))
        notes[e] = (f"not compared: scored on other items than {_names(compared)} ({missing} of their {len(index)} "
                    f"items missing, {extra} others), so the banks and items differ" if compared and e not in compared
                    else "not compared: no other encoder was scored on the same items")
    if len(compared) < 2:
        return estimates, [], notes, 0
    fam = max_t_family(est, reps, n_clusters, ALPHA)
    n_items = int(by_enc[compared[0]].loc[index, paired.value].notna().sum())  # the metric's items (queries)
    records = []
    for j, (ia, ib) in enumerate(fam["pairs"]):
        records.append(dict(encoder_a=compared[ia], encoder_b=compared[ib], estimate_a=float(est[ia]),
                            estimate_b=float(est[ib]), difference=float(fam["difference"][j]),
                            ci_low=fam["ci_low"][j], ci_high=fam["ci_high"][j], p=fam["p"][j],
                            sim_low=fam["sim_low"][j], sim_high=fam["sim_high"][j], p_adj=fam["p_adj"][j],
                            n_items=n_items, n_clusters=n_clusters))
    return estimates, records, notes, n_clusters


def _direction(method, paired) -> str:
    """Which way ``paired`` is better: its own declaration, else the method's headline metric of that
    name ("" where neither declares it)."""
    if paired.better:
        return paired.better
    return next((m.better for m in method.headline if m.name == paired.metric), "")


def compare_tables(stage: str, items: pd.DataFrame, summaries: pd.DataFrame | None = None, n_boot: int = N_BOOT,
                   seed: int = SEED) -> Comparisons:
    """:func:`compare` on in-memory tables: ``items``, the per-item tables (``Pairing.table``) of every
    encoder of one stage with a column ``encoder`` (and ``dataset``, ``setting`` where there are
    several), ``summaries`` their summaries likewise (optional: each estimate is checked against them)."""
    items = items.copy()
    for col in ("dataset", "setting"):
        if col not in items.columns:
            items[col] = ""
    if summaries is not None and "dataset" not in summaries.columns:
        summaries = summaries.assign(dataset="")
    pairs, own, notes = _compare_stage(stage, items, summaries if summaries is not None else pd.DataFrame(),
                                       n_boot, seed)
    return _finish(pairs, own, notes)


def _compare_stage(stage: str, items: pd.DataFrame, summaries: pd.DataFrame, n_boot: int, seed: int,
                   settings_of=None) -> tuple[list[pd.DataFrame], list[dict], list[str]]:
    """The pair records, each encoder's own estimate per family, and the notes, of one stage's items
    (with ``dataset`` and ``setting`` columns); ``settings_of(jobs)`` the settings of summary rows."""
    method = methods.find(stage)
    pairing = method.pairing if method is not None else None
    frames, own, notes = [], [], []
    if pairing is None or items.empty or items["encoder"].nunique() < 2:
        return frames, own, notes
    compared = []
    for paired in pairing.metrics:
        if paired.not_compared:
            notes.append(f"{stage} {paired.metric}: not compared: {paired.not_compared}")
        elif not _direction(method, paired):
            notes.append(f"{stage} {paired.metric}: not compared: its Paired declaration gives no direction; add "
                         f"better='higher' or better='lower' (methods.Paired)")
        else:
            compared.append(paired)
    for paired in [m for m in compared if m.bank and not {f"{m.bank}_0", f"{m.bank}_1"} <= set(items.columns)]:
        compared.remove(paired)  # items saved before the banks' influence was (a results folder of an older version)
        notes.append(f"{stage} {paired.metric}: not compared: the items have no {paired.bank}_0 / {paired.bank}_1 "
                     f"columns (the banks' role, docs/comparisons.md); run the stage again to compare it")
    for (dataset, setting), part in items.groupby(["dataset", "setting"], sort=True):
        encoders = sorted(part["encoder"].unique())
        if len(encoders) < 2:
            continue
        summ = summaries[(summaries["dataset"] == dataset)] if len(summaries) else summaries
        if len(summ) and "job" in summ.columns and settings_of is not None:
            summ = summ[[s == setting for s in settings_of(summ["job"])]]
        for paired in compared:
            better_is = _direction(method, paired)
            where = _where(part, paired.where)
            if paired.bank:  # every item of a row: a bank member that is no query still carries its cluster's share
                chosen = part.assign(**{paired.value: part[paired.value].where(where)})
            else:
                chosen = part[where]
            for keys, unit, strata_cols, outer in _units(chosen, pairing):
                finding = keys.get("finding", "")
                unit_seed = zlib.crc32(json.dumps([dataset, stage, paired.metric, keys], default=str).encode())
                estimates, records, uncompared, n_clusters = _compare_unit(
                    unit, paired, pairing, strata_cols, outer, encoders, (seed, unit_seed), n_boot)
                if not estimates:
                    continue
                off = [e for e, v in estimates.items()
                       if (s := _summary_value(summ, e, keys, paired.metric)) is not None
                       and not (np.isnan(s) and np.isnan(v)) and not abs(s - v) <= SAME * max(1, abs(s))]
                label = _row_label(keys, finding)
                if off:
                    notes.append(f"{stage} {paired.metric}, {finding} {label}: not compared; the items do not "
                                 f"give the summary's value for {', '.join(off)}")
                    continue
                base = dict(dataset=dataset, setting=setting, method=stage, metric=paired.metric,
                            finding=str(finding), row=label, better_is=better_is)
                n_items = records[0]["n_items"] if records else 0
                for e, v in estimates.items():
                    own.append(dict(base, encoder=e, estimate=float(v), note=uncompared.get(e, ""),
                                    n_items=n_items if e not in uncompared else
                                    int(unit.loc[unit["encoder"] == e, paired.value].notna().sum()),
                                    n_clusters=n_clusters, unit=pairing.unit))
                for e, why in uncompared.items():
                    notes.append(f"{stage} {paired.metric}, {finding} {label}: {e} {why}")
                if not records:
                    continue
                frame = pd.DataFrame(records)
                for col, value in base.items():
                    frame[col] = value
                sign = -1.0 if better_is == "lower" else 1.0
                significant = frame["p_adj"] <= ALPHA
                frame["better"] = np.where(significant & (sign * frame["difference"] > 0), frame["encoder_a"],
                                           np.where(significant & (sign * frame["difference"] < 0),
                                                    frame["encoder_b"], ""))
                frames.append(frame)
                if n_clusters < MIN_CLUSTERS:
                    notes.append(f"{stage} {paired.metric}, {finding} {label}: no interval or p-value: the items "
                                 f"come from {n_clusters} cluster{'s' if n_clusters != 1 else ''} ({pairing.unit}; "
                                 f"at least {MIN_CLUSTERS} are needed)")
    return frames, own, notes


def _finish(frames: list[pd.DataFrame], own: list[dict], notes: list[str]) -> Comparisons:
    if not frames:
        return Comparisons(notes=notes)
    pairs = pd.concat(frames, ignore_index=True)[COLUMNS]
    ranking = rank(pairs, pd.DataFrame(own))
    return Comparisons(pairs, ranking, overall(ranking), notes)


def compare(results: SweepResults, n_boot: int = N_BOOT, seed: int = SEED) -> Comparisons:
    """Paired comparisons of the encoders scored on the same items, for every stage that declares a
    :class:`~robustbench_fm.methods.Pairing` (module doc)."""
    frames, own, notes, settings = [], [], [], {}
    for stage in sorted({f.parts[-2] for d in results.job_dirs for f in (d / "results").glob("*/*/*/*")}):
        method = methods.find(stage)
        if method is None or method.pairing is None:
            continue
        items = results._read(stage, f"{method.pairing.table}.parquet")
        if items.empty or items["encoder"].nunique() < 2:
            continue
        items["setting"] = [_setting(results, j, settings) for j in items["job"]]
        f, o, n = _compare_stage(stage, items, results.summaries(stage), n_boot, seed,
                                 lambda jobs: [_setting(results, j, settings) for j in jobs])
        frames += f
        own += o
        notes += n
    return _finish(frames, own, notes)


def rank(pairs: pd.DataFrame, own: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per family (setting, metric, finding, row): the encoders ordered by their own estimate (``own``:
    one row per family and encoder with ``estimate``, ``note``, ``n_items``, ``n_clusters``; without it,
    the pairs' estimates), 1 the best and equal estimates sharing the lower rank; each compared encoder's
    simultaneous rank interval (``rank_low``, ``rank_high``) from the family's decisions (``better``);
    the best encoder (the first compared one); each one's ``gap``: how far it falls short of the best
    (positive = worse, whichever way the metric is better) with the simultaneous interval of that
    shortfall (``gap_low``, ``gap_high``) and the pair's ``p_adj``; and the best set: the encoders no
    encoder is significantly better than (``rank_low`` = 1). An encoder that was not compared keeps its
    rank by estimate, no interval and its ``note``."""
    if pairs.empty:
        return pd.DataFrame(columns=RANK_COLUMNS)
    if own is None or own.empty:
        est = pd.concat([pairs.rename(columns={"encoder_a": "encoder", "estimate_a": "estimate"}),
                         pairs.rename(columns={"encoder_b": "encoder", "estimate_b": "estimate"})])
        own = est.drop_duplicates([*FAMILY, "encoder"])[[*FAMILY, "encoder", "estimate", "better_is", "n_items",
                                                         "n_clusters"]].assign(note="")
    out = []
    by_family = {k: g for k, g in own.groupby(FAMILY, sort=False)}
    for keys, part in pairs.groupby(FAMILY, sort=False):
        lower = part["better_is"].iloc[0] == "lower"
        rows = by_family[keys] if keys in by_family else own.iloc[:0]
        rows = rows[np.isfinite(rows["estimate"].astype(float))]
        ordered = rows.sort_values("estimate", ascending=lower, kind="stable")
        if ordered.empty:
            continue
        names = sorted(set(part["encoder_a"]) | set(part["encoder_b"]))
        at = {e: i for i, e in enumerate(names)}
        better = [at[w] if w else -1 for w in part["better"]]
        low, high = rank_intervals(len(names), [(at[a], at[b]) for a, b in zip(part["encoder_a"], part["encoder_b"])],
                                   better)
        ranks = (ordered["estimate"] if lower else -ordered["estimate"]).rank(method="min").astype(int)
        best = next(e for e in ordered["encoder"] if e in at)
        best_est = float(ordered.set_index("encoder").loc[best, "estimate"])
        flip = 1.0 if lower else -1.0  # shortfall = flip · (encoder − best)
        n_clusters = int(part["n_clusters"].iloc[0])

        def interval(enc: str) -> dict:
            return dict(rank_low=int(low[at[enc]]), rank_high=int(high[at[enc]]), in_best_set=bool(low[at[enc]] == 1))

        for (_, r), rk in zip(ordered.iterrows(), ranks):
            row = dict(zip(FAMILY, keys), encoder=r["encoder"], estimate=float(r["estimate"]), rank=int(rk),
                       best=best, better_is=part["better_is"].iloc[0], note=r.get("note", "") or "",
                       n_items=r.get("n_items", np.nan), n_clusters=n_clusters)
            enc = r["encoder"]
            if enc not in at:
                row.update(rank_low=np.nan, rank_high=np.nan, in_best_set=False,
                           gap=flip * (row["estimate"] - best_est), gap_low=np.nan, gap_high=np.nan, p_adj=np.nan)
            elif enc == best:
                row.update(interval(enc), gap=0.0, gap_low=0.0, gap_high=0.0, p_adj=np.nan)
            else:
                pair = part[((part["encoder_a"] == enc) & (part["encoder_b"] == best))
                            | ((part["encoder_a"] == best) & (part["encoder_b"] == enc))].iloc[0]
                sgn = flip * (1.0 if pair["encoder_a"] == enc else -1.0)  # shortfall = sgn · (a − b)
                lo, hi = sorted((sgn * pair["sim_low"] + 0.0, sgn * pair["sim_high"] + 0.0))  # no -0.0
                row.update(interval(enc), gap=sgn * pair["difference"] + 0.0, gap_low=lo, gap_high=hi,
                           p_adj=pair["p_adj"])
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


def _shortfall(pairs: pd.DataFrame, enc: str, against: str, lower: bool) -> tuple[float, float, float, float]:
    """How far ``enc`` falls short of ``against`` (positive = worse) with the simultaneous interval of
    that shortfall and the pair's adjusted p."""
    pair = pairs[((pairs["encoder_a"] == enc) & (pairs["encoder_b"] == against))
                 | ((pairs["encoder_a"] == against) & (pairs["encoder_b"] == enc))].iloc[0]
    sgn = (1.0 if lower else -1.0) * (1.0 if pair["encoder_a"] == enc else -1.0)
    lo, hi = sorted((sgn * pair["sim_low"] + 0.0, sgn * pair["sim_high"] + 0.0))  # + 0.0: no -0.000
    return sgn * pair["difference"] + 0.0, lo, hi, pair["p_adj"]


def _unit_word(stage: str) -> str:
    method = methods.find(stage)
    return method.pairing.unit if method is not None and method.pairing is not None else "clusters"


def verdict(comparisons: Comparisons) -> list[str]:
    """One plain sentence per finding (and headline row) on the method's first compared headline
    metric: the best set (the encoders no encoder is significantly better than), and by how much the
    nearest encoder outside it falls short, with the simultaneous 95% interval of that shortfall and the
    family-wise adjusted p (or the gap to the runner-up); too few clusters, an encoder ranked above one
    of the best set yet outside it, and encoders scored on other items are said in words."""
    ranking = _first_metric(headline_rows(comparisons.ranking))
    if ranking.empty:
        return []
    pairs = comparisons.pairs
    lines = []
    n_datasets = ranking["dataset"].nunique()
    n_rows = ranking.groupby(["dataset", "setting", "method", "metric", "finding"])["row"].nunique()
    for keys, rows in ranking.groupby(FAMILY, sort=False):
        dataset, setting, stage, metric, finding, row = keys
        method = methods.find(stage)
        title = method.title if method is not None else stage
        rows = rows.sort_values(["rank", "encoder"], kind="stable")
        lower = rows["better_is"].iloc[0] == "lower"
        fam = pairs[np.logical_and.reduce([pairs[c].astype(str) == str(v) for c, v in zip(FAMILY, keys)])]
        compared = rows[rows["rank_low"].notna()]
        parts = str(row).split(" / ")
        parts = ["mean over its classes" if p == "__mean__" else p for p in parts]
        shown = " / ".join(p for p in parts if p != POOLED) if POOLED in parts else \
            str(row) if n_rows[(dataset, setting, stage, metric, finding)] > 1 else ""  # a finding's only row
        where = f"{finding}" + (f" ({shown})" if shown else "") + (f" on {dataset}" if n_datasets > 1 else "")
        text = f"{where}, {title} {metric} ({rows['better_is'].iloc[0]} is better): "
        n_clusters = int(rows["n_clusters"].iloc[0]) if len(rows) else 0
        if n_clusters < MIN_CLUSTERS:
            text += (f"too few {_unit_word(stage)} to compare ({n_clusters}; at least {MIN_CLUSTERS} are needed); "
                     + ", ".join(f"{r['encoder']} {_fmt(r['estimate'])}" for _, r in compared.iterrows()))
        else:
            best = compared[compared["in_best_set"].astype(bool)]
            rest = compared[~compared["in_best_set"].astype(bool)]
            top = compared.iloc[0]
            text += (f"{best['encoder'].iloc[0]} is best alone ({_fmt(best['estimate'].iloc[0])})" if len(best) == 1
                     else f"{_names(best['encoder'].tolist())} are indistinguishable (best {top['encoder']} "
                          f"{_fmt(top['estimate'])})")
            if not rest.empty:
                nxt = rest.iloc[0]["encoder"]
                winners = fam[(fam["better"] != "") & ((fam["encoder_a"] == nxt) | (fam["encoder_b"] == nxt))
                              & (fam["better"] != nxt)]
                against = top["encoder"] if (winners["better"] == top["encoder"]).any() else \
                    winners.sort_values("p_adj", kind="stable")["better"].iloc[0]
                gap, lo, hi, p = _shortfall(fam, nxt, against, lower)
                worse = rest["encoder"].tolist()
                text += (f"; {_names(worse)} {'is' if len(worse) == 1 else 'are'} worse: {nxt} by {_fmt(gap)}"
                         + (f" against {against}" if against != top["encoder"] else "")
                         + f" (simultaneous 95% CI {_fmt(lo)} to {_fmt(hi)}, adjusted p {_p(p)})")
                above = rest[rest["rank"] < best["rank"].max()]["encoder"].tolist()
                if above:
                    below = best[best["rank"] > rest["rank"].min()]["encoder"].tolist()
                    text += (f"; {_names(below)} {'stays' if len(below) == 1 else 'stay'} in the best set though "
                             f"ranked below {_names(above)}: no encoder is significantly better than "
                             f"{'it' if len(below) == 1 else 'them'}, as {'its' if len(below) == 1 else 'their'} "
                             f"differences are measured less precisely")
            elif len(compared) > 1:
                nxt = compared.iloc[1]["encoder"]
                gap, lo, hi, p = _shortfall(fam, nxt, top["encoder"], lower)
                text += (f"; the gap to {nxt} is {_fmt(gap)} (simultaneous 95% CI {_fmt(lo)} to {_fmt(hi)}, "
                         f"adjusted p {_p(p)})")
        uncompared = rows[rows["rank_low"].isna()]["encoder"].tolist()
        if uncompared:
            text += (f"; {_names(uncompared)} {'was' if len(uncompared) == 1 else 'were'} not compared (scored on "
                     f"other items: {rows[rows['rank_low'].isna()]['estimate'].map(_fmt).str.cat(sep=', ')})")
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
        for col in ("finding", "row", "better", "note"):
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
    whose family-wise adjusted p is at most :data:`ALPHA` (its simultaneous interval excludes 0) is
    marked ``*``."""
    order = ranking.sort_values(["rank", "encoder"], kind="stable")["encoder"].tolist()
    lower = pairs["better_is"].iloc[0] == "lower"
    n = len(order)
    diff, star = np.full((n, n), np.nan), np.zeros((n, n), bool)
    for _, p in pairs.iterrows():
        i, j = order.index(p["encoder_a"]), order.index(p["encoder_b"])
        diff[i, j], diff[j, i] = p["difference"], -p["difference"]
        star[i, j] = star[j, i] = p["p_adj"] <= ALPHA
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
    ax.set_title(title + "\n(row − column; green: the row's encoder is better; * adjusted p ≤ 0.05)", fontsize=9)
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
    metric, as a report shows them: encoder, estimate, rank, its simultaneous 95% rank interval
    (``ranks``: "1–3"), whether it is in the best set, its shortfall from the best with the simultaneous
    interval and adjusted p, and the note of an encoder that was not compared."""
    rows = _first_metric(headline_rows(comparisons.ranking))
    if rows.empty:
        return rows

    def interval(r) -> str:
        if not np.isfinite(r["rank_low"]):
            return "n/a"
        lo, hi = int(r["rank_low"]), int(r["rank_high"])
        return f"{lo}" if lo == hi else f"{lo}–{hi}"

    show = rows.assign(best_set=np.where(rows["in_best_set"].astype(bool), "yes", ""),
                       ranks=rows.apply(interval, axis=1),
                       row=rows["row"].astype(str).str.replace(POOLED, "pooled", regex=False)
                       .str.replace("__mean__", "mean", regex=False))
    columns = ["method", "metric", "finding", "row", "encoder", "estimate", "rank", "ranks", "best_set", "gap",
               "gap_low", "gap_high", "p_adj"]
    if show["note"].fillna("").astype(str).str.len().gt(0).any():
        columns.append("note")
    if show["dataset"].nunique() > 1:
        columns.insert(0, "dataset")
    return show[columns].reset_index(drop=True)
