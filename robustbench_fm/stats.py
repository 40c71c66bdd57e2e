"""Resampling statistics shared by the stages."""
from __future__ import annotations

import numpy as np
import pandas as pd


def cluster_bootstrap_ratio(numer: np.ndarray, denom: np.ndarray, clusters, n_boot: int,
                            rng: np.random.Generator, max_draws: int = 2_000_000) -> np.ndarray:
    """Bootstrap distribution of Σnumer / Σdenom resampling whole clusters with replacement.

    With ``denom`` = 1 per unit this is the clustered bootstrap of a mean (e.g. the discordance
    rate over queries, clustered by patient, candor.md "Reporting"). Each resample draws as many
    clusters as there are, uniformly with replacement (``rng.integers``), and sums their
    per-cluster totals; resamples are drawn in chunks of at most ``max_draws`` cluster draws.
    Returns ``n_boot`` values.
    """
    codes, _ = pd.factorize(pd.Series(clusters), sort=True)
    n_clusters = int(codes.max()) + 1 if len(codes) else 0
    if n_clusters == 0:
        return np.full(n_boot, np.nan)
    num = np.bincount(codes, weights=np.asarray(numer, float), minlength=n_clusters)
    den = np.bincount(codes, weights=np.asarray(denom, float), minlength=n_clusters)
    out = np.empty(n_boot)
    chunk = max(1, max_draws // n_clusters)
    for start in range(0, n_boot, chunk):
        draws = rng.integers(0, n_clusters, size=(min(chunk, n_boot - start), n_clusters), dtype=np.int32)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[start:start + len(draws)] = num[draws].sum(axis=1) / den[draws].sum(axis=1)
    return out


def summarize_bootstrap(boot: np.ndarray, level: float = 0.95) -> dict:
    """± value (SD over resamples) and the percentile interval at ``level``."""
    boot = boot[np.isfinite(boot)]
    if len(boot) < 2:
        return {"sd": np.nan, "ci_low": np.nan, "ci_high": np.nan}
    lo, hi = np.percentile(boot, [50 * (1 - level), 100 - 50 * (1 - level)])
    return {"sd": float(boot.std(ddof=1)), "ci_low": float(lo), "ci_high": float(hi)}
