"""Rank and slope tests over CANDOR's encoder panels (candor.md "Chest Encoders and the Choice of
Candidate Sets", "Occlusion Retention and Discordance", "Ablation Studies"; "Reporting": every
family of p-values is corrected with Benjamini-Hochberg FDR control at 0.05).

* :func:`rank_correlation`: Spearman correlation of two scores over encoders, either once or per
  group (e.g. per finding) and then averaged ("Averaged over the 12 findings, the encoder ranking
  by head AUROC has a Spearman correlation of 0.513 with the ranking by −D");
* :func:`slope_test`: least-squares slope of y on x and its two-sided p-value (D vs release year,
  D vs finding size);
* :func:`association_family`: the chest family of the paper (head AUROC vs −D, D_all vs D, head
  AUROC vs LogME, D/D_all vs number of positives, retention and standardised retention vs D over the
  trained encoders, slopes of D on release year and finding size and of D_all on the number of
  positives), BH-corrected together. A test over fewer than :data:`MIN_TEST_N` encoders (or, for
  the tests over combinations, combinations) gets no p-value and a ``note`` instead: with n = 3 a
  perfect ranking has p = 0 by scipy's t approximation, which would read as significant.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from ...core.stats import FDR_ALPHA, bh_adjust


def spearman(x, y) -> tuple[float, float, int]:
    """Spearman ρ, its two-sided p-value and n over the pairs where both values are finite."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = np.isfinite(x) & np.isfinite(y)
    if keep.sum() < 3 or np.ptp(x[keep]) == 0 or np.ptp(y[keep]) == 0:  # ρ undefined for a constant
        return np.nan, np.nan, int(keep.sum())
    res = stats.spearmanr(x[keep], y[keep])
    return float(res.statistic), float(res.pvalue), int(keep.sum())


def rank_correlation(frame: pd.DataFrame, a: str, b: str, by: str | None = None) -> dict:
    """Spearman ρ of columns ``a`` and ``b`` (one row per encoder). With ``by``, ρ is computed in
    each group and ``rho`` is their mean (``p`` is then NaN: a mean of dependent ρ has no p-value
    from spearmanr); ``n`` is the number of rows or of groups."""
    for col in (a, b, *([by] if by else [])):
        if col not in frame.columns:
            raise ValueError(f"rank_correlation: column '{col}' missing; have {list(frame.columns)}")
    if by is None:
        rho, p, n = spearman(frame[a], frame[b])
        return dict(rho=rho, p=p, n=n)
    rhos = [spearman(part[a], part[b])[0] for _, part in frame.groupby(by, sort=True)]
    rhos = [r for r in rhos if np.isfinite(r)]
    return dict(rho=float(np.mean(rhos)) if rhos else np.nan, p=np.nan, n=len(rhos))


def slope_test(x, y) -> dict:
    """Ordinary least-squares slope of y on x (finite pairs) with its two-sided p-value
    (scipy.stats.linregress: H0 slope = 0)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = np.isfinite(x) & np.isfinite(y)
    if keep.sum() < 3 or np.ptp(x[keep]) == 0:
        return dict(slope=np.nan, intercept=np.nan, r=np.nan, p=np.nan, n=int(keep.sum()))
    res = stats.linregress(x[keep], y[keep])
    return dict(slope=float(res.slope), intercept=float(res.intercept), r=float(res.rvalue),
                p=float(res.pvalue), n=int(keep.sum()))


#: fewest encoders (units) a rank or slope test of :func:`association_family` is run on
MIN_TEST_N = 5
#: the encoders that count as trained (retention and release-year tests): not untrained, not synthetic
UNTRAINED = ("none", "synthetic")


def correct_family(tests: pd.DataFrame, p_col: str = "p", alpha: float = FDR_ALPHA) -> pd.DataFrame:
    """``tests`` with ``p_bh`` (BH-adjusted over the rows with a p-value) and ``significant``."""
    out = tests.copy()
    out["p_bh"], out["significant"] = np.nan, False
    has_p = out[p_col].notna()
    adjusted, rejected = bh_adjust(out.loc[has_p, p_col].to_numpy(float), alpha)
    out.loc[has_p, "p_bh"], out.loc[has_p, "significant"] = adjusted, rejected
    out["significant"] = out["significant"].astype(bool)
    return out


def association_family(encoders: pd.DataFrame, combos: pd.DataFrame) -> pd.DataFrame:
    """The chest association tests of candor.md, BH-corrected as one family.

    ``encoders``: one row per encoder with ``d``, ``d_all``, ``head_auroc``, optional ``logme``,
    ``retention``, ``retention_std``, ``release_year`` and ``objective``; ``combos``: one row per (encoder, finding)
    with ``finding``, ``d``, ``d_all``, ``n_pos`` (positives of the finding), ``head_auroc``, optional ``logme``.
    Rows: quantity, kind (spearman | mean spearman | slope), statistic, p, n, note, p_bh, significant
    (``note``: why a test has no p-value, e.g. "too few encoders (n = 3) for a rank test").
    """
    enc, com = encoders.copy(), combos.copy()
    enc["minus_d"], com["minus_d"] = -enc["d"], -com["d"]
    rows = []

    def units(frame, a, b, by):
        """What the test ranks and how many: encoders (also within each finding), or combinations."""
        keep = frame[[a, b]].notna().all(axis=1)
        if by is not None:
            n = int(frame[keep].groupby(by)["encoder"].nunique().min()) if "encoder" in frame and keep.any() else 0
            return "encoders", n
        return ("combinations" if "finding" in frame.columns else "encoders"), int(keep.sum())

    def spear(name, frame, a, b, by=None):
        if {a, b} <= set(frame.columns):
            res = rank_correlation(frame, a, b, by)
            rows.append(dict(quantity=name, kind="mean spearman" if by else "spearman", statistic=res["rho"],
                             p=res["p"], n=res["n"], units=units(frame, a, b, by)))

    spear("head AUROC vs D (encoders)", enc, "head_auroc", "d")
    spear("D_all vs D (encoders)", enc, "d_all", "d")
    spear("head AUROC vs -D (per finding, mean)", com, "head_auroc", "minus_d", by="finding")
    spear("head AUROC vs LogME (per finding, mean)", com, "head_auroc", "logme", by="finding")
    spear("D_all vs number of positives (combinations)", com, "d_all", "n_pos")
    spear("D vs number of positives (combinations)", com, "d", "n_pos")
    trained = enc[~enc.get("objective", pd.Series("ssl", index=enc.index)).isin(UNTRAINED)]
    spear("retention vs D (trained encoders)", trained, "retention", "d")
    spear("standardised retention vs D (trained encoders)", trained, "retention_std", "d")
    if "release_year" in enc.columns:
        res = slope_test(trained["release_year"], trained["d"])
        rows.append(dict(quantity="D vs release year (trained encoders)", kind="slope", statistic=res["slope"],
                         p=res["p"], n=res["n"], units=("encoders", res["n"])))
    if "n_pos" in com.columns:
        for name, y in (("D vs finding size (combinations)", "d"),
                        ("D_all vs number of positives, slope (combinations)", "d_all")):
            res = slope_test(com["n_pos"], com[y])
            rows.append(dict(quantity=name, kind="slope", statistic=res["slope"], p=res["p"], n=res["n"],
                             units=("combinations", res["n"])))
    tests = pd.DataFrame(rows, columns=["quantity", "kind", "statistic", "p", "n", "units"])
    tests["note"] = ""
    for i, (what, n) in tests["units"].items():
        if 0 < n < MIN_TEST_N:  # refused: no p-value, so no "significant" either (n = 0: nothing to test)
            tests.loc[i, "p"] = np.nan
            test = "slope test" if tests.loc[i, "kind"] == "slope" else "rank test"
            tests.loc[i, "note"] = f"too few {what} (n = {n}) for a {test}"
    return correct_family(tests.drop(columns="units"))
