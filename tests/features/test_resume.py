"""Kill extraction at any point and re-run: the cache ends bit-identical to an uninterrupted run.

Each scenario runs extraction in a child process (``multiprocessing`` forkserver: torch is
imported once in the server, every child is a cheap fork of it) that stops itself at an exact
point -- between shard writes, or in the middle of writing a shard / ``meta.json`` /
``skipped.csv`` temp file, or just after a rename -- and tells the test, which then SIGKILLs it.
The test resumes in-process and compares every shard, ``meta.json`` and ``skipped.csv`` byte for
byte with an uninterrupted run, checks that only the missing shards were embedded and that the
shards already written were left alone, and that no temp file left by the kill was read.
"""
from __future__ import annotations

import io
import json
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import cli_process
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

# the engine filling a manifest-keyed entry: these tests are about the engine and the entry format
from feature_fixtures import engine_extract as extract
from feature_fixtures import shard_bytes, tiny_encoder, write_images
from PIL import Image

import robustbench_fm.core.shards as shards_mod
import robustbench_fm.features.cache as cache_mod
from robustbench_fm.features import (
    ExtractionInterrupted,
    FeatureCache,
    FeatureCacheError,
    ImageReadError,
    verify_entry,
)

pytestmark = pytest.mark.slow  # command-line subprocesses: the full suite runs them

N_IMAGES, SHARD, BATCH = 40, 8, 3  # 5 shards; batches of 3 do not divide a shard
BAD_ROWS = {3: "img/garbage.png", 18: "img/missing.png"}  # skip scenarios: shard 0 and shard 2
KILL_WAIT_S = 90

# scenario -> (on_bad_image, where the child stops; everything happens around shard 2)
SCENARIOS = {
    "between_shards": ("error", "reader at row 16: shards 0-1 written and recorded, shard 2 not begun"),
    "mid_shard_write": ("error", "half of shard-00002's temp file written"),
    "after_shard_rename": ("error", "shard-00002 renamed into place, meta.json not yet updated"),
    "mid_meta_write": ("error", "half of the meta.json temp file recording shard-00002 written"),
    "skip_mid_skipped_csv": ("skip", "half of the skipped.csv temp file adding row 18 written"),
    "skip_after_skipped_csv": ("skip", "skipped.csv lists row 18, shard-00002 not yet written"),
}


# ---- the child ------------------------------------------------------------------------------------


def _pause(marker: str) -> None:
    # written aside, then renamed: the parent never reads a half-written marker (it saw an empty
    # file once under load)
    Path(marker + ".tmp").write_text(str(os.getpid()))
    os.replace(marker + ".tmp", marker)
    time.sleep(600)


def _child(scenario: str, root: str, manifest_csv: str, cache_root: str, marker: str) -> None:
    import torch

    torch.set_num_threads(1)
    real = cache_mod.write_atomic
    seen = set()

    def half_then_pause(path, write):
        def half(f):
            buf = io.BytesIO()
            write(buf)
            data = buf.getvalue()
            f.write(data[: len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
            _pause(marker)
        return real(path, half)

    def hook(path, write):
        name = Path(path).name
        if scenario == "mid_shard_write" and name == "shard-00002.parquet":
            return half_then_pause(path, write)
        if scenario == "mid_meta_write" and name == "meta.json" and "shard-00002.parquet" in seen:
            return half_then_pause(path, write)
        if scenario == "skip_mid_skipped_csv" and name == "skipped.csv" and "shard-00001.parquet" in seen:
            return half_then_pause(path, write)
        out = real(path, write)
        seen.add(name)
        if scenario == "after_shard_rename" and name == "shard-00002.parquet":
            _pause(marker)
        if scenario == "skip_after_skipped_csv" and name == "skipped.csv" and "shard-00001.parquet" in seen:
            _pause(marker)
        return out

    cache_mod.write_atomic = shards_mod.write_atomic = hook  # shards and meta.json: core.shards

    def reader(image_root, row):
        if scenario == "between_shards" and row["sample_id"] == "s016":
            _pause(marker)
        with Image.open(image_root / row["path"]) as im:
            im.load()
            return im

    manifest = pd.read_csv(manifest_csv, dtype={"sample_id": str, "path": str})
    extract(tiny_encoder(), manifest, Path(root), Path(cache_root), batch_size=BATCH, shard_size=SHARD,
            progress=False, reader=reader, on_bad_image=SCENARIOS[scenario][0])


# ---- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    manifest = write_images(root, N_IMAGES)
    (root / "img" / "garbage.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    bad = manifest.copy()
    for row, path in BAD_ROWS.items():
        bad.loc[row, "path"] = path
    manifest.to_csv(root / "manifest.csv", index=False)
    bad.to_csv(root / "bad_manifest.csv", index=False)
    return root, {"error": manifest, "skip": bad}


@pytest.fixture(scope="module")
def references(data, encoder, tmp_path_factory):
    """Uninterrupted runs, one per policy (with a decode worker: workers must change nothing)."""
    root, manifests = data
    return {policy: extract(encoder, manifests[policy], root, tmp_path_factory.mktemp(f"ref-{policy}"),
                            batch_size=BATCH, num_workers=1, shard_size=SHARD, progress=False,
                            on_bad_image=policy)
            for policy in ("error", "skip")}


@pytest.fixture(scope="module")
def forkserver():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "PIL.Image", "pandas", "pyarrow.parquet",
                                "robustbench_fm.features.engine.rows", "robustbench_fm.features.testing"])
    return ctx


def _kill_at(ctx, scenario: str, root: Path, cache_root: Path, tmp: Path) -> None:
    """Run the child until it reaches ``scenario``'s point, then SIGKILL it."""
    policy = SCENARIOS[scenario][0]
    marker = tmp / f"{scenario}.paused"
    csv = root / ("manifest.csv" if policy == "error" else "bad_manifest.csv")
    child = ctx.Process(target=_child, args=(scenario, str(root), str(csv), str(cache_root), str(marker)))
    child.start()
    deadline = time.monotonic() + KILL_WAIT_S
    try:
        while not marker.exists():
            assert child.is_alive(), f"child exited (code {child.exitcode}) before reaching {scenario}"
            assert time.monotonic() < deadline, f"child did not reach {scenario} within {KILL_WAIT_S} s"
            time.sleep(0.01)
        assert int(marker.read_text()) == child.pid
    finally:
        child.kill()  # SIGKILL
        child.join(10)
    assert child.exitcode == -9, child.exitcode


def _snapshot(entry: Path) -> dict[str, tuple[int, int, bytes]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(entry.iterdir())}


def _recorded(entry: Path) -> list[str]:
    return [s["file"] for s in json.loads((entry / "meta.json").read_text())["shards"]]


# ---- kill at a point, resume, compare --------------------------------------------------------------


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_sigkill_then_resume_is_byte_identical(scenario, data, encoder, references, forkserver, tmp_path,
                                               monkeypatch):
    root, manifests = data
    policy = SCENARIOS[scenario][0]
    manifest, ref = manifests[policy], references[policy]
    cache_root = tmp_path / "cache"
    _kill_at(forkserver, scenario, root, cache_root, tmp_path)
    entry = cache_root / "tiny" / ref.key
    cache = FeatureCache(cache_root, ref.fields)
    before = _snapshot(entry)
    temps = sorted(p.name for p in entry.glob(".*.tmp-*"))

    # ---- the state the kill left
    shard_files = sorted(n for n in before if n.startswith("shard-"))
    if scenario in ("after_shard_rename", "mid_meta_write"):
        assert shard_files == [f"shard-0000{i}.parquet" for i in range(3)]
        assert _recorded(entry) == shard_files[:2]  # meta.json (still whole) does not know shard 2
    else:
        assert shard_files == ["shard-00000.parquet", "shard-00001.parquet"]
        assert _recorded(entry) == shard_files
    for name in shard_files:  # every shard present is whole and byte-identical to the reference
        assert before[name][2] == (ref.path / name).read_bytes(), name
    expected_temp = {"mid_shard_write": ".shard-00002.parquet.tmp-", "mid_meta_write": ".meta.json.tmp-",
                     "skip_mid_skipped_csv": ".skipped.csv.tmp-"}.get(scenario)
    if expected_temp:
        assert len(temps) == 1 and temps[0].startswith(expected_temp), temps
        assert 0 < len(before[temps[0]][2]), "the kill should land while the temp file is half written"
    else:
        assert temps == []
    if scenario == "skip_mid_skipped_csv":  # the old skipped.csv (row 3) is intact
        assert cache.read_skipped(complete_only=False).keys() == {3}
    if scenario == "skip_after_skipped_csv":  # lists row 18 of a shard that does not exist yet
        assert cache.read_skipped(complete_only=False).keys() == {3, 18}
        assert cache.read_skipped().keys() == {3}
    with pytest.raises(FeatureCacheError, match=r"incomplete|missing"):
        cache.read(manifest)
    report = verify_entry(entry, manifest)
    assert not report.ok and report.n_complete == len(shard_files)
    assert any("shard-00004.parquet: missing" in p for p in report.problems), report.problems
    assert len(report.notes) >= len(temps)

    # ---- resume, recording every file read through pyarrow / the hash function
    opened = []
    real_read_table, real_parquet_file, real_sha = pq.read_table, pq.ParquetFile, cache_mod.file_sha256
    monkeypatch.setattr(pq, "read_table", lambda p, *a, **k: (opened.append(str(p)), real_read_table(p, *a, **k))[1])
    monkeypatch.setattr(pq, "ParquetFile", lambda p, *a, **k: (opened.append(str(p)), real_parquet_file(p, *a, **k))[1])
    monkeypatch.setattr(cache_mod, "file_sha256", lambda p, *a, **k: (opened.append(str(p)), real_sha(p, *a, **k))[1])
    resumed = extract(encoder, manifest, root, cache_root, batch_size=BATCH, shard_size=SHARD, progress=False,
                      on_bad_image=policy)
    monkeypatch.undo()

    assert not [p for p in opened if ".tmp-" in p], opened
    n_missing_rows = N_IMAGES - SHARD * len(shard_files)
    n_bad_missing = sum(r // SHARD >= len(shard_files) for r in BAD_ROWS) if policy == "skip" else 0
    assert resumed.n_images_embedded == n_missing_rows - n_bad_missing
    assert resumed.n_forward == (5 - len(shard_files)) * 3  # ceil(8 / 3) batches per missing shard
    after = _snapshot(entry)
    for name in shard_files:  # shards already written were not rewritten
        assert after[name][:2] == before[name][:2], name
    for name in temps:  # the kill's temp file is left alone (never read, never renamed)
        assert after[name] == before[name]
    assert shard_bytes(entry) == shard_bytes(ref.path)
    assert (entry / "meta.json").read_bytes() == (ref.path / "meta.json").read_bytes()
    if policy == "skip":
        assert (entry / "skipped.csv").read_bytes() == (ref.path / "skipped.csv").read_bytes()
        assert resumed.skipped == ref.skipped == ["s003", "s018"]
    else:
        assert not (entry / "skipped.csv").exists() and resumed.skipped == []
    np.testing.assert_array_equal(resumed.embeddings, ref.embeddings)
    report = verify_entry(entry, manifest)
    assert report.ok and report.n_complete == 5, report.problems
    assert len(report.notes) == len(temps)


def test_in_process_crash_keeps_whole_shards_and_resumes(data, encoder, references, tmp_path):
    """An exception mid-run (here: a reader that fails at row 19) leaves shards 0-1 only; a
    half-written temp file planted in the folder is ignored by the resumed run."""
    root, manifests = data
    manifest, ref = manifests["error"], references["error"]
    seen = []

    def crashing_reader(image_root, row):
        if len(seen) == 19:
            raise OSError("simulated crash")
        seen.append(row["sample_id"])
        with Image.open(image_root / row["path"]) as im:
            im.load()
            return im

    with pytest.raises(ImageReadError, match="simulated crash"):
        extract(encoder, manifest, root, tmp_path, batch_size=BATCH, shard_size=SHARD, progress=False,
                reader=crashing_reader)
    entry = tmp_path / "tiny" / ref.key
    assert sorted(shard_bytes(entry)) == ["shard-00000.parquet", "shard-00001.parquet"]
    cache = FeatureCache(tmp_path, ref.fields)
    assert cache.done_ids(manifest) == set(manifest["sample_id"][:16])
    assert cache.missing_shards() == [2, 3, 4]
    with pytest.raises(FeatureCacheError, match=r"24 of 40 rows in 3 of 5 shards missing"):
        cache.read(manifest)
    (entry / ".shard-00002.parquet.tmp-99999-abc").write_bytes(b"PAR1 half written")

    resumed = extract(encoder, manifest, root, tmp_path, batch_size=BATCH, shard_size=SHARD, progress=False)
    assert resumed.n_images_embedded == N_IMAGES - 16
    assert resumed.n_forward == 3 * 3  # 3 shards x ceil(8 / 3) batches
    assert shard_bytes(entry) == shard_bytes(ref.path)
    assert (entry / "meta.json").read_bytes() == (ref.path / "meta.json").read_bytes()
    assert (entry / ".shard-00002.parquet.tmp-99999-abc").read_bytes() == b"PAR1 half written"
    np.testing.assert_array_equal(resumed.embeddings, ref.embeddings)


def test_ctrl_c_during_extraction_says_what_was_saved_and_the_same_call_resumes(data, encoder, references,
                                                                                tmp_path):
    """Ctrl-C (KeyboardInterrupt) at row 19 of shard 2: the error says 2 of 5 shards are saved
    and where; it is still a KeyboardInterrupt; the same call resumes from those shards."""
    root, manifests = data
    manifest, ref = manifests["error"], references["error"]
    seen = []

    def interrupted_reader(image_root, row):
        if len(seen) == 19:
            raise KeyboardInterrupt
        seen.append(row["sample_id"])
        with Image.open(image_root / row["path"]) as im:
            im.load()
            return im

    with pytest.raises(ExtractionInterrupted) as err:
        extract(encoder, manifest, root, tmp_path, batch_size=BATCH, shard_size=SHARD, progress=False,
                reader=interrupted_reader)
    entry = tmp_path / "tiny" / ref.key
    assert isinstance(err.value, KeyboardInterrupt)
    assert str(err.value) == f"2 of 5 shards of tiny saved in {entry}"
    assert not list(entry.parent.glob("*.lock"))  # the entry lock was released
    resumed = extract(encoder, manifest, root, tmp_path, batch_size=BATCH, shard_size=SHARD, progress=False)
    assert resumed.n_images_embedded == N_IMAGES - 16
    assert shard_bytes(entry) == shard_bytes(ref.path)


@pytest.mark.slow
def test_ctrl_c_on_the_cli_prints_one_line_exits_130_and_the_same_command_resumes(tmp_path):
    """SIGINT to the process group (what Ctrl-C sends, decode workers included) while the demo
    extracts: one line saying how many shards are saved, exit code 130, status.json
    "interrupted", no traceback; the same command then resumes from those shards."""
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "robustbench_fm", "encoder=random_vit_s", "dataset.options.n=96",
           "extract.shard_size=8", "stage.params.n_boot=20"]
    cache = tmp_path / "outputs" / "cache" / "features" / "random_vit_s"
    # own session (so the signal reaches the decode worker too, as from a terminal), SIGINT not ignored
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 300
        while (not list(cache.glob("images-*/*/shard-00001.parquet")) and proc.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    last = err.strip().splitlines()[-1]
    m = re.fullmatch(r"interrupted: (\d+) of 12 shards of random_vit_s saved in (\S+); "
                     r"re-run the same command to resume", last)
    assert m, last
    entry = Path(m.group(2))
    # the chunk of the per-image store being filled: <cache>/<encoder>/images-<recipe>/<chunk>
    assert entry.parent.parent == cache and len(list(entry.glob("shard-*.parquet"))) == int(m.group(1)) >= 2
    (run,) = (tmp_path / "outputs" / "runs").glob("*/*")
    saved = last.removeprefix("interrupted: ").removesuffix("; re-run the same command to resume")
    status = json.loads((run / "status.json").read_text())
    assert {k: status[k] for k in ("status", "error")} == {"status": "interrupted", "error": saved}
    assert status["start"] <= status["end"]
    # the resume needs no signal: the suite's fork server runs it, a fresh process without the imports
    again = cli_process.run(cmd[1:], cwd=tmp_path, env=env, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"resuming {entry}: {m.group(1)} of 12 shards present" in again.stdout
