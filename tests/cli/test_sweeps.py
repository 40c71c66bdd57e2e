"""Sweeps (issue 9, "Launchers" and "Sharded extraction"): `-m` fans a panel out into one job per
encoder on submitit's local executor (the Slurm code path without a cluster), sharded extraction
jobs are collected into the stage's results, and an incomplete entry is refused by name."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import cli_process
import pandas as pd
import pytest

from robustbench_fm.cli.sweeps import IncompleteSweep, collect, sweep_values

pytestmark = pytest.mark.slow
SMALL = ["experiment=demo", "encoders=[planted_blur,planted_sharp]", "dataset.options.n=40",
         "stage.params.n_boot=20"]
#: the checkout under test, ahead of any installed copy, for commands run from a scratch folder
REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def cli(*args, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    proc = cli_process.run(["-m", "robustbench_fm", *args], cwd=cwd, timeout=900, env=ENV)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def pooled(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["acq_group"] == "__pooled__"].set_index("encoder")[["d", "d_sd", "d_all", "margin_auroc"]]


def test_readme_multirun_writes_under_the_launch_folder(tmp_path):
    """The README's `python -m robustbench_fm -m encoder=planted_blur,planted_sharp`, as written (plus
    appended size overrides), run from a scratch folder: no paths.output_root, no hydra.sweep.dir."""
    proc = cli("-m", "encoder=planted_blur,planted_sharp", "dataset.options.n=40", "stage.params.n_boot=20",
               cwd=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs"]
    sweeps = list((tmp_path / "outputs" / "multirun").glob("*/*"))
    assert len(sweeps) == 1
    sweep = sweeps[0]
    for job, encoder in [("0_planted_blur-planted-candor", "planted_blur"),
                         ("1_planted_sharp-planted-candor", "planted_sharp")]:
        assert json.loads((sweep / job / "status.json").read_text())["status"] == "done"
        assert set(pd.read_parquet(sweep / job / "summary.parquet")["encoder"]) == {encoder}
    combined = pd.read_parquet(sweep / "combined.parquet")
    assert sorted(combined["encoder"].unique()) == ["planted_blur", "planted_sharp"]
    assert pooled(combined).loc["planted_sharp", "d"] == 0.0
    assert list((tmp_path / "outputs" / "cache" / "features").iterdir())  # the cache under the launch folder too
    assert str(sweep / "combined.parquet") in proc.stdout


@pytest.mark.parametrize("launcher", ["local", "submitit_local"])
def test_a_failed_job_is_recorded_and_the_sweep_runs_every_other_job(tmp_path, launcher):
    """Job 0 fails (a bad option, found when the job starts), job 1 still runs; the collect step
    merges job 1, lists job 0 in missing.txt, the console ends with the summary line and the
    sweep's exit code is 1."""
    sweep = tmp_path / "sweep"
    proc = cli("-m", "encoder=planted_sharp", "dataset.options.n=40", "stage.params.n_boot=-1,20",
               f"launcher={launcher}", f"hydra.sweep.dir={sweep}", cwd=tmp_path, check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    failed, ok = "0_planted_sharp-planted-candor", "1_planted_sharp-planted-candor"
    assert [j["dir"] for j in json.loads((sweep / "jobs.json").read_text())["jobs"]] == [failed, ok]
    status = json.loads((sweep / failed / "status.json").read_text())
    assert {k: status[k] for k in ("status", "error")} == {
        "status": "failed", "error": "InvalidSetting: candor: n_boot=-1 must be 0 or more"}
    assert status["start"] <= status["end"]
    assert json.loads((sweep / ok / "status.json").read_text())["status"] == "done"
    assert set(pd.read_parquet(sweep / "combined.parquet")["job"]) == {ok}
    assert (sweep / "missing.txt").read_text() == (f"{failed}: failed "
                                                   "(InvalidSetting: candor: n_boot=-1 must be 0 or more)\n")
    assert proc.stderr.strip().splitlines()[-1] == (
        f"1 of 2 jobs failed: {failed} (failed: InvalidSetting: candor: n_boot=-1 must be 0 or more); "
        f"see {sweep / 'missing.txt'}")
    assert "Traceback" not in proc.stderr


def test_panel_fans_out_on_submitit_local_and_collect_combines(tmp_path):
    sweep = tmp_path / "sweep"
    cli("-m", *SMALL, "launcher=submitit_local", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert jobs == ["0_planted_blur-planted-candor", "1_planted_sharp-planted-candor"]
    assert list((sweep / ".submitit").iterdir())  # the jobs really went through submitit
    combined = pd.read_parquet(sweep / "combined.parquet")
    assert sorted(combined["encoder"].unique()) == ["planted_blur", "planted_sharp"]
    assert (sweep / "missing.txt").read_text() == ""
    assert pooled(combined).loc["planted_sharp", "d"] == 0.0


def test_sharded_sweep_equals_one_job_and_incomplete_parts_are_refused(tmp_path):
    sweep = tmp_path / "sweep"
    cli("-m", *SMALL, "extract.num_shards=2", "extract.shard=range(2)", "extract.shard_size=8",
        f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert len(list(sweep.glob("*/extracted.json"))) == 4
    sharded = pd.read_parquet(sweep / "combined.parquet")
    assert set(sharded["job"]) == {"collect/planted-candor"}
    cli(*SMALL, "hydra.run.dir=" + str(tmp_path / "single"), cwd=tmp_path)
    single = pd.read_parquet(tmp_path / "single" / "summary.parquet")
    pd.testing.assert_frame_equal(pooled(sharded).sort_index(), pooled(single).sort_index())

    # only part 0 of 3 of a new entry (30 images in an empty cache: a chunk of 4 shards of 8, part 0
    # holds shards 0 and 3; in the shared cache the store would hold some of these images already)
    partial = tmp_path / "partial"
    cli("-m", *SMALL, "dataset.options.n=30", "extract.num_shards=3", "extract.shard=0", "extract.shard_size=8",
        f"paths.cache_dir={tmp_path / 'cache-partial'}", f"hydra.sweep.dir={partial}", cwd=tmp_path)
    proc = cli("collect", str(partial), cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert "lacks 2 shards (shard-00001.parquet, shard-00002.parquet)" in proc.stderr
    assert "planted_blur" in (partial / "missing.txt").read_text()


def test_collect_lists_failed_jobs_and_keeps_the_others(tmp_path):
    ok, bad = tmp_path / "0_ok", tmp_path / "1_bad"
    ok.mkdir()
    bad.mkdir()
    (ok / "status.json").write_text(json.dumps({"status": "done", "error": ""}))
    pd.DataFrame({"encoder": ["a"], "d": [0.25]}).to_parquet(ok / "summary.parquet")
    (bad / "status.json").write_text(json.dumps({"status": "failed", "error": "ValueError: boom"}))
    combined = collect(tmp_path)
    assert combined.to_dict("records") == [{"encoder": "a", "d": 0.25, "job": "0_ok"}]
    assert (tmp_path / "missing.txt").read_text() == "1_bad: failed (ValueError: boom)\n"
    assert pd.read_csv(tmp_path / "combined.csv")["d"].dtype == float


def test_sweep_values():
    assert sweep_values(["a", "b"], "x") == "a,b" and sweep_values(None, "x") == "x"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        collect("/nonexistent/sweep")
    assert issubclass(IncompleteSweep, RuntimeError)


def test_dry_run_of_a_slurm_sweep_lists_its_jobs_and_launches_nothing(tmp_path):
    """No Slurm needed: the launcher settings and every job's checked plan, nothing submitted."""
    proc = cli("-m", "encoder=planted_blur,planted_sharp", "launcher=slurm", "hydra.launcher.partition=gpu",
               "dry_run=true", cwd=tmp_path)
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("dry run of a sweep: 2 jobs with SlurmLauncher (partition=gpu, gpus_per_node=1,")
    assert lines[1:] == ["  #0 0_planted_blur-planted-candor: ok", "  #1 1_planted_sharp-planted-candor: ok",
                         "nothing was launched (dry_run=true); every job's names, data folders and options check out"]
    assert not list(tmp_path.iterdir())  # no sweep folder, no .submitit, no generated data
    bad = cli("-m", "encoder=planted_blur", "dataset=chexpert,planted", "dataset.root=nowhere", "dry_run=true",
              cwd=tmp_path, check=False)
    assert bad.returncode == 2
    assert bad.stdout.strip().splitlines()[1:] == [
        "  #0 0_planted_blur-chexpert-candor: error (problem 1)",
        "  #1 1_planted_blur-planted-candor: ok",
        "problem 1, 1 job (#0): dataset 'chexpert': root 'nowhere' does not exist; "
        "set dataset.root=<folder holding the dataset>",
        "nothing was launched (dry_run=true); 1 of 2 jobs would fail their checks (1 distinct problem above)"]
