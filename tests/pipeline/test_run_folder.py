"""A run folder holds one run (issue 54 item 4): a second, different run aimed at a folder that
holds a run (``hydra.run.dir=<folder>``) used to exit 0, overwrite the first run's config.yaml and
summary and mix the two in its report. It is refused in one line naming the folder, what differs
and ``hydra.run.dir``, and the folder is left as it was; the same run resumed there (only how fast
it runs may change) goes on. A disk that fills up (item 10) is one line naming the full folder and
the setting that moves it."""
import errno
import json
import os

import pytest
from hydra import compose, initialize_config_dir
from plan_fixtures import compose_job

from robustbench_fm.cli.main import CONFIG_DIR
from robustbench_fm.core.errors import InvalidSetting, UserError
from robustbench_fm.pipeline import job
from robustbench_fm.pipeline.experiment import JobsRefused, check_jobs
from robustbench_fm.pipeline.plan import plan
from robustbench_fm.report.long_format import config_hash

FIRST = ["experiment=demo", "encoder=planted_sharp", "dataset.options.n=40"]
OTHER = ["experiment=demo", "encoder=planted_blur", "dataset.options.n=30"]


def _plan(tmp_path, overrides):
    return plan(compose_job(tmp_path, overrides), overrides)


def _finished(out, p):
    """``out`` as a finished run of plan ``p`` leaves it (its bookkeeping; the results stand in)."""
    with job.recorded(out) as record:
        record.claim(p)
        (out / "config.yaml").write_text(p.config_yaml)
        (out / "summary.md").write_text("the first run's summary\n")
    return {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()}


def test_a_folder_holding_another_run_is_refused_in_one_line_and_left_as_it_was(tmp_path):
    out = tmp_path / "run"
    first, other = _plan(tmp_path, FIRST), _plan(tmp_path, OTHER)
    files = _finished(out, first)
    assert json.loads(files["status.json"])["encoders"] == ["planted_sharp"]
    with pytest.raises(job.RunFolderTaken) as err:
        with job.recorded(out) as record:
            record.claim(other)
            raise AssertionError("the other run must not start")
    assert isinstance(err.value, UserError)
    assert str(err.value) == (
        f"run folder {out} holds another run (config hash {config_hash(first.config)} there, "
        f"{config_hash(other.config)} here: encoders [planted_sharp] there, [planted_blur] here; "
        f"dataset.options.n 40 there, 30 here); run this one into another folder with hydra.run.dir=<folder>, "
        f"or delete {out} to replace that run")
    assert {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()} == files  # status.json too
    assert not (out / ".lock").exists()


def test_the_same_run_resumed_in_its_folder_goes_on(tmp_path):
    out = tmp_path / "run"
    _finished(out, _plan(tmp_path, FIRST))
    # how fast it runs and where the caches are may change; what it computes may not
    again = _plan(tmp_path, [*FIRST, "extract.batch_size=8", "extract.num_workers=0", "debug=true",
                             f"paths.cache_dir={tmp_path / 'elsewhere'}"])
    with job.recorded(out) as record:
        assert record.claim(again) is again
    assert json.loads((out / "status.json").read_text())["status"] == "done"
    with pytest.raises(job.RunFolderTaken, match=r"stage\.params\.k 5 there, 3 here\)"):
        with job.recorded(out) as record:
            record.claim(_plan(tmp_path, [*FIRST, "stage.params.k=3"]))


def test_a_folder_written_before_status_json_named_its_encoders_is_compared_by_its_entries(tmp_path):
    """A run folder of an earlier release: its config.yaml and entries.json say what it ran."""
    out = tmp_path / "run"
    first = _plan(tmp_path, FIRST)
    _finished(out, first)
    (out / "status.json").write_text(json.dumps({"status": "done", "error": ""}))
    (out / "entries.json").write_text(json.dumps({"entries": [{"encoder": "planted_sharp"}]}))
    with pytest.raises(job.RunFolderTaken, match=r"encoders \[planted_sharp\] there, \[planted_blur\] here"):
        with job.recorded(out) as record:
            record.claim(_plan(tmp_path, [*FIRST[:1], "encoder=planted_blur", *FIRST[2:]]))
    with job.recorded(out) as record:
        record.claim(first)


def test_a_plan_that_fails_in_a_folder_holding_a_finished_run_keeps_its_status(tmp_path):
    out = tmp_path / "run"
    files = _finished(out, _plan(tmp_path, FIRST))
    with pytest.raises(InvalidSetting):
        with job.recorded(out):
            raise InvalidSetting("stage.params.k=0: a bad option of the second command")
    assert (out / "status.json").read_bytes() == files["status.json"]
    fresh = tmp_path / "fresh"  # a folder without a finished run records the failure, as always
    with pytest.raises(InvalidSetting):
        with job.recorded(fresh):
            raise InvalidSetting("stage.params.k=0: bad")
    assert json.loads((fresh / "status.json").read_text())["status"] == "failed"


def _unit_job(tmp_path, num, folder, overrides):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        full = compose("config", overrides=[f"paths.root={tmp_path}", *overrides], return_hydra_config=True)
    return {"num": num, "dir": folder, "overrides": overrides, "config": full}


def test_an_experiments_job_folder_holding_another_runs_job_is_a_problem_before_any_job_runs(tmp_path):
    """A job folder that says done used to be skipped whatever run it held: an experiment run into
    another experiment's folder collected the other's results as its own."""
    run_dir = tmp_path / "unit"
    held = plan(compose_job(tmp_path, FIRST), FIRST, multirun=True)
    _finished(run_dir / "0_planted_sharp-planted-candor", held)
    same = _unit_job(tmp_path, 0, "0_planted_sharp-planted-candor", FIRST)
    check_jobs([same], run_dir)  # the same job, done: skipped
    other = _unit_job(tmp_path, 0, "0_planted_sharp-planted-candor", [*FIRST, "stage.params.k=3"])
    with pytest.raises(JobsRefused) as err:
        check_jobs([other], run_dir)
    hashes = config_hash(held.config), config_hash(_plan(tmp_path, [*FIRST, "stage.params.k=3"]).config)
    assert err.value.lines == [
        f"problem 1, 1 job (#0): run folder {run_dir} holds the jobs of another run (0_planted_sharp-planted-candor: "
        f"config hash {hashes[0]} there, {hashes[1]} here: stage.params.k 5 there, 3 here); run this one into "
        "another folder with hydra.run.dir=<folder>"]


def _full(filename=None):
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), *([filename] if filename else []))


def test_a_full_disk_names_its_folder_and_the_setting_that_moves_it(tmp_path):
    p = _plan(tmp_path, FIRST)
    out = tmp_path / "outputs" / "runs" / "r"
    shard = p.paths.cache_dir / "planted_sharp" / "images-x" / "c" / "shard-00000.parquet"
    line = job.full_disk_line(_full(str(shard)), job._folders(p, out))  # the file named: its folder
    assert line == (f"no space left on the disk of {p.paths.cache_dir} (the feature cache: No space left on "
                    "device); free space there or move it with paths.cache_dir=<a folder on a disk with room>; "
                    "nothing written before is lost (finished feature-cache shards are kept and the same command "
                    "resumes)")
    # no file named (a write(2) on an open file): the folder being written, when no disk is short of room
    assert job.disk_full(_full(), p, out).args[0].startswith(
        f"no space left on the disk of {out} (the run folder: No space left on device); free space there or move "
        "it with paths.output_root=<a folder on a disk with room>;")
    assert f"{p.paths.prepared_dir} (the prepared-image store" in job.full_disk_line(
        _full(str(p.paths.prepared_dir / "224px" / "k" / "shard-00000.parquet")), job._folders(p, out))
    assert "with hydra.run.dir=<a folder" in str(job.disk_full(_full(), p, tmp_path / "mine"))  # outside output_root
    assert "(the feature cache: " in job.disk_full(_full(), p, out, "the feature cache").args[0]
