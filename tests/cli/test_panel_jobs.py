"""``extract.panel_jobs`` (issue 21, section 1: "The multirun fan-out keeps working: a panel
experiment can run as one extraction job per device followed by the stage jobs over cached
features, on the local launcher and on Slurm through submitit").

Each sweep runs in its own output root (its own feature cache), so a stage job that found its
entry complete found what the extraction job of that sweep wrote. The baseline is today's
multirun without the option; the summaries must equal it value for value."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from robustbench_fm.cli.sweeps import extraction_jobs, panel_jobs
from robustbench_fm.core.errors import UserError
from robustbench_fm.core.locking import FileLock

REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           HF_HUB_OFFLINE="1")
SMALL = ["experiment=demo", "encoders=[planted_blur,planted_sharp]", "dataset.options.n=40",
         "stage.params.n_boot=20"]
JOBS = ["0_planted_blur-planted-candor", "1_planted_sharp-planted-candor"]
N_IMAGES = 40  # dataset.options.n=40: 40 images, one manifest row each


def command(root: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "robustbench_fm", "-m", *SMALL, f"paths.output_root={root / 'outputs'}",
            f"hydra.sweep.dir={root / 'sweep'}", *args]


def sweep(root: Path, *args: str) -> subprocess.CompletedProcess:
    root.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(command(root, *args), cwd=root, capture_output=True, text=True, timeout=600, env=ENV)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def summaries(root: Path) -> pd.DataFrame:
    """Every job's summary (one frame, job folders in order), without the job column."""
    return pd.concat([pd.read_parquet(root / "sweep" / job / "summary.parquet") for job in JOBS],
                     ignore_index=True)


def combined(root: Path) -> pd.DataFrame:
    return pd.read_parquet(root / "sweep" / "combined.parquet").drop(columns="job")


def cache_use(root: Path) -> dict[str, dict]:
    """The stage jobs' feature-cache use (their entries.json)."""
    out = {}
    for job in JOBS:
        for e in json.loads((root / "sweep" / job / "entries.json").read_text())["entries"]:
            out[e["encoder"]] = e["cache"]
    return out


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Path:
    """Today's multirun (no extract.panel_jobs) on the local launcher: every stage job extracts."""
    root = tmp_path_factory.mktemp("baseline")
    sweep(root)
    assert not (root / "sweep" / "extract").exists()
    assert {n: (c["embedded"], c["hit"]) for n, c in cache_use(root).items()} == {
        "planted_blur": (N_IMAGES, False), "planted_sharp": (N_IMAGES, False)}
    return root


def assert_same_results(root: Path, baseline: Path) -> None:
    pd.testing.assert_frame_equal(summaries(root), summaries(baseline))
    pd.testing.assert_frame_equal(combined(root), combined(baseline))
    pooled = combined(root).query("acq_group == '__pooled__'").set_index("encoder")
    assert pooled.loc["planted_sharp", "d"] == 0.0  # the planted marker: sharp is perfectly separated


def assert_stage_jobs_only_scored(root: Path) -> None:
    """Each stage job found its entry complete: 0 embedded, a hit; its log has no extraction."""
    assert {n: (c["images"], c["embedded"], c["hit"]) for n, c in cache_use(root).items()} == {
        "planted_blur": (N_IMAGES, 0, True), "planted_sharp": (N_IMAGES, 0, True)}
    for job in JOBS:
        text = (root / "sweep" / job / "main.log").read_text()
        assert f"cache hit: {N_IMAGES} rows, 0 forward passes" in text
        assert "extracting" not in text and "panel pass" not in text


def assert_one_panel_pass(root: Path) -> None:
    """One extraction job, one pass decoding each of the 40 images once for both encoders (the
    panel's own log line, from the rows its DataLoader decodes), and both entries filled by it."""
    sweep_dir = root / "sweep"
    record = json.loads((sweep_dir / "jobs.json").read_text())
    assert [j["dir"] for j in record["jobs"]] == JOBS
    assert record["extraction"] == [{"num": 0, "dir": "extract/0", "panels": [
        {"dataset": "planted", "stage": "candor", "encoders": ["planted_blur", "planted_sharp"]}]}]
    log = (sweep_dir / "extract" / "0" / "extract.log").read_text()
    passes = [line.split(" - ", 1)[1] for line in log.splitlines() if "panel pass:" in line]
    assert passes == [f"panel pass: {N_IMAGES} images decoded once for 2 encoders (planted_blur, planted_sharp)"]
    panel = json.loads((sweep_dir / "extract" / "0" / "panel.json").read_text())["panels"]
    assert [(e["encoder"], e["cache"]["embedded"], e["cache"]["hit"]) for e in panel[0]["entries"]] == [
        ("planted_blur", N_IMAGES, False), ("planted_sharp", N_IMAGES, False)]
    assert json.loads((sweep_dir / "extract" / "0" / "status.json").read_text())["status"] == "done"
    assert (sweep_dir / "missing.txt").read_text() == ""


@pytest.mark.slow
def test_local_launcher_extracts_the_panel_once_then_the_stage_jobs_only_score(tmp_path, baseline):
    root = tmp_path / "panel"
    proc = sweep(root, "extract.panel_jobs=1")
    assert ("extract.panel_jobs=1: 1 panel extraction job first (in this process): "
            "extract/0: planted_blur, planted_sharp on planted") in proc.stdout
    assert_one_panel_pass(root)
    assert_stage_jobs_only_scored(root)
    assert_same_results(root, baseline)


@pytest.mark.slow
def test_submitit_local_extraction_jobs_one_killed_the_other_feeds_its_stage_job(tmp_path, baseline):
    """The Slurm code path without a cluster, in one sweep (``panel_jobs=2``: one submitit
    extraction job per encoder, each its own process in the sweep's submitit folder, then the
    stage jobs as submitit jobs too). Both extraction jobs wait for the dataset's generation lock,
    which this test holds; it kills extract/0 (SIGKILL, as a node failure or the OOM killer
    would) and lets extract/1 go. The sweep says so in one line naming the killed job's log;
    planted_sharp's stage job only scores what extract/1 wrote, planted_blur's extracts its own
    entry; the results equal the baseline's, and missing.txt records the killed extraction job
    without failing the sweep."""
    root = tmp_path / "panel"
    root.mkdir()
    sweep_dir = root / "sweep"
    status_files = [sweep_dir / "extract" / str(i) / "status.json" for i in (0, 1)]
    data = root / "outputs" / "demo_data"
    data.mkdir(parents=True)
    with FileLock(data / ".planted.generate.lock", timeout=0):
        proc = subprocess.Popen(command(root, "extract.panel_jobs=2", "launcher=submitit_local"), cwd=root,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        deadline = time.time() + 300
        while not all(f.exists() for f in status_files) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
        killed, kept = (json.loads(f.read_text()) for f in status_files)
        assert killed["status"] == kept["status"] == "running" and killed["pid"] != os.getpid()
        os.kill(killed["pid"], signal.SIGKILL)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert "2 panel extraction jobs first (submitit, local)" in out
    warnings = [line for line in err.splitlines() if line.startswith("warning: panel extraction job")]
    assert len(warnings) == 1
    assert warnings[0].startswith("warning: panel extraction job extract/0 (planted_blur on planted) "
                                  "failed: UncompletedJobError: ")
    found = re.search(r"; log: (\S+); its stage jobs extract what is missing themselves$", warnings[0])
    log_file = Path(found.group(1))
    job_id = log_file.parent.name
    assert log_file == sweep_dir / ".submitit" / job_id / f"{job_id}_0_log.err" and log_file.is_file()
    assert not list(log_file.parent.glob("*_result.pkl"))  # the killed job: no result
    assert [json.loads(f.read_text())["status"] for f in status_files] == ["failed", "done"]
    # extract/1, the two stage jobs: three submitit jobs with a result
    assert len(list((sweep_dir / ".submitit").glob("*/*_0_result.pkl"))) == 3
    panel = json.loads((sweep_dir / "extract" / "1" / "panel.json").read_text())["panels"]
    assert [(e["encoder"], e["cache"]["embedded"], e["cache"]["hit"]) for p in panel for e in p["entries"]] == [
        ("planted_sharp", N_IMAGES, False)]
    assert {n: (c["embedded"], c["hit"]) for n, c in cache_use(root).items()} == {
        "planted_blur": (N_IMAGES, False), "planted_sharp": (0, True)}
    missing = (sweep_dir / "missing.txt").read_text().splitlines()
    assert len(missing) == 1 and missing[0].startswith("extract/0: failed (UncompletedJobError: ")
    assert missing[0].endswith("; panel extraction only: its stage jobs extracted what was missing themselves")
    assert_same_results(root, baseline)


def _jobs(names: list[str], **changes) -> list[dict]:
    """Stage jobs as plan_jobs gives them, composed from the shipped configs."""
    from hydra import compose, initialize_config_dir

    from robustbench_fm.cli.main import CONFIG_DIR

    out = []
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        for num, name in enumerate(names):
            overrides = [f"encoder={name}", *[f"{k}={v}" for k, v in changes.items()]]
            out.append({"num": num, "dir": str(num), "overrides": overrides,
                        "config": compose("config", overrides=overrides)})
    return out


def test_encoders_are_dealt_round_robin_by_weight_size():
    """Three image encoders over two jobs: the largest and the smallest in job 0, the middle one in
    job 1 (params_m: random_vit_s 22 > planted_blur and planted_sharp, tied at 0.07 and taken in
    name order)."""
    from robustbench_fm import encoders

    names = ["planted_sharp", "random_vit_s", "planted_blur"]
    weights = {n: float(encoders.get(n).params_m or 0) for n in names}
    assert weights["random_vit_s"] > weights["planted_blur"] == weights["planted_sharp"]
    jobs = extraction_jobs(_jobs(names), 2)
    assert [(j["dir"], [n for p in j["panels"] for n, _ in p["encoders"]]) for j in jobs] == [
        ("extract/0", ["random_vit_s", "planted_sharp"]), ("extract/1", ["planted_blur"])]
    assert extraction_jobs(_jobs(names), 5)[2]["panels"][0]["encoders"][0][0] == "planted_sharp"
    assert len(extraction_jobs(_jobs(names), 5)) == 3  # never more jobs than encoders
    # the encoder node travels with each name: the stage job's own options (weights, batch size)
    assert extraction_jobs(_jobs(["planted_blur"], **{"encoder.batch_size": 7}), 1)[0]["panels"][0][
        "encoders"][0][1]["batch_size"] == 7


def test_jobs_that_differ_only_in_stage_parameters_share_one_panel():
    """``-m stage.params.k=3,5`` x two encoders: one panel of two encoders (the manifest and the
    entries do not depend on k); another dataset size is another panel."""
    jobs = _jobs(["planted_blur", "planted_sharp"], **{"stage.params.k": 3})
    jobs += _jobs(["planted_blur", "planted_sharp"], **{"stage.params.k": 5})
    planned = extraction_jobs(jobs, 1)
    assert [[n for n, _ in p["encoders"]] for p in planned[0]["panels"]] == [["planted_blur", "planted_sharp"]]
    jobs += _jobs(["planted_blur"], **{"dataset.options.n": 30})
    planned = extraction_jobs(jobs, 1)
    assert [[n for n, _ in p["encoders"]] for p in planned[0]["panels"]] == [["planted_blur", "planted_sharp"],
                                                                              ["planted_blur"]]


def test_jobs_that_extract_nothing_here_keep_todays_path():
    """Sharded extraction jobs and a stage that drives the encoder itself get no extraction job."""
    assert extraction_jobs(_jobs(["planted_blur"], **{"extract.num_shards": 2}), 1) == []
    assert extraction_jobs(_jobs(["planted_blur"], stage="retention"), 1) == []


@pytest.mark.parametrize("value", [-1, "two", True])
def test_panel_jobs_must_be_a_count(value):
    with pytest.raises(UserError, match=r"extract.panel_jobs=.*: use 0 \(each stage job extracts its own encoder\)"):
        panel_jobs(OmegaConf.create({"extract": {"panel_jobs": value}}))
    assert panel_jobs(OmegaConf.create({"extract": {"panel_jobs": 3}})) == 3


@pytest.mark.slow
def test_dry_run_lists_the_extraction_jobs_before_the_stage_jobs(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "robustbench_fm", "-m", "experiment=demo", "extract.panel_jobs=2",
                           "launcher=slurm", "dry_run=true"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[1:6] == [
        "  extract/0: panel extraction first (random_vit_s, planted_sharp on planted)",
        "  extract/1: panel extraction first (planted_blur on planted)",
        "  #0 0_planted_blur-planted-candor: ok", "  #1 1_planted_sharp-planted-candor: ok",
        "  #2 2_random_vit_s-planted-candor: ok"]
    assert not list(tmp_path.iterdir())  # nothing written


def test_the_slurm_extraction_jobs_take_the_sweeps_launcher_settings(tmp_path, monkeypatch):
    """Built as hydra-submitit-launcher builds the stage jobs' executor: every set field of
    ``hydra.launcher`` (folder, partition, account, setup, resources), unset ones (qos) left out.
    submitit's Slurm executor only checks that ``srun`` exists: a stub on PATH stands in."""
    from hydra import compose, initialize_config_dir

    from robustbench_fm.cli.main import CONFIG_DIR
    from robustbench_fm.cli.sweeps import _executor, _submitit_cluster

    (tmp_path / "srun").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", return_hydra_config=True, overrides=[
            "launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.account=lab", "hydra.launcher.mem_gb=32",
            "hydra.launcher.setup=[module load cuda]", "hydra.job.name=main", f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    assert _submitit_cluster(cfg) == "slurm"
    executor = _executor(cfg, "slurm")._executor
    assert executor.folder == tmp_path / "sweep" / ".submitit" / "%j"
    assert executor.parameters == {
        "time": 240, "cpus_per_task": 8, "gpus_per_node": 1, "ntasks_per_node": 1, "mem": "32GB", "nodes": 1,
        "job_name": "main-extract", "stderr_to_stdout": False, "partition": "gpu", "account": "lab",
        "signal_delay_s": 120, "additional_parameters": {}, "array_parallelism": 32, "setup": ["module load cuda"]}
