"""Sharded extraction: parts cover every row exactly once, fill
one content-keyed entry concurrently without corrupting it, and an incomplete entry is refused
with the missing shards named."""
from __future__ import annotations

import json
import multiprocessing as mp
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

# the engine filling a manifest-keyed entry: these tests are about the engine and the entry format
from feature_fixtures import engine_extract as extract
from feature_fixtures import shard_bytes, tiny_encoder, write_images
from PIL import Image

from robustbench_fm.features import FeatureCache, load_features, verify_entry
from robustbench_fm.features.cache import FeatureCacheError

pytestmark = pytest.mark.slow  # command-line subprocesses: the full suite runs them


@pytest.mark.parametrize("n_rows, shard_size", [(1, 1), (40, 8), (1000, 7), (1024, 1024)])
@pytest.mark.parametrize("num_parts", [1, 2, 3, 5, 16])
def test_parts_cover_every_row_exactly_once(n_rows, shard_size, num_parts):
    cache = FeatureCache("/nonexistent", {"encoder": "x", "embed_dim": 4}, shard_size=shard_size, n_rows=n_rows)
    rows = [r for part in range(num_parts) for s in cache.part_shards(num_parts, part)
            for r in range(*cache.shard_bounds(s))]
    assert sorted(rows) == list(range(n_rows))
    sizes = [len(cache.part_shards(num_parts, p)) for p in range(num_parts)]
    assert max(sizes) - min(sizes) <= 1  # balanced
    with pytest.raises(ValueError, match=r"extract.shard=3 must be in \[0, extract.num_shards=3\)"):
        cache.part_shards(3, 3)


def slow_reader(image_root: Path, row: dict) -> Image.Image:
    time.sleep(0.03)
    with Image.open(Path(image_root) / row["path"]) as im:
        im.load()
        return im


def _extract_part(root: str, cache_root: str, part: int, num_parts: int, out: str) -> None:
    import torch

    torch.set_num_threads(1)
    manifest = pd.read_csv(Path(root) / "manifest.csv", dtype=str)
    fs = extract(tiny_encoder(), manifest, root, cache_root, batch_size=4, shard_size=4, progress=False,
                 reader=slow_reader, num_shards=num_parts, shard=part, read=False)
    Path(out).write_text(json.dumps({"embedded": fs.n_images_embedded, "path": str(fs.path),
                                     "missing": fs.missing_shards}))


def test_concurrent_parts_fill_one_valid_entry_identical_to_an_unsharded_run(tmp_path):
    root, cache_root = tmp_path / "data", tmp_path / "cache"
    manifest = write_images(root, n=40)
    manifest.to_csv(root / "manifest.csv", index=False)
    ctx = mp.get_context("forkserver")
    outs = [tmp_path / f"part{i}.json" for i in range(3)]
    procs = [ctx.Process(target=_extract_part, args=(str(root), str(cache_root), i, 3, str(o)))
             for i, o in enumerate(outs)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
        assert p.exitcode == 0
    results = [json.loads(o.read_text()) for o in outs]
    assert sorted(r["embedded"] for r in results) == [12, 12, 16]  # 10 shards of 4: 4 + 3 + 3
    entry = Path(results[0]["path"])
    assert {r["path"] for r in results} == {str(entry)}
    report = verify_entry(entry, root / "manifest.csv")
    assert report.ok, report.problems
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["status"] == "complete" and len(meta["shards"]) == 10  # no part lost another's records
    assert not list(entry.parent.glob("*.lock")) and not list(entry.glob(".*tmp*"))
    reference = extract(tiny_encoder(), pd.read_csv(root / "manifest.csv", dtype=str), root, tmp_path / "ref",
                        batch_size=4, shard_size=4, progress=False)
    assert shard_bytes(entry) == shard_bytes(reference.path)
    ids, emb = load_features(entry)
    np.testing.assert_array_equal(emb, reference.embeddings)


def test_an_incomplete_entry_is_refused_naming_the_missing_shards(tmp_path):
    root = tmp_path / "data"
    manifest = write_images(root, n=24)
    part = extract(tiny_encoder(), manifest, root, tmp_path / "cache", batch_size=4, shard_size=4,
                   progress=False, num_shards=2, shard=1)
    assert part.embeddings is None and not part.complete and part.missing_shards == [0, 2, 4]
    assert part.n_images_embedded == 12
    with pytest.raises(FeatureCacheError, match=r"12 of 24 rows in 3 of 6 shards missing \(shard-00000"):
        load_features(part.path)
    rest = extract(tiny_encoder(), manifest, root, tmp_path / "cache", batch_size=4, shard_size=4,
                   progress=False, num_shards=2, shard=0)
    assert rest.complete and rest.n_images_embedded == 12 and rest.embeddings.shape == (24, 8)
