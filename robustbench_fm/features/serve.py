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
from . import engine
from .cache import FeatureSet
from .engine.rows import FLUSH_SECONDS, Reader
from .load import load_features
from .options import ExtractOptions
from .store import FeatureStore


def extract_panel(encoders: Sequence, manifest: pd.DataFrame, image_root: str | Path, cache_root: str | Path,
                  batch_size: int | Sequence[int] | None = None, *, options: ExtractOptions | None = None,
                  progress: bool = True, reader: Reader | None = None, read: bool = True,
                  flush_seconds: float | None = FLUSH_SECONDS, **settings) -> list[FeatureSet]:
    """Every row of ``manifest`` embedded by each loaded encoder of ``encoders``, served from the
    per-image feature store under ``cache_root`` (module docstring); one :class:`FeatureSet` per
    encoder, in order, whose ``path`` is the manifest's view (``load_features(path)`` reads it) and
    whose ``embeddings`` are read when ``read`` and the view is complete.

    The extraction options: ``options`` (an :class:`~.options.ExtractOptions`) or ``settings``, its
    fields by name (``num_workers``, ``shard_size`` of a new chunk, ``on_bad_image``,
    ``num_shards``/``shard``: this call embeds only its part, ``embeddings`` is None until every part
    is done; ``decode``: scaled or exact, part of the recipe; ``on_version_change``), each at the
    Python API's default (:data:`~.options.DEFAULTS`) unless given; ``batch_size``: one for every
    encoder (an option) or one per encoder. The engine's own: ``progress``, ``reader(image_root,
    row)`` (called as given; it is not part of any key, as before) and ``flush_seconds``
    (:func:`robustbench_fm.features.engine.extract_panel`)."""
    t0 = time.perf_counter()
    encoders = list(encoders)
    sizes = None
    if batch_size is not None and not isinstance(batch_size, int):
        sizes = [int(b) for b in batch_size]
        if len(sizes) != len(encoders):
            raise InvalidSetting(f"batch_size: {len(sizes)} values for {len(encoders)} encoders; give one per encoder")
    elif batch_size is not None:
        settings["batch_size"] = batch_size
    options = ExtractOptions(**settings) if options is None else dataclasses.replace(options, **settings)
    if image_root is None:
        raise InvalidSetting("image_root is required: the feature store finds each row's image by the content of "
                             "image_root/path")
    if not encoders:
        return []
    manifest = manifest.reset_index(drop=True)
    store = FeatureStore(cache_root, options)
    ids = store.identities(manifest, image_root)  # checks the manifest's rows (store.check_rows)
    size = dict(zip((e.spec.name for e in encoders), sizes or [options.batch_size] * len(encoders)))
    backend = engine.backend(cache_root, options, size.__getitem__, progress, reader=reader,
                             flush_seconds=flush_seconds)
    out = store.serve(manifest, image_root, encoders, ids, backend, t0)
    if not read:
        return out
    return [f if f.missing_shards else dataclasses.replace(f, embeddings=load_features(f.path, manifest)[1])
            for f in out]


def extract(encoder, manifest: pd.DataFrame, image_root: str | Path, cache_root: str | Path,
            batch_size: int | None = None, **kw) -> FeatureSet:
    """Every row of ``manifest`` embedded by the loaded ``encoder``, served from the per-image
    feature store under ``cache_root``: images an earlier call (any manifest, any image folder)
    embedded are read, the rest embedded once; entries of the earlier per-manifest layout are read
    in place. :func:`extract_panel` with one encoder (its docstring has the options)."""
    return extract_panel([encoder], manifest, image_root, cache_root, batch_size, **kw)[0]
