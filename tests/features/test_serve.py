"""The public ``features.extract`` / ``features.extract_panel`` go through the feature store (issue
43 item 1: one store writes every feature entry): no per-manifest entry is written, the values are
the store's byte for byte, the store's reuse holds across manifests and folders, and an entry of the
earlier per-manifest layout is still read with 0 forward passes. The engine fills only entries it
is handed, and the per-manifest key is used only to find old entries."""
from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from feature_fixtures import engine_extract, tiny_encoder, write_images

import robustbench_fm
from robustbench_fm.core.errors import InvalidSetting
from robustbench_fm.features import CACHE_FORMAT, extract, extract_panel, load_features
from robustbench_fm.features import engine as engine_mod
from robustbench_fm.features.embed import Embedder
from robustbench_fm.features.options import ExtractOptions

N, SHARD, BATCH = 12, 4, 3


def _same(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _per_manifest_entries(cache: Path) -> list[Path]:
    """Folders in the per-manifest layout: an entry of cache format 2 keyed by a manifest."""
    out = []
    for meta in Path(cache).glob("*/*/meta.json"):
        m = json.loads(meta.read_text())
        if m.get("format") == CACHE_FORMAT and "manifest_hash" in (m.get("fields") or {}):
            out.append(meta.parent)
    return out


@pytest.fixture
def data(tmp_path):
    return tmp_path / "images", write_images(tmp_path / "images", N)


def test_extract_writes_no_per_manifest_entry_and_gives_the_stores_values(data, tmp_path):
    root, manifest = data
    fs = extract(tiny_encoder(), manifest, root, tmp_path / "cache", batch_size=BATCH, shard_size=SHARD,
                 progress=False)
    assert fs.n_images_embedded == N and fs.complete and list(fs.sample_ids) == list(manifest["sample_id"])
    assert _per_manifest_entries(tmp_path / "cache") == []
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "cache" / "tiny").iterdir() if p.is_dir()) == [
        "images", "v"]
    assert _same(load_features(fs.path, manifest)[1], fs.embeddings)
    # the same values as the store serves a run (another cache: embedded again, byte for byte)
    run = Embedder(tmp_path / "other", ExtractOptions(device="cpu", batch_size=BATCH, shard_size=SHARD)).embed(
        manifest, root, tiny_encoder())
    assert run.n_images_embedded == N and _same(load_features(run.path, manifest)[1], fs.embeddings)
    # ... and the Embedder on the same cache embeds nothing: one store
    again = Embedder(tmp_path / "cache", ExtractOptions(device="cpu", batch_size=BATCH, shard_size=SHARD)).embed(
        manifest, root, tiny_encoder())
    assert again.n_images_embedded == 0 and again.path == fs.path


def test_extract_reuses_images_across_manifests_and_folders(data, tmp_path):
    root, manifest = data
    first = extract(tiny_encoder(), manifest.head(8), root, tmp_path / "cache", batch_size=BATCH, shard_size=SHARD,
                    progress=False)
    moved = tmp_path / "moved"
    shutil.copytree(root, moved)
    other = manifest.iloc[::-1].reset_index(drop=True).assign(sample_id=lambda d: "x" + d["sample_id"])
    fs = extract(tiny_encoder(), other, moved, tmp_path / "cache", batch_size=BATCH, shard_size=SHARD,
                 progress=False)
    assert fs.n_images_embedded == N - 8  # only the 4 images the first call did not embed
    order = [N - 1 - i for i in range(N)]
    whole = extract(tiny_encoder(), manifest, root, tmp_path / "fresh", batch_size=BATCH, shard_size=SHARD,
                    progress=False)
    assert _same(fs.embeddings, whole.embeddings[order]) and _same(first.embeddings, whole.embeddings[:8])
    assert _per_manifest_entries(tmp_path / "cache") == []


def test_a_per_manifest_entry_is_read_in_place_with_no_forward(data, tmp_path):
    """The earlier layout (what ``extract`` wrote before the store), from an image folder that has
    since moved: read as it is, 0 forward passes, the same bytes, nothing written in its layout."""
    root, manifest = data
    old = engine_extract(tiny_encoder(), manifest, root, tmp_path / "cache", batch_size=BATCH, shard_size=SHARD,
                         progress=False)
    moved = tmp_path / "moved"
    shutil.move(root, moved)
    calls = []
    enc = tiny_encoder(forward=lambda model, x: calls.append(len(x)) or model(x))
    fs = extract(enc, manifest, moved, tmp_path / "cache", batch_size=BATCH, shard_size=SHARD, progress=False)
    assert calls == [] and fs.n_forward == 0 and fs.n_images_embedded == 0
    assert _same(fs.embeddings, old.embeddings)
    assert _per_manifest_entries(tmp_path / "cache") == [old.path]


def test_a_panel_shares_one_pass_and_each_encoder_gets_its_single_values(data, tmp_path):
    root, manifest = data
    a, b = tiny_encoder(), tiny_encoder(weights_id="b", name="tiny_b", input_size=24)
    both = extract_panel([a, b], manifest, root, tmp_path / "panel", batch_size=[BATCH, 4], shard_size=SHARD,
                         progress=False)
    for enc, bs, fs in zip((a, b), (BATCH, 4), both):
        alone = extract(enc, manifest, root, tmp_path / f"alone-{enc.weights_id}", batch_size=bs, shard_size=SHARD,
                        progress=False)
        assert _same(fs.embeddings, alone.embeddings)
    assert _per_manifest_entries(tmp_path / "panel") == []


def test_sharded_parts_and_skipped_rows_go_through_the_store(data, tmp_path):
    root, manifest = data
    (root / "img" / "005.png").write_bytes(b"not a png")
    parts = [extract(tiny_encoder(), manifest, root, tmp_path / "cache", batch_size=BATCH, shard_size=SHARD,
                     progress=False, on_bad_image="skip", num_shards=2, shard=k) for k in (0, 1)]
    assert parts[0].embeddings is None and parts[0].missing_shards and parts[1].complete
    assert parts[1].skipped == ["s005"] and np.isnan(parts[1].embeddings[5]).all()
    assert np.isfinite(np.delete(parts[1].embeddings, 5, axis=0)).all()
    assert _per_manifest_entries(tmp_path / "cache") == []


def test_the_engine_fills_only_entries_it_is_handed(data, tmp_path):
    root, manifest = data
    with pytest.raises(InvalidSetting, match="robustbench_fm.features.extract$"):
        engine_mod.extract(tiny_encoder(), manifest, root, tmp_path / "c", progress=False)
    with pytest.raises(InvalidSetting, match="robustbench_fm.features.extract_panel$"):
        engine_mod.extract_panel([tiny_encoder()], manifest, root, tmp_path / "c", progress=False)
    assert not (tmp_path / "c").exists()


def test_the_per_manifest_key_is_used_only_to_find_old_entries():
    """Who calls ``cache_key_fields`` (the per-manifest key): only the read-only look-ups of the
    earlier layout (key.py's finders, the store's ``adopt``). Before the store's ``extract``, the
    engine keyed its default entry with it and so wrote that layout."""
    package = Path(robustbench_fm.__file__).parent
    callers = set()
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) \
                        == "cache_key_fields":
                    callers.add(f"{path.relative_to(package).as_posix()}::{fn.name}")
    assert callers == {"features/key.py::find_slide_entry", "features/store.py::adopt"}
