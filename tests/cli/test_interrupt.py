"""Issue 54 item 11: Ctrl-C (SIGINT) during a stage was ignored where the command started with
SIGINT ignored (``cmd &`` in a script, a tool that starts it so): the run went on to exit 0 and
``status.json`` said done. The run takes SIGINT back: it stops within seconds with the line
extraction prints, exit 130 and status ``interrupted``. A real subprocess (signals), with a stage
plugin that sleeps until interrupted."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.slow  # a command-line subprocess

REPO = Path(__file__).resolve().parents[2]

SLOW_STAGE = '''
import os
import time
from dataclasses import dataclass
from pathlib import Path

from robustbench_fm.methods import Method, register
from robustbench_fm.methods.params import StageParams


@dataclass(frozen=True)
class SlowParams(StageParams):
    STAGE = "slow"


PARAMS = SlowParams
register(Method("slow", "a stage that takes two minutes (a test method)", __name__, params=SlowParams))


def run(features, manifest, finding, **params):
    Path(os.environ["SLOW_STAGE_STARTED"]).touch()
    time.sleep(120)
    raise RuntimeError("the stage was not interrupted")
'''


def test_ctrl_c_during_a_stage_stops_the_run_with_exit_130_even_where_sigint_started_ignored(tmp_path):
    (tmp_path / "slow_stage.py").write_text(SLOW_STAGE)
    rng = np.random.default_rng(0)
    ids = [f"s{i}" for i in range(12)]
    pd.DataFrame({"sample_id": ids, "embedding": list(rng.normal(size=(12, 4)).astype(np.float32))}).to_parquet(
        tmp_path / "feats.parquet")
    pd.DataFrame({"sample_id": ids, "acq_group": "g", "lesion": [i % 2 for i in range(12)]}).to_csv(
        tmp_path / "manifest.csv", index=False)
    started, run = tmp_path / "stage_started", tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]), "HF_HUB_OFFLINE": "1",
           "SLOW_STAGE_STARTED": str(started)}
    cmd = [sys.executable, "-m", "robustbench_fm", f"paths.root={tmp_path}", "plugins=[slow_stage]",
           "experiment=from_features", "stage=slow", "features_file=feats.parquet", "manifest_file=manifest.csv",
           "stage.findings=[lesion]", f"hydra.run.dir={run}"]
    # started as a script's background job is: SIGINT ignored
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline = time.monotonic() + 300
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), proc.communicate()[1][-3000:]
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=60)  # the stage sleeps 120 s: ignored, this times out
        stopped = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-3000:]
    assert stopped < 20
    assert "Traceback" not in err and err.strip().splitlines()[-1] == (
        f"interrupted: run folder {run}; finished feature-cache shards are kept; re-run the same command to resume")
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "interrupted" and status["start"] <= status["end"]
