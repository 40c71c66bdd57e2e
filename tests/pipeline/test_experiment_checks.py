"""Issue 41 item 8: an experiment whose data is missing used to print the same missing-root line
once per job (136 lines for chest_candor's 66 jobs), exit 1 and leave an empty run folder with an
empty report. Every job's plan is checked before the first job runs: each distinct problem once
with the jobs it stops, exit 2, no run folder; robustbench_fm.run raises one UserError."""

import cli_process
import pytest

import robustbench_fm
from robustbench_fm.core.errors import UserError
from robustbench_fm.pipeline.experiment import JobsRefused

SMALL = ["encoders=[planted_blur,planted_sharp]", "stage=candor", "device=cpu"]


def test_run_in_python_raises_one_user_error_naming_each_problem_once_and_writes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(UserError) as err:
        robustbench_fm.run("chest_candor", [f"paths.root={tmp_path}", f"paths.data_dir={tmp_path / 'none'}", *SMALL],
                           run_dir=run_dir)
    assert isinstance(err.value, JobsRefused)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith("nothing was run: 4 of 4 jobs fail their checks (2 distinct problems)")
    assert text.count("does not exist") == 2  # mimic_cxr's and chexpert's root, once each
    assert "problem 1, 2 jobs (#0, #2): dataset 'mimic_cxr': root" in text
    assert "problem 2, 2 jobs (#1, #3): dataset 'chexpert': root" in text
    assert not run_dir.exists()


@pytest.mark.slow  # one command-line subprocess
def test_the_command_line_prints_each_problem_once_exits_2_and_leaves_no_run_folder(tmp_path):
    out = tmp_path / "outputs"
    proc = cli_process.run(["-m", "robustbench_fm", "experiment=chest_candor",
                           f"paths.data_dir={tmp_path / 'none'}", f"paths.output_root={out}", *SMALL],
                           cwd=tmp_path, timeout=600)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith("error: problem 1, 2 jobs (#0, #2): dataset 'mimic_cxr': root")
    assert lines[1].startswith("error: problem 2, 2 jobs (#1, #3): dataset 'chexpert': root")
    assert lines[2] == ("error: nothing was run: 4 of 4 jobs fail their checks (2 distinct problems); "
                        "dry_run=true lists every job")
    assert not (out / "runs").exists() or not any((out / "runs").rglob("*"))
    assert "job 1 of" not in proc.stdout
