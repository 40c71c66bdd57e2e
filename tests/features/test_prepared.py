"""The prepared-image stage (robustbench_fm/data/prepared.py; candor.md "Scope":
"Every image is stored at 224x224 pixels. The image processor of each encoder then resizes it"):
pixels equal an independent Pillow resize, a killed run resumes byte-identically, a panel prepares
once for all encoders, and the store's and the feature cache's keys follow the settings."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from feature_fixtures import tiny_encoder, write_images
from PIL import Image

from robustbench_fm.data import prepared
from robustbench_fm.data.images import read_image
from robustbench_fm.features.embed import Embedder
from robustbench_fm.features.key import cache_key, cache_key_fields
from robustbench_fm.features.load import load_features
from robustbench_fm.features.options import ExtractOptions


def _stored(store: Path) -> dict[str, Image.Image]:
    """source -> decoded stored image, read with pyarrow and Pillow only (not our reader)."""
    out = {}
    for f in sorted(store.glob("shard-*.parquet")):
        t = pq.read_table(f).to_pydict()
        for src, data in zip(t["source"], t["image"]):
            with Image.open(io.BytesIO(data)) as im:
                im.load()
                out[src] = im
    return out


def _mixed_images(root: Path) -> pd.DataFrame:
    """An RGB JPEG larger than 224 (shrunk), a grayscale PNG smaller than 224 (enlarged, not
    square), an RGBA PNG, and the JPEG again with a crop (a second source of the same file)."""
    rng = np.random.default_rng(3)
    (root / "a").mkdir(parents=True)
    Image.fromarray(rng.integers(0, 256, (300, 410, 3), dtype=np.uint8)).save(root / "a" / "rgb.jpg", quality=90)
    Image.fromarray(rng.integers(0, 256, (50, 80), dtype=np.uint8)).save(root / "a" / "gray.png")
    Image.fromarray(rng.integers(0, 256, (64, 64, 4), dtype=np.uint8)).save(root / "a" / "rgba.png")
    return pd.DataFrame({"sample_id": ["rgb", "gray", "rgba", "rgb_crop"],
                         "path": ["a/rgb.jpg", "a/gray.png", "a/rgba.png", "a/rgb.jpg"],
                         "crop_left": [np.nan, np.nan, np.nan, 10], "crop_top": [np.nan] * 3 + [0],
                         "crop_right": [np.nan] * 3 + [0], "crop_bottom": [np.nan] * 3 + [20],
                         "edema": [1.0, 0.0, 1.0, 0.0]})


def test_pixels_equal_an_independent_pillow_resize(tmp_path):
    m = _mixed_images(tmp_path / "src")
    done = prepared.prepare(m, tmp_path / "src", tmp_path / "store", 224, progress=False)
    stored = _stored(done.root)
    with Image.open(tmp_path / "src" / "a" / "rgb.jpg") as im:
        rgb = im.convert("RGB")
    with Image.open(tmp_path / "src" / "a" / "gray.png") as im:
        gray = im.copy()
    with Image.open(tmp_path / "src" / "a" / "rgba.png") as im:
        rgba = im.convert("RGB")
    want = {"a/rgb.jpg": rgb, "a/gray.png": gray, "a/rgba.png": rgba,
            "a/rgb.jpg|crop=10,0,0,20": rgb.crop((10, 0, 410, 280))}
    assert sorted(stored) == sorted(want)  # one stored image per distinct source
    for src, im in want.items():
        ref = im.resize((224, 224), Image.Resampling.BICUBIC)
        assert stored[src].mode == ref.mode == ("L" if src == "a/gray.png" else "RGB")
        assert stored[src].size == (224, 224)
        np.testing.assert_array_equal(np.asarray(stored[src]), np.asarray(ref))
    # what an encoder reads through the returned manifest is the stored image, crop columns gone
    assert not {"crop_left", "crop_bottom"} & set(done.manifest.columns)
    assert done.manifest["sample_id"].tolist() == m["sample_id"].tolist()
    assert done.manifest["edema"].tolist() == m["edema"].tolist()
    for row, src in zip(done.manifest.to_dict("records"), want):
        np.testing.assert_array_equal(np.asarray(read_image(done.root, row)), np.asarray(stored[src]))
    # 512 px: the same rule, another store
    big = prepared.prepare(m, tmp_path / "src", tmp_path / "store", 512, progress=False)
    assert big.root != done.root and big.root.parent.name == "512px"
    np.testing.assert_array_equal(np.asarray(_stored(big.root)["a/gray.png"]),
                                  np.asarray(gray.resize((512, 512), Image.Resampling.BICUBIC)))


def _count_decodes(monkeypatch) -> list:
    calls = []
    real = prepared.read_image

    def counting(root, row, need=None):
        calls.append(row["path"])
        return real(root, row, need)

    monkeypatch.setattr(prepared, "read_image", counting)
    return calls


def test_a_killed_run_resumes_from_its_missing_shards_byte_identically(tmp_path, monkeypatch):
    m = write_images(tmp_path / "src", n=10)
    whole = prepared.prepare(m, tmp_path / "src", tmp_path / "a", 32, shard_size=3, progress=False)
    assert whole.n_decoded == 10 and whole.shards_written == [0, 1, 2, 3]

    real_meta = prepared.PreparedStore.write_meta

    def killed(self):  # the kill lands after shard 1 is renamed into place, before meta.json records it
        if self.shard_path(1).exists():
            raise KeyboardInterrupt
        real_meta(self)

    monkeypatch.setattr(prepared.PreparedStore, "write_meta", killed)
    with pytest.raises(KeyboardInterrupt):
        prepared.prepare(m, tmp_path / "src", tmp_path / "b", 32, shard_size=3, progress=False)
    monkeypatch.undo()
    store_b = tmp_path / "b" / "32px" / whole.key
    assert sorted(p.name for p in store_b.glob("shard-*")) == ["shard-00000.parquet", "shard-00001.parquet"]
    assert not list((tmp_path / "b" / "32px").glob("*.lock"))  # released on the way out

    calls = _count_decodes(monkeypatch)
    resumed = prepared.prepare(m, tmp_path / "src", tmp_path / "b", 32, shard_size=3, progress=False)
    assert resumed.key == whole.key and resumed.shards_written == [2, 3]
    assert len(calls) == resumed.n_decoded == 4  # rows 6-9 only
    files = lambda root: {p.name: p.read_bytes() for p in sorted(root.iterdir())}  # noqa: E731
    assert files(resumed.root) == files(whole.root)  # shards and meta.json, byte for byte
    assert list(resumed.manifest["path"]) == [f"shard-{i // 3:05d}.parquet#{i % 3}" for i in range(10)]
    # decoded in 2 forked processes: the same bytes
    forked = prepared.prepare(m, tmp_path / "src", tmp_path / "c", 32, shard_size=3, workers=2, progress=False)
    assert files(forked.root) == files(whole.root)
    # complete: nothing read or written again
    calls.clear()
    again = prepared.prepare(m, tmp_path / "src", tmp_path / "b", 32, shard_size=3, progress=False)
    assert (again.n_decoded, again.shards_written, calls) == (0, [], [])


def test_a_panel_prepares_once_and_each_encoder_transforms_the_stored_image(tmp_path, monkeypatch):
    m = write_images(tmp_path / "src", n=12)
    calls = _count_decodes(monkeypatch)
    writes = []
    real_write = prepared.PreparedStore.write_shard
    monkeypatch.setattr(prepared.PreparedStore, "write_shard",
                        lambda self, i, *a: writes.append(i) or real_write(self, i, *a))
    service = Embedder(tmp_path / "cache" / "features", ExtractOptions(num_workers=0, shard_size=5), resolution=64)
    one, two = tiny_encoder(), tiny_encoder(name="tiny2", weights_id="other")
    f1 = service.embed(m, tmp_path / "src", one)
    assert (len(calls), writes) == (12, [0, 1, 2])
    f2 = service.embed(m, tmp_path / "src", two)
    assert (len(calls), writes) == (12, [0, 1, 2])  # the second encoder reads the same store
    assert f1.fields["image_root"] == f2.fields["image_root"]
    store = Path(f1.fields["image_root"])
    assert store.parent == tmp_path / "cache" / "prepared" / "64px"

    # independent reference: the images resized by hand, embedded natively
    ref_root = tmp_path / "by_hand"
    for rel in m["path"]:
        (ref_root / rel).parent.mkdir(parents=True, exist_ok=True)
        with Image.open(tmp_path / "src" / rel) as im:
            im.convert("RGB").resize((64, 64), Image.Resampling.BICUBIC).save(ref_root / rel)
    native = Embedder(tmp_path / "cache2", ExtractOptions(num_workers=0, shard_size=5))  # the same batches
    for enc, feats in ((one, f1), (two, f2)):
        ref = native.embed(m, ref_root, enc)
        np.testing.assert_array_equal(load_features(feats.path, m)[1], load_features(ref.path, m)[1])


def test_keys_follow_the_settings_and_native_differs(tmp_path, monkeypatch):
    m = write_images(tmp_path / "src", n=6)
    sources, _ = prepared.source_locators(m)
    base = prepared.key_fields(sources, tmp_path / "src", 224)
    key = prepared.store_key
    relabelled = m.assign(pneumothorax=1.0, sample_id=[f"x{i}" for i in range(6)])
    assert key(prepared.key_fields(prepared.source_locators(relabelled)[0], tmp_path / "src", 224)) == key(base)
    variants = {
        "size": prepared.key_fields(sources, tmp_path / "src", 512),
        "root": prepared.key_fields(sources, tmp_path / "other", 224),
        "crop": prepared.key_fields(prepared.source_locators(m.assign(crop_top=[0, 0, 0, 0, 0, 2]))[0],
                                    tmp_path / "src", 224),
        "order": prepared.key_fields(prepared.source_locators(m.iloc[::-1])[0], tmp_path / "src", 224),
    }
    monkeypatch.setattr(prepared, "PREPARE_VERSION", prepared.PREPARE_VERSION + 1)
    variants["version"] = prepared.key_fields(sources, tmp_path / "src", 224)
    monkeypatch.undo()
    assert len({key(base), *map(key, variants.values())}) == 6

    enc = tiny_encoder()
    keys = {}
    for res in (None, 224, 512):
        service = Embedder(tmp_path / "cache", ExtractOptions(num_workers=0), resolution=res)
        man, root = service.prepare(m, tmp_path / "src")
        keys[res] = cache_key(cache_key_fields(enc, man, root))
    assert len(set(keys.values())) == 3  # native, 224 and 512 never share a feature-cache entry
    man, root = Embedder(tmp_path / "cache", resolution=224).prepare(m, tmp_path / "src")
    assert cache_key(cache_key_fields(enc, man, root)) == keys[224]  # and the same settings do


def test_resolution_values_are_checked_in_one_line():
    assert prepared.parse_resolution("native") is None and prepared.parse_resolution(None) is None
    assert prepared.parse_resolution(224) == prepared.parse_resolution("512") - 288
    for bad in ("224px", 2.5, True, 4):
        with pytest.raises(ValueError, match="resolution=") as err:
            prepared.parse_resolution(bad)
        assert "\n" not in str(err.value)


def test_unreadable_images_stop_or_are_skipped_and_retried(tmp_path):
    m = write_images(tmp_path / "src", n=4)
    (tmp_path / "src" / "img" / "002.png").write_bytes(b"not a png")
    with pytest.raises(prepared.PreparedImageError, match=r"002.png \(manifest row 2, sample_id 's002'\)"):
        prepared.prepare(m, tmp_path / "src", tmp_path / "store", 32, shard_size=2, progress=False)
    service = Embedder(tmp_path / "cache", ExtractOptions(num_workers=0, shard_size=2, on_bad_image="skip"),
                       resolution=32)
    feats = service.embed(m, tmp_path / "src", tiny_encoder())
    assert feats.skipped == ["s002"]
    assert "UnidentifiedImageError" in pd.read_csv(feats.path / "skipped.csv")["error"].iloc[0]
    # the file is repaired: an "error" run re-reads it and rewrites its shard only
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(tmp_path / "src" / "img" / "002.png")
    again = prepared.prepare(m, tmp_path / "src", service.prepared_root, 32, shard_size=2,
                             progress=False)
    assert (again.failed, again.shards_written, again.n_decoded) == ({}, [1], 3)
    assert np.asarray(read_image(again.root, again.manifest.iloc[2].to_dict())).shape == (32, 32, 3)


def _ids(m: pd.DataFrame, root: Path, cache: Path) -> np.ndarray:
    from robustbench_fm.features import store  # the feature store's identities, as the Embedder passes them

    return store.source_ids(m, root, store.FileHashes(cache))


def test_images_are_found_per_image_across_entries_and_moved_roots(tmp_path, monkeypatch):
    """Issue 31 item 4: with identities, a source an earlier complete entry holds is read from it
    (no decode); only the others are decoded, into a new entry of just them. The pixels are the
    bytes a fresh store of the whole manifest holds, and the same files under another root decode
    nothing."""
    m = write_images(tmp_path / "src", n=8)
    calls = _count_decodes(monkeypatch)
    first = m.iloc[:5]
    a = prepared.prepare(first, tmp_path / "src", tmp_path / "store", 32, shard_size=2, progress=False,
                         identities=_ids(first, tmp_path / "src", tmp_path))
    assert (a.n_decoded, len(calls)) == (5, 5) and (a.root / prepared.IDENTITIES_NAME).is_file()
    # a reordered extension: rows 7, 3, 6, 0 (two held, two new)
    ext = m.iloc[[7, 3, 6, 0]].reset_index(drop=True)
    b = prepared.prepare(ext, tmp_path / "src", tmp_path / "store", 32, shard_size=2, progress=False,
                         identities=_ids(ext, tmp_path / "src", tmp_path))
    assert (b.n_decoded, len(calls)) == (2, 7)
    assert b.root == tmp_path / "store" / "32px"
    keys = [p.split("/")[0] for p in b.manifest["path"]]
    assert keys[1] == keys[3] == a.key and keys[0] == keys[2] == b.key != a.key
    fresh = prepared.prepare(ext, tmp_path / "src", tmp_path / "fresh", 32, shard_size=2, progress=False)
    for i in range(len(ext)):
        got = read_image(b.root, b.manifest.iloc[i].to_dict())
        want = read_image(fresh.root, fresh.manifest.iloc[i].to_dict())
        assert got.tobytes() == want.tobytes() and got.size == (32, 32)
    assert len(calls) == 11  # + the fresh store's 4
    # the same files mounted elsewhere: found by content; only image 5, never prepared, is decoded
    moved = tmp_path / "elsewhere"
    (tmp_path / "src").rename(moved)
    c = prepared.prepare(m, moved, tmp_path / "store", 32, shard_size=2, progress=False,
                         identities=_ids(m, moved, tmp_path))
    assert (c.n_decoded, len(calls), calls[-1]) == (1, 12, "img/005.png")
    assert {p.split("/")[0] for p in c.manifest["path"]} == {a.key, b.key, c.key}
    again = prepared.prepare(m.iloc[::-1], moved, tmp_path / "store", 32, shard_size=2, progress=False,
                             identities=_ids(m.iloc[::-1], moved, tmp_path))
    assert (again.n_decoded, again.key, len(calls)) == (0, None, 12)
    # without identities a call keeps to its own entry (the earlier behaviour)
    d = prepared.prepare(m, moved, tmp_path / "store", 32, shard_size=2, progress=False)
    assert d.n_decoded == 8 and d.root.parent == tmp_path / "store" / "32px" and len(calls) == 20


def test_a_source_that_failed_in_an_earlier_entry_is_read_again(tmp_path):
    m = write_images(tmp_path / "src", n=3)
    (tmp_path / "src" / "img" / "001.png").write_bytes(b"not a png")
    ids = _ids(m, tmp_path / "src", tmp_path)
    skip = prepared.prepare(m, tmp_path / "src", tmp_path / "store", 32, on_bad_image="skip", progress=False,
                            identities=ids)
    assert list(skip.failed) == [1]
    assert set(prepared.held_images(tmp_path / "store", 32)) == {ids[0], ids[2]}
    sub = m.iloc[[1, 2]].reset_index(drop=True)
    with pytest.raises(prepared.PreparedImageError, match=r"001.png \(manifest row 0, sample_id 's001'\)"):
        prepared.prepare(sub, tmp_path / "src", tmp_path / "store", 32, progress=False, identities=ids[[1, 2]])


def test_a_retention_style_run_decodes_each_source_once(tmp_path, monkeypatch):
    """Occluded variants of already embedded images (another identity for the features, the same
    source pixels) are read from the prepared entry of the first run: no source decoded twice."""
    m = write_images(tmp_path / "src", n=6)
    calls = _count_decodes(monkeypatch)
    service = Embedder(tmp_path / "cache", ExtractOptions(num_workers=0, shard_size=4), resolution=32)
    enc = tiny_encoder()
    service.embed(m, tmp_path / "src", enc)
    assert len(calls) == 6
    occluded = m.iloc[[1, 4]].assign(sample_id=["o1", "o4"], occlude_x0=0.1, occlude_y0=0.1, occlude_x1=0.5,
                                      occlude_y1=0.5, occlude_fill="image_mean").reset_index(drop=True)
    feats = service.embed(occluded, tmp_path / "src", enc)
    assert len(calls) == 6 and feats.n_images_embedded == 2
    ref = Embedder(tmp_path / "cache_ref", ExtractOptions(num_workers=0, shard_size=4), resolution=32).embed(
        occluded, tmp_path / "src", enc)
    np.testing.assert_array_equal(load_features(feats.path, occluded)[1], load_features(ref.path, occluded)[1])


def test_an_image_below_the_minimum_size_is_not_stored(tmp_path):
    """Issue 41 item 3: the prepared-image store (resolution=224) refuses it too, naming the row."""
    m = write_images(tmp_path / "src", n=4)
    Image.fromarray(np.zeros((1, 1, 3), np.uint8)).save(tmp_path / "src" / "img" / "001.png")
    with pytest.raises(prepared.PreparedImageError, match=r"001.png \(manifest row 1, sample_id 's001'\).*"
                                                          r"ImageTooSmall: the image is 1x1 px"):
        prepared.prepare(m, tmp_path / "src", tmp_path / "store", 32, shard_size=2, progress=False)
