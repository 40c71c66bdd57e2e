"""Handing a feature matrix over (no torch: the registry and ``list`` import it): a holder that
will not read a matrix again marks it, and :func:`robustbench_fm.core.neighbors.l2_normalize`
then scales it in place instead of into a copy (issue 31 item 7)."""
from __future__ import annotations

import numpy as np


class HandedOver(np.ndarray):
    """A feature matrix its holder will not read again (:func:`hand_over`):
    :func:`~robustbench_fm.core.neighbors.l2_normalize` scales it to unit rows in place."""


def hand_over(x: np.ndarray) -> HandedOver:
    """``x`` marked as handed over (a view: no copy). Only a holder that will not read ``x`` again
    marks it: a job's freshly loaded features, given to a stage that declares
    ``overwrites_features`` (:class:`robustbench_fm.methods.Method`), so the job holds one copy of
    the matrix instead of two (issue 31 item 7)."""
    return np.asarray(x).view(HandedOver)
