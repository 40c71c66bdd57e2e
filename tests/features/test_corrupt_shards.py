"""A cache shard that is not the file its entry recorded (issue 54 item 3): ``meta.json`` records
each shard's SHA-256 when it is written, and it is checked whenever the shard is read. The store's
look-up names a corrupted or truncated shard in one warning line and recomputes only it (the run
gets the values a clean cache gives); ``load_features`` of an entry or a view refuses it in one
line, never returning the flipped values or crashing in pyarrow ("ArrowInvalid ... this is a
bug"). On ae38a5a flipped bytes were read as features and a truncated shard crashed."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from feature_fixtures import engine_extract, tiny_encoder, write_images

from robustbench_fm.features import FeatureCacheError, load_features
from robustbench_fm.features.embed import Embedder
from robustbench_fm.features.options import ExtractOptions
from robustbench_fm.features.store import FeatureStore

SHARD_SIZE = 4


def _served(tmp_path, n: int = 10):
    manifest = write_images(tmp_path / "img", n=n)
    embedder = Embedder(tmp_path / "cache", ExtractOptions(device="cpu", batch_size=4, shard_size=SHARD_SIZE))
    feats = embedder.embed(manifest, tmp_path / "img", tiny_encoder())
    return embedder, manifest, feats, load_features(feats.path, manifest)[1]


def _chunk_shard(tmp_path, i: int):
    (meta,) = [m for m in (tmp_path / "cache" / "tiny").glob("images-*/*/meta.json")]
    return meta.parent / f"shard-{i:05d}.parquet", json.loads(meta.read_text())


def _flip(shard, values: np.ndarray) -> None:
    """Flip 8 bytes of the stored float32 embeddings (plain-encoded: their bytes are in the file)."""
    data = bytearray(shard.read_bytes())
    at = bytes(data).find(values.astype(np.float32).tobytes())
    assert at > 0
    data[at + 4:at + 12] = bytes(b ^ 0x5A for b in data[at + 4:at + 12])
    shard.write_bytes(bytes(data))


def _truncate(shard) -> None:
    data = shard.read_bytes()
    shard.write_bytes(data[:len(data) // 2])


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_bad_shard_is_named_once_and_only_it_is_recomputed(tmp_path, caplog, damage):
    embedder, manifest, feats, clean = _served(tmp_path)
    shard, _ = _chunk_shard(tmp_path, 1)
    _flip(shard, clean[SHARD_SIZE:2 * SHARD_SIZE]) if damage == "flip" else _truncate(shard)
    with caplog.at_level(logging.WARNING, logger="robustbench_fm.features"):
        again = embedder.embed(manifest, tmp_path / "img", tiny_encoder())
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and str(shard) in warnings[0] and "corrupted cache shard" in warnings[0]
    assert "\n" not in warnings[0] and f"recomputing its {SHARD_SIZE} rows" in warnings[0]
    assert again.n_images_embedded == SHARD_SIZE and again.path == feats.path
    assert load_features(again.path, manifest)[1].tobytes() == clean.tobytes()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="robustbench_fm.features"):
        third = embedder.embed(manifest, tmp_path / "img", tiny_encoder())
    assert third.n_images_embedded == 0 and not caplog.records  # recorded again, clean


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_reading_a_bad_shard_is_a_one_line_error_naming_it(tmp_path, damage):
    _, manifest, feats, clean = _served(tmp_path)
    shard, _ = _chunk_shard(tmp_path, 2)
    _flip(shard, clean[2 * SHARD_SIZE:]) if damage == "flip" else _truncate(shard)
    with pytest.raises(FeatureCacheError) as view_error:
        load_features(feats.path, manifest)  # the manifest's view
    with pytest.raises(FeatureCacheError) as entry_error:
        load_features(shard.parent)  # the chunk, as an entry folder
    for err in (view_error, entry_error):
        msg = str(err.value)
        assert msg.startswith(f"{shard}: corrupted cache shard") and "\n" not in msg
        assert "recorded in meta.json" in msg and "run the extraction again" in msg


def test_an_entry_the_engine_reads_back_is_checked(tmp_path):
    """An entry filled by the engine directly (``read=True``) and read again after a flip."""
    manifest = write_images(tmp_path / "img", n=6)
    first = engine_extract(tiny_encoder(), manifest, tmp_path / "img", tmp_path / "c", batch_size=4, shard_size=4,
                           progress=False)
    _flip(first.path / "shard-00000.parquet", first.embeddings[:4])
    with pytest.raises(FeatureCacheError, match="shard-00000.parquet: corrupted cache shard"):
        load_features(first.path, manifest)


def test_a_shard_is_hashed_once_per_process_and_file_version(tmp_path, monkeypatch):
    """The look-up's check and the read after it hash each shard once (the SHA-256 of a shard this
    process wrote is known without reading it); a rewritten file is hashed again."""
    from robustbench_fm.core import shards

    _, manifest, feats, clean = _served(tmp_path)
    hashed = []
    real = shards.file_sha256
    monkeypatch.setattr(shards, "file_sha256", lambda p, *a: hashed.append(p) or real(p, *a))
    FeatureStore(tmp_path / "cache")  # nothing hashed by opening the store
    load_features(feats.path, manifest)
    assert hashed == []  # written by this process: known
    shard, _ = _chunk_shard(tmp_path, 0)
    shard.write_bytes(shard.read_bytes())  # same bytes, a new file version
    load_features(feats.path, manifest)
    load_features(feats.path, manifest)
    assert hashed == [shard]
