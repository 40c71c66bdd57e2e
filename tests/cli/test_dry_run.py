"""The dry run of an experiment or a sweep (robustbench_fm.cli.sweeps.dry_run_sweep): every job is
listed with its verdict, and each distinct problem is printed once, with how many jobs and which
ones it stops, instead of the same line once per job."""
import pytest
from hydra import compose, initialize_config_dir

from robustbench_fm.cli.main import CONFIG_DIR
from robustbench_fm.cli.sweeps import dry_run_sweep, problem_lines


def _dry_run(tmp_path, capsys, *overrides) -> tuple[int, list[str]]:
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        config = compose("config", overrides=[f"paths.root={tmp_path}", *overrides], return_hydra_config=True)
        rc = dry_run_sweep(config, unit_dir=tmp_path / "run")
    return rc, capsys.readouterr().out.splitlines()


@pytest.mark.slow  # 66 jobs composed and planned (about 20 s)
def test_chest_candor_without_its_datasets_prints_each_missing_root_once_with_its_jobs(tmp_path, capsys):
    rc, lines = _dry_run(tmp_path, capsys, "experiment=chest_candor")
    assert rc == 2
    assert lines[0].startswith("dry run of an experiment: 66 jobs, run one after another in this process")
    jobs = [line for line in lines if line.startswith("  #")]
    assert len(jobs) == 66 and jobs[0] == "  #0 0_rad_dino-mimic_cxr-candor: error (problem 1)"
    assert jobs[3] == "  #3 3_rad_dino-chexpert-candor: error (problem 2)"
    data = tmp_path / "data"
    mimic = (f"dataset 'mimic_cxr': root '{data / 'mimic-cxr-jpg/2.1.0'}' does not exist; set "
             "paths.data_dir=<folder holding mimic-cxr-jpg/2.1.0> (where every dataset's folder is looked for) "
             "or dataset.root=<folder holding the dataset>")
    chexpert = (f"dataset 'chexpert': root '{data / 'CheXpert-v1.0-small'}' does not exist; set "
                "paths.data_dir=<folder holding CheXpert-v1.0-small> (where every dataset's folder is looked "
                "for) or dataset.root=<folder holding the dataset>")
    # the 11 encoders x (candor, linear_head, retention) on MIMIC-CXR are jobs 6i..6i+2, on CheXpert 6i+3..6i+5
    mimic_runs = ", ".join(f"#{6 * i}-{6 * i + 2}" for i in range(11))
    chexpert_runs = ", ".join(f"#{6 * i + 3}-{6 * i + 5}" for i in range(11))
    assert lines[-3:] == [
        f"problem 1, 33 jobs ({mimic_runs}): {mimic}",
        f"problem 2, 33 jobs ({chexpert_runs}): {chexpert}",
        "nothing was launched (dry_run=true); 66 of 66 jobs would fail their checks (2 distinct problems above)"]
    text = "\n".join(lines)
    assert text.count("does not exist") == 2  # each problem once, not once per job
    assert not (tmp_path / "run").exists()  # nothing written


def test_problem_lines_count_every_job_and_shorten_long_runs():
    assert problem_lines({"a": [0], "b": [1, 2, 3, 5]}) == ["problem 1, 1 job (#0): a",
                                                            "problem 2, 4 jobs (#1-3, #5): b"]
    line = problem_lines({"c": list(range(0, 40, 2))})[0]  # 20 runs of one job each
    assert line == ("problem 1, 20 jobs (" + ", ".join(f"#{n}" for n in range(0, 24, 2))
                    + ", ... (8 more runs)): c")
