"""CANDOR joined with the heads, and the cross-encoder tables built from it."""
import numpy as np
import pandas as pd
import pytest
import torch
from heads_data import synthetic

from robustbench_fm.core.neighbors import l2_normalize
from robustbench_fm.core.tables import SweepResults
from robustbench_fm.methods.heads import candor_heads
from robustbench_fm.methods.heads.tables import (
    RULES,
    candor_head_errors,
    candor_table4,
    candor_v1_consensus,
    clustered_rates,
    head_error_strata,
    mh_bootstrap_sd,
    table4_errors,
)

OPTIONS = dict(n_boot=20, epochs=3, bank_size=60, max_group_sample=200, max_test=150)


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    """Three 'encoders' (noisy views of the same planted features) run through candor_heads and
    saved as a run folder."""
    root = tmp_path_factory.mktemp("run")
    (root / "config.yaml").write_text("report: {tables: []}\nstage: {params: {n_boot: 200, seed: 42}}\n")
    x, m = synthetic(n=800, signal=0.8, seed=4)
    m["g"] = np.where(np.arange(800) % 4 == 0, np.nan, (np.arange(800) * 7 % 10 < 3).astype(float))
    runs = {}
    for i, name in enumerate(["enc_a", "enc_b", "enc_c"]):
        feats = x + np.random.default_rng(i).normal(scale=0.7, size=x.shape).astype(np.float32)
        res = candor_heads.run(feats, m, ["f", "g"], **OPTIONS)
        runs[name] = (feats, res)
        for f in ("f", "g"):
            part = res.per_sample[res.per_sample["finding"] == f].reset_index(drop=True)
            summary = res.summary[res.summary["finding"] == f].assign(encoder=name, dataset="synth")
            type(res)(summary=summary, per_sample=part).save(root / "results" / name / "synth" / "candor_heads" / f)
    return root, m, runs


def test_rows_match_candor_and_the_banks(panel):
    _, m, runs = panel
    feats, res = runs["enc_a"]
    per = res.per_sample
    q = per[per["query"]]
    from robustbench_fm.methods.candor import stage as candor
    c = candor.run(feats, m, ["f", "g"], k=5, bank_size=60, max_group_sample=200, n_boot=0).per_sample
    merged = q.merge(c, on=["sample_id", "finding"], suffixes=("", "_candor"))
    assert len(merged) == len(q) == len(c)
    assert (merged["discordant"].astype(bool) == merged["discordant_candor"]).all()
    # the same banks placed against the queries again (not read from CANDOR) give CANDOR's values
    rows = pd.Index(m["sample_id"]).get_indexer(q["sample_id"])
    tensor = torch.as_tensor(l2_normalize(feats))
    for f in ("f", "g"):
        at = (q["finding"] == f).to_numpy()
        c_pos, c_neg = candor_heads.bank_similarities(tensor, m, f, rows[at], 5, 60, 200, 42, "acq_group")
        np.testing.assert_allclose(c_pos, q.loc[at, "c_pos"], atol=1e-6)
        np.testing.assert_allclose(c_neg, q.loc[at, "c_neg"], atol=1e-6)
    test = per[(per["split"] == "test") & (per["finding"] == "f")]
    pos = test[test["label"] == 1]
    miss = ~pos["pred"].astype(bool)
    row = res.summary.set_index("finding").loc["f"]
    assert row["miss_discordant"] == pytest.approx(miss[pos["discordant"].astype(bool)].mean())
    assert row["n_discordant"] + row["n_other"] == len(pos)
    assert per.loc[per["label"] == 0, "discordant"].isna().all() and per.loc[per["label"] == 1, "near_pos"].isna().all()


def test_table4_rules_against_direct_counts(panel):
    root, _, runs = panel
    frame = candor_table4(SweepResults(root))[0].frame.set_index("Rule")
    columns = ["Miss rate 263", "Miss rate 33,770", "Miss rate All", "FP rate Negatives"]
    assert list(frame.columns[:9]) == ["Published as"] + [c for col in columns for c in (col, f"{col} ±")]
    assert list(frame.columns[9:13]) == [f"{c} published" for c in columns]
    assert frame.loc["OR rule", "Miss rate 263 published"] == 0.049  # Table 4, beside ours
    assert frame.loc["Oracle selector (candor_v1.md)", "Miss rate 263 published"] == pytest.approx(0.028)
    # single head, all positives of the drawn test sample: the mean of the three heads' miss rates
    rates = []
    for _, res in runs.values():
        per = res.per_sample
        sample_pos = per[per["in_sample"] & (per["label"] == 1)]
        rates.append((~sample_pos["pred"].astype(bool)).mean())
    assert frame.loc["Single head (mean of 3)", "Miss rate All"] == pytest.approx(np.mean(rates))
    assert (frame.loc["OR rule", ["Miss rate All", "Miss rate 33,770"]]
            <= frame[["Miss rate All", "Miss rate 33,770"]].min() + 1e-12).all()
    assert frame.loc["OR rule", "FP rate Negatives"] == frame["FP rate Negatives"].max()


def test_consensus_table_and_head_errors(panel):
    root, _, runs = panel
    frame = candor_v1_consensus(SweepResults(root))[0].frame.set_index("Finding")
    queries = {f: set() for f in ("f", "g")}
    for _, res in runs.values():
        q = res.per_sample[res.per_sample["query"] & (res.per_sample["label"] == 1)]
        for f in queries:
            queries[f] |= set(q.loc[q["finding"] == f, "sample_id"])
    assert frame.loc["Pooled", "n+"] == sum(len(v) for v in queries.values())
    # direct count: blind = discordant under >= 2 of 3 encoders; scored = blind and in the test sample
    per = pd.concat([res.per_sample.assign(encoder=name) for name, (_, res) in runs.items()])
    q = per[per["query"] & (per["label"] == 1)]
    votes = q.groupby(["finding", "sample_id"])["discordant"].sum()
    blind = votes[votes >= 2].index
    sample = per[per["in_sample"]].set_index(["finding", "sample_id"])
    scored = sample.loc[sample.index.isin(blind)]
    missed = (~scored["pred"].astype(bool)).groupby(level=[0, 1]).all()
    assert frame.loc["Pooled", "Blind"] == pytest.approx(len(blind) / frame.loc["Pooled", "n+"])
    assert frame.loc["Pooled", "Scored"] == len(missed) > 0
    assert frame.loc["Pooled", "Best"] == pytest.approx(missed.mean())
    assert frame.index[-1] == "Pooled"
    errors = candor_head_errors(SweepResults(root))[0].frame.set_index("Encoder")
    assert set(errors.index) == {"enc_a", "enc_b", "enc_c", "All encoders", "Published (candor.md)"}
    test_pos = per[(per["split"] == "test") & (per["label"] == 1) & per["discordant"].notna()]
    both = test_pos.groupby(["encoder", "finding"])["discordant"].agg(lambda d: 0 < d.sum() < len(d))
    assert errors.loc["All encoders", "Strata"] == both.sum() >= 3
    a = test_pos[test_pos["encoder"] == "enc_a"]
    assert errors.loc["enc_a", "Miss rate discordant"] == pytest.approx(
        (~a.loc[a["discordant"].astype(bool), "pred"].astype(bool)).mean())


def _panel_rows(runs) -> pd.DataFrame:
    return pd.concat([res.per_sample.assign(encoder=name, dataset="synth") for name, (_, res) in runs.items()],
                     ignore_index=True)


def test_every_table4_rule_is_scored_on_one_test_sample(panel):
    """candor.md: "Every rule is scored on the same 20,000 test images": one set of rows for all
    seven rows of the table, and the rates are those rows' errors."""
    root, m, runs = panel
    per = _panel_rows(runs)
    errors, sets = table4_errors(per)
    assert list(errors.columns) == list(RULES) and errors.notna().all().all()
    sample = per[per["in_sample"] & (per["encoder"] == "enc_a") & per["pred"].notna()]  # findings with a head
    # "All" / "Negatives": exactly the drawn test sample's positives / negatives, the same ids for every rule
    for col, label in (("Miss rate All", 1), ("FP rate Negatives", 0)):
        ids = set(map(tuple, sample.loc[sample["label"] == label, ["finding", "sample_id"]].to_numpy()))
        assert {(f, i) for _, f, i in sets[col]} == ids
    # the drawn test sample is the stable-hash draw, identical for every encoder
    drawn = {name: set(res.per_sample.loc[res.per_sample["in_sample"], "sample_id"]) for name, (_, res) in runs.items()}
    assert drawn["enc_a"] == drawn["enc_b"] == drawn["enc_c"]
    frame = candor_table4(SweepResults(root))[0].frame.set_index("Rule")
    for rule, (label, _) in RULES.items():
        for col, idx in sets.items():
            assert frame.loc[label.format(n=3), col] == pytest.approx(errors.loc[idx, rule].mean(), nan_ok=True)
    # the oracle errs only where every head errs, so it is never above any single head
    heads = per[per["split"] == "test"].pivot_table(index=["finding", "sample_id"], columns="encoder", values="pred",
                                                    aggfunc="first").astype(bool)
    label = per.drop_duplicates(["finding", "sample_id"]).set_index(["finding", "sample_id"])["label"] == 1
    pos = sets["Miss rate All"].droplevel("dataset")
    assert frame.loc["Oracle selector (candor_v1.md)", "Miss rate All"] == pytest.approx(
        (~heads.loc[pos]).all(axis=1).mean())
    assert (~heads.loc[pos]).all(axis=1).mean() < (~heads.loc[pos]).mean().min()
    assert label.loc[pos].all()


def test_table4_bootstrap_resamples_patients(panel):
    """The ± is the SD of the rates over resamples of the patients (two images each here), as a
    brute force with the same draws gives it; a bootstrap of rows would give another value."""
    _, _, runs = panel
    per = _panel_rows(runs)
    errors, sets = table4_errors(per)
    patients = per.drop_duplicates(["dataset", "finding", "sample_id"]).set_index(
        ["dataset", "finding", "sample_id"])["patient_id"]
    sets = {"Miss rate All": sets["Miss rate All"]}
    rates, sd = clustered_rates(errors, sets, patients, n_boot=300, seed=7)
    idx = sets["Miss rate All"]
    pids = patients.loc[idx].astype(str).to_numpy()
    order = np.unique(pids)  # patient codes in the order of their ids as strings
    code = np.searchsorted(order, pids)
    draws = np.random.default_rng(7).integers(0, len(order), size=(300, len(order)))
    brute = []
    for d in draws:
        mult = np.bincount(d, minlength=len(order))[code]
        brute.append((mult[:, None] * errors.loc[idx].to_numpy()).sum(0) / mult.sum())
    np.testing.assert_allclose(sd.loc["Miss rate All"].to_numpy(), np.std(brute, axis=0, ddof=1), rtol=1e-10)
    assert rates.loc["Miss rate All", "or"] == pytest.approx(errors.loc[idx, "or"].mean())
    assert len(np.unique(pids)) < len(pids)  # patients hold several rows of the set


def test_mh_strata_are_encoder_by_finding_and_its_sd_resamples_patients(panel):
    _, _, runs = panel
    per = _panel_rows(runs)
    two_sites = pd.concat([per, per.assign(dataset="other", sample_id=per["sample_id"] + "x",
                                           patient_id=per["patient_id"] + "x")], ignore_index=True)
    strata = head_error_strata(two_sites)
    # one stratum per encoder x finding with a head (g has none), the two sites pooled in it
    assert list(strata.columns[:2]) == ["encoder", "finding"] and len(strata) == 3
    one = head_error_strata(per).set_index(["encoder", "finding"])
    assert (strata.set_index(["encoder", "finding"])["n1"] == 2 * one["n1"]).all()
    sd = mh_bootstrap_sd(per, n_boot=60, seed=3)
    # brute force: resample the test patients, recount every stratum, MH over the strata
    from robustbench_fm.core.stats import mantel_haenszel_rd
    test = per[(per["split"] == "test") & per["pred"].notna() & per["discordant"].notna()].copy()
    test["miss"] = ~test["pred"].astype(bool)
    order = np.unique(test["patient_id"].astype(str))
    code = np.searchsorted(order, test["patient_id"].astype(str))
    draws = np.random.default_rng(3).integers(0, len(order), size=(60, len(order)))
    brute = []
    for d in draws:
        t = test.assign(w=np.bincount(d, minlength=len(order))[code])
        t["a"] = t["w"] * t["miss"]
        g = t.groupby(["encoder", "finding", t["discordant"].astype(bool)])[["a", "w"]].sum().unstack(fill_value=0)
        brute.append(mantel_haenszel_rd(g[("a", True)], g[("w", True)], g[("a", False)], g[("w", False)])["rd"])
    assert sd["All encoders"] == pytest.approx(np.nanstd(brute, ddof=1), rel=1e-9)
    frame = candor_head_errors(SweepResults(panel[0]))[0].frame.set_index("Encoder")
    assert frame.loc["Published (candor.md)", "MH difference"] == 0.136
    assert frame.loc["All encoders", "MH ±"] > 0
