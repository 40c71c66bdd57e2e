"""Two runs on the same cache entry or output folder never corrupt each other (issue:
reliability 5): the entry lock makes the second extraction wait and then hit the cache; a second
run aimed at a locked output folder stops at once with one line."""
from __future__ import annotations

import json
import multiprocessing as mp
import time
from pathlib import Path

import pandas as pd
import pytest

# the engine filling a manifest-keyed entry: these tests are about the engine and the entry format
from feature_fixtures import engine_extract as extract
from feature_fixtures import shard_bytes, tiny_encoder, write_images
from PIL import Image

from robustbench_fm.cli import app
from robustbench_fm.core.locking import FileLock, LockTimeout

pytestmark = pytest.mark.slow  # command-line subprocesses: the full suite runs them


def slow_reader(image_root: Path, row: dict) -> Image.Image:
    time.sleep(0.05)
    with Image.open(Path(image_root) / row["path"]) as im:
        im.load()
        return im


def _extract_child(root: str, cache_root: str, out: str) -> None:
    import torch

    torch.set_num_threads(1)
    manifest = pd.read_csv(Path(root) / "manifest.csv", dtype=str)
    fs = extract(tiny_encoder(), manifest, root, cache_root, batch_size=4, shard_size=8, progress=False,
                 reader=slow_reader)
    Path(out).write_text(json.dumps({"embedded": fs.n_images_embedded, "forward": fs.n_forward,
                                     "path": str(fs.path)}))


def test_two_extractions_of_one_entry_compute_it_once(tmp_path):
    root, cache_root = tmp_path / "data", tmp_path / "cache"
    write_images(root, n=40).to_csv(root / "manifest.csv", index=False)
    ctx = mp.get_context("forkserver")
    outs = [tmp_path / f"out{i}.json" for i in range(2)]
    procs = [ctx.Process(target=_extract_child, args=(str(root), str(cache_root), str(o))) for o in outs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
        assert p.exitcode == 0
    results = [json.loads(o.read_text()) for o in outs]
    assert sorted(r["embedded"] for r in results) == [0, 40]
    assert sorted(r["forward"] for r in results) == [0, 10]
    entry = Path(results[0]["path"])
    assert results[1]["path"] == str(entry)
    assert not list(entry.parent.glob("*.lock")) and not list(entry.glob(".*tmp*"))
    reference = extract(tiny_encoder(), pd.read_csv(root / "manifest.csv", dtype=str), root, tmp_path / "ref",
                        batch_size=4, shard_size=8, progress=False)
    assert shard_bytes(entry) == shard_bytes(reference.path)


def test_a_second_run_on_a_locked_output_folder_stops_at_once(tmp_path):
    from hydra import compose, initialize_config_dir

    from robustbench_fm.cli.main import CONFIG_DIR

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.root={tmp_path}", "encoders=[planted_blur]"])
    out = tmp_path / "run"
    with FileLock(out / ".lock"):
        with pytest.raises(LockTimeout, match=r"in use by pid \d+@") as err:
            app.run(cfg, out)
    assert "\n" not in str(err.value)
    assert not (out / "summary.parquet").exists()
    app.run(cfg, out)  # once the first run is gone the folder is usable
    assert (out / "summary.parquet").is_file() and not (out / ".lock").exists()


def test_a_waiter_on_a_busy_entry_logs_one_calm_line(tmp_path, caplog):
    """A run that finds the entry being filled by another process logs who it waits for and
    which entry, once, and no timeout message (it does not time out: it waits, then hits the
    cache)."""
    import logging
    import os
    import socket
    import threading

    root = tmp_path / "data"
    manifest = write_images(root, n=8)
    first = extract(tiny_encoder(), manifest, root, tmp_path / "cache", batch_size=4, progress=False)
    # another run is filling the entry: it holds the lock and the entry is not settled yet (a
    # settled entry is read without the lock, see test_first_hour's read-only cache)
    meta = (first.path / "meta.json").read_bytes()
    (first.path / "meta.json").unlink()
    lock = FileLock(first.path.parent / f"{first.key}.lock").acquire()

    def finish():
        (first.path / "meta.json").write_bytes(meta)
        lock.release()

    threading.Timer(1.0, finish).start()
    with caplog.at_level(logging.INFO, logger="robustbench_fm"):
        again = extract(tiny_encoder(), manifest, root, tmp_path / "cache", batch_size=4, progress=False)
    assert again.n_forward == 0
    waits = [m for m in caplog.messages if m.startswith("waiting") or "timed out" in m.lower() or ".lock" in m]
    assert waits == [f"waiting for pid {os.getpid()} on {socket.gethostname()} to finish {first.path} ..."]


def test_the_second_run_is_told_the_setting_that_picks_another_folder(tmp_path):
    """Issue 41 item 12: it was told to "pass a longer timeout" (no such option: the run folder's
    lock never waits)."""
    from robustbench_fm.pipeline.job import recorded

    out = tmp_path / "run"
    with FileLock(out / ".lock"):
        with pytest.raises(LockTimeout) as err:
            with recorded(out):
                pass
    text = str(err.value)
    assert text.startswith(f"run folder {out} is in use by pid ") and "\n" not in text
    assert "hydra.run.dir=<folder>" in text and f"delete {out / '.lock'}" in text and "timeout" not in text
    with FileLock(out / ".lock"):
        with pytest.raises(LockTimeout) as err:
            FileLock(out / ".lock", timeout=0).acquire()
    assert "timeout" not in str(err.value) and str(err.value).startswith(f"lock {out / '.lock'} is held by pid ")
