"""SPAR-Bench metrics (spar.md Section 3.1): Level 1 mean Euclidean distance (MED, px) and success
detection rate at 10 px, Level 2 patch and full-permutation accuracy over present organs, Level 3
per-probe accuracy and its macro average, each with its chance level."""
from __future__ import annotations

import numpy as np


def localization(pred_px: np.ndarray, true_px: np.ndarray, present: np.ndarray,
                 threshold: float = 10.0) -> dict:
    """MED and SDR@threshold over present organs of predicted vs true centroids [N, 16, 2] (px),
    plus per-slot MED [16] (NaN for a slot never present)."""
    dist = np.linalg.norm(np.asarray(pred_px, float) - np.asarray(true_px, float), axis=-1)
    counts = present.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_slot = np.where(counts > 0, np.where(present, dist, 0.0).sum(0) / counts, np.nan)
    d = dist[present]
    return {"med": float(d.mean()), "sdr": float((d <= threshold).mean()), "n": int(present.sum()),
            "per_slot_med": per_slot}


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
