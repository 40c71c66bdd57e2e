"""Cache integrity: ``verify_entry`` / ``verify_cache`` re-check checksums, rows and manifest;
an entry of another package version or cache format is never reused."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

# the engine filling a manifest-keyed entry: these tests are about the engine and the entry format
from feature_fixtures import engine_extract as extract
from feature_fixtures import tiny_encoder, write_images

import robustbench_fm.features.cache as cache_mod
import robustbench_fm.features.key as key_mod
from robustbench_fm.core.shards import file_sha256
from robustbench_fm.features import (
    CACHE_FORMAT,
    FeatureCache,
    FeatureCacheError,
    cache_key_fields,
    verify_cache,
    verify_entry,
)

N_IMAGES, SHARD, BATCH = 40, 8, 3


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    manifest = write_images(root, N_IMAGES)
    manifest.loc[10, "path"] = "img/missing.png"  # one skipped row, so skipped.csv is checked too
    return root, manifest


@pytest.fixture(scope="module")
def good(data, encoder, tmp_path_factory):
    root, manifest = data
    return extract(encoder, manifest, root, tmp_path_factory.mktemp("good"), batch_size=BATCH, shard_size=SHARD,
                   progress=False, on_bad_image="skip")


@pytest.fixture
def entry(good, tmp_path) -> Path:
    """A private copy of the good entry, laid out as <root>/tiny/<key>."""
    dst = tmp_path / "cache" / "tiny" / good.key
    shutil.copytree(good.path, dst)
    return dst


def problems_naming(report, name: str) -> list[str]:
    assert not report.ok
    assert report.problems and all("\n" not in p for p in report.problems), report.problems
    hits = [p for p in report.problems if name in p]
    assert hits, report.problems
    return hits


def test_good_entry_verifies(good, data, entry):
    _, manifest = data
    assert good.skipped == ["s010"]
    for rep in (verify_entry(entry), verify_entry(entry, manifest)):
        assert rep.ok and rep.problems == [] and rep.notes == []
        assert (rep.n_rows, rep.n_shards, rep.n_complete, rep.n_skipped) == (40, 5, 5, 1)
        assert rep.key == good.key and rep.encoder == "tiny" and rep.path == entry
        assert rep.summary() == f"{entry}: OK, 5/5 shards, 40 rows, 1 skipped"
    (entry / ".shard-00001.parquet.tmp-123-abc").write_bytes(b"half")  # informational only
    rep = verify_entry(entry)
    assert rep.ok and len(rep.notes) == 1 and ".shard-00001.parquet.tmp-123-abc" in rep.notes[0]


def test_flipped_byte_is_named(entry):
    path = entry / "shard-00001.parquet"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the float data: still a readable parquet file
    path.write_bytes(bytes(data))
    hits = problems_naming(verify_entry(entry), "shard-00001.parquet")
    assert any("sha256" in p and "does not match" in p for p in hits), hits
    assert all("shard-00001.parquet" in p for p in verify_entry(entry).problems)


def test_deleted_shard_is_named(entry):
    (entry / "shard-00003.parquet").unlink()
    rep = verify_entry(entry)
    hits = problems_naming(rep, "shard-00003.parquet")
    assert any("missing" in p for p in hits) and rep.n_complete == 4 and len(rep.problems) == 1


def test_truncated_meta_is_named(entry):
    meta = entry / "meta.json"
    meta.write_bytes(meta.read_bytes()[:100])
    rep = verify_entry(entry)
    hits = problems_naming(rep, "meta.json")
    assert "unreadable" in hits[0] and len(rep.problems) == 1


def test_changed_manifest_is_named(data, entry):
    _, manifest = data
    reordered = manifest.iloc[[1, 0] + list(range(2, N_IMAGES))].reset_index(drop=True)
    rep = verify_entry(entry, reordered)
    assert any("meta.json" in p and "manifest hash" in p for p in problems_naming(rep, "meta.json"))
    assert any("shard-00000.parquet: row 0 holds sample_id 's000' but the manifest has 's001'" in p
               for p in rep.problems), rep.problems
    shorter = manifest.head(39)
    assert any("40 rows" in p and "39" in p for p in problems_naming(verify_entry(entry, shorter), "meta.json"))


def test_unknown_format_and_foreign_key_are_named(entry):
    meta = json.loads((entry / "meta.json").read_text())
    (entry / "meta.json").write_text(json.dumps({**meta, "format": 99}))
    hits = problems_naming(verify_entry(entry), "meta.json")
    assert "cache format 99" in hits[0] and f"format {CACHE_FORMAT}" in hits[0]
    (entry / "meta.json").write_text(json.dumps({**meta, "fields": {**meta["fields"], "weights_id": "other"}}))
    assert any("not the hash of its key fields" in p for p in problems_naming(verify_entry(entry), "meta.json"))


def test_unlisted_nan_row_and_missing_skipped_csv_are_named(data, entry):
    _, manifest = data
    # rewrite shard 2 with a NaN row that skipped.csv does not list (meta.json keeps the old checksum)
    path = entry / "shard-00002.parquet"
    table = pq.read_table(path)
    emb = np.stack(table.column("embedding").to_numpy(zero_copy_only=False)).astype(np.float32)
    emb[3] = np.nan
    col = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1), pa.float32()), emb.shape[1])
    pq.write_table(table.set_column(1, table.schema.field("embedding"), col), path)
    rep = verify_entry(entry)
    hits = problems_naming(rep, "shard-00002.parquet")
    assert any("row 19 (sample_id 's019') holds non-finite features but is not listed" in p for p in hits), hits
    fields = json.loads((entry / "meta.json").read_text())["fields"]
    with pytest.raises(FeatureCacheError, match=r"shard-00002.parquet: corrupted cache shard \(SHA-256"):
        FeatureCache(entry.parents[1], fields).read(manifest)  # not the file meta.json recorded
    meta = json.loads((entry / "meta.json").read_text())  # recorded as it is now: the NaN row is still refused
    meta["shards"] = [{**r, "sha256": file_sha256(path)} if r["file"] == path.name else r for r in meta["shards"]]
    (entry / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(FeatureCacheError, match=r"shard-00002.parquet: row 19 .* not listed in skipped.csv"):
        FeatureCache(entry.parents[1], fields).read(manifest)

    (entry / "skipped.csv").unlink()
    hits = problems_naming(verify_entry(entry), "shard-00001.parquet")  # row 10's NaN is now unlisted
    assert any("row 10" in p and "not listed" in p for p in hits), hits


def test_verify_cache_walks_every_entry(good, data, encoder, tmp_path):
    root, manifest = data
    cache_root = tmp_path / "cache"
    shutil.copytree(good.path, cache_root / "tiny" / good.key)
    other = extract(tiny_encoder(weights_id="other"), manifest.head(12), root, cache_root, shard_size=SHARD,
                    progress=False, on_bad_image="skip")
    (other.path / "shard-00001.parquet").unlink()
    reports = verify_cache(cache_root)
    assert sorted(r.path for r in reports) == [r.path for r in reports]
    assert {r.path: r.ok for r in reports} == {cache_root / "tiny" / good.key: True, other.path: False}
    [missing] = verify_cache(tmp_path / "nowhere")
    assert not missing.ok and "nowhere: not a folder" in missing.problems[0]
    (tmp_path / "empty").mkdir()
    assert verify_cache(tmp_path / "empty") == []


def test_other_package_version_or_format_gets_a_new_entry(good, data, encoder, entry, monkeypatch):
    root, manifest = data
    cache_root = entry.parents[1]
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in entry.iterdir()}
    old_fields = cache_key_fields(encoder, manifest, root)

    monkeypatch.setattr(key_mod, "package_version", lambda: "99.0.0")
    newer = extract(encoder, manifest, root, cache_root, batch_size=BATCH, shard_size=SHARD, progress=False,
                    on_bad_image="skip")
    assert newer.fields["package_version"] == "99.0.0" != old_fields["package_version"]
    assert newer.key != good.key and newer.path != entry and newer.n_images_embedded == N_IMAGES - 1
    monkeypatch.setattr(key_mod, "CACHE_FORMAT", CACHE_FORMAT + 1)
    monkeypatch.setattr(cache_mod, "CACHE_FORMAT", CACHE_FORMAT + 1)
    newest = extract(encoder, manifest, root, cache_root, batch_size=BATCH, shard_size=SHARD, progress=False,
                     on_bad_image="skip")
    assert newest.key not in (good.key, newer.key) and newest.n_images_embedded == N_IMAGES - 1
    monkeypatch.undo()
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in entry.iterdir()} == before
    np.testing.assert_array_equal(newer.embeddings, good.embeddings)

    # a meta.json of another cache format inside the current key's folder is refused, not reused
    meta = json.loads((entry / "meta.json").read_text())
    (entry / "meta.json").write_text(json.dumps({**meta, "format": CACHE_FORMAT - 1}))
    with pytest.raises(FeatureCacheError, match=rf"written in cache format {CACHE_FORMAT - 1}.*delete the folder"):
        extract(encoder, manifest, root, cache_root, batch_size=BATCH, shard_size=SHARD, progress=False,
                on_bad_image="skip")


def test_verify_command_line(tmp_path):
    root = tmp_path / "data"
    manifest = write_images(root, n=12)
    fs = extract(tiny_encoder(), manifest, root, tmp_path / "cache", batch_size=4, shard_size=4, progress=False)
    cmd = [sys.executable, "-m", "robustbench_fm", "verify"]
    good = subprocess.run(cmd + [str(tmp_path / "cache")], capture_output=True, text=True, timeout=120)
    assert good.returncode == 0 and good.stdout.startswith(f"{fs.path}: OK, 3/3 shards, 12 rows")
    shard = fs.path / "shard-00001.parquet"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    bad = subprocess.run(cmd + [str(fs.path)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "problem:" in bad.stdout and "shard-00001.parquet" in bad.stdout
