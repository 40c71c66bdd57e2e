"""The public extraction calls: :func:`extract` (one encoder) and :func:`extract_panel` (several,
one decode pass), a manifest served by the feature store (:class:`~.store.FeatureStore`: look up
-> embed what is missing with the engine, :mod:`.engine`, as its backend -> write the manifest's
view), exactly as the Embedder serves a run (issue 43: one store writes every feature entry).

Entries of the earlier per-manifest layout (cache format 2, :mod:`.key`) are read where they are
(0 forward passes) and never written: a call that misses embeds into per-image store chunks.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Sequence

import pandas as pd

from ..core.errors import InvalidSetting
from ..core.versions import VERSION_POLICIES
from ..data.images import BAD_IMAGE_POLICIES, DEFAULT_DECODE, check_decode
from . import engine
from .cache import FeatureSet
from .engine.rows import FLUSH_SECONDS, Reader
from .load import load_features
from .store import FeatureStore


def extract_panel(encoders: Sequence, manifest: pd.DataFrame, image_root: str | Path, cache_root: str | Path,
                  batch_size: int | Sequence[int] = 32, num_workers: int | str = 0, shard_size: int = 1024,
                  progress: bool = True, reader: Reader | None = None, on_bad_image: str = "error",
                  num_shards: int = 1, shard: int = 0, read: bool = True,
                  flush_seconds: float | None = FLUSH_SECONDS, decode: str = DEFAULT_DECODE,
                  on_version_change: str = "reuse") -> list[FeatureSet]:
    """Every row of ``manifest`` embedded by each loaded encoder of ``encoders``, served from the
    per-image feature store under ``cache_root`` (module docstring); one :class:`FeatureSet` per
    encoder, in order, whose ``path`` is the manifest's view (``load_features(path)`` reads it) and
    whose ``embeddings`` are read when ``read`` and the view is complete.

    The engine's options (:func:`robustbench_fm.features.engine.extract_panel`): ``batch_size``
    (one, or one per encoder), ``num_workers``, ``shard_size`` (of a new chunk), ``progress``,
    ``reader(image_root, row)`` (called as given; it is not part of any key, as before),
    ``on_bad_image``, ``num_shards``/``shard`` (this call embeds only its part; ``embeddings`` is
    None until every part is done), ``flush_seconds``, ``decode`` (``extract.decode``: scaled or
    exact, part of the recipe) and ``on_version_change`` (``cache.on_version_change``)."""
    t0 = time.perf_counter()
    encoders = list(encoders)
    sizes = [int(batch_size)] * len(encoders) if isinstance(batch_size, int) else [int(b) for b in batch_size]
    if len(sizes) != len(encoders):
        raise InvalidSetting(f"batch_size: {len(sizes)} values for {len(encoders)} encoders; give one per encoder")
    if on_bad_image not in BAD_IMAGE_POLICIES:
        raise InvalidSetting(f"on_bad_image must be one of {', '.join(BAD_IMAGE_POLICIES)}, got {on_bad_image!r}")
    if on_version_change not in VERSION_POLICIES:
        raise InvalidSetting(f"on_version_change={on_version_change!r}: use one of {', '.join(VERSION_POLICIES)}")
    for col in ("sample_id", "path"):
        if col not in manifest.columns:
            raise InvalidSetting(f"manifest has no '{col}' column; validate it with "
                                 "robustbench_fm.data.manifest.validate")
    if image_root is None:
        raise InvalidSetting("image_root is required: the feature store finds each row's image by the content of "
                             "image_root/path")
    manifest = manifest.reset_index(drop=True)
    ids_ = manifest["sample_id"].astype(str)
    dup = ids_.duplicated()
    if dup.any():
        j = int(dup.to_numpy().nonzero()[0][0])
        raise InvalidSetting(f"manifest row {j}: duplicate sample_id {ids_.iloc[j]!r}; one row per image")
    if not encoders:
        return []
    store = FeatureStore(cache_root, on_version_change, on_bad_image, check_decode(decode))
    ids = store.identities(manifest, image_root)
    size = dict(zip((e.spec.name for e in encoders), sizes))
    backend = engine.backend(cache_root, size.__getitem__, num_workers, shard_size, on_bad_image, num_shards, shard,
                             progress, reader=reader, flush_seconds=flush_seconds)
    out = store.serve(manifest, image_root, encoders, ids, backend, t0)
    if not read:
        return out
    return [f if f.missing_shards else dataclasses.replace(f, embeddings=load_features(f.path, manifest)[1])
            for f in out]


def extract(encoder, manifest: pd.DataFrame, image_root: str | Path, cache_root: str | Path, batch_size: int = 32,
            num_workers: int | str = 0, shard_size: int = 1024, progress: bool = True, reader: Reader | None = None,
            on_bad_image: str = "error", num_shards: int = 1, shard: int = 0, read: bool = True,
            flush_seconds: float | None = FLUSH_SECONDS, decode: str = DEFAULT_DECODE,
            on_version_change: str = "reuse") -> FeatureSet:
    """Every row of ``manifest`` embedded by the loaded ``encoder``, served from the per-image
    feature store under ``cache_root``: images an earlier call (any manifest, any image folder)
    embedded are read, the rest embedded once; entries of the earlier per-manifest layout are read
    in place. :func:`extract_panel` with one encoder (its docstring has the options)."""
    return extract_panel([encoder], manifest, image_root, cache_root, batch_size, num_workers, shard_size, progress,
                         reader, on_bad_image, num_shards, shard, read, flush_seconds, decode, on_version_change)[0]
