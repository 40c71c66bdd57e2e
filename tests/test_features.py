"""Feature extraction and the parquet feature cache: key, resume, warm hits, alignment, errors.

Uses a tiny random conv encoder built in place and a few dozen small PNGs; no downloads.
Run as a script (``python tests/test_features.py child ...``) it is the child process of the
kill-and-resume test.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from robustbench_fm.encoders.base import Encoder
from robustbench_fm.encoders.spec import EncoderSpec
from robustbench_fm.features import (FeatureCache, FeatureCacheError, ImageReadError, cache_key,
                                     cache_key_fields, extract, load_features)
from robustbench_fm.features.cache import PARQUET_META_KEY

N_IMAGES, SHARD, BATCH = 40, 8, 3  # 5 shards; batches of 3 do not divide a shard
REPO = Path(__file__).resolve().parents[1]


def tiny_encoder(weights_id: str = "test", **spec_changes) -> Encoder:
    spec = EncoderSpec(name="tiny", library="timm", hub_id="test", input_size=32, mean=(0.5,) * 3,
                       std=(0.5,) * 3, embedding="pooled", embed_dim=8, params_m=0.0, pretrained=False,
                       seed=0).replace(**spec_changes)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(),
                                    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 8))
    return Encoder(spec=spec, model=model, forward=model, weights_id=weights_id, device=torch.device("cpu"))


def make_dataset(root: Path, n: int = N_IMAGES) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    (root / "img").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        h, w = (40, 48) if i % 2 else (36, 36)
        arr = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        Image.fromarray(arr).save(root / "img" / f"{i:03d}.png")
        rows.append({"sample_id": f"s{i:03d}", "path": f"img/{i:03d}.png", "pneumothorax": float(i % 2)})
    return pd.DataFrame(rows)


def shard_bytes(entry: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(entry.glob("shard-*.parquet"))}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    return root, make_dataset(root)


@pytest.fixture(scope="module")
def encoder():
    return tiny_encoder()


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


# ---- (b) kill and resume ----------------------------------------------------------------------


def test_crash_and_resume_is_byte_identical(data, encoder, reference, tmp_path):
    root, manifest = data
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
    entry = tmp_path / "tiny" / reference.key
    assert sorted(shard_bytes(entry)) == ["shard-00000.parquet", "shard-00001.parquet"]
    cache = FeatureCache(tmp_path, reference.fields)
    assert cache.done_ids(manifest) == set(manifest["sample_id"][:16])
    assert cache.missing_shards() == [2, 3, 4]
    with pytest.raises(FeatureCacheError, match=r"24 of 40 rows in 3 of 5 shards missing"):
        cache.read(manifest)
    # a half-written temp file of a killed run must be ignored
    (entry / ".shard-00002.parquet.tmp-99999-abc").write_bytes(b"PAR1 half written")

    resumed = extract(encoder, manifest, root, tmp_path, batch_size=BATCH, shard_size=SHARD, progress=False)
    assert resumed.n_images_embedded == N_IMAGES - 16
    assert resumed.n_forward == 3 * 3  # 3 shards x ceil(8 / 3) batches
    assert shard_bytes(entry) == shard_bytes(reference.path)
    assert (entry / "meta.json").read_bytes() == (reference.path / "meta.json").read_bytes()
    np.testing.assert_array_equal(resumed.embeddings, reference.embeddings)


def test_sigkill_and_resume_is_byte_identical(data, encoder, reference, tmp_path):
    root, manifest = data
    manifest.to_csv(tmp_path / "manifest.csv", index=False)
    cache_root = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    child = subprocess.Popen([sys.executable, __file__, "child", str(root), str(tmp_path / "manifest.csv"),
                              str(cache_root)], env=env, stderr=subprocess.PIPE)
    entry = cache_root / "tiny" / reference.key
    deadline = time.monotonic() + 60
    try:
        while not (entry / "shard-00001.parquet").exists():
            assert child.poll() is None, child.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "child wrote no shards within 60 s"
            time.sleep(0.005)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    done = FeatureCache(cache_root, reference.fields).complete_shards()
    assert 2 <= len(done) < 5, done
    resumed = extract(encoder, manifest, root, cache_root, batch_size=BATCH, shard_size=SHARD, progress=False)
    assert resumed.n_images_embedded == N_IMAGES - SHARD * len(done)
    assert shard_bytes(entry) == shard_bytes(reference.path)
    np.testing.assert_array_equal(resumed.embeddings, reference.embeddings)


def _child(root: str, manifest_csv: str, cache_root: str) -> None:
    def slow_reader(image_root, row):
        time.sleep(0.05)
        with Image.open(image_root / row["path"]) as im:
            im.load()
            return im

    manifest = pd.read_csv(manifest_csv, dtype={"sample_id": str, "path": str})
    extract(tiny_encoder(), manifest, Path(root), Path(cache_root), batch_size=BATCH, shard_size=SHARD,
            progress=False, reader=slow_reader)


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
    entry = FeatureCache(tmp_path, cache_key_fields(encoder, bad))
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


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "child":
    _child(*sys.argv[2:])
