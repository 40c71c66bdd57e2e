"""LogME of the frozen features for each finding (candor.md "Baselines": "LogME [8] scores the
frozen features without a trained head"; :mod:`robustbench_fm.methods.heads.logme`).

Scored on the labelled rows of the heads' training draw (:mod:`robustbench_fm.methods.heads.rows`: at most
``max_train`` training rows by a stable hash of sample_id, the same for every encoder), so LogME
and the head AUROC describe the same images. Features are used as extracted (LogME's own
convention, no standardisation).

``summary`` columns: finding, logme, alpha_pos, beta_pos (α, β of the positive one-hot target),
n, n_pos, reason.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ...core.results import Results
from .. import missing_column
from .logme import fit_evidence
from .params import LogmeParams
from .rows import draw_rows

PARAMS = LogmeParams


def check_params(**params) -> LogmeParams:
    """Refuse unknown, mistyped or inconsistent options before any heavy work
    (:class:`~robustbench_fm.methods.heads.params.LogmeParams`)."""
    return PARAMS.parse(params)


def run(features: np.ndarray, manifest: pd.DataFrame, finding: str, params: LogmeParams | None = None,
        **kw) -> Results:
    """LogME of ``finding`` on the drawn training rows (module doc); ``params``:
    :class:`~robustbench_fm.methods.heads.params.LogmeParams`."""
    p = PARAMS.parse(params, **kw)
    params = {"finding": finding, **p.to_dict()}
    if finding not in manifest.columns:
        raise missing_column("logme", finding, "finding", manifest.columns)
    train = draw_rows(manifest, p.max_train, 1, p.seed, p.cluster_col, p.val_fraction, p.test_fraction).train
    y = manifest[finding].to_numpy()[train]
    train, y = train[np.isin(y, (0.0, 1.0))], y[np.isin(y, (0.0, 1.0))]
    row = dict(finding=finding, logme=np.nan, alpha_pos=np.nan, beta_pos=np.nan, n=len(y),
               n_pos=int((y == 1).sum()), reason="")
    if len(np.unique(y)) < 2:
        row["reason"] = f"the training rows lack positives or negatives ({len(y)} labelled rows)"
    else:
        evidence, alpha, beta = fit_evidence(features[train], np.stack([y != 1, y == 1], 1).astype(np.float64))
        row.update(logme=float(evidence.mean()), alpha_pos=float(alpha[1]), beta_pos=float(beta[1]))
    return Results(summary=pd.DataFrame([row]), per_sample=None, params=params)
