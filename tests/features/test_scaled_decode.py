"""Scaled JPEG decoding as a recipe (issue 44): ``decode="exact"`` reproduces the prepared store
of commit cf22284 (before scaled decoding existed) byte for byte and with its key; a scaled entry
is never served to an exact request (prepared store, per-image feature store, per-manifest key);
a panel decodes each encoder's images at the scale its own resize needs, so each entry equals the
single-encoder extraction's; and a real encoder's features agree between the two paths."""
from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from feature_fixtures import engine_extract as extract  # the engine filling a manifest-keyed entry
from feature_fixtures import engine_extract_panel as extract_panel
from feature_fixtures import shard_bytes, tiny_encoder
from PIL import Image

from robustbench_fm.data import prepared
from robustbench_fm.data.images import Need, need_of, read_image
from robustbench_fm.features.embed import Embedder
from robustbench_fm.features.key import cache_key_fields
from robustbench_fm.features.options import ExtractOptions

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "prepared_cf22284"


def _images(table_file: Path) -> list[bytes]:
    return pq.read_table(table_file, columns=["image"]).column("image").to_pylist()


def test_exact_reproduces_the_prepared_store_of_cf22284_byte_for_byte(tmp_path):
    """The fixture's store was written by commit cf22284's ``prepare`` (64 px, a grey and an RGB
    JPEG, a cropped source); ``decode="exact"`` stores the same PNG bytes under the same key
    fields (so an existing store is found), ``"scaled"`` other bytes under another key."""
    shutil.copytree(FIXTURE / "src", tmp_path / "src")
    manifest = pd.read_csv(FIXTURE / "manifest.csv")
    (old,) = (FIXTURE / "store" / "64px").iterdir()
    import json

    old_fields = json.loads((old / "meta.json").read_text())["fields"]
    exact = prepared.prepare(manifest, tmp_path / "src", tmp_path / "store", 64, progress=False, decode="exact")
    fields = {**old_fields, "image_root": str((tmp_path / "src").resolve())}
    assert prepared.PreparedStore(tmp_path / "store", fields).key == exact.key
    assert _images(exact.root / "shard-00000.parquet") == _images(old / "shard-00000.parquet")
    scaled = prepared.prepare(manifest, tmp_path / "src", tmp_path / "store", 64, progress=False)  # the default
    assert scaled.key != exact.key and scaled.n_decoded == 3
    got, want = _images(scaled.root / "shard-00000.parquet"), _images(old / "shard-00000.parquet")
    assert all(a != b for a, b in zip(got, want))  # every source is a JPEG large enough to scale
    for a, b in zip(scaled.manifest.to_dict("records"), exact.manifest.to_dict("records")):
        x = np.asarray(read_image(scaled.root, a), dtype=int)
        y = np.asarray(read_image(exact.root, b), dtype=int)
        assert np.abs(x - y).max() <= 3 and np.abs(x - y).mean() < 0.6


def test_a_scaled_entry_is_never_served_to_an_exact_request(tmp_path):
    shutil.copytree(FIXTURE / "src", tmp_path / "src")
    manifest = pd.read_csv(FIXTURE / "manifest.csv")
    ids = [f"id-{i}" for i in range(len(manifest))]
    scaled = prepared.prepare(manifest, tmp_path / "src", tmp_path / "store", 64, progress=False, identities=ids,
                              decode="scaled")
    assert scaled.n_decoded == 3 and len(prepared.held_images(tmp_path / "store", 64, "scaled")) == 3
    assert prepared.held_images(tmp_path / "store", 64, "exact") == {}
    exact = prepared.prepare(manifest, tmp_path / "src", tmp_path / "store", 64, progress=False, identities=ids,
                             decode="exact")
    assert exact.n_decoded == 3 and exact.key != scaled.key  # decoded again, not read from the scaled entry
    assert prepared.recipe(64, "exact") != prepared.recipe(64, "scaled")
    assert "decode" not in prepared.recipe(64, "exact")  # the recipe of stores made before the field
    enc = tiny_encoder(input_size=40)
    assert cache_key_fields(enc, manifest, tmp_path, "scaled") != cache_key_fields(enc, manifest, tmp_path, "exact")


def _films(root: Path, n: int = 6) -> pd.DataFrame:
    rng = np.random.default_rng(5)
    (root / "img").mkdir(parents=True)
    rows = []
    for i in range(n):
        w, h = (640, 512) if i % 2 else (800, 1000)
        low = Image.fromarray(rng.integers(0, 256, (h // 64, w // 64), dtype=np.uint8))
        low.resize((w, h), Image.BICUBIC).save(root / "img" / f"{i}.jpg", quality=90)
        rows.append({"sample_id": f"s{i}", "path": f"img/{i}.jpg"})
    return pd.DataFrame(rows)


def test_the_embedder_keys_the_decode_and_exact_reads_full_size(tmp_path):
    """The per-image feature store: an exact run after a scaled one embeds every image again;
    each path's features are the encoder's transform of the image read at that path's scale."""
    m = _films(tmp_path / "d")
    enc = tiny_encoder(input_size=48, resize="squash")
    a = Embedder(tmp_path / "cache", ExtractOptions(device="cpu", batch_size=4)).embed(m, tmp_path / "d", enc)
    b = Embedder(tmp_path / "cache", ExtractOptions(device="cpu", batch_size=4, decode="exact")).embed(
        m, tmp_path / "d", enc)
    assert a.n_images_embedded == b.n_images_embedded == len(m)
    assert a.fields["recipe"]["decode"] == "scaled" and "decode" not in b.fields["recipe"]
    again = Embedder(tmp_path / "cache", ExtractOptions(device="cpu", batch_size=4, decode="exact")).embed(
        m, tmp_path / "d", enc)
    assert again.n_images_embedded == 0
    from robustbench_fm.features.load import load_features

    (_, fa), (_, fb) = load_features(a.path, m), load_features(b.path, m)
    need = need_of("squash", 48)
    for i, row in enumerate(m.to_dict("records")):
        with Image.open(tmp_path / "d" / row["path"]) as im:
            assert read_image(tmp_path / "d", row, need).size[0] in (im.size[0] // 8, im.size[0] // 4)
        want_a = enc.embed(enc.transform(read_image(tmp_path / "d", row, need))[None]).numpy()[0]
        want_b = enc.embed(enc.transform(read_image(tmp_path / "d", row))[None]).numpy()[0]
        np.testing.assert_allclose(fa[i], want_a, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(fb[i], want_b, rtol=1e-5, atol=1e-6)
    assert not np.allclose(fa, fb, rtol=1e-6, atol=1e-7)


def test_a_panel_decodes_each_encoder_at_its_own_scale(tmp_path, monkeypatch):
    """Two encoders with different needs in one panel call: each entry is byte-identical to its
    single-encoder extraction (the scale does not depend on the panel), the larger one's images
    were never decoded below its target, and encoders whose needs agree on an image's scale share
    one decode of it."""
    m = _films(tmp_path / "d")
    small = tiny_encoder(weights_id="s", name="small", input_size=48, resize="squash")
    large = tiny_encoder(weights_id="l", name="large", input_size=300, resize_size=320)
    sizes = []
    real = read_image

    def reader(root, row, need=None):  # records what each pass decoded
        im = real(root, row, need)
        sizes.append((need, min(im.size)))
        return im

    extract_mod = importlib.import_module("robustbench_fm.features.engine.rows")  # the module, not the function

    monkeypatch.setattr(extract_mod, "default_reader", reader)
    panel = extract_panel([small, large], m, tmp_path / "d", tmp_path / "p", batch_size=4, progress=False)
    monkeypatch.undo()
    assert {n for n, _ in sizes} == {Need(short=48), Need(short=320)}
    assert all(side >= n.short for n, side in sizes)
    assert any(side < 500 for n, side in sizes if n == Need(short=48))  # the small one's decode was scaled
    # encoders whose needs give an image the same scale share one read of it
    sizes.clear()
    mid = tiny_encoder(weights_id="m", name="mid", input_size=40, resize="squash")
    monkeypatch.setattr(extract_mod, "default_reader", reader)
    extract_panel([small, mid], m, tmp_path / "d", tmp_path / "p2", batch_size=4, progress=False)
    monkeypatch.undo()
    assert len(sizes) == len(m)  # 48 and 40 px: 1/4 of these films for both, one decode each
    for enc, got in zip([small, large], panel):
        alone = extract(enc, m, tmp_path / "d", tmp_path / f"alone-{enc.spec.name}", batch_size=4, progress=False)
        assert alone.key == got.key and got.fields["decode"] == "scaled"
        assert shard_bytes(alone.path) == shard_bytes(got.path)


@pytest.mark.parametrize("decode", ["scaled", "exact"])
def test_a_custom_reader_is_called_as_given(tmp_path, decode):
    m = _films(tmp_path / "d", n=2)
    seen = []

    def reader(root, row):
        seen.append(row["path"])
        return Image.open(Path(root) / row["path"]).convert("RGB")

    extract(tiny_encoder(), m, tmp_path / "d", tmp_path / "c", batch_size=2, progress=False, reader=reader,
            decode=decode)
    assert seen == ["img/0.jpg", "img/1.jpg"]


def test_a_per_manifest_entry_is_adopted_only_by_a_request_of_its_decode(tmp_path):
    """An entry of the per-manifest layout written with scaled decoding (``extract`` without
    ``entry=``) is read by the store for a scaled request and never for an exact one (the legacy
    key's match compares the decode field both ways: an exact key has none to compare)."""
    m = _films(tmp_path / "d", n=3)
    enc = tiny_encoder(input_size=48, resize="squash")
    old = extract(enc, m, tmp_path / "d", tmp_path / "cache", batch_size=4, progress=False)
    assert old.fields["decode"] == "scaled"
    exact = Embedder(tmp_path / "cache", ExtractOptions(device="cpu", batch_size=4, decode="exact")).embed(
        m, tmp_path / "d", enc)
    assert exact.n_images_embedded == len(m)
    scaled = Embedder(tmp_path / "cache", ExtractOptions(device="cpu", batch_size=4)).embed(m, tmp_path / "d", enc)
    assert scaled.n_images_embedded == 0
