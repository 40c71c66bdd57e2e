"""Every kind of feature entry main wrote at c1e1b9b (tests/fixtures/store_c1e1b9b, written by its
make_fixture.py with that commit's code, from an image folder that no longer exists) is served by
today's code with 0 forward passes and the stored values, byte for byte (issue 43, "Done when"): a
per-manifest entry (through the Embedder and through the public ``features.extract``, both of which
now go through the feature store), slide embeddings (and their tiles' per-manifest entry) and a SPAR
frozen-token array. c1e1b9b decoded every image at full size: its entries serve
``extract.decode=exact`` requests (issue 44)."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from store_cf22284 import make_fixture

from robustbench_fm.features import extract, load_features
from robustbench_fm.features.embed import Embedder
from robustbench_fm.features.slides import extract_slides
from robustbench_fm.methods.spar.run import cached_tokens

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "store_c1e1b9b"


@pytest.fixture
def fx(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "fx", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return tmp_path / "fx", make_fixture, np.load(FIXTURE / "expected.npz")


def _same(got, want) -> bool:
    return got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


def test_a_per_manifest_entry_is_served_to_the_embedder_without_a_forward(fx):
    root, mod, expected = fx
    calls: list = []
    manifest = pd.read_csv(root / "manifest.csv")
    feats = Embedder(root / "cache", device="cpu", batch_size=4, shard_size=2, decode="exact").embed(
        manifest, root / "images", mod.tile_encoder(calls))
    assert calls == [] and feats.n_forward == 0 and feats.n_images_embedded == 0
    assert _same(load_features(feats.path, manifest)[1], expected["manifest"])


def test_a_per_manifest_entry_is_served_to_extract_without_a_forward(fx):
    root, mod, expected = fx
    calls: list = []
    manifest = pd.read_csv(root / "manifest.csv")
    feats = extract(mod.tile_encoder(calls), manifest, root / "images", root / "cache", batch_size=4, shard_size=2,
                    progress=False, decode="exact")
    assert calls == [] and feats.n_forward == 0 and feats.n_images_embedded == 0
    assert _same(feats.embeddings, expected["manifest"])
    # the old entry is read where it is: nothing is written beside it in the per-manifest layout
    assert sorted(p.name for p in (root / "cache" / "tiny").iterdir() if (p / "meta.json").is_file()
                  and not p.name.startswith(("v-", "images-"))) == ["85f31c553eb3a130", "e49929e5c28a2127"]


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
