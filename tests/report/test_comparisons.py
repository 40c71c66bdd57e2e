"""Which encoder (robustbench_fm/report/comparisons.py): paired comparisons rebuilt from saved per-item
tables equal the stages' own summaries, max-T families whose decisions are their simultaneous intervals,
rank intervals, best sets with ties, encoders scored on other items, metric directions, the verdict's
sentences, the rank command and its errors (issues 46 and 58)."""
import dataclasses

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from robustbench_fm.cli.main import rank as rank_command
from robustbench_fm.methods.run import evaluate as cmp_evaluate
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
    # every estimate equals the stage's own summary value (else a note says so); the margin AUROC is not compared
    assert len(found.notes) == 1 and found.notes[0].startswith("candor margin_auroc: not compared: every image's")
    pairs = found.pairs
    assert set(pairs["metric"]) == {"d", "d_all"}
    assert set(pairs["row"]) == {"a", "b", "__pooled__"}
    assert len(pairs) == 3 * 2 * 3  # 3 pairs x 2 metrics x 3 rows
    summary = pd.concat([pd.read_parquet(p) for p in run.glob("results/*/toy/candor/marker/summary.parquet")])
    for _, p in pairs.iterrows():
        s = summary[(summary["acq_group"] == p["row"])].set_index("encoder")[p["metric"]]
        assert p["estimate_a"] == pytest.approx(s[p["encoder_a"]], abs=1e-12)
        assert p["difference"] == pytest.approx(s[p["encoder_a"]] - s[p["encoder_b"]], abs=1e-12)
        # the decision is the simultaneous interval's: significant exactly where it excludes 0
        assert (p["p_adj"] <= 0.05) == (p["sim_low"] > 0 or p["sim_high"] < 0) == (p["better"] != "")
        assert p["sim_low"] <= p["difference"] <= p["sim_high"]
    ranking = found.ranking
    d = ranking[(ranking["metric"] == "d") & (ranking["row"] == "__pooled__")].set_index("encoder")
    assert set(d.index[d["in_best_set"]]) == {"sharp", "twin"}  # a tie: neither significantly worse
    assert not d.loc["blur", "in_best_set"] and d.loc["blur", "gap"] > 0 and d.loc["blur", "gap_low"] > 0
    assert d.loc[d["best"].iloc[0], "rank"] == 1
    assert d[["rank_low", "rank_high"]].astype(int).to_dict("index") == {
        "sharp": {"rank_low": 1, "rank_high": 2}, "twin": {"rank_low": 1, "rank_high": 2},
        "blur": {"rank_low": 3, "rank_high": 3}}
    line = [v for v in cmp.verdict(found) if v.startswith("marker, CANDOR d ")]
    assert len(line) == 1 and "are indistinguishable" in line[0] and "blur is worse: blur by 0.477" in line[0]
    assert "simultaneous 95% CI 0.244 to 0.710, adjusted p = 0.003" in line[0]
    assert (run / "comparisons.csv").exists() and (run / "ranking.csv").exists()
    back = cmp.read(run)  # an exact round trip of the numbers
    pd.testing.assert_frame_equal(back.pairs.drop(columns="setting"), found.pairs.drop(columns="setting"),
                                  check_dtype=False)
    pd.testing.assert_frame_equal(back.ranking.drop(columns="setting"), found.ranking.drop(columns="setting"),
                                  check_dtype=False)
    shown = cmp.first_metric_rows(found).set_index("encoder")
    assert shown.loc["blur", "ranks"] == "3" and shown.loc["sharp", "ranks"] == "1–2"


def test_one_vs_rest_mean_rows_are_compared(tmp_path):
    manifest, feats = _cohort(n=240)
    digit = np.arange(len(manifest)) % 4  # classes 0, 1 in family a; 2, 3 in family b
    manifest = manifest.assign(digit=digit.astype(str), acq_group=np.where(digit < 2, "a", "b"))
    for f in feats.values():
        f[:, 1] += digit  # the classes apart, more or less sharply
    run = _run(tmp_path, "candor", feats, manifest, ["digit"], n_boot=0, task="family_one_vs_rest", k=3)
    found = cmp.build(run, n_boot=100)
    assert [n.split(":")[0] for n in found.notes] == ["candor margin_auroc"]
    assert "__mean__ / __pooled__" in set(found.pairs["row"])  # target __mean__, group __pooled__
    assert {"0 / a", "3 / b"} <= set(found.pairs["row"])


def test_an_encoder_scored_on_other_items_keeps_its_own_estimate_and_is_not_compared():
    """An encoder whose job skipped images was scored on other items (and, for CANDOR, other banks): it
    is ranked by its own estimate (what its summary shows) with a note, and the others are compared on
    their common items (issue 58 item 6)."""
    rng = np.random.default_rng(3)
    n = 60
    base = pd.DataFrame({"sample_id": [f"s{i}" for i in range(n)], "cluster": [f"p{i // 2}" for i in range(n)],
                         "finding": "f"})
    unit = pd.concat([base.assign(encoder=e, discordant=(rng.random(n) < q).astype(float))
                      for e, q in (("a", 0.2), ("b", 0.5), ("c", 0.3))], ignore_index=True)
    unit = unit[~((unit["encoder"] == "b") & unit["sample_id"].isin(["s0", "s1", "s7"]))]
    paired = cmp.methods.Paired("d", "mean", "discordant", better="lower")
    pairing = cmp.methods.Pairing(metrics=(paired,), rows=("finding",))
    estimates, records, notes, n_clusters = cmp._compare_unit(unit, paired, pairing, (), "", ["a", "b", "c"], 0, 200)
    own = unit.groupby("encoder")["discordant"].mean()
    assert estimates == pytest.approx(own.to_dict(), abs=1e-15)
    assert [(r["encoder_a"], r["encoder_b"]) for r in records] == [("a", "c")]
    assert records[0]["n_items"] == n and n_clusters == 30
    assert notes["b"].startswith("not compared: scored on other items than a and c (3 of their 60 items missing")
    items = unit.assign(dataset="toy")
    found = cmp.compare_tables("candor", items.assign(query=True, discordant_all=items["discordant"],
                                                      target="f", acq_group="g", margin=0.0, label=0.0,
                                                      **{f"{c}_{h}": 0.0 for h in (0, 1)
                                                         for c in ("discordant_bank", "discordant_all_bank")}))
    d = found.ranking[(found.ranking["metric"] == "d") & (found.ranking["row"] == "__pooled__")] \
        if (found.ranking["row"] == "__pooled__").any() else found.ranking[found.ranking["metric"] == "d"]
    d = d.set_index("encoder")
    assert d.loc["b", "estimate"] == pytest.approx(own["b"], abs=1e-15)  # its own D, not the common items'
    assert np.isnan(d.loc["b", "rank_low"]) and d.loc["b", "note"].startswith("not compared")
    line = [v for v in cmp.verdict(found) if " d (" in v][0]
    assert "b was not compared (scored on other items" in line


def test_heads_are_not_compared_and_croma_compares_its_median(tmp_path, capsys):
    manifest, feats = _cohort()
    heads = _run(tmp_path / "heads", "linear_head", feats, manifest, ["marker"], n_boot=0, epochs=5)
    found = cmp.build(heads, n_boot=100)
    assert found.empty and len(found.notes) == 1
    assert found.notes[0].startswith("linear_head auroc: not compared: each encoder's test scores come from a head")
    assert rank_command(str(heads)) == 2  # and rank says why in one line
    assert capsys.readouterr().err.startswith(f"error: rank: nothing in '{heads}' is compared: linear_head auroc: not "
                                              "compared: each encoder's test scores")
    croma_manifest = manifest.assign(bio_label=np.where(manifest["marker"] == 1, "tumour", "normal"),
                                     site=[("A", "B")[i % 2] for i in range(len(manifest))],
                                     slide_id=[f"slide{i // 6}" for i in range(len(manifest))])
    croma = _run(tmp_path / "croma", "croma", feats, croma_manifest, ["bio_label"], k=5, m=3)
    found = cmp.build(croma, n_boot=100)
    assert [n.split(":")[0] for n in found.notes] == ["croma ri", "croma mari"]  # kNN-graph counts: not compared
    assert set(found.pairs["metric"]) == {"croma"}  # the median, as the summary has it
    assert (found.pairs["n_clusters"] == 40).all()  # slides, not tiles


def _rotations(n_patients=160, n_good=21, seed=0, signal=1.4):
    """One latent matrix whose first axis carries the finding, seen by ``n_good`` encoders through their
    own random rotation plus noise of equal size (equally good), and one encoder that is noise alone (no
    signal); 1-4 images per patient, two matched groups."""
    rng = np.random.default_rng(seed)
    per = rng.integers(1, 5, n_patients)
    patient = np.repeat(np.arange(n_patients), per)
    n = len(patient)
    labels = (rng.random(n_patients) < 0.4)[patient].astype(float)
    latent = rng.normal(size=(n, 8))
    latent[:, 0] += signal * labels
    feats = {}
    for e in range(n_good):
        q, _ = np.linalg.qr(rng.normal(size=(8, 8)))
        feats[f"enc{e:02d}"] = latent @ q + 0.6 * rng.normal(size=(n, 8))
    feats["blind"] = rng.normal(size=(n, 8))
    manifest = pd.DataFrame({"sample_id": [f"s{i:04d}" for i in range(n)], "path": [f"{i}.png" for i in range(n)],
                             "patient_id": [f"p{p}" for p in patient], "acq_group": np.where(patient % 2, "a", "b"),
                             "marker": labels})
    return manifest, feats


def test_22_encoders_one_blind_is_significantly_worse_and_out_of_the_best_set(tmp_path):
    """Issue 58 item 1: with 231 pairs Holm on bootstrap p-values could not go below 0.46; the max-T family
    finds the blind encoder worse than the best on pooled D and leaves it out of the best set."""
    manifest, feats = _rotations()
    items, summaries = [], []
    for name, f in feats.items():
        out = cmp_evaluate("candor", f, manifest, finding="marker", n_boot=0)
        items.append(out.items.assign(encoder=name, finding="marker"))
        summaries.append(out.summary.assign(encoder=name))
    found = cmp.compare_tables("candor", pd.concat(items), pd.concat(summaries))
    d = found.ranking[(found.ranking["metric"] == "d") & (found.ranking["row"] == "__pooled__")].set_index("encoder")
    assert len(d) == 22
    pairs, best = found.pairs, d["best"].iloc[0]
    pair = pairs[(pairs["metric"] == "d") & (pairs["row"] == "__pooled__")
                 & ((pairs["encoder_a"] == "blind") | (pairs["encoder_b"] == "blind"))
                 & ((pairs["encoder_a"] == best) | (pairs["encoder_b"] == best))]
    assert pair["p_adj"].iloc[0] <= 0.05 and pair["better"].iloc[0] == d["best"].iloc[0]
    assert not d.loc["blind", "in_best_set"] and d.loc["blind", "rank"] == 22
    assert d.loc["blind", "rank_low"] > 1 and d.loc["blind", "rank_high"] == 22
    good = d.drop(index="blind")
    assert good["rank_low"].max() <= good["rank_high"].min()  # the equal encoders' rank intervals overlap


def test_12_encoders_through_rank(tmp_path, capsys):
    manifest, feats = _rotations(n_good=11, seed=1)
    run = _run(tmp_path / "run", "candor", feats, manifest, ["marker"], n_boot=0)
    assert rank_command(str(run)) == 0
    out = capsys.readouterr().out
    line = [v for v in out.splitlines() if v.startswith("- marker, CANDOR d (lower is better): ")][0]
    assert "blind is worse" in line
    ranking = pd.read_csv(run / "ranking.csv")
    d = ranking[(ranking["metric"] == "d") & (ranking["row"] == "__pooled__")].set_index("encoder")
    assert not d.loc["blind", "in_best_set"] and d.loc["blind", "rank_high"] == 12


def test_every_shipped_compared_metric_declares_its_direction_and_spar_med_is_lower():
    """Issue 58 item 2: no direction is defaulted; SPAR's MED is a distance (lower is better)."""
    for name in cmp.methods.names():
        method = cmp.methods.method(name)
        for paired in method.pairing.metrics if method.pairing else ():
            assert cmp._direction(method, paired) in ("higher", "lower"), (name, paired.metric)
    spar = {p.metric: p.better for p in cmp.methods.method("spar").pairing.metrics}
    assert spar == {"accuracy": "higher", "med": "lower", "patch_acc": "higher"}


def test_a_metric_without_a_direction_is_not_compared_and_the_notes_say_so(monkeypatch):
    method = cmp.methods.method("candor")
    pairing = cmp.methods.Pairing(metrics=(cmp.methods.Paired("d_plain", "mean", "discordant", where="query"),),
                                  rows=("finding", "target", "acq_group"), pool="acq_group", table="items")
    monkeypatch.setattr(cmp.methods, "find", lambda name: dataclasses.replace(method, pairing=pairing,
                                                                                  headline=()))
    rng = np.random.default_rng(0)
    items = pd.concat([pd.DataFrame({"sample_id": [f"s{i}" for i in range(40)], "cluster": [f"p{i}" for i in range(40)],
                                     "finding": "f", "target": "f", "acq_group": "g", "query": True,
                                     "discordant": (rng.random(40) < 0.5) * 1.0, "encoder": e}) for e in "ab"])
    found = cmp.compare_tables("candor", items)
    assert found.empty and found.notes == ["candor d_plain: not compared: its Paired declaration gives no direction; "
                                           "add better='higher' or better='lower' (methods.Paired)"]


def _verdict_of(estimates: dict, better_is: str, significant: set, n_clusters: int = 30, sims=None) -> str:
    """The verdict sentence of one family built by hand: ``significant`` the (winner, loser) pairs."""
    names = sorted(estimates)
    rows = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            diff = estimates[a] - estimates[b]
            lo, hi = (sims or {}).get((a, b), (diff - 0.01, diff + 0.01))
            win = a if (a, b) in significant else b if (b, a) in significant else ""
            rows.append(dict(dataset="toy", setting="s", method="candor", metric="d", finding="f", row="__pooled__",
                             encoder_a=a, encoder_b=b, estimate_a=estimates[a], estimate_b=estimates[b],
                             difference=diff, ci_low=lo, ci_high=hi, p=0.01 if win else 0.5, sim_low=lo,
                             sim_high=hi, p_adj=0.01 if win else 0.5, n_items=50, n_clusters=n_clusters, better=win,
                             better_is=better_is))
    pairs = pd.DataFrame(rows)
    ranking = cmp.rank(pairs)
    return cmp.verdict(cmp.Comparisons(pairs, ranking, cmp.overall(ranking)))[0]


def test_verdict_sentences_print_shortfalls_positive_say_too_few_patients_and_explain_order():
    # higher is better: the shortfall of the worse encoder is positive, and so is the runner-up's gap
    text = _verdict_of({"a": 0.9, "b": 0.7}, "higher", {("a", "b")}, sims={("a", "b"): (0.1, 0.3)})
    assert "b is worse: b by 0.200 (simultaneous 95% CI 0.100 to 0.300, adjusted p = 0.010)" in text
    text = _verdict_of({"a": 0.9, "b": 0.85}, "higher", set(), sims={("a", "b"): (-0.02, 0.12)})
    assert "a and b are indistinguishable" in text and "the gap to b is 0.050 (simultaneous 95% CI -0.020 to 0.120" \
        in text
    text = _verdict_of({"a": 0.9, "b": 0.85}, "higher", set(), n_clusters=4)
    assert text == "f, CANDOR d (higher is better): too few patients to compare (4; at least 5 are needed); a 0.900, " \
                   "b 0.850."
    # c (rank 3) is beaten by a; b (rank 2) by nobody; d (rank 4) by nobody: d stays in the best set below c
    text = _verdict_of({"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4}, "lower", {("a", "c")})
    assert "a, b and d are indistinguishable" in text and "c is worse: c by 0.200" in text
    assert "d stays in the best set though ranked below c: no encoder is significantly better than it" in text


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


def test_error_detection_aurocs_are_not_compared(tmp_path):
    manifest, feats = _cohort()
    run = _run(tmp_path, "error_detection", {k: feats[k] for k in ("sharp", "blur")}, manifest, ["marker"],
               n_boot=0, epochs=3, n_members=2, k=3, bank_size=20)
    found = cmp.build(run, n_boot=50)
    assert found.empty and [n.split(":")[0] for n in found.notes] == ["error_detection auroc"]


def test_items_saved_before_the_banks_role_are_not_compared_and_the_note_says_to_run_again():
    """A results folder of an older version (CANDOR items without the ``*_bank_*`` columns): D and D_all
    would be compared with the banks fixed, which under-covers (docs/comparisons.md), so they are not
    compared, and one line per metric says why and what to do."""
    rng = np.random.default_rng(0)
    n = 40
    items = pd.concat([pd.DataFrame({"sample_id": [f"s{i}" for i in range(n)], "cluster": [f"p{i}" for i in range(n)],
                                     "finding": "f", "target": "f", "acq_group": "g", "query": True,
                                     "discordant": (rng.random(n) < 0.3).astype(float),
                                     "discordant_all": (rng.random(n) < 0.3).astype(float),
                                     "margin": rng.normal(size=n), "label": 1.0, "encoder": e})
                       for e in ("a", "b")], ignore_index=True)
    found = cmp.compare_tables("candor", items)
    assert found.empty
    old = [n for n in found.notes if "run the stage again" in n]
    assert [n.split(":")[0] for n in old] == ["candor d", "candor d_all"]
    assert "no discordant_bank_0 / discordant_bank_1 columns" in old[0]
