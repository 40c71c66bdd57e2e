"""Reading features back without a :class:`~robustbench_fm.features.cache.FeatureCache`.

``load_features(path_or_dir, manifest)`` reads any features parquet: a cache entry folder, a
folder of parquet files or one file of your own ("bring your own features"), with ``sample_id``
and ``embedding`` columns. ``read_skipped(entry)`` / ``skipped_ids(entry)`` name the rows of a
cache entry skipped as unreadable (``on_bad_image="skip"``), which come back as all-NaN rows.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..core.devices import usable_cores
from ..core.errors import InvalidSetting
from ..core.shards import META_NAME, SHARD_NAME, shard_index
from . import view as views
from .cache import (
    SKIPPED_COLUMNS,
    SKIPPED_NAME,
    FeatureCacheError,
    _embedding_matrix,
    _manifest_ids,
    corrupted_shard,
    parse_skipped_csv,
    shard_mismatch,
)


def read_skipped(entry: str | Path) -> pd.DataFrame:
    """The skipped rows of cache entry folder ``entry`` (columns sample_id, row, path, error; sorted
    by row), limited to its complete shards; empty when nothing was skipped."""
    entry = Path(entry)
    if views.is_view(entry):
        return _view_skipped(entry)
    path = entry / SKIPPED_NAME
    if not path.exists():
        return pd.DataFrame({c: pd.Series(dtype=int if c == "row" else object) for c in SKIPPED_COLUMNS})
    shard_size = None
    n_rows = None
    if (entry / META_NAME).exists():
        try:
            meta = json.loads((entry / META_NAME).read_text())
            shard_size, n_rows = int(meta["shard_size"]), int(meta["n_rows"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            shard_size = n_rows = None
    records = parse_skipped_csv(path, n_rows)
    if shard_size:
        have = {shard_index(p.name) for p in entry.iterdir()} - {None}
        records = {r: v for r, v in records.items() if r // shard_size in have}
    df = pd.DataFrame([records[r] for r in sorted(records)], columns=list(SKIPPED_COLUMNS))
    return df.astype({"row": int})


def skipped_ids(entry: str | Path) -> list[str]:
    """sample_ids of the rows skipped as unreadable in cache entry folder ``entry`` (row order);
    ``[]`` when nothing was skipped. Drop these rows from every stage and every encoder."""
    return [str(s) for s in read_skipped(entry)["sample_id"]]


def missing_shards(entry: str | Path) -> list[int]:
    """Shards of a cache entry folder (as its ``meta.json`` lays them out) whose file is absent; of
    a view (:mod:`.store`), the missing shards of its chunks, numbered across them in order."""
    entry = Path(entry)
    if views.is_view(entry):
        out, offset = [], 0
        for folder in _view_chunks(entry):
            meta = json.loads((folder / META_NAME).read_text()) if (folder / META_NAME).is_file() else None
            if meta is None:
                return [0]
            out += [offset + i for i in missing_shards(folder)]
            offset += int(meta["n_shards"])
        return out
    meta = json.loads((entry / META_NAME).read_text())
    return [i for i in range(int(meta["n_shards"])) if not (entry / SHARD_NAME.format(i)).exists()]


#: parquet files :func:`load_features` reads at once (the shards of a cache entry)
READ_THREADS = 8
#: embeddings decoded at a time when a file is read into the matrix (issue 44): decoding a large
#: file whole allocates its full column in pyarrow's pool (slow to fault in on first use) and then
#: copies it; a batch at a time reuses one small buffer and writes each value once, in place
READ_BATCH_ROWS = 4096


def load_features(path_or_dir: str | Path, manifest: pd.DataFrame | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Read features from a parquet file, a folder of parquet files, or a cache entry folder.

    The parquet needs a ``sample_id`` column and an ``embedding`` column (fixed-size or plain
    list of floats). Returns ``(sample_ids, embeddings)`` with embeddings float32 (N, D); with
    ``manifest`` the rows are reordered to the manifest's ``sample_id`` order, and a manifest
    row without features is an error. Rows of a cache entry skipped as unreadable
    (``on_bad_image="skip"``) come back as all-NaN rows; :func:`skipped_ids` names them.
    """
    path = Path(path_or_dir)
    if views.is_view(path):
        return _load_view(path, manifest)
    recorded: dict[str, str] = {}  # a cache entry's shard -> the SHA-256 its meta.json recorded
    if path.is_dir():
        files = sorted(p for p in path.glob("*.parquet") if not p.name.startswith("."))
        if (path / META_NAME).exists():
            meta = json.loads((path / META_NAME).read_text())
            recorded = views.recorded_sha256(meta)
            missing = missing_shards(path)
            if missing:
                n, size, rows = int(meta["n_shards"]), int(meta["shard_size"]), int(meta["n_rows"])
                n_missing = sum(min((i + 1) * size, rows) - i * size for i in missing)
                names = (", ".join(SHARD_NAME.format(i).removesuffix(".parquet") for i in missing[:5])
                         + (", ..." if len(missing) > 5 else ""))
                raise FeatureCacheError(f"{path}: incomplete cache entry, {n_missing} of {rows} rows in "
                                        f"{len(missing)} of {n} shards missing ({names}); run the missing "
                                        "extraction parts (extract.shard=...) or extraction again to resume")
        if not files:
            raise FeatureCacheError(f"{path}: no .parquet files in this folder")
    elif path.exists():
        files = [path]
    else:
        raise FeatureCacheError(f"{path}: features file not found; pass a parquet file or cache folder")
    # a cache entry's shards are read side by side (pyarrow decodes one file's row group on one
    # thread): each file is checked and its vector length found, then every file decodes its rows
    # straight into its place in the one matrix
    with ThreadPoolExecutor(min(READ_THREADS, usable_cores(), len(files))) as pool:
        parts = list(pool.map(_open_part, files, [recorded.get(f.name) for f in files]))
        dims = sorted({p.dim for p in parts if p.dim is not None})
        if len(dims) > 1:
            raise FeatureCacheError(f"{path}: files hold embeddings of different sizes {dims}")
        starts = np.cumsum([0] + [len(p.ids) for p in parts])
        emb = np.empty((int(starts[-1]), dims[0] if dims else 0), dtype=np.float32)
        list(pool.map(_fill, parts, [emb] * len(parts), starts[:-1].tolist()))
    ids = np.concatenate([p.ids for p in parts])
    uniq, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        raise FeatureCacheError(f"{path}: sample_id {str(uniq[counts > 1][0])!r} appears {counts.max()} times; "
                                "keep one feature row per sample")
    return _in_manifest_order(path, ids, emb, manifest)


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
        yield _embedding_matrix(pa.chunked_array([batch.column(0)]), path)


def _open_part(f: Path, sha256: str | None = None) -> _Part:
    """Features file ``f``'s columns checked, its sample_ids and its vector length: the schema's (a
    fixed-size list, as the cache writes) or else its first batch's. The file is closed again (a
    folder may hold more files than a process may keep open). ``sha256``: what the entry's
    ``meta.json`` recorded for it, checked first (:func:`.cache.shard_mismatch`)."""
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


def _in_manifest_order(path: Path, ids: np.ndarray, emb: np.ndarray, manifest: pd.DataFrame | None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, emb)`` as read, or reordered to ``manifest``'s sample_ids (each must be there)."""
    if manifest is None:
        return ids, emb
    want = _manifest_ids(manifest)
    pos = pd.Index(ids).get_indexer(want)
    if (pos < 0).any():
        miss = want[pos < 0]
        raise FeatureCacheError(f"{path}: no features for {len(miss)} of {len(want)} manifest rows "
                                f"(first: sample_id {str(miss[0])!r}); extract them or fix the sample_ids")
    if len(pos) == len(emb) and (pos == np.arange(len(pos))).all():
        return want.copy(), emb  # already in manifest order: no second copy of the matrix
    return want.copy(), emb[pos]


def align_features(sample_ids, embeddings: np.ndarray, manifest: pd.DataFrame, source: str) -> np.ndarray:
    """Rows of ``embeddings`` reordered to the manifest's ``sample_id`` order."""
    index = pd.Index(pd.Series(sample_ids).astype(str))
    if index.has_duplicates:
        raise InvalidSetting(f"{source}: duplicated sample_id '{index[index.duplicated()][0]}'; "
                         "each feature row needs a unique sample_id")
    pos = index.get_indexer(manifest["sample_id"].astype(str))
    if (pos < 0).any():
        missing = manifest["sample_id"].to_numpy()[pos < 0]
        raise InvalidSetting(f"{source}: {len(missing)} manifest rows have no features, first sample_id "
                         f"'{missing[0]}'; extract them or drop them from the manifest")
    emb = np.asarray(embeddings, dtype=np.float32)
    aligned = emb if len(pos) == len(emb) and (pos == np.arange(len(pos))).all() else emb[pos]
    # a NaN/Inf row spreads through a sum (float64: no overflow of finite float32 values)
    bad = ~np.isfinite(aligned.sum(axis=1, dtype=np.float64))
    zero = ~bad & ~aligned.any(axis=1)
    for rows, what in ((bad, "hold NaN/Inf"), (zero, "are a zero vector (cosine similarity is undefined for it)")):
        if rows.any():
            first = int(np.flatnonzero(rows)[0])
            raise InvalidSetting(f"{source}: the features of sample_id '{manifest['sample_id'].iloc[first]}' "
                                 f"{what} ({int(rows.sum())} of {len(rows)} manifest rows); re-extract them or drop "
                                 "those rows from the manifest")
    return aligned  # in manifest order (already so: a view, no second copy)


def _view_chunks(entry: Path) -> list[Path]:
    return [Path(c) for c in dict.fromkeys(views.read_view(entry)["chunk"])]


def _load_view(entry: Path, manifest: pd.DataFrame | None) -> tuple[np.ndarray, np.ndarray]:
    """A view's (sample_ids, embeddings): each row's image read from its chunk (:mod:`.store`)."""
    missing = missing_shards(entry)
    if missing:
        raise FeatureCacheError(f"{entry}: incomplete features, {len(missing)} shards of its chunks missing; run "
                                "the missing extraction parts (extract.shard=...) or extraction again to resume")
    view = views.read_view(entry)
    emb = views.gather(view)
    return _in_manifest_order(entry, view["sample_id"].astype(str).to_numpy(), emb, manifest)


def _view_skipped(entry: Path) -> pd.DataFrame:
    """The rows of a view whose image its chunk skipped (sample_id of the view, its row there)."""
    view = views.read_view(entry)
    parts = []
    for folder, part in view.groupby("chunk", sort=False):
        skipped = read_skipped(Path(folder))
        if not len(skipped):
            continue
        hit = part[part["row"].isin(skipped["row"])]
        info = skipped.set_index("row").loc[hit["row"].to_numpy()]
        parts.append(pd.DataFrame({"sample_id": hit["sample_id"].to_numpy(), "row": hit.index.to_numpy(),
                                   "path": info["path"].to_numpy(), "error": info["error"].to_numpy()}))
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype=int if c == "row" else object) for c in SKIPPED_COLUMNS})
    return pd.concat(parts).sort_values("row").reset_index(drop=True).astype({"row": int})
