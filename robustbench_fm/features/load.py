"""Reading features back without a :class:`~robustbench_fm.features.cache.FeatureCache`.

``load_features(path_or_dir, manifest)`` reads any features parquet: a cache entry folder (a
chunk, a keyed entry or a view: :func:`.entry.open_entry` dispatches on its ``meta.json``'s
format), a folder of parquet files or one file of your own ("bring your own features"), with
``sample_id`` and ``embedding`` columns. ``read_skipped(entry)`` / ``skipped_ids(entry)`` name the
rows of a cache entry skipped as unreadable (``on_bad_image="skip"``), which come back as all-NaN rows.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..core.errors import InvalidSetting
from .entry import READ_BATCH_ROWS, READ_THREADS, no_skipped, open_entry  # noqa: F401 (the readers' settings)


def read_skipped(entry: str | Path) -> pd.DataFrame:
    """The skipped rows of cache entry folder ``entry`` (columns sample_id, row, path, error; sorted
    by row), limited to its complete shards; empty when nothing was skipped."""
    return open_entry(entry).skipped() if Path(entry).exists() else no_skipped()


def skipped_ids(entry: str | Path) -> list[str]:
    """sample_ids of the rows skipped as unreadable in cache entry folder ``entry`` (row order);
    ``[]`` when nothing was skipped. Drop these rows from every stage and every encoder."""
    return [str(s) for s in read_skipped(entry)["sample_id"]]


def missing_shards(entry: str | Path) -> list[int]:
    """Shards of a cache entry folder (as its ``meta.json`` lays them out) whose file is absent; of
    a view (:mod:`.store`), the missing shards of its chunks, numbered across them in order."""
    return open_entry(entry).missing()


def load_features(path_or_dir: str | Path, manifest: pd.DataFrame | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Read features from a parquet file, a folder of parquet files, or a cache entry folder.

    The parquet needs a ``sample_id`` column and an ``embedding`` column (fixed-size or plain
    list of floats). Returns ``(sample_ids, embeddings)`` with embeddings float32 (N, D); with
    ``manifest`` the rows are reordered to the manifest's ``sample_id`` order, and a manifest
    row without features is an error. Rows of a cache entry skipped as unreadable
    (``on_bad_image="skip"``) come back as all-NaN rows; :func:`skipped_ids` names them.
    """
    return open_entry(path_or_dir).read(manifest)


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
