"""A view: a manifest's rows as (sample_id, image id, chunk, row) of the per-image feature store
(:mod:`.store` writes them); read here by :mod:`.load` and :mod:`.verify` like an entry."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from ..core.shards import META_NAME, SHARD_NAME
from .cache import _embedding_matrix

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


def gather(view: pd.DataFrame) -> np.ndarray:
    """The view's matrix [n, D] (float32), filled shard by shard from its chunks: besides the
    result only one shard is held at a time (a chunk's whole matrix never is)."""
    out = None
    for folder, part in view.groupby("chunk", sort=False):
        folder = Path(folder)
        meta = json.loads((folder / META_NAME).read_text())
        size = int(meta["shard_size"])
        rows = part["row"].to_numpy()
        dest = part.index.to_numpy()
        shard_of = rows // size
        for i in np.unique(shard_of):
            f = folder / SHARD_NAME.format(int(i))
            table = pq.read_table(f, columns=["embedding"])
            emb = _embedding_matrix(table.column("embedding"), f, int(meta.get("embed_dim") or 0) or None)
            if out is None:
                out = np.empty((len(view), emb.shape[1]), np.float32)
            sel = shard_of == i
            out[dest[sel]] = emb[rows[sel] - int(i) * size]
            del table, emb
    return out if out is not None else np.zeros((0, 0), np.float32)
