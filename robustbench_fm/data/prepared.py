"""Prepared images: every image of a job's manifest stored once at S x S pixels before any encoder
reads it (candor.md "Scope": "Every image is stored at 224x224 pixels. The image processor of each
encoder then resizes it to the input size of that encoder"; ablation (5) "Input Resolution":
"With source images of 512x512 pixels ... At 224x224 pixels ...").

``prepare(manifest, image_root, store_root, size)`` returns the same manifest with each ``path``
pointing into a parquet image store (``"<shard>.parquet#<row>"``, read by
:func:`robustbench_fm.data.parquet_images.read_parquet_image` through
:func:`robustbench_fm.data.images.read_image` like any other locator) and the store's folder as the
new image root. Every encoder of a panel reads the same store; its own transform then runs on the
stored image, as the paper describes.

Resize rule (the paper names no method, aspect handling or format; our reading): the image as
:func:`~robustbench_fm.data.images.read_image` returns it (8-bit 'L' or 'RGB', DICOM LUTs applied,
crop columns applied) is resized to exactly S x S with Pillow's bicubic filter, which widens its
support when it shrinks (antialiased); the aspect ratio is not kept ("stored at 224x224": square,
and no crop, so nothing of the image is lost); grayscale stays 'L' and colour 'RGB' (each
encoder's transform converts channels as it does for the originals); stored as lossless PNG, so
reading it back gives exactly the resized pixels. :func:`prepare_image` is the one home of the
rule (``scripts/prepare_dataset.py`` uses it too). With ``decode="scaled"`` (the default) a JPEG
is first decoded at the largest DCT scale that leaves at least twice S on both sides
(:func:`robustbench_fm.data.images.draft_scale`); ``decode="exact"`` decodes it at full size,
the pixels of a store made before the option existed.

Store layout (content-keyed and resumable like the feature cache,
:mod:`robustbench_fm.features.cache`)::

    <store_root>/<S>px/<key>/
        meta.json              key fields, shard_size, n_images, n_shards and per complete shard
                               its file, row count, SHA-256 and number of failed rows
        shard-00000.parquet    unique source images [0, shard_size): columns source (the
        shard-00001.parquet    locator: path and crop), image (PNG bytes), error ('' or why
        ...                    the source could not be read)

``key``: the first 16 hex digits of the SHA-256 of the canonical JSON of :func:`key_fields`: the
format version :data:`PREPARE_VERSION`, the size, the resize rule, the resolved image root, the
hash of the unique source locators in manifest order (``path`` and the crop columns; labels and
sample_ids do not change pixels), their number, Pillow's version and, for ``decode="scaled"``
only, ``"decode": "scaled"`` (an exact store keeps the key it had before the field existed). Bump
:data:`PREPARE_VERSION` when :func:`read_image` or :func:`prepare_image` changes what it returns
for every image (it is part of :func:`recipe`, so a bump also re-embeds every prepared image's
features); a change confined to images one can find by their header is an upgrade in place
instead, as for EXIF orientation below.
One image is stored once however many manifest rows (occluded variants, paired subsets) use it.

EXIF orientation (issue 54): :func:`read_image` turns an image upright as its EXIF Orientation
says. Entries written before did not; their ``meta.json`` lacks ``"upright": true``. When such an
entry is complete and used (its own manifest, or found by :func:`held_images`), every source's
header is read once and only the shards holding an image whose orientation is not 1 are decoded
again (:func:`make_upright`, one warning line), then the entry is marked;
its key, and so the features of its other images, stay. A read-only entry is checked on every use
and refused in one line if it holds a turned image.

Shards are written whole and atomically (temp file, fsync, rename) with byte-deterministic
parquet settings; ``meta.json`` holds no timestamps. A run killed at any point leaves only
complete shards; the next run writes just the missing ones, and the result is byte-identical to
an uninterrupted run. Writers hold ``<S>px/<key>.lock`` (a second process waits, then finds the
store complete); a complete store is read without lock or write access.

Per image: with ``identities`` (the caller's content identity of each row's pixels, which the
per-image feature store computes anyway), a complete entry records its sources' identities in
:data:`IDENTITIES_NAME`, and a later call whose own entry is not complete finds each source in
every complete entry of the same recipe (format, size, resize rule, Pillow major): the images
held are read from there, only the others are decoded, into a new entry of just them, and the
returned paths are ``<key>/<locator>`` under ``<store_root>/<S>px`` (:func:`held_images`; an
exact request never finds a scaled entry, nor the reverse). A
pool, subset, reorder or extension of prepared images, or the same files under another root,
decodes only what no entry holds (issue 31 item 4). Without ``identities`` a call reads or
writes its own entry only.

Unreadable sources (``on_bad_image``): ``"error"`` stops at the first with a one-line
:class:`PreparedImageError` naming the file, manifest row and sample_id; ``"skip"`` stores the row
with empty image bytes and the error, so the extraction's reader fails on it with that error and
skips it like any unreadable image. An ``"error"`` run on a store holding failed rows re-reads
them: it raises if one still fails, else rewrites their shards.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import multiprocessing
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from ..core.atomic import write_atomic
from ..core.devices import usable_cores
from ..core.errors import InvalidSetting, UserError
from ..core.locking import acquire_waiting
from ..core.shards import META_NAME, SHARD_NAME, ShardedEntry, file_sha256, json_bytes, parquet_bytes
from ..core.text import one_line
from .images import (
    CROP_COLUMNS,
    DEFAULT_DECODE,
    check_size,
    decode_fields,
    file_orientation,
    locator_file,
    need_of,
    read_image,
)
from .manifest import SOURCE_COLUMN

log = logging.getLogger("robustbench_fm.data")

#: ``resolution=native``: the images as the dataset ships them (no prepared store).
NATIVE = "native"
#: Bump when the layout, :func:`read_image` or :func:`prepare_image` changes what a store holds.
PREPARE_VERSION = 1
#: The resize rule, in words (a key field: another rule is another store).
RESIZE_RULE = "PIL bicubic (antialiased) to size x size, aspect ratio not kept, mode L/RGB kept, PNG"
#: Smallest side accepted (a typo such as resolution=2 is refused).
MIN_SIZE = 8
DEFAULT_SHARD_SIZE = 1024
#: Images per parquet row group: a random read decodes one group (~64 PNGs), not a whole shard.
ROW_GROUP_SIZE = 64
PARQUET_META_KEY = b"robustbench_fm.prepared"
#: each complete entry's sources by identity (``identity``, ``locator``): the per-image index
IDENTITIES_NAME = "identities.parquet"
_WRITE_OPTIONS = dict(compression={"source": "zstd", "image": "none", "error": "zstd"}, use_dictionary=False,
                      write_statistics=False, version="2.6", data_page_version="1.0", store_schema=True)
_SCHEMA_FIELDS = [pa.field("source", pa.string(), nullable=False), pa.field("image", pa.binary(), nullable=False),
                  pa.field("error", pa.string(), nullable=False)]


class PreparedImageError(UserError, RuntimeError):
    """A source image could not be read for the prepared store, or the store is damaged (one line)."""


def parse_resolution(value, key: str = "resolution") -> int | None:
    """``native`` / None -> None (no store); a side in pixels (int or digit string) -> that int.
    Anything else is a one-line error naming ``key`` and the accepted values."""
    if value is None or (isinstance(value, str) and value.strip().lower() == NATIVE):
        return None
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit())):
        raise InvalidSetting(f"{key}={value!r}: use {NATIVE} (the images as shipped) or a side in pixels, "
                             f"e.g. {key}=224 (candor.md: every image stored at 224 x 224)")
    size = int(value)
    if size < MIN_SIZE:
        raise InvalidSetting(f"{key}={size}: too small; use {NATIVE}, 224 (the paper) or 512 (the resolution ablation)")
    return size


def prepare_image(image: Image.Image, size: int) -> Image.Image:
    """``image`` resized to exactly ``size`` x ``size`` by the module's rule (bicubic, antialiased
    when shrinking, aspect ratio not kept, mode kept)."""
    return image.resize((int(size), int(size)), Image.Resampling.BICUBIC)


def encode_png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _crop_part(row: dict) -> str:
    vals = []
    for c in CROP_COLUMNS:
        v = row.get(c)
        vals.append(0 if v is None or (isinstance(v, float) and math.isnan(v)) else int(v))
    return "" if not any(vals) else "|crop=" + ",".join(map(str, vals))


def source_locators(manifest: pd.DataFrame) -> tuple[list[dict], np.ndarray]:
    """(unique sources in order of first use, each ``{"source", "path", crop columns, "first_row"}``;
    for every manifest row the index of its source). A source is ``path`` plus the row's crop."""
    if "path" not in manifest.columns:
        raise InvalidSetting("manifest has no 'path' column; prepared images need each row's image locator")
    crops = [c for c in CROP_COLUMNS if c in manifest.columns]
    records = manifest[["path", *crops]].to_dict("records")
    seen: dict[str, int] = {}
    sources, index = [], np.empty(len(records), dtype=np.int64)
    for i, rec in enumerate(records):
        name = f"{rec['path']}{_crop_part(rec)}"
        j = seen.get(name)
        if j is None:
            j = seen[name] = len(sources)
            sources.append({"source": name, **{k: rec[k] for k in ("path", *crops)}, "first_row": i})
        index[i] = j
    return sources, index


def pillow_version() -> str:
    return Image.__version__


def key_fields(sources: list[dict], image_root, size: int, decode: str = DEFAULT_DECODE) -> dict:
    """What determines the stored pixels (module docstring, "key")."""
    blob = "\x1f".join(s["source"] for s in sources).encode()
    return {"format": PREPARE_VERSION, "size": int(size), "resize": RESIZE_RULE,
            "image_root": str(Path(image_root).resolve()),
            "sources_hash": hashlib.sha256(blob).hexdigest()[:16], "n_images": len(sources),
            "pillow": pillow_version(), **decode_fields(decode)}


def recipe(size: int, decode: str = DEFAULT_DECODE) -> dict:
    """What turns a source image into its stored copy, without the sources, folder or patch
    versions: the per-image feature store's identity of a prepared image
    (:func:`robustbench_fm.features.store.derived_ids`), and what :func:`held_images` matches."""
    return _recipe_of({"format": PREPARE_VERSION, "size": int(parse_resolution(size)), "resize": RESIZE_RULE,
                       "pillow": pillow_version(), **decode_fields(decode)})


def _recipe_of(fields: dict) -> dict:
    """The recipe part of an entry's key fields (:func:`key_fields`); the decode mode only when
    scaled (an exact entry's recipe is that of a store made before the field existed)."""
    out = {"format": fields.get("format"), "size": fields.get("size"), "resize": fields.get("resize"),
           "pillow_major": str(fields.get("pillow", "")).split(".")[0]}
    return {**out, "decode": fields["decode"]} if "decode" in fields else out


def store_key(fields: dict) -> str:
    blob = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class PreparedStore(ShardedEntry):
    """One store entry ``<root>/<size>px/<key>/`` (module docstring; layout, listing and atomic
    writes: :class:`robustbench_fm.core.shards.ShardedEntry`). An existing entry keeps the
    ``shard_size`` it was started with."""

    def __init__(self, root: str | Path, fields: dict, shard_size: int = DEFAULT_SHARD_SIZE):
        self.fields = json.loads(json.dumps(fields, sort_keys=True))
        self.key = store_key(self.fields)
        self.path = Path(root) / f"{int(self.fields['size'])}px" / self.key
        self.meta_path = self.path / META_NAME
        self._records: dict[int, dict] = {}
        self.upright = True  # a new entry's images are read upright (EXIF orientation applied)
        if self.meta_path.exists():
            try:
                meta = json.loads(self.meta_path.read_text())
                if meta.get("key") != self.key or meta.get("fields") != self.fields:
                    raise ValueError("records other key fields")
                shard_size = int(meta["shard_size"])
                self._records = {int(r["index"]): r for r in meta["shards"]}
                self.upright = bool(meta.get("upright", False))  # written before EXIF orientation was applied
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise PreparedImageError(f"{self.meta_path}: unreadable or foreign ({one_line(exc)}); delete the "
                                         f"folder {self.path} to prepare the images again") from None
        self._set_layout(self.path, int(self.fields["n_images"]), shard_size, "image")

    @property
    def n_images(self) -> int:
        return self.n_items

    def locator(self, j: int) -> str:
        """The manifest ``path`` of source ``j``, relative to :attr:`path`."""
        return f"{SHARD_NAME.format(j // self.shard_size)}#{j % self.shard_size}"

    def _record(self, i: int) -> dict:
        """The meta record of complete shard ``i`` (hashed now when a killed run did not record it)."""
        rec = self._records.get(i)
        if rec is None:
            path = self.shard_path(i)
            try:
                errors = pq.read_table(path, columns=["error"]).column("error").to_pylist()
            except Exception as exc:  # noqa: BLE001  (any pyarrow failure means a bad file)
                raise PreparedImageError(f"{path}: unreadable shard ({one_line(exc) or type(exc).__name__}); "
                                         "delete this file and run again to rewrite it") from None
            rec = self._records[i] = {"index": i, "file": path.name, "rows": len(errors), "sha256": file_sha256(path),
                                      "failed": sum(bool(e) for e in errors)}
        return rec

    def meta(self) -> dict:
        complete = self.complete_shards()
        return {"format": PREPARE_VERSION, "key": self.key, "fields": self.fields, "shard_size": self.shard_size,
                "n_images": self.n_images, "n_shards": self.n_shards,
                "status": "complete" if len(complete) == self.n_shards else "partial",
                "shards": [self._record(i) for i in complete], **({"upright": True} if self.upright else {})}

    def write_meta(self) -> None:
        self._write_meta_bytes(json_bytes(self.meta()))

    def failed(self) -> dict[int, str]:
        """{source index: error} of the failed rows of the complete shards."""
        out = {}
        for i in self.complete_shards():
            if not self._record(i)["failed"]:
                continue
            lo, _ = self.shard_bounds(i)
            errors = pq.read_table(self.shard_path(i), columns=["error"]).column("error").to_pylist()
            out.update({lo + r: e for r, e in enumerate(errors) if e})
        return out

    def write_shard(self, i: int, sources: list[str], images: list[bytes], errors: list[str]) -> Path:
        lo, hi = self.shard_bounds(i)
        if not len(sources) == len(images) == len(errors) == hi - lo:
            raise ValueError(f"shard {i} holds sources [{lo}, {hi}): got {len(sources)} rows")
        schema = pa.schema(_SCHEMA_FIELDS, metadata={PARQUET_META_KEY: json.dumps(
            {"key": self.key, "fields": self.fields, "shard_size": self.shard_size}, sort_keys=True).encode()})
        table = pa.Table.from_arrays([pa.array(sources, pa.string()), pa.array(images, pa.binary()),
                                      pa.array(errors, pa.string())], schema=schema)
        path, sha = self._write_shard_bytes(i, parquet_bytes(table, ROW_GROUP_SIZE, _WRITE_OPTIONS))
        self._records[i] = {"index": i, "file": path.name, "rows": len(sources), "sha256": sha,
                            "failed": sum(bool(e) for e in errors)}
        self.write_meta()
        return path

    def sources(self) -> list[str]:
        """The source locator of every image of the complete entry, in order (column ``source``)."""
        out = []
        for i in range(self.n_shards):
            out.extend(pq.read_table(self.shard_path(i), columns=["source"]).column("source").to_pylist())
        return out

    def drop_shards(self, shards) -> None:
        shards = list(shards)
        self._unlink_shards(shards)
        for i in shards:
            self._records.pop(i, None)
        self.write_meta()


@dataclass
class Prepared:
    """What :func:`prepare` returns: the manifest whose ``path`` points into the store (crop columns
    dropped: already applied), the store folder (the new image root: the entry's folder, or
    ``<store_root>/<S>px`` when the images come from several entries, paths ``<key>/<locator>``),
    and what this call did (``key``: the entry it wrote or read; None when every image came from
    earlier entries)."""

    manifest: pd.DataFrame
    root: Path
    key: str | None
    size: int
    n_images: int
    n_decoded: int  # source images read and resized by this call (0 when the store was complete)
    shards_written: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)  # source index -> error (on_bad_image="skip")


def _decode(job: tuple) -> tuple[bytes, str]:
    """(image_root, source record, size, decode) -> (PNG bytes, '') or (b'', 'Type: message')."""
    image_root, rec, size, decode = job
    need = need_of("squash", size) if decode == "scaled" else None  # S x S: both sides >= S
    try:
        return encode_png(prepare_image(check_size(read_image(image_root, rec, need)), size)), ""
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001  (reported by the caller, one line)
        short = one_line(exc) or type(exc).__name__
        return b"", f"{type(exc).__name__}: {short.replace(f'{image_root}{os.sep}', '')}"


def prepare_workers(num_workers, n_images: int) -> int:
    """Decoding processes: ``"auto"`` = the cores this process may use (at most 16), else the
    number given; never more than there are images."""
    if num_workers == "auto":
        n = usable_cores()
        num_workers = min(16, n)
    return max(0, min(int(num_workers), n_images))


def prepare(manifest: pd.DataFrame, image_root: str | Path, store_root: str | Path, size: int,
            shard_size: int = DEFAULT_SHARD_SIZE, workers: int | str = 0, on_bad_image: str = "error",
            progress: bool = True, identities=None, decode: str = DEFAULT_DECODE) -> Prepared:
    """Store every image of ``manifest`` (under ``image_root``) at ``size`` x ``size`` in the
    store under ``store_root`` (writing only what is missing) and return the manifest that reads
    them (module docstring). ``workers`` > 1 decodes in that many forked processes.

    ``identities``: one per manifest row, what identifies the pixels the row selects whatever its
    path (the per-image feature store's content identity of the file, locator and crop:
    :func:`robustbench_fm.features.store.source_ids`). With them the store is found per image
    (module docstring, "Per image"): a source some complete entry of the same recipe already
    holds is read from there, and only the others are decoded, into one new entry.

    ``decode``: ``"scaled"`` (a JPEG decoded at the largest DCT scale that leaves ``size`` px on
    its short side, :func:`robustbench_fm.data.images.draft_scale`) or ``"exact"`` (full-size
    decode, the pixels and key of a store made before scaled decoding); keyed, so the two never mix.
    ``on_bad_image`` (``"error"`` or ``"skip"``) comes checked from the run's extraction options
    (:class:`robustbench_fm.features.options.ExtractOptions`, the one check of it).
    """
    size = parse_resolution(size)
    if size is None:
        raise InvalidSetting("prepare needs a side in pixels; resolution=native reads the images as shipped")
    manifest = manifest.reset_index(drop=True)
    sources, index = source_locators(manifest)
    image_root = Path(image_root)
    store = PreparedStore(store_root, key_fields(sources, image_root, size, decode), shard_size=shard_size)
    src_ids = None
    if identities is not None:
        ids = np.asarray(identities, dtype=object)
        if len(ids) != len(manifest):
            raise ValueError(f"prepare: {len(ids)} identities for {len(manifest)} manifest rows")
        src_ids = [str(ids[s["first_row"]]) for s in sources]
        hit = not store.missing_shards() and not (on_bad_image == "error" and store.failed())
        if not hit:
            held = held_images(store_root, size, decode)
            if any(i in held for i in src_ids):
                return _from_held(manifest, sources, index, src_ids, held, image_root, store_root, size,
                                  shard_size, workers, on_bad_image, progress, decode)
    n_decoded, written = 0, []
    # a complete store is only read (no lock, no write access); "error" mode re-reads failed rows;
    # an entry of a release that did not apply EXIF orientation is checked once (make_upright)
    if not store.missing_shards() and not store.upright and not os.access(store.path, os.W_OK):
        if turned := _turned(store):
            raise PreparedImageError(f"{store.path}: {len(turned)} images with an EXIF orientation were "
                                     "stored unturned by an earlier release and the store is read-only; make it "
                                     "writable or set paths.prepared_dir to another folder to store them upright")
    elif store.missing_shards() or (on_bad_image == "error" and store.failed()) or not store.upright:
        lock = acquire_waiting(store.path.parent / f"{store.key}.lock", f"preparing {store.path}", log)
        try:
            store = PreparedStore(store_root, store.fields, shard_size=shard_size)  # what the holder wrote
            n_decoded, written = _fill(store, manifest, sources, image_root, size, workers, on_bad_image, progress,
                                       lock.refresh, decode)
            n_decoded += make_upright(store)
        finally:
            lock.release()
    failed = store.failed()
    if failed:
        first = min(failed)
        log.warning("%s: %d of %d source images could not be read (on_bad_image=skip); first: %s: %s", store.path,
                    len(failed), len(sources), sources[first]["source"], failed[first])
    if src_ids is not None:
        _record_identities(store, src_ids)
    out = manifest.drop(columns=[c for c in CROP_COLUMNS if c in manifest.columns])
    out["path"] = [store.locator(int(j)) for j in index]
    return Prepared(manifest=out, root=store.path, key=store.key, size=size, n_images=len(sources),
                    n_decoded=n_decoded, shards_written=written, failed=failed)


def _source_record(source: str) -> dict:
    """A stored ``source`` (``path`` plus ``|crop=l,t,r,b`` when cropped) as the record
    :func:`read_image` reads."""
    path, sep, crop = source.rpartition("|crop=")
    if not sep:
        return {"path": source}
    return {"path": path, **dict(zip(CROP_COLUMNS, (int(v) for v in crop.split(","))))}


def _turned(store: PreparedStore) -> list[int]:
    """The sources of a complete entry whose file has an EXIF orientation other than 1 (header reads)."""
    root = Path(store.fields["image_root"])
    return [j for j, src in enumerate(store.sources())
            if file_orientation(root / locator_file(_source_record(src)["path"])) != 1]


def make_upright(store: PreparedStore) -> int:
    """A complete entry written before :func:`read_image` applied EXIF orientation (``meta.json``
    without ``"upright": true``) made right once: its sources whose file has an orientation other
    than 1 (:func:`_turned`: one header read per source) are read again, their shards rewritten,
    and the entry marked upright; the other images, whose pixels did not change, are kept. Under
    the entry's lock. Returns the images decoded (0 for an upright or incomplete entry)."""
    if store.upright or store.missing_shards():
        return 0
    turned = _turned(store)
    sources, root = store.sources(), Path(store.fields["image_root"])
    decode = "scaled" if store.fields.get("decode") == "scaled" else "exact"
    n = 0
    for i in sorted({j // store.shard_size for j in turned}):
        lo, hi = store.shard_bounds(i)
        results = [_decode((root, _source_record(sources[j]), int(store.fields["size"]), decode))
                   for j in range(lo, hi)]
        store.write_shard(i, sources[lo:hi], [b for b, _ in results], [e for _, e in results])
        n += hi - lo
    store.upright = True
    store.write_meta()
    if turned:
        log.warning("%s: %d of %d images have an EXIF orientation and were stored unturned by an earlier release; "
                    "stored them upright (%d images of %d shards read again)", store.path, len(turned),
                    store.n_images, n, len({j // store.shard_size for j in turned}))
    return n


def _upright_entry(store: PreparedStore) -> bool:
    """Whether the complete entry ``store`` holds every image upright, making it so when it is an
    earlier release's and writable (:func:`make_upright`); a read-only one only if none is turned."""
    if store.upright:
        return True
    if not os.access(store.path, os.W_OK):
        return not _turned(store)
    lock = acquire_waiting(store.path.parent / f"{store.key}.lock", f"checking {store.path}", log)
    try:
        make_upright(PreparedStore(store.path.parent.parent, store.fields, shard_size=store.shard_size))
    finally:
        lock.release()
    return True


def held_images(store_root: str | Path, size: int, decode: str = DEFAULT_DECODE) -> dict[str, str]:
    """``{identity: "<key>/<locator>"}`` of the images the complete entries under
    ``<store_root>/<size>px/`` hold for this package's recipe (:func:`recipe`: format, size, resize
    rule, Pillow major, decode mode), read from each entry's :data:`IDENTITIES_NAME`; a source that failed to
    read is left out (it is read again, or skipped again). Entries are read in key order and the
    first holder of an identity wins."""
    want, out = recipe(size, decode), {}
    for ids_file in sorted((Path(store_root) / f"{int(size)}px").glob(f"*/{IDENTITIES_NAME}")):
        folder = ids_file.parent
        try:
            fields = json.loads((folder / META_NAME).read_text())["fields"]
            if _recipe_of(fields) != want:
                continue
            entry = PreparedStore(store_root, fields)
            if entry.key != folder.name or entry.missing_shards() or not _upright_entry(entry):
                continue
            failed = entry.failed()
            table = pq.read_table(ids_file, columns=["identity", "locator"]).to_pydict()
        except (OSError, ValueError, KeyError, TypeError, PreparedImageError, pa.ArrowException) as exc:
            log.debug("prepared entry %s not indexed: %s", folder, one_line(exc))
            continue
        if len(table["identity"]) != entry.n_images:
            continue
        for j, (ident, loc) in enumerate(zip(table["identity"], table["locator"])):
            if j not in failed:
                out.setdefault(ident, f"{folder.name}/{loc}")
    return out


def _record_identities(store: PreparedStore, src_ids: list[str]) -> None:
    """``<entry>/identities.parquet``: each source's identity and locator, once the entry is
    complete (what :func:`held_images` reads). A read-only store is left as it is."""
    if store.missing_shards():
        return
    path = store.path / IDENTITIES_NAME
    table = pa.table({"identity": pa.array(src_ids, pa.string()),
                      "locator": pa.array([store.locator(j) for j in range(store.n_images)], pa.string())})
    data = parquet_bytes(table, max(len(src_ids), 1), {"compression": "zstd", "use_dictionary": False,
                                                       "write_statistics": False, "version": "2.6"})
    try:
        if path.is_file() and path.read_bytes() == data:
            return
        write_atomic(path, lambda f: f.write(data))
    except OSError as exc:
        log.debug("%s: identities not recorded (%s)", store.path, one_line(exc))


def _from_held(manifest, sources, index, src_ids, held, image_root, store_root, size, shard_size, workers,
               on_bad_image, progress, decode) -> Prepared:
    """The manifest read from the entries that hold its sources, the sources none holds stored
    first in one new entry of just them (their own :func:`prepare`); paths are
    ``<key>/<locator>`` under ``<store_root>/<size>px``."""
    todo = [j for j, i in enumerate(src_ids) if i not in held]
    where = dict(held)
    n_decoded, written, failed, key = 0, [], {}, None
    if todo:
        rows = manifest.iloc[[sources[j]["first_row"] for j in todo]].reset_index(drop=True)
        new = prepare(rows, image_root, store_root, size, shard_size=shard_size, workers=workers,
                      on_bad_image=on_bad_image, progress=progress, identities=[src_ids[j] for j in todo],
                      decode=decode)
        for k, j in enumerate(todo):
            where[src_ids[j]] = f"{new.key}/{new.manifest['path'].iloc[k]}"
        n_decoded, written, key = new.n_decoded, new.shards_written, new.key
        failed = {todo[k]: e for k, e in new.failed.items()}
    log.info("prepared images at %d px: %d of %d read from earlier entries, %d newly stored", size,
             len(sources) - len(todo), len(sources), len(todo))
    out = manifest.drop(columns=[c for c in CROP_COLUMNS if c in manifest.columns])
    out["path"] = [where[src_ids[int(j)]] for j in index]
    return Prepared(manifest=out, root=Path(store_root) / f"{int(size)}px", key=key, size=size,
                    n_images=len(sources), n_decoded=n_decoded, shards_written=written, failed=failed)


def _describe(image_root: Path, manifest: pd.DataFrame, src: dict) -> str:
    """The file and where its first row came from: the label file's row when the manifest says
    (:data:`~.manifest.SOURCE_COLUMN`), else that row's position in ``manifest`` (which may be
    the part of the job's manifest no cache holds) and its sample_id."""
    row = src["first_row"]
    source = manifest[SOURCE_COLUMN].iloc[row] if SOURCE_COLUMN in manifest.columns else None
    if isinstance(source, str) and source:
        return f"{image_root / str(src['path'])} ({source})"
    return (f"{image_root / str(src['path'])} (manifest row {row}, sample_id "
            f"{str(manifest['sample_id'].iloc[row]) if 'sample_id' in manifest.columns else row!r})")


def _fill(store: PreparedStore, manifest, sources, image_root: Path, size: int, workers, on_bad_image: str,
          progress: bool, heartbeat, decode: str = DEFAULT_DECODE) -> tuple[int, list[int]]:
    """Write the missing shards (after re-reading failed rows in ``"error"`` mode); (images
    decoded, shards written)."""
    n_decoded = 0
    failed = store.failed() if on_bad_image == "error" else {}
    for j in sorted(failed):  # an earlier skip run's failures: readable now, or stop naming the first
        _, error = _decode((image_root, sources[j], size, decode))
        n_decoded += 1
        if error:
            raise PreparedImageError(f"{_describe(image_root, manifest, sources[j])}: cannot read image: {error}")
    if failed:
        store.drop_shards(sorted({j // store.shard_size for j in failed}))
    missing = store.missing_shards()
    if not missing:
        return n_decoded, []
    store.path.mkdir(parents=True, exist_ok=True)
    store.write_meta()
    total = sum(hi - lo for lo, hi in map(store.shard_bounds, missing))
    log.info("preparing %d of %d images at %d x %d px in %s", total, store.n_images, size, size, store.path)
    n_workers = prepare_workers(workers, total)
    pool = multiprocessing.get_context("fork").Pool(n_workers) if n_workers > 1 else None
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, unit="img", desc=f"prepare {size}px", dynamic_ncols=True)
    written = []
    try:
        for i in missing:
            lo, hi = store.shard_bounds(i)
            jobs = [(image_root, sources[j], size, decode) for j in range(lo, hi)]
            results = pool.map(_decode, jobs, chunksize=8) if pool is not None else [_decode(job) for job in jobs]
            n_decoded += len(jobs)
            if on_bad_image == "error":
                bad = next((k for k, (_, e) in enumerate(results) if e), None)
                if bad is not None:
                    raise PreparedImageError(f"{_describe(image_root, manifest, sources[lo + bad])}: cannot read "
                                             f"image: {results[bad][1]}")
            store.write_shard(i, [sources[j]["source"] for j in range(lo, hi)], [b for b, _ in results],
                              [e for _, e in results])
            written.append(i)
            heartbeat()
            if bar is not None:
                bar.update(hi - lo)
    finally:
        if bar is not None:
            bar.close()
        if pool is not None:
            pool.terminate()
            pool.join()
    return n_decoded, written
