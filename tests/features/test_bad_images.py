"""Unreadable images: ``on_bad_image="error"`` names the file and row; ``"skip"`` records the row.

Four kinds of bad input, each in a different shard: a truncated PNG, garbage bytes with a PNG
name, a missing file, and a file whose reader raises (the stand-in for a DICOM without pixel
data, which a real reader reports the same way).
"""
from __future__ import annotations

import csv
import io
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

# the engine filling a manifest-keyed entry: these tests are about the engine and the entry format
from feature_fixtures import engine_extract as extract
from feature_fixtures import shard_bytes, tiny_encoder, write_images
from PIL import Image

from robustbench_fm.core.errors import UserError
from robustbench_fm.features import (
    FeatureCache,
    FeatureCacheError,
    ImageReadError,
    cache_key,
    cache_key_fields,
    read_skipped,
    skipped_ids,
)
from robustbench_fm.features.engine.rows import default_reader

N_IMAGES, SHARD, BATCH = 40, 8, 3
# row -> (kind, file name); one bad row in each of shards 0-3
BAD = {5: ("truncated", "img/005_truncated.png"), 12: ("garbage", "img/012_garbage.png"),
       21: ("missing", "img/021_missing.png"), 30: ("no_pixels", "img/030.dcm")}
DICOM_NO_PIXELS = b"DICM-no-pixel-data"


def reader(image_root: Path, row: dict) -> Image.Image:
    """The default reader, except that a file starting with DICOM_NO_PIXELS raises like pydicom
    reading a DICOM without pixel data."""
    path = Path(image_root) / row["path"]
    with open(path, "rb") as f:
        if f.read(len(DICOM_NO_PIXELS)) == DICOM_NO_PIXELS:
            raise AttributeError("'FileDataset' object has no attribute 'PixelData'")
    return default_reader(image_root, row)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """(clean root, clean manifest, bad root, bad manifest): the bad root holds the broken files,
    the clean root holds good images under the very same relative paths."""
    clean_root = tmp_path_factory.mktemp("clean")
    manifest = write_images(clean_root, N_IMAGES)
    bad_manifest = manifest.copy()
    for row, (_, rel) in BAD.items():
        bad_manifest.loc[row, "path"] = rel
        shutil.copy(clean_root / manifest.loc[row, "path"], clean_root / rel)  # good image, same name
    bad_root = tmp_path_factory.mktemp("bad")
    shutil.copytree(clean_root / "img", bad_root / "img")
    png = (clean_root / "img" / "005.png").read_bytes()
    (bad_root / BAD[5][1]).write_bytes(png[: len(png) // 2])
    (bad_root / BAD[12][1]).write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8)
    (bad_root / BAD[21][1]).unlink()
    (bad_root / BAD[30][1]).write_bytes(DICOM_NO_PIXELS + b"\x00" * 128)
    return clean_root, manifest, bad_root, bad_manifest


def one_bad(manifest: pd.DataFrame, row: int) -> pd.DataFrame:
    out = manifest.copy()
    out.loc[row, "path"] = BAD[row][1]
    return out


@pytest.mark.parametrize("row", sorted(BAD), ids=[BAD[r][0] for r in sorted(BAD)])
def test_error_policy_names_file_and_row(row, data, encoder, tmp_path):
    _, manifest, bad_root, _ = data
    bad = one_bad(manifest, row)
    with pytest.raises(ImageReadError) as info:
        extract(encoder, bad, bad_root, tmp_path, batch_size=BATCH, shard_size=SHARD, progress=False,
                reader=reader, num_workers=row % 2)  # both inline decoding and a worker
    msg = str(info.value)
    assert isinstance(info.value, UserError)
    assert "\n" not in msg
    assert f"{bad_root / BAD[row][1]} (manifest row {row}, sample_id 's{row:03d}')" in msg, msg
    expected = {"truncated": "truncated", "garbage": "cannot identify image file", "missing": "FileNotFoundError",
                "no_pixels": "PixelData"}[BAD[row][0]]
    assert expected in msg, msg
    # shards before the bad row are kept; the one holding it and later ones are not written
    cache = FeatureCache(tmp_path, cache_key_fields(encoder, bad, bad_root))
    assert cache.complete_shards() == list(range(row // SHARD))
    assert not cache.skipped_path.exists()


def test_skip_policy_records_rows_and_stays_consistent(data, encoder, tmp_path, caplog):
    clean_root, _, bad_root, bad_manifest = data
    clean = extract(encoder, bad_manifest, clean_root, tmp_path / "clean", batch_size=BATCH, shard_size=SHARD,
                    progress=False, reader=reader)
    assert clean.skipped == [] and np.isfinite(clean.embeddings).all()

    calls = []

    def counting_reader(image_root, row):
        calls.append(row["sample_id"])
        return reader(image_root, row)

    with caplog.at_level(logging.WARNING, logger="robustbench_fm.features"):
        out = extract(encoder, bad_manifest, bad_root, tmp_path / "cache", batch_size=BATCH, shard_size=SHARD,
                      progress=False, reader=counting_reader, on_bad_image="skip", num_workers=0)
    # the policy is not part of the key (only the image root tells the two folders apart)
    assert out.key == cache_key({**cache_key_fields(encoder, bad_manifest, clean_root),
                                 "image_root": str(bad_root.resolve())}) != clean.key
    want = [f"s{r:03d}" for r in sorted(BAD)]
    assert out.skipped == want
    assert "skipped 4 of 40 rows" in caplog.text
    assert out.n_images_embedded == N_IMAGES - 4 and len(calls) == N_IMAGES
    bad_rows = sorted(BAD)
    assert np.isnan(out.embeddings[bad_rows]).all()
    keep = np.setdiff1d(np.arange(N_IMAGES), bad_rows)
    assert (out.kept == np.isin(np.arange(N_IMAGES), keep)).all()
    # the other rows are bit-identical to a clean run's (failed rows are zero images in the batch)
    np.testing.assert_array_equal(out.embeddings[keep], clean.embeddings[keep])

    # skipped.csv: exactly those rows, sorted, one line each, no absolute paths
    text = (out.path / "skipped.csv").read_text()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert text.count("\n") == 5 and list(rows[0]) == ["sample_id", "row", "path", "error"]
    assert [(r["sample_id"], int(r["row"]), r["path"]) for r in rows] == \
        [(f"s{r:03d}", r, BAD[r][1]) for r in bad_rows]
    assert all(r["error"] for r in rows) and str(bad_root) not in text
    assert "FileNotFoundError" in rows[2]["error"] and "PixelData" in rows[3]["error"]
    assert skipped_ids(out.path) == want
    assert list(read_skipped(out.path)["row"]) == bad_rows

    # warm re-run: a cache hit, same list, no image read, nothing rewritten
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.path.iterdir()}
    calls.clear()
    warm = extract(encoder, bad_manifest, bad_root, tmp_path / "cache", batch_size=BATCH, shard_size=SHARD,
                   progress=False, reader=counting_reader, on_bad_image="skip")
    assert warm.n_forward == 0 and calls == [] and warm.skipped == want
    np.testing.assert_array_equal(warm.embeddings, out.embeddings)
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.path.iterdir()} == before

    # the same run with a decode worker writes the same bytes
    again = extract(encoder, bad_manifest, bad_root, tmp_path / "cache2", batch_size=BATCH, shard_size=SHARD,
                    progress=False, reader=reader, on_bad_image="skip", num_workers=1)
    assert shard_bytes(again.path) == shard_bytes(out.path)
    assert (again.path / "skipped.csv").read_bytes() == (out.path / "skipped.csv").read_bytes()

    # "error" on an entry with skipped rows: re-reads only those images; still bad -> the error, nothing deleted
    calls.clear()
    with pytest.raises(ImageReadError, match=r"005_truncated.png \(manifest row 5, sample_id 's005'\).*skipped.csv"):
        extract(encoder, bad_manifest, bad_root, tmp_path / "cache", batch_size=BATCH, shard_size=SHARD,
                progress=False, reader=counting_reader)
    assert calls == ["s005"]
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.path.iterdir()} == before

    # ... and once the images are fixed (same paths), the shards holding them are recomputed: a clean entry
    shutil.copytree(clean_root, bad_root, dirs_exist_ok=True)
    fixed = extract(encoder, bad_manifest, bad_root, tmp_path / "cache", batch_size=BATCH, shard_size=SHARD,
                    progress=False, reader=reader)
    assert fixed.skipped == [] and fixed.n_images_embedded == 4 * SHARD and fixed.path == out.path
    assert not (out.path / "skipped.csv").exists()
    # the same features as a clean run's (the entries differ only by the image root in their key)
    np.testing.assert_array_equal(fixed.embeddings, clean.embeddings)
    metas = [json.loads((e / "meta.json").read_text()) for e in (out.path, clean.path)]
    assert metas[0]["n_shards"] == metas[1]["n_shards"] and metas[0]["status"] == metas[1]["status"]


def test_skipped_rows_are_the_only_nan_rows(data, tmp_path):
    """An encoder that returns NaN for a readable image is an error naming it, even with skip."""
    clean_root, manifest, _, _ = data
    white = manifest.copy()
    Image.fromarray(np.full((36, 36, 3), 255, np.uint8)).save(clean_root / "img" / "white.png")
    white.loc[9, "path"] = "img/white.png"

    def nan_for_white(model, x):
        out = model(x)
        return torch.where((x.amin(dim=(1, 2, 3)) >= 0.99)[:, None], torch.nan, out)

    enc = tiny_encoder(forward=nan_for_white)
    with pytest.raises(FeatureCacheError, match=r"non-finite features for sample_id 's009' \(manifest row 9\)"):
        extract(enc, white, clean_root, tmp_path, batch_size=BATCH, shard_size=SHARD, progress=False,
                on_bad_image="skip")
    assert FeatureCache(tmp_path, cache_key_fields(enc, white, clean_root)).complete_shards() == [0]


def test_policy_is_checked(data, encoder, tmp_path):
    """The policy is checked once, by the extraction options (features.options.ExtractOptions), for
    every way in: the public extract() names the keyword it was given."""
    from robustbench_fm.features import extract as served

    clean_root, manifest, _, _ = data
    with pytest.raises(ValueError, match=r"^on_bad_image='ignore': use error or skip \(stop at an unreadable"):
        served(encoder, manifest, clean_root, tmp_path, on_bad_image="ignore", progress=False)
    assert not any(tmp_path.iterdir())  # refused before any image is hashed or embedded


@pytest.mark.parametrize("size", [(1, 1), (15, 40)])
def test_an_image_below_the_minimum_size_stops_or_is_skipped_and_listed(data, encoder, tmp_path, size):
    """Issue 41 item 3: a 1x1 image was embedded and scored like a radiograph. Below
    MIN_IMAGE_SIDE (16 px) on its short side it is refused naming the file and row, or skipped
    under on_bad_image=skip and listed in skipped.csv; 16 px exactly is read."""
    from robustbench_fm.data.images import MIN_IMAGE_SIDE

    clean_root, manifest, _, _ = data
    root = tmp_path / "root"
    shutil.copytree(clean_root, root)
    Image.fromarray(np.zeros(size[::-1], np.uint8)).save(root / "img" / "007.png")
    with pytest.raises(ImageReadError) as info:
        extract(encoder, manifest, root, tmp_path / "a", batch_size=BATCH, shard_size=SHARD, progress=False)
    msg = str(info.value)
    assert f"{root / 'img' / '007.png'} (manifest row 7, sample_id 's007')" in msg and "\n" not in msg
    assert (f"ImageTooSmall: the image is {size[0]}x{size[1]} px, below the minimum of {MIN_IMAGE_SIDE} px on its "
            "short side") in msg
    out = extract(encoder, manifest, root, tmp_path / "b", batch_size=BATCH, shard_size=SHARD, progress=False,
                  on_bad_image="skip")
    assert out.skipped == ["s007"] and skipped_ids(out.path) == ["s007"]
    assert np.isnan(out.embeddings[7]).all() and np.isfinite(np.delete(out.embeddings, 7, axis=0)).all()
    Image.fromarray(np.zeros((MIN_IMAGE_SIDE, 40), np.uint8)).save(root / "img" / "007.png")
    assert extract(encoder, manifest, root, tmp_path / "c", batch_size=BATCH, shard_size=SHARD,
                   progress=False).skipped == []
