"""Errors (issue 30, item 3): only a user error (bad input) prints as one line naming what to fix;
any other exception is a bug: one line saying so, naming the log file that holds the full
traceback and ``debug=true``. Before, a pandas ``KeyError`` deep in a stage printed as a one-line
"user" error with no traceback anywhere and no hint that it was a bug."""
import os
from pathlib import Path

import cli_process
import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.slow  # command-line subprocesses

REPO = Path(__file__).resolve().parents[2]

BUGGY = '''
from dataclasses import dataclass

from robustbench_fm.methods import Method, register
from robustbench_fm.methods.params import StageParams

@dataclass(frozen=True)
class BuggyParams(StageParams):
    STAGE = "buggy"


PARAMS = BuggyParams
register(Method("buggy", "a stage with a bug (a test method)", __name__, params=BuggyParams))


def run(features, manifest, finding, **params):
    return manifest.groupby("acq_group")["no_such_column"].mean()  # a pandas KeyError: a bug, not the user's
'''


def _cli(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]), "HF_HUB_OFFLINE": "1"}
    return cli_process.run(["-m", "robustbench_fm", f"paths.root={tmp_path}", *args],
                           cwd=tmp_path, env=env, timeout=300)


@pytest.fixture
def own(tmp_path):
    (tmp_path / "buggy_stage.py").write_text(BUGGY)
    rng = np.random.default_rng(0)
    ids = [f"s{i}" for i in range(12)]
    pd.DataFrame({"sample_id": ids, "embedding": list(rng.normal(size=(12, 4)).astype(np.float32))}).to_parquet(
        tmp_path / "feats.parquet")
    pd.DataFrame({"sample_id": ids, "acq_group": "g", "lesion": [i % 2 for i in range(12)]}).to_csv(
        tmp_path / "manifest.csv", index=False)
    return tmp_path


def test_a_bug_deep_in_a_stage_is_one_line_saying_so_with_the_log_holding_the_traceback(own):
    proc = _cli(own, "plugins=[buggy_stage]", "experiment=from_features", "stage=buggy", "features_file=feats.parquet",
                "manifest_file=manifest.csv", "stage.findings=[lesion]")
    assert proc.returncode == 1, proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: KeyError: Column not found: no_such_column; this is a bug in robustbench_fm"), line
    assert line.endswith("; rerun with debug=true to print it")
    log = Path(line.split("the full traceback is in ")[1].split(";")[0])
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "no_such_column" in text and "buggy_stage.py" in text
    debug = _cli(own, "plugins=[buggy_stage]", "experiment=from_features", "stage=buggy",
                 "features_file=feats.parquet", "manifest_file=manifest.csv", "stage.findings=[lesion]", "debug=true")
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr


@pytest.mark.parametrize("override, message", [
    ("fixed_sample=-3", "error: fixed_sample=-3: use null (every image) or the number of positives"),
    ("stage.params.k=0", "error: candor: k=0 must be at least 1"),
])
def test_a_bad_option_is_one_line_naming_it(own, override, message):
    proc = _cli(own, "experiment=demo", "dataset.options.n=20", override)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(message) and "bug" not in line, line
