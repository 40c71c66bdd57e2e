"""The chest failure-detection study's protocol on synthetic sites (candor.md "Discordance and Head
Errors"): heads trained on one site (MIMIC-CXR), r's candidate set from that site's training split
in the view of the query, every site's test rows scored, one stratum per test site."""
import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from robustbench_fm import evaluate
from robustbench_fm.core.neighbors import l2_normalize
from robustbench_fm.methods.heads.rows import draw_first, head_splits

SITES = ("mimic_cxr", "chexpert", "padchest")


def pooled(n_per_site=500, d=12, seed=0):
    """A pooled manifest in data/pool.py's form: prefixed ids, ``dataset``, ``site``, ``view``,
    ``acq_group`` = site_view, per-site splits (MIMIC: train/val/test; CheXpert: train/val, no
    test; PadChest: no split at all). Each site has its own offset: the other sites' rows would
    change r if they entered the candidate set."""
    rng = np.random.default_rng(seed)
    parts = []
    for s, site in enumerate(SITES):
        y = (rng.random(n_per_site) < 0.35).astype(float)
        view = np.where(np.arange(n_per_site) % 3 == 0, "LATERAL", "PA")
        x = rng.normal(size=(n_per_site, d)) + 2.0 * s * np.eye(d)[5]
        x[:, :3] += 1.2 * y[:, None] * (1 if site == "mimic_cxr" else 0.6)
        u = np.arange(n_per_site) // 2 % 10
        split = {"mimic_cxr": np.where(u < 6, "train", np.where(u < 8, "validate", "test")),
                 "chexpert": np.where(u < 8, "train", "val"), "padchest": np.full(n_per_site, None)}[site]
        split = np.where(split == "validate", "val", split)
        parts.append((x, pd.DataFrame({
            "sample_id": [f"{site}/{i}" for i in range(n_per_site)], "dataset": site,
            "patient_id": [f"{site}/p{i // 2}" for i in range(n_per_site)], "site": site, "view": view,
            "acq_group": [f"{site}_{v}" for v in view], "split": split, "f": y})))
    return (np.concatenate([p[0] for p in parts]).astype(np.float32),
            pd.concat([p[1] for p in parts], ignore_index=True))


def test_pooled_splits_are_carved_per_site():
    _, m = pooled()
    split = head_splits(m, seed=42)
    for site in SITES:
        assert set(split[m["dataset"] == site]) == {"train", "val", "test"}
    # MIMIC keeps its own splits; the carve-outs keep patients whole
    mimic = (m["dataset"] == "mimic_cxr").to_numpy()
    assert (split[mimic] == m.loc[mimic, "split"].to_numpy()).all()
    assert pd.Series(split).groupby(m["patient_id"]).nunique().max() == 1


def test_mimic_trained_heads_are_scored_on_every_sites_test_rows_without_leakage():
    x, m = pooled()
    res = evaluate("error_detection", x, m, finding="f", train_on="mimic_cxr", n_boot=50, epochs=5,
                   n_members=2, knn_k=10, max_test=60, device="cpu")
    per, summ = res.per_sample, res.summary
    split = head_splits(m, seed=42)
    ids = m["sample_id"].to_numpy()
    position = pd.Series(np.arange(len(m)), index=ids)
    rows = position[per["sample_id"]].to_numpy()
    # every scored row is a test row; per site exactly its stable-hash draw of <= max_test labelled test rows
    assert (split[rows] == "test").all()
    assert set(per["stratum"]) == set(SITES) and (per["stratum"].to_numpy() == m["dataset"].to_numpy()[rows]).all()
    for site in SITES:
        drawn = draw_first(np.flatnonzero((m["dataset"] == site).to_numpy() & (split == "test")), ids, 60, 42)
        assert set(per.loc[per["stratum"] == site, "sample_id"]) == set(ids[drawn])
    assert set(summ["stratum"]) == {"__all__", *SITES}
    # r by brute force: the k = 5 nearest (cosine) MIMIC training rows of the query's view, nothing else
    y, feats = m["f"].to_numpy(), l2_normalize(x.astype(np.float64))
    train = np.flatnonzero((m["dataset"] == "mimic_cxr").to_numpy() & (split == "train"))
    ref = []
    for r in rows:
        cands = train[m["view"].to_numpy()[train] == m["view"].iloc[r]]
        nearest = cands[np.argsort(-(feats[cands] @ feats[r]), kind="stable")[:5]]
        ref.append(1 - abs(2 * y[nearest].mean() - 1))
    np.testing.assert_allclose(per["impurity"].to_numpy(), ref, atol=1e-9)
    # the per-site AUROCs are the stratum's rows
    for site in SITES:
        at = per["stratum"] == site
        got = summ[(summ["stratum"] == site) & (summ["method"] == "impurity")].iloc[0]
        assert got["auroc"] == pytest.approx(roc_auc_score(per.loc[at, "error"], per.loc[at, "impurity"]))


def test_train_on_an_unknown_site_is_one_line():
    x, m = pooled(n_per_site=60)
    with pytest.raises(ValueError, match=r"train_on='nih' names no row of column 'dataset'") as err:
        evaluate("error_detection", x, m, finding="f", train_on="nih", n_boot=0, epochs=1, device="cpu")
    assert "\n" not in str(err.value)
