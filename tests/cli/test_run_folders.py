"""Issue 54 from the command line. Item 4: a second, different run aimed at a folder holding a run
(``hydra.run.dir=<folder>``) exited 0, overwrote the first run's config.yaml and summary and
compared its encoder with the first run's in its report; it is refused in one line and the folder
is left as it was, while the same command resumes its own run there. Item 15: a run that replaced
the demo's data or stage was titled "demo: ..." and its saved config listed the demo's three
encoders and notes."""
import os
from pathlib import Path

import cli_process
import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

pytestmark = pytest.mark.slow  # command-line runs

REPO = Path(__file__).resolve().parents[2]


def _cli(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]), "HF_HUB_OFFLINE": "1"}
    flags = [a for a in args if a == "-m"]
    return cli_process.run(["-m", "robustbench_fm", *flags, f"paths.root={tmp_path}", *[a for a in args if a != "-m"]],
                           cwd=tmp_path, env=env, timeout=600)


def _own_features(tmp_path, name, seed):
    rng = np.random.default_rng(seed)
    ids = [f"s{i}" for i in range(40)]
    pd.DataFrame({"sample_id": ids, "embedding": list(rng.normal(size=(40, 4)).astype(np.float32))}).to_parquet(
        tmp_path / f"{name}.parquet")
    pd.DataFrame({"sample_id": ids, "acq_group": "g", "patient_id": ids,
                  "lesion": [i % 2 for i in range(40)]}).to_csv(tmp_path / "manifest.csv", index=False)
    return ["experiment=from_features", f"features_file={name}.parquet", "manifest_file=manifest.csv",
            "stage.findings=[lesion]", "stage.params.n_boot=20"]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.suffix != ".log"}


def test_a_different_run_into_a_folder_holding_a_run_is_refused_and_the_same_command_resumes(tmp_path):
    run = tmp_path / "run"
    first = _own_features(tmp_path, "feats_a", 0)
    proc = _cli(tmp_path, *first, f"hydra.run.dir={run}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = _files(run)
    assert {"config.yaml", "summary.parquet", "report.md", "status.json", "entries.json"} <= set(files)
    other = _own_features(tmp_path, "feats_b", 1)
    proc = _cli(tmp_path, *other, f"hydra.run.dir={run}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    # the config hash (results_long.csv's config_hash) leaves out the files and encoders: it is the same
    assert line == (f"error: run folder {run} holds another run (encoders [feats_a] there, [feats_b] here; "
                    "features_file feats_a.parquet there, feats_b.parquet here); run this one into another folder "
                    f"with hydra.run.dir=<folder>, or delete {run} to replace that run")
    assert _files(run) == files  # its config, summary, report and status as the first run left them
    again = _cli(tmp_path, *first, f"hydra.run.dir={run}")  # the same run: it resumes there
    assert again.returncode == 0, again.stderr[-3000:]
    assert _files(run)["config.yaml"] == files["config.yaml"]


def test_a_run_that_is_not_the_demo_is_not_titled_demo_and_saves_the_encoders_it_ran(tmp_path):
    proc = _cli(tmp_path, "stage=logme", "encoder=random_vit_s", "dataset.options.n=40", "device=cpu",
                f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = (tmp_path / "run" / "report.md").read_text()
    assert report.splitlines()[0] == "# LogME on planted (1 encoder)"  # was "# demo: LogME on planted (1 encoder)"
    saved = OmegaConf.load(tmp_path / "run" / "config.yaml")
    assert list(saved.encoders) == ["random_vit_s"] and list(saved.report.notes) == []  # the demo's notes: its data
    assert "D = 0.71" not in report and "encoders:\n- random_vit_s\n" in report  # the resolved config shown


def test_a_sweep_into_a_folder_holding_another_sweep_fails_and_keeps_its_jobs(tmp_path):
    sweep = tmp_path / "sweep"
    proc = _cli(tmp_path, "-m", *_own_features(tmp_path, "feats", 0), f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (job,) = [p for p in sweep.iterdir() if (p / "status.json").is_file()]
    files = _files(job)
    proc = _cli(tmp_path, "-m", *_own_features(tmp_path, "feats", 0), "stage.params.k=3", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 2, proc.stderr[-3000:]  # was 0, with the first sweep's results collected as its own
    lines = proc.stderr.strip().splitlines()
    assert lines[-2].startswith(f"error: job {job.name}: run folder {job} holds another run (config hash ")
    assert "stage.params.k 5 there, 3 here" in lines[-2]
    assert lines[-1] == (f"error: 1 job folders of {sweep} hold another run; run this sweep into another folder with "
                         "hydra.sweep.dir=<folder>")
    assert _files(job) == files
