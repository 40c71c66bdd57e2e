"""core/shards.py: the sharded entry the feature cache and the prepared-image store share (issue 31
item 4): layout, listing that ignores temp and stray files, byte-deterministic atomic writes whose
recorded SHA-256 is the file's, and a meta.json rewritten only when its bytes change."""
import hashlib

import pyarrow as pa
import pytest

from robustbench_fm.core.errors import InvalidSetting
from robustbench_fm.core.shards import (
    SHARD_NAME,
    ShardedEntry,
    file_sha256,
    json_bytes,
    parquet_bytes,
    shard_index,
)
from robustbench_fm.data.prepared import PreparedStore
from robustbench_fm.features.cache import FeatureCache


class _Entry(ShardedEntry):
    def __init__(self, path, n, size):
        self._set_layout(path, n, size)


def test_layout_and_listing(tmp_path):
    e = _Entry(tmp_path / "e", 10, 4)
    assert (e.n_shards, [e.shard_bounds(i) for i in range(3)]) == (3, [(0, 4), (4, 8), (8, 10)])
    assert e.complete_shards() == [] and e.missing_shards() == [0, 1, 2] and not e.is_complete
    e.path.mkdir()
    for name in (SHARD_NAME.format(1), SHARD_NAME.format(7), ".shard-00000.parquet.tmp-123", "shard-0.parquet",
                 "notes.txt"):
        (e.path / name).write_bytes(b"x")
    assert e.complete_shards() == [1] and e.missing_shards() == [0, 2]  # 7 is beyond the entry
    assert [shard_index(n) for n in ("shard-00012.parquet", "shard-123456.parquet", "shard-12.parquet")] == \
        [12, 123456, None]
    with pytest.raises(InvalidSetting, match="shard_size=0: use at least 1 item per shard"):
        _Entry(tmp_path / "f", 3, 0)


def test_writes_are_deterministic_and_recorded(tmp_path):
    e = _Entry(tmp_path / "e", 3, 3)
    table = pa.table({"a": pa.array(["x", "y", "z"])})
    data = parquet_bytes(table, 3, {"compression": "zstd", "write_statistics": False})
    assert data == parquet_bytes(table, 3, {"compression": "zstd", "write_statistics": False})
    path, sha = e._write_shard_bytes(0, data)
    assert path == e.shard_path(0) and path.read_bytes() == data
    assert sha == hashlib.sha256(data).hexdigest() == file_sha256(path, chunk=7)
    assert e.is_complete and not list(e.path.glob(".*tmp*"))
    meta = json_bytes({"b": 1, "a": [1, 2]})
    assert meta == b'{\n "a": [\n  1,\n  2\n ],\n "b": 1\n}\n'
    e._write_meta_bytes(meta)
    stamp = e.meta_path.stat().st_mtime_ns
    e._write_meta_bytes(meta)  # unchanged bytes: not rewritten
    assert e.meta_path.stat().st_mtime_ns == stamp and e.meta_path.read_bytes() == meta
    e._unlink_shards([0, 2])
    assert e.missing_shards() == [0]


def test_both_stores_are_sharded_entries(tmp_path):
    """One implementation: the feature cache and the prepared store answer layout questions
    through the same code (their row and image counts are its ``n_items``)."""
    cache = FeatureCache(tmp_path, {"encoder": "e", "embed_dim": 2}, shard_size=2, n_rows=5)
    store = PreparedStore(tmp_path / "p", {"size": 16, "n_images": 5}, shard_size=2)
    for entry, n in ((cache, cache.n_rows), (store, store.n_images)):
        assert isinstance(entry, ShardedEntry) and n == entry.n_items == 5
        assert type(entry).shard_bounds is ShardedEntry.shard_bounds
        assert type(entry).complete_shards is ShardedEntry.complete_shards
        assert entry.n_shards == 3 and entry.shard_bounds(2) == (4, 5)
