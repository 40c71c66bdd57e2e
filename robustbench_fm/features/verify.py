"""Re-check feature-cache entries against their ``meta.json`` (and a manifest).

``verify_entry(path, manifest=None)`` opens the entry (:mod:`.entry`) and runs the checks of its
format. A sharded entry (a chunk or a keyed entry): every shard is re-hashed and compared with the
SHA-256 and row count recorded in ``meta.json`` when it was written; also the cache format, that
the folder's key is the hash of the recorded key fields, each shard's row count, sample_ids
(unique; equal to the manifest's rows when a manifest is given, with the manifest's locator hash),
key, embedding size, and that the non-finite rows are exactly those listed in ``skipped.csv``.
Missing shards and stray parquet files are problems; temp files left by killed writes are
reported as notes only (they are never read). A view: its rows, key and chunks. An array (SPAR's
frozen tokens): its key, shape, dtype and SHA-256 (an array of the earlier layout, which records
none: that its file is the whole array its header describes). Nothing is printed or modified: the
caller gets a :class:`VerifyReport` whose ``problems`` are one line each, naming the file.

``verify_cache(root)`` does this for every entry under a cache root.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from ..core.shards import SHARD_NAME, file_sha256, shard_index
from ..core.text import one_line
from ..data import manifest as mf
from . import entry as fmt
from .entry import (
    PARQUET_META_KEY,
    SKIPPED_NAME,
    TEMP_GLOB,
    VIEW_NAME,
    FeatureCacheError,
    embedding_matrix,
    parse_skipped_csv,
)
from .key import manifest_hash
from .recipe import canonical as _canonical
from .recipe import fields_key as cache_key

__all__ = ["VerifyReport", "verify_cache", "verify_entry"]

#: At most this many missing shards are named one per line; the rest are counted in one line.
_MAX_NAMED = 10


@dataclass
class VerifyReport:
    """What :func:`verify_entry` found for one cache entry.

    ``ok`` is True when there is no problem (a partial entry is not ok: its missing shards are
    problems). ``notes`` are informational (temp files of killed writes, stale skipped rows of a
    shard that will be recomputed) and do not affect ``ok``.
    """

    path: Path
    ok: bool
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    n_rows: int = 0
    n_shards: int = 0
    n_complete: int = 0
    n_skipped: int = 0
    key: str | None = None
    encoder: str | None = None

    def summary(self) -> str:
        """One line: ``<path>: OK|N problems, <n_complete>/<n_shards> shards, <n_rows> rows[, k skipped]``."""
        state = "OK" if self.ok else f"{len(self.problems)} problem{'s' * (len(self.problems) != 1)}"
        extra = f", {self.n_skipped} skipped" if self.n_skipped else ""
        return (f"{self.path}: {state}, {self.n_complete}/{self.n_shards} shards, {self.n_rows} rows{extra}"
                f"{f', {len(self.notes)} notes' if self.notes else ''}")


def _manifest_frame(manifest) -> tuple[pd.DataFrame, str]:
    if isinstance(manifest, pd.DataFrame):
        return manifest.reset_index(drop=True), "the given manifest"
    return mf.read(manifest).reset_index(drop=True), str(manifest)


def verify_entry(path: str | Path, manifest: pd.DataFrame | str | Path | None = None) -> VerifyReport:
    """Re-check one cache entry folder ``<root>/<encoder>/<key>`` (see the module docstring), or an
    array file of the earlier layout.

    ``manifest`` (a DataFrame, or a manifest CSV/parquet path read with
    :func:`robustbench_fm.data.manifest.read`) adds the checks that the entry was built for it.
    """
    path = Path(path)
    rep = VerifyReport(path=path, ok=False)
    problems, notes = rep.problems, rep.notes
    if path.suffix == ".npy" and path.is_file():
        return _verify_array(fmt.Array(path, None), rep)
    if not path.is_dir():
        problems.append(f"{path}: not a folder; pass a cache entry folder <cache root>/<encoder>/<key>")
        return rep
    for tmp in sorted(path.glob(TEMP_GLOB)):
        notes.append(f"{tmp}: temp file of a killed (or running) write; never read, safe to delete "
                     "when no extraction is running")
    meta_path = fmt.meta_path(path)
    try:
        raw = fmt.read_meta(path)
    except (OSError, ValueError) as exc:
        problems.append(f"{meta_path}: unreadable ({one_line(exc)}); delete the folder {path} and re-run "
                        "extraction")
        return rep
    if raw is None:
        problems.append(f"{meta_path}: missing; this folder is not a usable cache entry, delete it and re-run "
                        "extraction")
        return rep
    try:
        entry = fmt.entry_of(path, raw, strict=True)
    except FeatureCacheError as exc:  # a format this package does not read
        problems.append(str(exc))
        return rep
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        what = path / VIEW_NAME if raw.get("format") == fmt.VIEW_FORMAT else meta_path
        problems.append(f"{what}: malformed ({one_line(exc)}); delete the folder {path} and re-run "
                        "extraction")
        return rep
    check = {fmt.CHUNK: _verify_sharded, fmt.KEYED: _verify_sharded, fmt.VIEW: _verify_view,
             fmt.ARRAY: _verify_array_entry}[entry.kind]
    return check(entry, rep, manifest)


# ------------------------------------------------------------------ sharded entries

def _verify_sharded(entry: fmt.Sharded, rep: VerifyReport, manifest) -> VerifyReport:
    """A chunk or a keyed entry: its meta, then each shard, then what is missing."""
    meta, path = entry.meta, entry.path
    rep.key, rep.n_rows, rep.n_shards = meta.key, meta.n_rows, meta.n_shards
    rep.encoder = meta.fields.get("encoder") if isinstance(meta.fields, dict) else None
    n_shards = _check_layout(entry, rep)
    man_ids = _check_manifest(entry, rep, manifest) if manifest is not None else None
    skipped: dict[int, dict] = {}
    if entry.skipped_path.exists():
        try:
            skipped = parse_skipped_csv(entry.skipped_path, meta.n_rows)
        except FeatureCacheError as exc:
            rep.problems.append(str(exc))
    recorded = meta.recorded()
    seen_ids: dict[str, int] = {}
    missing = []
    for i in range(n_shards):
        if not entry.shard_path(i).exists():
            missing.append(i)
            if i in recorded:
                rep.problems.append(f"{entry.shard_path(i)}: missing although meta.json records it (deleted?); "
                                    "re-run extraction to recompute it")
            continue
        _check_shard(entry, i, recorded.get(i), skipped, seen_ids, man_ids, rep)
    _report_missing(entry, [i for i in missing if i not in recorded], rep)
    stale = sorted(r for r in skipped if r // meta.shard_size in set(missing))
    if stale:
        rep.notes.append(f"{entry.skipped_path}: lists {len(stale)} rows of shards not written yet (a killed run); "
                         "they are recomputed on resume")
    if not missing and meta.status != "complete":
        rep.notes.append(f"{fmt.meta_path(path)}: status {meta.status!r} though every shard is present; re-run "
                         "extraction to finalise it")
    rep.ok = not rep.problems
    return rep


def _check_layout(entry: fmt.Sharded, rep: VerifyReport) -> int:
    """The key, the folder's name, the shard count and stray files; -> the number of shards."""
    meta, path, problems = entry.meta, entry.path, rep.problems
    meta_path = fmt.meta_path(path)
    if cache_key(_canonical(meta.fields)) != meta.key:
        problems.append(f"{meta_path}: key {meta.key} is not the hash of its key fields ({cache_key(meta.fields)}); "
                        f"the file was edited or is foreign, delete the folder {path}")
    if path.name != meta.key:
        problems.append(f"{meta_path}: records key {meta.key} but lies in folder {path.name}; delete the folder {path}")
    n_shards = meta.n_shards
    if -(-meta.n_rows // meta.shard_size) != n_shards:
        problems.append(f"{meta_path}: n_shards {n_shards} does not fit n_rows {meta.n_rows} / shard_size "
                        f"{meta.shard_size}; delete the folder {path}")
        n_shards = rep.n_shards = -(-meta.n_rows // meta.shard_size)
    for p in sorted(path.glob("*.parquet")):  # stray parquet files
        i = shard_index(p.name)
        if i is None or i >= n_shards:
            problems.append(f"{p}: not a shard of this entry ({n_shards} shards); load_features would read "
                            "it, delete it")
    for i in sorted(meta.recorded()):
        if i >= n_shards:
            problems.append(f"{meta_path}: records shard {i} but the entry has {n_shards} shards; delete the "
                            f"folder {path}")
    return n_shards


def _check_manifest(entry: fmt.Sharded, rep: VerifyReport, manifest) -> np.ndarray | None:
    """That the entry was built for ``manifest``; -> the manifest's sample_ids when they line up."""
    meta, meta_path = entry.meta, fmt.meta_path(entry.path)
    frame, source = _manifest_frame(manifest)
    want = meta.fields.get("manifest_hash") if isinstance(meta.fields, dict) else None
    got = manifest_hash(frame)
    if want != got:
        rep.problems.append(f"{meta_path}: built for manifest hash {want}, {source} hashes to {got} (rows "
                            "added, removed, moved or reordered); this entry does not hold its features")
    if len(frame) != meta.n_rows:
        rep.problems.append(f"{meta_path}: {meta.n_rows} rows, {source} has {len(frame)}")
    if "sample_id" in frame.columns and len(frame) == meta.n_rows:
        return frame["sample_id"].astype(str).to_numpy()
    return None


def _check_shard(entry: fmt.Sharded, i: int, rec, skipped: dict, seen_ids: dict, man_ids, rep: VerifyReport) -> None:
    """Shard ``i`` (present) against its record, the key, the manifest and ``skipped.csv``."""
    problems, sp = rep.problems, entry.shard_path(i)
    lo, hi = entry.shard_bounds(i)
    rep.n_complete += 1
    shard_skipped = {r: v for r, v in skipped.items() if lo <= r < hi}
    rep.n_skipped += len(shard_skipped)
    try:
        sha = file_sha256(sp)
    except OSError as exc:
        problems.append(f"{sp}: unreadable ({one_line(exc)}); delete it and re-run extraction")
        return
    if rec is None:
        problems.append(f"{sp}: present but not recorded in meta.json (a run was killed right after "
                        "writing it); re-run extraction to record it")
    elif rec.sha256 != sha:
        problems.append(f"{sp}: sha256 {sha[:16]} does not match {rec.sha256[:16]} recorded in meta.json "
                        "(changed or corrupted after it was written); delete it and re-run extraction")
    try:
        table = pq.read_table(sp, memory_map=False)
        ids = table.column("sample_id").to_numpy(zero_copy_only=False).astype(str)
        emb = embedding_matrix(table.column("embedding"), sp, entry.meta.embed_dim)
        schema_meta = (table.schema.metadata or {}).get(PARQUET_META_KEY)
    except FeatureCacheError as exc:
        problems.append(str(exc))
        return
    except Exception as exc:  # noqa: BLE001  (any pyarrow failure means a bad file)
        problems.append(f"{sp}: unreadable parquet ({one_line(exc) or type(exc).__name__}); delete it and "
                        "re-run extraction")
        return
    if len(ids) != hi - lo:
        problems.append(f"{sp}: {len(ids)} rows, expected {hi - lo} (manifest rows {lo}-{hi - 1}); delete it "
                        "and re-run extraction")
        return
    if rec is not None and rec.rows != len(ids):
        problems.append(f"{sp}: {len(ids)} rows but meta.json records {rec.rows}")
    try:
        shard_key = json.loads(schema_meta)["key"] if schema_meta else None
    except (ValueError, KeyError, TypeError):
        shard_key = "unreadable"
    if shard_key != entry.meta.key:
        problems.append(f"{sp}: written for key {shard_key}, not {entry.meta.key} (a foreign file); delete it and "
                        "re-run extraction")
    _check_ids(sp, lo, ids, seen_ids, man_ids, problems)
    _check_nan_rows(entry, sp, lo, ids, emb, shard_skipped, problems)
    if rec is not None and rec.skipped != len(shard_skipped):
        problems.append(f"{sp}: meta.json records {rec.skipped} skipped rows, {SKIPPED_NAME} lists "
                        f"{len(shard_skipped)}")


def _check_ids(sp: Path, lo: int, ids: np.ndarray, seen_ids: dict, man_ids, problems: list) -> None:
    """The shard's sample_ids: unique across the entry, the manifest's rows when given."""
    for j, sid in enumerate(ids.tolist()):
        if sid in seen_ids:
            problems.append(f"{sp}: row {lo + j} repeats sample_id {sid!r} of row {seen_ids[sid]}; delete it "
                            "and re-run extraction")
            break
        seen_ids[sid] = lo + j
    if man_ids is not None:
        bad = np.flatnonzero(ids != man_ids[lo:lo + len(ids)])
        if len(bad):
            j = int(bad[0])
            problems.append(f"{sp}: row {lo + j} holds sample_id {str(ids[j])!r} but the manifest has "
                            f"{str(man_ids[lo + j])!r}")


def _check_nan_rows(entry: fmt.Sharded, sp: Path, lo: int, ids: np.ndarray, emb: np.ndarray,
                    shard_skipped: dict, problems: list) -> None:
    """The shard's non-finite rows are exactly its rows ``skipped.csv`` lists, with their sample_ids."""
    nonfinite = set((lo + np.flatnonzero(~np.isfinite(emb).all(axis=1))).tolist())
    listed = set(shard_skipped)
    for r in sorted(nonfinite - listed)[:1]:
        problems.append(f"{sp}: row {r} (sample_id {str(ids[r - lo])!r}) holds non-finite features but is not "
                        f"listed in {SKIPPED_NAME} ({len(nonfinite - listed)} such rows); delete it and re-run "
                        "extraction")
    for r in sorted(listed - nonfinite)[:1]:
        problems.append(f"{entry.skipped_path}: lists row {r} (sample_id {shard_skipped[r]['sample_id']!r}) "
                        f"but {sp.name} holds finite features for it; delete the folder {entry.path}")
    for r in sorted(listed):
        if shard_skipped[r]["sample_id"] != ids[r - lo]:
            problems.append(f"{entry.skipped_path}: row {r} lists sample_id "
                            f"{shard_skipped[r]['sample_id']!r} but {sp.name} holds {str(ids[r - lo])!r}; delete "
                            f"the folder {entry.path}")
            break


def _report_missing(entry: fmt.Sharded, unrecorded: list[int], rep: VerifyReport) -> None:
    for i in unrecorded[:_MAX_NAMED]:
        lo, hi = entry.shard_bounds(i)
        rep.problems.append(f"{entry.path / SHARD_NAME.format(i)}: missing (manifest rows {lo}-{hi - 1}); the entry "
                            "is incomplete, run extraction again to resume")
    if len(unrecorded) > _MAX_NAMED:
        rep.problems.append(f"{entry.path}: {len(unrecorded) - _MAX_NAMED} more shards missing; run extraction "
                            "again to resume")


# ------------------------------------------------------------------ views

def _verify_view(entry: fmt.View, rep: VerifyReport, manifest) -> VerifyReport:
    """A manifest's view (:mod:`.store`): its rows, key, and that every row names an existing row of
    a complete chunk holding that image; notes say which versions each chunk's rows were made with."""
    problems, notes, path = rep.problems, rep.notes, entry.path
    fields = entry.meta.fields
    try:
        rep.n_rows, rep.key, rep.encoder = entry.meta.n_rows, entry.meta.key, fields.get("encoder")
        view = entry.rows()
    except (OSError, KeyError, TypeError, ValueError, AttributeError) as exc:
        problems.append(f"{path / VIEW_NAME}: unreadable ({one_line(exc)}); delete the folder {path} and "
                        "re-run extraction (the features are kept in the chunks)")
        return rep
    if f"v-{cache_key(_canonical(fields))}" != path.name:
        problems.append(f"{fmt.meta_path(path)}: its key fields hash to v-{cache_key(fields)}, not {path.name}; "
                        f"delete the folder {path}")
    if len(view) != rep.n_rows or view["sample_id"].duplicated().any():
        problems.append(f"{path / VIEW_NAME}: {len(view)} rows (meta.json: {rep.n_rows}) or a repeated "
                        f"sample_id; delete the folder {path}")
    if manifest is not None:
        frame, _ = _manifest_frame(manifest)
        if view["sample_id"].astype(str).tolist() != frame["sample_id"].astype(str).tolist():
            problems.append(f"{path}: its sample_ids are not the manifest's rows in order; this view was "
                            "made for another manifest")
    for folder, part in view.groupby("chunk", sort=False):
        folder = Path(folder)
        try:
            chunk = fmt.open_chunk(folder)
            if chunk is None:
                problems.append(f"{path}: chunk {folder} is missing; delete the view folder and re-run extraction")
                continue
            ids = np.concatenate([pq.read_table(sp, columns=["sample_id"]).column(0).to_numpy(zero_copy_only=False)
                                  for sp in sorted(folder.glob("shard-*.parquet"))] or [np.array([], object)])
        except (OSError, ValueError, FeatureCacheError) as exc:
            problems.append(f"{fmt.meta_path(folder)}: unreadable ({one_line(exc)})")
            continue
        _check_view_chunk(path, folder, chunk, part, ids, problems, notes)
    rep.ok = not problems
    return rep


def _check_view_chunk(path: Path, folder: Path, chunk: fmt.Sharded, part: pd.DataFrame, ids: np.ndarray,
                      problems: list, notes: list) -> None:
    if len(ids) != chunk.meta.n_rows:
        problems.append(f"{folder}: incomplete chunk ({len(ids)} of {chunk.meta.n_rows} rows); run extraction "
                        "again to resume")
        return
    rows = part["row"].to_numpy()
    if chunk.kind == fmt.KEYED:
        pass  # an adopted entry of the per-manifest layout: its sample_ids are its manifest's
    elif (rows >= len(ids)).any() or (ids[rows].astype(str) != part["image_id"].astype(str).to_numpy()).any():
        problems.append(f"{path}: rows of chunk {folder.name} do not hold the images the view names; delete "
                        f"the view folder {path} and re-run extraction")
    f = chunk.meta.fields
    made = f.get("made_with") or {"package": f.get("package_version"), "libraries": f.get("library_versions")}
    libs = ", ".join(f"{k} {v}" for k, v in sorted((made.get("libraries") or {}).items()))
    notes.append(f"{len(part)} rows from chunk {folder.name}, made with robustbench_fm {made.get('package')}"
                 f"{'; ' + libs if libs else ''}")


# ------------------------------------------------------------------ arrays

def _verify_array_entry(entry: fmt.Array, rep: VerifyReport, manifest=None) -> VerifyReport:
    """An array entry: its key, then its file against the recorded shape, dtype and SHA-256."""
    meta, path = entry.meta, entry.path
    rep.key, rep.encoder = meta.key, meta.fields.get("encoder") if isinstance(meta.fields, dict) else None
    if cache_key(_canonical(meta.fields)) != meta.key or path.name != meta.key:
        rep.problems.append(f"{fmt.meta_path(path)}: key {meta.key} is not the hash of its key fields "
                            f"({cache_key(meta.fields)}) or not its folder's name; delete the folder {path}")
    return _verify_array(entry, rep)


def _verify_array(entry: fmt.Array, rep: VerifyReport) -> VerifyReport:
    """The array file: readable, as long as its header says and, with a ``meta.json``, the shape,
    dtype and SHA-256 it records. A bare ``.npy`` of the earlier layout records no checksum."""
    problems, f = rep.problems, entry.file
    rep.n_shards = 1
    if not f.is_file():
        problems.append(f"{f}: missing; delete the folder {entry.path} so that the array is made again")
        rep.ok = False
        return rep
    rep.n_complete = 1
    try:
        arr = np.load(f, mmap_mode="r")
        rep.n_rows = int(arr.shape[0]) if arr.ndim else 1
        size = f.stat().st_size
        want = arr.offset + arr.nbytes
        shape, dtype = tuple(arr.shape), arr.dtype.str
        del arr
    except (OSError, ValueError) as exc:
        problems.append(f"{f}: unreadable array ({one_line(exc)}): corrupted or truncated; delete "
                        f"{entry.path} so that it is made again")
        rep.ok = False
        return rep
    if size != want:
        problems.append(f"{f}: {size} bytes, its header describes {want}: corrupted or truncated; delete "
                        f"{entry.path} so that it is made again")
    if entry.meta is None:
        rep.notes.append(f"{f}: an array of the earlier layout (no meta.json): no checksum to compare")
    elif (shape, dtype) != (entry.meta.shape, entry.meta.dtype):
        problems.append(f"{f}: holds {dtype} {shape}, meta.json records {entry.meta.dtype} {entry.meta.shape}; "
                        f"delete the folder {entry.path}")
    else:
        sha = file_sha256(f)
        if sha != entry.meta.sha256:
            problems.append(f"{f}: sha256 {sha[:16]} does not match {entry.meta.sha256[:16]} recorded in meta.json "
                            f"(changed or corrupted after it was written); delete the folder {entry.path}")
    rep.ok = not problems
    return rep


# ------------------------------------------------------------------ a cache

def verify_cache(root: str | Path) -> list[VerifyReport]:
    """:func:`verify_entry` for every entry (a folder holding ``meta.json`` or shards, an array file
    of the earlier layout) under ``root``, sorted by path; ``[]`` when there is none. ``root`` may
    itself be an entry."""
    root = Path(root)
    if not root.is_dir():
        return [VerifyReport(path=root, ok=False, problems=[f"{root}: not a folder; pass a feature cache root"])]
    return [verify_entry(p) for p in fmt.entries_under(root)]

