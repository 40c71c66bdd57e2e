"""Mantel-Haenszel risk difference over strata (candor.md "Discordance and Head Errors": the
difference of the miss rates of discordant and other positives, stratified by encoder × finding).

Stratum i has n1_i exposed units (discordant positives) with a1_i events (misses) and n0_i
unexposed units (other positives) with a0_i events, T_i = n1_i + n0_i. Then
  RD_MH = Σ (a1_i n0_i − a0_i n1_i)/T_i  /  Σ n1_i n0_i / T_i.
Its variance is Sato's estimator (T. Sato, "On the variance estimator for the Mantel-Haenszel
risk difference", Biometrics 45:1323-1324, 1989), the Greenland-Robins (1985) estimator corrected
to be consistent both for many sparse strata and for few large ones (as given in Rothman,
Greenland & Lash, Modern Epidemiology, 3rd ed., ch. 15):
  Var = (RD_MH Σ P_i + Σ Q_i) / (Σ n1_i n0_i / T_i)²,
  P_i = (n1_i² a0_i − n0_i² a1_i + n1_i n0_i (n0_i − n1_i)/2) / T_i²,
  Q_i = (a1_i (n0_i − a0_i) + a0_i (n1_i − a1_i)) / (2 T_i).
Strata missing either group carry no information and are dropped.
"""
from __future__ import annotations

import numpy as np


def mantel_haenszel_rd(a1, n1, a0, n0) -> dict:
    """RD_MH, Sato's variance, its SE and the number of informative strata (arrays per stratum)."""
    a1, n1, a0, n0 = (np.asarray(v, np.float64) for v in (a1, n1, a0, n0))
    keep = (n1 > 0) & (n0 > 0)
    a1, n1, a0, n0 = a1[keep], n1[keep], a0[keep], n0[keep]
    t = n1 + n0
    weight = (n1 * n0 / t).sum()
    if weight == 0:
        return dict(rd=np.nan, var=np.nan, se=np.nan, n_strata=0)
    rd = ((a1 * n0 - a0 * n1) / t).sum() / weight
    p = (n1 ** 2 * a0 - n0 ** 2 * a1 + n1 * n0 * (n0 - n1) / 2) / t ** 2
    q = (a1 * (n0 - a0) + a0 * (n1 - a1)) / (2 * t)
    var = (rd * p.sum() + q.sum()) / weight ** 2
    return dict(rd=float(rd), var=float(var), se=float(np.sqrt(max(var, 0.0))), n_strata=int(keep.sum()))
