"""The per-image feature store (robustbench_fm/features/store.py, issue 31): a manifest is served by
looking up its images, so a reorder, a subset, a pool, an added image, a moved folder or a version
bump costs only the images no chunk holds, with features byte-identical to a fresh extraction;
entries of the earlier per-manifest layout (written by 45a9efd's code) are read without
re-embedding."""
import dataclasses
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from robustbench_fm.features import load_features, skipped_ids, store, verify_cache
from robustbench_fm.features.embed import Embedder
from robustbench_fm.features.options import ExtractOptions

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "cache_45a9efd"


def _images(folder: Path, n: int, seed: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (36, 36, 3), dtype=np.uint8)).save(folder / f"im{i}.png")


def _manifest(idx, prefix="s") -> pd.DataFrame:
    return pd.DataFrame({"sample_id": [f"{prefix}{i}" for i in idx], "path": [f"im{i}.png" for i in idx]})


@pytest.fixture(scope="module")
def encoder():
    from robustbench_fm import encoders

    # a real architecture (ViT-S/16, random weights) at a small input: kernels whose blocking
    # depends on the batch shape, which the store's padded batches must neutralise
    return encoders.load(encoders.get("random_vit_s").replace(input_size=32, model_kwargs={"img_size": 32}),
                         device="cpu")


def _embed(cache, manifest, root, enc, **kw):
    """``kw``: extraction options (fields of ExtractOptions) and the Embedder's own (resolution, ...)."""
    options = {k: kw.pop(k) for k in list(kw) if k in {f.name for f in dataclasses.fields(ExtractOptions)}}
    service = Embedder(cache, ExtractOptions(device="cpu", batch_size=4, shard_size=4, **options), **kw)
    feats = service.embed(manifest, root, enc)
    return feats, load_features(feats.path, manifest)[1]


def test_each_invalidation_costs_only_the_missing_images(tmp_path, encoder):
    """One shared cache; each call embeds exactly the images no earlier call embedded, and every
    matrix equals, byte for byte, a fresh extraction of the same manifest in an empty cache."""
    root = tmp_path / "data"
    _images(root, 9)
    cache = tmp_path / "cache"
    cases = [("first", _manifest(range(6)), root, 6),
             ("reorder", _manifest([5, 3, 1, 0, 2, 4]), root, 0),
             ("relabel + subset", _manifest([4, 1], prefix="other"), root, 0),
             ("add one image", _manifest(range(7)), root, 1),
             ("pool of two with a new image and a duplicate file", pd.concat(
                 [_manifest(range(7)), _manifest([7, 2], prefix="b")], ignore_index=True), root, 1)]
    moved = tmp_path / "moved" / "copy"
    shutil.copytree(root, moved)
    cases.append(("moved folder", _manifest(range(8)), moved, 0))
    for what, manifest, folder, embedded in cases:
        feats, got = _embed(cache, manifest, folder, encoder)
        assert feats.n_images_embedded == embedded, what
        _, fresh = _embed(tmp_path / f"fresh-{len(list(tmp_path.iterdir()))}", manifest, folder, encoder)
        assert got.tobytes() == fresh.tobytes(), what
    # the duplicate file (im2 as s2 and b2) was embedded once and is one row of one chunk
    chunks = sorted(p for p in (cache / encoder.spec.name).glob("images-*/*") if p.is_dir())
    assert sum(json.loads((c / "meta.json").read_text())["n_rows"] for c in chunks) == 8


def test_moving_the_cache_keeps_every_entry(tmp_path, encoder):
    _images(tmp_path / "data", 5)
    m = _manifest(range(5))
    feats, before = _embed(tmp_path / "out" / "cache", m, tmp_path / "data", encoder)
    shutil.move(tmp_path / "out", tmp_path / "elsewhere")
    again, after = _embed(tmp_path / "elsewhere" / "cache", m, tmp_path / "data", encoder)
    assert again.n_images_embedded == 0 and after.tobytes() == before.tobytes()
    assert again.path.name == feats.path.name


def test_a_version_bump_is_recorded_not_keyed(tmp_path, encoder, monkeypatch, caplog):
    """reuse (default): zero forwards and one line naming the versions; recompute: embedded again."""
    _images(tmp_path / "data", 4)
    m = _manifest(range(4))
    _, first = _embed(tmp_path / "cache", m, tmp_path / "data", encoder)
    now = store.made_with()
    bumped = {"package": "9.9.9", "libraries": {**now["libraries"], "torch": "99.0.1"}}
    monkeypatch.setattr(store, "made_with", lambda: bumped)
    with caplog.at_level(logging.INFO, logger="robustbench_fm.features"):
        feats, again = _embed(tmp_path / "cache", m, tmp_path / "data", encoder)
    assert feats.n_images_embedded == 0 and again.tobytes() == first.tobytes()
    line = next(r.getMessage() for r in caplog.records if "were embedded with" in r.getMessage())
    assert f"robustbench_fm {now['package']} (now 9.9.9)" in line and "torch" in line and "reuse" in line
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="robustbench_fm.features"):
        _embed(tmp_path / "cache", m, tmp_path / "data", encoder, on_version_change="warn")
    assert any("were embedded with" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    feats, redone = _embed(tmp_path / "cache", m, tmp_path / "data", encoder, on_version_change="recompute")
    assert feats.n_images_embedded == 4 and redone.tobytes() == first.tobytes()
    # the manifest's view now reads the chunk made with the current versions
    (chunk,) = set(pd.read_parquet(feats.path / "view.parquet")["chunk"])
    made = json.loads((feats.path.parent / chunk / "meta.json").read_text())["fields"]["made_with"]
    assert made == bumped
    # the new chunk records the versions it was made with; verify checks chunks and views
    reports = verify_cache(tmp_path / "cache")
    assert reports and all(r.ok for r in reports), [r.summary() for r in reports if not r.ok]
    made = {json.dumps(json.loads((p / "meta.json").read_text())["fields"]["made_with"], sort_keys=True)
            for p in (tmp_path / "cache").glob("*/images-*/*") if p.is_dir()}
    assert json.dumps(bumped, sort_keys=True) in made and len(made) == 2


def test_an_entry_written_by_45a9efd_is_read_without_re_embedding(tmp_path, monkeypatch, caplog):
    """The committed entry (planted_sharp on 6 PNGs, written by 45a9efd's extract from a folder
    that no longer exists) serves the same manifest from the images' new place: zero forwards,
    the stored values; a reorder of it also costs nothing; an added image costs one."""
    from robustbench_fm import encoders

    shutil.copytree(FIXTURE, tmp_path / "fx")
    root, cache = tmp_path / "fx" / "images", tmp_path / "fx" / "cache"
    manifest = pd.read_csv(tmp_path / "fx" / "manifest.csv")
    expected = np.load(tmp_path / "fx" / "expected.npy")
    recorded = json.loads(next(cache.glob("planted_sharp/*/meta.json")).read_text())["fields"]["image_root"]
    assert not Path(recorded).exists()  # the folder it was written from has moved
    monkeypatch.setattr(store, "made_with", lambda: {"package": "2.0.0", "libraries": {"torch": "3.0.0"}})
    enc = encoders.load("planted_sharp", device="cpu")
    # an entry made before extract.decode existed is an exact-decode entry: served to exact requests
    with caplog.at_level(logging.INFO, logger="robustbench_fm.features"):
        feats, got = _embed(cache, manifest, root, enc, decode="exact")
    assert feats.n_images_embedded == 0 and got.tobytes() == expected.astype(np.float32).tobytes()
    assert any("written by an earlier layout" in r.getMessage() for r in caplog.records)
    assert any("were embedded with" in r.getMessage() and "robustbench_fm 0.1.0 (now 2.0.0)" in r.getMessage()
               for r in caplog.records)
    rev = manifest.iloc[::-1].reset_index(drop=True)
    feats, got = _embed(cache, rev, root, enc, decode="exact")
    assert feats.n_images_embedded == 0 and got.tobytes() == expected[::-1].astype(np.float32).tobytes()
    Image.fromarray(np.full((24, 24), 7, np.uint8)).save(root / "new.png")
    more = pd.concat([manifest, pd.DataFrame({"sample_id": ["new"], "path": ["new.png"]})], ignore_index=True)
    feats, got = _embed(cache, more, root, enc, decode="exact")
    assert feats.n_images_embedded == 1 and got[:6].tobytes() == expected.astype(np.float32).tobytes()
    # a scaled request (the default): an exact vector serves it (and PNGs read the same pixels either way)
    feats, got = _embed(cache, more, root, enc)
    assert feats.n_images_embedded == 0 and got[:6].tobytes() == expected.astype(np.float32).tobytes()


def test_an_entry_from_another_folder_that_still_exists_is_not_adopted(tmp_path):
    """Same relative names in two existing folders may be different images: not the same entry."""
    from robustbench_fm import encoders

    shutil.copytree(FIXTURE, tmp_path / "fx")
    cache = tmp_path / "fx" / "cache"
    meta_path = next(cache.glob("planted_sharp/*/meta.json"))
    other = tmp_path / "other"
    _images(other, 6, seed=3)
    meta = json.loads(meta_path.read_text())
    meta["fields"]["image_root"] = str(other.resolve())
    # rewrite as the old code would have keyed it for that folder
    from robustbench_fm.features.key import cache_key

    key = cache_key(meta["fields"])
    meta["key"] = key
    target = meta_path.parent.parent / key
    meta_path.parent.rename(target)
    (target / "meta.json").write_text(json.dumps(meta))
    manifest = pd.read_csv(tmp_path / "fx" / "manifest.csv")
    feats, _ = _embed(cache, manifest, tmp_path / "fx" / "images", encoders.load("planted_sharp", device="cpu"))
    assert feats.n_images_embedded == 6


def test_a_read_only_store_serves_what_it_holds(tmp_path, encoder, monkeypatch):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
    import readonly_fs  # noqa: E402  (tests/fixtures is not a package)

    _images(tmp_path / "data", 4)
    m = _manifest(range(4))
    _, before = _embed(tmp_path / "cache", m, tmp_path / "data", encoder)
    readonly_fs.install(tmp_path / "cache", monkeypatch.setattr)
    feats, after = _embed(tmp_path / "cache", m.iloc[::-1].reset_index(drop=True), tmp_path / "data", encoder)
    assert feats.n_images_embedded == 0 and after.tobytes() == before[::-1].tobytes()


def test_skipped_images_are_named_per_manifest_row(tmp_path, encoder):
    _images(tmp_path / "data", 4)
    (tmp_path / "data" / "im2.png").write_bytes(b"not a png")
    m = pd.concat([_manifest(range(4)), _manifest([2], prefix="again")], ignore_index=True)
    feats, got = _embed(tmp_path / "cache", m, tmp_path / "data", encoder, on_bad_image="skip")
    assert feats.skipped == ["s2", "again2"] and skipped_ids(feats.path) == ["s2", "again2"]
    assert np.isnan(got[[2, 4]]).all() and np.isfinite(got[[0, 1, 3]]).all()
    assert feats.n_images_embedded == 3  # the unreadable file is read once, for both rows
    # on_bad_image=error reads a skipped image again: still bad, the run stops naming the file;
    # repaired, it is embedded and nothing is skipped any more
    from robustbench_fm.features import ImageReadError

    with pytest.raises(ImageReadError, match="im2.png"):
        _embed(tmp_path / "cache", m, tmp_path / "data", encoder)
    Image.fromarray(np.zeros((36, 36, 3), np.uint8)).save(tmp_path / "data" / "im2.png")
    feats, got = _embed(tmp_path / "cache", m, tmp_path / "data", encoder)
    assert feats.skipped == [] and np.isfinite(got).all() and feats.n_images_embedded == 1


def test_prepared_copies_are_found_by_their_source(tmp_path, encoder):
    """resolution=32: an image is known by its source and the prepared recipe, so a subset of a
    prepared manifest needs no stored copy (nothing decoded, zero forwards, the same bytes), and a
    manifest with one new image stores and embeds that one image only."""
    _images(tmp_path / "data", 6)
    m = _manifest(range(5))
    kw = dict(resolution=32, prepared_dir=tmp_path / "prepared")
    _, full = _embed(tmp_path / "cache", m, tmp_path / "data", encoder, **kw)
    stores = lambda: sorted((tmp_path / "prepared").glob("32px/*/meta.json"))  # noqa: E731
    assert len(stores()) == 1
    feats, part = _embed(tmp_path / "cache", m.iloc[[3, 1]].reset_index(drop=True), tmp_path / "data", encoder, **kw)
    assert feats.n_images_embedded == 0 and part.tobytes() == full[[3, 1]].tobytes() and len(stores()) == 1
    more = _manifest([4, 5, 0])
    feats, got = _embed(tmp_path / "cache", more, tmp_path / "data", encoder, **kw)
    assert feats.n_images_embedded == 1 and got[[0, 2]].tobytes() == full[[4, 0]].tobytes()
    (new,) = [p for p in stores() if json.loads(p.read_text())["n_images"] == 1]  # only im5 was decoded
    _, fresh = _embed(tmp_path / "fresh", more, tmp_path / "data", encoder, resolution=32,
                      prepared_dir=tmp_path / "prepared-fresh")
    assert got.tobytes() == fresh.tobytes()


def test_pixel_parts_of_a_manifest_of_0_rows_are_none():
    """Issue 41 item 5: a header-only manifest ended in "KeyError: 2 ... this is a bug" here."""
    empty = pd.DataFrame({"sample_id": pd.Series([], dtype=str), "path": pd.Series([], dtype=str)})
    assert store._pixel_part(empty) == []
    two = pd.DataFrame({"sample_id": ["a", "b"], "path": ["x.nii.gz#12", "y.png"]})
    assert store._pixel_part(two) == ["12", ""]


def test_an_array_is_made_once_under_the_stores_lock_and_replaced_atomically(tmp_path):
    """FeatureStore.array (SPAR's frozen tokens): two makers of the same array at once make it once
    (the second waits on the lock and reads it), nothing temporary is left, and a maker that fails
    leaves no array behind (the next call makes it)."""
    import threading
    import time

    from robustbench_fm.features.store import FeatureStore

    calls = []

    def make(alloc):
        calls.append(1)
        out = alloc((3, 4), np.float16)
        time.sleep(0.3)
        out[:] = np.arange(12, dtype=np.float16).reshape(3, 4)

    got = [None, None]
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, FeatureStore(tmp_path).array("tok", "k", make)))
               for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    want = np.arange(12, dtype=np.float16).reshape(3, 4)
    assert len(calls) == 1 and all(np.array_equal(g, want) for g in got)
    # an array entry (format "array", features/entry.py): its folder holds array.npy and meta.json
    [entry] = list((tmp_path / "tok").iterdir())
    assert sorted(p.name for p in entry.iterdir()) == ["array.npy", "meta.json"]

    def fail(alloc):
        alloc((2,), np.float32)
        raise RuntimeError("interrupted")
    with pytest.raises(RuntimeError):
        FeatureStore(tmp_path).array("tok", "other", fail)
    assert list((tmp_path / "tok").iterdir()) == [entry]
