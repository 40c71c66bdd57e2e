"""Scores that should be high on a head's errors (candor.md "Baselines", "Discordance and Head
Errors", Ablation (3)). Every function returns one score per test row; higher = more likely wrong.

* confidence (Ablation (3); Hendrycks & Gimpel 2017, Liu et al. 2020), computed from the head's
  OUTPUTS, its logits, never from its decision at the operating point: with logits z_1..z_C,
  maximum softmax probability max_c softmax(z)_c (scored as −log MSP = logsumexp(z) − max_c z_c,
  the same order without float saturation), maximum logit max_c z_c and energy
  −logsumexp(z); the error scores are −log MSP, −max logit and energy. A binary head has one
  logit z (P(positive) = σ(z)); its two class logits are taken centred, (−z/2, z/2) (the
  softmax of any (a, a + z) is the same, and centring is the one choice that does not favour a
  class), so MSP = σ(|z|), max logit = |z|/2, energy = −logsumexp(±z/2): all three are monotone
  in |z| and their AUROCs agree up to float ties ("monotone transforms of the single logit of a
  binary head", Ablation (3)). On a multi-class head (logits of shape (N, C), C > 2) they are
  different functions of z and their AUROCs may differ (the paper: ≤ 0.005 over 2,532
  combinations);
* deep-ensemble disagreement: the standard deviation of the members' probabilities;
* Mahalanobis distance (Lee et al. 2018): class-conditional Gaussians of the training features
  with a shared covariance, the distance to the nearest class mean;
* k-NN distance (Sun et al. 2022): the Euclidean distance of the L2-normalised feature to its
  k-th nearest L2-normalised training feature;
* DM proxy: DM_g computed with the head's prediction in place of the label, c_other − c_pred,
  with c± the mean cosine similarity to the k nearest of equal-size positive / negative
  training banks of the query's matched group.
"""
from __future__ import annotations

import numpy as np
import torch
from scipy.special import logsumexp

from ...core.devices import resolve_device
from ...core.neighbors import l2_normalize, mean_topk_similarity, topk_similarity

CONFIDENCE = ("msp", "max_logit", "energy")


def confidence_scores(logits) -> dict[str, np.ndarray]:
    """Error scores (higher = less confident) of the three confidence measures from the head's
    logits: shape (N,) for a binary head's single logit, (N, C) for a C-class head (module doc)."""
    z = np.asarray(logits, np.float64)
    if z.ndim == 1:  # a binary head's one logit: its centred class logits (-z/2, z/2)
        z = np.stack([-z / 2, z / 2], axis=1)
    if z.ndim != 2 or z.shape[1] < 2:
        raise ValueError(f"confidence scores: logits of shape {z.shape}; give (N,) for a binary head "
                         "or (N, C) with C >= 2 classes")
    top = z.max(axis=1)
    rest = z - top[:, None]
    rest[np.arange(len(z)), z.argmax(axis=1)] = -np.inf
    others = logsumexp(rest, axis=1)  # log Σ_{c ≠ top} exp(z_c − z_top)
    return {"msp": np.logaddexp(0.0, others),  # −log MSP = log(1 + Σ_{c ≠ top} e^{z_c − z_top}), no saturation
            "max_logit": -top,
            "energy": -(top + np.logaddexp(0.0, others))}  # −logsumexp(z)


def ensemble_disagreement(member_probs: np.ndarray) -> np.ndarray:
    """Standard deviation over the members (rows of ``member_probs``, shape (M, N))."""
    return np.asarray(member_probs, np.float64).std(axis=0)


def mahalanobis(train: np.ndarray, train_labels, test: np.ndarray, rcond: float = 1e-10) -> np.ndarray:
    """min_c (x − μ_c)ᵀ Σ⁺ (x − μ_c) with class means μ_c and the pooled within-class covariance Σ
    of the training rows (pseudo-inverse over eigenvalues above ``rcond`` × the largest)."""
    train, test = np.asarray(train, np.float64), np.asarray(test, np.float64)
    y = np.asarray(train_labels) == 1
    means = np.stack([train[~y].mean(0), train[y].mean(0)])
    centred = train - means[y.astype(int)]
    eigval, eigvec = np.linalg.eigh(centred.T @ centred / len(train))
    keep = eigval > rcond * eigval.max()
    whiten = eigvec[:, keep] / np.sqrt(eigval[keep])
    zt, zm = test @ whiten, means @ whiten
    dist = (zt ** 2).sum(1)[:, None] - 2 * zt @ zm.T + (zm ** 2).sum(1)[None, :]
    return dist.min(axis=1)


def knn_distance(train: np.ndarray, test: np.ndarray, k: int = 50, device="auto") -> np.ndarray:
    """‖z − z_(k)‖ to the k-th nearest training row, z = x/‖x‖ (Sun et al. 2022)."""
    feats = torch.as_tensor(l2_normalize(np.concatenate([train, test])), device=resolve_device(device))
    k = min(k, len(train))
    sims, _ = topk_similarity(feats, np.arange(len(train), len(feats)), np.arange(len(train)), k)
    return np.sqrt(np.clip(2.0 - 2.0 * sims[:, -1].double().cpu().numpy(), 0.0, None))


def dm_proxy(feats: torch.Tensor, pred, test_rows: np.ndarray, bank_pos: np.ndarray, bank_neg: np.ndarray,
             k: int = 5) -> np.ndarray:
    """c_neg − c_pos for rows predicted positive and c_pos − c_neg for the others (module doc);
    ``feats`` is the L2-normalised feature matrix on the device, the row arrays index it."""
    c_pos = mean_topk_similarity(feats, test_rows, bank_pos, k)
    c_neg = mean_topk_similarity(feats, test_rows, bank_neg, k)
    return np.where(np.asarray(pred, bool), c_neg - c_pos, c_pos - c_neg)
