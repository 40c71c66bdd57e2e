"""The stable Python API (DESIGN.md, "Python API"): run one stage on features you already have."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .core.results import Results
from .data import manifest as mf


def align_features(sample_ids, embeddings: np.ndarray, manifest: pd.DataFrame, source: str) -> np.ndarray:
    """Rows of ``embeddings`` reordered to the manifest's ``sample_id`` order."""
    index = pd.Index(pd.Series(sample_ids).astype(str))
    if index.has_duplicates:
        raise ValueError(f"{source}: duplicated sample_id '{index[index.duplicated()][0]}'; "
                         "each feature row needs a unique sample_id")
    pos = index.get_indexer(manifest["sample_id"].astype(str))
    if (pos < 0).any():
        missing = manifest["sample_id"].to_numpy()[pos < 0]
        raise ValueError(f"{source}: {len(missing)} manifest rows have no features, first sample_id "
                         f"'{missing[0]}'; extract them or drop them from the manifest")
    return np.asarray(embeddings, dtype=np.float32)[pos]


def evaluate(stage: str, features, manifest, **params) -> Results:
    """Run metric ``stage`` on ``features`` aligned row-for-row with ``manifest``.

    ``features``: an (N, D) array/tensor in manifest order, or the path of a feature parquet
    (a cache shard, a cache folder, or any parquet with ``sample_id`` + ``embedding``), then
    aligned to the manifest by ``sample_id``. ``manifest``: a DataFrame or a CSV/parquet path.
    ``params`` are the stage's parameters (see the stage module's docstring). An in-memory
    float64 matrix is passed on as float64, anything else as float32.
    """
    from . import methods as stages

    module = stages.get(stage)
    if isinstance(manifest, (str, Path)):
        manifest = mf.read(manifest)
    else:
        manifest = mf.validate(manifest)
    if isinstance(features, (str, Path)):
        from .features import load_features

        ids, emb = load_features(features)
        features = align_features(ids, emb, manifest, str(features))
    else:
        features = np.asarray(features.cpu() if hasattr(features, "cpu") else features)
        # float64 stays float64 (CRoMa computes distances in the input precision); all else float32
        features = features.astype(np.float64 if features.dtype == np.float64 else np.float32, copy=False)
        if features.ndim != 2 or features.shape[0] != len(manifest):
            raise ValueError(f"features: shape {features.shape} does not match the manifest's "
                             f"{len(manifest)} rows; pass an (N, D) matrix aligned with the manifest")
    return module.run(features, manifest, **params)
