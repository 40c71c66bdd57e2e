"""Bad configs fail in one line before heavy work; a task a stage cannot score is recorded and
the run goes on (issue: reliability 4)."""
from pathlib import Path

import cli_process
import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

import robustbench_fm
from robustbench_fm.cli.main import CONFIG_DIR
from robustbench_fm.pipeline.job import USER_ERRORS
from robustbench_fm.pipeline.plan import plan as plan_job

pytestmark = pytest.mark.slow  # command-line subprocesses: the full suite runs them

ROOT = Path(__file__).resolve().parents[2]


def plan(tmp_path, *overrides):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.root={tmp_path}", *overrides])
    return plan_job(cfg, list(overrides))


@pytest.mark.parametrize("overrides, message", [
    (["encoders=[rad_dinoo]"], "unknown encoder 'rad_dinoo'; did you mean rad_dino"),
    (["stage.name=candr"], "unknown stage 'candr'; did you mean candor"),
    (["dataset.name=plantd"], "unknown dataset 'plantd'; did you mean planted"),
    (["dataset.generate=false", "dataset.root=/nonexistent/chexpert"],
     "root '/nonexistent/chexpert' does not exist"),
    (["stage.params.k=0"], "k=0 must be at least 1"),
    (["stage.params.bank_size=5"], "bank_size=5 must exceed k=5"),
    (["stage.params.n_boot=-1"], "n_boot=-1"),
])
def test_bad_options_fail_in_plan_with_one_line(tmp_path, overrides, message):
    with pytest.raises(USER_ERRORS) as err:
        plan(tmp_path, *overrides)
    text = err.value.args[0] if isinstance(err.value, KeyError) else str(err.value)
    assert message in text and "\n" not in text


def test_cli_prints_one_line_and_exits_2_before_any_work(tmp_path):
    proc = cli_process.run(["-m", "robustbench_fm", f"paths.output_root={tmp_path}",
                           "encoders=[planted_blur,dinov2_ll]"], cwd=ROOT, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: unknown encoder 'dinov2_ll'; did you mean dinov2_l, dinov3_l, dinov2_b?")
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "demo_data").exists() and not (tmp_path / "cache").exists()


def test_groups_a_stage_cannot_score_are_recorded_and_the_rest_goes_on():
    rng = np.random.default_rng(0)
    labels = np.r_[np.ones(50), np.zeros(50), np.zeros(30), np.ones(4), np.zeros(40)]
    groups = ["ok"] * 100 + ["no_positive"] * 30 + ["k_exceeds_bank"] * 44
    man = pd.DataFrame({"sample_id": [f"s{i}" for i in range(174)], "patient_id": [f"p{i}" for i in range(174)],
                        "acq_group": groups, "finding": labels})
    res = robustbench_fm.evaluate("candor", rng.normal(size=(174, 8)), man, finding="finding", n_boot=10)
    s = res.summary.set_index("acq_group")
    assert "0 positives" in s.loc["no_positive", "reason"]
    assert "4 positives" in s.loc["k_exceeds_bank", "reason"]
    assert s.loc["ok", "reason"] == "" and s.loc["__pooled__", "n_queries"] == 50
    assert set(res.per_sample["acq_group"]) == {"ok"}
