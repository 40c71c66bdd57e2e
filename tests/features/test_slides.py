"""Slide-level features (robustbench_fm.features.slides): tile embeddings from the tile encoder's
cache entry aggregated per slide into a cache entry of their own, equal to the aggregator called
directly, resumable by shard, and usable by the croma stage like any feature entry."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from feature_fixtures import shard_bytes, tiny_encoder
from PIL import Image
from store_cf22284.make_fixture import slide_encoder  # a seeded linear aggregator (mean-pooled)

from robustbench_fm.api import evaluate
from robustbench_fm.features import load_features
from robustbench_fm.features.embed import Embedder
from robustbench_fm.features.options import ExtractOptions
from robustbench_fm.features.slides import extract_slides, slide_tiles


@pytest.fixture(scope="module")
def slides(tmp_path_factory):
    root = tmp_path_factory.mktemp("slides")
    rng = np.random.default_rng(0)
    rows = []
    for lab in ("benign", "cancer"):
        for site in ("karolinska", "radboud"):
            for s in range(4):
                slide = f"{site[:3]}_{lab}_{s}"
                rows.append((slide, lab, site))
                (root / "tiles" / slide).mkdir(parents=True)
                for t in range(2 + s):
                    tint = np.array([80 * (lab == "cancer"), 50 * (site == "radboud"), 10 * t])
                    arr = np.clip(rng.normal(100, 40, (20, 20, 3)) + tint, 0, 255).astype(np.uint8)
                    Image.fromarray(arr).save(root / "tiles" / slide / f"{224 * t}_{448 * (t % 2)}.png")
    manifest = pd.DataFrame(rows, columns=["sample_id", "bio_label", "site"])
    manifest["slide_id"] = manifest["sample_id"]
    manifest["path"] = "train_images/" + manifest["sample_id"] + ".tiff"
    return root, manifest


def test_slide_embeddings_equal_the_aggregator_on_cached_tiles(slides, tmp_path):
    root, manifest = slides
    calls = []
    slide_enc, tile_enc = slide_encoder(calls), tiny_encoder()
    entry = extract_slides(slide_enc, manifest, root, tmp_path, tile_encoder=tile_enc, shard_size=5, progress=False)
    assert entry.parent.name == "tiny_slide"
    ids, emb = load_features(entry)
    assert ids.tolist() == manifest["sample_id"].tolist() and emb.shape == (16, 4)
    tiles = slide_tiles(manifest, root)
    assert len(tiles) == 4 * sum(range(2, 6)) and tiles["x"].max() == 224 * 4
    direct_tiles = Embedder(tmp_path, ExtractOptions(device="cpu")).embed(tiles[["sample_id", "path"]], root, tile_enc)
    assert direct_tiles.n_forward == 0  # the tiles extract_slides had the store embed are reused
    tile_emb = load_features(direct_tiles.path, tiles)[1]
    for i, slide in enumerate(manifest["sample_id"]):
        rows = (tiles["slide"] == slide).to_numpy()
        want = slide_enc.embed_slide(torch.from_numpy(tile_emb[rows]),
                                     torch.tensor(tiles.loc[rows, ["x", "y"]].to_numpy()))
        np.testing.assert_allclose(emb[i], want.numpy(), rtol=1e-6, atol=1e-7)
    # warm re-run: nothing aggregated; a lost shard is recomputed to the same bytes
    before, n_calls = shard_bytes(entry), len(calls)
    assert extract_slides(slide_enc, manifest, root, tmp_path, tile_encoder=tile_enc, progress=False) == entry
    assert len(calls) == n_calls
    (entry / "shard-00001.parquet").unlink()
    extract_slides(slide_enc, manifest, root, tmp_path, tile_encoder=tile_enc, progress=False)
    assert len(calls) == n_calls + 5 and shard_bytes(entry) == before

    # the croma stage on the entry = on the slide embeddings computed directly
    direct = np.stack([slide_enc.embed_slide(
                           torch.from_numpy(tile_emb[(tiles["slide"] == s).to_numpy()]),
                           torch.tensor(tiles.loc[tiles["slide"] == s, ["x", "y"]].to_numpy()))
                       .numpy() for s in manifest["sample_id"]])
    params = dict(exclude_col="slide_id", m=2, k_grid=[1, 3, 5], device="cpu")
    from_entry = evaluate("croma", entry, manifest, **params).summary
    from_direct = evaluate("croma", direct, manifest, **params).summary
    pd.testing.assert_frame_equal(from_entry, from_direct, check_exact=False, rtol=1e-5)
    assert from_entry["n"].iloc[0] == 16


def test_slide_extraction_refuses_a_wrong_tile_encoder_and_missing_tiles(slides, tmp_path):
    root, manifest = slides
    with pytest.raises(ValueError, match="aggregates 'tiny' tiles, not 'other'"):
        extract_slides(slide_encoder([]), manifest, root, tmp_path, tile_encoder=tiny_encoder(name="other"))
    with pytest.raises(FileNotFoundError, match="no tiles"):
        extract_slides(slide_encoder([]), manifest.assign(sample_id="ghost"), root, tmp_path,
                       tile_encoder=tiny_encoder())
