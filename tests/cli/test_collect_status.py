"""The collect step accounts for every job of a sweep (issue 16): the job list the sweep wrote
when it started (``jobs.json``) names the jobs that never got a folder, a job whose process was
SIGKILLed (status.json still ``running``, its lock's holder gone) is reported -- and recorded --
as interrupted, and a job still running stays ``running``."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from robustbench_fm.cli.main import collect as cli_collect
from robustbench_fm.cli.sweeps import collect
from robustbench_fm.core.locking import FileLock

pytestmark = pytest.mark.slow  # command-line subprocesses: the full suite runs them

REPO = Path(__file__).resolve().parents[2]
# a job as app.run leaves it while it works: its folder locked, status.json "running"
HOLDER = """
import sys, time
from pathlib import Path
from robustbench_fm.pipeline.job import write_status
from robustbench_fm.core.locking import FileLock
job = Path(sys.argv[1])
with FileLock(job / ".lock", timeout=0):
    write_status(job, "running")
    print("ready", flush=True)
    time.sleep(600)
"""


def _job(sweep: Path, name: str, status: str, error: str = "") -> Path:
    job = sweep / name
    job.mkdir(parents=True)
    (job / "status.json").write_text(json.dumps({"status": status, "error": error}))
    return job


def test_collect_lists_never_started_and_killed_jobs(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    names = ["0_done", "1_failed", "2_killed", "3_running", "4_never"]
    sweep.mkdir()
    (sweep / "jobs.json").write_text(json.dumps({"jobs": [{"num": i, "dir": n, "overrides": []}
                                                          for i, n in enumerate(names)]}))
    pd.DataFrame({"encoder": ["a"], "d": [0.5]}).to_parquet(_job(sweep, "0_done", "done") / "summary.parquet")
    _job(sweep, "1_failed", "failed", "ValueError: boom")
    (sweep / "2_killed").mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(sweep / "2_killed")], stdout=subprocess.PIPE,
                             text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert json.loads((sweep / "2_killed" / "status.json").read_text())["status"] == "running"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    pid = child.pid
    with FileLock(_job(sweep, "3_running", "running") / ".lock"):  # held by a live process: this one
        assert cli_collect(str(sweep)) == 1  # `python -m robustbench_fm collect <sweep>`
    err = capsys.readouterr().err.strip().splitlines()
    killed = f"the run stopped: process {pid} no longer exists on this host"
    lines = (sweep / "missing.txt").read_text().splitlines()
    assert lines[:2] == ["1_failed: failed (ValueError: boom)", f"2_killed: interrupted ({killed})"]
    assert lines[2].startswith(f"3_running: running (held by pid {os.getpid()}@")
    assert lines[3:] == ["4_never: never started"]
    assert err[-1] == (f"4 of 5 jobs failed: 1_failed (failed: ValueError: boom), 2_killed (interrupted), "
                       f"3_running (running) and 1 more; see {sweep / 'missing.txt'}")
    # the killed job's status now says what happened; the lock is left for the next run to break
    assert json.loads((sweep / "2_killed" / "status.json").read_text()) == {"status": "interrupted",
                                                                            "error": killed}
    assert pd.read_csv(sweep / "combined.csv")["job"].tolist() == ["0_done"]


def test_a_complete_sweep_collects_quietly(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "jobs.json").write_text(json.dumps({"jobs": [{"num": 0, "dir": "0_a", "overrides": []}]}))
    pd.DataFrame({"encoder": ["a"], "d": [0.5]}).to_parquet(_job(sweep, "0_a", "done") / "summary.parquet")
    assert cli_collect(str(sweep)) == 0
    assert "failed" not in capsys.readouterr().err
    assert (sweep / "missing.txt").read_text() == ""
    assert collect(sweep)["job"].tolist() == ["0_a"]


def test_a_later_run_in_a_killed_runs_folder_says_it_was_interrupted(tmp_path, caplog):
    from hydra import compose, initialize_config_dir

    from robustbench_fm.cli import app
    from robustbench_fm.cli.main import CONFIG_DIR

    out = tmp_path / "run"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    (out / ".lock").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "created": time.time(),
                                           "token": "t"}))
    (out / "status.json").write_text(json.dumps({"status": "running", "error": ""}))
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.root={tmp_path}", "encoders=[planted_sharp]",
                                           "dataset.options.n=40", "stage.params.n_boot=20"])
    with caplog.at_level("WARNING", logger="robustbench_fm"):
        app.run(cfg, out)
    assert f"{out}: the previous run there was interrupted; running it again" in caplog.messages
    assert json.loads((out / "status.json").read_text())["status"] == "done"
