"""LogME (You et al., ICML 2021, "LogME: Practical Assessment of Pre-trained Models for Transfer
Learning"): the log marginal likelihood of a target under Bayesian linear regression on the frozen
features, maximised over the prior precision α and the noise precision β.

For features F (N × D) and a target y, the evidence is
  log p(y | F, α, β) = log N(y | 0, β⁻¹ I + α⁻¹ F Fᵀ)
    = D/2 log α + N/2 log β − ½ Σ_i log(α + β σ_i) − β/2 ‖y − F m‖² − α/2 ‖m‖² − N/2 log 2π,
with σ_i the D eigenvalues of FᵀF and m = β (α I + β FᵀF)⁻¹ Fᵀ y the posterior mean. α and β are
found by the paper's fixed-point iteration (γ = Σ βσ_i/(α + βσ_i), α ← γ/‖m‖², β ← (N − γ)/‖y − Fm‖²,
at most 11 steps, stop when α/β changes by less than 1%). The evidence is then evaluated exactly
at the final (α, β) (the reference code reuses the previous step's m) and divided by N. A binary
finding is scored as the paper scores classification: the mean over the one-hot targets
[y = 0] and [y = 1].

Everything is computed in the eigenbasis of the Gram matrix of the smaller side, vectorised over
targets (columns of ``targets``).
"""
from __future__ import annotations

import numpy as np


def _spectrum(features: np.ndarray, targets: np.ndarray):
    """(σ_i of FᵀF padded to D, projections x = Uᵀy (r × T), ‖y‖² − ‖x‖², N, D)."""
    f = np.asarray(features, np.float64)
    n, d = f.shape
    if n >= d:
        sigma, v = np.linalg.eigh(f.T @ f)
        keep = sigma > sigma.max() * 1e-12
        x = (v[:, keep].T @ (f.T @ targets)) / np.sqrt(sigma[keep])[:, None]
    else:
        sigma, u = np.linalg.eigh(f @ f.T)
        keep = sigma > sigma.max() * 1e-12
        x = u[:, keep].T @ targets
    s = sigma[keep]
    residual = np.clip((targets ** 2).sum(0) - (x ** 2).sum(0), 0.0, None)
    return s, x, residual, n, d


def _terms(s, x, residual, alpha, beta):
    """γ, ‖m‖² and ‖y − Fm‖² at (α, β) for every target."""
    denom = alpha + beta * s[:, None]
    gamma = (beta * s[:, None] / denom).sum(0)
    m2 = (beta ** 2 * s[:, None] * x ** 2 / denom ** 2).sum(0)
    res2 = (alpha ** 2 * x ** 2 / denom ** 2).sum(0) + residual
    return gamma, m2, res2


def log_evidence(s, x, residual, n, d, alpha, beta) -> np.ndarray:
    """log p(y | F, α, β) / N for every target (module doc), from :func:`_spectrum`'s terms."""
    _, m2, res2 = _terms(s, x, residual, alpha, beta)
    log_det = np.log(alpha + beta * s[:, None]).sum(0) + (d - len(s)) * np.log(alpha)
    ev = (d / 2 * np.log(alpha) + n / 2 * np.log(beta) - 0.5 * log_det - beta / 2 * res2 - alpha / 2 * m2
          - n / 2 * np.log(2 * np.pi))
    return ev / n


def fit_evidence(features: np.ndarray, targets: np.ndarray, max_iter: int = 11,
                 tol: float = 0.01) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(evidence / N, α, β) for each column of ``targets`` (N × T) after the fixed point."""
    targets = np.asarray(targets, np.float64).reshape(len(features), -1)
    s, x, residual, n, d = _spectrum(features, targets)
    alpha, beta = np.ones(targets.shape[1]), np.ones(targets.shape[1])
    active = np.ones(targets.shape[1], bool)
    for _ in range(max_iter):
        gamma, m2, res2 = _terms(s, x, residual, alpha, beta)
        new_alpha, new_beta = gamma / (m2 + 1e-5), (n - gamma) / (res2 + 1e-5)
        change = np.abs(new_alpha / new_beta - alpha / beta) / (alpha / beta)
        alpha, beta = np.where(active, new_alpha, alpha), np.where(active, new_beta, beta)
        active &= change >= tol
        if not active.any():
            break
    return log_evidence(s, x, residual, n, d, alpha, beta), alpha, beta


def logme(features: np.ndarray, labels) -> float:
    """LogME of binary ``labels`` (0/1): the mean evidence of the two one-hot targets."""
    y = np.asarray(labels) == 1
    return float(fit_evidence(features, np.stack([~y, y], axis=1).astype(np.float64))[0].mean())
