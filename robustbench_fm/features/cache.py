"""The parquet feature cache (DESIGN.md, "Feature cache").

Layout of one entry::

    <root>/<encoder name>/<key>/
        meta.json              key fields + shard_size + n_rows + n_shards + status
        shard-00000.parquet    manifest rows [0, shard_size)
        shard-00001.parquet    manifest rows [shard_size, 2 * shard_size)
        ...

``key`` is the first 16 hex digits of the SHA-256 of the canonical JSON of
:func:`cache_key_fields`: encoder identity, weights identity, resolved preprocessing, pooling,
precision, the manifest's locator hash (``sample_id`` and ``path`` in row order, so relabelling a
dataset keeps its features while adding, removing, moving or reordering rows does not), the
package and library versions and the cache format. Any change makes a new entry; nothing is ever
overwritten in place.

Shard ``i`` always holds manifest rows ``[i * shard_size, (i + 1) * shard_size)`` in manifest
order, with columns ``sample_id`` (string) and ``embedding`` (``fixed_size_list<float32>[D]``);
its schema metadata repeats the key fields. Shards are written whole and atomically (temp file
in the same folder, fsync, ``os.replace``) with byte-deterministic parquet settings, so a run
killed at any point leaves only complete shards, and resuming it yields the same bytes as a run
that was never interrupted. Temp files (``.shard-*.tmp-*``) are never read.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import re
import sys
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .. import manifest as mf
from ..atomic import write_atomic

log = logging.getLogger("robustbench_fm.features")

#: Bump when the on-disk layout or the meaning of a key field changes.
CACHE_FORMAT = 1
DEFAULT_SHARD_SIZE = 1024
META_NAME = "meta.json"
#: Parquet schema-metadata key holding the cache key fields (JSON).
PARQUET_META_KEY = b"robustbench_fm.features"
_SHARD_RE = re.compile(r"^shard-(\d{5,})\.parquet$")
#: Libraries whose version can change features (module to import, distribution name).
_LIBRARIES = (("torch", "torch"), ("torchvision", "torchvision"), ("PIL", "pillow"),
              ("timm", "timm"), ("open_clip", "open_clip_torch"), ("transformers", "transformers"))
#: Parquet writer settings; fixed so that the same rows always give the same bytes.
_WRITE_OPTIONS = dict(compression={"sample_id": "zstd", "embedding": "none"}, use_dictionary=False,
                      write_statistics=False, version="2.6", data_page_version="1.0",
                      store_schema=True)


class FeatureCacheError(RuntimeError):
    """The cache is incomplete, corrupted or does not belong to the given manifest (one line)."""


# --------------------------------------------------------------------------------------------
# key


def package_version() -> str:
    """``robustbench_fm``'s installed version, else ``robustbench_fm.__version__``, else 0+unknown."""
    try:
        return importlib.metadata.version("robustbench_fm")
    except importlib.metadata.PackageNotFoundError:
        return str(getattr(sys.modules.get("robustbench_fm"), "__version__", "0+unknown"))


def library_versions() -> dict[str, str]:
    """Versions of the importable libraries that can change an encoder's features.

    Read from the installed distributions' metadata, so nothing is imported here.
    """
    out = {}
    for module, dist in _LIBRARIES:
        if importlib.util.find_spec(module) is None:
            continue
        try:
            out[module] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[module] = "unknown"
    return out


def _canonical(obj) -> dict:
    """JSON round trip: tuples become lists, odd values strings, so fields compare after I/O."""
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


def cache_key_fields(encoder, manifest: pd.DataFrame) -> dict:
    """Everything that determines the cached features of ``encoder`` on ``manifest``.

    Label columns are deliberately absent: the manifest enters only through
    ``content_hash(manifest, LOCATOR_COLUMNS)``.
    """
    spec = encoder.spec
    return _canonical({
        "cache_format": CACHE_FORMAT,
        "encoder": spec.name,
        "library": spec.library,
        "hub_id": spec.hub_id,
        "revision": spec.revision,
        "model_kwargs": spec.model_kwargs,
        "embedding": spec.embedding,
        "embed_dim": int(spec.embed_dim),
        "preprocessing": spec.preprocessing(),
        "weights_id": encoder.weights_id,
        "precision": spec.amp_dtype if encoder.uses_amp else "fp32",
        "manifest_hash": mf.content_hash(manifest, mf.LOCATOR_COLUMNS),
        "n_rows": int(len(manifest)),
        "package_version": package_version(),
        "library_versions": library_versions(),
    })


def cache_key(fields: dict) -> str:
    """First 16 hex digits of the SHA-256 of ``fields`` as canonical (sorted-key) JSON."""
    blob = json.dumps(_canonical(fields), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _safe_name(name: str) -> str:
    """A folder name for an encoder name (``pathology/uni`` -> ``pathology__uni``)."""
    return re.sub(r"[^A-Za-z0-9._+-]", "_", name.replace("/", "__")) or "encoder"


# --------------------------------------------------------------------------------------------
# atomic I/O


def _json_bytes(obj) -> bytes:
    return (json.dumps(obj, sort_keys=True, indent=1) + "\n").encode()


# --------------------------------------------------------------------------------------------
# the cache


def _manifest_ids(manifest: pd.DataFrame) -> np.ndarray:
    if "sample_id" not in manifest.columns:
        raise FeatureCacheError("manifest has no 'sample_id' column; validate it with manifest.validate")
    return manifest["sample_id"].astype(str).to_numpy()


class FeatureCache:
    """One cache entry ``root/<encoder name>/<key>/`` (see the module docstring).

    ``shard_size`` and ``n_rows`` are taken from an existing ``meta.json`` when there is one (an
    entry keeps the shard layout it was started with), otherwise from the arguments
    (``n_rows`` defaults to ``fields["n_rows"]``).
    """

    def __init__(self, root: str | Path, fields: dict, shard_size: int | None = None,
                 n_rows: int | None = None):
        self.fields = _canonical(fields)
        self.key = cache_key(self.fields)
        self.root = Path(root)
        self.path = self.root / _safe_name(str(self.fields.get("encoder", "encoder"))) / self.key
        self.meta_path = self.path / META_NAME
        meta = self._read_meta()
        if n_rows is None:
            n_rows = self.fields.get("n_rows")
        if meta is not None:
            if shard_size is not None and int(shard_size) != int(meta["shard_size"]):
                log.info("%s: keeping the entry's shard_size %d (asked for %d)",
                            self.path, meta["shard_size"], shard_size)
            if n_rows is not None and int(n_rows) != int(meta["n_rows"]):
                raise FeatureCacheError(f"{self.meta_path}: entry holds {meta['n_rows']} rows but the "
                                        f"manifest has {n_rows}; delete the folder {self.path}")
            shard_size, n_rows = meta["shard_size"], meta["n_rows"]
        if n_rows is None:
            raise ValueError("FeatureCache needs n_rows (or fields['n_rows']) for a new entry")
        self.shard_size = int(shard_size or DEFAULT_SHARD_SIZE)
        if self.shard_size < 1:
            raise ValueError(f"shard_size must be >= 1, got {self.shard_size}")
        self.n_rows = int(n_rows)
        self.embed_dim = int(self.fields["embed_dim"])

    @classmethod
    def for_encoder(cls, root, encoder, manifest: pd.DataFrame, shard_size: int | None = None
                    ) -> "FeatureCache":
        return cls(root, cache_key_fields(encoder, manifest), shard_size, len(manifest))

    # ---- layout -------------------------------------------------------------------------
    @property
    def n_shards(self) -> int:
        return -(-self.n_rows // self.shard_size)

    def shard_bounds(self, i: int) -> tuple[int, int]:
        return i * self.shard_size, min((i + 1) * self.shard_size, self.n_rows)

    def shard_path(self, i: int) -> Path:
        return self.path / f"shard-{i:05d}.parquet"

    def complete_shards(self) -> list[int]:
        """Indices of the shard files present (temp files and stray names are ignored)."""
        if not self.path.is_dir():
            return []
        found = []
        for p in self.path.iterdir():
            m = _SHARD_RE.match(p.name)
            if m and int(m.group(1)) < self.n_shards:
                found.append(int(m.group(1)))
        return sorted(found)

    def missing_shards(self) -> list[int]:
        have = set(self.complete_shards())
        return [i for i in range(self.n_shards) if i not in have]

    @property
    def is_complete(self) -> bool:
        return not self.missing_shards()

    # ---- meta -----------------------------------------------------------------------------
    def _read_meta(self) -> dict | None:
        if not self.meta_path.exists():
            return None
        try:
            meta = json.loads(self.meta_path.read_text())
            ok = meta.get("key") == self.key and _canonical(meta.get("fields")) == self.fields
        except (OSError, ValueError, AttributeError) as exc:
            raise FeatureCacheError(f"{self.meta_path}: unreadable ({exc}); delete the folder "
                                    f"{self.path} to rebuild this entry") from None
        if not ok:
            raise FeatureCacheError(f"{self.meta_path}: records other key fields than key {self.key}; "
                                    f"delete the folder {self.path} to rebuild this entry")
        return meta

    def meta(self, status: str | None = None) -> dict:
        status = status or ("complete" if self.is_complete else "partial")
        return {"format": CACHE_FORMAT, "key": self.key, "fields": self.fields,
                "shard_size": self.shard_size, "n_rows": self.n_rows, "n_shards": self.n_shards,
                "embed_dim": self.embed_dim, "status": status}

    def write_meta(self, status: str | None = None) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        data = _json_bytes(self.meta(status))
        if self.meta_path.exists() and self.meta_path.read_bytes() == data:
            return
        write_atomic(self.meta_path, lambda f: f.write(data))

    # ---- shards ---------------------------------------------------------------------------
    def _schema(self) -> pa.Schema:
        key_json = json.dumps({"key": self.key, "fields": self.fields, "shard_size": self.shard_size},
                              sort_keys=True)
        return pa.schema([pa.field("sample_id", pa.string(), nullable=False),
                          pa.field("embedding", pa.list_(pa.float32(), self.embed_dim), nullable=False)],
                         metadata={PARQUET_META_KEY: key_json.encode()})

    def write_shard(self, i: int, sample_ids: Iterable[str], embeddings: np.ndarray) -> Path:
        """Write shard ``i`` atomically; ``sample_ids`` must be exactly its manifest rows."""
        lo, hi = self.shard_bounds(i)
        ids = [str(s) for s in sample_ids]
        emb = np.ascontiguousarray(embeddings, dtype=np.float32)
        if len(ids) != hi - lo or emb.shape != (hi - lo, self.embed_dim):
            raise ValueError(f"shard {i} holds rows [{lo}, {hi}): got {len(ids)} ids and embeddings "
                             f"of shape {emb.shape}, expected ({hi - lo}, {self.embed_dim})")
        if not np.isfinite(emb).all():
            bad = int(np.flatnonzero(~np.isfinite(emb).all(axis=1))[0])
            raise FeatureCacheError(f"encoder '{self.fields.get('encoder')}' produced non-finite features "
                                    f"for sample_id {str(ids[bad])!r} (manifest row {lo + bad}); not caching them")
        values = pa.array(emb.reshape(-1), type=pa.float32())
        table = pa.Table.from_arrays(
            [pa.array(ids, type=pa.string()), pa.FixedSizeListArray.from_arrays(values, self.embed_dim)],
            schema=self._schema())
        self.path.mkdir(parents=True, exist_ok=True)
        if not self.meta_path.exists():
            self.write_meta("partial")
        path = self.shard_path(i)
        write_atomic(path, lambda f: pq.write_table(table, f, row_group_size=max(len(ids), 1),
                                                          **_WRITE_OPTIONS))
        return path

    def _read_shard(self, i: int, columns=("sample_id", "embedding")) -> pa.Table:
        path = self.shard_path(i)
        try:
            return pq.read_table(path, columns=list(columns), memory_map=True)
        except Exception as exc:  # noqa: BLE001  (any pyarrow failure means a bad file)
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise FeatureCacheError(f"{path}: unreadable shard ({msg}); delete this file and re-run "
                                    "extraction to recompute it") from None

    def _check_ids(self, i: int, got: np.ndarray, manifest_ids: np.ndarray | None) -> None:
        lo, hi = self.shard_bounds(i)
        if len(got) != hi - lo:
            raise FeatureCacheError(f"{self.shard_path(i)}: {len(got)} rows, expected {hi - lo} (manifest rows "
                                    f"{lo}-{hi - 1}); delete this file and re-run extraction")
        if manifest_ids is not None:
            want = manifest_ids[lo:hi]
            bad = np.flatnonzero(got != want)
            if len(bad):
                j = int(bad[0])
                raise FeatureCacheError(
                    f"{self.shard_path(i)}: row {lo + j} holds sample_id {str(got[j])!r} but the manifest "
                    f"has {str(want[j])!r}; the file is corrupted or foreign, delete it and re-run extraction")

    def shard_ids(self, i: int, manifest: pd.DataFrame | None = None) -> np.ndarray:
        """The sample_ids of shard ``i``, checked against ``manifest`` when given."""
        got = self._read_shard(i, ("sample_id",)).column("sample_id").to_numpy(zero_copy_only=False)
        got = got.astype(str)
        self._check_ids(i, got, None if manifest is None else _manifest_ids(manifest))
        return got

    def done_ids(self, manifest: pd.DataFrame | None = None) -> set[str]:
        """The sample_ids held by the complete shards (checked against ``manifest`` when given)."""
        ids = None if manifest is None else _manifest_ids(manifest)
        out: set[str] = set()
        for i in self.complete_shards():
            got = self._read_shard(i, ("sample_id",)).column("sample_id").to_numpy(zero_copy_only=False)
            got = got.astype(str)
            self._check_ids(i, got, ids)
            out.update(got.tolist())
        return out

    def _check_manifest(self, manifest: pd.DataFrame) -> np.ndarray:
        ids = _manifest_ids(manifest)
        want = self.fields.get("manifest_hash")
        got = mf.content_hash(manifest, mf.LOCATOR_COLUMNS)
        if want is not None and got != want:
            raise FeatureCacheError(f"{self.path}: this entry was built for manifest hash {want}, the given "
                                    f"manifest hashes to {got} (rows added, removed, moved or reordered); "
                                    "extract features for this manifest instead")
        if len(ids) != self.n_rows:
            raise FeatureCacheError(f"{self.path}: entry holds {self.n_rows} rows, manifest has {len(ids)}")
        return ids

    def read(self, manifest: pd.DataFrame) -> np.ndarray:
        """Features (N, D) float32, row ``j`` belonging to ``manifest`` row ``j``."""
        ids = self._check_manifest(manifest)
        missing = self.missing_shards()
        if missing:
            n_missing = sum(hi - lo for lo, hi in map(self.shard_bounds, missing))
            names = ", ".join(self.shard_path(i).name for i in missing[:3]) + (", ..." if len(missing) > 3 else "")
            raise FeatureCacheError(f"{self.path}: incomplete, {n_missing} of {self.n_rows} rows in "
                                    f"{len(missing)} of {self.n_shards} shards missing ({names}); "
                                    "run extraction again to resume")
        out = np.empty((self.n_rows, self.embed_dim), dtype=np.float32)
        for i in range(self.n_shards):
            lo, hi = self.shard_bounds(i)
            table = self._read_shard(i)
            self._check_ids(i, table.column("sample_id").to_numpy(zero_copy_only=False).astype(str), ids)
            out[lo:hi] = _embedding_matrix(table.column("embedding"), self.shard_path(i), self.embed_dim)
        return out

    def clear_temp_files(self) -> int:
        """Remove leftover temp files of killed runs (only call when no other run writes here)."""
        n = 0
        if self.path.is_dir():
            for p in self.path.glob(".*.tmp-*"):
                try:
                    p.unlink()
                    n += 1
                except OSError:
                    pass
        return n

    def __repr__(self) -> str:
        return (f"FeatureCache({str(self.path)!r}, rows={self.n_rows}, shards="
                f"{self.n_shards - len(self.missing_shards())}/{self.n_shards})")


def _embedding_matrix(column: pa.ChunkedArray, path, dim: int | None = None) -> np.ndarray:
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
    arr = np.concatenate(parts) if parts else np.empty((0, dim or 0), np.float32)
    if dim is not None and arr.shape[1] != dim:
        raise FeatureCacheError(f"{path}: embeddings have {arr.shape[1]} dims, expected {dim}")
    return arr


def load_features(path_or_dir: str | Path, manifest: pd.DataFrame | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Read features from a parquet file, a folder of parquet files, or a cache entry folder.

    The parquet needs a ``sample_id`` column and an ``embedding`` column (fixed-size or plain
    list of floats). Returns ``(sample_ids, embeddings)`` with embeddings float32 (N, D); with
    ``manifest`` the rows are reordered to the manifest's ``sample_id`` order, and a manifest
    row without features is an error.
    """
    path = Path(path_or_dir)
    if path.is_dir():
        files = sorted(p for p in path.glob("*.parquet") if not p.name.startswith("."))
        if (path / META_NAME).exists():
            meta = json.loads((path / META_NAME).read_text())
            if meta.get("status") != "complete" and len(files) < meta.get("n_shards", 0):
                raise FeatureCacheError(f"{path}: incomplete cache entry ({len(files)} of "
                                        f"{meta.get('n_shards')} shards); run extraction again to resume")
        if not files:
            raise FeatureCacheError(f"{path}: no .parquet files in this folder")
    elif path.exists():
        files = [path]
    else:
        raise FeatureCacheError(f"{path}: features file not found; pass a parquet file or cache folder")
    ids_parts, emb_parts = [], []
    for f in files:
        try:
            table = pq.read_table(f, memory_map=True)
        except Exception as exc:  # noqa: BLE001
            raise FeatureCacheError(f"{f}: unreadable parquet ({str(exc).splitlines()[0] if str(exc) else exc!r})") from None
        for col in ("sample_id", "embedding"):
            if col not in table.column_names:
                raise FeatureCacheError(f"{f}: no '{col}' column (present: {', '.join(table.column_names[:12])}); "
                                        "features need 'sample_id' and a list-of-floats 'embedding'")
        ids_parts.append(table.column("sample_id").to_numpy(zero_copy_only=False).astype(str))
        emb_parts.append(_embedding_matrix(table.column("embedding"), f))
    dims = {e.shape[1] for e in emb_parts}
    if len(dims) > 1:
        raise FeatureCacheError(f"{path}: files hold embeddings of different sizes {sorted(dims)}")
    ids = np.concatenate(ids_parts)
    emb = np.concatenate(emb_parts)
    uniq, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        raise FeatureCacheError(f"{path}: sample_id {str(uniq[counts > 1][0])!r} appears {counts.max()} times; "
                                "keep one feature row per sample")
    if manifest is None:
        return ids, emb
    want = _manifest_ids(manifest)
    pos = pd.Index(ids).get_indexer(want)
    if (pos < 0).any():
        miss = want[pos < 0]
        raise FeatureCacheError(f"{path}: no features for {len(miss)} of {len(want)} manifest rows "
                                f"(first: sample_id {str(miss[0])!r}); extract them or fix the sample_ids")
    return want.copy(), emb[pos]
