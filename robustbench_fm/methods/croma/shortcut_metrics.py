"""PathoROB's shortcut protocol as pure functions: training schedules, Cramér's V, APD, nIPD.

The confounder-biased probe (croma.md §2.7 "Downstream shortcut susceptibility"; conventions
``croma_conventions.md`` section B) trains a biology probe on training sets whose centre ×
class composition walks from balanced (split 0) to fully confounded, and scores it on a fixed
balanced in-domain tail and on unseen centres. This module holds the parts that need no
features: the per-split slide counts of each benchmark, the Cramér's V of those counts, the
replicate seeds, and the two reductions of the resulting ``(n_splits, n_replicates)`` accuracy
matrix. :mod:`robustbench_fm.methods.croma.shortcut` runs the probes.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from itertools import combinations

import numpy as np
from scipy.stats.contingency import association


@dataclass(frozen=True)
class Benchmark:
    """One PathoROB downstream benchmark (conventions B, "Cells and slides", "Schedules").

    ``centres`` and ``classes`` fix the cell index order the schedule is written in;
    ``ood_centres`` are the unseen centres of the out-of-domain test; a cell's rows are cut
    into slides of ``rows_per_slide`` consecutive rows; ``n_splits`` schedules are defined and
    no cell ever trains on more than ``max_train_slides`` slides.
    """

    name: str
    centres: tuple[str, ...]
    classes: tuple[str, ...]
    ood_centres: tuple[str, ...]
    rows_per_slide: int
    n_splits: int
    max_train_slides: int
    case_split_max_sizes: tuple[int, ...] = ()


BENCHMARKS = {
    "camelyon": Benchmark("camelyon", ("RUMC", "UMCU"), ("normal", "tumor"), ("CWZ", "RST", "LPON"),
                          rows_per_slide=300, n_splits=8, max_train_slides=14),
    "tcga": Benchmark("tcga", ("Asterand", "Christiana Healthcare", "Roswell Park", "University of Pittsburgh"),
                      ("Breast_invasive_carcinoma", "Colon_adenocarcinoma", "Lung_adenocarcinoma",
                       "Lung_squamous_cell_carcinoma"),
                      ("Cureline", "Greater Poland Cancer Center", "International Genomics Consortium",
                       "Johns Hopkins"),
                      rows_per_slide=30, n_splits=7, max_train_slides=8),
    "tolkach_esca": Benchmark("tolkach_esca", ("VALSET2_WNS", "VALSET4_CHA_FULL"),
                              ("TUMOR", "MUSC_PROP", "SH_OES", "SH_MAG", "REGR_TU", "ADVENT"),
                              ("VALSET1_UKK", "VALSET3_TCGA"),
                              rows_per_slide=100, n_splits=4, max_train_slides=6, case_split_max_sizes=(12, 5)),
}

#: PathoROB's logistic-probe regularisation grid (conventions B, "Probe").
C_GRID = 10.0 ** np.linspace(-8, 4, 15)


def benchmark(name: str) -> Benchmark:
    """The :class:`Benchmark` called ``name``, or a one-line error listing the known ones."""
    if name not in BENCHMARKS:
        raise ValueError(f"shortcut: unknown benchmark '{name}'; use one of {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]


def training_slides(name: str, split: int) -> np.ndarray:
    """Training slides per (centre i, class j) cell at ``split`` (conventions B, "Schedules").

    Camelyon: cells (0,0), (1,1) get 7−s, cells (0,1), (1,0) get 7+s. TCGA: diagonal s+2;
    anti-diagonal 1 for odd s, else 2 for s < 3, else 0; the rest 2 for s < 2, 1 for s < 5,
    else 0. Tolkach-ESCA: centre 0 gives classes 0–2 3−s and classes 3–5 3+s; centre 1 mirrored.
    """
    bm = benchmark(name)
    if not 0 <= split < bm.n_splits:
        raise ValueError(f"shortcut: split {split} outside 0..{bm.n_splits - 1} for '{name}'")
    i, j = np.meshgrid(np.arange(len(bm.centres)), np.arange(len(bm.classes)), indexing="ij")
    if name == "camelyon":
        return np.where(i == j, 7 - split, 7 + split)
    if name == "tcga":
        anti = 1 if split % 2 == 1 else (2 if split < 3 else 0)
        rest = 2 if split < 2 else (1 if split < 5 else 0)
        return np.where(i == j, split + 2, np.where(i + j == 3, anti, rest))
    favoured = (j >= 3) == (i == 0)
    return np.where(favoured, 3 + split, 3 - split)


def cramers_v(counts: np.ndarray) -> float:
    """Cramér's V of a (centre × class) count table: sqrt(χ²/(n·(min(r,c)−1))), χ² from the
    margins without continuity correction (conventions B, "Cramér's V per split")."""
    return float(association(np.asarray(counts), method="cramer", correction=False))


def schedule_cramers_v(name: str) -> np.ndarray:
    """Cramér's V of the training counts of every split of benchmark ``name``, split 0 first."""
    return np.array([cramers_v(training_slides(name, s)) for s in range(benchmark(name).n_splits)])


def replicate_seeds(seed: int = 1000, iterations: int = 20) -> list[int]:
    """Per-replicate seeds, ``random.Random(seed).sample(range(10000), iterations)``
    (conventions B, "Replicates"; PathoROB's ``random.seed(1000); random.sample``)."""
    if not 1 <= iterations <= 10000:
        raise ValueError(f"shortcut: iterations={iterations} must lie in 1..10000")
    return random.Random(seed).sample(range(0, 10000), iterations)


def feasible_case_splits(case_ids, class_index, n_classes: int, tail_rows: int, max_size: int
                         ) -> tuple[list[list[str]], list[list[str]]]:
    """Tolkach-ESCA's feasible train/test case splits of one centre (conventions B, "Tolkach only";
    PathoROB ``apd/utils.load_data``, shipped as ``resources/tolkach_splits.json``).

    A test set is a set of 2..``max_size`` cases that together hold exactly ``tail_rows`` rows of
    every class (the held-out tail: 2 slides × 100 rows); sets are enumerated by size, then
    lexicographically over the sorted case ids; train = the other cases, sorted. ``case_ids`` and
    ``class_index`` give each row's case and class index. Returns (train lists, test lists).
    """
    cases, row_case = np.unique(np.asarray(case_ids).astype(str), return_inverse=True)
    counts = np.zeros((len(cases), n_classes), dtype=np.int64)
    np.add.at(counts, (row_case, np.asarray(class_index)), 1)
    train, test = [], []
    for size in range(2, min(max_size, len(cases)) + 1):
        combos = np.array(list(combinations(range(len(cases)), size)))
        for combo in combos[(counts[combos].sum(axis=1) == tail_rows).all(axis=1)]:
            test.append(cases[combo].tolist())
            train.append(np.delete(cases, combo).tolist())
    return train, test


def _accuracy_matrix(accuracies) -> np.ndarray:
    acc = np.asarray(accuracies, dtype=float)
    if acc.ndim != 2 or acc.shape[0] < 2 or acc.shape[1] < 1 or not np.isfinite(acc).all():
        raise ValueError(f"shortcut: accuracies must be a finite (n_splits >= 2, n_replicates >= 1) "
                         f"matrix with the balanced split in row 0, got shape {acc.shape}")
    return acc


def apd(accuracies) -> float:
    """Average Performance Drop (conventions B, "APD"; croma.md §2.7):
    APD = mean_r [ mean_{s≥1} acc[s, r] / acc[0, r] ] − 1, the ratio taken per replicate r."""
    acc = _accuracy_matrix(accuracies)
    if (acc[0] <= 0).any():
        raise ValueError("shortcut: every replicate's balanced-split accuracy must be positive for APD")
    return float(np.mean((acc[1:] / acc[0]).mean(axis=0) - 1.0))


def nipd(accuracies, cramers_v_values, chance: float) -> float:
    """Normalised Integrated Performance Degradation (conventions B, "nIPD"; croma.md §2.7).

    ā(V) = mean over replicates at each split; g(V) = (ā(V) − ā(0)) / (ā(0) − chance);
    nIPD = trapezoid ∫₀¹ g dV over the given Cramér's V, which must rise strictly from 0 to 1.
    −0.5 is a linear fall from the baseline to chance.
    """
    acc = _accuracy_matrix(accuracies)
    v = np.asarray(cramers_v_values, dtype=float)
    if v.shape != (len(acc),) or not np.isfinite(v).all() or not (np.diff(v) > 0).all() \
            or not (np.isclose(v[0], 0.0) and np.isclose(v[-1], 1.0)):
        raise ValueError(f"shortcut: Cramér's V must hold one strictly increasing value per split from 0 to 1, "
                         f"got {v.tolist()}")
    if not 0.0 <= chance < 1.0:
        raise ValueError(f"shortcut: chance={chance} must lie in [0, 1)")
    mean = acc.mean(axis=1)
    if mean[0] <= chance:
        raise ValueError(f"shortcut: mean balanced-split accuracy {mean[0]:.4f} is not above chance {chance}; "
                         "nIPD is undefined")
    g = (mean - mean[0]) / (mean[0] - chance)
    return float(np.trapezoid(g, v))
