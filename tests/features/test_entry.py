"""One module owns the feature entry format (issue 56 item 1; robustbench_fm/features/entry.py): an
entry opened from its folder dispatches on the ``format`` its ``meta.json`` records (a chunk, a keyed
entry, a view, an array), the typed metas round-trip the files earlier releases wrote byte for byte,
``meta.json`` is parsed nowhere else, and the engine writes through the store's own entry object.
SPAR's frozen tokens (an array entry keyed by the recipe, issue 56 item 2):
tests/methods/spar/test_spar_tokens.py."""
from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from feature_fixtures import tiny_encoder, write_images

import robustbench_fm
from robustbench_fm.core.shards import json_bytes
from robustbench_fm.features import FeatureCache, FeatureCacheError, FeatureStore, engine, load_features
from robustbench_fm.features import entry as fmt
from robustbench_fm.features.options import ExtractOptions
from robustbench_fm.features.verify import verify_entry

PACKAGE = Path(robustbench_fm.__file__).parent
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
#: modules that may name ``meta.json``: the entry format; where the name is defined (core/shards.py,
#: shared with the prepared-image store); the prepared-image store and SPAR's sample cache, stores
#: of their own formats that are not feature entries
OTHER_STORES = {"features/entry.py", "core/shards.py", "data/prepared.py", "methods/spar/samples.py"}


def _names_meta_json(tree: ast.AST) -> list[int]:
    """Lines naming ``meta.json`` in code: the ``META_NAME`` constant, or a string that is the file's
    name or a path to it (a message mentioning it, inside a longer string, is not)."""
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "META_NAME" or \
                isinstance(node, ast.alias) and node.name == "META_NAME" or \
                isinstance(node, ast.Attribute) and node.attr == "META_NAME":
            out.append(node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings \
                and (node.value == "meta.json" or node.value.endswith("/meta.json")):
            out.append(node.lineno)
    return out


def test_meta_json_is_named_and_parsed_only_by_the_entry_module():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in OTHER_STORES:
            continue
        lines = _names_meta_json(ast.parse(path.read_text()))
        if lines:
            found[rel] = lines
    assert found == {}, f"meta.json read outside features/entry.py (go through it): {found}"


def _copy(tmp_path, commit):
    dst = tmp_path / commit
    shutil.copytree(FIXTURES / f"store_{commit}", dst, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return dst


def test_the_typed_metas_round_trip_every_meta_json_earlier_releases_wrote_byte_for_byte(tmp_path):
    """Chunks, keyed (per-manifest and slide) entries and views of c1e1b9b, cf22284 and ae38a5a: the
    format dispatches to the right kind and the typed meta writes exactly the file's bytes back."""
    kinds = {}
    for commit in ("c1e1b9b", "cf22284", "ae38a5a"):
        for meta in sorted((FIXTURES / f"store_{commit}").rglob("cache*/**/meta.json")):
            entry = fmt.open_entry(meta.parent)
            kinds.setdefault(entry.kind, 0)
            kinds[entry.kind] += 1
            assert json_bytes(entry.meta.to_json()) == meta.read_bytes(), meta
            if entry.kind == fmt.CHUNK:
                assert "made_with" in entry.meta.fields and meta.parent.parent.name.startswith("images-")
            if entry.kind == fmt.KEYED:
                assert "made_with" not in entry.meta.fields and not meta.parent.parent.name.startswith("images-")
    assert set(kinds) == {fmt.CHUNK, fmt.KEYED, fmt.VIEW} and min(kinds.values()) >= 2, kinds


def test_a_view_and_a_keyed_entry_read_through_the_entry_are_the_stored_values(tmp_path):
    root = _copy(tmp_path, "cf22284")
    expected = np.load(FIXTURES / "store_cf22284" / "expected.npz")
    manifest = pd.read_csv(root / "store.csv")
    views = [fmt.open_entry(p.parent) for p in sorted((root / "cache" / "tiny").glob("v-*/meta.json"))]
    got = set()
    for view in views:  # native and at a prepared 16 px resolution
        assert isinstance(view, fmt.View) and view.missing() == [] and len(view.skipped()) == 0
        ids, emb = view.read(manifest)
        assert list(ids) == list(manifest["sample_id"])
        got.add(emb.tobytes())
    assert got == {expected["store"].tobytes(), expected["store_16px"].tobytes()}
    slide = fmt.open_entry(next((root / "cache" / "tiny_slide").iterdir()))
    assert slide.kind == fmt.KEYED and slide.read()[1].tobytes() == expected["slides"].tobytes()


def _sharded(tmp_path, fields) -> FeatureCache:
    cache = FeatureCache(tmp_path, {"encoder": "e", "embed_dim": 2, **fields}, shard_size=2, n_rows=3)
    cache.write_skipped({2: {"sample_id": "c", "path": "c.png", "error": "OSError: bad"}})
    cache.write_shard(0, ["a", "b"], np.array([[1, 2], [3, 4]], np.float32))
    cache.write_shard(1, ["c"], np.zeros((1, 2), np.float32), skipped_rows=[2])
    cache.write_meta()
    return cache


@pytest.mark.parametrize("fields, kind", [({}, fmt.KEYED), ({"made_with": {"package": "x"}}, fmt.CHUNK)])
def test_a_sharded_entry_round_trips_and_offers_read_missing_skipped(tmp_path, fields, kind):
    cache = _sharded(tmp_path, fields)
    entry = fmt.open_entry(cache.path)
    assert isinstance(entry, fmt.Sharded) and entry.kind == kind
    assert json_bytes(entry.meta.to_json()) == (cache.path / "meta.json").read_bytes()
    assert fmt.ShardedMeta.parse(entry.meta.to_json(), strict=True) == entry.meta
    ids, emb = entry.read()
    assert list(ids) == ["a", "b", "c"] and emb[:2].tobytes() == np.array([[1, 2], [3, 4]], np.float32).tobytes()
    assert np.isnan(emb[2]).all()
    assert entry.skipped()[["sample_id", "row"]].values.tolist() == [["c", 2]] and entry.missing() == []
    (cache.path / "shard-00001.parquet").unlink()
    assert entry.missing() == [1] and len(entry.skipped()) == 0  # the rows of complete shards only
    with pytest.raises(FeatureCacheError, match=r"1 of 3 rows in 1 of 2 shards missing \(shard-00001\)"):
        entry.read()


def test_the_kind_is_the_recorded_format_not_which_files_exist(tmp_path):
    """A sharded entry holding a stray view.parquet is still read as its shards (the kind was once
    sniffed from view.parquet's presence); an unknown format is one line naming meta.json."""
    cache = _sharded(tmp_path, {})
    pq.write_table(pq.read_table(cache.shard_path(0)), cache.path / fmt.VIEW_NAME)
    ids, _ = load_features(cache.path)
    assert list(ids) == ["a", "b", "c"]
    meta = fmt.read_meta(cache.path)
    (cache.path / "meta.json").write_text(json.dumps({**meta, "format": "chunky"}))
    with pytest.raises(FeatureCacheError, match=r"meta.json: cache format 'chunky', this package reads format 2"):
        load_features(cache.path)


def test_an_array_entry_round_trips_and_a_bare_npy_is_the_earlier_layout(tmp_path):
    want = np.arange(24, dtype=np.float16).reshape(2, 3, 4)

    def make(alloc):
        alloc(want.shape, want.dtype)[:] = want

    got = FeatureStore(tmp_path).array("arrays", {"encoder": "e", "what": "tokens"}, make)
    [folder] = list((tmp_path / "arrays").iterdir())
    entry = fmt.open_entry(folder)
    assert isinstance(entry, fmt.Array) and entry.meta.shape == (2, 3, 4) and entry.meta.dtype == "<f2"
    assert json_bytes(fmt.ArrayMeta.parse(fmt.read_meta(folder)).to_json()) == (folder / "meta.json").read_bytes()
    assert np.array_equal(got, want) and np.array_equal(entry.read_array(), want)
    assert verify_entry(folder).ok
    np.save(tmp_path / "old.npy", want)
    old = fmt.open_entry(tmp_path / "old.npy")
    assert isinstance(old, fmt.Array) and old.meta is None and np.array_equal(old.read_array(), want)


def test_the_engine_writes_through_the_stores_own_entry_object(tmp_path):
    """The chunk's FeatureCache the store opened is the object the engine fills (no second
    FeatureCache of the same folder to refresh): complete and settled once the pass returns."""
    root = tmp_path / "data"
    manifest = write_images(root, 6)
    store = FeatureStore(tmp_path / "cache")
    encoder = tiny_encoder()
    ids = store.identities(manifest, root)
    p = store.look_up(encoder, manifest, ids, root)
    [(chunk, _)] = p.fill
    seen = []
    run = engine.backend(tmp_path / "cache", ExtractOptions(batch_size=4, num_workers=0, shard_size=4), progress=False)

    def spy(encs, rows, root_, entries, decode):
        seen.append(list(entries))
        return run(encs, rows, root_, entries, decode)

    store.fill([encoder], [p], root, spy)
    cache = chunk.home.chunk_cache(chunk)
    assert seen == [[cache]] and cache.shard_size == 4 and cache.settled()
    assert store.view(p, manifest, root).missing_shards == []
