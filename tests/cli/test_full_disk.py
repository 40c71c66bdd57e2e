"""Issue 54 item 10: a full disk (``OSError: [Errno 28]``) was "a bug in robustbench_fm" (exit 1),
after a ``--- Logging error ---`` traceback per log record when the log file's disk was full too.
It is one line naming the full folder and the setting that moves it, exit 2, with everything
written before kept. The disk is not filled: a plugin module makes the writes of one file name
(``FULL_DISK_AT``) and, with ``FULL_DISK_LOG``, every log file write fail with ENOSPC, after the
temp file was opened, as ``write(2)`` on a full disk does."""
import os
from pathlib import Path

import cli_process
import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.slow  # command-line runs

REPO = Path(__file__).resolve().parents[2]

FULL_DISK = '''
import contextlib
import errno
import logging
import os
from pathlib import Path

import robustbench_fm.core.atomic as atomic

_replace = atomic.replace_atomic


def _full():
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as write(2) raises it: no file named


@contextlib.contextmanager
def replace_atomic(path, suffix=""):
    with _replace(path, suffix) as tmp:
        yield tmp
        if Path(path).name == os.environ.get("FULL_DISK_AT"):
            raise _full()


atomic.replace_atomic = replace_atomic


class _FullFile:
    def write(self, text):
        raise _full()

    def flush(self):
        pass

    def close(self):
        pass


if os.environ.get("FULL_DISK_LOG"):
    logging.FileHandler._open = lambda self: _FullFile()
'''


def _cli(tmp_path, *args, **env):
    (tmp_path / "full_disk.py").write_text(FULL_DISK)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]), "HF_HUB_OFFLINE": "1", **env}
    return cli_process.run(["-m", "robustbench_fm", f"paths.root={tmp_path}", *args], cwd=tmp_path, env=env,
                           timeout=600)


def test_a_full_disk_under_the_run_folder_is_one_line_naming_paths_output_root(tmp_path):
    rng = np.random.default_rng(0)
    ids = [f"s{i}" for i in range(40)]
    pd.DataFrame({"sample_id": ids, "embedding": list(rng.normal(size=(40, 4)).astype(np.float32))}).to_parquet(
        tmp_path / "feats.parquet")
    pd.DataFrame({"sample_id": ids, "acq_group": "g", "patient_id": ids,
                  "lesion": [i % 2 for i in range(40)]}).to_csv(tmp_path / "manifest.csv", index=False)
    run = tmp_path / "outputs" / "runs" / "r"
    args = ["plugins=[full_disk]", "experiment=from_features", "features_file=feats.parquet",
            "manifest_file=manifest.csv", "stage.findings=[lesion]", "stage.params.n_boot=20", f"hydra.run.dir={run}"]
    proc = _cli(tmp_path, *args, FULL_DISK_AT="results_long.parquet", FULL_DISK_LOG="1")
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()  # no "--- Logging error ---" traceback before it
    assert line == (f"error: no space left on the disk of {run} (the run folder: No space left on device); free "
                    "space there or move it with paths.output_root=<a folder on a disk with room>; nothing written "
                    "before is lost (finished feature-cache shards are kept and the same command resumes)")
    # what was written before is there, whole; the temp file of the write that failed is gone
    assert all((run / name).is_file() for name in ("config.yaml", "entries.json", "summary.parquet", "summary.md"))
    assert list((run / "results").rglob("summary.parquet")) and not list(run.glob(".results_long.parquet.tmp-*"))
    assert '"status": "failed", "error": "DiskFull: no space left' in (run / "status.json").read_text()
    again = _cli(tmp_path, *args)  # room again (the plugin fails no write): the same command
    assert again.returncode == 0, again.stderr[-3000:]
    assert (run / "results_long.parquet").is_file() and (run / "report.md").is_file()


def test_a_full_disk_under_the_feature_cache_names_paths_cache_dir_and_keeps_what_was_embedded(tmp_path):
    args = ["plugins=[full_disk]", "encoder=planted_sharp", "dataset.options.n=40", "extract.shard_size=16",
            "stage.params.n_boot=20", "device=cpu", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = _cli(tmp_path, *args, FULL_DISK_AT="shard-00001.parquet")
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    cache = tmp_path / "outputs" / "cache" / "features"
    assert line == (f"error: no space left on the disk of {cache} (the feature cache: No space left on device); "
                    "free space there or move it with paths.cache_dir=<a folder on a disk with room>; nothing "
                    "written before is lost (finished feature-cache shards are kept and the same command resumes)")
    (shard,) = cache.glob("planted_sharp/images-*/*/shard-*.parquet")  # the first shard, whole
    assert shard.name == "shard-00000.parquet"
    again = _cli(tmp_path, *args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "1 of 3 shards present" in again.stdout  # resumed: shard 0 was not embedded again
