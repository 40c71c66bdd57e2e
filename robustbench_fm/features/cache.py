"""The parquet feature cache (docs/architecture.md, "Contracts"): :class:`FeatureCache`, the writer
of a sharded entry. The entry format (file names, ``meta.json``, the readers) is
:mod:`.entry`'s; this module writes it through :class:`.entry.ShardedMeta`.

Layout of one entry::

    <root>/<encoder name>/<key>/
        meta.json              key fields, shard_size, n_rows, n_shards, status and, per complete
                               shard, its file name, row count, SHA-256 and number of skipped rows
        shard-00000.parquet    manifest rows [0, shard_size)
        shard-00001.parquet    manifest rows [shard_size, 2 * shard_size)
        ...
        skipped.csv            only when rows were skipped (``on_bad_image="skip"``): one line per
                               skipped row, columns sample_id,row,path,error, sorted by row
        shard-00002.partial.npz   only while shard 2 is being computed: its first rows so far
                               (whole batches), flushed every few seconds so that a killed run
                               loses seconds of work, not a shard (see "Partial shards" below)

``key`` is the first 16 hex digits of the SHA-256 of the canonical JSON of the entry's key
fields: for a chunk of the per-image store (:mod:`.store`) its recipe, its images and the versions
it was made with; for an entry of the earlier per-manifest layout (read only now,
:func:`.key.cache_key_fields`) the encoder identity, the manifest's locator hash, the image root,
the versions and the cache format. Any change makes a new entry (a new folder;
the old one is left untouched); nothing is ever overwritten in place. A ``meta.json`` inside the
key's folder that records another cache format, another key or other key fields is never reused:
opening the entry raises :class:`FeatureCacheError` naming the folder to delete.

Shard ``i`` always holds manifest rows ``[i * shard_size, (i + 1) * shard_size)`` in manifest
order, with columns ``sample_id`` (string) and ``embedding`` (``fixed_size_list<float32>[D]``);
its schema metadata repeats the key fields. Shards are written whole and atomically (temp file
in the same folder, fsync, ``os.replace``) with byte-deterministic parquet settings, so a run
killed at any point leaves only complete shards, and resuming it yields the same bytes as a run
that was never interrupted (shards, ``meta.json`` and ``skipped.csv``; ``meta.json`` holds no
timestamps). Temp files (``.<name>.tmp-*``) are never read.

Skipped rows (an image that could not be read or transformed, with ``on_bad_image="skip"``) keep
their place in their shard with an all-NaN embedding, so shards stay complete and fixed; they are
listed in ``skipped.csv``, which is written *before* the shard holding them, so every NaN row of a
complete shard is listed. Only listed rows may hold non-finite values; anything else is refused
on write and reported as corruption on read. ``robustbench_fm.features.verify`` re-checks all of
this (checksums, row counts, sample_ids, NaN rows against ``skipped.csv``).

Partial shards: while shard ``i`` is computed, the extraction rewrites ``shard-0000i.partial.npz``
(atomically) with the embeddings of its first ``m`` rows, ``m`` a whole number of batches, the
skipped-row records among them, the sample_ids, a SHA-256 of the embedding bytes and a ``tag``
(batch size, device type) naming what makes batches and values identical. A resumed run with the
same tag validates the file (:meth:`FeatureCache.read_partial`: key, shard, tag, row count on a
batch boundary, sample_ids against the manifest, checksum, NaN rows exactly the listed skipped
rows) and continues at row ``lo + m``; its batches are the batches an uninterrupted run makes
(they start at the shard's first row), so the shard it writes is byte-identical. A partial that
does not validate is deleted and the shard computed from its first row. The partial is deleted
once its shard is written; it is never read as features.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..core.atomic import write_atomic
from ..core.errors import InvalidSetting
from ..core.locking import FileLock
from ..core.shards import ShardedEntry, file_sha256, json_bytes, parquet_bytes
from ..core.text import one_line
from . import entry as fmt
from .entry import (  # noqa: F401 (the entry format's names, as this module has always offered them)
    CACHE_FORMAT,
    PARQUET_META_KEY,
    PARTIAL_NAME,
    SKIPPED_COLUMNS,
    SKIPPED_NAME,
    TEMP_GLOB,
    FeatureCacheError,
    ShardedMeta,
    ShardRecord,
    check_shard_ids,
    corrupted_shard,
    parse_skipped_csv,
    shard_mismatch,
    skipped_csv_bytes,
)
from .entry import embedding_matrix as _embedding_matrix  # noqa: F401
from .entry import manifest_ids as _manifest_ids
from .entry import safe_name as _safe_name
from .key import check_manifest
from .recipe import canonical as _canonical
from .recipe import fields_key as cache_key

log = logging.getLogger("robustbench_fm.features")

DEFAULT_SHARD_SIZE = 1024
#: Parquet writer settings; fixed so that the same rows always give the same bytes.
_WRITE_OPTIONS = dict(compression={"sample_id": "zstd", "embedding": "none"}, use_dictionary=False,
                      write_statistics=False, version="2.6", data_page_version="1.0",
                      store_schema=True)


@dataclass
class FeatureSet:
    """Features aligned row-for-row with the manifest, and what this call did to get them."""

    sample_ids: np.ndarray
    embeddings: np.ndarray  # (N, D) float32
    key: str
    path: Path  # the cache entry folder (load_features(path) reads it back)
    n_forward: int  # forward batches run by this call (0 on a warm cache)
    n_images_embedded: int
    seconds: float
    images_per_s: float
    fields: dict = field(default_factory=dict, repr=False)
    #: sample_ids of the rows skipped as unreadable (manifest order); their embeddings are NaN.
    skipped: list[str] = field(default_factory=list)
    #: cache shards still missing after this call (other parts of a sharded extraction).
    missing_shards: list[int] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.missing_shards

    @property
    def kept(self) -> np.ndarray:
        """Boolean mask over the rows: True where the row was not skipped."""
        return ~np.isin(self.sample_ids, np.asarray(self.skipped, dtype=str))



def unwritable(exc: OSError, folder: Path) -> bool:
    """``exc`` is a refused write (read-only file system, no permission) in ``folder``, below it
    or in a parent it was being created in."""
    if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM) or not exc.filename:
        return False
    path, folder = Path(os.fsdecode(exc.filename)).resolve(), Path(folder).resolve()
    return path.is_relative_to(folder) or path in folder.parents


# --------------------------------------------------------------------------------------------
# the cache


class FeatureCache(ShardedEntry):
    """One cache entry ``root/<encoder name>/<key>/`` (see the module docstring).

    ``shard_size`` and ``n_rows`` are taken from an existing ``meta.json`` when there is one (an
    entry keeps the shard layout it was started with), otherwise from the arguments
    (``n_rows`` defaults to ``fields["n_rows"]``).
    """

    def __init__(self, root: str | Path, fields: dict, shard_size: int | None = None,
                 n_rows: int | None = None, folder: str | Path | None = None):
        self.fields = _canonical(fields)
        self.key = cache_key(self.fields)
        self.root = Path(root)
        # ``folder``: the entry lives there instead (a chunk of the per-image store, :mod:`.store`)
        self.path = Path(folder) if folder is not None else \
            self.root / _safe_name(str(self.fields.get("encoder", "encoder"))) / self.key
        self.meta_path = fmt.meta_path(self.path)
        self._lay_out(shard_size, n_rows)

    @classmethod
    def to_fill(cls, root: str | Path, entry, shard_size: int | None = None,
                n_rows: int | None = None) -> FeatureCache:
        """The entry the extraction engine fills: the feature store's own object (a chunk it opened,
        :meth:`.store.Recipe.chunk_cache`, so its writes land in the object the store reads; laid
        out here with ``shard_size`` while nothing is on disk yet) or ``(folder, key fields)``
        (folder None: the default folder of those fields under ``root``)."""
        if isinstance(entry, FeatureCache):
            entry._lay_out(shard_size, n_rows)
            return entry
        folder, fields = entry
        return cls(root, fields, shard_size=shard_size, n_rows=n_rows, folder=folder)

    def _lay_out(self, shard_size: int | None, n_rows: int | None) -> None:
        """Layout from ``meta.json`` when there is one, else from the arguments (class docstring)."""
        meta = self._read_meta()
        if n_rows is None:
            n_rows = self.fields.get("n_rows")
        if meta is not None:
            if shard_size is not None and int(shard_size) != meta.shard_size:
                log.info("%s: keeping the entry's shard_size %d (asked for %d)",
                            self.path, meta.shard_size, shard_size)
            if n_rows is not None and int(n_rows) != meta.n_rows:
                raise FeatureCacheError(f"{self.meta_path}: entry holds {meta.n_rows} rows but the "
                                        f"manifest has {n_rows}; delete the folder {self.path}")
            shard_size, n_rows = meta.shard_size, meta.n_rows
        if n_rows is None:
            raise ValueError("FeatureCache needs n_rows (or fields['n_rows']) for a new entry")
        self._set_layout(self.path, n_rows, shard_size or DEFAULT_SHARD_SIZE, "row")
        self.embed_dim = int(self.fields["embed_dim"])

    # ---- layout (the rest: core.shards.ShardedEntry) ------------------------------------------
    @property
    def n_rows(self) -> int:
        return self.n_items

    def partial_path(self, i: int) -> Path:
        return self.path / PARTIAL_NAME.format(i)

    def write_partial(self, i: int, n_done: int, embeddings: np.ndarray, skipped: dict[int, dict],
                      tag: dict, sample_ids: np.ndarray) -> Path:
        """Atomically write the first ``n_done`` rows of shard ``i`` (``embeddings`` (n_done, D),
        ``skipped``: ``{row: record}`` of the skipped rows among them, ``sample_ids``: the
        manifest's); see "Partial shards" in the module docstring."""
        lo, hi = self.shard_bounds(i)
        emb = np.ascontiguousarray(embeddings, dtype=np.float32)
        if not 0 < n_done < hi - lo or emb.shape != (n_done, self.embed_dim):
            raise ValueError(f"partial shard {i}: {n_done} rows of [{lo}, {hi}) and embeddings {emb.shape}")
        header = {"format": CACHE_FORMAT, "key": self.key, "shard": int(i), "rows": int(n_done), "tag": tag,
                  "sample_ids": [str(x) for x in sample_ids[lo:lo + n_done]],
                  "skipped": {str(r): v for r, v in sorted(skipped.items())},
                  "sha256": hashlib.sha256(emb.tobytes()).hexdigest()}
        blob = np.frombuffer(json.dumps(header, sort_keys=True, default=str).encode(), dtype=np.uint8)

        def write(f):
            np.savez(f, embedding=emb, header=blob)

        self.path.mkdir(parents=True, exist_ok=True)
        return write_atomic(self.partial_path(i), write)

    def read_partial(self, i: int, tag: dict, sample_ids: np.ndarray) -> tuple[np.ndarray, dict[int, dict]] | None:
        """``(embeddings, skipped)`` of shard ``i``'s partial file when it validates against this
        entry, ``tag`` and the manifest's ``sample_ids``; else None (an invalid file is deleted,
        with one log line saying why)."""
        path = self.partial_path(i)
        if not path.is_file():
            return None
        lo, hi = self.shard_bounds(i)
        try:
            with np.load(path, allow_pickle=False) as z:
                emb = np.array(z["embedding"], dtype=np.float32)
                header = json.loads(bytes(z["header"]).decode())
            m = int(header["rows"])
            why = None
            if header.get("format") != CACHE_FORMAT or header.get("key") != self.key or int(header["shard"]) != i:
                why = "written for another entry or shard"
            elif _canonical(header.get("tag")) != _canonical(tag):
                why = f"written with {header.get('tag')}, this run uses {tag}"
            elif not 0 < m < hi - lo or emb.shape != (m, self.embed_dim):
                why = f"holds {emb.shape} for {m} rows"
            elif header["sample_ids"] != [str(x) for x in sample_ids[lo:lo + m]]:
                why = "its sample_ids differ from the manifest's"
            elif hashlib.sha256(emb.tobytes()).hexdigest() != header["sha256"]:
                why = "checksum mismatch"
            skipped = {int(r): v for r, v in header.get("skipped", {}).items()}
            if why is None:
                nan = ~np.isfinite(emb).all(axis=1)
                listed = np.zeros(m, dtype=bool)
                listed[[r - lo for r in skipped if lo <= r < lo + m]] = True
                if len(skipped) != int(listed.sum()) or (nan != listed).any() \
                        or not np.isnan(emb[listed]).all():
                    why = "its non-finite rows differ from its skipped rows"
        except Exception as exc:  # noqa: BLE001  (any unreadable file is discarded, never trusted)
            why = f"unreadable ({one_line(exc) or type(exc).__name__})"
        if why is not None:
            log.info("%s: discarding the partial shard (%s); computing shard %d from its first row", path, why, i)
            path.unlink(missing_ok=True)
            return None
        return emb, skipped

    def drop_partial(self, i: int) -> None:
        self.partial_path(i).unlink(missing_ok=True)

    def part_shards(self, num_parts: int, part: int) -> list[int]:
        """The shards that extraction part ``part`` of ``num_parts`` computes: every
        ``num_parts``-th shard from ``part`` on (round robin, so parts stay balanced whatever the
        manifest's order). The parts of one ``num_parts`` cover every shard exactly once."""
        if num_parts < 1 or not 0 <= part < num_parts:
            raise InvalidSetting(f"extract.shard={part} must be in [0, extract.num_shards={num_parts}); "
                             "pick one part per job, e.g. extract.shard=range(N)")
        return list(range(part, self.n_shards, num_parts))

    @contextlib.contextmanager
    def bookkeeping(self):
        """Hold ``<key>.meta.lock`` while ``meta.json`` or ``skipped.csv`` is read and rewritten,
        so that several processes filling different shards of one entry never lose each
        other's records (each holds it for milliseconds; a dead holder is cleared after 2 min)."""
        with FileLock(self.path.parent / f"{self.key}.meta.lock", timeout=None, stale_after=120):
            yield

    def settled(self) -> bool:
        """Complete, and ``meta.json`` / ``skipped.csv`` hold exactly what the bookkeeping of an
        extraction would write: reading the entry needs no lock and no write access (a
        read-only cache, a shared cache owned by someone else)."""
        if self.missing_shards() or not self.meta_path.is_file():
            return False
        try:
            if set(self._records) != set(range(self.n_shards)):  # a shard the meta does not record
                return False
            if self.meta_path.read_bytes() != json_bytes(self.meta("complete")):
                return False
            listed = self.read_skipped(complete_only=True)
            on_disk = self.skipped_path.read_bytes() if self.skipped_path.exists() else None
            return on_disk == (skipped_csv_bytes(listed) if listed else None)
        except OSError:
            return False

    # ---- meta -----------------------------------------------------------------------------
    def _read_meta(self) -> ShardedMeta | None:
        try:
            raw = fmt.read_meta(self.path)
            form = None if raw is None else raw.get("format")
        except (OSError, ValueError) as exc:
            raise FeatureCacheError(f"{self.meta_path}: unreadable ({one_line(exc)}); delete the folder "
                                    f"{self.path} to rebuild this entry") from None
        self._records = {}
        if raw is None:
            return None
        if form != CACHE_FORMAT:
            raise FeatureCacheError(f"{self.meta_path}: written in cache format {form!r}, this package uses "
                                    f"format {CACHE_FORMAT}; not reusing it, delete the folder {self.path}")
        if raw.get("key") != self.key or _canonical(raw.get("fields")) != self.fields:
            raise FeatureCacheError(f"{self.meta_path}: records other key fields than key {self.key}; "
                                    f"delete the folder {self.path} to rebuild this entry")
        try:
            meta = ShardedMeta.parse(raw)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise FeatureCacheError(f"{self.meta_path}: malformed ({one_line(exc)}); delete the folder "
                                    f"{self.path} to rebuild this entry") from None
        self._records = {i: r.to_json() for i, r in meta.recorded().items()}
        return meta

    def _shard_records(self) -> list[dict]:
        """One record per complete shard, sorted by index. Shards written by a run killed before
        it recorded them are hashed now (they are whole: they only appear by an atomic rename)."""
        complete = self.complete_shards()
        unrecorded = [i for i in complete if i not in self._records]
        if unrecorded:
            skipped = self.read_skipped(complete_only=False)
            for i in unrecorded:
                lo, hi = self.shard_bounds(i)
                path = self.shard_path(i)
                try:
                    rows = pq.ParquetFile(path).metadata.num_rows
                except Exception as exc:  # noqa: BLE001
                    raise FeatureCacheError(f"{path}: unreadable shard ({one_line(exc) or type(exc).__name__}); "
                                            "delete this file and re-run extraction to recompute it") from None
                self._records[i] = {"file": path.name, "rows": int(rows), "sha256": file_sha256(path),
                                    "skipped": sum(lo <= r < hi for r in skipped)}
        keep = set(complete)
        self._records = {i: r for i, r in self._records.items() if i in keep}
        return [self._records[i] for i in sorted(self._records)]

    def meta(self, status: str | None = None) -> dict:
        return self.as_meta(status).to_json()

    def as_meta(self, status: str | None = None) -> ShardedMeta:
        """This entry's ``meta.json`` as the entry format types it (:class:`.entry.ShardedMeta`)."""
        status = status or ("complete" if self.is_complete else "partial")
        return ShardedMeta(self.key, self.fields, self.shard_size, self.n_rows, self.n_shards, self.embed_dim,
                           status, tuple(ShardRecord(**r) for r in self._shard_records()), format=CACHE_FORMAT)

    def write_meta(self, status: str | None = None) -> None:
        """Write ``meta.json`` atomically (skipped when the bytes would not change).

        Shard records written meanwhile by other processes filling other parts are taken from
        the file on disk rather than re-hashed."""
        if self.meta_path.exists():
            mine = self._records
            self._read_meta()
            self._records.update(mine)
        self._write_meta_bytes(json_bytes(self.meta(status)))

    # ---- skipped rows -----------------------------------------------------------------------
    @property
    def skipped_path(self) -> Path:
        return self.path / SKIPPED_NAME

    def read_skipped(self, complete_only: bool = True) -> dict[int, dict]:
        """``skipped.csv`` as ``{row: {"sample_id", "row", "path", "error"}}``.

        With ``complete_only`` only rows of complete shards are returned: a killed run may have
        listed the rows of the shard it was about to write; that shard is recomputed on resume.
        """
        if not self.skipped_path.exists():
            return {}
        out = parse_skipped_csv(self.skipped_path, self.n_rows)
        if complete_only:
            have = set(self.complete_shards())
            out = {r: v for r, v in out.items() if r // self.shard_size in have}
        return out

    def write_skipped(self, records: dict[int, dict]) -> None:
        """Write ``skipped.csv`` atomically (sorted by row); no records -> no file."""
        if not records:
            if self.skipped_path.exists():
                self.skipped_path.unlink()
            return
        data = skipped_csv_bytes(records)
        if self.skipped_path.exists() and self.skipped_path.read_bytes() == data:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomic(self.skipped_path, lambda f: f.write(data))

    def drop_shards(self, shards: Iterable[int]) -> None:
        """Delete shard files (they become missing and are recomputed by the next extraction),
        then drop their rows from ``skipped.csv`` and their records from ``meta.json``."""
        with self.bookkeeping():
            self._unlink_shards(shards)
            self.write_skipped(self.read_skipped(complete_only=True))
            self.write_meta()

    # ---- shards ---------------------------------------------------------------------------
    def _schema(self) -> pa.Schema:
        key_json = json.dumps({"key": self.key, "fields": self.fields, "shard_size": self.shard_size},
                              sort_keys=True)
        return pa.schema([pa.field("sample_id", pa.string(), nullable=False),
                          pa.field("embedding", pa.list_(pa.float32(), self.embed_dim), nullable=False)],
                         metadata={PARQUET_META_KEY: key_json.encode()})

    def write_shard(self, i: int, sample_ids: Iterable[str], embeddings: np.ndarray,
                    skipped_rows: Iterable[int] = ()) -> Path:
        """Write shard ``i`` atomically and record its checksum in ``meta.json``.

        ``sample_ids`` must be exactly its manifest rows. ``skipped_rows`` (manifest row indices
        inside the shard, already listed in ``skipped.csv``) are stored as all-NaN rows; any other
        non-finite value is refused.
        """
        lo, hi = self.shard_bounds(i)
        ids = [str(s) for s in sample_ids]
        emb = np.array(embeddings, dtype=np.float32, order="C", copy=True)
        if len(ids) != hi - lo or emb.shape != (hi - lo, self.embed_dim):
            raise ValueError(f"shard {i} holds rows [{lo}, {hi}): got {len(ids)} ids and embeddings "
                             f"of shape {emb.shape}, expected ({hi - lo}, {self.embed_dim})")
        skip = sorted({int(r) for r in skipped_rows})
        if any(not lo <= r < hi for r in skip):
            raise ValueError(f"shard {i} holds rows [{lo}, {hi}): skipped rows {skip} fall outside it")
        emb[[r - lo for r in skip]] = np.nan
        finite = np.isfinite(emb).all(axis=1)
        finite[[r - lo for r in skip]] = True
        if not finite.all():
            bad = int(np.flatnonzero(~finite)[0])
            raise FeatureCacheError(f"encoder '{self.fields.get('encoder')}' produced non-finite features "
                                    f"for sample_id {str(ids[bad])!r} (manifest row {lo + bad}); not caching them")
        values = pa.array(emb.reshape(-1), type=pa.float32())
        table = pa.Table.from_arrays(
            [pa.array(ids, type=pa.string()), pa.FixedSizeListArray.from_arrays(values, self.embed_dim)],
            schema=self._schema())
        data = parquet_bytes(table, len(ids), _WRITE_OPTIONS)
        if not self.meta_path.exists():
            self.write_meta("partial")
        path, sha = self._write_shard_bytes(i, data)
        self._records[i] = {"file": path.name, "rows": len(ids), "sha256": sha, "skipped": len(skip)}
        self.write_meta()
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
        check_shard_ids(self.shard_path(i), *self.shard_bounds(i), got, manifest_ids)

    def bad_shards(self, shards: Iterable[int]) -> dict[int, str]:
        """``{i: why}`` for the present shards among ``shards`` that are not the file ``meta.json``
        recorded (:func:`shard_mismatch`); a shard the meta does not record is not checked."""
        out = {}
        for i in shards:
            rec = self._records.get(int(i))
            why = shard_mismatch(self.shard_path(i), rec and rec["sha256"]) if self.shard_path(i).exists() else None
            if why is not None:
                out[int(i)] = why
        return out

    def done_ids(self, manifest: pd.DataFrame | None = None, shards: Iterable[int] | None = None) -> set[str]:
        """The sample_ids held by the complete shards (checked against ``manifest`` when given);
        ``shards``: only those (a listing taken once by a caller while other parts may add shards)."""
        ids = None if manifest is None else _manifest_ids(manifest)
        out: set[str] = set()
        for i in self.complete_shards() if shards is None else shards:
            got = self._read_shard(i, ("sample_id",)).column("sample_id").to_numpy(zero_copy_only=False)
            got = got.astype(str)
            self._check_ids(i, got, ids)
            out.update(got.tolist())
        return out

    def as_entry(self) -> fmt.Sharded:
        """This entry as the entry format reads it (:class:`.entry.Sharded`), with the shard
        records this object holds."""
        return fmt.Sharded(self.path, self.as_meta())

    def read(self, manifest: pd.DataFrame) -> np.ndarray:
        """Features (N, D) float32, row ``j`` belonging to ``manifest`` row ``j``: the manifest checked
        against the entry's key fields (:func:`.key.check_manifest`), then read strictly
        (:meth:`.entry.Sharded.read_rows`)."""
        return self.as_entry().read_rows(check_manifest(self.path, self.fields, self.n_rows, manifest))

    def __repr__(self) -> str:
        return (f"FeatureCache({str(self.path)!r}, rows={self.n_rows}, shards="
                f"{self.n_shards - len(self.missing_shards())}/{self.n_shards})")
