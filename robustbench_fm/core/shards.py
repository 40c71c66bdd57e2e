"""A sharded store entry: one folder of numbered parquet shards written whole and atomically, and a
``meta.json`` recording each complete shard's SHA-256. The one implementation the feature cache
(:class:`robustbench_fm.features.cache.FeatureCache`) and the prepared-image store
(:class:`robustbench_fm.data.prepared.PreparedStore`) share (issue 31 item 4): layout, shard
listing, atomic byte-deterministic writes and the checksums. What a shard holds, what the meta
records about it and how a stale entry is refused stay with each store.

A shard appears only by an atomic rename (temp file, fsync, rename:
:func:`robustbench_fm.core.atomic.write_atomic`), so a listed shard is whole; ``meta.json`` is
rewritten only when its bytes change and holds no timestamps, so an uninterrupted and a resumed
entry are byte-identical.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from .atomic import write_atomic
from .errors import InvalidSetting

META_NAME = "meta.json"
#: the file name of shard ``i`` (``SHARD_NAME.format(i)``); :func:`shard_index` reads it back
SHARD_NAME = "shard-{:05d}.parquet"
_SHARD_RE = re.compile(r"^shard-(\d{5,})\.parquet$")


def shard_index(name: str) -> int | None:
    """``shard-00012.parquet`` -> 12; any other name (temp files included) -> None."""
    m = _SHARD_RE.match(name)
    return int(m.group(1)) if m else None


def shard_bounds(i: int, shard_size: int, n_rows: int) -> tuple[int, int]:
    """Rows [lo, hi) of shard ``i`` of ``n_rows`` rows cut ``shard_size`` at a time."""
    return i * shard_size, min((i + 1) * shard_size, n_rows)


def present_shards(folder: Path, n_shards: int) -> list[int]:
    """Indices below ``n_shards`` of the shard files present in ``folder`` (temp files and stray
    names are ignored; none when the folder does not exist)."""
    if not folder.is_dir():
        return []
    found = (shard_index(p.name) for p in folder.iterdir())
    return sorted(i for i in found if i is not None and i < n_shards)


def json_bytes(obj) -> bytes:
    """The canonical bytes of a ``meta.json`` (sorted keys, indent 1, final newline)."""
    return (json.dumps(obj, sort_keys=True, indent=1) + "\n").encode()


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


#: SHA-256 of the shard files this process hashed or wrote, by (device, inode, size, mtime_ns): a
#: shard checked when a run looks its chunk up is not hashed again when the run reads it
_CHECKED: dict[tuple, str] = {}


def _signature(path: Path) -> tuple:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def checked_sha256(path: str | Path) -> str:
    """:func:`file_sha256` of ``path``, hashed once per process while the file's inode, size and
    mtime stay the same (a rewrite or an in-place change of the file hashes it again)."""
    key = _signature(Path(path))
    sha = _CHECKED.get(key)
    if sha is None:
        sha = _CHECKED[key] = file_sha256(path)
    return sha


def remember_sha256(path: str | Path, sha: str) -> None:
    """Record that ``path`` (just written from bytes of SHA-256 ``sha``) hashes to ``sha``."""
    with contextlib.suppress(OSError):
        _CHECKED[_signature(Path(path))] = sha


def parquet_bytes(table: pa.Table, row_group_size: int, options: dict) -> bytes:
    """``table`` serialised with fixed writer ``options``: the same rows give the same bytes."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=max(int(row_group_size), 1), **options)
    return sink.getvalue().to_pybytes()


class ShardedEntry:
    """The layout of one entry folder ``path`` holding ``n_items`` items in shards of
    ``shard_size`` (the last one shorter)."""

    path: Path
    n_items: int
    shard_size: int

    def _set_layout(self, path: Path, n_items: int, shard_size: int, what: str = "item") -> None:
        self.path, self.n_items, self.shard_size = Path(path), int(n_items), int(shard_size)
        if self.shard_size < 1:
            raise InvalidSetting(f"shard_size={self.shard_size}: use at least 1 {what} per shard")
        self.meta_path = self.path / META_NAME

    @property
    def n_shards(self) -> int:
        return -(-self.n_items // self.shard_size)

    def shard_bounds(self, i: int) -> tuple[int, int]:
        return shard_bounds(i, self.shard_size, self.n_items)

    def shard_path(self, i: int) -> Path:
        return self.path / SHARD_NAME.format(i)

    def complete_shards(self) -> list[int]:
        """Indices of the shard files present (temp files and stray names are ignored)."""
        return present_shards(self.path, self.n_shards)

    def missing_shards(self) -> list[int]:
        have = set(self.complete_shards())
        return [i for i in range(self.n_shards) if i not in have]

    @property
    def is_complete(self) -> bool:
        return not self.missing_shards()

    def _write_shard_bytes(self, i: int, data: bytes) -> tuple[Path, str]:
        """Shard ``i`` written atomically from ``data``; (its path, its hex SHA-256)."""
        self.path.mkdir(parents=True, exist_ok=True)
        path = self.shard_path(i)
        write_atomic(path, lambda f: f.write(data))
        sha = hashlib.sha256(data).hexdigest()
        remember_sha256(path, sha)
        return path, sha

    def _write_meta_bytes(self, data: bytes) -> None:
        """``meta.json`` written atomically, unless it already holds exactly ``data``."""
        if self.meta_path.exists() and self.meta_path.read_bytes() == data:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomic(self.meta_path, lambda f: f.write(data))

    def _unlink_shards(self, shards: Iterable[int]) -> None:
        for i in shards:
            self.shard_path(i).unlink(missing_ok=True)
