"""Feature extraction and the parquet feature cache: key, warm hits, alignment, errors.

Uses a tiny random conv encoder built in place and a few dozen small PNGs; no downloads.
Kill-and-resume tests live in ``tests/features/test_resume.py``, unreadable images in
``test_bad_images.py`` and ``verify`` in ``test_verify.py``.
"""
from __future__ import annotations

import hashlib
import json
import logging

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

# the engine filling a manifest-keyed entry: these tests are about the engine and the entry format
from feature_fixtures import engine_extract as extract
from feature_fixtures import tiny_encoder, write_images
from PIL import Image

from robustbench_fm.core.errors import UserError
from robustbench_fm.features import (
    FeatureCache,
    FeatureCacheError,
    ImageReadError,
    cache_key,
    cache_key_fields,
    load_features,
)
from robustbench_fm.features.cache import PARQUET_META_KEY

N_IMAGES, SHARD, BATCH = 40, 8, 3  # 5 shards; batches of 3 do not divide a shard


def make_dataset(root, n: int = N_IMAGES) -> pd.DataFrame:
    return write_images(root, n)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    return root, make_dataset(root)


@pytest.fixture(scope="module")
def reference(data, encoder, tmp_path_factory):
    """An uninterrupted run (with a decode worker, to check workers change nothing)."""
    root, manifest = data
    return extract(encoder, manifest, root, tmp_path_factory.mktemp("ref"), batch_size=BATCH,
                   num_workers=1, shard_size=SHARD, progress=False)


# ---- (a) the key ------------------------------------------------------------------------------


def test_key_tracks_what_changes_features(data, encoder):
    _, manifest = data
    fields = cache_key_fields(encoder, manifest)
    for name in ("encoder", "library", "hub_id", "revision", "model_kwargs", "embedding", "embed_dim",
                 "preprocessing", "weights_id", "precision", "manifest_hash", "package_version",
                 "library_versions", "cache_format"):
        assert name in fields, name
    assert fields["precision"] == "fp32" and "torch" in fields["library_versions"]
    key = cache_key(fields)
    assert len(key) == 16 and int(key, 16) >= 0
    assert cache_key(dict(reversed(list(fields.items())))) == key  # canonical JSON
    # the image root is part of the key: another folder with the same relative paths is another entry
    assert cache_key(cache_key_fields(encoder, manifest, "/data/a")) != cache_key(
        cache_key_fields(encoder, manifest, "/data/b"))

    def key_of(enc=encoder, man=manifest):
        return cache_key(cache_key_fields(enc, man))

    changed = {
        "input_size": key_of(tiny_encoder(input_size=64)),
        "mean": key_of(tiny_encoder(mean=(0.4, 0.5, 0.5))),
        "interpolation": key_of(tiny_encoder(interpolation="bilinear")),
        "pooling": key_of(tiny_encoder(embedding="cls")),
        "weights": key_of(tiny_encoder(weights_id="other-checkpoint")),
        "row added": key_of(man=pd.concat([manifest, pd.DataFrame(
            [{"sample_id": "extra", "path": "img/000.png", "pneumothorax": 0.0}])], ignore_index=True)),
        "path changed": key_of(man=manifest.assign(path=manifest["path"].str.replace("img/", "img2/"))),
        "rows permuted": key_of(man=manifest.iloc[::-1].reset_index(drop=True)),
    }
    assert all(k != key for k in changed.values()), changed
    assert len(set(changed.values())) == len(changed)
    relabelled = manifest.assign(pneumothorax=1.0 - manifest["pneumothorax"], site="elsewhere")
    assert key_of(man=relabelled) == key


# ---- (c) warm re-run --------------------------------------------------------------------------


def test_warm_rerun_does_no_forward_pass(data, encoder, reference, caplog):
    root, manifest = data
    with caplog.at_level(logging.INFO, logger="robustbench_fm.features"):
        warm = extract(encoder, manifest, root, reference.path.parents[1], batch_size=BATCH,
                       shard_size=SHARD, progress=False)
    assert warm.n_forward == 0 and warm.n_images_embedded == 0 and warm.key == reference.key
    np.testing.assert_array_equal(warm.embeddings, reference.embeddings)
    assert "cache hit: 40 rows, 0 forward passes" in caplog.text
    # labels changed, same images: still a hit
    relabelled = manifest.assign(pneumothorax=0.0)
    assert extract(encoder, relabelled, root, reference.path.parents[1], shard_size=SHARD,
                   progress=False).n_forward == 0
    meta = json.loads((reference.path / "meta.json").read_text())
    assert meta["status"] == "complete" and meta["n_rows"] == N_IMAGES and meta["shard_size"] == SHARD
    schema_meta = pq.read_schema(reference.path / "shard-00000.parquet").metadata[PARQUET_META_KEY]
    assert json.loads(schema_meta)["fields"] == reference.fields
    # every shard's checksum and row count, sorted, no timestamps
    assert [s["file"] for s in meta["shards"]] == [f"shard-{i:05d}.parquet" for i in range(5)]
    for rec in meta["shards"]:
        data = (reference.path / rec["file"]).read_bytes()
        assert rec["sha256"] == hashlib.sha256(data).hexdigest() and rec["rows"] == SHARD and rec["skipped"] == 0
    assert set(meta) == {"format", "key", "fields", "shard_size", "n_rows", "n_shards", "embed_dim", "status",
                         "shards"}
    assert warm.skipped == [] and warm.kept.all() and not (reference.path / "skipped.csv").exists()


# ---- (d) alignment with the manifest -------------------------------------------------------------


def test_rows_follow_manifest_order(data, encoder, reference, tmp_path):
    root, manifest = data
    assert reference.embeddings.shape == (N_IMAGES, 8) and reference.embeddings.dtype == np.float32
    assert list(reference.sample_ids) == list(manifest["sample_id"])
    one_by_one = np.concatenate([encoder.embed(encoder.transform(
        Image.open(root / p)).unsqueeze(0)).numpy() for p in manifest["path"]])
    np.testing.assert_allclose(reference.embeddings, one_by_one, rtol=1e-5, atol=1e-6)

    permuted = manifest.sample(frac=1.0, random_state=1).reset_index(drop=True)
    cache = FeatureCache(reference.path.parents[1], reference.fields)
    with pytest.raises(FeatureCacheError, match="manifest hash"):
        cache.read(permuted)
    out = extract(encoder, permuted, root, reference.path.parents[1], batch_size=BATCH, shard_size=SHARD,
                  progress=False)
    assert out.key != reference.key and out.n_images_embedded == N_IMAGES
    order = pd.Index(manifest["sample_id"]).get_indexer(permuted["sample_id"])
    np.testing.assert_allclose(out.embeddings, reference.embeddings[order], rtol=1e-5, atol=1e-6)

    ids, emb = load_features(reference.path, manifest=permuted)
    assert list(ids) == list(permuted["sample_id"])
    np.testing.assert_array_equal(emb, reference.embeddings[order])


def test_load_features_bring_your_own(tmp_path):
    df = pd.DataFrame({"sample_id": ["b", "a", "c"], "embedding": [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]})
    df.to_parquet(tmp_path / "mine.parquet")
    ids, emb = load_features(tmp_path / "mine.parquet")
    assert list(ids) == ["b", "a", "c"] and emb.dtype == np.float32 and emb.shape == (3, 2)
    ids, emb = load_features(tmp_path / "mine.parquet", manifest=pd.DataFrame({"sample_id": ["a", "b"]}))
    np.testing.assert_array_equal(emb, [[3.0, 4.0], [1.0, 2.0]])
    with pytest.raises(FeatureCacheError, match="no features for 1 of 2 manifest rows"):
        load_features(tmp_path / "mine.parquet", manifest=pd.DataFrame({"sample_id": ["a", "zz"]}))


def test_load_features_reads_a_folder_side_by_side_in_file_order(tmp_path, monkeypatch):
    """Issue 44 (speed6): a folder's parquet files are read on several threads, and the rows still come
    back in file order. An unreadable file is named as before: the first unreadable one in that order."""
    import threading

    import robustbench_fm.features.entry as load  # the parquet readers live with the entry format

    rng = np.random.default_rng(3)
    want_ids, want_emb = [], []
    for i in range(12):
        n = int(rng.integers(1, 40))
        ids = [f"f{i:02d}_{j:03d}" for j in range(n)]
        emb = rng.normal(size=(n, 3)).astype(np.float32)
        pd.DataFrame({"sample_id": ids, "embedding": list(emb)}).to_parquet(tmp_path / f"part-{i:02d}.parquet")
        want_ids += ids
        want_emb.append(emb)
    threads, lock = set(), threading.Lock()
    first_two = threading.Barrier(2, timeout=20)  # files read one after another: it would time out
    real = load._open_part

    def open_part(*a, **k):
        with lock:
            new = threading.get_ident() not in threads
            threads.add(threading.get_ident())
            wait = new and len(threads) <= 2  # the first two threads meet once, at their first file
        if wait:
            first_two.wait()
        return real(*a, **k)

    monkeypatch.setattr(load, "_open_part", open_part)
    monkeypatch.setattr(load, "usable_cores", lambda: 4)
    ids, emb = load_features(tmp_path)
    assert list(ids) == want_ids
    np.testing.assert_array_equal(emb, np.concatenate(want_emb))
    assert len(threads) > 1 and threading.get_ident() not in threads
    (tmp_path / "part-05.parquet").write_bytes(b"not parquet")
    (tmp_path / "part-09.parquet").write_bytes(b"not parquet either")
    with pytest.raises(FeatureCacheError, match=r"part-05.parquet: unreadable parquet"):
        load_features(tmp_path)


def test_load_features_decodes_a_file_batch_by_batch_into_one_writable_matrix(tmp_path, monkeypatch):
    """Issue 44: a file's embeddings are decoded a few rows at a time straight into the matrix
    (READ_BATCH_ROWS), fixed-size and plain lists alike; the rows are those pyarrow reads whole, the
    matrix is writable (a handed-over matrix is normalised in place) and a vector length that changes
    from one batch to the next is refused as one within a batch is."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import robustbench_fm.features.entry as load  # the parquet readers live with the entry format

    monkeypatch.setattr(load, "READ_BATCH_ROWS", 3)
    rng = np.random.default_rng(5)
    emb = rng.normal(size=(10, 4)).astype(np.float32)
    ids = [f"s{i}" for i in range(10)]
    fixed = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), 4)
    pq.write_table(pa.table({"sample_id": ids, "embedding": fixed}), tmp_path / "fixed.parquet", row_group_size=4)
    pd.DataFrame({"sample_id": ids, "embedding": list(emb.astype(np.float64))}).to_parquet(tmp_path / "list.parquet")
    for name in ("fixed", "list"):
        got_ids, got = load_features(tmp_path / f"{name}.parquet")
        assert list(got_ids) == ids and got.dtype == np.float32 and got.flags.writeable
        np.testing.assert_array_equal(got, emb)
    ragged = [list(v) for v in emb.astype(np.float64)]
    for row, length in ((4, 3), (1, 5)):  # a later batch, then the first batch, holds a shorter or longer row
        rows = [(v + [0.0])[:length] if i == row else v for i, v in enumerate(ragged)]
        pd.DataFrame({"sample_id": ids, "embedding": rows}).to_parquet(tmp_path / "ragged.parquet")
        low, high = sorted((length, 4))
        with pytest.raises(FeatureCacheError, match=rf"ragged.parquet: 'embedding' rows have different lengths "
                                                    rf"\({low}\.\.{high}\)"):
            load_features(tmp_path / "ragged.parquet")


def test_load_features_keeps_no_more_files_open_than_it_reads_at_once(tmp_path, monkeypatch):
    """A folder may hold more shards than a process may keep open: each file is closed after its
    check and opened again to be read, so at most one per reading thread is open at a time."""
    import threading

    import robustbench_fm.features.entry as load  # the parquet readers live with the entry format

    rng = np.random.default_rng(7)
    want = []
    for i in range(12):
        emb = rng.normal(size=(5, 3)).astype(np.float32)
        pd.DataFrame({"sample_id": [f"f{i:02d}_{j}" for j in range(5)], "embedding": list(emb)}).to_parquet(
            tmp_path / f"part-{i:02d}.parquet")
        want.append(emb)
    real, lock, live, peak = load.pq.ParquetFile, threading.Lock(), [0], [0]

    class Counted(real):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            with lock:
                live[0] += 1
                peak[0] = max(peak[0], live[0])

        def close(self, *a, **k):
            with lock:
                live[0] -= 1
            return super().close(*a, **k)

    monkeypatch.setattr(load.pq, "ParquetFile", Counted)
    monkeypatch.setattr(load, "usable_cores", lambda: 2)
    ids, emb = load_features(tmp_path)
    np.testing.assert_array_equal(emb, np.concatenate(want))
    assert len(ids) == 60 and live[0] == 0 and 1 <= peak[0] <= 2


# ---- (e) errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 1])
def test_bad_image_names_file_and_row(data, encoder, tmp_path, num_workers):
    root, manifest = data
    bad = manifest.copy()
    bad.loc[13, "path"] = "img/does_not_exist.png"
    with pytest.raises(ImageReadError) as info:
        extract(encoder, bad, root, tmp_path, batch_size=BATCH, num_workers=num_workers, shard_size=SHARD,
                progress=False)
    msg = str(info.value)
    assert "\n" not in msg and "does_not_exist.png" in msg and "manifest row 13" in msg and "s013" in msg
    # the shard before the bad row was written; the one holding it was not
    entry = FeatureCache(tmp_path, cache_key_fields(encoder, bad, root))
    assert entry.complete_shards() == [0]

    # an undecodable file is reported the same way
    root2 = tmp_path / "root2"
    (root2 / "img").mkdir(parents=True)
    (root2 / "img" / "000.png").write_bytes((root / "img" / "000.png").read_bytes())
    (root2 / "img" / "001.png").write_bytes(b"not a png")
    with pytest.raises(ImageReadError, match=r"img/001.png \(manifest row 1, sample_id 's001'\)"):
        extract(encoder, manifest.head(2), root2, tmp_path / "c2", num_workers=num_workers, progress=False)


def test_corrupted_or_foreign_shard_is_named(data, encoder, reference, tmp_path):
    root, manifest = data
    import shutil
    entry = tmp_path / "tiny" / reference.key
    shutil.copytree(reference.path, entry)
    cache = FeatureCache(tmp_path, reference.fields)
    np.testing.assert_array_equal(cache.read(manifest), reference.embeddings)

    (entry / "shard-00001.parquet").write_bytes(b"garbage")
    with pytest.raises(FeatureCacheError) as info:
        cache.read(manifest)
    assert "shard-00001.parquet" in str(info.value) and "\n" not in str(info.value)

    shutil.copy(entry / "shard-00000.parquet", entry / "shard-00001.parquet")
    with pytest.raises(FeatureCacheError, match=r"shard-00001.parquet: row 8 holds sample_id 's000'"):
        extract(encoder, manifest, root, tmp_path, batch_size=BATCH, shard_size=SHARD, progress=False)


def test_cache_errors_are_user_errors():
    assert issubclass(FeatureCacheError, UserError) and issubclass(FeatureCacheError, RuntimeError)
    assert issubclass(ImageReadError, UserError) and issubclass(ImageReadError, RuntimeError)
