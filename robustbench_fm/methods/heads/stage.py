"""Trained heads on frozen features, one per binary finding (candor.md "Implementation",
"Baselines": "The test AUROC of the trained linear head is the usual criterion for choosing an
encoder"; candor_v1.md: a linear readout (primary) and a 256-unit hidden layer).

Registered twice: ``linear_head`` and ``mlp_head`` (:class:`~robustbench_fm.methods.heads.params.HeadParams`
and ``MlpHeadParams``, whose ``head`` is mlp).

Rows (:mod:`robustbench_fm.methods.heads.rows`): at most ``max_train`` training and ``max_test`` test rows
drawn once by a stable hash of sample_id (identical for every encoder: paired comparisons), the
validation split from the manifest or carved out by a stable hash of the patient. Training
(:mod:`robustbench_fm.methods.heads.train`): Adam, ``epochs`` = 30, ``lr`` = 1e-3, ``weight_decay`` = 1e-4,
``batch_size`` = 256, seeded, on ``device``. Operating point: the largest threshold with
validation sensitivity ≥ ``sensitivity`` = 0.800 (a score equal to it is positive).

``summary`` columns: finding, head, auroc, auroc_ci_low, auroc_ci_high (test AUROC with the
95% interval of ``n_boot`` patient-clustered resamples), val_auroc, threshold (probability),
threshold_logit, val_sensitivity, test_sensitivity, test_specificity, n (labelled test rows),
n_train, n_val, reason (why a finding could not be scored).
``per_sample`` columns: sample_id, finding, split (val / test), label, prob, logit, pred.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ...core.results import Results
from .. import missing_column
from .fit import PER_SAMPLE_COLUMNS, fit_finding
from .params import HeadParams
from .rows import draw_rows

PARAMS = HeadParams


def check_params(**params) -> HeadParams:
    """Refuse unknown, mistyped or inconsistent options before any heavy work (one line each;
    :class:`~robustbench_fm.methods.heads.params.HeadParams`)."""
    return PARAMS.parse(params)


def run(features: np.ndarray, manifest: pd.DataFrame, finding: str, params: HeadParams | None = None,
        **kw) -> Results:
    """The ``head`` of ``finding`` trained and tested on the shared rows (module doc); ``params``:
    :class:`~robustbench_fm.methods.heads.params.HeadParams` (``head`` defaults to linear here;
    ``stage=mlp_head`` sets mlp)."""
    p = PARAMS.parse(params, **kw)
    head, max_train, max_test, seed, cluster_col = p.head, p.max_train, p.max_test, p.seed, p.cluster_col
    params = {"finding": finding, **{n: v for n, v in p.to_dict().items() if n != "device"}}
    if finding not in manifest.columns:
        raise missing_column("heads", finding, "finding", manifest.columns)
    rows = draw_rows(manifest, max_train, max_test, seed, cluster_col, p.val_fraction, p.test_fraction)
    fit = fit_finding(features, manifest, finding, rows, head=head, seed=seed, sensitivity=p.sensitivity,
                      cluster_col=cluster_col, n_boot=p.n_boot, device=p.device, epochs=p.epochs, lr=p.lr,
                      weight_decay=p.weight_decay, batch_size=p.batch_size, hidden=p.hidden)
    per = fit.per_sample(features, manifest, rows.split)
    return Results(summary=pd.DataFrame([fit.summary]), per_sample=per[PER_SAMPLE_COLUMNS], params=params)
