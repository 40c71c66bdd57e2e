"""Every kind of feature entry main wrote at c1e1b9b and at cf22284 (tests/fixtures/store_c1e1b9b
and store_cf22284, each written by its make_fixture.py with that commit's code, from an image
folder that no longer exists) is served by today's code with 0 forward passes and the stored
values, byte for byte (issue 43, "Done when"): per-image store chunks and their views (cf22284
only; native and at a prepared resolution), a per-manifest entry (through the Embedder and through
the public ``features.extract``, both of which go through the feature store, which reads the
entry in place and writes nothing in its layout), slide embeddings (and their tiles' per-manifest
entry), and a SPAR frozen-token array. Both commits decoded every image at full size: their entries
serve ``extract.decode=exact`` requests (exact adds no recipe field) and, since an exact vector
serves a scaled request (exact is the reference; issue 54 item 1), the default ``scaled`` ones too.
The ae38a5a entries (tests/fixtures/store_ae38a5a: scaled decoding the default, ``"decode":
"scaled"`` in every recipe it filed, PNGs included) serve both modes wherever the pixels are the
same. The 45a9efd entry: tests/features/test_store.py."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from store_ae38a5a import make_fixture as fixture_ae38a5a
from store_cf22284 import make_fixture

from robustbench_fm.features import CACHE_FORMAT, extract, load_features
from robustbench_fm.features.embed import Embedder
from robustbench_fm.features.options import ExtractOptions
from robustbench_fm.features.slides import extract_slides
from robustbench_fm.methods.spar.run import cached_tokens

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
COMMITS = ["c1e1b9b", "cf22284"]


def _copy(tmp_path, commit: str):
    folder = FIXTURES / f"store_{commit}"
    shutil.copytree(folder, tmp_path / "fx", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return tmp_path / "fx", make_fixture, np.load(folder / "expected.npz")


@pytest.fixture(params=COMMITS)
def fx(request, tmp_path):
    return _copy(tmp_path, request.param)


def _same(got, want) -> bool:
    return got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


def _per_manifest_entries(cache: Path) -> set[str]:
    return {m.parent.name for m in cache.glob("*/*/meta.json")
            if json.loads(m.read_text()).get("format") == CACHE_FORMAT
            and "manifest_hash" in json.loads(m.read_text()).get("fields", {})}


DECODES = ["scaled", "exact"]  # the default first: on ae38a5a a scaled request embedded every image again


@pytest.mark.parametrize("decode", DECODES)
@pytest.mark.parametrize("resolution", [None, 16])
def test_store_chunks_and_views_are_served_without_a_forward(tmp_path, resolution, decode):
    root, mod, expected = _copy(tmp_path, "cf22284")
    calls: list = []
    manifest = pd.read_csv(root / "store.csv")
    feats = Embedder(root / "cache", ExtractOptions(device="cpu", batch_size=4, shard_size=2, decode=decode),
                     resolution=resolution, prepared_dir=root / "prepared").embed(manifest, root / "images",
                                                                                  mod.tile_encoder(calls))
    got = load_features(feats.path, manifest)[1]
    assert calls == [] and feats.n_forward == 0 and feats.n_images_embedded == 0
    assert _same(got, expected["store" if resolution is None else "store_16px"])
    # PNGs read the same pixels either way: the view is the one cf22284 wrote
    assert (root / "cache" / "tiny" / feats.path.name / "view.parquet").is_file()


@pytest.mark.parametrize("decode", DECODES)
def test_a_per_manifest_entry_is_served_to_the_embedder_without_a_forward(fx, decode):
    root, mod, expected = fx
    calls: list = []
    manifest = pd.read_csv(root / "manifest.csv")
    feats = Embedder(root / "cache", ExtractOptions(device="cpu", batch_size=4, shard_size=2, decode=decode)).embed(
        manifest, root / "images", mod.tile_encoder(calls))
    assert calls == [] and feats.n_forward == 0 and feats.n_images_embedded == 0
    assert _same(load_features(feats.path, manifest)[1], expected["manifest"])


@pytest.mark.parametrize("decode", DECODES)
def test_a_per_manifest_entry_is_served_to_extract_without_a_forward(fx, decode):
    """Before the store, ``extract`` keyed its entry by the image root: from the moved folder it
    embedded every row again (2 forwards of 4 images at c1e1b9b's fixture) into a new per-manifest
    entry."""
    root, mod, expected = fx
    before = _per_manifest_entries(root / "cache")
    calls: list = []
    manifest = pd.read_csv(root / "manifest.csv")
    feats = extract(mod.tile_encoder(calls), manifest, root / "images", root / "cache", batch_size=4, shard_size=2,
                    progress=False, decode=decode)
    assert calls == [] and feats.n_forward == 0 and feats.n_images_embedded == 0
    assert _same(feats.embeddings, expected["manifest"])
    assert _per_manifest_entries(root / "cache") == before  # read in place, nothing written in that layout


@pytest.mark.parametrize("decode", DECODES)
def test_slide_embeddings_are_served_without_a_forward(fx, decode):
    root, mod, expected = fx
    tile_calls, slide_calls = [], []
    entry = extract_slides(mod.slide_encoder(slide_calls), pd.read_csv(root / "slides.csv"), root / "images",
                           root / "cache", tile_encoder=mod.tile_encoder(tile_calls), batch_size=4, shard_size=1,
                           progress=False, decode=decode)
    assert tile_calls == [] and slide_calls == []
    assert _same(load_features(entry)[1], expected["slides"])


def test_spar_tokens_are_served_without_a_forward(fx):
    root, mod, expected = fx
    net = mod.Tokens()
    got = cached_tokens(net, lambda r: pytest.fail("read the images again"), 5, mod.SPAR_KEY,
                        root / "cache" / "spar_tokens", 2, tiles=False)
    assert net.calls == 0 and _same(np.asarray(got), expected["spar_tokens"])


# ------------------------------------------------------------- ae38a5a: scaled decoding the default

def _ae38a5a(tmp_path):
    folder = FIXTURES / "store_ae38a5a"
    shutil.copytree(folder, tmp_path / "fx", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    root = tmp_path / "fx"
    return root, pd.read_csv(root / "store.csv"), np.load(folder / "expected.npz")


def _embed(root, cache: str, decode: str, resolution, calls: list):
    manifest = pd.read_csv(root / "store.csv")
    feats = Embedder(root / cache, ExtractOptions(device="cpu", batch_size=4, shard_size=2, decode=decode),
                     resolution=resolution, prepared_dir=root / "prepared").embed(manifest, root / "images",
                                                                                  fixture_ae38a5a.tile_encoder(calls))
    return feats, load_features(feats.path, manifest)[1]


def _tag(resolution) -> str:
    return "native" if resolution is None else "16px"


@pytest.mark.parametrize("resolution", [None, 16])
@pytest.mark.parametrize("decode", DECODES)
def test_an_exact_entry_serves_both_modes_png_and_jpeg(tmp_path, resolution, decode):
    """ae38a5a's ``extract.decode=exact`` entries (the recipe of every release before scaled
    decoding) serve a scaled request too, JPEGs included: exact is the reference. On ae38a5a the
    default request embedded all 6 images again."""
    root, manifest, expected = _ae38a5a(tmp_path)
    calls: list = []
    feats, got = _embed(root, "cache_exact", decode, resolution, calls)
    assert calls == [] and feats.n_forward == 0 and feats.n_images_embedded == 0
    assert _same(got, expected[f"exact_{_tag(resolution)}"])


@pytest.mark.parametrize("resolution", [None, 16])
def test_a_scaled_entry_serves_exact_requests_where_the_pixels_are_the_same(tmp_path, resolution):
    """ae38a5a's default entries filed every image under the scaled recipe. A scaled request reads
    them all; an exact request reads the PNGs and the JPEG too small to scale from them (the same
    pixels) and embeds only the three JPEGs scaling changed, whose vectors are then exact."""
    root, manifest, expected = _ae38a5a(tmp_path)
    tag, calls = _tag(resolution), []
    feats, got = _embed(root, "cache_scaled", "scaled", resolution, calls)
    assert calls == [] and feats.n_forward == 0 and _same(got, expected[f"scaled_{tag}"])
    feats, got = _embed(root, "cache_scaled", "exact", resolution, calls)
    scaled = manifest["path"].isin(fixture_ae38a5a.SCALED).to_numpy()
    assert feats.n_images_embedded == scaled.sum() == 3 and calls
    assert _same(got[~scaled], expected[f"scaled_{tag}"][~scaled])
    np.testing.assert_allclose(got[scaled], expected[f"exact_{tag}"][scaled], rtol=1e-5, atol=1e-6)
    assert not np.allclose(got[scaled], expected[f"scaled_{tag}"][scaled], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("resolution", [None, 16])
def test_a_scaled_run_files_unscaled_images_under_the_exact_recipe(tmp_path, resolution):
    """A scaled run on an empty cache keys the decode mode only where it changes pixels: an exact
    run after it embeds only the three JPEGs scaling changed, and a scaled run after both none."""
    root, manifest, expected = _ae38a5a(tmp_path)
    calls: list = []
    first, got = _embed(root, "fresh", "scaled", resolution, calls)
    assert first.n_images_embedded == 6
    np.testing.assert_allclose(got, expected[f"scaled_{_tag(resolution)}"], rtol=1e-5, atol=1e-6)
    exact, _ = _embed(root, "fresh", "exact", resolution, calls)
    assert exact.n_images_embedded == 3
    again, _ = _embed(root, "fresh", "scaled", resolution, calls)
    assert again.n_images_embedded == 0 and again.path == first.path
