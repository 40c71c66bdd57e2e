"""SPAR-Bench metrics (spar.md Section 3.1): Level 1 mean Euclidean distance (MED, px) and success
detection rate at 10 px, Level 2 patch and full-permutation accuracy over present organs, Level 3
per-probe accuracy and its macro average, each with its chance level."""
from __future__ import annotations

import numpy as np
import pandas as pd


def localization(pred: np.ndarray, true: np.ndarray, present: np.ndarray, threshold: float = 10.0,
                 scale=None) -> dict:
    """MED and SDR@threshold over present organs of predicted vs true centroids [N, 16, 2], plus
    per-slot MED [16] (NaN for a slot never present).

    spar.md Section 3.1, Level 1: "Targets are organ centroids in the original slice frame,
    normalized to slice dimensions. ... We report Mean Euclidean Distance (MED) in pixels and
    Success Detection Rate (SDR) at a 10-pixel threshold." With ``scale`` (the (W, H) of each
    sample's slice [N, 2], or one (W, H) for all) the points are normalised (x, y) and are
    multiplied by it first, so a distance is in pixels of that frame: the native slice for the
    paper's numbers (:func:`native_frame`); without it they are already in pixels.
    """
    pred, true = np.asarray(pred, float), np.asarray(true, float)
    if scale is not None:
        scale = np.asarray(scale, float)
        scale = scale[:, None, :] if scale.ndim == 2 else scale
        pred, true = pred * scale, true * scale
    dist = np.linalg.norm(pred - true, axis=-1)
    counts = present.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_slot = np.where(counts > 0, np.where(present, dist, 0.0).sum(0) / counts, np.nan)
    d = dist[present]
    return {"med": float(d.mean()), "sdr": float((d <= threshold).mean()), "n": int(present.sum()),
            "per_slot_med": per_slot}


def native_frame(sample_ids, slice_table: pd.DataFrame) -> np.ndarray:
    """(W, H) in pixels [N, 2] of the original slice of every tile set ``sample_ids`` (a tile set
    and its whole slice share the sample id; ``slice_table`` has ``width`` and ``height``)."""
    if not {"sample_id", "width", "height"} <= set(slice_table.columns):
        raise ValueError("SPAR samples: slice_table has no width/height of the original slices; delete the "
                         "sample cache (<cache_dir>/spar/) so it is rebuilt")
    frame = slice_table.drop_duplicates("sample_id").set_index("sample_id")[["width", "height"]]
    missing = pd.Index(sample_ids).difference(frame.index)
    if len(missing):
        raise ValueError(f"SPAR samples: tile sets {', '.join(map(str, missing[:3]))} have no slice in "
                         "slice_table; delete the sample cache (<cache_dir>/spar/) so it is rebuilt")
    return frame.loc[list(sample_ids)].to_numpy(np.float64)


def permutation(pred_cells: np.ndarray, true_cells: np.ndarray, present: np.ndarray) -> dict:
    """Patch accuracy (present tiles in their cell), permutation accuracy (samples whose present
    tiles are all correct) and per-slot patch accuracy [16] for cells [N, 16]."""
    correct = (np.asarray(pred_cells) == np.asarray(true_cells)) & present
    counts = present.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_slot = np.where(counts > 0, correct.sum(0) / counts, np.nan)
    full = (correct | ~present).all(axis=1)
    return {"patch_acc": float(correct.sum() / present.sum()), "perm_acc": float(full.mean()),
            "n": int(len(full)), "per_slot_acc": per_slot}


def probe_accuracy(pred: np.ndarray, label: np.ndarray, probe: np.ndarray) -> dict[str, float]:
    """Accuracy of every Level 3 probe present in ``probe`` and their unweighted macro average."""
    pred, label, probe = np.asarray(pred), np.asarray(label), np.asarray(probe)
    acc = {p: float((pred[probe == p] == label[probe == p]).mean()) for p in dict.fromkeys(probe)}
    acc["macro"] = float(np.mean(list(acc.values()))) if acc else float("nan")
    return acc


def chance(n_classes: int) -> float:
    """Chance accuracy of a balanced probe with ``n_classes`` answers (spar.md Tables 1, 2, 5)."""
    return 1.0 / n_classes


def majority(labels) -> float:
    """Majority-class rate: the accuracy of always giving the most frequent answer of ``labels``.
    It equals :func:`chance` only on balanced labels; an imbalanced probe (organ size, distance)
    shows it beside the uniform chance (the paper's Chance rows are 1 / classes)."""
    labels = np.asarray(labels)
    if labels.size == 0:
        return float("nan")
    return float(np.unique(labels, return_counts=True)[1].max() / labels.size)


def probe_rows(pred, label, probe, n_classes) -> list[dict]:
    """One row per Level 3 probe present and one ``macro`` row: ``finding``, ``accuracy``, ``n``,
    ``chance`` (1 / classes) and ``majority`` (the majority-class rate of the scored labels);
    macro's chance and majority are the unweighted means over the probes, like its accuracy."""
    label, probe, n_classes = np.asarray(label), np.asarray(probe), np.asarray(n_classes)
    acc = probe_accuracy(pred, label, probe)
    rows = [{"finding": p, "accuracy": v, "n": int((probe == p).sum()),
             "chance": chance(int(n_classes[probe == p][0])), "majority": majority(label[probe == p])}
            for p, v in acc.items() if p != "macro"]
    rows.append({"finding": "macro", "accuracy": acc["macro"], "n": len(label),
                 "chance": float(np.mean([r["chance"] for r in rows])) if rows else float("nan"),
                 "majority": float(np.mean([r["majority"] for r in rows])) if rows else float("nan")})
    return rows
