"""The collect step's operating k: ``report.croma_k`` median over a roster the user
can name, the paper's published k, or a fixed k (a ``stage.params.k`` is kept too); a panel median is
refused, naming the encoders, when a roster encoder's job failed or never ran, unless
``report.croma_partial_roster=true``."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from croma_sweeps import camelyon_root, compose_cfg, fake_sweep
from omegaconf import OmegaConf

from robustbench_fm.cli.sweeps import collect_and_report
from robustbench_fm.core.errors import UserError
from robustbench_fm.core.tables import SweepResults
from robustbench_fm.data import build_manifest
from robustbench_fm.methods.croma import rescore
from robustbench_fm.methods.croma import tables as tc
from robustbench_fm.methods.croma.panel import median_k
from robustbench_fm.methods.croma.params import PUBLISHED_K
from robustbench_fm.paper import published
from robustbench_fm.pipeline.job import job_manifest


def features_for(manifest, strengths, dim=16, seed=0):
    """Per encoder: label signal a, confounder signal b and noise."""
    rng = np.random.default_rng(seed)
    lab, con = pd.factorize(manifest["bio_label"])[0], pd.factorize(manifest["site"])[0]
    out = {}
    for name, (a, b) in strengths.items():
        d_lab, d_con = rng.standard_normal((lab.max() + 1, dim)), rng.standard_normal((con.max() + 1, dim))
        out[name] = (a * d_lab[lab] + b * d_con[con] + 0.7 * rng.standard_normal((len(lab), dim))).astype(np.float32)
    return out

STRENGTHS = {"uni": (1.2, 0.4), "phikon": (0.5, 1.0), "virchow2": (0.9, 0.9), "conch": (0.3, 1.4)}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("croma_k")
    root = camelyon_root(tmp / "camelyon", slides_per_cell=4, tiles_per_slide=6)
    manifest = build_manifest("pathorob_camelyon", root)
    return tmp, root, manifest, features_for(manifest, STRENGTHS, seed=4)


def sweep(data, tmp_path, overrides=(), encoders=tuple(STRENGTHS), failed=(), planned=()):
    """A finished sweep of ``encoders``, plus failed job folders (no cache entry) and jobs.json
    entries that never started."""
    tmp, root, manifest, feats = data
    names = ",".join(list(encoders) + list(failed) + list(planned))
    cfg = compose_cfg([f"paths.root={tmp}", "experiment=croma_camelyon", f"dataset.root={root}", "device=cpu",
                       f"encoders=[{names}]", "stage.params.k_grid=[1,3,5,7,9,11,21]", *overrides])
    out = tmp_path / "sweep"
    fake_sweep(out, cfg, manifest, {e: feats[e] for e in encoders}, tmp / "cache")
    for n, name in enumerate(failed, start=len(encoders)):
        job = out / f"{n}_{name}-pathorob_camelyon-croma"
        job.mkdir()
        job_cfg = compose_cfg([f"paths.root={tmp}", "experiment=croma_camelyon", f"dataset.root={root}",
                               "device=cpu", f"encoder={name}", *overrides])
        (job / "config.yaml").write_text(OmegaConf.to_yaml(job_cfg))
        (job / "status.json").write_text(json.dumps({"status": "failed", "error": "CUDA out of memory"}))
    if planned:
        jobs = [{"num": i, "dir": p.name, "overrides": []} for i, p in enumerate(sorted(out.iterdir()))]
        jobs += [{"num": len(jobs) + i, "dir": f"{len(jobs) + i}_{name}-pathorob_camelyon-croma",
                  "overrides": [f"encoder={name}"]} for i, name in enumerate(planned)]
        (out / "jobs.json").write_text(json.dumps({"jobs": jobs}))
    return SweepResults(out, load_manifest=job_manifest)


def job_k_star(results) -> dict[str, int]:
    jobs = results.summaries("croma")
    jobs = jobs[~jobs["job"].str.startswith("collect")]
    return {e: int(k) for e, k in zip(jobs["encoder"], jobs["k"])}


def test_the_median_is_taken_over_the_whole_panel_by_default(data, tmp_path):
    results = sweep(data, tmp_path)
    k_star = job_k_star(results)
    assert len(set(k_star.values())) > 1  # the encoders disagree, so the roster matters
    summary = rescore.croma_panel(results).summary
    assert set(summary["k"]) == {median_k(k_star.values())}
    assert summary["k_policy"].iloc[0] == f"k = {median_k(k_star.values())} (lower median of the k* of 4 encoders)"


def test_a_failed_job_stops_the_panel_median_naming_it(data, tmp_path, capsys):
    results = sweep(data, tmp_path, encoders=("uni", "phikon", "virchow2"), failed=("conch",), planned=("gpfm",))
    with pytest.raises(UserError) as err:
        tc.croma_table3(results)
    message = str(err.value)
    assert "\n" not in message and "2 of the 5 roster encoders have no result" in message
    assert "conch (failed: CUDA out of memory)" in message and "gpfm (never started)" in message
    assert "report.croma_partial_roster=true" in message
    collect_and_report(results.root)  # the collect step prints it as one error line
    err_lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err_lines) == 1 and "conch (failed" in err_lines[0]
    assert not (results.root / "tables" / "croma_table3.csv").exists()


def test_a_partial_roster_is_accepted_on_request(data, tmp_path):
    results = sweep(data, tmp_path, ["report.croma_partial_roster=true"], encoders=("uni", "phikon", "virchow2"),
                    failed=("conch",))
    k_star = job_k_star(results)
    summary = rescore.croma_panel(results).summary
    shared = median_k(k_star.values())
    assert set(summary["k"]) == {shared}
    assert summary["k_policy"].iloc[0] == f"k = {shared} (lower median of the k* of 3 encoders, partial roster: " \
                                          "conch missing)"


def test_a_named_roster_sets_the_median_and_the_others_follow(data, tmp_path):
    k_star = job_k_star(sweep(data, tmp_path / "all"))
    low = sorted(k_star, key=k_star.get)[:2]  # the two smallest k*: their lower median is the smallest
    results = sweep(data, tmp_path, [f"report.croma_roster=[{','.join(low)}]"])
    summary = rescore.croma_panel(results).summary
    assert set(summary["k"]) == {min(k_star.values())} and len(summary) == 4
    named = sweep(data, tmp_path / "named", ["report.croma_roster=[uni,gpfm]"])
    with pytest.raises(UserError, match=r"1 of the 2 roster encoders have no result: gpfm \(no job in this sweep\)"):
        rescore.croma_panel(named)


def test_published_and_fixed_k(data, tmp_path):
    results = sweep(data, tmp_path / "published", ["report.croma_k=published"])
    summary = rescore.croma_panel(results).summary
    text = published.text_numbers()
    text = text[text["paper"] == "croma"]
    camelyon_k = text[text["quantity"].str.startswith("Camelyon operating k")]["value"].iloc[0]
    assert set(summary["k"]) == {PUBLISHED_K["pathorob_camelyon"]} == {int(camelyon_k)}
    (t3,) = tc.croma_table3(results)
    assert "k = 11 (the paper's published k)" in t3.caption
    fixed = rescore.croma_panel(sweep(data, tmp_path / "fixed", ["report.croma_k=7"])).summary
    assert set(fixed["k"]) == {7} and fixed["k_policy"].iloc[0] == "k = 7 (fixed)"
    kept = rescore.croma_panel(sweep(data, tmp_path / "stage_k", ["stage.params.k=5"])).summary  # no longer dropped
    assert set(kept["k"]) == {5}
    with pytest.raises(UserError, match="report.croma_k='mean' is unknown"):
        rescore.croma_panel(sweep(data, tmp_path / "bad", ["report.croma_k=mean"]))


def test_published_k_star_of_the_slide_panel(tmp_path):
    """k-star protocol with report.croma_k=published: each slide encoder at its Table 14 k⋆."""
    from croma_sweeps import panda_table

    panda_table(tmp_path / "panda" / "train.csv", per_cell=4)
    for n, view in enumerate(("binary", "isup")):
        cfg = compose_cfg([f"paths.root={tmp_path}", "experiment=croma_pcabiop", f"dataset.root={tmp_path / 'panda'}",
                           "device=cpu", f"dataset.options.view={view}", "dataset.options.per_cell=4",
                           "stage.params.m=2", "stage.params.k_grid=[1,3]", "report.croma_k=published"])
        manifest = build_manifest("pcabiop", tmp_path / "panda", verify_images=False, **dict(cfg.dataset.options))
        rng = np.random.default_rng(n)
        feats = {e: rng.standard_normal((manifest["sample_id"].nunique(), 8)).astype(np.float32)
                 for e in ("prism", "moozy")}
        fake_sweep(tmp_path / "sweep", cfg, manifest, feats, tmp_path / "cache", start=2 * n)
    summary = rescore.croma_panel(SweepResults(tmp_path / "sweep", load_manifest=job_manifest)).summary
    got = {(b, e): int(k) for b, e, k in zip(summary["benchmark"], summary["encoder"], summary["k"])}
    table = published.table("croma", 14, "")
    table = table[table["column"] == "k⋆"]
    want = {(b, e): int(table[(table["section"] == s) & (table["row"] == r)]["value"].iloc[0])
            for b, s in (("pcabiop-binary", "(a) Cancer detection"), ("pcabiop-isup", "(b) ISUP grading"))
            for e, r in (("prism", "PRISM"), ("moozy", "MOOZY"))}
    assert got == want == {("pcabiop-binary", "prism"): 3, ("pcabiop-binary", "moozy"): 9,
                           ("pcabiop-isup", "prism"): 3, ("pcabiop-isup", "moozy"): 11}
