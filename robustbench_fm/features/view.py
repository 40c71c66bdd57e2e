"""A view: a manifest's rows as (sample_id, image id, chunk, row) of the per-image feature store
(:mod:`.store` writes them); read here by :mod:`.load` and :mod:`.verify` like an entry."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..core.shards import META_NAME, SHARD_NAME
from ..core.text import one_line
from .cache import FeatureCacheError, _embedding_matrix, corrupted_shard, shard_mismatch

VIEW_FORMAT = "view"
VIEW_NAME = "view.parquet"


def is_view(entry: str | Path) -> bool:
    return (Path(entry) / VIEW_NAME).is_file()


def read_view(entry: str | Path) -> pd.DataFrame:
    """The rows of a view (sample_id, image_id, chunk folder as a resolved path, row)."""
    entry = Path(entry)
    t = pq.read_table(entry / VIEW_NAME).to_pandas()
    base = entry.parent
    t["chunk"] = [str((base / c).resolve()) if not os.path.isabs(c) else c for c in t["chunk"]]
    return t


def recorded_sha256(meta: dict) -> dict[str, str]:
    """``{shard file name: SHA-256}`` as an entry's ``meta.json`` recorded them."""
    return {str(r["file"]): str(r["sha256"]) for r in meta.get("shards", []) if r.get("sha256")}


def gather(view: pd.DataFrame) -> np.ndarray:
    """The view's matrix [n, D] (float32), filled shard by shard from its chunks: besides the
    result only one shard is held at a time (a chunk's whole matrix never is). Each shard read is
    first checked against the SHA-256 its chunk's ``meta.json`` recorded (a corrupted or truncated
    shard is a one-line :class:`~.cache.FeatureCacheError`; the run's look-up recomputes it)."""
    out = None
    for folder, part in view.groupby("chunk", sort=False):
        folder = Path(folder)
        meta = json.loads((folder / META_NAME).read_text())
        recorded = recorded_sha256(meta)
        size = int(meta["shard_size"])
        rows = part["row"].to_numpy()
        dest = part.index.to_numpy()
        shard_of = rows // size
        for i in np.unique(shard_of):
            f = folder / SHARD_NAME.format(int(i))
            why = shard_mismatch(f, recorded.get(f.name))
            if why is not None:
                raise corrupted_shard(f, why)
            try:
                table = pq.read_table(f, columns=["embedding"])
            except (OSError, ValueError, pa.ArrowException) as exc:
                raise FeatureCacheError(f"{f}: unreadable cache shard ({one_line(exc) or type(exc).__name__}); run "
                                        "the extraction again, which recomputes it") from None
            emb = _embedding_matrix(table.column("embedding"), f, int(meta.get("embed_dim") or 0) or None)
            if out is None:
                out = np.empty((len(view), emb.shape[1]), np.float32)
            sel = shard_of == i
            out[dest[sel]] = emb[rows[sel] - int(i) * size]
            del table, emb
    return out if out is not None else np.zeros((0, 0), np.float32)
