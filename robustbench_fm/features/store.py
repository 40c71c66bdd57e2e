"""The per-image feature store: every (encoder recipe, image) is embedded once, whatever manifest
asks for it (docs/architecture.md, "The feature store"). :class:`FeatureStore` is its one door:
look up -> embed what is missing (the extraction engine, :mod:`.engine`, is a backend it is
handed) -> write the manifest's view; slide embeddings (:meth:`FeatureStore.entry`) and SPAR's
frozen-token arrays (:meth:`FeatureStore.array`) are written through it too.

A manifest's features are found by looking up its images, not its rows:

- **Image identity** (:func:`image_ids`): the SHA-256 of the image file's bytes (memoised per
  resolved file, size and mtime in ``<cache>/_files/hashes.parquet``, so a later run only stats
  the files), combined with what selects pixels inside the file (the ``#`` locator of an HDF5 /
  NPZ / parquet row, crop and occlusion columns). The same image under another folder, another
  relative path, another ``sample_id`` or in another row order has the same identity; a file
  whose bytes change gets a new one. We chose the content hash over a cheap (path, size, mtime)
  identity because the cheap one changes on a plain ``cp`` and cannot tell two copies apart from
  two different images under the same name; the memo makes its cost one read of each file, the
  first time the file is seen.
- **Recipe** (:func:`.recipe.recipe_fields`, defined from the encoder, not from any key): what
  makes an encoder's vector of a given image: encoder identity, weights, architecture,
  preprocessing, pooling, precision, how JPEGs are decoded (``extract.decode``; ``exact`` adds
  no field, so entries made before scaled decoding keep their recipe), device-side transform,
  :data:`RECIPE_VERSION` and the *major* version of torch and of the encoder's own library.
  The decode mode is keyed only where it changes pixels (:meth:`FeatureStore.sources`): a vector
  is filed under the scaled recipe only when scaled decoding drafts that JPEG for that encoder
  (:func:`scaled_rows`), else under the exact one, and an exact vector serves a scaled request
  (exact is the reference; issue 54).
  Nothing else: no manifest, no absolute path, no patch version (a patch release of a library
  the encoder does not use cannot change its features; the versions a row was made with are
  recorded, :func:`made_with`, and compared on use, ``cache.on_version_change``).

Layout under the feature cache ``<cache>``::

    <cache>/_files/hashes.parquet              content-hash memo (path, size, mtime_ns, sha256)
    <cache>/<encoder>/images-<recipe>/         one folder per recipe
        recipe.json                            the recipe fields
        <chunk>.ids.parquet                    the images of chunk <chunk>, in its row order
                                               (image_id and the locator columns read them)
        <chunk>/                               a feature-cache entry (:mod:`.cache`) whose
                                               sample_ids are image ids: shards, meta.json
                                               (recording ``made_with``), skipped.csv
        adopted-<key>.ids.parquet              an entry of the earlier per-manifest layout read as
                                               a chunk (its rows' image ids; the entry stays put:
                                               that layout is read, never written, :mod:`.key`)
    <cache>/<encoder>/<view>/                  one folder per manifest (the entry runs name)
        meta.json                              format "view": recipe folder, rows, key fields
        view.parquet                           sample_id, image_id, chunk, row (manifest order)

A chunk is written by the ordinary extraction (sharded, atomic, locked, resumable, SHA-256 per
shard, checked again whenever a look-up reads the shard: :meth:`FeatureStore._check_shards`);
only images no chunk of the recipe holds go into a new chunk, each once (duplicates inside a
manifest too; a run refuses an image under two sample_ids unless told otherwise,
:func:`apply_duplicates`). A view is written when all its chunks are complete and is read by
:func:`robustbench_fm.features.load.load_features` like any entry. Views and chunk references
are relative to the encoder folder, so a moved or copied ``outputs/`` keeps every entry valid.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from ..core.atomic import replace_atomic, write_atomic, write_text_atomic
from ..core.devices import usable_cores
from ..core.errors import InvalidSetting
from ..core.locking import FileLock
from ..core.shards import file_sha256
from ..core.text import one_line
from ..core.versions import VERSION_POLICIES
from ..data.images import (
    CROP_COLUMNS,
    DEFAULT_DECODE,
    HDF5_SUFFIXES,
    Need,
    draft_scale,
    file_orientation,
    locator_file,
    need_of,
)
from .cache import (
    SKIPPED_NAME,
    FeatureCache,
    FeatureCacheError,
    FeatureSet,
    _safe_name,
    skipped_csv_bytes,
    unwritable,
)
from .entry import (  # noqa: F401 (VIEW_FORMAT, VIEW_NAME, gather, read_view: the store's names)
    ARRAY_NAME,
    VIEW_FORMAT,
    VIEW_NAME,
    Array,
    ArrayMeta,
    ViewMeta,
    gather,
    is_entry,
    open_entry,
    read_view,
    recorded_fields,
    write_meta,
)
from .key import cache_key_fields, find_entry, legacy_array, legacy_versions
from .load import READ_THREADS, missing_shards, read_skipped
from .occlusion import OCCLUSION_COLUMNS
from .options import DEFAULTS, ExtractOptions, check_duplicates
from .recipe import RECIPE_VERSION, library_major, made_with, recipe_fields  # noqa: F401 (the store's names)
from .recipe import canonical as _canonical
from .recipe import fields_key as cache_key

log = logging.getLogger("robustbench_fm.features")

IDS_SUFFIX = ".ids.parquet"
#: columns besides ``path`` that select pixels of a file (part of an image's identity)
PIXEL_COLUMNS = (*CROP_COLUMNS, *OCCLUSION_COLUMNS)
#: files the reader opens without Pillow (never decoded by DCT scaling)
NON_PILLOW_SUFFIXES = (*HDF5_SUFFIXES, ".npz", ".parquet")

# ------------------------------------------------------------------ hashes

def _hash(*parts) -> str:
    return hashlib.sha256(json.dumps(_canonical(list(parts)), sort_keys=True).encode()).hexdigest()


# ------------------------------------------------------------------ image identity

class FileHashes:
    """SHA-256 of image files, memoised by (resolved path, size, mtime_ns) in
    ``<cache>/_files/hashes.parquet``; a file whose size or mtime changed is hashed again. The
    memo is a speed-up only: a read-only cache is hashed in memory and nothing is written. It also
    keeps, once asked (:meth:`jpeg_size`), whether Pillow reads the file as a JPEG and its size
    (column ``jpeg``: ``"WxH"``, ``""`` for any other file; a memo written before has none: asked
    again), what decides whether scaled decoding changes its pixels (:func:`scaled_rows`), and its
    EXIF orientation (:meth:`orientation`, column ``orientation``), which the readers apply and so
    is part of an image's identity where it turns the pixels (:func:`image_ids`)."""

    COLUMNS = ("path", "size", "mtime_ns", "sha256")

    def __init__(self, cache_dir: str | Path):
        self.path = Path(cache_dir) / "_files" / "hashes.parquet"
        self._memo: dict[str, tuple[int, int, str, str | None, int | None]] = {}
        self._new = 0
        if self.path.is_file():
            try:
                t = pq.read_table(self.path).to_pydict()
                jpeg = t.get("jpeg") or [None] * len(t["path"])
                turn = t.get("orientation") or [None] * len(t["path"])  # a memo written before has none
                self._memo = {p: (s, m, h, j, o)
                              for p, s, m, h, j, o in zip(*(t[c] for c in self.COLUMNS), jpeg, turn)}
            except (OSError, KeyError, pa.ArrowException):
                self._memo = {}  # a damaged memo is rebuilt

    def _valid(self, file: Path) -> tuple[str, os.stat_result, tuple | None]:
        st = file.stat()
        key = str(file.resolve())
        got = self._memo.get(key)
        ok = got is not None and got[0] == st.st_size and got[1] == st.st_mtime_ns
        return key, st, got if ok else None

    def of(self, file: Path) -> str:
        key, st, got = self._valid(file)
        if got is not None:
            return got[2]
        h = hashlib.sha256()
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        self._memo[key] = (st.st_size, st.st_mtime_ns, h.hexdigest(), None, None)
        self._new += 1
        return h.hexdigest()

    def jpeg_size(self, file: Path) -> tuple[int, int] | None:
        """``(w, h)`` when the reader decodes ``file`` as a JPEG (Pillow's format, as
        :func:`robustbench_fm.data.images.read_image` dispatches; an HDF5, NPZ or parquet file
        never), else None; its header only is read, once per file version."""
        try:
            key, st, got = self._valid(file)
        except OSError:
            return None
        if got is not None and got[3] is not None:
            info = got[3]
        else:
            info = _jpeg_info(file)
            if got is not None:
                self._memo[key] = (*got[:3], info, got[4])
                self._new += 1
        if not info:
            return None
        w, h = info.split("x")
        return int(w), int(h)

    def orientation(self, file: Path) -> int:
        """The EXIF Orientation the readers apply to ``file``
        (:func:`robustbench_fm.data.images.file_orientation`; 1 for none), its header read once per
        file version."""
        try:
            key, st, got = self._valid(file)
        except OSError:
            return 1
        if got is not None and got[4] is not None:
            return int(got[4])
        turn = int(file_orientation(file))
        if got is not None:
            self._memo[key] = (*got[:4], turn)
            self._new += 1
        return turn

    def save(self) -> None:
        if not self._new:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(self.path.with_name(".hashes.lock")):
                if self.path.is_file():  # keep what another process added meanwhile
                    merged = FileHashes(self.path.parents[1])._memo
                    for k, v in self._memo.items():  # a JPEG size / orientation another process found is kept
                        old = merged.get(k)
                        same = old is not None and old[:3] == v[:3]
                        merged[k] = (*v[:3], old[3] if same and v[3] is None else v[3],
                                     old[4] if same and v[4] is None else v[4])
                    self._memo = merged
                items = sorted(self._memo.items())
                table = pa.table({"path": [k for k, _ in items], "size": [v[0] for _, v in items],
                                  "mtime_ns": [v[1] for _, v in items], "sha256": [v[2] for _, v in items],
                                  "jpeg": pa.array([v[3] for _, v in items], pa.string()),
                                  "orientation": pa.array([v[4] for _, v in items], pa.int16())})
                _write_parquet(self.path, table)
            self._new = 0
        except OSError as exc:  # a read-only cache: hashes stay in memory
            log.debug("content-hash memo not written (%s)", exc)


def _jpeg_info(file: Path) -> str:
    """``"WxH"`` of a file the reader decodes as a JPEG, else ``""`` (:meth:`FileHashes.jpeg_size`)."""
    if file.suffix.lower() in NON_PILLOW_SUFFIXES:
        return ""
    try:
        with Image.open(file) as im:
            return f"{im.size[0]}x{im.size[1]}" if im.format == "JPEG" else ""
    except Exception:  # noqa: BLE001  (not an image Pillow reads: never decoded by DCT scaling)
        return ""


def _pixel_part(manifest: pd.DataFrame) -> list[str]:
    cols = [c for c in PIXEL_COLUMNS if c in manifest.columns]
    # str.partition of an empty column has no column 2: map (a manifest of 0 rows has 0 parts)
    loc = manifest["path"].astype(str).map(lambda p: p.partition("#")[2]).to_numpy()
    if not cols:
        return list(loc)
    vals = manifest[cols].astype(object).where(manifest[cols].notna(), None).to_numpy()
    return [json.dumps([part, *map(_scalar, v)]) for part, v in zip(loc, vals)]


def _scalar(v):
    if v is None:
        return None
    if isinstance(v, (np.integer, int)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        return float(v)
    return str(v)


def _content(hashes: FileHashes, file: Path) -> str:
    """What an image's identity takes from its file: the content hash, and the EXIF orientation
    where the readers turn the pixels by it (issue 54 item 5: a vector embedded before the readers
    applied it is of the unturned image, so a turned file gets a new identity and is embedded again;
    every other file keeps its identity and its vectors)."""
    digest = hashes.of(file)
    turn = hashes.orientation(file)
    return digest if turn == 1 else f"{digest}\x1fexif-orientation={turn}"


def image_ids(manifest: pd.DataFrame, root: str | Path, hashes: FileHashes) -> np.ndarray:
    """One identity per manifest row (module docstring): 32 hex digits of the SHA-256 of the
    file's content hash and the row's pixel-selecting fields. A missing file raises
    :class:`~robustbench_fm.core.errors.InvalidSetting` naming the row."""
    root = Path(root)
    files = manifest["path"].astype(str).map(locator_file).to_numpy()
    content: dict[str, str] = {}
    out = []
    for i, (f, extra) in enumerate(zip(files, _pixel_part(manifest))):
        if f not in content:
            try:
                content[f] = _content(hashes, root / f)
            except FileNotFoundError:
                content[f] = "missing:" + f  # extraction reports it (or skips it) by row
            except OSError as exc:
                raise InvalidSetting(f"manifest row {i}: cannot read '{root / f}' ({exc}); fix the path or "
                                     "the image root") from None
        out.append(hashlib.sha256(f"{content[f]}\x1f{extra}".encode()).hexdigest()[:32])
    return np.asarray(out, dtype=object)


def source_ids(manifest: pd.DataFrame, root: str | Path, hashes: FileHashes) -> np.ndarray:
    """One identity per row of the pixels its file, locator and crop select, before any occlusion:
    what the prepared-image store finds an image by (:func:`robustbench_fm.data.prepared.prepare`,
    ``identities``), since a row's occlusion is applied to the prepared copy when it is read."""
    return image_ids(manifest.drop(columns=[c for c in OCCLUSION_COLUMNS if c in manifest.columns]), root, hashes)


def derived_ids(ids: np.ndarray, recipe: dict) -> np.ndarray:
    """Identities of images derived from ``ids`` by ``recipe`` (the prepared-image store's size
    and resize rule, :func:`robustbench_fm.data.prepared.recipe`): a stored 224-px copy is the same
    image whichever manifest's store entry holds it."""
    tag = json.dumps(_canonical(recipe), sort_keys=True)
    return np.asarray([hashlib.sha256(f"{i}\x1f{tag}".encode()).hexdigest()[:32] for i in ids], dtype=object)


def check_rows(manifest: pd.DataFrame) -> None:
    """What every served manifest needs (the one check, :meth:`FeatureStore.identities`): a
    ``sample_id`` and a ``path`` column and one row per sample_id (one line naming the first repeat)."""
    for col in ("sample_id", "path"):
        if col not in manifest.columns:
            raise InvalidSetting(f"manifest has no '{col}' column; validate it with "
                                 "robustbench_fm.data.manifest.validate")
    ids = manifest["sample_id"].astype(str)
    dup = ids.duplicated()
    if dup.any():
        j = int(dup.to_numpy().nonzero()[0][0])
        raise InvalidSetting(f"manifest row {j}: duplicate sample_id {ids.iloc[j]!r}; one row per image")


def duplicate_images(manifest: pd.DataFrame, root: str | Path, cache_dir: str | Path) -> list[np.ndarray]:
    """The rows (positions, in order) of each image that ``manifest`` lists under two or more
    sample_ids: the same identity (:func:`image_ids`: file content and pixel-selecting columns; a
    file renamed or copied is the same image), hashed through the store's memo under
    ``cache_dir``. Rows of one sample_id (a paired design lists an image once per subset) count
    once; a row whose file cannot be read here (missing, a folder) is left to extraction to report."""
    root, hashes = Path(root), FileHashes(cache_dir)
    files = manifest["path"].astype(str).map(locator_file)
    readable = {f: _readable(root / f) for f in dict.fromkeys(files)}
    pos = np.flatnonzero(files.map(readable).to_numpy(bool))
    ids = image_ids(manifest.iloc[pos], root, hashes) if len(pos) else np.array([], dtype=object)
    hashes.save()
    table = pd.DataFrame({"image": ids, "sample_id": manifest["sample_id"].astype(str).to_numpy()[pos],
                          "pos": pos})
    shared = table.groupby("image", sort=False)["sample_id"].transform("nunique") > 1
    return [g["pos"].to_numpy() for _, g in table[shared].groupby("image", sort=False)]


def _readable(file: Path) -> bool:
    """Whether ``file`` is a file this process can open (a missing file, a folder or an unreadable one
    is left to extraction to report, by row)."""
    try:
        with open(file, "rb"):
            return file.is_file()
    except OSError:
        return False


def apply_duplicates(manifest: pd.DataFrame, root: str | Path, cache_dir: str | Path, policy: str,
                     source: str) -> pd.DataFrame:
    """``manifest`` under ``extract.duplicates=policy`` (:data:`.options.DUPLICATE_POLICIES`) given the images
    :func:`duplicate_images` finds: none, it is returned as it is; ``refuse`` is one line naming the
    first image's rows (row, path, sample_id; ``source`` names the manifest) and the two options;
    ``drop`` keeps each image's first sample_id (its rows) and drops the rows of the others, in one
    log line; ``keep`` keeps every row, in one warning line."""
    check_duplicates(policy)
    groups = duplicate_images(manifest, root, cache_dir)
    if not groups:
        return manifest
    sids = manifest["sample_id"].astype(str).to_numpy()
    paths = manifest["path"].astype(str).to_numpy()
    first = groups[0]
    shown = [int(r) for r in pd.Series(first).groupby(sids[first]).first().sort_values()]
    rows = " = ".join(f"row {r} '{paths[r]}' (sample_id '{sids[r]}')" for r in shown[:3])
    extra = [r for g in groups for r in g if sids[r] != sids[g[0]]]
    what = (f"{len(groups)} image{'s' if len(groups) > 1 else ''} listed under more than one sample_id "
            f"({len(set(sids[extra]))} extra sample_ids, {len(extra)} rows); first: {rows}")
    if policy == "refuse":
        raise InvalidSetting(f"{source}: {what}; a copy is its own image's nearest neighbour and inflates every "
                             "score: remove the copies, or set extract.duplicates=drop (keep each image's first "
                             "sample_id) or extract.duplicates=keep")
    if policy == "keep":
        log.warning("%s: %s; kept (extract.duplicates=keep)", source, what)
        return manifest
    drop = np.zeros(len(manifest), bool)
    drop[extra] = True
    log.warning("%s: %s; dropped the %d rows of the extra sample_ids (extract.duplicates=drop)", source, what,
                int(drop.sum()))
    return manifest[~drop].reset_index(drop=True)


def _margins(manifest: pd.DataFrame) -> np.ndarray:
    """Each row's crop margins (left, top, right, bottom; absent or NaN: 0) as an int array [n, 4]."""
    cols = [manifest[c] if c in manifest.columns else pd.Series(0, index=manifest.index) for c in CROP_COLUMNS]
    return np.stack([pd.to_numeric(c, errors="coerce").fillna(0).to_numpy(np.int64) for c in cols], axis=1) \
        if len(manifest) else np.zeros((0, 4), np.int64)


def scaled_rows(manifest: pd.DataFrame, root: str | Path, hashes: FileHashes, need: Need | None,
                rows: np.ndarray) -> np.ndarray:
    """Among the rows ``rows`` (a boolean mask), those whose pixels scaled decoding changes for a
    resize that needs ``need``: a JPEG (:meth:`FileHashes.jpeg_size`) decoded at a DCT scale above 1
    (:func:`robustbench_fm.data.images.draft_scale`, the crop margins included), exactly when
    :func:`~robustbench_fm.data.images.read_image` drafts it. Every other row (a PNG, DICOM, NIfTI
    slice, HDF5 row, a JPEG too small to scale) reads the same pixels either way."""
    out = np.zeros(len(manifest), bool)
    if need is None or not rows.any():
        return out
    root = Path(root)
    paths = manifest["path"].astype(str).to_numpy()
    margins = _margins(manifest)
    for i in np.flatnonzero(rows):
        size = hashes.jpeg_size(root / locator_file(paths[i]))
        out[i] = size is not None and draft_scale(size, need, tuple(margins[i])) > 1
    return out


@dataclass
class Identities:
    """A manifest's image identities as the store looks them up (:meth:`FeatureStore.identities`):
    ``content`` (:func:`image_ids`) and, at a prepared resolution, ``prepared`` (``{decode mode:
    the prepared recipe}``, :func:`robustbench_fm.data.prepared.recipe`), by which each row's image
    is its prepared copy (:func:`derived_ids`: one identity per decode mode) and ``sources``
    (:func:`source_ids`, what the prepared-image store finds a source by). ``manifest`` / ``root``:
    the rows as given, read (JPEG headers only) to tell which rows scaled decoding changes."""

    manifest: pd.DataFrame
    root: Path
    content: np.ndarray
    hashes: FileHashes
    sources: np.ndarray | None = None
    prepared: dict | None = None
    #: what the prepared store's resize needs (its S x S square): the need of every prepared row
    prepared_need: Need | None = None
    _by_mode: dict = field(default_factory=dict, repr=False)
    _scaled: dict = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.content)

    def of(self, decode: str) -> np.ndarray:
        """Each row's image identity when it is decoded as ``decode`` (native: the content's)."""
        if self.prepared is None:
            return self.content
        if decode not in self._by_mode:
            self._by_mode[decode] = derived_ids(self.content, self.prepared[decode])
        return self._by_mode[decode]

    def scaled(self, need: Need | None, rows: np.ndarray) -> np.ndarray:
        """:func:`scaled_rows` of ``rows`` for an encoder whose resize needs ``need`` (at a prepared
        resolution the prepared store's need: the encoders read its copies, never a JPEG),
        memoised per need; the JPEG sizes it reads are kept in the content-hash memo."""
        need = self.prepared_need if self.prepared is not None else need
        known, values = self._scaled.setdefault(need, (np.zeros(len(self), bool), np.zeros(len(self), bool)))
        todo = rows & ~known
        if todo.any():
            values[todo] = scaled_rows(self.manifest, self.root, self.hashes, need, todo)[todo]
            known[todo] = True
            self.hashes.save()
        return values & rows


def _encoder_need(encoder) -> Need:
    p = encoder.spec.preprocessing()
    return need_of(p["resize"], p["input_size"], p["resize_size"])


# ------------------------------------------------------------------ chunks

@dataclass
class Chunk:
    """One chunk of a recipe folder: ``name`` (its folder, relative to the recipe folder: a chunk
    key, or ``../<key>`` for an adopted entry of the per-manifest layout) and its image ids."""

    name: str
    ids: np.ndarray
    adopted: bool = False
    _cache: FeatureCache | None = field(default=None, repr=False)
    #: the recipe folder holding it
    home: Recipe | None = field(default=None, repr=False, compare=False)
    #: shards found corrupted in an adopted entry (that layout is never written): not read
    bad: set = field(default_factory=set, repr=False, compare=False)


class Recipe:
    """The store of one encoder recipe: ``<cache>/<encoder>/images-<recipe key>/``; ``decode``:
    how its images' JPEGs are decoded (scaled or exact, :func:`.recipe.decode_fields`)."""

    def __init__(self, cache_dir: str | Path, encoder, extra: dict | None = None, decode: str = DEFAULT_DECODE):
        self.cache_dir = Path(cache_dir)
        self.decode = decode
        self.fields = recipe_fields(encoder, extra, decode)
        self.key = cache_key(self.fields)
        self.encoder_dir = self.cache_dir / _safe_name(str(self.fields["encoder"]))
        self.folder = self.encoder_dir / f"images-{self.key}"
        self._chunks: list[Chunk] | None = None

    # --- chunks
    def chunks(self, refresh: bool = False) -> list[Chunk]:
        if self._chunks is None or refresh:
            found = []
            if self.folder.is_dir():
                for f in sorted(self.folder.glob(f"*{IDS_SUFFIX}")):
                    stem = f.name[:-len(IDS_SUFFIX)]
                    adopted = stem.startswith("adopted-")
                    name = f"../{stem[len('adopted-'):]}" if adopted else stem
                    ids = pq.read_table(f, columns=["image_id"]).column(0).to_numpy(zero_copy_only=False)
                    found.append(Chunk(name, ids.astype(object), adopted, home=self))
            self._chunks = found
        return self._chunks

    def held(self, complete: bool = False) -> set:
        """Image ids the recipe's chunks name (only its complete chunks with ``complete``)."""
        have: set = set()
        for c in self.chunks():
            if not complete or self.complete(c):
                have.update(c.ids.tolist())
        return have

    def n_missing(self, ids: np.ndarray) -> int:
        """How many distinct images of ``ids`` no chunk of the recipe (complete or not) names."""
        return len(set(map(str, ids)) - self.held())

    def covers(self, ids: np.ndarray) -> bool:
        """Whether the recipe's chunks (complete or not) name every image of ``ids``."""
        return self.n_missing(ids) == 0

    def chunk_folder(self, chunk: Chunk) -> Path:
        return (self.folder / chunk.name).resolve() if chunk.adopted else self.folder / chunk.name

    def chunk_cache(self, chunk: Chunk) -> FeatureCache:
        """The chunk's feature-cache entry (its recorded fields when it exists)."""
        if chunk._cache is None:
            folder = self.chunk_folder(chunk)
            fields = recorded_fields(folder) or self.chunk_fields(chunk.ids)
            chunk._cache = FeatureCache(self.cache_dir, fields, folder=folder)
        return chunk._cache

    def complete(self, chunk: Chunk) -> bool:
        try:
            return self.chunk_cache(chunk).is_complete
        except FeatureCacheError:
            return False

    def versions(self, chunk: Chunk) -> dict:
        """What the chunk's rows were made with (an adopted entry: its key's versions)."""
        return legacy_versions(self.chunk_cache(chunk).fields)

    def chunk_fields(self, ids) -> dict:
        """Key fields of a new chunk of images ``ids``: the recipe, the images, the versions now."""
        return _canonical({**self.fields, "images": _hash(list(map(str, ids)))[:16], "n_rows": int(len(ids)),
                           "made_with": made_with()})

    def new_chunk(self, rows: pd.DataFrame, ids: np.ndarray) -> Chunk:
        """A chunk for the images ``ids`` (unique), read through the locator columns of ``rows``;
        its ids file is written first, so a concurrent part of the same run finds it."""
        name = cache_key(self.chunk_fields(ids))
        self.folder.mkdir(parents=True, exist_ok=True)
        recipe = self.folder / "recipe.json"
        if not recipe.exists():
            write_text_atomic(recipe, json.dumps(self.fields, indent=1, sort_keys=True) + "\n")
        path = self.folder / f"{name}{IDS_SUFFIX}"
        if not path.exists():
            _write_parquet(path, _ids_table(rows, ids))
        chunk = Chunk(name, np.asarray(ids, dtype=object), home=self)
        self.chunks().append(chunk)
        return chunk

    def chunk_manifest(self, chunk: Chunk, manifest: pd.DataFrame, ids: np.ndarray) -> pd.DataFrame | None:
        """The rows the chunk's images are read from in THIS manifest (sample_id = image id, in the
        chunk's order); None when the manifest does not hold every image of the chunk."""
        pos = _first_positions(ids).reindex(chunk.ids)
        if pos.isna().any():
            return None
        rows = manifest.iloc[pos.to_numpy(int)].reset_index(drop=True).copy()
        rows["sample_id"] = list(chunk.ids)
        return rows

    # --- the per-manifest layout (cache format 2), read only
    def adopt(self, encoder, manifest: pd.DataFrame, root, ids: np.ndarray) -> Chunk | None:
        """The complete entry of the per-manifest layout that holds ``manifest``'s rows
        (:func:`.key.find_entry`: same encoder identity, locator hash and row count, from this image
        root or one that no longer exists), read as a chunk without re-embedding. Its image ids are
        written to ``adopted-<key>.ids.parquet`` (kept in memory on a read-only cache)."""
        folder = find_entry(self.encoder_dir, cache_key_fields(encoder, manifest, root, self.decode), root)
        if folder is None:
            return None
        key = folder.name
        name = f"../{key}"
        for c in self.chunks():
            if c.name == name:
                return c
        chunk = Chunk(name, np.asarray(ids, dtype=object), adopted=True, home=self)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            _write_parquet(self.folder / f"adopted-{key}{IDS_SUFFIX}", _ids_table(manifest, ids))
        except OSError:
            pass  # read-only: this run reads it anyway
        self.chunks().append(chunk)
        log.info("reading %s (written by an earlier layout) as features of %d images", folder, len(ids))
        return chunk


def _first_positions(ids) -> pd.Series:
    """Position of each distinct id's first occurrence in ``ids``, indexed by id."""
    return pd.Series(np.arange(len(ids)), index=pd.Index(ids)).groupby(level=0).first()


def _ids_table(rows: pd.DataFrame, ids) -> pa.Table:
    cols = {"image_id": pa.array([str(i) for i in ids], pa.string()),
            "path": pa.array(rows["path"].astype(str).tolist(), pa.string())}
    return pa.table(cols)


def _write_parquet(path: Path, table: pa.Table) -> None:
    write_atomic(path, lambda f: pq.write_table(table, f, compression="zstd"))


# ------------------------------------------------------------------ planning a manifest

@dataclass
class Source:
    """A recipe folder a plan looks rows up in: ``ids``, each row's image id there; ``serves``
    (None: any row) is called once with the rows still open and returns those it may serve;
    ``fills``: this manifest may fill its unfinished chunks (a folder new vectors are filed in)."""

    recipe: Recipe
    ids: np.ndarray
    serves: Callable[[np.ndarray], np.ndarray] | None = None
    fills: bool = True


@dataclass
class Plan:
    """How a manifest is served: ``where[i]`` = (chunk index, row) of manifest row i's image, the
    chunks that still need embedding (each with the rows of this manifest it is read from), and
    ``ids``, each row's image id as its chunk holds it. ``recipe``: the request's recipe (its
    decode mode); the chunks may lie in another (:meth:`FeatureStore.sources`)."""

    recipe: Recipe
    ids: np.ndarray
    chunks: list[Chunk]
    where: np.ndarray  # [n, 2] int64: (index into chunks, row in chunk)
    fill: list[tuple[Chunk, pd.DataFrame]]
    old_versions: dict = field(default_factory=dict)  # chunk folder -> its made_with, where it differs
    sources: list = field(default_factory=list, repr=False)  # the Sources it was planned from

    @property
    def view_recipe(self) -> Recipe:
        """The recipe a view of this plan is keyed by: a scaled recipe when one of its chunks lies
        in one (its rows may hold scaled vectors), else the folder of its chunks (exact), else the
        request's."""
        homes = [c.home for c in self.chunks if c.home is not None]
        return next((r for r in homes if r.decode != "exact"), homes[0] if homes else self.recipe)


def _chunk_key(c: Chunk) -> str:
    return str(c.home.chunk_folder(c)) if c.home is not None else c.name


def plan(sources: list[Source], manifest: pd.DataFrame, policy: str = "reuse",
         target: Callable[[np.ndarray], np.ndarray] | None = None, complete_only: bool = False) -> Plan:
    """Assign every row of ``manifest`` to a chunk of the ``sources`` (in order): a complete chunk
    holding its image (current versions first; ``policy="recompute"`` uses only chunks made with the
    current versions), else an incomplete chunk of a source that ``fills`` and that this manifest can
    fill whole (a resumed or sharded run), else a new chunk of the remaining images, each once, in
    first-appearance order, in the source ``target(open rows)`` names per row (default: the first).
    ``complete_only``: complete chunks only and no new chunk (rows left open have chunk -1)."""
    if policy not in VERSION_POLICIES:
        raise InvalidSetting(f"cache.on_version_change={policy!r}: use one of {', '.join(VERSION_POLICIES)}")
    now = made_with()
    usable: list[tuple[int, int, bool, Chunk, Source]] = []
    old: dict = {}
    for s, src in enumerate(sources):
        for c in src.recipe.chunks():
            try:
                v = src.recipe.versions(c)
            except FeatureCacheError as exc:
                log.warning("%s", exc)
                continue
            if v != now:
                if policy == "recompute":
                    continue
                old[_chunk_key(c)] = v
            complete = src.recipe.complete(c)
            if not complete and (complete_only or c.adopted or not src.fills):
                continue  # an adopted entry is never written, so never filled
            usable.append((0 if complete else 1, s, _chunk_key(c) in old, c, src))
    # complete before incomplete, then the sources in order, then current versions before old
    usable.sort(key=lambda t: t[:3])
    n = len(manifest)
    chosen: list[Chunk] = []
    fill: list[tuple[Chunk, pd.DataFrame]] = []
    where = np.full((n, 2), -1, np.int64)
    found = np.empty(n, dtype=object)
    served: dict[int, np.ndarray] = {}
    indexes: dict[int, pd.Index] = {}
    for rank, s, _, c, src in usable:
        open_rows = where[:, 0] < 0
        if not open_rows.any():
            break
        if src.serves is not None and s not in served:
            served[s] = src.serves(open_rows)
        index = indexes.setdefault(s, pd.Index(src.ids))
        hit = open_rows & index.isin(c.ids)
        if s in served:
            hit &= served[s]
        if not hit.any():
            continue
        pos = _first_positions(c.ids).reindex(index[hit]).to_numpy(int)
        if c.bad:  # rows of a corrupted shard of an adopted entry are embedded again
            size = src.recipe.chunk_cache(c).shard_size
            keep = ~np.isin(pos // size, list(c.bad))
            hit[np.flatnonzero(hit)[~keep]] = False
            pos = pos[keep]
            if not hit.any():
                continue
        if rank == 1:
            rows = src.recipe.chunk_manifest(c, manifest, src.ids)
            if rows is None:
                continue  # another manifest's unfinished chunk: its images go into a new one
            fill.append((c, rows))
        k = len(chosen)
        chosen.append(c)
        where[hit, 0] = k
        where[hit, 1] = pos
        found[hit] = src.ids[hit]
    todo = where[:, 0] < 0
    if todo.any() and not complete_only:
        homes = np.zeros(n, np.int64) if target is None else np.asarray(target(todo), np.int64)
        for s in sorted(set(homes[todo].tolist())):
            src, rows_at = sources[s], np.flatnonzero(todo & (homes == s))
            uniq, first_row = np.unique(src.ids[rows_at].astype(str), return_index=True)
            order = np.argsort(first_row)
            new_ids = uniq[order]
            rows = manifest.iloc[rows_at[first_row[order]]].reset_index(drop=True)
            c = src.recipe.new_chunk(rows, new_ids)
            rows = rows.copy()
            rows["sample_id"] = list(new_ids)
            k = len(chosen)
            chosen.append(c)
            fill.append((c, rows))
            lookup = pd.Series(np.arange(len(new_ids)), index=pd.Index(new_ids))
            where[rows_at, 0] = k
            where[rows_at, 1] = lookup.reindex(pd.Index(src.ids[rows_at].astype(str))).to_numpy(int)
            found[rows_at] = src.ids[rows_at]
    request = sources[0].recipe
    return Plan(request, found, chosen, where, fill,
                {_chunk_key(c): old[_chunk_key(c)] for c in chosen if _chunk_key(c) in old})


def version_notice(p: Plan, policy: str) -> str | None:
    """One line naming the rows made with other versions (None when there are none)."""
    if not p.old_versions:
        return None
    now = made_with()
    n = int(sum((p.where[:, 0] == k).sum() for k, c in enumerate(p.chunks) if _chunk_key(c) in p.old_versions))
    diffs = set()
    for v in p.old_versions.values():
        if v.get("package") != now["package"]:
            diffs.add(f"robustbench_fm {v.get('package')} (now {now['package']})")
        libs = v.get("libraries") or {}
        for lib in sorted(set(libs) | set(now["libraries"])):
            if libs.get(lib) != now["libraries"].get(lib):
                diffs.add(f"{lib} {libs.get(lib) or 'absent'} (now {now['libraries'].get(lib) or 'absent'})")
    action = "embeds them again" if policy == "recompute" else "keeps them (recompute embeds them again)"
    return (f"{p.recipe.fields['encoder']}: {n} rows were embedded with {', '.join(sorted(diffs)) or 'other versions'}"
            f"; cache.on_version_change={policy} {action}")


# ------------------------------------------------------------------ views

def view_fields(recipe: Recipe, manifest: pd.DataFrame, ids: np.ndarray) -> dict:
    """Key fields of a manifest's view: the recipe and the (sample_id, image id) rows in order."""
    rows = hashlib.sha256("\n".join(f"{s}\x1f{i}" for s, i in zip(manifest["sample_id"].astype(str), ids))
                          .encode()).hexdigest()[:16]
    return _canonical({"format": VIEW_FORMAT, "encoder": recipe.fields["encoder"], "recipe": recipe.key,
                       "rows": rows, "n_rows": int(len(ids))})


def view_path(p: Plan, manifest: pd.DataFrame) -> tuple[Path, dict]:
    """The view folder of plan ``p`` and its key fields: its :attr:`Plan.view_recipe` and the rows'
    image ids as their chunks hold them (so a scaled request served by exact chunks, a PNG, names
    the view an exact request names)."""
    recipe = p.view_recipe
    fields = view_fields(recipe, manifest, p.ids)
    return recipe.encoder_dir / f"v-{cache_key(fields)}", fields


def write_view(p: Plan, manifest: pd.DataFrame) -> Path:
    """The manifest's view folder (written once; a read-only cache gets a temporary one)."""
    folder, fields = view_path(p, manifest)
    names = [os.path.relpath(c.home.chunk_folder(c), p.recipe.encoder_dir) for c in p.chunks]
    table = pa.table({"sample_id": pa.array(manifest["sample_id"].astype(str).tolist(), pa.string()),
                      "image_id": pa.array([str(i) for i in p.ids], pa.string()),
                      "chunk": pa.array([names[k] for k in p.where[:, 0]], pa.string()),
                      "row": pa.array(p.where[:, 1], pa.int64())})
    if (folder / VIEW_NAME).is_file() and is_entry(folder):
        try:
            if pq.read_table(folder / VIEW_NAME).equals(table):
                return folder  # the same rows from the same chunks (a recompute points it at new ones)
        except (OSError, pa.ArrowException):
            pass  # unreadable: written again below
    meta = ViewMeta(folder.name, fields, int(len(p.ids)), p.view_recipe.folder.name, tuple(sorted(set(names))))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _write_parquet(folder / VIEW_NAME, table)
        write_meta(folder, meta)
        return folder
    except OSError as exc:
        tmp = Path(tempfile.mkdtemp(prefix="robustbench_fm-view-"))
        log.info("feature cache is read-only (%s); this run's view of it is in %s", exc, tmp)
        table = table.set_column(2, "chunk", pa.array([str(p.recipe.encoder_dir / n) for n in table["chunk"]
                                                        .to_pylist()], pa.string()))
        _write_parquet(tmp / VIEW_NAME, table)
        write_meta(tmp, meta)
        return tmp


def write_view_skipped(folder: Path, table: pd.DataFrame) -> None:
    """``skipped.csv`` of a view (its rows whose image a chunk skipped; none: no file), for a person
    reading the folder; :func:`robustbench_fm.features.load.read_skipped` derives it from the chunks."""
    path = folder / SKIPPED_NAME
    try:
        if not len(table):
            path.unlink(missing_ok=True)
            return
        records = {int(r["row"]): {k: r[k] for k in ("sample_id", "path", "error")} | {"row": int(r["row"])}
                   for r in table.to_dict("records")}
        data = skipped_csv_bytes(records)
        if not path.is_file() or path.read_bytes() != data:
            write_atomic(path, lambda f: f.write(data))
    except OSError:
        pass  # a read-only cache: load.read_skipped still names them


# ------------------------------------------------------------------ the store

#: The extraction engine as the store calls it: ``backend(encoders, rows, root, entries, decode)``
#: embeds ``rows`` (sample_id = image id) with each encoder into its entry (the chunk's
#: :class:`~.cache.FeatureCache`, the store's own object: :meth:`.cache.FeatureCache.to_fill`),
#: reading JPEGs as the recipe's ``decode`` says, and returns one :class:`~.cache.FeatureSet` per
#: encoder (:func:`robustbench_fm.features.engine.extract_panel` with the run's settings bound).
Backend = Callable[[list, pd.DataFrame, Path, list, str], list]


class FeatureStore:
    """The one writer of feature entries under ``cache_dir``: look up -> embed what is missing (by
    the engine, a :data:`Backend`) -> write the manifest's view; the entries a slide encoder
    aggregates (:meth:`entry`) and frozen-token arrays (:meth:`array`) go through it too, under
    its locks and atomic writes. Entries of the earlier per-manifest layout are read, never written.
    ``options``: the run's extraction options (:class:`.options.ExtractOptions`, checked where they
    were made), of which the store reads ``decode`` (``extract.decode``: scaled or exact, how the
    images' JPEGs are decoded, part of every recipe this store looks up and fills:
    :func:`.recipe.decode_fields`), ``on_version_change`` and ``on_bad_image``."""

    def __init__(self, cache_dir: str | Path, options: ExtractOptions = DEFAULTS):
        self.cache_dir = Path(cache_dir)
        self.options = options

    @property
    def on_version_change(self) -> str:
        return self.options.on_version_change

    @property
    def on_bad_image(self) -> str:
        return self.options.on_bad_image

    @property
    def decode(self) -> str:
        return self.options.decode

    def recipe(self, encoder, extra: dict | None = None, decode: str | None = None) -> Recipe:
        """``encoder``'s recipe store under ``decode`` (default: this store's decode mode)."""
        return Recipe(self.cache_dir, encoder, extra, self.decode if decode is None else decode)

    # --- look up
    def identities(self, manifest: pd.DataFrame, root, prepared: dict | None = None,
                   prepared_need: Need | None = None) -> Identities:
        """Each row's image identities (:class:`Identities`: :func:`image_ids`; with the prepared
        recipes ``prepared`` = ``{decode mode: recipe}``, :func:`robustbench_fm.data.prepared.recipe`,
        the identities of its prepared copy by each mode, :func:`derived_ids`, and each row's source
        identity, :func:`source_ids`; ``prepared_need``: what the prepared store's resize needs).
        Every served manifest's rows are checked here, first (:func:`check_rows`)."""
        check_rows(manifest)
        hashes = FileHashes(self.cache_dir)
        ids = image_ids(manifest, root, hashes)
        sources = source_ids(manifest, root, hashes) if prepared is not None else None
        hashes.save()
        return Identities(manifest.reset_index(drop=True), Path(root), ids, hashes, sources, prepared, prepared_need)

    def sources(self, encoder, idents: Identities, extra: dict | None = None
                ) -> tuple[list[Source], Callable[[np.ndarray], np.ndarray]]:
        """Where ``encoder``'s vectors of these rows are looked up, in order, and where a missing
        one is filed (``target(open rows)``: an index into the sources per row). The decode mode is
        keyed only where it changes pixels (:meth:`Identities.scaled`: a JPEG drafted at a DCT scale
        above 1), and an exact vector serves a scaled request (exact is the reference):

        - ``scaled``: the scaled recipe (``"decode": "scaled"``, as every release since scaled
          decoding keyed it, for every image), then the exact one (every entry made before, or with
          ``extract.decode=exact``); a missing row is filed in the scaled recipe when scaling changes
          its pixels, else in the exact one (so a later exact request finds it);
        - ``exact``: the exact recipe, then the scaled one for the rows scaling does not change (a
          PNG an earlier scaled run embedded); a missing row is filed in the exact recipe."""
        need = _encoder_need(encoder)
        exact = Source(self.recipe(encoder, extra, "exact"), idents.of("exact"))
        if self.decode == "exact":
            scaled = Source(self.recipe(encoder, extra, "scaled"), idents.of("scaled"), fills=False,
                            serves=lambda open_rows: open_rows & ~idents.scaled(need, open_rows))
            return [exact, scaled], lambda todo: np.zeros(len(todo), np.int64)
        scaled = Source(self.recipe(encoder, extra, "scaled"), idents.of("scaled"))
        return [scaled, exact], lambda todo: np.where(idents.scaled(need, todo), 0, 1)

    def held(self, encoder, idents: Identities) -> np.ndarray:
        """Which rows complete chunks of ``encoder``'s recipes hold (as :meth:`look_up` finds them)."""
        sources, _ = self.sources(encoder, idents)
        return plan(sources, idents.manifest, self.on_version_change, complete_only=True).where[:, 0] >= 0

    def look_up(self, encoder, manifest: pd.DataFrame, idents: Identities | np.ndarray, root,
                check: bool = True) -> Plan:
        """Where each row's image is (a complete chunk, an entry of the earlier layout; in the
        recipes :meth:`sources` names) and the chunks still to fill (:func:`plan`). With ``check``
        each shard the manifest reads is first checked against the SHA-256 its ``meta.json``
        recorded: a corrupted or truncated one is named in one warning line and recomputed
        (:meth:`_check_shards`)."""
        if not isinstance(idents, Identities):  # content identities of a native manifest
            idents = Identities(manifest.reset_index(drop=True), Path(root), np.asarray(idents, dtype=object),
                                FileHashes(self.cache_dir))
        sources, target = self.sources(encoder, idents)
        for src in sources:  # an entry of the earlier per-manifest layout may hold them
            if src.serves is None and not src.recipe.covers(src.ids):
                src.recipe.adopt(encoder, manifest, root, src.ids)
        try:
            p = plan(sources, manifest, self.on_version_change, target)
            if check and self._check_shards(p):  # its chunks now miss the bad shards: planned again
                p = plan(sources, manifest, self.on_version_change, target)
        except OSError as exc:
            if not unwritable(exc, self.cache_dir):
                raise
            n_missing = sources[0].recipe.n_missing(sources[0].ids)
            raise FeatureCacheError(
                f"feature cache '{self.cache_dir}' is not writable ({one_line(exc)}) and '{encoder.spec.name}' "
                f"has {n_missing} of {len(set(map(str, sources[0].ids)))} images of this manifest to embed; set "
                "paths.cache_dir=<a writable folder>") from None
        idents.hashes.save()
        p.sources = sources
        if self.on_bad_image == "error":  # images an earlier run skipped are read again (and stop the run if bad)
            filling = {_chunk_key(c) for c, _ in p.fill}
            for c in p.chunks:
                if _chunk_key(c) not in filling and len(read_skipped(c.home.chunk_folder(c))):
                    src = next(x for x in sources if x.recipe is c.home)
                    rows = c.home.chunk_manifest(c, manifest, src.ids)
                    if rows is not None:
                        p.fill.append((c, rows))
        if not p.fill:
            log.info("cache hit: %d rows, 0 forward passes (%s)", len(p.ids), view_path(p, manifest)[0])
        notice = version_notice(p, self.on_version_change)
        if notice:
            (log.warning if self.on_version_change == "warn" else log.info)("%s", notice)
        return p

    def _check_shards(self, p: Plan) -> bool:
        """Check every shard of a complete chunk that ``p`` reads rows from against the SHA-256
        recorded when it was written (:meth:`.cache.FeatureCache.bad_shards`, hashed side by side);
        each bad one gets one warning line naming it and is deleted, so the chunk's next fill
        recomputes it (a chunk of an adopted entry, a layout never written, is left as it is and the
        rows of that shard are embedded again). True when a shard was bad (``p`` is stale)."""
        filling = {_chunk_key(c) for c, _ in p.fill}
        jobs = []
        for k, c in enumerate(p.chunks):
            if _chunk_key(c) in filling:
                continue
            cache = c.home.chunk_cache(c)
            rows = p.where[p.where[:, 0] == k, 1]
            jobs.append((c, cache, sorted(set((rows // cache.shard_size).tolist()))))
        if not jobs:
            return False
        with ThreadPoolExecutor(min(READ_THREADS, usable_cores(), sum(len(s) for _, _, s in jobs) or 1)) as pool:
            found = list(pool.map(lambda job: job[1].bad_shards(job[2]), jobs))
        bad = False
        for (c, cache, _), shards in zip(jobs, found):
            for i, why in shards.items():
                lo, hi = cache.shard_bounds(i)
                log.warning("%s: corrupted cache shard (%s); recomputing its %d rows", cache.shard_path(i), why,
                            hi - lo)
                bad = True
                if c.adopted:
                    c.bad.add(i)
                    continue
                try:
                    cache.drop_shards([i])
                except OSError as exc:
                    raise FeatureCacheError(f"{cache.shard_path(i)}: corrupted cache shard ({why}) in a cache this "
                                            f"run cannot write ({one_line(exc)}); delete the file, or set "
                                            "paths.cache_dir=<a writable folder>") from None
        return bad

    # --- embed what is missing
    def fill(self, loaded: list, plans: list[Plan], root, backend: Backend) -> list[tuple[int, int]]:
        """Embed what each plan still needs with ``backend``; encoders missing the same images, read
        the same way, share one call (one decode pass; each chunk is filled under its own recipe's
        decode mode). Returns (forward batches, images embedded) per encoder."""
        counts = [[0, 0] for _ in loaded]
        groups: dict[str, list] = {}
        for j, p in enumerate(plans):
            for chunk, rows in p.fill:
                key = _hash(chunk.home.decode, list(rows["sample_id"]), list(rows["path"].astype(str)))
                groups.setdefault(key, []).append((j, chunk, rows))
        for items in groups.values():
            # the chunks' own entries: the engine writes through the objects this store reads
            entries = [c.home.chunk_cache(c) for _, c, _ in items]
            feats = backend([loaded[j] for j, _, _ in items], items[0][2], Path(root), entries,
                            items[0][1].home.decode)
            for (j, _, _), f in zip(items, feats):
                counts[j][0] += f.n_forward
                counts[j][1] += f.n_images_embedded
        return [tuple(c) for c in counts]

    # --- write the view
    def view(self, p: Plan, manifest: pd.DataFrame, root, n_forward: int = 0, n_images: int = 0,
             seconds: float = 0.0) -> FeatureSet:
        """The manifest's view (:func:`write_view`) as a FeatureSet (``read=False``: its ``path``
        is read by ``load_features``)."""
        folder = write_view(p, manifest)
        missing = missing_shards(folder)
        table = read_skipped(folder) if not missing else None
        skipped = [] if table is None else [str(s) for s in table["sample_id"]]
        if table is not None:
            write_view_skipped(folder, table)
        fields = {**view_path(p, manifest)[1], "image_root": str(Path(root).resolve())}
        return FeatureSet(sample_ids=manifest["sample_id"].astype(str).to_numpy(), embeddings=None,
                          key=folder.name, path=folder, n_forward=n_forward, n_images_embedded=n_images,
                          seconds=seconds, images_per_s=n_images / seconds if n_images and seconds else 0.0,
                          fields={**fields, "recipe": p.view_recipe.fields}, skipped=skipped,
                          missing_shards=missing)

    def serve(self, manifest: pd.DataFrame, root, encoders: list, ids: Identities, backend: Backend,
              t0: float | None = None) -> list[FeatureSet]:
        """Every row of ``manifest`` (image identities ``ids``) by each loaded encoder: look up,
        embed only what no chunk holds (one ``backend`` call per set of missing images), write
        the view. One FeatureSet per encoder, in order."""
        t0 = time.perf_counter() if t0 is None else t0
        plans = [self.look_up(enc, manifest, ids, root) for enc in encoders]
        counts = self.fill(encoders, plans, root, backend)
        return [self.view(p, manifest, root, n_forward, n_images, time.perf_counter() - t0)
                for p, (n_forward, n_images) in zip(plans, counts)]

    # --- entries computed from other entries (slide embeddings)
    def settled(self, fields: dict) -> bool:
        """The entry with key ``fields`` is complete (read without a lock)."""
        try:
            return FeatureCache(self.cache_dir, fields).settled()
        except FeatureCacheError:
            return False

    def entry(self, fields: dict, n_rows: int, shard_size: int,
              compute: Callable[[int, int], tuple[list, np.ndarray]]) -> tuple[Path, int]:
        """The entry with key ``fields`` (``<cache>/<fields['encoder']>/<key>/``): settled, it is read
        with no lock; else under its lock each missing shard ``i`` is written (atomically) from
        ``compute(lo, hi) -> (sample_ids, matrix)`` of its rows. Returns (folder, shards computed)."""
        cache = FeatureCache(self.cache_dir, fields, shard_size=shard_size, n_rows=n_rows)
        if cache.settled():  # read without the lock: a complete entry needs no write access
            return cache.path, 0
        cache.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(cache.path.parent / f"{cache.key}.lock", timeout=None):
            missing = cache.missing_shards()
            for i in missing:
                lo, hi = cache.shard_bounds(i)
                cache.write_shard(i, *compute(lo, hi))
        return cache.path, len(missing)

    # --- arrays (SPAR's frozen token sequences)
    def array(self, folder: str | Path, key: dict | str, make: Callable[[Callable], np.ndarray]) -> np.ndarray:
        """The array keyed by ``key`` under ``<cache>/<folder>`` (``folder`` relative to the cache, or
        absolute), memory-mapped: an entry of format "array" (:mod:`.entry`) ``<folder>/<fields
        key>/`` holding ``array.npy`` and a ``meta.json`` with the key fields, shape, dtype and the
        file's SHA-256 (``verify`` checks it). ``key``: the key fields (SPAR's tokens: the encoder's
        recipe and the inputs, :func:`robustbench_fm.methods.spar.run.token_fields`); a name (str) is
        first looked up as the bare ``<folder>/<name>.npy`` an earlier release wrote
        (:func:`.key.legacy_array`, read in place) and else keyed by ``{"array": name}``.

        Missing, it is made under ``<fields key>.lock``: ``make(alloc)`` calls ``alloc(shape, dtype)``
        once for the array to fill (a memory map of a temporary file beside it, so the whole array is
        never held in memory) and fills it; the file then replaces the name atomically
        (:func:`robustbench_fm.core.atomic.replace_atomic`) and ``meta.json`` is written last. Another
        process making the same array waits and reads it."""
        base = self.cache_dir / folder
        if isinstance(key, str):
            old = legacy_array(base, key)
            if old is not None:
                return Array(old, None).read_array()
            key = {"array": key}
        fields = _canonical(key)
        name = cache_key(fields)
        path = base / name
        if is_entry(path):
            return open_entry(path).read_array()
        base.mkdir(parents=True, exist_ok=True)
        with FileLock(base / f"{name}.lock", timeout=None):
            if not is_entry(path):
                self._make_array(path, name, fields, make)
        return open_entry(path).read_array()

    @staticmethod
    def _make_array(path: Path, name: str, fields: dict, make: Callable[[Callable], np.ndarray]) -> None:
        """Under the array's lock: ``array.npy`` from ``make`` (atomically), then its ``meta.json``; a
        maker that fails leaves nothing behind."""
        try:
            with replace_atomic(path / ARRAY_NAME, suffix=".npy") as tmp:
                held: list = []

                def alloc(shape, dtype):
                    held.append(np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=tuple(shape)))
                    return held[-1]
                make(alloc)
                if not held:
                    raise ValueError(f"{path}: make() allocated no array (alloc(shape, dtype) once)")
                for a in held:
                    a.flush()
                shape, dtype = tuple(held[-1].shape), held[-1].dtype.str
                held.clear()  # the memory maps closed before the file replaces the name
        except BaseException:
            with contextlib.suppress(OSError):
                path.rmdir()  # only when empty: nothing was made
            raise
        write_meta(path, ArrayMeta(name, fields, shape, dtype, file_sha256(path / ARRAY_NAME)))
