"""Feature extraction: manifest + encoder -> cached (N, D) float32 features.

Only the shards of the cache entry that are missing are computed (the set difference of the
manifest's sample_ids against the complete shards); each shard is written as soon as its last
batch is embedded. Batches never straddle a shard boundary and always start at a shard's first
row, so every shard sees the same batches however often the run was interrupted, and a resumed
entry is byte-identical to an uninterrupted one (same batch size and device).

Unreadable images (``on_bad_image``): ``"error"`` (default) stops at the first image that cannot
be read or transformed with a one-line :class:`ImageReadError` naming the file, the manifest row
and the sample_id (shards already written are kept). ``"skip"`` keeps going: the row gets an
all-NaN embedding in its shard (in the forward pass it is replaced by a zero image of the batch's
shape, so the other rows see exactly the batches of a clean run) and is listed in the entry's
``skipped.csv``; :attr:`FeatureSet.skipped` names those rows so that callers drop them from every
stage and every encoder. The policy is not part of the cache key: a warm run in ``"skip"`` mode
returns the recorded list without reading any image; a run in ``"error"`` mode on an entry with
skipped rows re-reads just those images, raises if one still fails, and otherwise deletes and
recomputes the shards that held them (the result is byte-identical to a clean run).
"""
from __future__ import annotations

import collections
import logging
import os
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch
from PIL import Image
from torch.utils.data import Dataset

from ...core.devices import torch_threads, usable_cores
from ...core.errors import InvalidSetting, UserError
from ...core.text import one_line
from ...data.images import check_size, read_image
from ...data.manifest import SOURCE_COLUMN
from ..cache import FeatureCache, FeatureCacheError, FeatureSet, unwritable
from ..occlusion import occlude_row

log = logging.getLogger("robustbench_fm.features")

#: ``reader(image_root, row) -> PIL.Image``; ``row`` is the manifest row as a dict.
Reader = Callable[[Path, dict], Image.Image]


#: Accepted values of ``extract(on_bad_image=...)``.


class ImageReadError(UserError, RuntimeError):
    """An image could not be read or transformed; the message names the file and manifest row."""


class ExtractionInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) during extraction; the message says how much of the cache entry is saved
    (complete shards are kept: the same call resumes from them)."""


def default_reader(image_root: Path, row: dict, need=None) -> Image.Image:
    """The row's image as 'L' or 'RGB', decoded eagerly: :func:`robustbench_fm.data.images.read_image`
    (PNG 8/16-bit, JPEG, TIFF, DICOM with its LUTs, HDF5/NPZ rows, crop columns), at least
    :data:`~robustbench_fm.data.images.MIN_IMAGE_SIDE` px on its short side (:func:`check_size`);
    ``need`` (:class:`~robustbench_fm.data.images.Need`): a JPEG decoded at the DCT scale that leaves it."""

    return check_size(read_image(image_root, row, need))


def default_num_workers(device: torch.device | str) -> int:
    """Decode workers that keep the model fed without starving it of cores.

    CUDA: the model runs off the CPU, so decoding gets every core this process may use (the
    affinity mask: a Slurm job's allocation, not the node) but one, at most 16; one worker
    decodes ~100-300 PNGs/s at 224 px. CPU: one worker, which decodes the next batch
    while the model's threads run the current one; decoding is ~2 % of a ViT-S forward on CPU,
    so more workers would only take cycles from the model. A single core decodes inline (0).
    Measured on a shared, loaded 2-core machine (random_vit_s, 224 px PNGs, batch 32; four
    paired runs; extract / forward throughput): one worker 1.05, 1.00, 0.87, 0.92; inline 0.92,
    0.93, 0.67, 1.22. Decoding alone runs at 100-230 img/s against ~4 img/s for the model, so
    on CPU either setting keeps the model the bottleneck; the worker matters on GPU.
    """
    n = usable_cores()
    if torch.device(device).type == "cuda":
        return max(1, min(16, n - 1))
    return 1 if n >= 2 else 0


def _describe(image_root, row: dict, i: int) -> str:
    """The file and where the row came from: its label file's row (``source_row``, set by
    ``dataset=csv``), else its position ``i`` in the rows read and its sample_id (the rows read are
    those no cache holds, whose sample_ids are image ids in the per-image store)."""
    where = str(Path(image_root) / row["path"]) if "path" in row and image_root is not None else \
        f"sample_id {str(row.get('sample_id'))!r}"
    source = row.get(SOURCE_COLUMN)
    if isinstance(source, str) and source:
        return f"{where} ({source})"
    return f"{where} (manifest row {i}, sample_id {str(row.get('sample_id'))!r})"


class _RowsDataset(Dataset):
    """Manifest rows -> (row index, tensor, error); errors travel as strings, never raise.

    ``error`` is ``(message, short)``: the one-line message of :class:`ImageReadError` (naming
    the file, row and sample_id) and the ``Type: message`` kept in ``skipped.csv`` (with the
    image root stripped, so the file does not depend on where the images live).
    """

    def __init__(self, records: list[dict], image_root, transform, reader: Reader):
        self.records, self.image_root, self.transform, self.reader = records, image_root, transform, reader

    def __len__(self):
        return len(self.records)

    def _error(self, i: int, what: str) -> tuple[str, str]:
        short = " ".join(what.split())
        if self.image_root is not None:
            short = short.replace(f"{self.image_root}{os.sep}", "")
        return f"{_describe(self.image_root, self.records[i], i)}: cannot read image: {short}", short

    def __getitem__(self, i: int):
        row = self.records[i]
        try:
            x = self.transform(occlude_row(self.reader(self.image_root, row), row))
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"transform returned {type(x).__name__}, expected a tensor")
            return i, x, None
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001  (reported in the main process, one line)
            msg = " ".join(str(exc).split()) or type(exc).__name__
            return i, None, self._error(i, f"{type(exc).__name__}: {msg}")

    def collate(self, items):
        """-> (rows, batch or None, errors): ``errors`` is ``[(position, row, (message, short))]``.

        A failed row's slot holds zeros of the batch's shape, so the batch has the size and
        composition of a clean run's; a tensor whose shape differs from the batch's most common
        shape is a failed row too. ``batch`` is None when every row failed.
        """
        rows = [i for i, _, _ in items]
        errors = [(pos, i, e) for pos, (i, _, e) in enumerate(items) if e is not None]
        good = [(pos, x) for pos, (_, x, e) in enumerate(items) if e is None]
        if not good:
            return rows, None, errors
        shape = collections.Counter(tuple(x.shape) for _, x in good).most_common(1)[0][0]
        for pos, x in good:
            if tuple(x.shape) != shape:
                errors.append((pos, rows[pos], self._error(
                    rows[pos], f"ValueError: transform gave shape {tuple(x.shape)}, the batch has {shape}")))
        errors.sort()
        bad = {pos for pos, _, _ in errors}
        ref = next(x for pos, x in good if pos not in bad)
        batch = torch.stack([torch.zeros_like(ref) if pos in bad else x for pos, (_, x, _) in enumerate(items)])
        return rows, batch, errors


def _one_thread(enabled: bool):
    """Decode/transform in the main process with one torch thread (:func:`torch_threads`): the
    transform's small tensor ops gain nothing from intra-op threads. Workers already use one."""
    return torch_threads(1 if enabled else 0)


#: Decoded batches held in flight by the decode workers are bounded by this many bytes.
PREFETCH_BYTES = 2 << 30


def _malloc_trim() -> Callable[[], None]:
    """A function that hands the C heap's free memory back to the OS (glibc ``malloc_trim(0)``);
    a no-op where the C library has none (macOS, musl, Windows).

    Called after every forward batch: the model's batch-sized temporaries in this process (tens
    of MB each) are freed back to glibc's heap, not to the OS. glibc raises its mmap threshold
    when a large mmapped block is freed (up to 32 MB), after which such blocks come from the
    heap arenas, whose free pages it keeps; the retained, fragmented memory then grew with the
    number of batches (planted_blur on CPU, batch 32: 1,065 MiB peak over 2,000 images vs 1,433
    MiB over 20,000; with the trim ~815 MiB for both). A trim takes ~0.1 ms.
    """
    try:
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    except Exception:  # noqa: BLE001  (no glibc: nothing to do)
        return lambda: None
    return lambda: trim(0)


def _batches(cache: FeatureCache, shards: list[int], batch_size: int,
             start: dict[int, int] | None = None) -> list[list[int]]:
    """Row-index batches over ``shards``, each within one shard and starting at its first row;
    ``start[s]`` (a multiple of ``batch_size``: rows a partial shard holds) skips that many rows
    of shard ``s``, so the remaining batches are those of an uninterrupted run."""
    out = []
    for s in shards:
        lo, hi = cache.shard_bounds(s)
        out.extend(list(range(b, min(b + batch_size, hi)))
                   for b in range(lo + (start or {}).get(s, 0), hi, batch_size))
    return out


#: Seconds between flushes of the shard in progress to its partial file (:mod:`.cache`, "Partial
#: shards"): a killed extraction loses at most this much work plus one batch, on any device.
FLUSH_SECONDS = 10.0


def embed_full_batch(encoder, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """``encoder.embed(x)`` on a batch padded with zero images to ``batch_size`` rows, the padding's
    outputs dropped: every forward has the same shape, so a row's vector does not depend on how many
    rows share its batch (kernels pick their blocking by shape; a last, short batch measured 1.7e-8
    away on a conv net), and the per-image store (:mod:`.store`) returns the same bytes for an image
    whichever manifest first embedded it."""
    n = int(x.shape[0])
    if n < batch_size:
        x = torch.cat([x, x.new_zeros((batch_size - n, *x.shape[1:]))])
    return encoder.embed(x)[:n]


def partial_tag(encoder, batch_size: int) -> dict:
    """What a partial shard must share with the run that resumes it so that the rows it holds are
    the rows this run would compute: the batch size (batch composition) and the device type."""
    return {"batch_size": int(batch_size), "device": torch.device(encoder.device).type}


def load_partials(cache: FeatureCache, shards: list[int], tag: dict, ids: np.ndarray,
                  on_bad_image: str) -> dict[int, tuple[np.ndarray, dict]]:
    """The valid partial files of ``shards`` (``{shard: (embeddings, skipped)}``). Under
    ``on_bad_image="error"`` a partial holding skipped rows is discarded (those rows must be read
    again or fail), as a complete shard holding them would be recomputed."""
    out = {}
    for s in shards:
        got = cache.read_partial(s, tag, ids)
        if got is None:
            continue
        if got[1] and on_bad_image == "error":
            log.info("%s: the partial shard lists skipped rows; recomputing it (on_bad_image=error)",
                     cache.partial_path(s))
            cache.drop_partial(s)
            continue
        out[s] = got
    return out


class _ShardWriter:
    """One encoder's embedded batches, shard by shard: a shard is written (its skipped rows listed
    in ``skipped.csv`` first) when its last batch is in, and the shard in progress is flushed to
    its partial file every ``flush_seconds`` (None: never). ``partials`` seed a shard with the rows
    a killed run flushed. ``heartbeat`` is called after every write."""

    def __init__(self, cache: FeatureCache, ids: np.ndarray, paths: np.ndarray | None, tag: dict,
                 partials: dict[int, tuple[np.ndarray, dict]], flush_seconds: float | None,
                 heartbeat: Callable[[], None]):
        self.cache, self.ids, self.paths, self.tag = cache, ids, paths, tag
        self.partials, self.flush_seconds, self.heartbeat = partials, flush_seconds, heartbeat
        self.current, self.parts, self.bad, self.n_done, self.flushed = None, [], {}, 0, 0.0

    def _begin(self, shard: int) -> None:
        emb, bad = self.partials.pop(shard, (None, {}))
        self.current, self.parts, self.bad = shard, ([emb] if emb is not None else []), dict(bad)
        self.n_done = 0 if emb is None else len(emb)
        self.flushed = time.monotonic()

    def add(self, rows: list[int], emb: np.ndarray, errors) -> None:
        """Add a batch (``rows`` of one shard, in order; ``errors`` as :meth:`_RowsDataset.collate`'s)."""
        shard = rows[0] // self.cache.shard_size
        if shard != self.current:
            self._begin(shard)
        lo, hi = self.cache.shard_bounds(shard)
        if rows[0] != lo + self.n_done:  # cannot happen: batches come in order from the shard's start
            raise RuntimeError(f"{self.cache.path}: batch starts at row {rows[0]}, expected {lo + self.n_done}")
        for pos, row, (_, short) in errors:
            emb[pos] = np.nan
            self.bad[row] = {"sample_id": str(self.ids[row]), "row": row,
                             "path": str(self.paths[row]) if self.paths is not None else "", "error": short}
        self.parts.append(emb)
        self.n_done += len(rows)
        if rows[-1] == hi - 1:
            self._write(shard, lo, hi)
        elif self.flush_seconds is not None and time.monotonic() - self.flushed >= self.flush_seconds:
            self.cache.write_partial(shard, self.n_done, np.concatenate(self.parts), self.bad, self.tag, self.ids)
            self.parts = [np.concatenate(self.parts)]
            self.flushed = time.monotonic()
            self.heartbeat()

    def _write(self, shard: int, lo: int, hi: int) -> None:
        cache = self.cache
        # listed before the shard exists, so a complete shard's NaN rows are always listed
        with cache.bookkeeping():
            on_disk = cache.read_skipped(complete_only=False)
            listed = {r: v for r, v in on_disk.items() if not lo <= r < hi}
            listed.update(self.bad)
            if listed != on_disk:
                cache.write_skipped(listed)
            cache.write_shard(shard, self.ids[lo:hi], np.concatenate(self.parts), skipped_rows=list(self.bad))
        cache.drop_partial(shard)
        self.heartbeat()
        self.current, self.parts, self.bad, self.n_done = None, [], {}, 0


def _check_inputs(manifest: pd.DataFrame, image_root, reader, batch_sizes, num_workers,
                  device) -> tuple[pd.DataFrame, np.ndarray, Path | None, Reader, int]:
    """The arguments every extraction checks first; (manifest with a fresh index, its sample_ids,
    image root, reader, number of decode workers). The run's options were checked where they were
    made (:class:`~robustbench_fm.features.options.ExtractOptions`) and the manifest's sample_ids by
    the store that hands the rows (:func:`robustbench_fm.features.store.check_rows`)."""
    for b in batch_sizes:
        if int(b) < 1:
            raise InvalidSetting(f"batch_size={b}: use a batch of at least 1 image")
    if num_workers == "auto":
        num_workers = default_num_workers(device)
    num_workers = int(num_workers)
    manifest = manifest.reset_index(drop=True)
    if "sample_id" not in manifest.columns:
        raise InvalidSetting("manifest has no 'sample_id' column; validate it with "
                             "robustbench_fm.data.manifest.validate")
    ids = manifest["sample_id"].astype(str).to_numpy()
    if reader is None:
        if "path" not in manifest.columns:
            raise InvalidSetting("manifest has no 'path' column; add one or pass reader=(image_root, row) -> PIL image")
        if image_root is None:
            raise InvalidSetting("image_root is required with the default reader (paths are relative to it)")
        reader = default_reader
    image_root = Path(image_root) if image_root is not None else None
    return manifest, ids, image_root, reader, num_workers


def _settled_hit(cache: FeatureCache, manifest: pd.DataFrame, on_bad_image: str) -> dict | None:
    """A settled entry is read without the lock: no write access needed (a read-only cache). Only
    on_bad_image="error" over skipped rows must write (it recomputes their shards). -> the entry's
    skipped rows on a hit, else None."""
    if cache.settled() and not (on_bad_image == "error" and cache.read_skipped()):
        cache.done_ids(manifest)  # checks every shard's sample_ids against the manifest
        log.info("cache hit: %d rows, 0 forward passes (%s)", len(manifest), cache.path)
        return cache.read_skipped()
    return None


def _unwritable_error(exc: OSError, cache: FeatureCache, name: str) -> Exception:
    if not unwritable(exc, cache.root):
        return exc
    return FeatureCacheError(
        f"feature cache '{cache.root}' is not writable ({one_line(exc)}) and the entry of "
        f"'{name}' for this manifest needs writing ({len(cache.missing_shards())} of "
        f"{cache.n_shards} shards missing); set paths.cache_dir=<a writable folder>")


def _result(encoder, manifest, cache: FeatureCache, fields: dict, ids, skipped: dict, n_forward: int,
            n_images: int, t0: float, read: bool, num_shards: int, shard: int) -> FeatureSet:
    still_missing = cache.missing_shards()
    embeddings = cache.read(manifest) if read and not still_missing else None
    if still_missing:
        log.info("%s: part %d of %d done; %d of %d shards still missing (other parts)", cache.path, shard,
                 num_shards, len(still_missing), cache.n_shards)
    skipped_ids = [str(ids[r]) for r in sorted(skipped)]
    if skipped_ids:
        first = skipped[min(skipped)]
        log.warning("%s: skipped %d of %d rows whose image could not be read (on_bad_image=skip), listed in "
                    "%s; first: row %d %s: %s", encoder.spec.name, len(skipped_ids), len(ids),
                    cache.skipped_path, first["row"], first["path"], first["error"])
    seconds = time.perf_counter() - t0
    return FeatureSet(sample_ids=ids, embeddings=embeddings, key=cache.key, path=cache.path,
                      n_forward=n_forward, n_images_embedded=n_images, seconds=seconds,
                      images_per_s=n_images / seconds if n_images else 0.0, fields=fields,
                      skipped=skipped_ids, missing_shards=still_missing)

def _prepare(encoder, manifest, image_root, cache: FeatureCache, mine: set[int], ids, reader,
             on_bad_image: str) -> tuple[list[int], list[dict] | None]:
    """Under the entry lock: check the complete shards against the manifest, re-read previously
    skipped rows under ``on_bad_image="error"``, tidy the bookkeeping; (this part's missing shards,
    the manifest records if they were built)."""
    # one listing for both sides of the guard: other parts may write shards meanwhile
    complete = cache.complete_shards()
    done = cache.done_ids(manifest, complete)  # reads + checks the sample_ids of those shards
    todo_mask = ~pd.Index(ids).isin(list(done))
    expected = len(ids) - sum(hi - lo for lo, hi in map(cache.shard_bounds, complete))
    if int(todo_mask.sum()) != expected:  # cannot happen with whole-shard writes; guard anyway
        raise FeatureCacheError(f"{cache.path}: complete shards hold {len(done)} sample_ids but "
                                f"{len(ids) - expected} were expected; delete the folder and re-run")
    records = None
    skipped = {r: v for r, v in cache.read_skipped(complete_only=True).items() if r // cache.shard_size in mine}
    if skipped and on_bad_image == "error":
        records = manifest.to_dict("records")
        _retry_skipped(cache, skipped, _RowsDataset(records, image_root, encoder.transform, reader))
    missing = [i for i in cache.missing_shards() if i in mine]
    if missing:
        with cache.bookkeeping():
            if cache.path.is_dir():  # drop rows a killed run listed for a shard it never wrote
                cache.write_skipped(cache.read_skipped(complete_only=True))
            cache.write_meta()
    return missing, records


def _settle(cache: FeatureCache) -> dict:
    """After filling: ``skipped.csv`` and ``meta.json`` as the entry's complete shards say; the
    entry's skipped rows."""
    skipped = {}
    if cache.path.is_dir():
        with cache.bookkeeping():
            # re-read: another process filling the same entry may have listed rows of its shards
            skipped = cache.read_skipped(complete_only=True)
            cache.write_skipped(skipped)
            cache.write_meta()  # no-op when unchanged; records shards a killed run did not record
    return skipped


def _log_start(cache: FeatureCache, encoder, missing: list[int], mine: set[int], partials: dict, n_rows: int):
    todo = sum(hi - lo for lo, hi in map(cache.shard_bounds, missing)) - sum(len(e) for e, _ in partials.values())
    if len(missing) < len(mine) or partials:
        log.info("resuming %s: %d of %d shards present%s, embedding %d of %d rows", cache.path,
                 cache.n_shards - len(missing), cache.n_shards,
                 f" (+{len(partials)} partial)" if partials else "", todo, n_rows)
    else:
        log.info("extracting %d rows with '%s' into %s (%d shard%s)", n_rows, encoder.spec.name,
                 cache.path, cache.n_shards, "" if cache.n_shards == 1 else "s")


def _interrupted(cache: FeatureCache, name: str, exc: KeyboardInterrupt) -> ExtractionInterrupted:
    saved = cache.n_shards - len(cache.missing_shards())
    partial = sum(cache.partial_path(i).is_file() for i in cache.missing_shards())
    return ExtractionInterrupted(f"{saved} of {cache.n_shards} shards of {name} saved in {cache.path}"
                                 + (f" (+{partial} partial, resumed from where it stopped)" if partial else ""))


def lock_path(cache: FeatureCache, num_shards: int = 1, shard: int = 0) -> Path:
    """``<encoder folder>/<key>.lock``, or ``<key>.part-<i>-of-<N>.lock`` for a part."""
    name = f"{cache.key}.lock" if num_shards == 1 else f"{cache.key}.part-{shard}-of-{num_shards}.lock"
    return cache.path.parent / name


def _retry_skipped(cache: FeatureCache, skipped: dict[int, dict], dataset: _RowsDataset) -> None:
    """``on_bad_image="error"`` on an entry with skipped rows: re-read those images; raise for
    the first one that still fails, else delete the shards holding them so they are recomputed."""
    with _one_thread(True):
        for row in sorted(skipped):
            _, _, error = dataset[row]
            if error is not None:
                raise ImageReadError(f"{error[0]} (skipped by an earlier on_bad_image=skip run, "
                                     f"listed in {cache.skipped_path})")
    shards = sorted({row // cache.shard_size for row in skipped})
    log.info("%s: the %d previously skipped images are readable now; recomputing %d shards",
             cache.path, len(skipped), len(shards))
    cache.drop_shards(shards)
