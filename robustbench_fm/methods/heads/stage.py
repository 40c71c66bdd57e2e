"""Trained heads on frozen features, one per binary finding (candor.md "Implementation",
"Baselines": "The test AUROC of the trained linear head is the usual criterion for choosing an
encoder"; candor_v1.md: a linear readout (primary) and a 256-unit hidden layer).

Registered twice: ``linear_head`` and ``mlp_head`` (configs/stage/*.yaml set ``head``).

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
from .fit import PER_SAMPLE_COLUMNS, fit_finding
from .rows import draw_rows
from .train import HEADS


def check_params(head: str = "linear", max_train: int = 25_000, max_test: int = 20_000, epochs: int = 30,
                 batch_size: int = 256, sensitivity: float = 0.8, n_boot: int = 1000,
                 val_fraction: float = 0.1, test_fraction: float = 0.2, **_) -> None:
    """Refuse inconsistent options before any heavy work (one line each)."""
    if head not in HEADS:
        raise ValueError(f"heads: head='{head}' is not one of {', '.join(HEADS)}; set stage.params.head")
    for name, value in (("max_train", max_train), ("max_test", max_test), ("epochs", epochs),
                        ("batch_size", batch_size)):
        if value < 1:
            raise ValueError(f"heads: {name}={value} must be at least 1")
    if not 0 < sensitivity <= 1:
        raise ValueError(f"heads: sensitivity={sensitivity} must be in (0, 1]")
    if n_boot < 0:
        raise ValueError(f"heads: n_boot={n_boot} must be 0 or more")
    if val_fraction <= 0 or test_fraction <= 0 or val_fraction + test_fraction >= 1:
        raise ValueError(f"heads: val_fraction={val_fraction} and test_fraction={test_fraction} must be "
                         "positive with a sum below 1")


def run(features: np.ndarray, manifest: pd.DataFrame, finding: str, head: str = "linear",
        max_train: int = 25_000, max_test: int = 20_000, epochs: int = 30, lr: float = 1e-3,
        weight_decay: float = 1e-4, batch_size: int = 256, hidden: int = 256, sensitivity: float = 0.8,
        seed: int = 42, cluster_col: str = "patient_id", n_boot: int = 1000, val_fraction: float = 0.1,
        test_fraction: float = 0.2, device="auto") -> Results:
    """The ``head`` of ``finding`` trained and tested on the shared rows (module doc)."""
    params = dict(finding=finding, head=head, max_train=max_train, max_test=max_test, epochs=epochs, lr=lr,
                  weight_decay=weight_decay, batch_size=batch_size, hidden=hidden, sensitivity=sensitivity,
                  seed=seed, cluster_col=cluster_col, n_boot=n_boot, val_fraction=val_fraction,
                  test_fraction=test_fraction)
    check_params(**params)
    if finding not in manifest.columns:
        from .. import missing_column
        raise missing_column("heads", finding, "finding", manifest.columns)
    rows = draw_rows(manifest, max_train, max_test, seed, cluster_col, val_fraction, test_fraction)
    fit = fit_finding(features, manifest, finding, rows, head=head, seed=seed, sensitivity=sensitivity,
                      cluster_col=cluster_col, n_boot=n_boot, device=device, epochs=epochs, lr=lr,
                      weight_decay=weight_decay, batch_size=batch_size, hidden=hidden)
    per = fit.per_sample(features, manifest, rows.split)
    return Results(summary=pd.DataFrame([fit.summary]), per_sample=per[PER_SAMPLE_COLUMNS], params=params)
