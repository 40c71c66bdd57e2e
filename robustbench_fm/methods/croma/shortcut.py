"""Shortcut protocol: PathoROB's confounder-biased linear probe, reduced to APD and nIPD
(croma.md §2.7 and Table 11; conventions ``croma_conventions.md`` section B).

For one benchmark (``camelyon``, ``tcga`` = TCGA-4x4, ``tolkach_esca``):

* rows of the benchmark's in-domain centres form the cells ``cells[i][j]`` (centre i, class j,
  both in PathoROB's order, rows in manifest order); each cell is cut into slides of
  ``rows_per_slide`` consecutive rows, which must each hold one ``slide_id``;
* replicate r uses ``random.Random(seed_r)`` with ``seed_r`` from
  ``random.Random(seed).sample(range(10000), iterations)``; it shuffles the slides of every
  cell (centre outer, class inner). The shuffles compound across replicates, as upstream's do.
  Tolkach-ESCA first draws one feasible train/test case split per centre
  (``rng.randint`` over :func:`~robustbench_fm.methods.croma.shortcut_metrics.feasible_case_splits` of the
  in-domain rows, which reproduces PathoROB's ``resources/tolkach_splits.json``) and moves the
  test cases' slides to the end of each cell, in sorted case order (croma's deterministic choice);
* split s trains on the first ``slides(s)·rows_per_slide`` rows of each cell (the schedule of
  :func:`robustbench_fm.methods.croma.shortcut_metrics.training_slides`), validates on the next
  ``int(take / max_train_slides)`` rows, and tests on every cell's rows from
  ``(max_train_slides + 1)·rows_per_slide`` on (ID: the same balanced rows at every split) and
  on all rows of the unseen centres (OOD);
* the probe is ``LogisticRegression(C, random_state=0)`` on the raw features for each C of
  10^linspace(−8, 4, 15); the C with the first-highest validation balanced accuracy is refit on
  the training rows and scored by balanced accuracy on each test set;
* APD and nIPD reduce each (split × replicate) accuracy matrix; nIPD integrates over the
  Cramér's V of the training counts with chance = 1/#classes.

``summary`` columns (one row per test set ``id`` / ``ood``): benchmark, test_set, apd, nipd,
chance, n_splits, iterations, acc_balanced (mean accuracy of split 0), acc_confounded (of the
last split), n_test.
``per_sample`` holds one row per trained probe and test set (PathoROB's ``*_raw.json``):
test_set, split, replicate, seed, cramers_v, best_c, accuracy.
"""
from __future__ import annotations

import random
import warnings

import numpy as np
import pandas as pd
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import balanced_accuracy_score

from ...core.errors import InvalidSetting
from ...core.results import Results
from .. import missing_column
from . import shortcut_metrics as sm
from .params import ShortcutParams

PARAMS = ShortcutParams



def check_params(**params) -> ShortcutParams:
    """Refuse unknown, mistyped or inconsistent options before any heavy work (one line each;
    :class:`~robustbench_fm.methods.croma.params.ShortcutParams`)."""
    return PARAMS.parse(params)


def probe_accuracies(train_x, train_y, val_x, val_y, tests: list[tuple[np.ndarray, np.ndarray]]
                     ) -> tuple[float, list[float]]:
    """PathoROB's probe (conventions B, "Probe"): C chosen on validation balanced accuracy
    (first maximum over :data:`~robustbench_fm.methods.croma.shortcut_metrics.C_GRID`), refit on the training
    rows, balanced accuracy on each test set. Returns (best C, test accuracies)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # lbfgs, max_iter=100, as upstream
        scores = [balanced_accuracy_score(val_y, LogisticRegression(C=c, random_state=0)
                                          .fit(train_x, train_y).predict(val_x)) for c in sm.C_GRID]
        best_c = float(sm.C_GRID[int(np.argmax(scores))])
        model = LogisticRegression(C=best_c).fit(train_x, train_y)
    return best_c, [float(balanced_accuracy_score(y, model.predict(x))) for x, y in tests]


def _cells(manifest: pd.DataFrame, bm: sm.Benchmark, label_col: str, site_col: str, slide_col: str,
           rows_per_slide: int) -> list[list[list[np.ndarray]]]:
    """Row indices of each (centre, class) cell, in manifest order, cut into slides."""
    cells = []
    for centre in bm.centres:
        row = []
        for cls in bm.classes:
            idx = np.flatnonzero((manifest[site_col] == centre).to_numpy() & (manifest[label_col] == cls).to_numpy())
            need = (bm.max_train_slides + 2) * rows_per_slide
            if len(idx) < need or len(idx) % rows_per_slide:
                raise ValueError(f"shortcut: cell ({centre}, {cls}) has {len(idx)} rows; '{bm.name}' needs a "
                                 f"multiple of rows_per_slide={rows_per_slide} and at least {need}; "
                                 "use the benchmark's full metadata (dataset option view=apd)")
            slides = [idx[k:k + rows_per_slide] for k in range(0, len(idx), rows_per_slide)]
            if slide_col in manifest.columns:
                ids = manifest[slide_col].to_numpy()
                mixed = next((k for k, s in enumerate(slides) if len(set(ids[s])) > 1), None)
                if mixed is not None:
                    raise ValueError(f"shortcut: cell ({centre}, {cls}) block {mixed} of {rows_per_slide} rows spans "
                                     f"slides {sorted(set(ids[slides[mixed]]))}; keep the metadata's slide-contiguous "
                                     "row order or set rows_per_slide")
            row.append(slides)
        cells.append(row)
    return cells


def _case_splits(cells, frame: pd.DataFrame, y: np.ndarray, bm: sm.Benchmark, site_col: str, slide_col: str,
                 rows_per_slide: int) -> list[tuple[list, list]] | None:
    """Per in-domain centre, its feasible (train cases, test cases) lists, or None where slides
    are not cases (every benchmark but Tolkach-ESCA). The test cases must fill exactly the
    held-out tail of every cell: (slides per cell − max_train_slides − 1) slides."""
    if not bm.case_split_max_sizes:
        return None
    splits = []
    for i, (centre, max_size) in enumerate(zip(bm.centres, bm.case_split_max_sizes)):
        n_slides = {len(cell) for cell in cells[i]}
        if len(n_slides) != 1:
            raise ValueError(f"shortcut: the cells of centre {centre} hold {sorted(n_slides)} slides; "
                             f"'{bm.name}' needs the same number in every class (use view=apd)")
        tail_rows = (n_slides.pop() - bm.max_train_slides - 1) * rows_per_slide
        rows = (frame[site_col] == centre).to_numpy()
        train, test = sm.feasible_case_splits(frame[slide_col].to_numpy()[rows], y[rows], len(bm.classes),
                                              tail_rows, max_size)
        if not test:
            raise ValueError(f"shortcut: centre {centre} has no set of 2..{max_size} cases holding exactly "
                             f"{tail_rows} rows of every class; use the full tolkach_esca.csv rows (view=apd)")
        splits.append((train, test))
    return splits


def _arrange(cells, rng: random.Random, slide_ids: np.ndarray | None, case_splits: list[tuple[list, list]] | None):
    """One replicate's reordering of every cell's slides, in place (see module doc)."""
    if case_splits is not None:
        draws = [rng.randint(0, len(train) - 1) for train, _ in case_splits]
    for i, row in enumerate(cells):
        for slides in row:
            rng.shuffle(slides)
            if case_splits is None:
                continue
            test_cases = set(case_splits[i][1][draws[i]])
            for case in sorted(test_cases & {slide_ids[s[0]] for s in slides}):
                first = next(k for k, s in enumerate(slides) if slide_ids[s[0]] == case)
                slides.append(slides.pop(first))


def _check_validation_rows(bm: sm.Benchmark, rps: int, chosen: bool) -> None:
    """Each split validates on int(training rows / max_train_slides) rows per cell (conventions
    F.14); a ``rows_per_slide`` so small that a split keeps none is refused in one line (croma
    refuses it too) instead of failing inside sklearn."""
    empty = [s for s in range(bm.n_splits)
             if not (sm.training_slides(bm.name, s) * rps // bm.max_train_slides).any()]
    if empty:
        most = [int(sm.training_slides(bm.name, s).max()) for s in range(bm.n_splits)]
        need = max(-(-bm.max_train_slides // max(m, 1)) for m in most)
        setting = f"rows_per_slide={rps}" + ("" if chosen else " (the benchmark's)")
        raise InvalidSetting(f"shortcut: {setting} leaves split {empty[0]} of '{bm.name}' ({len(empty)} of "
                             f"{bm.n_splits} splits) without validation rows (int(training rows / "
                             f"max_train_slides={bm.max_train_slides}) is 0 in every cell); set "
                             f"rows_per_slide to at least {need} (the benchmark's is {bm.rows_per_slide})")


def run(features: np.ndarray, manifest: pd.DataFrame, finding: str = "bio_label",
        params: ShortcutParams | None = None, **kw) -> Results:
    """APD and nIPD of a confounder-biased probe sweep on ``features`` (see module doc);
    ``params``: :class:`~robustbench_fm.methods.croma.params.ShortcutParams`.

    ``finding`` is the manifest column holding the biological class the probe predicts;
    ``rows_per_slide`` defaults to the benchmark's (300 / 30 / 100).
    """
    p = PARAMS.parse(params, **kw)
    benchmark, site_col, slide_col, iterations, seed = p.benchmark, p.site_col, p.slide_col, p.iterations, p.seed
    rows_per_slide = p.rows_per_slide
    bm = sm.benchmark(benchmark)
    rps = rows_per_slide or bm.rows_per_slide
    needed = {finding: "finding", site_col: "site_col"} | ({slide_col: "slide_col"} if bm.case_split_max_sizes else {})
    for col, param in needed.items():
        if col not in manifest.columns:
            raise missing_column("shortcut", col, param, manifest.columns)
    sites, labels = manifest[site_col].astype(str), manifest[finding].astype(str)
    unknown = ~sites.isin(bm.centres + bm.ood_centres)
    if unknown.any():
        raise ValueError(f"shortcut: {int(unknown.sum())} rows have a centre outside '{benchmark}' "
                         f"(first '{sites[unknown].iloc[0]}'); keep only {', '.join(bm.centres + bm.ood_centres)}")
    bad = ~labels.isin(bm.classes)
    if bad.any():
        raise ValueError(f"shortcut: column '{finding}' holds '{labels[bad].iloc[0]}', not a '{benchmark}' class; "
                         f"use {', '.join(bm.classes)}")
    x = np.asarray(features, dtype=np.float64)
    y = labels.map({c: j for j, c in enumerate(bm.classes)}).to_numpy()
    frame = pd.DataFrame({site_col: sites, finding: labels})
    if slide_col in manifest.columns:
        frame[slide_col] = manifest[slide_col].astype(str)
    _check_validation_rows(bm, rps, rows_per_slide is not None)
    cells = _cells(frame, bm, finding, site_col, slide_col, rps)
    splits = _case_splits(cells, frame, y, bm, site_col, slide_col, rps)
    slide_ids = frame[slide_col].to_numpy() if splits is not None else None
    ood = np.flatnonzero(sites.isin(bm.ood_centres).to_numpy())
    test_sets = ["id"] + (["ood"] if len(ood) else [])
    v = sm.schedule_cramers_v(benchmark)
    seeds = sm.replicate_seeds(seed, iterations)
    acc = {t: np.empty((bm.n_splits, iterations)) for t in test_sets}
    records = []
    first_test = (bm.max_train_slides + 1) * rps
    for r, rep_seed in enumerate(seeds):
        _arrange(cells, random.Random(rep_seed), slide_ids, splits)
        rows = [[np.concatenate(slides) for slides in row] for row in cells]
        id_test = np.concatenate([cell[first_test:] for row in rows for cell in row])
        for s in range(bm.n_splits):
            take = sm.training_slides(benchmark, s) * rps
            train = np.concatenate([rows[i][j][:take[i, j]] for i in range(len(bm.centres))
                                    for j in range(len(bm.classes))])
            val = np.concatenate([rows[i][j][take[i, j]:take[i, j] + int(take[i, j] / bm.max_train_slides)]
                                  for i in range(len(bm.centres)) for j in range(len(bm.classes))])
            tests = [(x[id_test], y[id_test])] + ([(x[ood], y[ood])] if len(ood) else [])
            best_c, scores = probe_accuracies(x[train], y[train], x[val], y[val], tests)
            for t, score in zip(test_sets, scores):
                acc[t][s, r] = score
                records.append(dict(test_set=t, split=s, replicate=r, seed=rep_seed, cramers_v=float(v[s]),
                                    best_c=best_c, accuracy=score))
    chance = 1.0 / len(bm.classes)
    summary = pd.DataFrame([dict(benchmark=benchmark, test_set=t, apd=sm.apd(acc[t]), nipd=sm.nipd(acc[t], v, chance),
                                 chance=chance, n_splits=bm.n_splits, iterations=iterations,
                                 acc_balanced=float(acc[t][0].mean()), acc_confounded=float(acc[t][-1].mean()),
                                 n_test=len(id_test) if t == "id" else len(ood)) for t in test_sets])
    params = dict(benchmark=benchmark, finding=finding, site_col=site_col, slide_col=slide_col,
                  iterations=iterations, seed=seed, rows_per_slide=rps)
    return Results(summary=summary, per_sample=pd.DataFrame(records), params=params)
