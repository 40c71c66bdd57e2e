"""A method defined outside the package (tests/fixtures/toy_method.py) runs from the command line
once named in ``plugins=[...]``: its ``stage=toy_gap`` config is generated from its parameter
class, its console columns, results and report (display name, guide) are the app's, and no file of
the package is edited."""
import os
from pathlib import Path

import cli_process
import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.slow  # command-line subprocesses: the full suite runs them

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


def _cli(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FIXTURES), str(REPO)]), "HF_HUB_OFFLINE": "1"}
    return cli_process.run(["-m", "robustbench_fm", *args], cwd=tmp_path, env=env, timeout=300)


@pytest.fixture
def own_features(tmp_path):
    rng = np.random.default_rng(1)
    feats = rng.normal(size=(30, 4)).astype(np.float32)
    ids = [f"s{i}" for i in range(30)]
    pd.DataFrame({"sample_id": ids, "embedding": list(feats)}).to_parquet(tmp_path / "feats.parquet")
    pd.DataFrame({"sample_id": ids, "lesion": [i % 3 == 0 for i in range(30)]}).astype({"lesion": int}).to_csv(
        tmp_path / "manifest.csv", index=False)
    expected = 3.0 * (feats[::3, 0].astype(np.float64).mean()
                      - np.delete(feats[:, 0], np.arange(0, 30, 3)).astype(np.float64).mean())
    return tmp_path, expected


def test_a_plugin_method_runs_from_the_command_line(own_features):
    tmp_path, expected = own_features
    proc = _cli(tmp_path, "plugins=[toy_method]", "experiment=from_features", "stage=toy_gap",
                "features_file=feats.parquet", "manifest_file=manifest.csv", "stage.findings=[lesion]",
                "stage.params.scale=3.0", f"paths.root={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    [summary] = [p for p in (tmp_path / "outputs").rglob("summary.parquet") if (p.parent / "config.yaml").exists()]
    row = pd.read_parquet(summary).iloc[0]
    assert row["gap"] == pytest.approx(expected, rel=1e-6)
    assert row["encoder"] == "feats" and row["n"] == 30
    assert "| feats | lesion |" in proc.stdout  # the plugin's console columns
    # its report: the display name, headline and guide of its declaration, scale from the run
    md = (summary.parent / "report.md").read_text()
    assert md.startswith("# from_features: toy gap on manifest (1 encoder)\n"), md[:200]
    assert "**toy gap.** gap is the mean of the first feature, times scale = 3.0, over a finding's positives" in md
    assert "<p><b>toy gap.</b> gap is the mean" in (summary.parent / "report.html").read_text()


def test_a_plugin_stage_checks_its_parameters_in_one_line(own_features):
    tmp_path, _ = own_features
    proc = _cli(tmp_path, "plugins=[toy_method]", "experiment=from_features", "stage=toy_gap",
                "features_file=feats.parquet", "manifest_file=manifest.csv", "stage.findings=[lesion]",
                "stage.params.scale=-1.0", f"paths.root={tmp_path}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == "error: toy_gap: scale=-1.0 must be positive"


def test_without_the_plugin_the_stage_is_unknown(own_features):
    tmp_path, _ = own_features
    proc = _cli(tmp_path, "experiment=from_features", "stage=toy_gap", "features_file=feats.parquet",
                "manifest_file=manifest.csv", "stage.findings=[lesion]", f"paths.root={tmp_path}")
    assert proc.returncode == 2 and "toy_gap" in proc.stderr and "Traceback" not in proc.stderr
