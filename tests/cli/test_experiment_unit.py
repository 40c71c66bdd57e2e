"""An experiment is a unit without ``-m`` (issue 30, items 1 and 2): ``python -m robustbench_fm
experiment=chest_candor`` runs every job the ``-m`` sweep would launch, in this process, then the
collect step, and writes the same paper tables, file for file; a resumed run skips the finished
jobs; the dry run lists the jobs and both ways to run them; ``robustbench_fm.run`` writes the
same tables as the command line."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import robustbench_fm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "methods" / "candor"))
import cli_process
from test_chest_candor_e2e import write_chexpert, write_mimic  # noqa: E402

pytestmark = pytest.mark.slow  # command-line runs of a 4-job experiment

SMALL = ["experiment=chest_candor", "encoders=[planted_blur,planted_sharp]", "stage=candor", "stage.params.n_boot=20",
         "device=cpu", "extract.num_workers=0"]


def _cli(root: Path, *args: str) -> subprocess.CompletedProcess:
    flags = [a for a in args if a == "-m"]
    return cli_process.run(["-m", "robustbench_fm", *flags, f"paths.root={root}", *SMALL,
                           *[a for a in args if a != "-m"]], timeout=600, cwd=root)


def _tables(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((folder / "tables").iterdir())}


@pytest.fixture(scope="module")
def chest(tmp_path_factory):
    root = tmp_path_factory.mktemp("chest")
    rng = np.random.default_rng(0)
    write_mimic(root / "data" / "mimic-cxr-jpg" / "2.1.0", rng)
    write_chexpert(root / "data" / "CheXpert-v1.0-small", rng)
    sweep = _cli(root, "-m", f"hydra.sweep.dir={root / 'sweep'}")
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    unit = _cli(root, f"hydra.run.dir={root / 'unit'}")
    assert unit.returncode == 0, unit.stderr[-3000:]
    return root, unit


def test_without_m_the_experiment_runs_every_job_and_writes_the_sweeps_tables(chest):
    """The old code ran one job (mimic_cxr with the whole panel) and wrote no candor_table2."""
    root, proc = chest
    jobs = ["0_planted_blur-mimic_cxr-candor", "1_planted_blur-chexpert-candor", "2_planted_sharp-mimic_cxr-candor",
            "3_planted_sharp-chexpert-candor"]
    for folder in (root / "sweep", root / "unit"):  # the same layout: collect works on either
        assert sorted(p.name for p in folder.iterdir() if (p / "status.json").is_file()) == jobs
        assert (folder / "missing.txt").read_text() == ""
    tables = _tables(root / "unit")
    assert "candor_table2.csv" in tables and tables == _tables(root / "sweep")  # bit for bit
    assert "experiment chest_candor: 4 jobs, one after another in this process" in proc.stdout


def test_a_resumed_run_skips_finished_jobs(chest):
    root, _ = chest
    before = _tables(root / "unit")
    again = _cli(root, f"hydra.run.dir={root / 'unit'}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "4 of 4 jobs already done" in again.stdout and "job 1 of 4" not in again.stdout
    assert _tables(root / "unit") == before


def test_the_dry_run_lists_the_jobs_and_both_ways_to_run_them(chest):
    root, _ = chest
    proc = _cli(root, "dry_run=true", f"hydra.run.dir={root / 'dry'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("dry run of an experiment: 4 jobs, run one after another in this process")
    assert lines[1].startswith("  in this process: python -m robustbench_fm paths.root=")
    assert lines[2].startswith("  fanned out onto the launcher (BasicLauncher): python -m robustbench_fm -m ")
    assert [line.split(":")[0] for line in lines[3:7]] == [
        "  #0 0_planted_blur-mimic_cxr-candor", "  #1 1_planted_blur-chexpert-candor",
        "  #2 2_planted_sharp-mimic_cxr-candor", "  #3 3_planted_sharp-chexpert-candor"]
    assert not (root / "dry").exists() or not any((root / "dry").iterdir())  # nothing written
    sweep = _cli(root, "-m", "dry_run=true")
    assert sweep.stdout.splitlines()[0].startswith("dry run of a sweep: 4 jobs with BasicLauncher")
    assert "  in this process: python -m robustbench_fm " in sweep.stdout


def test_run_from_python_writes_the_command_lines_tables(chest, monkeypatch):
    root, _ = chest
    monkeypatch.chdir(root)
    outcome = robustbench_fm.run("chest_candor", [f"paths.root={root}", *SMALL[1:]], run_dir=root / "python")
    assert outcome.ok, outcome.errors
    assert outcome.run_dir == root / "python" and _tables(root / "python") == _tables(root / "unit")
    assert "candor_table2" in outcome.tables and sorted(outcome.tables["candor_table2"]["Encoder"]) == [
        "planted_blur", "planted_sharp"]
    assert set(outcome.summary["dataset"]) == {"mimic_cxr", "chexpert"}
