"""Ablation (1), box-verified positives (stage candor_box_verified): the boxed queries of each arm
against the reference site's candidate sets, checked against a brute force; the reference's own
positives reproduce the main analysis's D exactly."""
import numpy as np
import pandas as pd
import pytest

import robustbench_fm
from robustbench_fm.methods.candor import stage as candor

K, BANK = 3, 12


def pool(seed=0, per_view=40, dim=6):
    """A pool manifest: the reference ``ref`` (two views, its own matched groups), ``dup`` whose
    rows are boxed copies of some reference positives (same path, same features: MS-CXR on
    MIMIC-CXR images) plus unboxed positives, and ``ext`` with boxed positives of its own images
    (RSNA: from outside the reference)."""
    rng = np.random.default_rng(seed)
    rows, feats = [], []
    for view in ("PA", "AP"):
        y = rng.permutation(np.r_[np.ones(15), np.zeros(per_view - 15)])
        for i in range(per_view):
            rows.append(dict(sample_id=f"ref/{view}{i}", dataset="ref", path=f"ref/{view}/{i}.jpg",
                             patient_id=f"ref/p{view}{i // 2}", view=view, acq_group=f"ref_{view}", f=y[i]))
            feats.append(rng.normal(size=dim))
    ref = pd.DataFrame(rows)
    for view in ("PA", "AP"):
        positives = ref.index[(ref["view"] == view) & (ref["f"] == 1)][:6]
        for j, at in enumerate(positives):
            boxed = j < 4
            rows.append(dict(sample_id=f"dup/{view}{j}", dataset="dup", path=ref.loc[at, "path"],
                             patient_id=f"dup/p{view}{j}", view=view, acq_group=f"ref_{view}", f=1.0,
                             box_x0=0.1 if boxed else np.nan, box_y0=0.1, box_x1=0.5, box_y1=0.5))
            feats.append(feats[at])
        for j in range(3):
            rows.append(dict(sample_id=f"ext/{view}{j}", dataset="ext", path=f"ext/{view}{j}.dcm",
                             patient_id=f"ext/p{view}{j}", view=view, acq_group=f"ext_{view}", f=1.0,
                             box_x0=0.2, box_y0=0.2, box_x1=0.6, box_y1=0.6))
            feats.append(rng.normal(size=dim))
    return np.array(feats), pd.DataFrame(rows)


def run(feats, man, **params):
    return robustbench_fm.evaluate("candor_box_verified", feats, man, finding="f", k=K, bank_size=BANK, n_boot=0,
                                   reference="ref", arms=[{"dataset": "dup", "finding": "f"},
                                                          {"dataset": "ext", "finding": "f"}], **params)


def brute_c(z, query, bank, paths):
    """Mean of the k largest cosines of ``query`` to ``bank``, without any image of its own file."""
    keep = [b for b in bank if paths[b] != paths[query]]
    return np.sort(z[keep] @ z[query])[::-1][:K].mean()


def test_boxed_queries_match_a_brute_force_and_all_positives_match_the_main_analysis():
    feats, man = pool()
    res = run(feats, man)
    per = res.per_sample.set_index(["arm", "sample_id"])
    z = feats / np.linalg.norm(feats, axis=1, keepdims=True)
    paths = man["path"].to_numpy()
    y = man["f"].to_numpy()
    checked = 0
    for view in ("PA", "AP"):
        g = ((man["dataset"] == "ref") & (man["view"] == view)).to_numpy()
        _, bank_pos, bank_neg = candor.draw_group(np.flatnonzero(g), np.flatnonzero(g & (y == 1)),
                                                  np.flatnonzero(g & (y == 0)), BANK, 4000,
                                                  candor.group_rng(42, f"ref_{view}"))
        for arm in ("dup", "ext"):
            boxed = np.flatnonzero(((man["dataset"] == arm) & (man["view"] == view) & man["box_x0"].notna()).to_numpy())
            for q in boxed:
                got = per.loc[(arm, man["sample_id"][q])]
                assert got["c_pos"] == pytest.approx(brute_c(z, q, bank_pos, paths), abs=1e-6)
                assert got["c_neg"] == pytest.approx(brute_c(z, q, bank_neg, paths), abs=1e-6)
                assert got["discordant"] == (got["c_neg"] - got["c_pos"] > 0)
                checked += 1
    assert checked == 2 * (4 + 3)
    summary = res.summary.set_index(["arm", "acq_group"])
    # unboxed positives of the arm are no queries: 4 boxed per view
    assert summary.loc[("dup", candor.POOLED), "n_queries"] == 8
    assert summary.loc[("ext", candor.POOLED), "n_queries"] == 6
    # a boxed copy of a reference image meets the same sets as that image: the same c+ and c-
    own = per.loc["ref"]
    for sid, path in man.loc[man["dataset"] == "dup", ["sample_id", "path"]].itertuples(index=False):
        if ("dup", sid) in per.index and (ref_id := man.loc[(man["dataset"] == "ref") & (man["path"] == path),
                                                            "sample_id"].iloc[0]) in own.index:
            assert per.loc[("dup", sid), "c_pos"] == pytest.approx(own.loc[ref_id, "c_pos"], abs=1e-9)
            assert per.loc[("dup", sid), "c_neg"] == pytest.approx(own.loc[ref_id, "c_neg"], abs=1e-9)
    # "all its positives": the main analysis's D on the reference alone, group by group
    only = man[man["dataset"] == "ref"].reset_index(drop=True)
    main = robustbench_fm.evaluate("candor", feats[: len(only)], only, finding="f", k=K, bank_size=BANK, n_boot=0)
    main = main.summary.set_index("acq_group")
    for group in ("ref_PA", "ref_AP", candor.POOLED):
        assert summary.loc[("ref", group), "d"] == main.loc[group, "d"]
        assert summary.loc[("ref", group), "n_queries"] == main.loc[group, "n_queries"]


def test_chance_level_for_label_free_features():
    """Lemma 1: features independent of the finding give D = 1/2 for queries outside both sets
    (the external arm), within binomial error."""
    rng = np.random.default_rng(5)
    n = 600
    man = pd.DataFrame({"sample_id": [f"s{i}" for i in range(n)], "dataset": ["ref"] * 400 + ["ext"] * 200,
                        "path": [f"{i}.png" for i in range(n)], "patient_id": [f"p{i}" for i in range(n)],
                        "view": "PA", "acq_group": ["ref_PA"] * 400 + ["ext_PA"] * 200,
                        "f": np.r_[rng.permutation(np.r_[np.ones(200), np.zeros(200)]), np.ones(200)],
                        "box_x0": 0.1, "box_y0": 0.1, "box_x1": 0.4, "box_y1": 0.4})
    res = robustbench_fm.evaluate("candor_box_verified", rng.normal(size=(n, 4)), man, finding="f", k=5,
                                  bank_size=200, n_boot=0, arms=[{"dataset": "ext", "finding": "f"}], reference="ref")
    d = res.summary.set_index(["arm", "acq_group"]).loc[("ext", candor.POOLED), "d"]
    assert abs(d - 0.5) < 4 * np.sqrt(0.25 / 200)


def test_a_manifest_without_pool_members_is_one_line():
    feats, man = pool()
    with pytest.raises(ValueError, match="no 'dataset' column; run it on a pool") as err:
        run(feats, man.drop(columns="dataset"))
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="reference=mimic_cxr is not a member"):
        robustbench_fm.evaluate("candor_box_verified", feats, man, finding="f", n_boot=0)
