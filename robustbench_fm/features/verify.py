"""Re-check feature-cache entries against their ``meta.json`` (and a manifest).

``verify_entry(path, manifest=None)`` re-hashes every shard and compares it with the SHA-256
and row count recorded in ``meta.json`` when the shard was written; it also checks the cache
format, that the folder's key is the hash of the recorded key fields, each shard's row count,
sample_ids (unique; equal to the manifest's rows when a manifest is given, with the manifest's
locator hash), key, embedding size, and that the non-finite rows are exactly those listed in
``skipped.csv``. Missing shards and stray parquet files are problems; temp files left by killed
writes are reported as notes only (they are never read). Nothing is printed or modified:
the caller gets a :class:`VerifyReport` whose ``problems`` are one line each, naming the file.

``verify_cache(root)`` does this for every entry under a cache root.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from ..core.shards import META_NAME, SHARD_NAME, file_sha256, shard_index
from ..core.text import one_line
from ..data import manifest as mf
from . import view as views
from .cache import (
    CACHE_FORMAT,
    PARQUET_META_KEY,
    SKIPPED_NAME,
    TEMP_GLOB,
    FeatureCacheError,
    _embedding_matrix,
    manifest_hash,
    parse_skipped_csv,
)
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
    """Re-check one cache entry folder ``<root>/<encoder>/<key>`` (see the module docstring).

    ``manifest`` (a DataFrame, or a manifest CSV/parquet path read with
    :func:`robustbench_fm.data.manifest.read`) adds the checks that the entry was built for it.
    """
    path = Path(path)
    rep = VerifyReport(path=path, ok=False)
    problems, notes = rep.problems, rep.notes
    if not path.is_dir():
        problems.append(f"{path}: not a folder; pass a cache entry folder <cache root>/<encoder>/<key>")
        return rep
    for tmp in sorted(path.glob(TEMP_GLOB)):
        notes.append(f"{tmp}: temp file of a killed (or running) write; never read, safe to delete "
                     "when no extraction is running")

    meta_path = path / META_NAME
    if not meta_path.exists():
        problems.append(f"{meta_path}: missing; this folder is not a usable cache entry, delete it and re-run "
                        "extraction")
        return rep
    try:
        meta = json.loads(meta_path.read_text())
        if not isinstance(meta, dict):
            raise ValueError(f"top level is {type(meta).__name__}, expected an object")
    except (OSError, ValueError) as exc:
        problems.append(f"{meta_path}: unreadable ({one_line(exc)}); delete the folder {path} and re-run "
                        "extraction")
        return rep
    fmt = meta.get("format")
    if fmt == views.VIEW_FORMAT:
        return _verify_view(path, meta, manifest, rep)
    if fmt != CACHE_FORMAT:
        problems.append(f"{meta_path}: cache format {fmt!r}, this package reads format {CACHE_FORMAT}; it is "
                        f"never reused (extraction makes a new entry), delete the folder {path}")
        return rep
    try:
        fields = meta["fields"]
        key = str(meta["key"])
        shard_size, n_rows, n_shards = int(meta["shard_size"]), int(meta["n_rows"]), int(meta["n_shards"])
        embed_dim = int(meta["embed_dim"])
        recorded = {}
        for rec in meta["shards"]:
            i = shard_index(rec["file"])
            if i is None:
                raise ValueError(f"bad shard file name {rec['file']!r}")
            recorded[i] = {"rows": int(rec["rows"]), "sha256": str(rec["sha256"]),
                           "skipped": int(rec.get("skipped", 0))}
        if shard_size < 1 or n_rows < 0:
            raise ValueError(f"shard_size {shard_size}, n_rows {n_rows}")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        problems.append(f"{meta_path}: malformed ({one_line(exc)}); delete the folder {path} and re-run "
                        "extraction")
        return rep
    rep.key, rep.n_rows, rep.n_shards = key, n_rows, n_shards
    rep.encoder = fields.get("encoder") if isinstance(fields, dict) else None
    if cache_key(_canonical(fields)) != key:
        problems.append(f"{meta_path}: key {key} is not the hash of its key fields ({cache_key(fields)}); "
                        f"the file was edited or is foreign, delete the folder {path}")
    if path.name != key:
        problems.append(f"{meta_path}: records key {key} but lies in folder {path.name}; delete the folder {path}")
    if -(-n_rows // shard_size) != n_shards:
        problems.append(f"{meta_path}: n_shards {n_shards} does not fit n_rows {n_rows} / shard_size "
                        f"{shard_size}; delete the folder {path}")
        n_shards = rep.n_shards = -(-n_rows // shard_size)

    man_ids = None
    if manifest is not None:
        frame, source = _manifest_frame(manifest)
        want = fields.get("manifest_hash") if isinstance(fields, dict) else None
        got = manifest_hash(frame)
        if want != got:
            problems.append(f"{meta_path}: built for manifest hash {want}, {source} hashes to {got} (rows "
                            "added, removed, moved or reordered); this entry does not hold its features")
        if len(frame) != n_rows:
            problems.append(f"{meta_path}: {n_rows} rows, {source} has {len(frame)}")
        if "sample_id" in frame.columns and len(frame) == n_rows:
            man_ids = frame["sample_id"].astype(str).to_numpy()

    skipped: dict[int, dict] = {}
    if (path / SKIPPED_NAME).exists():
        try:
            skipped = parse_skipped_csv(path / SKIPPED_NAME, n_rows)
        except FeatureCacheError as exc:
            problems.append(str(exc))

    # stray parquet files (load_features(entry) would read them)
    for p in sorted(path.glob("*.parquet")):
        i = shard_index(p.name)
        if i is None or i >= n_shards:
            problems.append(f"{p}: not a shard of this entry ({n_shards} shards); load_features would read "
                            "it, delete it")
    for i in sorted(recorded):
        if i >= n_shards:
            problems.append(f"{meta_path}: records shard {i} but the entry has {n_shards} shards; delete the "
                            f"folder {path}")

    seen_ids: dict[str, int] = {}
    missing = []
    for i in range(n_shards):
        lo, hi = i * shard_size, min((i + 1) * shard_size, n_rows)
        sp = path / SHARD_NAME.format(i)
        if not sp.exists():
            missing.append(i)
            if i in recorded:
                problems.append(f"{sp}: missing although meta.json records it (deleted?); re-run extraction to "
                                "recompute it")
            continue
        rep.n_complete += 1
        shard_skipped = {r: v for r, v in skipped.items() if lo <= r < hi}
        rep.n_skipped += len(shard_skipped)
        rec = recorded.get(i)
        try:
            sha = file_sha256(sp)
        except OSError as exc:
            problems.append(f"{sp}: unreadable ({one_line(exc)}); delete it and re-run extraction")
            continue
        if rec is None:
            problems.append(f"{sp}: present but not recorded in meta.json (a run was killed right after "
                            "writing it); re-run extraction to record it")
        elif rec["sha256"] != sha:
            problems.append(f"{sp}: sha256 {sha[:16]} does not match {rec['sha256'][:16]} recorded in meta.json "
                            "(changed or corrupted after it was written); delete it and re-run extraction")
        try:
            table = pq.read_table(sp, memory_map=False)
            ids = table.column("sample_id").to_numpy(zero_copy_only=False).astype(str)
            emb = _embedding_matrix(table.column("embedding"), sp, embed_dim)
            schema_meta = (table.schema.metadata or {}).get(PARQUET_META_KEY)
        except FeatureCacheError as exc:
            problems.append(str(exc))
            continue
        except Exception as exc:  # noqa: BLE001  (any pyarrow failure means a bad file)
            problems.append(f"{sp}: unreadable parquet ({one_line(exc) or type(exc).__name__}); delete it and "
                            "re-run extraction")
            continue
        if len(ids) != hi - lo:
            problems.append(f"{sp}: {len(ids)} rows, expected {hi - lo} (manifest rows {lo}-{hi - 1}); delete it "
                            "and re-run extraction")
            continue
        if rec is not None and rec["rows"] != len(ids):
            problems.append(f"{sp}: {len(ids)} rows but meta.json records {rec['rows']}")
        try:
            shard_key = json.loads(schema_meta)["key"] if schema_meta else None
        except (ValueError, KeyError, TypeError):
            shard_key = "unreadable"
        if shard_key != key:
            problems.append(f"{sp}: written for key {shard_key}, not {key} (a foreign file); delete it and re-run "
                            "extraction")
        for j, sid in enumerate(ids.tolist()):
            if sid in seen_ids:
                problems.append(f"{sp}: row {lo + j} repeats sample_id {sid!r} of row {seen_ids[sid]}; delete it "
                                "and re-run extraction")
                break
            seen_ids[sid] = lo + j
        if man_ids is not None:
            bad = np.flatnonzero(ids != man_ids[lo:hi])
            if len(bad):
                j = int(bad[0])
                problems.append(f"{sp}: row {lo + j} holds sample_id {str(ids[j])!r} but the manifest has "
                                f"{str(man_ids[lo + j])!r}")
        nonfinite = set((lo + np.flatnonzero(~np.isfinite(emb).all(axis=1))).tolist())
        listed = set(shard_skipped)
        for r in sorted(nonfinite - listed)[:1]:
            problems.append(f"{sp}: row {r} (sample_id {str(ids[r - lo])!r}) holds non-finite features but is not "
                            f"listed in {SKIPPED_NAME} ({len(nonfinite - listed)} such rows); delete it and re-run "
                            "extraction")
        for r in sorted(listed - nonfinite)[:1]:
            problems.append(f"{path / SKIPPED_NAME}: lists row {r} (sample_id {shard_skipped[r]['sample_id']!r}) "
                            f"but {sp.name} holds finite features for it; delete the folder {path}")
        for r in sorted(listed):
            if shard_skipped[r]["sample_id"] != ids[r - lo]:
                problems.append(f"{path / SKIPPED_NAME}: row {r} lists sample_id "
                                f"{shard_skipped[r]['sample_id']!r} but {sp.name} holds {str(ids[r - lo])!r}; delete "
                                f"the folder {path}")
                break
        if rec is not None and rec["skipped"] != len(listed):
            problems.append(f"{sp}: meta.json records {rec['skipped']} skipped rows, {SKIPPED_NAME} lists "
                            f"{len(listed)}")

    unrecorded_missing = [i for i in missing if i not in recorded]
    for i in unrecorded_missing[:_MAX_NAMED]:
        lo, hi = i * shard_size, min((i + 1) * shard_size, n_rows)
        problems.append(f"{path / SHARD_NAME.format(i)}: missing (manifest rows {lo}-{hi - 1}); the entry "
                        "is incomplete, run extraction again to resume")
    if len(unrecorded_missing) > _MAX_NAMED:
        problems.append(f"{path}: {len(unrecorded_missing) - _MAX_NAMED} more shards missing; run extraction "
                        "again to resume")
    stale = sorted(r for r in skipped if r // shard_size in set(missing))
    if stale:
        notes.append(f"{path / SKIPPED_NAME}: lists {len(stale)} rows of shards not written yet (a killed run); "
                     "they are recomputed on resume")
    if not missing and meta.get("status") != "complete":
        notes.append(f"{meta_path}: status {meta.get('status')!r} though every shard is present; re-run "
                     "extraction to finalise it")
    rep.ok = not problems
    return rep


def _verify_view(path: Path, meta: dict, manifest, rep: VerifyReport) -> VerifyReport:
    """A manifest's view (:mod:`.store`): its rows, key, and that every row names an existing row of
    a complete chunk holding that image; notes say which versions each chunk's rows were made with."""
    problems, notes = rep.problems, rep.notes
    try:
        fields = meta["fields"]
        rep.n_rows, rep.key, rep.encoder = int(meta["n_rows"]), str(meta["key"]), fields.get("encoder")
        view = views.read_view(path)
    except (OSError, KeyError, TypeError, ValueError, AttributeError) as exc:
        problems.append(f"{path / views.VIEW_NAME}: unreadable ({one_line(exc)}); delete the folder {path} and "
                        "re-run extraction (the features are kept in the chunks)")
        return rep
    if f"v-{cache_key(_canonical(fields))}" != path.name:
        problems.append(f"{path / META_NAME}: its key fields hash to v-{cache_key(fields)}, not {path.name}; "
                        f"delete the folder {path}")
    if len(view) != rep.n_rows or view["sample_id"].duplicated().any():
        problems.append(f"{path / views.VIEW_NAME}: {len(view)} rows (meta.json: {rep.n_rows}) or a repeated "
                        f"sample_id; delete the folder {path}")
    if manifest is not None:
        frame, _ = _manifest_frame(manifest)
        if view["sample_id"].astype(str).tolist() != frame["sample_id"].astype(str).tolist():
            problems.append(f"{path}: its sample_ids are not the manifest's rows in order; this view was "
                            "made for another manifest")
    for folder, part in view.groupby("chunk", sort=False):
        folder = Path(folder)
        chunk_meta = folder / META_NAME
        if not chunk_meta.is_file():
            problems.append(f"{path}: chunk {folder} is missing; delete the view folder and re-run extraction")
            continue
        try:
            cm = json.loads(chunk_meta.read_text())
            ids = np.concatenate([pq.read_table(sp, columns=["sample_id"]).column(0).to_numpy(zero_copy_only=False)
                                  for sp in sorted(folder.glob("shard-*.parquet"))] or [np.array([], object)])
        except (OSError, ValueError) as exc:
            problems.append(f"{chunk_meta}: unreadable ({one_line(exc)})")
            continue
        if len(ids) != int(cm.get("n_rows", -1)):
            problems.append(f"{folder}: incomplete chunk ({len(ids)} of {cm.get('n_rows')} rows); run extraction "
                            "again to resume")
            continue
        rows = part["row"].to_numpy()
        if cm.get("format") == CACHE_FORMAT and "made_with" not in cm.get("fields", {}):
            pass  # an adopted entry of the per-manifest layout: its sample_ids are its manifest's
        elif (rows >= len(ids)).any() or (ids[rows].astype(str) != part["image_id"].astype(str).to_numpy()).any():
            problems.append(f"{path}: rows of chunk {folder.name} do not hold the images the view names; delete "
                            f"the view folder {path} and re-run extraction")
        f = cm.get("fields", {})
        made = f.get("made_with") or {"package": f.get("package_version"), "libraries": f.get("library_versions")}
        libs = ", ".join(f"{k} {v}" for k, v in sorted((made.get("libraries") or {}).items()))
        notes.append(f"{len(part)} rows from chunk {folder.name}, made with robustbench_fm {made.get('package')}"
                     f"{'; ' + libs if libs else ''}")
    rep.ok = not problems
    return rep


def _entries(root: Path) -> list[Path]:
    found = {p.parent for p in root.rglob(META_NAME)}
    found |= {p.parent for p in root.rglob("shard-*.parquet")}
    return sorted(found)


def verify_cache(root: str | Path) -> list[VerifyReport]:
    """:func:`verify_entry` for every entry (a folder holding ``meta.json`` or shards) under
    ``root``, sorted by path; ``[]`` when there is none. ``root`` may itself be an entry."""
    root = Path(root)
    if not root.is_dir():
        return [VerifyReport(path=root, ok=False, problems=[f"{root}: not a folder; pass a feature cache root"])]
    return [verify_entry(p) for p in _entries(root)]
