"""The banks' role of a patient in CANDOR's D (issue 58 item 3; methods/candor/influence.py): the items'
``discordant_bank_0`` / ``_1`` columns equal a brute force from the paper's definitions (c± the mean of the k
nearest cosine similarities in R±_s, each patient's images left out in turn), smoothed by the kernel of the
row's DM values."""
import null_cohorts as nc  # tests/fixtures (tests/conftest.py)
import numpy as np
import pandas as pd
import pytest

from robustbench_fm.core.stats import cluster_halves, smoothed_density
from robustbench_fm.methods.candor import stage as candor


def _brute(unit, q, bank_pos, bank_neg, k, patients, halves):
    """Δ̃_p per half by brute force: for each query its DM, and its DM once patient p's images left both banks."""
    def c(i, bank):
        cands = bank[bank != i]
        return np.sort(unit[cands] @ unit[i])[::-1][:k].mean()

    dm = np.array([c(i, bank_neg) - c(i, bank_pos) for i in q])
    density = smoothed_density(dm)
    out = {}
    for p in np.unique(patients[np.r_[bank_pos, bank_neg]]):
        kp, kn = bank_pos[patients[bank_pos] != p], bank_neg[patients[bank_neg] != p]
        for j, i in enumerate(q):
            if patients[i] == p:
                continue
            shift = dm[j] - (c(i, kn) - c(i, kp))
            if shift:
                key = (p, int(halves[i]))
                out[key] = out.get(key, 0.0) + density(dm[j]) * shift
    return out


def test_bank_shares_equal_a_brute_force_of_each_patient_left_out():
    manifest, feats = nc.cohort(nc.DESIGNS[0], seed=5, n_encoders=1)
    f = feats["enc0"]
    res = candor.run(f, manifest, nc.FINDING, n_boot=0, device="cpu")
    unit = f / np.linalg.norm(f, axis=1, keepdims=True)
    patients = manifest["patient_id"].astype(str).to_numpy()
    halves = cluster_halves(patients)
    groups = manifest["acq_group"].to_numpy()
    labels = manifest[nc.FINDING].to_numpy()
    checked = 0
    for group in sorted(set(groups)):
        pos = np.flatnonzero((groups == group) & (labels == 1))
        neg = np.flatnonzero((groups == group) & (labels == 0))
        q, bank_pos, bank_neg = candor.draw_group(np.flatnonzero(groups == group), pos, neg, 1000, 4000,
                                                  candor.group_rng(42, group))
        expected = _brute(unit, q, bank_pos, bank_neg, 5, patients, halves)
        items = res.items[res.items["acq_group"] == group]
        for h in (0, 1):
            got = items.groupby("cluster")[f"discordant_bank_{h}"].sum()
            want = pd.Series({p: v for (p, hh), v in expected.items() if hh == h}, dtype=float)
            got = got[got != 0]
            assert set(got.index) <= set(want.index)  # a patient without any query-side shift has no share
            np.testing.assert_allclose(got.reindex(want.index, fill_value=0.0).to_numpy(), want.to_numpy(),
                                       rtol=1e-4, atol=1e-6)  # the stage's similarities are float32
            checked += int((want != 0).sum())
        # D_all: the banks are every positive here (n = #positives), but not every negative
        assert not np.array_equal(bank_neg, neg) or items["discordant_all_bank_0"].equals(items["discordant_bank_0"])
    assert checked > 50


def test_the_banks_role_widens_the_comparison_and_leaves_the_estimates_alone():
    """The bank term changes the intervals, never an estimate: every pair's difference and item count are those
    with the bank columns zeroed (the old fixed-bank bootstrap), and the intervals are wider overall (a row's
    can narrow: the cross term with the query role may be negative)."""
    from robustbench_fm.report.comparisons import compare_tables

    manifest, feats = nc.cohort(nc.DESIGNS[2], seed=3, n_encoders=2)
    items = pd.concat([candor.run(f, manifest, nc.FINDING, n_boot=0, device="cpu").items.assign(encoder=e)
                       for e, f in feats.items()], ignore_index=True)
    zero = {c: 0.0 for c in items.columns if "_bank_" in c}
    on, off = (compare_tables("candor", it, n_boot=400).pairs.set_index(["metric", "row"])
               for it in (items, items.assign(**zero)))
    assert len(on) == len(off) == 2 * 3
    np.testing.assert_array_equal(on["difference"], off["difference"])
    width_on, width_off = on["ci_high"] - on["ci_low"], off["ci_high"] - off["ci_low"]
    assert width_on.sum() > 1.1 * width_off.sum() and (width_on != width_off).all()
    assert on["n_items"].equals(off["n_items"]) and (on["n_clusters"] >= off["n_clusters"]).all()


def test_bank_influence_is_zero_where_no_patient_is_anyone_else_s_neighbour():
    """Each patient a tight cluster of its own, positives patient 0, negatives patient 1: a query's nearest
    positives are its own patient's other images (never counted as another patient's role), and removing
    patient 1 leaves its negatives' bank empty below k, which counts nothing."""
    rng = np.random.default_rng(0)
    x = np.r_[rng.normal(size=(6, 4)) * 0.01 + [1, 0, 0, 0], rng.normal(size=(6, 4)) * 0.01 + [0, 1, 0, 0]]
    import torch

    from robustbench_fm.methods.candor.influence import bank_influence

    clusters = np.repeat([0, 1], 6)
    unit = torch.as_tensor(x / np.linalg.norm(x, axis=1, keepdims=True))
    out = bank_influence(unit, np.arange(3), np.arange(6), np.arange(6, 12), 2, clusters, np.zeros(12, int))
    # the query's nearest positives are its own patient's (removing patient 1 changes only c−, far away)
    assert out.shape == (2, 2) and out[:, 0].tolist() == [0.0, 0.0]
    assert pytest.approx(out[1, 1]) == 0.0
