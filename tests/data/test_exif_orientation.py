"""Issue 54 item 5: an image's EXIF Orientation is applied by every reader (``read_image`` for files
and parquet rows, ``read_mask``) and by the prepared-image store, whose entries written before are
made upright in place (only the shards holding a turned image are decoded again)."""
from __future__ import annotations

import io
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image, ImageOps

from robustbench_fm.data import images, prepared
from robustbench_fm.data.images import Need, read_image, read_mask

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "prepared_cf22284"
#: Pillow's transposition per orientation (ImageOps.exif_transpose's table, TIFF 6.0 tag 274)
CLOCKWISE_90 = 6


def _exif(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def _pattern(h: int = 48, w: int = 80, rgb: bool = True) -> np.ndarray:
    """An image no flip or turn maps onto itself (a gradient plus a block in one corner)."""
    y, x = np.mgrid[0:h, 0:w]
    a = ((x * 3 + y * 5) % 256).astype(np.uint8)
    a[:8, :12] = 255
    return np.stack([a, 255 - a, a // 2], axis=-1) if rgb else a


def _jpeg(path: Path, arr: np.ndarray, orientation: int | None) -> Path:
    kw = {} if orientation is None else {"exif": _exif(orientation)}
    Image.fromarray(arr).save(path, quality=95, **kw)
    return path


def _as_stored(path: Path) -> np.ndarray:
    """The pixels as the file stores them (Pillow's decode, no orientation applied)."""
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def test_a_jpeg_with_orientation_6_is_read_turned_clockwise(tmp_path):
    """The issue's case: Orientation=6 (the camera was turned; viewers turn the picture 90 deg
    clockwise). Exactly the stored pixels, turned: closed form np.rot90(k=-1)."""
    path = _jpeg(tmp_path / "a.jpg", _pattern(), CLOCKWISE_90)
    got = np.asarray(read_image(tmp_path, {"path": "a.jpg"}))
    assert got.shape == (80, 48, 3)
    assert np.array_equal(got, np.rot90(_as_stored(path), k=-1))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_orientation_matches_pillows_exif_transpose(tmp_path, orientation):
    path = _jpeg(tmp_path / "a.jpg", _pattern(), orientation)
    with Image.open(path) as im:
        want = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    assert np.array_equal(np.asarray(read_image(tmp_path, {"path": "a.jpg"})), want)


def test_the_edge_table_is_pillows(tmp_path):
    """``ORIENTED_EDGES`` (which stored edge each upright edge is) measured on Pillow's own
    transposition of an image whose four margins differ."""
    h, w, stored = 30, 40, (1, 2, 3, 4)  # left, top, right, bottom
    a = np.zeros((h, w), np.uint8)
    a[2:h - 4, 1:w - 3] = 255
    for o in range(2, 9):
        im = Image.fromarray(a)
        im.info["exif"] = _exif(o)
        d = np.asarray(ImageOps.exif_transpose(im))
        ys, xs = np.nonzero(d)
        upright = (xs.min(), ys.min(), d.shape[1] - 1 - xs.max(), d.shape[0] - 1 - ys.max())
        assert tuple(stored[e] for e in images.ORIENTED_EDGES[o]) == upright, o
        assert images.stored_margins(upright, o) == stored, o


@pytest.mark.parametrize("orientation", [3, 5, 6, 8])
@pytest.mark.parametrize("need", [None, Need(short=40)])
def test_crop_columns_are_margins_of_the_upright_image_at_every_decode_scale(tmp_path, orientation, need):
    """The crop columns are pixels of the image as it is shown (upright). Exact decode: the
    upright image cut by them. Scaled decode of a 1,000 x 602 JPEG (602 leaves a partial last
    block at 1/4, which the crop removes): the same pixels as the same file without EXIF read at
    the same scale with the margins seen in the stored orientation, then turned."""
    arr = _pattern(602, 1000)
    oriented = _jpeg(tmp_path / "o.jpg", arr, orientation)
    _jpeg(tmp_path / "p.jpg", arr, None)
    stored = (8, 16, 24, 34)  # on the 1/4 grid: 1000 - 24 and 602 - 34 are multiples of 4
    upright_margins = tuple(stored[e] for e in images.ORIENTED_EDGES[orientation])
    got = np.asarray(read_image(tmp_path, {"path": "o.jpg", **dict(zip(images.CROP_COLUMNS, upright_margins))},
                                need))
    ref = read_image(tmp_path, {"path": "p.jpg", **dict(zip(images.CROP_COLUMNS, stored))}, need)
    with Image.open(oriented) as im:
        ref.info["exif"] = im.info["exif"]
        up = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    assert np.array_equal(got, np.asarray(ImageOps.exif_transpose(ref)))
    if need is None:
        left, top, right, bottom = upright_margins
        assert np.array_equal(got, up[top:up.shape[0] - bottom, left:up.shape[1] - right])
    else:
        assert images.draft_scale((1000, 602), need, stored) == 4  # the scaled path, with a partial block
        assert got.shape[:2] == ((552 // 4, 968 // 4) if orientation < 5 else (968 // 4, 552 // 4))


def test_a_png_and_a_parquet_row_and_a_mask_are_turned(tmp_path):
    arr = _pattern(rgb=False)
    Image.fromarray(arr).save(tmp_path / "a.png", exif=_exif(CLOCKWISE_90))
    assert np.array_equal(np.asarray(read_image(tmp_path, {"path": "a.png"})), np.rot90(arr, k=-1))
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG", exif=_exif(8))
    pq.write_table(pa.table({"image": [buf.getvalue()]}), tmp_path / "t.parquet")
    assert np.array_equal(np.asarray(read_image(tmp_path, {"path": "t.parquet#0"})), np.rot90(arr, k=1))
    mask = np.zeros((20, 30), np.uint8)
    mask[:5, :3] = 255
    Image.fromarray(mask).save(tmp_path / "m.png", exif=_exif(CLOCKWISE_90))
    assert np.array_equal(read_mask(tmp_path / "m.png"), np.rot90(mask, k=-1) != 0)


def test_an_image_without_orientation_is_the_same_object_unchanged(tmp_path):
    """No orientation (or 1): the pixels of every release before, and no copy."""
    arr = _pattern()
    path = _jpeg(tmp_path / "a.jpg", arr, 1)
    assert np.array_equal(np.asarray(read_image(tmp_path, {"path": "a.jpg"})), _as_stored(path))
    im = Image.fromarray(arr)
    assert images.upright(im) is im


def _stored(result: prepared.Prepared, i: int) -> np.ndarray:
    return np.asarray(read_image(result.root, result.manifest.to_dict("records")[i]))


def test_the_prepared_store_holds_the_upright_image(tmp_path):
    arr = _pattern()
    _jpeg(tmp_path / "a.jpg", arr, CLOCKWISE_90)
    manifest = pd.DataFrame({"sample_id": ["a"], "path": ["a.jpg"]})
    out = prepared.prepare(manifest, tmp_path, tmp_path / "store", 32, progress=False, decode="exact")
    with Image.open(tmp_path / "a.jpg") as im:
        want = np.asarray(prepared.prepare_image(ImageOps.exif_transpose(im).convert("RGB"), 32))
    assert np.array_equal(_stored(out, 0), want)
    assert json.loads((out.root / "meta.json").read_text())["upright"] is True


def test_an_entry_written_before_is_made_upright_decoding_only_the_shards_of_turned_images(tmp_path, monkeypatch,
                                                                                           caplog):
    """An entry of the earlier release (its reader ignored EXIF, its meta.json has no "upright"):
    the one shard of two holding the turned image is decoded again, the other kept byte for byte;
    the key (and so every prepared image's feature identity) is unchanged; the next call decodes
    nothing."""
    arr = _pattern()
    for i in range(4):
        _jpeg(tmp_path / f"{i}.jpg", np.roll(arr, 7 * i, axis=1), CLOCKWISE_90 if i == 3 else None)
    manifest = pd.DataFrame({"sample_id": list("abcd"), "path": [f"{i}.jpg" for i in range(4)]})
    with monkeypatch.context() as m:  # the earlier release: no orientation applied
        m.setattr(images, "exif_orientation", lambda im: 1)
        old = prepared.prepare(manifest, tmp_path, tmp_path / "store", 32, shard_size=2, progress=False)
    meta = json.loads((old.root / "meta.json").read_text())
    meta.pop("upright")
    (old.root / "meta.json").write_text(json.dumps(meta))
    kept = (old.root / "shard-00000.parquet").read_bytes()
    stale = _stored(old, 3)
    with caplog.at_level(logging.WARNING, logger="robustbench_fm.data"):
        new = prepared.prepare(manifest, tmp_path, tmp_path / "store", 32, shard_size=2, progress=False)
    assert new.key == old.key and new.n_decoded == 2  # shard 1 (images 2 and 3)
    assert (new.root / "shard-00000.parquet").read_bytes() == kept
    want = read_image(tmp_path, {"path": "3.jpg"}, images.need_of("squash", 32))
    assert np.array_equal(_stored(new, 3), np.asarray(prepared.prepare_image(want, 32)))
    assert not np.array_equal(_stored(new, 3), stale)
    assert [r.getMessage() for r in caplog.records if "EXIF" in r.getMessage()] == [
        f"{new.root}: 1 of 4 images have an EXIF orientation and were stored unturned by an earlier release; "
        "stored them upright (2 images of 1 shards read again)"]
    assert json.loads((new.root / "meta.json").read_text())["upright"] is True
    again = prepared.prepare(manifest, tmp_path, tmp_path / "store", 32, shard_size=2, progress=False)
    assert again.n_decoded == 0


def test_the_store_of_cf22284_is_kept_whole_and_marked_upright(tmp_path):
    """A real entry written by an earlier release (no EXIF in its sources): nothing is decoded
    again, its shard stays byte for byte, and it is marked so it is not checked again."""
    shutil.copytree(FIXTURE / "src", tmp_path / "src")
    manifest = pd.read_csv(FIXTURE / "manifest.csv")
    (old,) = (FIXTURE / "store" / "64px").iterdir()
    fields = {**json.loads((old / "meta.json").read_text())["fields"], "image_root": str((tmp_path / "src").resolve())}
    entry = prepared.PreparedStore(tmp_path / "store", fields)
    entry.path.mkdir(parents=True)
    shutil.copy(old / "shard-00000.parquet", entry.path)
    meta = json.loads((old / "meta.json").read_text())
    (entry.path / "meta.json").write_text(json.dumps({**meta, "key": entry.key, "fields": fields}))
    assert "upright" not in meta
    out = prepared.prepare(manifest, tmp_path / "src", tmp_path / "store", 64, progress=False, decode="exact")
    assert out.key == entry.key and out.n_decoded == 0
    assert (entry.path / "shard-00000.parquet").read_bytes() == (old / "shard-00000.parquet").read_bytes()
    assert json.loads((entry.path / "meta.json").read_text())["upright"] is True
