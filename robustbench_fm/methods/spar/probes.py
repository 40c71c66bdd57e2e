"""SPAR-Bench probe labels (spar.md section 3.1, Levels 2 and 3) from per-slice organ measurements.

All coordinates are in the radiological display frame of ``volumes.to_display``: x grows to the
right of the image (towards the patient's left), y grows downwards (towards posterior), both
normalised to [0, 1] by the slice size, with pixel centres at ``(i + 0.5) / size``.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ...data.ct.layouts import ORGANS, SAMPLE_OPTIONS

#: The six Level-3 probes (spar.md section 3.1, Level 3 (i)-(vi)).
L3_PROBES = ("relative_position", "orientation", "kidney_symmetry", "liver_size", "distance_compare", "tumour_count")
#: Transforms a Level-3 question may present its slice under; the orientation label is the index.
TRANSFORMS = ("none", "hflip", "vflip", "rot90", "rot180")
GRID = 4                     # Level 2 grid: 4 x 4 cells, cell index = row * 4 + col
SYMMETRIC_BAND = (0.95, 1.05)  # kidney area ratio band called symmetric (section 3.1 (iii))
LIVER_SIZE_BINS = (0.10, 0.20)  # liver fraction of the slice: <10%, 10-20%, >20% (section 3.1 (iv))
N_CLASSES = {"relative_position": 2, "orientation": 5, "kidney_symmetry": 3, "liver_size": 3,
             "distance_compare": 2, "tumour_count": 3}
LIVER, LEFT_KIDNEY, RIGHT_KIDNEY = ORGANS.index("liver"), ORGANS.index("left_kidney"), ORGANS.index("right_kidney")


def grid_cells(centroids: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Level-2 target cell of every slot, (N, 16) int64, each row a permutation of 0..15.

    spar.md 3.1 Level 2: "The original ordering places each organ in the grid cell matching its
    centroid, so the model must recover a spatial arrangement, not a fixed class order." The paper
    gives no grid and no rule for two organs whose centroids fall in one cell. Our reading: the
    grid is 4 x 4 over the slice (16 cells for 16 slots), and an organ's cell is the one that
    contains its centroid (``row * 4 + col``) whenever no other present organ's centroid falls in
    it. Where several centroids share a cell, one of them keeps it and the others move to free
    cells. Which organ keeps it, and which free cells the others take, is chosen to minimise the
    summed Euclidean distance from each centroid to its cell centre. Absent organs then fill the
    remaining cells in slot order.

    One Hungarian assignment (``scipy.optimize.linear_sum_assignment``) does this. Its cost is the
    distance to the cell centre plus a penalty larger than any sum of distances for every organ not
    in its centroid's cell. The penalty makes the assignment keep as many organs in their own cells
    as possible, which keeps every uncontested organ in its cell. The distances then settle the
    rest. With the distance alone (the earlier rule), organs were pushed out of free cells to
    make room for crowded neighbours, and 42% of the present organs in the phantom demo sat in a cell
    that did not hold their centroid (tests/methods/spar/test_spar_scoring.py, test_spar_probes.py).
    """
    from scipy.optimize import linear_sum_assignment

    n_slots = centroids.shape[1]
    centres = (np.stack(np.meshgrid(np.arange(GRID), np.arange(GRID)), -1).reshape(-1, 2) + 0.5) / GRID  # (x, y)
    penalty = 2.0 * n_slots  # > any summed distance (each < sqrt(2) in the unit square)
    out = np.empty(present.shape, dtype=np.int64)
    for i in range(len(present)):
        slots = np.flatnonzero(present[i])
        xy = centroids[i, slots]
        cost = np.linalg.norm(xy[:, None, :] - centres[None], axis=-1)
        cost += penalty * (np.arange(GRID * GRID)[None] != centroid_cell(xy)[:, None])
        rows, cells = linear_sum_assignment(cost)
        out[i, slots[rows]] = cells
        free = np.setdiff1d(np.arange(GRID * GRID), cells)
        out[i, np.setdiff1d(np.arange(n_slots), slots)] = free[: n_slots - len(slots)]
    return out


def centroid_cell(xy: np.ndarray) -> np.ndarray:
    """The 4 x 4 grid cell (``row * 4 + col``) that holds each normalised (x, y) point [..., 2]."""
    col, row = (np.clip(np.floor(np.asarray(xy, float)[..., k] * GRID), 0, GRID - 1).astype(np.int64) for k in (0, 1))
    return row * GRID + col


def transform_points(xy: np.ndarray, transform: str) -> np.ndarray:
    """Normalised (x, y) points moved as ``samples.apply_transform`` moves the image under them."""
    x, y = xy[..., 0], xy[..., 1]
    moved = {"none": (x, y), "hflip": (1 - x, y), "vflip": (x, 1 - y), "rot90": (y, 1 - x),
             "rot180": (1 - x, 1 - y)}
    if transform not in moved:
        raise ValueError(f"unknown transform {transform!r}; use one of {', '.join(TRANSFORMS)}")
    return np.stack(moved[transform], axis=-1)


def relative_position_label(xy_a: np.ndarray, xy_b: np.ndarray, transform: str = "none") -> np.ndarray:
    """Probe (i): 0 when organ A lies to the PATIENT's left of organ B, 1 to the patient's right,
    read from the presented image in the radiological convention (patient's left on the image's
    right), the side convention of the organ names ("left kidney" = the patient's left) and of
    the SPAR-VQA prompts. spar.md 3.1 (i) "Is organ A left or right of organ B?" and "presents
    each slice in original and horizontally flipped form, so the label flips with the image": the
    label is read off the image as shown, so it flips under 'hflip'."""
    return (transform_points(xy_a, transform)[..., 0] < transform_points(xy_b, transform)[..., 0]).astype(np.int64)


def kidney_symmetry_class(area_left: np.ndarray, area_right: np.ndarray) -> np.ndarray:
    """Probe (iii): 0 symmetric (left/right area ratio in [0.95, 1.05]), 1 left larger, 2 right larger."""
    ratio = np.asarray(area_left, dtype=float) / np.asarray(area_right, dtype=float)
    return np.where(ratio > SYMMETRIC_BAND[1], 1, np.where(ratio < SYMMETRIC_BAND[0], 2, 0)).astype(np.int64)


def liver_size_class(fraction: np.ndarray) -> np.ndarray:
    """Probe (iv): 0 when the liver covers < 10% of the slice, 1 for 10-20%, 2 for > 20%."""
    fraction = np.asarray(fraction, dtype=float)
    return np.where(fraction < LIVER_SIZE_BINS[0], 0, np.where(fraction > LIVER_SIZE_BINS[1], 2, 1)).astype(np.int64)


def count_tumours(mask: np.ndarray) -> int:
    """Probe (vi): tumour instances on one slice, the connected components of its 2-D tumour mask
    with 8-connectivity (pixels touching at an edge or a corner belong to one lesion). spar.md 3.1
    (vi) says "tumor instances" and names no connectivity. With 4-connectivity (scipy's default,
    used earlier) a lesion whose outline touches itself only at a corner, as resampled or
    hand-drawn masks often do, counted as two."""
    from scipy import ndimage

    return int(ndimage.label(np.asarray(mask, bool), structure=np.ones((3, 3), bool))[1])


def tumour_count_class(n_components: np.ndarray) -> np.ndarray:
    """Probe (vi): number of tumour connected components on the slice, 0, 1 or 2 (meaning >= 2)."""
    return np.minimum(np.asarray(n_components), 2).astype(np.int64)


def question_key(probe: str, organs) -> tuple[tuple, bool]:
    """(key, flipped) of one Level 3 question as the question-only prior looks it up
    (:func:`~robustbench_fm.methods.spar.metrics.reference_answers`): equal keys ask the same thing.
    Relative position "Is A left or right of B?" with (A, B) sorted; distance "is d(A, B) greater
    than d(C, D)?" with each pair sorted and the two pairs sorted. ``flipped`` is True when sorting
    swapped the two sides, so the stored answer is 1 - label (both probes have 2 classes). The
    other probes ask about fixed organs: the key is the probe and its organs."""
    a, b, c, d = (str(o) for o in organs)
    if probe == "relative_position":
        return (probe, *sorted((a, b))), a > b
    if probe == "distance_compare":
        ab, cd = tuple(sorted((a, b))), tuple(sorted((c, d)))
        return (probe, *sorted((ab, cd))), ab > cd
    return (probe, a, b, c, d), False


def undersample(labels: np.ndarray, groups: np.ndarray, rng: np.random.Generator, n_classes: int) -> np.ndarray:
    """Sorted indices keeping, within each group, the same number of items of every class
    (the rarest class's count; zero when a class is missing), drawn without replacement."""
    keep = []
    for g in pd.unique(groups):
        idx = [np.flatnonzero((groups == g) & (labels == c)) for c in range(n_classes)]
        n = min(len(i) for i in idx)
        keep += [rng.choice(i, size=n, replace=False) for i in idx]
    return np.sort(np.concatenate(keep)) if keep else np.zeros(0, dtype=np.int64)


#: unordered organ pairs (i < j), pair index p = (PAIRS[0][p], PAIRS[1][p])
PAIRS = np.triu_indices(len(ORGANS), k=1)


def pair_distances(centroids: np.ndarray, present: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Distance of every unordered organ pair (:data:`PAIRS`) on every slice [M, 120], NaN where
    an organ is absent: ``centroids`` (M, 16, 2) normalised (x, y) times ``scale`` (M, 2), the
    slice's (width, height) in mm or in pixels of the resized frame."""
    i, j = PAIRS
    px = np.asarray(centroids, np.float64) * np.asarray(scale, np.float64)[:, None, :]
    d = np.linalg.norm(px[:, i] - px[:, j], axis=-1)
    return np.where(present[:, i] & present[:, j], d, np.nan)


def pick_distance_questions(slices: np.ndarray, present: np.ndarray, centroids: np.ndarray, scale: np.ndarray,
                            split: np.ndarray, rng: np.random.Generator, per_slice: int = 1) -> list[tuple]:
    """Probe (v)'s questions on ``slices`` (rows of ``present`` / ``centroids``; ``scale`` (M, 2)
    as in :func:`pair_distances`, ``split`` (M,)): (slice row, (a, b, c, d) organ indices, label
    d(a, b) > d(c, d), draw index on its slice), sorted by slice row.

    Every pair of disjoint present pairs of every slice is a candidate (exact ties left out). Its
    key is the unordered pair of pairs and its answer is taken in the key's order. Within each
    split, a key keeps as many candidates of each answer as its rarer answer has (drawn at random,
    as :func:`undersample` does), so a key whose order never changes across the split's slices is never
    asked, and the kept ones are paired, one of each answer. Couples are then taken in random
    order while both of their slices hold fewer than ``per_slice`` questions, so every key keeps
    its balance and no slice is asked more than ``per_slice``. Finally each question's two pairs,
    and each pair's two organs, are put in random order (the label flips with the pairs)."""
    i, j = PAIRS
    dist = pair_distances(centroids[slices], present[slices], scale[slices])
    rows, first, second, answer = [], [], [], []
    for m, d in zip(slices, dist):
        pairs = np.flatnonzero(np.isfinite(d))
        a, b = np.triu_indices(len(pairs), 1)
        p, q = pairs[a], pairs[b]
        ok = (i[p] != i[q]) & (i[p] != j[q]) & (j[p] != i[q]) & (j[p] != j[q]) & (d[p] != d[q])
        rows.append(np.full(int(ok.sum()), m))
        first.append(p[ok])
        second.append(q[ok])
        answer.append(d[p[ok]] > d[q[ok]])
    if not rows:
        return []
    rows, first, second = (np.concatenate(v).astype(np.int64) for v in (rows, first, second))
    answer = np.concatenate(answer).astype(np.int64)
    group = pd.factorize(split[rows])[0].astype(np.int64) * len(i) ** 2 + first * len(i) + second
    order = rng.permutation(len(rows))  # a random draw within every (split, key, answer)
    cand = pd.DataFrame({"group": group[order], "answer": answer[order], "item": order})
    cand["rank"] = cand.groupby(["group", "answer"]).cumcount()
    rarer = cand.groupby(["group", "answer"]).size().unstack(fill_value=0).reindex(columns=[0, 1], fill_value=0)
    cand = cand[cand["rank"] < cand["group"].map(rarer.min(axis=1))]
    paired = cand[cand["answer"] == 0].merge(cand[cand["answer"] == 1], on=["group", "rank"])
    couples = paired[["item_x", "item_y"]].to_numpy()  # one question of each answer of one key
    asked = np.zeros(len(present), np.int64)
    chosen = []
    for c in rng.permutation(len(couples)):
        x, y = couples[c]
        if asked[rows[x]] < per_slice and asked[rows[y]] < per_slice:
            asked[rows[x]] += 1
            asked[rows[y]] += 1
            chosen += [x, y]
    chosen = np.sort(np.asarray(chosen, np.int64))
    swap = rng.random((len(chosen), 3)) < 0.5  # the two pairs, organs within the first, within the second
    out, draws = [], {}
    for k, s in zip(chosen, swap):
        ab, cd = [i[first[k]], j[first[k]]], [i[second[k]], j[second[k]]]
        ab, cd = ab[::-1] if s[1] else ab, cd[::-1] if s[2] else cd
        label = int(answer[k])
        if s[0]:
            ab, cd, label = cd, ab, 1 - label
        m = int(rows[k])
        draws[m] = draws.get(m, -1) + 1
        out.append((m, (*ab, *cd), label, draws[m]))
    return sorted(out, key=lambda t: (t[0], t[3]))


def make_questions(slice_table: pd.DataFrame, present: np.ndarray, centroids: np.ndarray, areas: np.ndarray,
                   slice_pixels: np.ndarray, tumours: np.ndarray, rng: np.random.Generator,
                   probes: tuple[str, ...] = L3_PROBES, size: int = 224, distance_questions: int = 1,
                   frame_mm: np.ndarray | None = None,
                   distance_rule: str = SAMPLE_OPTIONS["distance_rule"]) -> pd.DataFrame:
    """Level-3 questions over the slices (section 3.1 (i)-(vi)), one row per question.

    ``present`` (M, 16) bool, ``centroids`` (M, 16, 2) normalised display (x, y), ``areas`` (M, 16)
    organ pixel counts in the original slice, ``slice_pixels`` (M,) pixels of the original slice,
    ``tumours`` (M,) tumour components per slice (-1 where the volume has no tumour labels),
    ``frame_mm`` (M, 2) each slice's (width, height) in mm (NaN or None where the pixel spacing is
    unknown).
    Only slices of ``slice_table.dataset == 'lits'`` carry tumour questions, and only they lack
    the others. Rules where the paper is silent:

    - relative position: one random pair of present organs per slice whose centroids differ by
      at least one pixel of the ``size`` frame horizontally, asked in original and h-flipped form;
    - orientation: one transform per slice, a shuffled cycle of the five so classes are balanced;
    - symmetry: slices with both kidneys present, undersampled to balance classes per split;
    - distance (``distance_rule="varying"``, the default: ``SAMPLE_OPTIONS``): the paper's control
      read literally (spar.md Section 3.1: "Distance compares organ pairs that change across
      slices, so no single ordering applies"): only pairs of pairs whose order changes across a
      split's slices, balanced per pair of pairs and split, at most ``distance_questions`` per
      slice (:func:`pick_distance_questions`), so the question-only prior sits near 0.5 (0.502 in
      domain, 0.497 zero-shot on the demo's phantoms at 8 per slice: 1,352 and 1,240 test questions;
      docs/methods/spar.md, "Where the demo's figures come from", names the command that prints them).
      spar.md gives no count per slice; one is our default (a real cohort has thousands of
      slices), more suit a small cohort, where a head must see each organ pair often enough to
      read its distance.
    - distance (``distance_rule="random"``, the demo's): ``distance_questions`` draws per slice of
      four distinct random present organs, label 1 when d(A, B) > d(C, D); exact ties and a
      repeat of a drawn pair of pairs are skipped. In canonical anatomy most pairs of pairs drawn
      so never change order: the question-only prior scores 0.893 in domain and 0.916 zero-shot
      on the demo's phantoms; the tables' prior row shows it. It asks more questions (the demo's
      training split, 8 per slice: 1,240 against 586 under ``varying``), which the demo's heads
      need.
    Distances are Euclidean in mm where the slice's pixel spacing is known (``frame_mm``): the
    anatomy's own geometry. Where it is unknown they are in the ``size`` x ``size`` resized frame,
    which squashes a non-square slice (a 512 x 400 slice shrinks x by 224/512 and y by 224/400),
    so a pair across the slice and one along it may swap order. Earlier, every label used the
    resized frame.
    """
    rows: list[dict] = []
    split = slice_table["split"].to_numpy()
    sample_id = slice_table["sample_id"].to_numpy()
    lits = (slice_table["dataset"] == "lits").to_numpy()

    def add(probe, m, label, transform="none", organs=(), draw=0):
        names = [ORGANS[o] for o in organs] + [""] * (4 - len(organs))
        qid = f"{probe}:{sample_id[m]}:{transform}" + (f":{draw}" if draw else "")
        rows.append({"question_id": qid, "probe": probe, "slice_row": int(m),
                     "transform": transform, "organ_a": names[0], "organ_b": names[1], "organ_c": names[2],
                     "organ_d": names[3], "label": int(label), "n_classes": N_CLASSES[probe], "split": split[m]})

    general = np.flatnonzero(~lits)
    if "relative_position" in probes:
        for m in general:
            slots = np.flatnonzero(present[m])
            x = centroids[m, slots, 0]
            pairs = [(a, b) for i, a in enumerate(slots) for j, b in enumerate(slots)
                     if i != j and abs(x[i] - x[j]) * size >= 1.0]
            if not pairs:
                continue
            a, b = pairs[rng.integers(len(pairs))]
            for t in ("none", "hflip"):
                add("relative_position", m, relative_position_label(centroids[m, a], centroids[m, b], t), t, (a, b))
    if "orientation" in probes:
        transforms = rng.permutation(np.arange(len(general)) % len(TRANSFORMS))
        for m, t in zip(general, transforms):
            add("orientation", m, t, TRANSFORMS[t])
    if "kidney_symmetry" in probes:
        both = general[present[general, LEFT_KIDNEY] & present[general, RIGHT_KIDNEY]]
        labels = kidney_symmetry_class(areas[both, LEFT_KIDNEY], areas[both, RIGHT_KIDNEY])
        for k in undersample(labels, split[both], rng, N_CLASSES["kidney_symmetry"]):
            add("kidney_symmetry", both[k], labels[k], organs=(LEFT_KIDNEY, RIGHT_KIDNEY))
    if "liver_size" in probes:
        has = general[present[general, LIVER]]
        for m, c in zip(has, liver_size_class(areas[has, LIVER] / slice_pixels[has])):
            add("liver_size", m, c, organs=(LIVER,))
    if distance_rule not in ("random", "varying"):
        raise ValueError(f"unknown distance_rule {distance_rule!r}; use 'random' or 'varying'")
    if "distance_compare" in probes and distance_rule == "varying":
        scale = np.full((len(present), 2), float(size))
        if frame_mm is not None:
            known = np.isfinite(frame_mm).all(-1)
            scale[known] = frame_mm[known]
        for m, organs, label, draw in pick_distance_questions(general, present, centroids, scale, split, rng,
                                                             distance_questions):
            add("distance_compare", m, label, organs=organs, draw=draw)
    elif "distance_compare" in probes:
        for m in general:
            slots = np.flatnonzero(present[m])
            if len(slots) < 4:
                continue
            scale = frame_mm[m] if frame_mm is not None and np.isfinite(frame_mm[m]).all() else (size, size)
            px, seen = centroids[m] * np.asarray(scale, np.float64), set()
            for draw in range(distance_questions):
                a, b, c, d = rng.choice(slots, size=4, replace=False)
                key = frozenset((frozenset((a, b)), frozenset((c, d))))
                d_ab, d_cd = np.linalg.norm(px[a] - px[b]), np.linalg.norm(px[c] - px[d])
                if d_ab != d_cd and key not in seen:
                    seen.add(key)
                    add("distance_compare", m, d_ab > d_cd, organs=(a, b, c, d), draw=draw)
    if "tumour_count" in probes:
        for m in np.flatnonzero(lits & (tumours >= 0)):
            add("tumour_count", m, tumour_count_class(tumours[m]), organs=(LIVER,))
    columns = ["question_id", "probe", "slice_row", "transform", "organ_a", "organ_b", "organ_c", "organ_d",
               "label", "n_classes", "split"]
    out = pd.DataFrame(rows, columns=columns)
    out["probe"] = pd.Categorical(out["probe"], categories=list(L3_PROBES))
    out = out.sort_values(["probe", "slice_row"], kind="stable").reset_index(drop=True)
    out["probe"] = out["probe"].astype(str)
    return out.astype({"slice_row": np.int64, "label": np.int64, "n_classes": np.int64})
