"""Which encoder (robustbench_fm/report/comparisons.py): paired comparisons rebuilt from saved per-item
tables equal the stages' own summaries, pairs and Holm families, best sets with ties, dropped items,
the rank command and its errors."""
import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from robustbench_fm.cli.main import rank as rank_command
from robustbench_fm.core.stats import holm_adjust
from robustbench_fm.methods.run import score_and_save
from robustbench_fm.report import comparisons as cmp


def _run(tmp_path, stage, feats: dict, manifest, findings, **params):
    """A run folder as a job writes it: each encoder's results under results/ and the config."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(
        {"dataset": {"name": "toy"}, "stage": {"name": stage, "params": params, "findings": list(findings)}}))
    for name, f in feats.items():
        score_and_save(stage, f, manifest, findings, params, tmp_path, name, "toy")
    return tmp_path


def _cohort(n=240, seed=0, groups=("a", "b")):
    rng = np.random.default_rng(seed)
    labels = (rng.random(n) < 0.4).astype(float)
    base = rng.normal(size=(n, 10))
    manifest = pd.DataFrame({"sample_id": [f"s{i:03d}" for i in range(n)], "path": [f"{i}.png" for i in range(n)],
                             "patient_id": [f"p{i // 2}" for i in range(n)],
                             "acq_group": [groups[i % len(groups)] for i in range(n)], "marker": labels,
                             "digit": [str(i % 3) for i in range(n)]})
    sharp, blur = base.copy(), base + 0.5 * rng.normal(size=base.shape)
    sharp[:, 0] += 2.0 * labels
    blur[:, 0] += 0.3 * labels
    twin = sharp + 1e-3 * rng.normal(size=base.shape)  # indistinguishable from sharp
    return manifest, {"sharp": sharp, "twin": twin, "blur": blur}


def test_candor_comparisons_rebuild_every_summary_value_and_rank_with_ties(tmp_path):
    manifest, feats = _cohort()
    run = _run(tmp_path, "candor", feats, manifest, ["marker"], n_boot=0)
    found = cmp.build(run, n_boot=300)
    assert found.notes == []  # every estimate equals the stage's own summary value (else a note says so)
    pairs = found.pairs
    assert set(pairs["metric"]) == {"d", "d_all", "margin_auroc"}
    assert set(pairs["row"]) == {"a", "b", "__pooled__"}
    assert len(pairs) == 3 * 3 * 3  # 3 pairs x 3 metrics x 3 rows
    summary = pd.concat([pd.read_parquet(p) for p in run.glob("results/*/toy/candor/marker/summary.parquet")])
    for _, p in pairs.iterrows():
        s = summary[(summary["acq_group"] == p["row"])].set_index("encoder")[p["metric"]]
        assert p["estimate_a"] == pytest.approx(s[p["encoder_a"]], abs=1e-12)
        assert p["difference"] == pytest.approx(s[p["encoder_a"]] - s[p["encoder_b"]], abs=1e-12)
    for _, family in pairs.groupby(["metric", "row"]):
        np.testing.assert_allclose(family["p_holm"], holm_adjust(family["p"].to_numpy()))
    ranking = found.ranking
    d = ranking[(ranking["metric"] == "d") & (ranking["row"] == "__pooled__")].set_index("encoder")
    assert set(d.index[d["in_best_set"]]) == {"sharp", "twin"}  # a tie: neither significantly worse
    assert not d.loc["blur", "in_best_set"] and d.loc["blur", "gap"] > 0 and d.loc["blur", "gap_ci_low"] > 0
    assert d.loc[d["best"].iloc[0], "rank"] == 1
    line = [v for v in cmp.verdict(found) if v.startswith("marker, CANDOR d ")]
    assert len(line) == 1 and "are indistinguishable" in line[0] and "blur is worse" in line[0]
    assert (run / "comparisons.csv").exists() and (run / "ranking.csv").exists()
    back = cmp.read(run)  # an exact round trip of the numbers
    pd.testing.assert_frame_equal(back.pairs.drop(columns="setting"), found.pairs.drop(columns="setting"),
                                  check_dtype=False)


def test_one_vs_rest_mean_rows_and_pooled_margins_equal_the_summary(tmp_path):
    manifest, feats = _cohort(n=240)
    digit = np.arange(len(manifest)) % 4  # classes 0, 1 in family a; 2, 3 in family b
    manifest = manifest.assign(digit=digit.astype(str), acq_group=np.where(digit < 2, "a", "b"))
    for f in feats.values():
        f[:, 1] += digit  # the classes apart, more or less sharply
    run = _run(tmp_path, "candor", feats, manifest, ["digit"], n_boot=0, task="family_one_vs_rest", k=3)
    found = cmp.build(run, n_boot=100)
    assert found.notes == []
    assert "__mean__ / __pooled__" in set(found.pairs["row"])  # target __mean__, group __pooled__
    assert {"0 / a", "3 / b"} <= set(found.pairs["row"])


def test_an_item_one_encoder_lacks_is_dropped_from_that_pair_and_counted():
    """A pair is compared on the items both encoders have (e.g. an image one encoder's job skipped);
    each encoder's estimate on all of its own items is what its summary shows."""
    rng = np.random.default_rng(3)
    n = 60
    base = pd.DataFrame({"sample_id": [f"s{i}" for i in range(n)], "cluster": [f"p{i // 2}" for i in range(n)],
                         "finding": "f"})
    unit = pd.concat([base.assign(encoder=e, discordant=(rng.random(n) < q).astype(float))
                      for e, q in (("a", 0.2), ("b", 0.5), ("c", 0.3))], ignore_index=True)
    unit = unit[~((unit["encoder"] == "b") & unit["sample_id"].isin(["s0", "s1", "s7"]))]
    paired = cmp.methods.Paired("d", "mean", "discordant")
    pairing = cmp.methods.Pairing(metrics=(paired,), rows=("finding",))
    estimates, records = cmp._compare_unit(unit, paired, pairing, (), "", ["a", "b", "c"], 0, 200)
    own = unit.groupby("encoder")["discordant"].mean()
    assert estimates == pytest.approx(own.to_dict(), abs=1e-15)
    by_pair = {(r["encoder_a"], r["encoder_b"]): r for r in records}
    assert by_pair[("a", "b")]["n_dropped"] == 3 and by_pair[("a", "b")]["n_items"] == n - 3
    assert by_pair[("a", "c")]["n_dropped"] == 0 and by_pair[("a", "c")]["n_items"] == n
    shared = unit[~unit["sample_id"].isin(["s0", "s1", "s7"])].groupby("encoder")["discordant"].mean()
    assert by_pair[("a", "b")]["difference"] == pytest.approx(shared["a"] - shared["b"], abs=1e-15)
    assert by_pair[("a", "b")]["n_clusters"] == 29  # p0 (s0, s1) goes; s7's patient p3 keeps s6


def test_heads_and_croma_compare_their_own_headline_metrics(tmp_path):
    manifest, feats = _cohort()
    heads = _run(tmp_path / "heads", "linear_head", feats, manifest, ["marker"], n_boot=0, epochs=5)
    found = cmp.build(heads, n_boot=100)
    assert found.notes == [] and set(found.pairs["metric"]) == {"auroc"} and len(found.pairs) == 3
    assert found.pairs["n_clusters"].iloc[0] == manifest.loc[
        pd.read_parquet(next(heads.glob("results/sharp/**/per_sample.parquet")))
        .query("split == 'test'")["sample_id"].str[1:].astype(int), "patient_id"].nunique()
    croma_manifest = manifest.assign(bio_label=np.where(manifest["marker"] == 1, "tumour", "normal"),
                                     site=[("A", "B")[i % 2] for i in range(len(manifest))],
                                     slide_id=[f"slide{i // 6}" for i in range(len(manifest))])
    croma = _run(tmp_path / "croma", "croma", feats, croma_manifest, ["bio_label"], k=5, m=3)
    found = cmp.build(croma, n_boot=100)
    assert found.notes == []  # RI and MaRI (pooled ratios) and CRoMa (the median) as the summary has them
    assert set(found.pairs["metric"]) == {"ri", "mari", "croma"}
    assert (found.pairs["n_clusters"] == 40).all()  # slides, not tiles


def test_rank_rebuilds_from_finished_results_and_refuses_what_it_cannot_compare(tmp_path, capsys):
    manifest, feats = _cohort()
    run = _run(tmp_path / "run", "candor", feats, manifest, ["marker"], n_boot=0)
    assert rank_command(str(run)) == 0
    out = capsys.readouterr().out
    assert out.startswith("- marker, CANDOR d (lower is better): ") and (run / "ranking_overall.csv").exists()
    one = _run(tmp_path / "one", "candor", {"sharp": feats["sharp"]}, manifest, ["marker"], n_boot=0)
    assert rank_command(str(one)) == 2
    assert "holds no two encoders" in capsys.readouterr().err
    assert rank_command(str(tmp_path / "nowhere")) == 2
    assert "holds no finished run" in capsys.readouterr().err


def test_error_detection_aurocs_are_compared_per_detector(tmp_path):
    manifest, feats = _cohort()
    run = _run(tmp_path, "error_detection", {k: feats[k] for k in ("sharp", "blur")}, manifest, ["marker"],
               n_boot=0, epochs=3, n_members=2, k=3, bank_size=20)
    found = cmp.build(run, n_boot=50)
    assert found.notes == []  # each detector's AUROC of each encoder's own head errors, as its summary has it
    assert set(found.pairs["metric"]) == {"auroc"} and found.pairs["row"].str.endswith("msp").any()
