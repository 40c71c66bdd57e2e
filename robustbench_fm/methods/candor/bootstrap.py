"""CANDOR's intervals: the patient bootstrap of every summary row, the banks fixed (candor.md
"Reporting": "A ± value is the standard deviation over 1,000 bootstrap resamples clustered by
patient. An interval is the 95% interval of the same resamples").

:mod:`~robustbench_fm.methods.candor.stage` scores the groups and pools the rows; this module
resamples them. A row resamples the patients (``cluster_col``) of its own queries for D and D_all
and those of the images it scores for the margin AUROC, never every patient of the manifest; a
pooled row resamples those of all its groups (and tasks) jointly (:func:`row_intervals`). One
draw of resamples is taken per distinct set of patients, from a generator seeded by the set
(:func:`patient_set_rng`), and shared by the rows over that set (:class:`_Resampler`). The margin
AUROC is re-ranked in every resample (``auroc_bootstrap="exact"``) or resampled through its
placement-value expansion (``"linear"``), chunk by chunk of the draws (:func:`resampled_aurocs`);
a group row's own AUROC resamples are taken while the group's scoring is at hand
(:func:`group_aurocs`).

The scored groups reach it as *parts*: one dict per (task, matched group) scored, with ``task``,
``row`` (its summary row), ``queries``, ``disc`` (queries × [discordant, discordant_all]),
``images``, ``margin`` and ``labels`` (the images the margin AUROC scores).
"""
from __future__ import annotations

import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from ...core.devices import torch_threads
from ...core.stats import (
    MIN_CLUSTERS,
    ResampledRatio,
    cluster_draw_chunks,
    count_draws,
    few_clusters,
    resampled_sums,
    summarize_bootstrap,
)

#: the metrics of a row's replicates, in the order of their columns (resamples × [D, D_all, AUROC])
METRICS = ("d", "d_all", "margin_auroc")
#: cluster draws per chunk of the margin AUROC's bootstrap multiplicities (small enough for the counting to
#: stay in cache; at least 64 resamples a chunk)
BOOT_CHUNK = 262_144


def auroc_weights(parts: list[dict]) -> np.ndarray:
    """Each group's weight in the pooled margin AUROC: its number of queries (0 without an AUROC,
    e.g. a group with no negatives under ``unmatched``)."""
    return np.array([len(p["queries"]) * np.isfinite(p["row"]["margin_auroc"]) for p in parts], float)


def row_intervals(tasks, parts, pooled, combos, clusters, n_boot, seed, auroc_boot, cluster_col="patient_id") -> None:
    """± and 95% intervals of every row, the banks fixed (candor.md "Reporting": "A ± value is the
    standard deviation over 1,000 bootstrap resamples clustered by patient. An interval is the 95%
    interval of the same resamples").

    Each row resamples the patients of its own units, never every patient of the manifest: D and
    D_all the patients of its queries, the margin AUROC the patients of the images it scores (its
    "queries": every positive and negative of the group, "Baselines"). A group row draws from its
    group's patients; a task's pooled row from those of all its groups, jointly; a pool across
    tasks (``__chest__``, ``__mean__``) from those of all its tasks' groups, jointly. A resample
    draws as many patients as the set holds, uniformly with replacement, from a generator seeded by
    ``seed`` and the set itself (:func:`patient_set_rng`): rows over the same patients (e.g. the
    findings of a group labelled on the same images) share their resamples, which pairs them.

    A row over fewer than :data:`~robustbench_fm.core.stats.MIN_CLUSTERS` patients gets no ± and no
    interval (a bootstrap of one patient has width 0) and a ``note`` naming ``cluster_col`` and the fix."""
    if n_boot == 0 or not parts:
        return
    by_task = {i: [j for j, p in enumerate(parts) if p["task"] == i] for i in range(len(tasks))}
    # every row as {task: its parts}; a row's replicates are (resamples x [D, D_all, AUROC]) per task
    rows = [({p["task"]: [j]}, p["row"], None) for j, p in enumerate(parts)]
    rows += [({i: by_task[i]}, row, None) for i, row in pooled.items() if by_task[i]]
    rows += [({i: by_task[i] for i in members}, row, (members, weights)) for row, members, weights in combos if members]
    resampler = _Resampler(parts, clusters, n_boot, seed, auroc_boot)
    for tasks_parts, _, _ in rows:
        resampler.need(tasks_parts)
    resampler.run()
    for tasks_parts, row, pool in rows:
        reps = resampler.replicates(tasks_parts)
        (_, rate_patients), (_, auroc_patients) = resampler._keys(tasks_parts)
        few = len(rate_patients) < MIN_CLUSTERS, len(rate_patients) < MIN_CLUSTERS, len(auroc_patients) < MIN_CLUSTERS
        for task_reps in reps.values():  # (resamples x [D, D_all, AUROC]) per task
            task_reps[:, np.array(few)] = np.nan
        if any(few):
            row["note"] = few_clusters(min(len(rate_patients), len(auroc_patients)), cluster_col)
        if pool is None:
            [task_reps] = reps.values()
            _fill_intervals(row, task_reps)
            continue
        members, weights = pool
        stack = np.stack([reps[i] for i in members])  # (tasks, resamples, metrics)
        _fill_intervals(row, np.stack([np.tensordot(weights, stack[:, :, 0], 1) / weights.sum(),
                                       np.tensordot(weights, stack[:, :, 1], 1) / weights.sum(),
                                       stack[:, :, 2].mean(axis=0)], axis=1))


def _patient_set(*patients: np.ndarray) -> tuple[bytes, np.ndarray]:
    """The set of patients (sorted distinct cluster codes, int64) of the union of ``patients``, with its
    key: the one way :class:`_Resampler` and :func:`group_aurocs` name the sets they resample."""
    union = np.unique(np.concatenate(patients)).astype(np.int64) if patients else np.zeros(0, np.int64)
    return union.tobytes(), union


def patient_set_rng(seed: int, patients: np.ndarray) -> np.random.Generator:
    """The bootstrap generator of one set of patients (sorted cluster codes): seeded by ``seed`` and
    the set, so the resamples of a row do not depend on the other rows."""
    return np.random.default_rng([seed, zlib.crc32(np.ascontiguousarray(patients, np.int64).tobytes())])


class _Resampler:
    """The bootstrap of :func:`row_intervals`, one draw of resamples per distinct patient set.

    :meth:`need` registers a row ({task: its parts}); :meth:`run` resamples every patient set a row
    needs (its queries' patients for D and D_all, its scored images' patients for the AUROC) and
    evaluates what the rows over that set need: each task's summed discordance counts
    (:func:`~robustbench_fm.core.stats.resampled_sums` of the patients' totals) and each part's
    resampled AUROC (once per part and set, shared by the rows); :meth:`replicates` combines them
    into a row's (resamples × [D, D_all, AUROC]) per task."""

    def __init__(self, parts, clusters, n_boot, seed, auroc_boot):
        self.parts, self.n_boot, self.seed, self.auroc_boot = parts, n_boot, seed, auroc_boot
        self.patients = {(j, kind): np.unique(clusters[p[kind]]) for j, p in enumerate(parts)
                         for kind in ("queries", "images")}
        self.clusters = clusters
        self.rate_sets: dict[bytes, tuple[np.ndarray, set]] = {}   # set -> (patients, task groups of parts)
        self.auroc_sets: dict[bytes, tuple[np.ndarray, set]] = {}  # set -> (patients, parts)
        self.sums: dict[tuple, np.ndarray] = {}    # (set, parts) -> (resamples × [Σ disc, Σ disc_all, queries])
        self.aurocs: dict[tuple, np.ndarray] = {}  # (set, part) -> (resamples,)
        self.keys: dict[tuple, tuple] = {}  # row -> its two patient sets

    def _set(self, js, kind) -> tuple[bytes, np.ndarray]:
        return _patient_set(*(self.patients[(j, kind)] for j in js))

    def _scored(self, js) -> list[int]:
        """The parts of ``js`` that carry an AUROC (weight > 0 in the pooled AUROC)."""
        return [j for j, w in zip(js, auroc_weights([self.parts[j] for j in js])) if w]

    def _keys(self, tasks_parts) -> tuple[tuple, tuple]:
        row = tuple((i, tuple(group)) for i, group in tasks_parts.items())
        if row not in self.keys:
            js = [j for group in tasks_parts.values() for j in group]
            self.keys[row] = self._set(js, "queries"), self._set(self._scored(js), "images")
        return self.keys[row]

    def need(self, tasks_parts: dict[int, list[int]]) -> None:
        (rate_key, rate_patients), (auroc_key, auroc_patients) = self._keys(tasks_parts)
        self.rate_sets.setdefault(rate_key, (rate_patients, set()))[1].update(map(tuple, tasks_parts.values()))
        js = [j for group in tasks_parts.values() for j in group]
        self.auroc_sets.setdefault(auroc_key, (auroc_patients, set()))[1].update(self._scored(js))

    def run(self) -> None:
        """Every patient set's resamples on one pool of threads (numpy and torch free the GIL): the
        sets' discordance sums (:meth:`_rate_set`) and the AUROC estimators' construction run as tasks
        of their own; the AUROC's multiplicities are drawn here, chunk by chunk, while the pool
        evaluates the previous chunk's estimators. Each value is computed by the same ops whatever
        ran beside it, so the results do not depend on the threads."""
        threads = max(1, torch.get_num_threads())
        # the pool's threads are the parallelism: each torch op in them on one thread (a cumsum of 6,000 × 64 with
        # 2 intra-op threads took 17 ms instead of 2.5 ms on a loaded 2-core host; the sums are exact either way)
        with torch_threads(1), ThreadPoolExecutor(threads) as pool:
            rates = [pool.submit(self._rate_set, key, patients, sorted(groups))
                     for key, (patients, groups) in self.rate_sets.items()]
            for key, (patients, js) in self.auroc_sets.items():
                if js:
                    self._auroc_set(pool, threads, key, patients, sorted(js))
            for done in rates:
                done.result()

    def _rate_set(self, key: bytes, patients: np.ndarray, groups: list[tuple]) -> None:
        """Each task group's resampled (Σ disc, Σ disc_all, queries) over the patient set ``patients``."""
        totals = np.zeros((len(patients), 3 * len(groups)))  # per patient: Σ disc, Σ disc_all, queries
        for g, group in enumerate(groups):
            for j in group:
                part = self.parts[j]
                local = np.searchsorted(patients, self.clusters[part["queries"]])
                for c, values in enumerate((*part["disc"].T, np.ones(len(local)))):
                    totals[:, 3 * g + c] += np.bincount(local, weights=values, minlength=len(patients))
        out = resampled_sums(totals, self.n_boot, patient_set_rng(self.seed, patients))
        for g, group in enumerate(groups):
            self.sums[(key, group)] = out[:, 3 * g:3 * g + 3]

    def _auroc_set(self, pool: ThreadPoolExecutor, threads: int, key: bytes, patients: np.ndarray,
                   js: list[int]) -> None:
        """The resampled AUROC of each part ``js`` over the patient set ``patients``; a part's own set
        (its group row's) was resampled beside the other groups' scoring (:func:`group_aurocs`)."""
        todo = []
        for j in js:
            done = self.parts[j].get("aurocs", {}).get(key)
            if done is None:
                todo.append(j)
            else:
                self.aurocs[(key, j)] = done
        if todo:
            out = resampled_aurocs([self.parts[j] for j in todo], patients, self.clusters, self.n_boot, self.seed,
                                   self.auroc_boot, pool, threads)
            for c, j in enumerate(todo):
                self.aurocs[(key, j)] = out[:, c]

    def replicates(self, tasks_parts: dict[int, list[int]]) -> dict[int, np.ndarray]:
        (rate_key, _), (auroc_key, _) = self._keys(tasks_parts)
        out = {}
        for i, group in tasks_parts.items():
            reps = np.full((self.n_boot, 3), np.nan)
            reps[:, :2] = ResampledRatio.ratio(self.sums[(rate_key, tuple(group))])
            weights = auroc_weights([self.parts[j] for j in group])
            if weights.sum():
                reps[:, 2] = sum(w * self.aurocs[(auroc_key, j)] for j, w in zip(group, weights) if w) / weights.sum()
            out[i] = reps
        return out


def resampled_aurocs(parts: list[dict], patients: np.ndarray, clusters: np.ndarray, n_boot: int, seed: int,
                     auroc_boot, pool: ThreadPoolExecutor | None = None, threads: int = 1) -> np.ndarray:
    """(n_boot × parts) margin AUROCs of ``parts`` over the bootstrap resamples of the patient set
    ``patients`` (sorted cluster codes; :func:`patient_set_rng` seeds the draws, so a part's values do
    not depend on the parts beside it). The draws are taken here, in order; each chunk is counted and
    evaluated by every estimator (:func:`_evaluate_chunk`), in ``pool`` when given (at most one chunk
    per thread and one more waiting)."""
    def build(part):
        return auroc_boot(part["margin"], part["labels"], np.searchsorted(patients, clusters[part["images"]]))

    estimators = list(pool.map(build, parts)) if pool is not None else [build(part) for part in parts]
    # estimators over the same patients (a group's tasks) share their columns of the multiplicities
    shares = [e.clusters.tobytes() if hasattr(e, "columns") else None for e in estimators]
    out, start, pending = np.empty((n_boot, len(parts))), 0, []
    for draws in cluster_draw_chunks(len(patients), n_boot, patient_set_rng(seed, patients),
                                     max_draws=max(BOOT_CHUNK, 64 * len(patients))):
        if pool is None:
            _evaluate_chunk(estimators, shares, draws, len(patients), out, start)
        else:
            pending.append(pool.submit(_evaluate_chunk, estimators, shares, draws, len(patients), out, start))
            if len(pending) > threads:
                pending.pop(0).result()
        start += len(draws)
    for done in pending:
        done.result()
    return out


def group_aurocs(group_parts: list[dict], clusters: np.ndarray, n_boot: int, seed: int, auroc_boot) -> None:
    """Each scored part's AUROC resamples over its own patients (the set its group row resamples,
    :class:`_Resampler`), stored in the part as ``aurocs`` {set: values}: taken while the group's
    scoring is at hand, so that on the CPU the groups' threads do them beside each other."""
    by_set: dict[bytes, tuple[np.ndarray, list[dict]]] = {}
    for part in group_parts:
        if auroc_weights([part])[0]:
            key, patients = _patient_set(clusters[part["images"]])
            by_set.setdefault(key, (patients, []))[1].append(part)
    threads = torch.get_num_threads()  # 1 in a group scored beside others; all of them for a group alone
    pool = ThreadPoolExecutor(threads) if threads > 1 and by_set else None
    try:
        with torch_threads(1 if pool is not None else 0):  # the pool's threads each on one torch thread (run)
            for key, (patients, members) in by_set.items():
                out = resampled_aurocs(members, patients, clusters, n_boot, seed, auroc_boot, pool, threads)
                for c, part in enumerate(members):
                    part["aurocs"] = {key: out[:, c]}
    finally:
        if pool is not None:
            pool.shutdown()


def _evaluate_chunk(estimators, shares, draws: np.ndarray, n_clusters: int, out: np.ndarray, start: int) -> None:
    """One chunk of resamples (its draws) counted and evaluated by every estimator, into its rows of
    ``out``; estimators of the same ``shares`` key (over the same patients) share their columns of the
    multiplicities."""
    counts = count_draws(draws, n_clusters)
    columns = {}
    for c, (share, e) in enumerate(zip(shares, estimators)):
        if share is not None and share not in columns and e.segment_form(counts):
            columns[share] = e.columns(counts)
        out[start:start + len(counts), c] = e(counts, columns[share]) if share in columns else e(counts)


def _fill_intervals(row: dict, reps: np.ndarray) -> None:
    """``<metric>_sd``, ``_ci_low`` and ``_ci_high`` from the (resamples × metrics) replicates."""
    for m, column in zip(METRICS, reps.T):
        ci = summarize_bootstrap(column)
        row.update({f"{m}_sd": ci["sd"], f"{m}_ci_low": ci["ci_low"], f"{m}_ci_high": ci["ci_high"]})
