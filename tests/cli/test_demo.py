"""The embedded default end to end, as a user runs it: `python -m robustbench_fm`."""
import re
import subprocess
from pathlib import Path

import cli_process
import pandas as pd
import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args, cwd=ROOT) -> subprocess.CompletedProcess:
    proc = cli_process.run(["-m", "robustbench_fm", *args], cwd=cwd,
                           timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def cli(*args, cwd=ROOT):
    proc = run_cli(*args, cwd=cwd)
    return proc.stdout + proc.stderr


def latest_run(output_root: Path, kind="runs") -> Path:
    return sorted((output_root / kind).glob("*/*"))[-1]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The README's demo command (``HF_HUB_OFFLINE=1 python -m robustbench_fm``, tests/e2e/test_readme.py's
    RUN_BY) as written, with only the output root appended; then the same again (the cache)."""
    out = tmp_path_factory.mktemp("demo")
    proc = run_cli(f"paths.output_root={out}")
    first = proc.stdout + proc.stderr
    run1 = latest_run(out)
    second = cli(f"paths.output_root={out}", "hydra.run.dir=" + str(out / "runs" / "z" / "second"))
    return out, first, second, run1, out / "runs" / "z" / "second", proc.stdout


def test_demo_reproduces_the_calibration(demo):
    out, first, _, run1, *_ = demo
    summary = pd.read_parquet(run1 / "summary.parquet")
    pooled = summary[summary["acq_group"] == "__pooled__"].set_index("encoder")
    assert set(pooled.index) == {"planted_blur", "planted_sharp", "random_vit_s"}
    blur, sharp = pooled.loc["planted_blur"], pooled.loc["planted_sharp"]
    assert abs(blur["d"] - 0.5) <= 0.1 and blur["d_ci_low"] <= 0.5 <= blur["d_ci_high"]
    assert sharp["d"] == 0.0
    assert pooled["n_queries"].eq(100).all()
    assert "planted_sharp" in first and "| d |" in first.replace(" d ", " d ")
    assert (run1 / "config.yaml").is_file()
    per = pd.read_parquet(run1 / "results/planted_blur/planted/candor/marker/per_sample.parquet")
    assert len(per) == 100 and set(per.columns) >= {"sample_id", "c_pos", "c_neg", "dm", "discordant"}


def test_readme_table_is_what_the_demo_prints(demo):
    """README.md's ```text block under "What the demo shows" is the demo's printed table, line for
    line (the README's demo command runs here, not in tests/e2e/test_readme.py: its RUN_BY)."""
    stdout = demo[-1]
    readme = (ROOT / "README.md").read_text()
    shown = re.search(r"^```text\n(.*?)^```", readme, re.S | re.M).group(1)
    lines = [line for line in shown.splitlines() if line]
    assert lines[0].startswith("| encoder |") and len(lines) == 6  # the table, then the verdict
    missing = [line for line in lines if line not in stdout.splitlines()]
    assert not missing, f"README's demo table differs from the demo's output: {missing}\n{stdout[-2000:]}"


def test_the_demo_says_which_encoder_first(demo):
    """Issue 46: planted_sharp alone is in the best set on D, and the report opens with that verdict."""
    run1 = demo[3]
    ranking = pd.read_csv(run1 / "ranking.csv", keep_default_na=False, na_values=[""])
    d = ranking[ranking["metric"] == "d"]
    assert d[d["in_best_set"].astype(str) == "True"]["encoder"].tolist() == ["planted_sharp"]
    pairs = pd.read_csv(run1 / "comparisons.csv", keep_default_na=False, na_values=[""])
    assert {"method", "metric", "finding", "row", "encoder_a", "encoder_b", "estimate_a", "estimate_b", "difference",
            "ci_low", "ci_high", "p", "sim_low", "sim_high", "p_adj", "n_items", "n_clusters", "better"} \
        <= set(pairs.columns)
    # D and D_all (the margin AUROC is not compared), 3 pairs each, on the demo's one matched group
    assert len(pairs) == 6 and (pairs["n_items"][pairs["metric"] == "d"] == 100).all()
    # issue 58: planted_sharp's 95% rank interval is [1, 1] on D (significantly better than both others)
    sharp = d.set_index("encoder").loc["planted_sharp"]
    assert sharp["rank_low"] == sharp["rank_high"] == 1
    report = (run1 / "report.md").read_text()
    which = report.split("## Which encoder\n\n", 1)[1]
    assert which.startswith("marker, CANDOR d (lower is better): planted_sharp is best alone (0.000)")
    html = (run1 / "report.html").read_text()
    assert html.index("<h2>Which encoder</h2>") < html.index("<h2>How to read this</h2>")


def test_the_demo_scans_its_planted_site(demo):
    """Issue 55 item 4: the demo's run scans the manifest's columns after CANDOR (report.scan: auto).
    Its planted ``site`` (the more right-skewed backgrounds, data/synthetic.py) organises the coarse
    features of planted_blur and random_vit_s, not planted_sharp's local-contrast ones, whose
    neighbourhoods follow the marker alone; the report says so per encoder and shows the scan table."""
    run1 = demo[3]
    score = {}
    for enc in ("planted_blur", "planted_sharp", "random_vit_s"):
        for col in ("site", "marker"):
            row = pd.read_parquet(run1 / f"results/{enc}/planted/confounders/{col}/summary.parquet").iloc[0]
            assert row["n"] == 200 and row["kind"] == ("finding" if col == "marker" else "metadata")
            score[enc, col] = (row["score"], row["score_ci_low"], row["score_ci_high"])
    assert score["planted_blur", "site"][1] > 0.4 and score["random_vit_s", "site"][1] > 0.3
    assert score["planted_sharp", "site"][1] <= 0 <= score["planted_sharp", "site"][2]
    assert score["planted_sharp", "marker"][0] == 1.0
    assert all(score[e, "marker"][1] <= 0 <= score[e, "marker"][2] for e in ("planted_blur", "random_vit_s"))
    report = (run1 / "report.md").read_text()
    follows = report.split("## What the neighbourhoods follow\n\n", 1)[1]
    assert follows.startswith("planted_blur: its neighbourhoods follow `site` (")
    assert "planted_sharp: its neighbourhoods follow `marker` (1.00 [1.00, 1.00])" in follows
    overview = next(line for line in report.splitlines() if line.startswith("Dataset:"))
    assert overview.rstrip().endswith("stages: candor, confounders · finding: marker")  # a column is no finding
    # the CANDOR table the README shows is the stage's alone
    assert set(pd.read_parquet(run1 / "summary.parquet")["finding"]) == {"marker"}


def test_second_run_hits_the_cache_with_zero_forwards(demo):
    out, first, second, run1, run2, _ = demo
    for name in ("planted_blur", "planted_sharp", "random_vit_s"):
        assert f"{name}: 200 images embedded" in first
        assert f"cache hit: 200 rows, 0 forward passes ({out / 'cache' / 'features' / name}/" in second
    assert "images embedded" not in second and "images/s" not in second  # no "0 images ... 0.0 images/s"
    pd.testing.assert_frame_equal(pd.read_parquet(run1 / "summary.parquet"),
                                  pd.read_parquet(run2 / "summary.parquet"))


def test_from_features_cli_matches_the_pipeline(demo, tmp_path):
    out, _, _, run1, *_ = demo
    cache = next((out / "cache" / "features" / "planted_sharp").glob("v-*"))  # the demo manifest's view
    from robustbench_fm import data

    manifest = data.build_manifest("planted", out / "demo_data" / "planted")
    manifest.to_csv(tmp_path / "manifest.csv", index=False)
    cli(f"paths.output_root={tmp_path}", "experiment=from_features", f"features_file={cache}",
        f"manifest_file={tmp_path / 'manifest.csv'}", "stage.findings=[marker]")
    got = pd.read_parquet(latest_run(tmp_path) / "summary.parquet")
    want = pd.read_parquet(run1 / "summary.parquet").query("encoder == 'planted_sharp'")
    cols = ["acq_group", "n_queries", "d", "d_sd", "d_all", "margin_auroc"]
    pd.testing.assert_frame_equal(got[cols].reset_index(drop=True), want[cols].reset_index(drop=True))
    # a features file's run scans its manifest too, to the same numbers as the demo's (same features)
    for col in ("site", "marker"):
        scanned = sorted(latest_run(tmp_path).glob(f"results/*/*/confounders/{col}/summary.parquet"))
        assert len(scanned) == 1, scanned
        got, want = (pd.read_parquet(f).drop(columns=["encoder", "dataset"], errors="ignore") for f in
                     (scanned[0], run1 / f"results/planted_sharp/planted/confounders/{col}/summary.parquet"))
        pd.testing.assert_frame_equal(got, want)  # the names aside (the features file's: manifest)


def test_multirun_over_encoders(demo, tmp_path):
    out, *_ = demo
    cli("-m", "encoder=planted_blur,planted_sharp", f"paths.output_root={tmp_path}",
        f"paths.cache_dir={out / 'cache' / 'features'}", f"dataset.root={out / 'demo_data' / 'planted'}")
    jobs = sorted(p for p in latest_run(tmp_path, "multirun").iterdir() if p.is_dir())
    assert [j.name for j in jobs] == ["0_planted_blur-planted-candor", "1_planted_sharp-planted-candor"]
    sweep = latest_run(tmp_path, "multirun")  # the collect step compares the sweep's two encoders
    better = pd.read_csv(sweep / "comparisons.csv", keep_default_na=False, na_values=[""])
    assert better[better["metric"] == "d"]["better"].tolist() == ["planted_sharp"]
    for job, name in zip(jobs, ["planted_blur", "planted_sharp"]):
        s = pd.read_parquet(job / "summary.parquet")
        assert s["encoder"].unique().tolist() == [name]
        assert (job / "config.yaml").is_file()
