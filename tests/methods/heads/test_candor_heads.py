"""CANDOR joined with the heads, and the cross-encoder tables built from it."""
import numpy as np
import pandas as pd
import pytest
import torch
from heads_data import synthetic

from robustbench_fm.core.neighbors import l2_normalize
from robustbench_fm.core.tables import SweepResults
from robustbench_fm.methods.heads import candor_heads
from robustbench_fm.methods.heads.tables import candor_head_errors, candor_table4, candor_v1_consensus

OPTIONS = dict(n_boot=20, epochs=3, bank_size=60, max_group_sample=200, max_test=150)


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    """Three 'encoders' (noisy views of the same planted features) run through candor_heads and
    saved as a run folder."""
    root = tmp_path_factory.mktemp("run")
    (root / "config.yaml").write_text("report: {tables: []}\n")
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
    assert list(frame.columns) == ["Miss rate 263", "Miss rate 33,770", "Miss rate All", "FP rate Negatives"]
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
    assert set(errors.index) == {"enc_a", "enc_b", "enc_c", "All encoders"}
    test_pos = per[(per["split"] == "test") & (per["label"] == 1) & per["discordant"].notna()]
    both = test_pos.groupby(["encoder", "finding"])["discordant"].agg(lambda d: 0 < d.sum() < len(d))
    assert errors.loc["All encoders", "Strata"] == both.sum() >= 3
    a = test_pos[test_pos["encoder"] == "enc_a"]
    assert errors.loc["enc_a", "Miss rate discordant"] == pytest.approx(
        (~a.loc[a["discordant"].astype(bool), "pred"].astype(bool)).mean())
