"""The operating point of a head (candor.md "Implementation": "We fix the operating point of each
finding at 0.800 sensitivity on the validation split").

Tie convention: a row is predicted positive iff its score is ≥ the threshold (a score equal to
the threshold is positive). The threshold is the largest value whose validation sensitivity is
at least the target, i.e. the ⌈target·P⌉-th largest positive validation score (P positives):
any larger threshold drops the sensitivity below the target, so among the thresholds that meet
the target it has the fewest false positives.
"""
from __future__ import annotations

import math

import numpy as np

from ...core.errors import InvalidSetting


def threshold_at_sensitivity(labels, scores, target: float = 0.8) -> float:
    """The largest t with mean(scores[labels == 1] ≥ t) ≥ ``target`` (module doc)."""
    pos = np.sort(np.asarray(scores, np.float64)[np.asarray(labels) == 1])[::-1]
    if len(pos) == 0:
        raise InvalidSetting("operating point: no positive validation row; the finding needs labelled "
                         "positives in the validation split")
    need = max(1, math.ceil(round(target * len(pos), 9)))
    return float(pos[need - 1])


def rates(labels, pred) -> tuple[float, float]:
    """(sensitivity, specificity) of boolean predictions; NaN when a class is absent."""
    labels, pred = np.asarray(labels) == 1, np.asarray(pred, bool)
    sens = pred[labels].mean() if labels.any() else np.nan
    spec = (~pred[~labels]).mean() if (~labels).any() else np.nan
    return float(sens), float(spec)
