"""One head for one finding, end to end: labelled rows of the shared draw → train → operating
point on validation → test AUROC with its patient-clustered interval (candor.md
"Implementation", "Reporting")."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.special import expit

from ...core.stats import auroc_with_ci, few_clusters
from .operating_point import rates, threshold_at_sensitivity
from .rows import HeadRows
from .train import TrainedHead, train_head

SUMMARY_COLUMNS = ["finding", "head", "auroc", "auroc_ci_low", "auroc_ci_high", "val_auroc", "threshold",
                   "threshold_logit", "val_sensitivity", "test_sensitivity", "test_specificity", "n",
                   "n_train", "n_val", "reason", "note"]
#: ``cluster``: the row's bootstrap cluster (``cluster_col``, else its sample_id), for paired comparisons
PER_SAMPLE_COLUMNS = ["sample_id", "finding", "split", "label", "prob", "logit", "pred", "cluster"]


@dataclass
class FindingFit:
    """A finding's head, its threshold (on the logit) and the labelled rows it used."""

    finding: str
    summary: dict
    head: TrainedHead | None = None
    threshold_logit: float = np.nan
    train: np.ndarray = field(default_factory=lambda: np.zeros(0, int))
    val: np.ndarray = field(default_factory=lambda: np.zeros(0, int))
    test: np.ndarray = field(default_factory=lambda: np.zeros(0, int))
    cluster_col: str = "patient_id"

    def scores(self, features: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(logit, prediction at the operating point) of manifest rows ``rows``."""
        logit = self.head.logits(features[rows])
        return logit, logit >= self.threshold_logit

    def per_sample(self, features: np.ndarray, manifest: pd.DataFrame, split: np.ndarray,
                   rows: np.ndarray | None = None) -> pd.DataFrame:
        """Validation and test rows (or ``rows``) with label, probability, logit and prediction."""
        if self.head is None:
            return pd.DataFrame(columns=PER_SAMPLE_COLUMNS)
        rows = np.concatenate([self.val, self.test]) if rows is None else rows
        logit, pred = self.scores(features, rows)
        return pd.DataFrame({"sample_id": manifest["sample_id"].to_numpy()[rows], "finding": self.finding,
                             "split": split[rows], "label": manifest[self.finding].to_numpy()[rows],
                             "prob": expit(logit), "logit": logit, "pred": pred,
                             "cluster": _clusters(manifest, self.cluster_col)[rows]})


def _clusters(manifest: pd.DataFrame, cluster_col: str) -> np.ndarray:
    """Each row's bootstrap cluster: ``cluster_col``, or the sample_id where the manifest has none."""
    return manifest[cluster_col if cluster_col in manifest.columns else "sample_id"].astype(str).to_numpy()


def _labelled(manifest: pd.DataFrame, finding: str, rows: np.ndarray) -> np.ndarray:
    return rows[np.isin(manifest[finding].to_numpy()[rows], (0.0, 1.0))]


def fit_finding(features: np.ndarray, manifest: pd.DataFrame, finding: str, rows: HeadRows,
                head: str = "linear", seed: int = 42, sensitivity: float = 0.8, cluster_col: str = "patient_id",
                n_boot: int = 1000, device="auto", **train_options) -> FindingFit:
    """Train the ``head`` of ``finding`` on the drawn training rows labelled for it, fix the
    threshold at ``sensitivity`` on the labelled validation rows and score the drawn test rows.
    A finding lacking a class in a split gets a summary row whose ``reason`` says so."""
    train, val, test = (_labelled(manifest, finding, r) for r in (rows.train, rows.val, rows.test))
    y = manifest[finding].to_numpy()
    summary = dict.fromkeys(SUMMARY_COLUMNS, np.nan) | dict(finding=finding, head=head, n=len(test),
                                                             n_train=len(train), n_val=len(val), reason="",
                                                             note="")
    for name, part in (("training", train), ("validation", val), ("test", test)):
        if len(np.unique(y[part])) < 2:
            summary["reason"] = f"the {name} rows lack positives or negatives ({len(part)} labelled rows)"
            return FindingFit(finding, summary)
    model = train_head(features[train], y[train], kind=head, seed=seed, device=device, **train_options)
    fit = FindingFit(finding, summary, model, train=train, val=val, test=test, cluster_col=cluster_col)
    val_logit = model.logits(features[val])
    fit.threshold_logit = threshold_at_sensitivity(y[val], val_logit, sensitivity)
    test_logit, test_pred = fit.scores(features, test)
    clusters = _clusters(manifest, cluster_col)[test]
    sens, spec = rates(y[test], test_pred)
    summary.update(auroc_with_ci(y[test], test_logit, clusters, n_boot, seed),
                   val_auroc=auroc_with_ci(y[val], val_logit, None, 0)["auroc"],
                   threshold=float(expit(fit.threshold_logit)), threshold_logit=fit.threshold_logit,
                   val_sensitivity=rates(y[val], val_logit >= fit.threshold_logit)[0],
                   test_sensitivity=sens, test_specificity=spec,
                   note=few_clusters(len(np.unique(clusters)), cluster_col) if n_boot else "")
    return fit
