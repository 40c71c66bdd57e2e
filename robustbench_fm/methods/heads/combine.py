"""Rules that combine the heads of an encoder panel on the same rows (candor.md Table 4;
candor_v1.md Table 4 "Best (of 11)").

Inputs are aligned matrices with one column per head (encoder): test ``pred`` (bool) / ``prob``
and, for the rules fitted on validation, the heads' validation probabilities and labels.

* single head: each head's own prediction (the table reports the mean of the heads' rates);
* head chosen on validation: the head with the highest validation AUROC;
* majority vote: positive iff more than half of the heads predict positive;
* mean probability: the mean of the heads' probabilities, thresholded at 0.800 validation
  sensitivity like a head (:mod:`.operating_point`);
* stacked logistic regression: a logistic regression on the heads' validation logits (sklearn,
  L2, C = 1), its probability thresholded at 0.800 validation sensitivity;
* OR rule: positive iff any head predicts positive;
* oracle selector: per image whichever head is right, i.e. right iff any head is right (it needs
  the label: an upper bound, not a rule); scored in :func:`.tables.table4_errors`, where it errs
  only where every head errs.
"""
from __future__ import annotations

import numpy as np
from scipy.special import logit as logit_fn
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from .operating_point import threshold_at_sensitivity


def majority_vote(pred: np.ndarray) -> np.ndarray:
    """Positive iff strictly more than half of the heads (columns) predict positive."""
    pred = np.asarray(pred, bool)
    return pred.sum(axis=1) > pred.shape[1] / 2


def or_rule(pred: np.ndarray) -> np.ndarray:
    """Positive iff any head predicts positive."""
    return np.asarray(pred, bool).any(axis=1)


def choose_on_validation(val_prob: np.ndarray, val_labels) -> int:
    """Column of the head with the highest validation AUROC (first on ties)."""
    return int(np.argmax([roc_auc_score(val_labels, col) for col in np.asarray(val_prob).T]))


def mean_probability(val_prob, val_labels, prob, sensitivity: float = 0.8) -> np.ndarray:
    """Mean of the heads' probabilities ≥ its threshold at ``sensitivity`` on validation."""
    t = threshold_at_sensitivity(val_labels, np.mean(val_prob, axis=1), sensitivity)
    return np.mean(prob, axis=1) >= t


def stacked_logistic(val_prob, val_labels, prob, sensitivity: float = 0.8, seed: int = 42) -> np.ndarray:
    """Logistic regression on the heads' validation logits, thresholded at ``sensitivity``."""
    clip = 1e-7
    z_val, z = (logit_fn(np.clip(np.asarray(p, np.float64), clip, 1 - clip)) for p in (val_prob, prob))
    model = LogisticRegression(max_iter=1000, random_state=seed).fit(z_val, np.asarray(val_labels) == 1)
    t = threshold_at_sensitivity(val_labels, model.decision_function(z_val), sensitivity)
    return model.decision_function(z) >= t
