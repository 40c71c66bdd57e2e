"""CANDOR against an independent brute-force reference (float64 numpy, explicit loops over
queries and candidates) for DM, D, D_all and the margin AUROC, with ties and queries that are
bank members, in the default setting and under every control.

The features are binary vectors with exactly 4 ones, scaled by 1/2: every cosine similarity is a
multiple of 1/4 and k = 4, so every c±, DM and margin is exact in both implementations and ties
(DM = 0, equal margins) are frequent. The reference reuses only the stage's seeded draws
(banks, the negative removed by ``equal_size``, the shuffle permutation).
"""
import numpy as np
import pandas as pd
import pytest

import robustbench_fm
from robustbench_fm.methods.candor import stage as candor
from robustbench_fm.methods.candor import tasks as ct

K = 4
FINDINGS = ["pneumothorax", "cardiomegaly"]



def tie_cohort(n=240, d=10, seed=0):
    rng = np.random.default_rng(seed)
    feats = np.zeros((n, d))
    for row in feats:
        row[rng.choice(d, 4, replace=False)] = 1.0
    twins = np.flatnonzero(rng.random(n // 2) < 0.5) * 2      # half the patients: two equal images
    feats[twins + 1] = feats[twins]
    man = pd.DataFrame({
        "sample_id": [f"s{i:04d}" for i in range(n)],
        "patient_id": [f"p{i // 2:04d}" for i in range(n)],          # two images per patient
        "acq_group": np.where(np.arange(n) // 2 % 3 == 0, "siteA|AP", "siteB|PA"),
    })
    man["pneumothorax"] = np.where(rng.random(n) < 0.1, np.nan, (rng.random(n) < 0.35) * 1.0)
    man["cardiomegaly"] = (rng.random(n) < 0.3) * 1.0
    box = rng.random(n) < 0.5
    for c, v in zip(("box_x0", "box_y0", "box_x1", "box_y1"), (0.1, 0.1, 0.6, 0.7)):
        man[c] = np.where(box, v, np.nan)
    return feats, man


def mean_topk(x, q, cands, k):
    sims = sorted((float(x[q] @ x[j]) for j in cands), reverse=True)
    return np.mean(sims[:k]) if len(sims) >= k else np.nan


def auroc(scores, labels):
    pos, neg = scores[labels == 1], scores[labels == 0]
    total = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg)
    return total / (len(pos) * len(neg))


def reference(feats, man, finding, bank_size, max_group_sample, seed=42, shuffle_labels=False,
              queries="positive", equal_size=False, exclude_patient=False, unmatched=False,
              isolated=False, box_verified=False):
    """Per-query DM / DM_all and per-group D, D_all, margin AUROC by plain loops."""
    x = feats / np.linalg.norm(feats, axis=1, keepdims=True)
    groups = man["acq_group"].to_numpy()
    patients = man["patient_id"].to_numpy()
    y = man[finding].to_numpy(float).copy()
    if isolated:
        others = [f for f in FINDINGS if f != finding]
        y[(man[others].to_numpy() == 1).any(axis=1)] = np.nan
    if box_verified:
        y[(y == 1) & man["box_x0"].isna().to_numpy()] = np.nan
    if shuffle_labels:
        y = ct.shuffle_within_groups(y, groups, seed, finding)
    if queries == "negative":
        y = 1 - y
    all_pos, all_neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    if unmatched:
        pool_bank_pos, pool_bank_neg = candor.draw_banks(all_pos, all_neg, bank_size,
                                                         candor.group_rng(seed, candor.UNMATCHED))

    def allowed(q, cands, drop=-1):
        return [j for j in cands if j != q and j != drop and not (exclude_patient and patients[j] == patients[q])]

    per_query, per_group = {}, {}
    for group in sorted(set(groups)):
        pos = np.flatnonzero((groups == group) & (y == 1))
        neg = np.flatnonzero((groups == group) & (y == 0))
        qs, bank_pos, bank_neg = candor.draw_group(np.flatnonzero(groups == group), pos, neg, bank_size,
                                                   max_group_sample, candor.group_rng(seed, group))
        cand_pos, cand_neg = (all_pos, all_neg) if unmatched else (pos, neg)
        if unmatched:
            bank_pos, bank_neg = pool_bank_pos, pool_bank_neg
        drops = candor.equal_size_drops(qs, bank_pos, bank_neg, ct.task_rng(seed, group, finding, "equal_size")) \
            if equal_size else np.full(len(qs), -1)
        disc, disc_all = [], []
        for q, drop in zip(qs, drops):
            dm = mean_topk(x, q, allowed(q, bank_neg, drop), K) - mean_topk(x, q, allowed(q, bank_pos), K)
            dm_all = mean_topk(x, q, allowed(q, cand_neg), K) - mean_topk(x, q, allowed(q, cand_pos), K)
            per_query[man["sample_id"][q]] = (dm, dm_all)
            disc.append(dm > 0)
            disc_all.append(dm_all > 0)
        images = np.r_[pos, neg]
        margin = np.array([mean_topk(x, i, allowed(i, bank_pos), K) - mean_topk(x, i, allowed(i, bank_neg), K)
                           for i in images])
        labels = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
        per_group[group] = (len(qs), np.mean(disc), np.mean(disc_all), auroc(margin, labels))
    return per_query, per_group


CONTROLS = [{}, {"shuffle_labels": True}, {"queries": "negative"}, {"equal_size": True},
            {"exclude_patient": True}, {"unmatched": True}, {"isolated": True}, {"box_verified": True},
            {"equal_size": True, "exclude_patient": True}]


@pytest.mark.parametrize("controls", CONTROLS, ids=lambda c: "+".join(c) or "default")
def test_stage_equals_brute_force(controls):
    feats, man = tie_cohort()
    params = dict(k=K, bank_size=30, max_group_sample=120)
    findings = FINDINGS if not controls else FINDINGS[:1]
    res = robustbench_fm.evaluate("candor", feats, man, finding=findings, n_boot=0, **params, **controls)
    per = res.per_sample.set_index(["finding", "sample_id"])
    for finding in findings:
        ref_q, ref_g = reference(feats, man, finding, params["bank_size"], params["max_group_sample"], **controls)
        got = per.loc[finding]
        assert sorted(got.index) == sorted(ref_q)
        ref = np.array([ref_q[s] for s in got.index])
        np.testing.assert_array_equal(got["dm"].to_numpy(), ref[:, 0])
        np.testing.assert_array_equal(got["dm_all"].to_numpy(), ref[:, 1])
        assert (got["discordant"] == (ref[:, 0] > 0)).all()
        rows = res.summary[res.summary["finding"] == finding].set_index("acq_group")
        for group, (n_q, d, d_all, margin) in ref_g.items():
            assert rows.loc[group, "n_queries"] == n_q
            assert rows.loc[group, "d"] == d and rows.loc[group, "d_all"] == d_all
            assert rows.loc[group, "margin_auroc"] == pytest.approx(margin, abs=1e-12)
        sizes = np.array([v[0] for v in ref_g.values()])
        pooled = rows.loc[candor.POOLED]
        assert pooled["d"] == pytest.approx(sizes @ [v[1] for v in ref_g.values()] / sizes.sum(), abs=1e-12)
        assert pooled["margin_auroc"] == pytest.approx(sizes @ [v[3] for v in ref_g.values()] / sizes.sum(),
                                                       abs=1e-12)


def test_the_cohort_exercises_ties_and_bank_members():
    """The reference comparison is only informative if DM = 0 and in-bank queries occur."""
    feats, man = tie_cohort()
    res = robustbench_fm.evaluate("candor", feats, man, finding=FINDINGS, k=K, bank_size=30,
                                  max_group_sample=120, n_boot=0)
    assert (res.per_sample["dm"] == 0).sum() >= 5
    for controls, changed in (({"equal_size": True}, 1), ({"exclude_patient": True}, 10)):
        other = robustbench_fm.evaluate("candor", feats, man, finding=FINDINGS, k=K, bank_size=30,
                                        max_group_sample=120, n_boot=0, **controls)
        assert (other.per_sample["dm"] != res.per_sample["dm"]).sum() >= changed
    y = man["pneumothorax"].to_numpy()
    group = "siteB|PA"
    pos = np.flatnonzero((man["acq_group"] == group).to_numpy() & (y == 1))
    neg = np.flatnonzero((man["acq_group"] == group).to_numpy() & (y == 0))
    images = np.flatnonzero((man["acq_group"] == group).to_numpy())
    qs, bank_pos, _ = candor.draw_group(images, pos, neg, 30, 120, candor.group_rng(42, group))
    assert 0 < np.isin(qs, bank_pos).sum() < len(qs)


def test_duplicated_vectors_tie_exactly_in_the_margin_auroc():
    """Issue 42 item 7: 513 images that are copies of 20 Gaussian vectors (d = 384). The margin
    AUROC equals an exact-tie brute force (float64 similarities of the distinct vectors, a vector
    and itself exactly 1), and the queries' c± are bitwise equal among copies in the same bank
    situation. Before, the shortlist's float32 products rounded copies apart: AUROC 0.45722 against
    the brute force's 0.45716."""
    rng = np.random.default_rng(5)
    n, k, bank = 513, 5, 60
    base = rng.normal(size=(20, 384)).astype(np.float32)
    vid = rng.integers(0, 20, size=n)
    y = (rng.random(n) < 0.4).astype(float)
    man = pd.DataFrame({"sample_id": [f"s{i:04d}" for i in range(n)], "patient_id": [f"p{i}" for i in range(n)],
                        "acq_group": "g", "f": y})
    res = robustbench_fm.evaluate("candor", base[vid], man, finding="f", k=k, n_boot=0, bank_size=bank,
                                  block_size=256)
    unit = base.astype(np.float64) / np.linalg.norm(base.astype(np.float64), axis=1, keepdims=True)
    sims = unit @ unit.T
    np.fill_diagonal(sims, 1.0)
    pos, neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    _, bank_pos, bank_neg = candor.draw_group(np.arange(n), pos, neg, bank, 4000, candor.group_rng(42, "g"))

    def c(i, cands):
        return np.sort([sims[vid[i], vid[j]] for j in cands if j != i])[::-1][:k].mean()

    images = np.r_[pos, neg]
    margin = np.array([c(i, bank_pos) - c(i, bank_neg) for i in images])
    want = auroc(margin, np.r_[np.ones(len(pos)), np.zeros(len(neg))])
    assert res.summary.set_index("acq_group").loc["g", "margin_auroc"] == pytest.approx(want, abs=1e-12)
    per = res.per_sample.assign(vector=vid[res.per_sample["sample_id"].str[1:].astype(int)],
                                in_bank=res.per_sample["sample_id"].isin(man["sample_id"].to_numpy()[bank_pos]))
    assert (per.groupby(["vector", "in_bank"])[["c_pos", "c_neg"]].nunique() == 1).all().all()
    assert per.groupby(["vector", "in_bank"]).size().max() > 1
