"""CANDOR tasks: one class against the other classes of its family (birds, aircraft), the
severity-weighted chest pool, and the label restrictions of the ablations."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import robustbench_fm
from robustbench_fm.data.natural import cub_family
from robustbench_fm.methods.candor import stage as candor
from robustbench_fm.methods.candor import tasks as ct

CUB_CLASSES = Path(__file__).resolve().parents[2] / "fixtures" / "cub_classes.txt"



def test_167_cub_species_share_their_family():
    """candor.md "Scope": 167 of the 200 species share their family with another species."""
    names = [line.split()[1] for line in CUB_CLASSES.read_text().splitlines() if line.strip()]
    assert len(names) == 200
    eligible = ct.eligible_classes(names, [cub_family(n) for n in names])
    assert len(eligible) == 167
    assert "001.Black_footed_Albatross" in eligible and "004.Groove_billed_Ani" not in eligible


def natural_cohort(seed=0, per_class=40):
    """Families of 3, 2 and 1 classes; class 'a2' is planted apart from its family."""
    rng = np.random.default_rng(seed)
    classes = {"a1": "A", "a2": "A", "a3": "A", "b1": "B", "b2": "B", "c1": "C"}
    rows = [(cls, fam) for cls, fam in classes.items() for _ in range(per_class)]
    man = pd.DataFrame({"sample_id": [f"s{i:04d}" for i in range(len(rows))],
                        "patient_id": [f"s{i:04d}" for i in range(len(rows))],
                        "bio_label": [r[0] for r in rows], "acq_group": [r[1] for r in rows]})
    feats = rng.normal(size=(len(man), 8))
    feats[man["bio_label"].to_numpy() == "a2", 0] += 4.0
    return feats, man


def test_one_vs_rest_scores_each_class_against_its_family():
    feats, man = natural_cohort()
    params = dict(k=3, n_boot=100)
    res = robustbench_fm.evaluate("candor", feats, man, finding="bio_label", task="family_one_vs_rest", **params)
    auto = robustbench_fm.evaluate("candor", feats, man, finding="bio_label", **params)   # names -> one-vs-rest
    pd.testing.assert_frame_equal(res.summary, auto.summary)
    s = res.summary
    assert list(s["target"].unique()) == ["a1", "a2", "a3", "b1", "b2", ct.CLASS_MEAN]   # c1 is alone
    pooled = s[(s["acq_group"] == candor.POOLED) & (s["target"] != ct.CLASS_MEAN)].set_index("target")
    for cls in ("a1", "a2", "b2"):
        # the same task as a binary finding restricted to the family
        fam = man["acq_group"][man["bio_label"] == cls].iloc[0]
        binary = man.assign(f=np.where(man["acq_group"] == fam, (man["bio_label"] == cls) * 1.0, np.nan))
        ref = robustbench_fm.evaluate("candor", feats, binary, finding="f", **params).summary.iloc[-1]
        for col in ("n_queries", "n_pos", "n_neg", "d", "d_all", "margin_auroc"):
            assert pooled.loc[cls, col] == pytest.approx(ref[col], abs=1e-12), (cls, col)
    assert pooled.loc["a2", "d"] == 0 and pooled.loc["a1", "n_neg"] == 80 and pooled.loc["b1", "n_neg"] == 40
    mean = s[s["target"] == ct.CLASS_MEAN].iloc[0]
    assert mean["finding"] == "bio_label" and mean["acq_group"] == candor.POOLED
    assert mean["d"] == pytest.approx(pooled["d"].mean(), abs=1e-12)
    assert mean["margin_auroc"] == pytest.approx(pooled["margin_auroc"].mean(), abs=1e-12)
    assert mean["n_queries"] == 5 * 40
    assert mean["d_ci_low"] <= mean["d"] <= mean["d_ci_high"] and mean["d_sd"] > 0
    # every class row names its class; per-sample rows too, each query a member of its class
    per = res.per_sample
    assert (per["target"].to_numpy() == man.set_index("sample_id").loc[per["sample_id"], "bio_label"].to_numpy()).all()


def chest_cohort(seed=1, n=1800):
    rng = np.random.default_rng(seed)
    man = pd.DataFrame({"sample_id": [f"s{i:05d}" for i in range(n)],
                        "patient_id": [f"p{i // 3:05d}" for i in range(n)],
                        "acq_group": np.where(np.arange(n) % 2 == 0, "siteA|AP", "siteA|PA")})
    feats = rng.normal(size=(n, 8))
    for j, (f, p) in enumerate({"pneumothorax": 0.15, "cardiomegaly": 0.25, "atelectasis": 0.3}.items()):
        man[f] = (rng.random(n) < p) * 1.0
        feats[:, j] += (j + 0.5) * man[f]
    man["fracture"] = np.r_[np.ones(3), np.zeros(n - 3)]   # too rare to score: left out of the pool
    return feats, man


def test_chest_pool_is_the_severity_weighted_mean_of_the_findings():
    feats, man = chest_cohort()
    findings = ["pneumothorax", "cardiomegaly", "atelectasis", "fracture"]
    res = robustbench_fm.evaluate("candor", feats, man, finding=findings, n_boot=200)
    s = res.summary.set_index(["finding", "acq_group"])
    d = {f: s.loc[(f, candor.POOLED), "d"] for f in findings[:3]}
    d_all = {f: s.loc[(f, candor.POOLED), "d_all"] for f in findings[:3]}
    auroc = {f: s.loc[(f, candor.POOLED), "margin_auroc"] for f in findings[:3]}
    chest = s.loc[(ct.CHEST_POOL, candor.POOLED)]
    assert np.isnan(s.loc[("fracture", candor.POOLED), "d"])
    assert chest["d"] == pytest.approx((3 * d["pneumothorax"] + 2 * d["cardiomegaly"] + d["atelectasis"]) / 6,
                                       abs=1e-12)
    assert chest["d_all"] == pytest.approx(
        (3 * d_all["pneumothorax"] + 2 * d_all["cardiomegaly"] + d_all["atelectasis"]) / 6, abs=1e-12)
    assert chest["margin_auroc"] == pytest.approx(np.mean(list(auroc.values())), abs=1e-12)
    assert chest["n_queries"] == sum(s.loc[(f, candor.POOLED), "n_queries"] for f in findings[:3])
    # per-finding pooled rate = per-sample share of discordant queries (pooled over sites by size)
    per = res.per_sample
    for f in findings[:3]:
        assert d[f] == pytest.approx(per.loc[per["finding"] == f, "discordant"].mean(), abs=1e-12)
    # joint resampling: the pool's SD is below the weighted SDs added up, and its interval holds it
    sds = [s.loc[(f, candor.POOLED), "d_sd"] for f in findings[:3]]
    assert 0 < chest["d_sd"] < (3 * sds[0] + 2 * sds[1] + sds[2]) / 6
    for m in candor.METRICS:
        assert chest[f"{m}_ci_low"] <= chest[m] <= chest[f"{m}_ci_high"]
    # the row is written to its own results folder by the app: finding == target == "__chest__"
    assert chest["target"] == ct.CHEST_POOL
    # no pool for a single finding or for findings outside the 12
    one = robustbench_fm.evaluate("candor", feats, man, finding=["pneumothorax"], n_boot=0).summary
    assert ct.CHEST_POOL not in set(one["finding"])


def test_isolated_and_box_verified_restrict_the_labels():
    feats, man = chest_cohort(n=900)
    has_box = np.random.default_rng(2).random(len(man)) < 0.5
    for c in ("box_x0", "box_y0", "box_x1", "box_y1"):
        man[c] = np.where(has_box, 0.3, np.nan)
    man.loc[0, "box_y1"] = np.nan                       # a box needs all 4 coordinates
    findings = ["pneumothorax", "cardiomegaly", "atelectasis"]
    iso = robustbench_fm.evaluate("candor", feats, man, finding=findings, n_boot=0, isolated=True)
    box = robustbench_fm.evaluate("candor", feats, man, finding="pneumothorax", n_boot=0, box_verified=True)
    pooled = iso.summary.set_index(["finding", "acq_group"])
    chest = man[["pneumothorax", "cardiomegaly", "atelectasis", "fracture"]].to_numpy() == 1
    for j, f in enumerate(findings):
        others = np.delete(chest, j, axis=1).any(axis=1)
        assert pooled.loc[(f, candor.POOLED), "n_pos"] == (chest[:, j] & ~others).sum()
        assert pooled.loc[(f, candor.POOLED), "n_neg"] == (~chest.any(axis=1)).sum()
    boxed = man["box_y1"].notna().to_numpy() & (man["pneumothorax"] == 1).to_numpy()
    assert box.summary.iloc[-1]["n_pos"] == boxed.sum()
    assert set(box.per_sample["sample_id"]) <= set(man["sample_id"][boxed])
    with pytest.raises(ValueError, match="box_verified needs the manifest box columns"):
        robustbench_fm.evaluate("candor", feats, man.drop(columns="box_x0"), finding="pneumothorax",
                                box_verified=True)


def test_a_binary_finding_takes_only_0_1_nan():
    feats, man = chest_cohort(n=60)
    man.loc[5, "pneumothorax"] = 2.0
    with pytest.raises(ValueError, match="column 'pneumothorax' holds 2.0"):
        robustbench_fm.evaluate("candor", feats, man, finding="pneumothorax")


@pytest.mark.parametrize("params, message", [
    ({"task": "multiclass"}, "task='multiclass' is not one of"),
    ({"queries": "both"}, "queries='both' is not one of"),
    ({"task": "family_one_vs_rest", "unmatched": True}, "apply to binary findings only"),
])
def test_bad_options_are_refused_at_plan_time(params, message):
    with pytest.raises(ValueError, match=message):
        candor.check_params(**params)
