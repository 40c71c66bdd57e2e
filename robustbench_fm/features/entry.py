"""The feature entry format, owned here (docs/architecture.md, "The feature entry format"): the
names of an entry's files, its ``meta.json`` (typed: :class:`ShardedMeta`, :class:`ViewMeta`,
:class:`ArrayMeta`, each naming its keys once) and the readers. ``meta.json`` is parsed nowhere
else (tests/features/test_entry.py holds it).

An entry is a folder whose ``meta.json`` records its ``format``; :func:`open_entry` reads it once
and returns the entry of that format, which offers :meth:`~Entry.read`, :meth:`~Entry.missing`
(its absent shards) and :meth:`~Entry.skipped` (its rows skipped as unreadable);
:func:`robustbench_fm.features.verify.verify_entry` finds its problems, per format:

- ``2`` (:data:`CACHE_FORMAT`), a **sharded** entry: ``shard-<i>.parquet`` (``sample_id``,
  ``embedding``; the layout and its guarantees: :mod:`.cache`), ``skipped.csv``. Two kinds, read
  alike and told apart by the key fields it records: a **chunk** of the per-image store
  (:mod:`.store`; its fields record ``made_with``, the versions its rows were made with) and a
  **keyed** entry ``<cache>/<encoder>/<key>/`` (slide embeddings, :mod:`.slides`; the per-manifest
  entries of the earlier layout, read only, :mod:`.key`). Every ``meta.json`` written since the
  first release records its format; chunks and keyed entries keep format 2, so no byte of an
  existing entry changes and entries stay readable by earlier releases.
- ``"view"`` (:data:`VIEW_FORMAT`): a manifest's rows as (sample_id, image id, chunk, row) of the
  store's chunks, in ``view.parquet``; read by gathering each row from its chunk (:func:`gather`).
- ``"array"`` (:data:`ARRAY_FORMAT`): one array (SPAR's frozen tokens,
  :meth:`robustbench_fm.features.store.FeatureStore.array`) in ``array.npy``, with its shape,
  dtype and SHA-256. An array an earlier release wrote is a bare ``<name>.npy`` without
  ``meta.json`` (:func:`.key.legacy_array`), read in place.

A folder of parquet files or one parquet file without ``meta.json`` is features of your own
(``"own"``: ``sample_id`` and ``embedding`` columns, "bring your own features").
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..core.atomic import write_atomic
from ..core.devices import usable_cores
from ..core.errors import UserError
from ..core.shards import META_NAME, SHARD_NAME, checked_sha256, json_bytes, present_shards, shard_bounds, shard_index
from ..core.text import one_line

#: ``format`` of a sharded entry (a chunk or a keyed entry). Bump when its on-disk layout changes.
#: 2: per-shard SHA-256 and row counts in meta.json; skipped rows (NaN + skipped.csv).
CACHE_FORMAT = 2
VIEW_FORMAT = "view"
ARRAY_FORMAT = "array"
#: what an opened entry is (:attr:`Entry.kind`)
CHUNK, KEYED, VIEW, ARRAY, OWN = "chunk", "keyed", "view", "array", "own"
#: the key field a chunk of the per-image store records (the versions its rows were made with)
MADE_WITH = "made_with"

SKIPPED_NAME = "skipped.csv"
SKIPPED_COLUMNS = ("sample_id", "row", "path", "error")
VIEW_NAME = "view.parquet"
ARRAY_NAME = "array.npy"
#: the partial file of shard ``i`` while it is being computed (``PARTIAL_NAME.format(i)``)
PARTIAL_NAME = "shard-{:05d}.partial.npz"
#: Temp files of :func:`robustbench_fm.core.atomic.write_atomic` (left behind by a killed write).
TEMP_GLOB = ".*.tmp-*"
#: Parquet schema-metadata key holding the cache key fields (JSON).
PARQUET_META_KEY = b"robustbench_fm.features"
#: parquet files :meth:`Entry.read` reads at once (the shards of a cache entry)
READ_THREADS = 8
#: embeddings decoded at a time when a file is read into the matrix (issue 44): decoding a large
#: file whole allocates its full column in pyarrow's pool (slow to fault in on first use) and then
#: copies it; a batch at a time reuses one small buffer and writes each value once, in place
READ_BATCH_ROWS = 4096


class FeatureCacheError(UserError, RuntimeError):
    """The cache is incomplete, corrupted or does not belong to the given manifest (one line)."""


def safe_name(name: str) -> str:
    """A folder name for an encoder name (``pathology/uni`` -> ``pathology__uni``)."""
    return re.sub(r"[^A-Za-z0-9._+-]", "_", name.replace("/", "__")) or "encoder"


# --------------------------------------------------------------------------------------------
# meta.json


def is_entry(path: str | Path) -> bool:
    """``path`` is an entry folder (it holds a ``meta.json``)."""
    return (Path(path) / META_NAME).is_file()


def meta_path(folder: str | Path) -> Path:
    return Path(folder) / META_NAME


def read_meta(folder: str | Path) -> dict | None:
    """``folder``'s ``meta.json`` as a dict (None when there is none); OSError / ValueError when
    it cannot be read or is not a JSON object."""
    path = meta_path(folder)
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"top level is {type(raw).__name__}, expected an object")
    return raw


def recorded_fields(folder: str | Path) -> dict | None:
    """The key fields ``folder``'s ``meta.json`` records; None without a readable one."""
    try:
        raw = read_meta(folder)
    except (OSError, ValueError):
        return None
    fields = raw.get("fields") if raw is not None else None
    return fields if isinstance(fields, dict) else None


def write_meta(folder: str | Path, meta) -> None:
    """``meta`` (a typed meta) written atomically as ``folder``'s ``meta.json``, unless it already
    holds exactly those bytes."""
    data = json_bytes(meta.to_json())
    path = meta_path(folder)
    if path.is_file() and path.read_bytes() == data:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda f: f.write(data))


@dataclass(frozen=True)
class ShardRecord:
    """What ``meta.json`` records of one complete shard."""

    file: str
    rows: int
    sha256: str
    skipped: int = 0

    def to_json(self) -> dict:
        return {"file": self.file, "rows": self.rows, "sha256": self.sha256, "skipped": self.skipped}

    @classmethod
    def parse(cls, raw: dict) -> ShardRecord:
        if shard_index(raw["file"]) is None:
            raise ValueError(f"bad shard file name {raw['file']!r}")
        return cls(str(raw["file"]), int(raw["rows"]), str(raw["sha256"]), int(raw.get("skipped", 0)))


@dataclass(frozen=True)
class ShardedMeta:
    """``meta.json`` of a sharded entry (format :data:`CACHE_FORMAT`: a chunk or a keyed entry)."""

    key: str
    fields: dict
    shard_size: int
    n_rows: int
    n_shards: int
    embed_dim: int | None
    status: str
    shards: tuple[ShardRecord, ...] = ()
    format: int = CACHE_FORMAT

    @property
    def kind(self) -> str:
        return CHUNK if isinstance(self.fields, dict) and MADE_WITH in self.fields else KEYED

    def to_json(self) -> dict:
        return {"format": self.format, "key": self.key, "fields": self.fields, "shard_size": self.shard_size,
                "n_rows": self.n_rows, "n_shards": self.n_shards, "embed_dim": self.embed_dim,
                "status": self.status, "shards": [r.to_json() for r in self.shards]}

    @classmethod
    def parse(cls, raw: dict, strict: bool = False) -> ShardedMeta:
        """KeyError / TypeError / ValueError when malformed; ``strict``: every key must be there (an
        entry this package wrote has them all) and the layout must make sense."""
        get = raw.__getitem__ if strict else raw.get
        fields, key = get("fields"), get("key")
        shard_size, n_rows = int(raw["shard_size"]), int(raw["n_rows"])
        n_shards = get("n_shards")
        n_shards = int(n_shards) if n_shards is not None else -(-n_rows // max(shard_size, 1))
        embed_dim = get("embed_dim")
        shards = tuple(ShardRecord.parse(r) for r in (raw["shards"] if strict else raw.get("shards", [])))
        if strict and (shard_size < 1 or n_rows < 0):
            raise ValueError(f"shard_size {shard_size}, n_rows {n_rows}")
        return cls(None if key is None else str(key), fields, shard_size, n_rows, n_shards,
                   None if embed_dim is None else int(embed_dim), str(raw.get("status")), shards,
                   raw.get("format"))

    def recorded(self) -> dict[int, ShardRecord]:
        """``{shard index: its record}``."""
        return {shard_index(r.file): r for r in self.shards}

    def recorded_sha256(self) -> dict[str, str]:
        """``{shard file name: SHA-256}`` as recorded."""
        return {r.file: r.sha256 for r in self.shards if r.sha256}


@dataclass(frozen=True)
class ViewMeta:
    """``meta.json`` of a view (format :data:`VIEW_FORMAT`)."""

    key: str
    fields: dict
    n_rows: int
    recipe: str
    chunks: tuple[str, ...]
    status: str = "complete"
    format: str = VIEW_FORMAT

    def to_json(self) -> dict:
        return {"format": self.format, "key": self.key, "fields": self.fields, "n_rows": self.n_rows,
                "recipe": self.recipe, "chunks": list(self.chunks), "status": self.status}

    @classmethod
    def parse(cls, raw: dict) -> ViewMeta:
        return cls(str(raw["key"]), raw["fields"], int(raw["n_rows"]), str(raw.get("recipe")),
                   tuple(raw.get("chunks", ())), str(raw.get("status")))


@dataclass(frozen=True)
class ArrayMeta:
    """``meta.json`` of an array entry (format :data:`ARRAY_FORMAT`): its key fields and what
    :data:`ARRAY_NAME` holds (shape, dtype as numpy writes it, SHA-256 of the file)."""

    key: str
    fields: dict
    shape: tuple[int, ...]
    dtype: str
    sha256: str
    status: str = "complete"
    format: str = ARRAY_FORMAT

    def to_json(self) -> dict:
        return {"format": self.format, "key": self.key, "fields": self.fields, "shape": list(self.shape),
                "dtype": self.dtype, "sha256": self.sha256, "status": self.status}

    @classmethod
    def parse(cls, raw: dict) -> ArrayMeta:
        return cls(str(raw["key"]), raw["fields"], tuple(int(n) for n in raw["shape"]), str(raw["dtype"]),
                   str(raw["sha256"]), str(raw.get("status")))


# --------------------------------------------------------------------------------------------
# skipped.csv, shards


def skipped_csv_bytes(records: dict[int, dict]) -> bytes:
    """``skipped.csv`` for ``{row: {"sample_id", "path", "error"}}``, sorted by row."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(SKIPPED_COLUMNS)
    for row in sorted(records):
        r = records[row]
        w.writerow([str(r["sample_id"]), int(row), one_line(r.get("path", "")), one_line(r.get("error", ""))])
    return buf.getvalue().encode()


def parse_skipped_csv(path: str | Path, n_rows: int | None = None) -> dict[int, dict]:
    """Read a ``skipped.csv``: ``{row: {"sample_id", "row", "path", "error"}}``.

    Raises :class:`FeatureCacheError` (one line, naming the file) on a malformed file.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise FeatureCacheError(f"{path}: unreadable ({one_line(exc)}); delete the cache entry folder "
                                f"{path.parent} to rebuild it") from None
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None or tuple(header) != SKIPPED_COLUMNS:
        raise FeatureCacheError(f"{path}: header {header!r}, expected {','.join(SKIPPED_COLUMNS)}; the file "
                                f"is corrupted, delete the cache entry folder {path.parent} to rebuild it")
    out: dict[int, dict] = {}
    for line_no, fields in enumerate(reader, start=2):
        try:
            sample_id, row, rel, error = fields
            row = int(row)
            if row < 0 or (n_rows is not None and row >= n_rows) or row in out:
                raise ValueError(f"row {row} out of range or repeated")
        except ValueError as exc:
            raise FeatureCacheError(f"{path}: line {line_no} is malformed ({one_line(exc)}); the file is "
                                    f"corrupted, delete the cache entry folder {path.parent} to rebuild it") from None
        out[row] = {"sample_id": sample_id, "row": row, "path": rel, "error": error}
    return out


def no_skipped() -> pd.DataFrame:
    """The empty table of skipped rows (columns :data:`SKIPPED_COLUMNS`)."""
    return pd.DataFrame({c: pd.Series(dtype=int if c == "row" else object) for c in SKIPPED_COLUMNS})


def shard_mismatch(path: str | Path, sha256: str | None) -> str | None:
    """Why the shard file ``path`` is not the file ``meta.json`` recorded with SHA-256 ``sha256``
    (flipped bytes, a truncated copy), else None; nothing recorded (None) is nothing to check. Hashed
    once per process and file version (:func:`robustbench_fm.core.shards.checked_sha256`): 0.9-1.4
    GB/s per core with SHA-NI (docs/outputs.md)."""
    if not sha256:
        return None
    try:
        got = checked_sha256(path)
    except OSError as exc:
        return f"unreadable ({one_line(exc)})"
    if got != sha256:
        return f"SHA-256 {got[:16]} is not {sha256[:16]} recorded in meta.json: corrupted or truncated"
    return None


def corrupted_shard(path: str | Path, why: str) -> FeatureCacheError:
    """The one-line error of a shard that is not the file its entry recorded (:func:`shard_mismatch`)."""
    return FeatureCacheError(f"{path}: corrupted cache shard ({why}); run the extraction again, which "
                             "recomputes it, or delete the file")


def embedding_matrix(column: pa.ChunkedArray, path, dim: int | None = None) -> np.ndarray:
    """A (fixed-size) list<float> column as an (n, D) float32 array."""
    parts = []
    for chunk in column.chunks:
        if pa.types.is_fixed_size_list(chunk.type):
            d = chunk.type.list_size
        elif pa.types.is_list(chunk.type) or pa.types.is_large_list(chunk.type):
            lengths = chunk.value_lengths().to_numpy(zero_copy_only=False)
            if len(lengths) and (lengths != lengths[0]).any():
                raise FeatureCacheError(f"{path}: 'embedding' rows have different lengths "
                                        f"({lengths.min()}..{lengths.max()}); store one vector length")
            d = int(lengths[0]) if len(lengths) else (dim or 0)
        else:
            raise FeatureCacheError(f"{path}: column 'embedding' has type {chunk.type}; expected a list of floats")
        if chunk.null_count:
            raise FeatureCacheError(f"{path}: column 'embedding' has {chunk.null_count} null rows")
        flat = chunk.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
        parts.append(flat.reshape(len(chunk), d))
    arr = (parts[0] if len(parts) == 1 else np.concatenate(parts)) if parts else np.empty((0, dim or 0), np.float32)
    if dim is not None and arr.shape[1] != dim:
        raise FeatureCacheError(f"{path}: embeddings have {arr.shape[1]} dims, expected {dim}")
    return arr


def manifest_ids(manifest: pd.DataFrame) -> np.ndarray:
    if "sample_id" not in manifest.columns:
        raise FeatureCacheError("manifest has no 'sample_id' column; validate it with manifest.validate")
    return manifest["sample_id"].astype(str).to_numpy()


def check_shard_ids(path: Path, lo: int, hi: int, got: np.ndarray, want: np.ndarray | None) -> None:
    """The shard ``path`` of manifest rows ``[lo, hi)`` holds ``hi - lo`` rows, with the manifest's
    sample_ids ``want`` (all of them; None: not checked)."""
    if len(got) != hi - lo:
        raise FeatureCacheError(f"{path}: {len(got)} rows, expected {hi - lo} (manifest rows "
                                f"{lo}-{hi - 1}); delete this file and re-run extraction")
    if want is not None:
        bad = np.flatnonzero(got != want[lo:hi])
        if len(bad):
            j = int(bad[0])
            raise FeatureCacheError(
                f"{path}: row {lo + j} holds sample_id {str(got[j])!r} but the manifest has "
                f"{str(want[lo + j])!r}; the file is corrupted or foreign, delete it and re-run extraction")


# --------------------------------------------------------------------------------------------
# reading parquet features files (a sharded entry's shards, your own files)


@dataclass
class _Part:
    """One features file being read: its sample_ids and vector length (``None``: no rows to tell)."""

    path: Path
    ids: np.ndarray
    dim: int | None


@contextmanager
def _readable(f: Path):
    """Any pyarrow failure while reading ``f`` as a one-line FeatureCacheError naming the file."""
    try:
        yield
    except FeatureCacheError:
        raise
    except Exception as exc:  # noqa: BLE001  (any pyarrow failure means a bad file)
        raise FeatureCacheError(f"{f}: unreadable parquet "
                                f"({str(exc).splitlines()[0] if str(exc) else exc!r})") from None


def _batches(file: pq.ParquetFile, path: Path) -> Iterator[np.ndarray]:
    """``file``'s embeddings as float32 blocks of :data:`READ_BATCH_ROWS` rows, decoded one at a time."""
    for batch in file.iter_batches(batch_size=READ_BATCH_ROWS, columns=["embedding"], use_threads=False):
        yield embedding_matrix(pa.chunked_array([batch.column(0)]), path)


def _open_part(f: Path, sha256: str | None = None) -> _Part:
    """Features file ``f``'s columns checked, its sample_ids and its vector length: the schema's (a
    fixed-size list, as the cache writes) or else its first batch's. The file is closed again (a
    folder may hold more files than a process may keep open). ``sha256``: what the entry's
    ``meta.json`` recorded for it, checked first (:func:`shard_mismatch`)."""
    why = shard_mismatch(f, sha256)
    if why is not None:
        raise corrupted_shard(f, why)
    with _readable(f):
        file = pq.ParquetFile(f, memory_map=True)
        try:
            names = file.schema_arrow.names
            for col in ("sample_id", "embedding"):
                if col not in names:
                    raise FeatureCacheError(f"{f}: no '{col}' column (present: {', '.join(names[:12])}); "
                                            "features need 'sample_id' and a list-of-floats 'embedding'")
            ids = file.read(columns=["sample_id"], use_threads=False).column("sample_id")
            kind = file.schema_arrow.field("embedding").type
            first = None if pa.types.is_fixed_size_list(kind) else next(_batches(file, f), None)
        finally:
            file.close()
    dim = kind.list_size if pa.types.is_fixed_size_list(kind) else None if first is None else first.shape[1]
    return _Part(f, ids.to_numpy(zero_copy_only=False).astype(str), dim)


def _fill(part: _Part, out: np.ndarray, start: int) -> None:
    """Decode ``part``'s embeddings batch by batch into ``out[start:start + len(part.ids)]``."""
    row = start
    with _readable(part.path):
        file = pq.ParquetFile(part.path, memory_map=True)
        try:
            for block in _batches(file, part.path):
                if block.shape[1] != part.dim:
                    low, high = sorted((block.shape[1], part.dim))
                    raise FeatureCacheError(f"{part.path}: 'embedding' rows have different lengths "
                                            f"({low}..{high}); store one vector length")
                out[row:row + len(block)] = block
                row += len(block)
        finally:
            file.close()
    if row != start + len(part.ids):
        raise FeatureCacheError(f"{part.path}: {row - start} embeddings for {len(part.ids)} sample_ids; "
                                "write one embedding per row")


def read_files(label: Path, files: list[Path], recorded: dict[str, str] | None = None,
               check: Callable[[list[_Part]], None] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(sample_ids, embeddings)`` of parquet ``files`` in order, read side by side (pyarrow decodes
    one file's row group on one thread): each file is checked (against its SHA-256 in ``recorded``,
    by file name) and its vector length found, ``check(parts)`` sees them all, then every file
    decodes its rows straight into its place in the one matrix. ``label`` names the set in errors."""
    recorded = recorded or {}
    with ThreadPoolExecutor(max(1, min(READ_THREADS, usable_cores(), len(files)))) as pool:
        parts = list(pool.map(_open_part, files, [recorded.get(f.name) for f in files]))
        if check is not None:
            check(parts)
        dims = sorted({p.dim for p in parts if p.dim is not None})
        if len(dims) > 1:
            raise FeatureCacheError(f"{label}: files hold embeddings of different sizes {dims}")
        starts = np.cumsum([0] + [len(p.ids) for p in parts])
        emb = np.empty((int(starts[-1]), dims[0] if dims else 0), dtype=np.float32)
        list(pool.map(_fill, parts, [emb] * len(parts), starts[:-1].tolist()))
    ids = np.concatenate([p.ids for p in parts]) if parts else np.array([], dtype=str)
    return ids, emb


def _unique(label: Path, ids: np.ndarray) -> None:
    uniq, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        raise FeatureCacheError(f"{label}: sample_id {str(uniq[counts > 1][0])!r} appears {counts.max()} times; "
                                "keep one feature row per sample")


def in_manifest_order(path: Path, ids: np.ndarray, emb: np.ndarray, manifest: pd.DataFrame | None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, emb)`` as read, or reordered to ``manifest``'s sample_ids (each must be there)."""
    if manifest is None:
        return ids, emb
    want = manifest_ids(manifest)
    pos = pd.Index(ids).get_indexer(want)
    if (pos < 0).any():
        miss = want[pos < 0]
        raise FeatureCacheError(f"{path}: no features for {len(miss)} of {len(want)} manifest rows "
                                f"(first: sample_id {str(miss[0])!r}); extract them or fix the sample_ids")
    if len(pos) == len(emb) and (pos == np.arange(len(pos))).all():
        return want.copy(), emb  # already in manifest order: no second copy of the matrix
    return want.copy(), emb[pos]


# --------------------------------------------------------------------------------------------
# entries


class Entry:
    """An entry opened from its path (:func:`open_entry`)."""

    kind: str
    path: Path

    def read(self, manifest: pd.DataFrame | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(sample_ids, embeddings float32 [N, D])``; with ``manifest`` in its sample_id order (a
        manifest row without features is an error). Rows skipped as unreadable are all-NaN."""
        raise FeatureCacheError(f"{self.path}: a {self.kind} entry holds no features to read")

    def missing(self) -> list[int]:
        """Its shards whose file is absent (none: it is complete)."""
        return []

    def skipped(self) -> pd.DataFrame:
        """Its rows skipped as unreadable (columns :data:`SKIPPED_COLUMNS`, sorted by row)."""
        return no_skipped()


class Sharded(Entry):
    """A sharded entry (format :data:`CACHE_FORMAT`): a chunk or a keyed entry."""

    def __init__(self, path: str | Path, meta: ShardedMeta):
        self.path, self.meta = Path(path), meta
        self.kind = meta.kind

    @property
    def skipped_path(self) -> Path:
        return self.path / SKIPPED_NAME

    def shard_bounds(self, i: int) -> tuple[int, int]:
        return shard_bounds(i, self.meta.shard_size, self.meta.n_rows)

    def shard_path(self, i: int) -> Path:
        return self.path / SHARD_NAME.format(i)

    def present(self) -> list[int]:
        """Indices of the shard files present (temp files and stray names are ignored)."""
        return present_shards(self.path, self.meta.n_shards)

    def missing(self) -> list[int]:
        return [i for i in range(self.meta.n_shards) if not self.shard_path(i).exists()]

    def skipped_records(self, complete_only: bool = True) -> dict[int, dict]:
        """``skipped.csv`` as ``{row: record}``; ``complete_only``: the rows of present shards only
        (a killed run may have listed the rows of the shard it was about to write)."""
        if not self.skipped_path.exists():
            return {}
        out = parse_skipped_csv(self.skipped_path, self.meta.n_rows)
        if complete_only:
            have = set(self.present())
            out = {r: v for r, v in out.items() if r // self.meta.shard_size in have}
        return out

    def skipped(self) -> pd.DataFrame:
        if not self.skipped_path.exists():
            return no_skipped()
        records = self.skipped_records()
        df = pd.DataFrame([records[r] for r in sorted(records)], columns=list(SKIPPED_COLUMNS))
        return df.astype({"row": int})

    def incomplete(self, missing: list[int]) -> FeatureCacheError:
        n, rows = self.meta.n_shards, self.meta.n_rows
        n_missing = sum(hi - lo for lo, hi in map(self.shard_bounds, missing))
        names = (", ".join(SHARD_NAME.format(i).removesuffix(".parquet") for i in missing[:5])
                 + (", ..." if len(missing) > 5 else ""))
        return FeatureCacheError(f"{self.path}: incomplete cache entry, {n_missing} of {rows} rows in "
                                 f"{len(missing)} of {n} shards missing ({names}); run the missing "
                                 "extraction parts (extract.shard=...) or extraction again to resume")

    def _files(self) -> list[Path]:
        missing = self.missing()
        if missing:
            raise self.incomplete(missing)
        return [self.shard_path(i) for i in range(self.meta.n_shards)]

    def read(self, manifest=None):
        files = self._files()
        if not files:
            return np.array([], dtype=str), np.empty((0, self.meta.embed_dim or 0), np.float32)
        ids, emb = read_files(self.path, files, self.meta.recorded_sha256())
        _unique(self.path, ids)
        return in_manifest_order(self.path, ids, emb, manifest)

    def read_rows(self, want: np.ndarray) -> np.ndarray:
        """The features (N, D) float32 of the manifest whose sample_ids are ``want``, row ``j``
        its row ``j``, strictly: every shard holds exactly its manifest rows, the embedding size is
        the recorded one and the non-finite rows are exactly those ``skipped.csv`` lists (all-NaN)."""
        files = self._files()
        skipped = self.skipped_records()
        dim = self.meta.embed_dim

        def check(parts: list[_Part]) -> None:
            for i, part in enumerate(parts):
                check_shard_ids(part.path, *self.shard_bounds(i), part.ids, want)
                if dim is not None and part.dim is not None and part.dim != dim:
                    raise FeatureCacheError(f"{part.path}: embeddings have {part.dim} dims, expected {dim}")

        emb = read_files(self.path, files, self.meta.recorded_sha256(), check)[1] if files else \
            np.empty((0, dim or 0), np.float32)
        self._check_skipped(emb, want, skipped)
        return emb

    def _check_skipped(self, emb: np.ndarray, ids: np.ndarray, skipped: dict[int, dict]) -> None:
        """Non-finite rows must be exactly the rows listed in ``skipped.csv`` (all-NaN)."""
        size = self.meta.shard_size
        for row, rec in skipped.items():
            if rec["sample_id"] != ids[row]:
                raise FeatureCacheError(f"{self.skipped_path}: row {row} lists sample_id {rec['sample_id']!r} but "
                                        f"the manifest has {str(ids[row])!r}; delete the folder {self.path}")
            if not np.isnan(emb[row]).all():
                raise FeatureCacheError(f"{self.skipped_path}: lists row {row} (sample_id {rec['sample_id']!r}) "
                                        f"but {self.shard_path(row // size).name} holds features for "
                                        f"it; delete the folder {self.path} to rebuild this entry")
        bad = ~np.isfinite(emb).all(axis=1)
        if skipped:
            bad[list(skipped)] = False
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise FeatureCacheError(f"{self.shard_path(row // size)}: row {row} (sample_id "
                                    f"{str(ids[row])!r}) holds non-finite features but is not listed in "
                                    f"{SKIPPED_NAME}; the file is corrupted, delete it and re-run extraction")


class View(Entry):
    """A manifest's view of the per-image store (format :data:`VIEW_FORMAT`)."""

    kind = VIEW

    def __init__(self, path: str | Path, meta: ViewMeta):
        self.path, self.meta = Path(path), meta

    def rows(self) -> pd.DataFrame:
        """Its rows (sample_id, image_id, chunk folder as a resolved path, row)."""
        t = pq.read_table(self.path / VIEW_NAME).to_pandas()
        base = self.path.parent
        t["chunk"] = [str((base / c).resolve()) if not os.path.isabs(c) else c for c in t["chunk"]]
        return t

    def chunks(self) -> list[Path]:
        return [Path(c) for c in dict.fromkeys(self.rows()["chunk"])]

    def missing(self) -> list[int]:
        """The missing shards of its chunks, numbered across them in order (a chunk without a
        ``meta.json`` counts as its shard 0)."""
        out, offset = [], 0
        for folder in self.chunks():
            chunk = open_chunk(folder)
            if chunk is None:
                return [0]
            out += [offset + i for i in chunk.missing()]
            offset += chunk.meta.n_shards
        return out

    def read(self, manifest=None):
        missing = self.missing()
        if missing:
            raise FeatureCacheError(f"{self.path}: incomplete features, {len(missing)} shards of its chunks missing; "
                                    "run the missing extraction parts (extract.shard=...) or extraction again to "
                                    "resume")
        rows = self.rows()
        return in_manifest_order(self.path, rows["sample_id"].astype(str).to_numpy(), gather(rows), manifest)

    def skipped(self) -> pd.DataFrame:
        """The rows whose image its chunk skipped (sample_id of the view, its row here)."""
        parts = []
        for folder, part in self.rows().groupby("chunk", sort=False):
            chunk = open_chunk(Path(folder))
            skipped = chunk.skipped() if chunk is not None else no_skipped()
            if not len(skipped):
                continue
            hit = part[part["row"].isin(skipped["row"])]
            info = skipped.set_index("row").loc[hit["row"].to_numpy()]
            parts.append(pd.DataFrame({"sample_id": hit["sample_id"].to_numpy(), "row": hit.index.to_numpy(),
                                       "path": info["path"].to_numpy(), "error": info["error"].to_numpy()}))
        if not parts:
            return no_skipped()
        return pd.concat(parts).sort_values("row").reset_index(drop=True).astype({"row": int})


class Array(Entry):
    """One array (format :data:`ARRAY_FORMAT`, :data:`ARRAY_NAME` beside its ``meta.json``), or a
    bare ``.npy`` an earlier release wrote (``meta`` None: no checksum recorded)."""

    kind = ARRAY

    def __init__(self, path: str | Path, meta: ArrayMeta | None):
        self.path, self.meta = Path(path), meta

    @property
    def file(self) -> Path:
        return self.path if self.meta is None else self.path / ARRAY_NAME

    def missing(self) -> list[int]:
        return [] if self.file.is_file() else [0]

    def read_array(self) -> np.ndarray:
        """The array, memory-mapped; its shape and dtype as recorded (its SHA-256 is checked by
        :func:`robustbench_fm.features.verify.verify_entry`: hashing a large token array on every
        read would cost seconds)."""
        try:
            arr = np.load(self.file, mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise FeatureCacheError(f"{self.file}: unreadable array ({one_line(exc)}); delete "
                                    f"{self.path} so that it is made again") from None
        if self.meta is not None and (tuple(arr.shape) != self.meta.shape or arr.dtype.str != self.meta.dtype):
            raise FeatureCacheError(f"{self.file}: holds {arr.dtype.str} {tuple(arr.shape)}, meta.json records "
                                    f"{self.meta.dtype} {self.meta.shape}; delete {self.path} so that it is made again")
        return arr


class Own(Entry):
    """Features of your own: parquet files with ``sample_id`` and ``embedding`` columns."""

    kind = OWN

    def __init__(self, path: str | Path, files: list[Path]):
        self.path, self.files = Path(path), files

    def read(self, manifest=None):
        if not self.files:
            raise FeatureCacheError(f"{self.path}: no .parquet files in this folder")
        ids, emb = read_files(self.path, self.files)
        _unique(self.path, ids)
        return in_manifest_order(self.path, ids, emb, manifest)


def unknown_format(path: Path, fmt) -> str:
    return (f"{meta_path(path)}: cache format {fmt!r}, this package reads format {CACHE_FORMAT} (and "
            f"{VIEW_FORMAT!r}, {ARRAY_FORMAT!r}); it is never reused (extraction makes a new entry), delete the "
            f"folder {path}")


def entry_of(path: str | Path, raw: dict, strict: bool = False) -> Entry:
    """The entry of ``meta.json`` contents ``raw`` (dispatched on its ``format``); KeyError /
    TypeError / ValueError when malformed, :class:`FeatureCacheError` for a format this package
    does not read."""
    path, fmt = Path(path), raw.get("format")
    if fmt == CACHE_FORMAT:
        return Sharded(path, ShardedMeta.parse(raw, strict))
    if fmt == VIEW_FORMAT:
        return View(path, ViewMeta.parse(raw))
    if fmt == ARRAY_FORMAT:
        return Array(path, ArrayMeta.parse(raw))
    raise FeatureCacheError(unknown_format(path, fmt))


def open_entry(path: str | Path) -> Entry:
    """The entry at ``path``: a folder's ``meta.json`` dispatched on its ``format``; a folder or file
    of parquet without one is features of your own; a bare ``.npy`` an array of the earlier layout."""
    path = Path(path)
    if path.is_dir():
        try:
            raw = read_meta(path)
        except (OSError, ValueError) as exc:
            raise FeatureCacheError(f"{meta_path(path)}: unreadable ({one_line(exc)}); delete the folder {path} "
                                    "and re-run extraction") from None
        if raw is None:
            return Own(path, sorted(p for p in path.glob("*.parquet") if not p.name.startswith(".")))
        try:
            return entry_of(path, raw)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise FeatureCacheError(f"{meta_path(path)}: malformed ({one_line(exc)}); delete the folder {path} and "
                                    "re-run extraction") from None
    if path.suffix == ".npy" and path.is_file():
        return Array(path, None)
    if path.exists():
        return Own(path, [path])
    raise FeatureCacheError(f"{path}: features file not found; pass a parquet file or cache folder")


def open_chunk(folder: str | Path) -> Sharded | None:
    """The sharded entry (a view's chunk) in ``folder``; None while it has no ``meta.json``."""
    if not is_entry(folder):
        return None
    got = open_entry(folder)
    if not isinstance(got, Sharded):
        raise FeatureCacheError(f"{meta_path(folder)}: a {got.kind} entry where a chunk of features belongs; "
                                f"delete the folder {folder}")
    return got


def entries_under(root: str | Path) -> list[Path]:
    """Entry folders (holding a ``meta.json`` or shards) under ``root`` (itself included), and the
    bare ``.npy`` arrays of the earlier layout (outside any entry folder), sorted."""
    root = Path(root)
    found = {p.parent for p in root.rglob(META_NAME)}
    found |= {p.parent for p in root.rglob("shard-*.parquet")}
    found |= {p for p in root.rglob("*.npy") if not p.name.startswith(".") and not is_entry(p.parent)}
    return sorted(found)


def read_view(folder: str | Path) -> pd.DataFrame:
    """The rows of the view in ``folder`` (:meth:`View.rows`)."""
    got = open_entry(folder)
    if not isinstance(got, View):
        raise FeatureCacheError(f"{folder}: a {got.kind} entry, not a view of the feature store")
    return got.rows()


def gather(view: pd.DataFrame) -> np.ndarray:
    """A view's matrix [n, D] (float32; ``view``: :meth:`View.rows`, or some of them), filled shard
    by shard from its chunks: besides the result only one shard is held at a time (a chunk's whole
    matrix never is). Each shard read is first checked against the SHA-256 its chunk's
    ``meta.json`` recorded (a corrupted or truncated shard is a one-line
    :class:`FeatureCacheError`; the run's look-up recomputes it)."""
    out = None
    for folder, part in view.groupby("chunk", sort=False):
        chunk = open_chunk(Path(folder))
        if chunk is None:
            raise FeatureCacheError(f"{meta_path(folder)}: missing; run the extraction again, which recomputes the "
                                    "chunk")
        recorded = chunk.meta.recorded_sha256()
        size = chunk.meta.shard_size
        rows = part["row"].to_numpy()
        dest = part.index.to_numpy()
        shard_of = rows // size
        for i in np.unique(shard_of):
            f = chunk.shard_path(int(i))
            why = shard_mismatch(f, recorded.get(f.name))
            if why is not None:
                raise corrupted_shard(f, why)
            try:
                table = pq.read_table(f, columns=["embedding"])
            except (OSError, ValueError, pa.ArrowException) as exc:
                raise FeatureCacheError(f"{f}: unreadable cache shard ({one_line(exc) or type(exc).__name__}); run "
                                        "the extraction again, which recomputes it") from None
            emb = embedding_matrix(table.column("embedding"), f, chunk.meta.embed_dim or None)
            if out is None:
                out = np.empty((len(view), emb.shape[1]), np.float32)
            sel = shard_of == i
            out[dest[sel]] = emb[rows[sel] - int(i) * size]
            del table, emb
    return out if out is not None else np.zeros((0, 0), np.float32)


__all__ = ["ARRAY", "ARRAY_FORMAT", "ARRAY_NAME", "CACHE_FORMAT", "CHUNK", "KEYED", "OWN", "SKIPPED_NAME", "VIEW",
           "VIEW_FORMAT", "VIEW_NAME", "Array", "ArrayMeta", "Entry", "FeatureCacheError", "Own", "ShardRecord",
           "Sharded", "ShardedMeta", "View", "ViewMeta", "gather", "is_entry", "open_entry", "read_meta", "read_view"]
