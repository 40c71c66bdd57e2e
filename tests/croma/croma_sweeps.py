"""Small CRoMa benchmarks in their real on-disk layouts and finished-sweep folders built from them.

* :func:`camelyon_root`: a PathoROB-Camelyon root (``metadata/camelyon.csv`` in PathoROB's columns
  and an HF parquet snapshot ``data/*.parquet`` whose tiles are 16 px RGB noise with a class and a
  centre colour cast), 2 classes x 2 in-domain centres x 3 slides x 5 tiles + one unseen centre.
* :func:`panda_table`: a PANDA ``train.csv`` (image_id, data_provider, isup_grade).
* :func:`fake_sweep`: job folders as ``app.run`` leaves them (config.yaml, status.json,
  entries.json pointing at real feature-cache entries, summary.parquet and the stage's saved
  results) for given features, so the collect-side table builders run on them.
"""
from __future__ import annotations

import json
from io import BytesIO
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from PIL import Image

from robustbench_fm.__main__ import CONFIG_DIR
from robustbench_fm.api import evaluate
from robustbench_fm.features import FeatureCache

CLASSES, CENTRES, OOD = ("normal", "tumor"), ("RUMC", "UMCU"), ("CWZ",)


def camelyon_root(root: Path, slides_per_cell: int = 3, tiles_per_slide: int = 5, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    rows, images = [], []
    for centre in CENTRES + OOD:
        for c, cls in enumerate(CLASSES):
            for s in range(slides_per_cell if centre in CENTRES else 1):
                slide = f"{centre.lower()}_{cls}_{s}"
                for t in range(tiles_per_slide):
                    patch = str(len(rows))
                    rows.append(("ID" if centre in CENTRES else "OOD", slide, patch, cls, centre))
                    tint = np.array([60 * c, 40 * (centre == "UMCU"), 30 * s], float)
                    arr = np.clip(rng.normal(110, 50, (16, 16, 3)) + tint, 0, 255).astype(np.uint8)
                    buf = BytesIO()
                    Image.fromarray(arr).save(buf, format="PNG")
                    images.append({"bytes": buf.getvalue(), "path": f"{slide}-{patch}.png"})
    meta = pd.DataFrame(rows, columns=["subset", "slide_id", "patch_id", "biological_class", "medical_center"])
    (root / "metadata").mkdir(parents=True, exist_ok=True)
    (root / "data").mkdir(parents=True, exist_ok=True)
    meta.to_csv(root / "metadata" / "camelyon.csv", index=False)
    order = rng.permutation(len(meta))
    for k, part in enumerate(np.array_split(order, 2)):
        table = pa.table({"image": pa.array([images[i] for i in part],
                                            type=pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                          "slide_id": meta["slide_id"].to_numpy()[part], "patch_id": meta["patch_id"].to_numpy()[part]})
        pq.write_table(table, root / "data" / f"train-{k:05d}-of-00002.parquet")
    return root


def panda_table(path: Path, per_cell: int = 6, seed: int = 0) -> pd.DataFrame:
    """``per_cell`` slides per ISUP grade (0-5) x provider, shuffled, plus PANDA's other columns."""
    rows = [(f"{p[:3]}{g}{i:03d}", p, g, "0+0" if g == 0 else "3+3")
            for p in ("karolinska", "radboud") for g in range(6) for i in range(per_cell)]
    table = pd.DataFrame(rows, columns=["image_id", "data_provider", "isup_grade", "gleason_score"])
    table = table.iloc[np.random.default_rng(seed).permutation(len(table))]
    path.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(path, index=False)
    return table


def compose_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=overrides)


def write_entry(cache_dir: Path, encoder: str, ids, features: np.ndarray) -> Path:
    """A real feature-cache entry (one shard) holding ``features`` for ``ids``."""
    cache = FeatureCache(cache_dir, {"encoder": encoder, "embed_dim": features.shape[1], "n_rows": len(ids),
                                     "test_features": encoder}, shard_size=len(ids))
    cache.write_shard(0, [str(i) for i in ids], features)
    return cache.path


def fake_sweep(sweep: Path, cfg, manifest: pd.DataFrame, features: dict[str, np.ndarray], cache_dir: Path,
               start: int = 0, stage_results=None) -> dict[str, Path]:
    """One finished job per encoder of ``features`` (rows of ``manifest``'s distinct sample_ids);
    ``stage_results(x, manifest) -> Results`` defaults to the job's stage run through evaluate."""
    params = OmegaConf.to_container(cfg.stage.params, resolve=True)
    ids = manifest["sample_id"].drop_duplicates().to_numpy()
    entries = {}
    for n, (encoder, x) in enumerate(features.items(), start=start):
        job = sweep / f"{n}_{encoder}-{cfg.dataset.name}-{cfg.stage.name}"
        job.mkdir(parents=True)
        (job / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
        (job / "status.json").write_text(json.dumps({"status": "done", "error": ""}))
        entries[encoder] = write_entry(cache_dir, encoder, ids, x)
        (job / "entries.json").write_text(json.dumps({"dataset": cfg.dataset.name, "stage": cfg.stage.name,
                                                      "entries": [{"encoder": encoder,
                                                                   "entry": str(entries[encoder])}]}))
        rows = pd.Index(ids).get_indexer(manifest["sample_id"])
        finding = str(cfg.stage.findings[0])
        res = stage_results(x[rows], manifest) if stage_results else evaluate(
            cfg.stage.name, x[rows], manifest, finding=finding, **params)
        res.summary.insert(0, "encoder", encoder)
        res.summary.insert(1, "dataset", cfg.dataset.name)
        res.save(job / "results" / encoder / cfg.dataset.name / cfg.stage.name / finding)
        res.summary.to_parquet(job / "summary.parquet")
    return entries
