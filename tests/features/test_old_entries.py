"""Every kind of feature entry main wrote at c1e1b9b and at cf22284 (tests/fixtures/store_c1e1b9b
and store_cf22284, each written by its make_fixture.py with that commit's code, from an image
folder that no longer exists) is served by today's code with 0 forward passes and the stored
values, byte for byte (issue 43, "Done when"): per-image store chunks and their views (cf22284
only; native and at a prepared resolution), a per-manifest entry (through the Embedder and through
the public ``features.extract``, both of which go through the feature store, which reads the
entry in place and writes nothing in its layout), slide embeddings (and their tiles' per-manifest
entry), and a SPAR frozen-token array. Both commits decoded every image at full size: their entries
serve ``extract.decode=exact`` requests (exact adds no recipe field) and never ``scaled`` ones
(issue 44). The 45a9efd entry: tests/features/test_store.py."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from store_cf22284 import make_fixture

from robustbench_fm.features import CACHE_FORMAT, extract, load_features
from robustbench_fm.features.embed import Embedder
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


@pytest.mark.parametrize("resolution", [None, 16])
def test_store_chunks_and_views_are_served_without_a_forward(tmp_path, resolution):
    root, mod, expected = _copy(tmp_path, "cf22284")
    calls: list = []
    manifest = pd.read_csv(root / "store.csv")
    feats = Embedder(root / "cache", device="cpu", batch_size=4, shard_size=2, resolution=resolution,
                     prepared_dir=root / "prepared", decode="exact").embed(manifest, root / "images",
                                                                           mod.tile_encoder(calls))
    got = load_features(feats.path, manifest)[1]
    assert calls == [] and feats.n_forward == 0 and feats.n_images_embedded == 0
    assert _same(got, expected["store" if resolution is None else "store_16px"])
    # a scaled request (the default) is another recipe: every image embedded again
    scaled = Embedder(root / "cache", device="cpu", batch_size=4, shard_size=2, resolution=resolution,
                      prepared_dir=root / "prepared").embed(manifest, root / "images", mod.tile_encoder(calls))
    assert scaled.n_images_embedded == manifest["path"].nunique() and calls


def test_a_per_manifest_entry_is_served_to_the_embedder_without_a_forward(fx):
    root, mod, expected = fx
    calls: list = []
    manifest = pd.read_csv(root / "manifest.csv")
    feats = Embedder(root / "cache", device="cpu", batch_size=4, shard_size=2, decode="exact").embed(
        manifest, root / "images", mod.tile_encoder(calls))
    assert calls == [] and feats.n_forward == 0 and feats.n_images_embedded == 0
    assert _same(load_features(feats.path, manifest)[1], expected["manifest"])


def test_a_per_manifest_entry_is_served_to_extract_without_a_forward(fx):
    """Before the store, ``extract`` keyed its entry by the image root: from the moved folder it
    embedded every row again (2 forwards of 4 images at c1e1b9b's fixture) into a new per-manifest
    entry."""
    root, mod, expected = fx
    before = _per_manifest_entries(root / "cache")
    calls: list = []
    manifest = pd.read_csv(root / "manifest.csv")
    feats = extract(mod.tile_encoder(calls), manifest, root / "images", root / "cache", batch_size=4, shard_size=2,
                    progress=False, decode="exact")
    assert calls == [] and feats.n_forward == 0 and feats.n_images_embedded == 0
    assert _same(feats.embeddings, expected["manifest"])
    assert _per_manifest_entries(root / "cache") == before  # read in place, nothing written in that layout


def test_slide_embeddings_are_served_without_a_forward(fx):
    root, mod, expected = fx
    tile_calls, slide_calls = [], []
    entry = extract_slides(mod.slide_encoder(slide_calls), pd.read_csv(root / "slides.csv"), root / "images",
                           root / "cache", tile_encoder=mod.tile_encoder(tile_calls), batch_size=4, shard_size=1,
                           progress=False, decode="exact")
    assert tile_calls == [] and slide_calls == []
    assert _same(load_features(entry)[1], expected["slides"])


def test_spar_tokens_are_served_without_a_forward(fx):
    root, mod, expected = fx
    net = mod.Tokens()
    got = cached_tokens(net, lambda r: pytest.fail("read the images again"), 5, mod.SPAR_KEY,
                        root / "cache" / "spar_tokens", 2, tiles=False)
    assert net.calls == 0 and _same(np.asarray(got), expected["spar_tokens"])
