"""Miniature NCT-CRC-HE and PatchCamelyon in their official layouts and formats (catalog 1.2)."""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
from PIL import Image

#: subset -> class -> number of tiles written.
NCT_COUNTS = {"NCT-CRC-HE-100K": {"ADI": 2, "TUM": 3, "STR": 1},
              "CRC-VAL-HE-7K": {"TUM": 2, "NORM": 2, "BACK": 1}}
PCAM_LABELS = {"train": [1, 0, 0, 1, 1, 0], "valid": [0, 1, 1], "test": [1, 0, 0, 0]}


def write_nct_crc(root: Path, counts: dict = NCT_COUNTS, size: int = 8) -> Path:
    """``<root>/<subset>/<CLASS>/<CLASS>-<8 letters>.tif``: RGB TIFF tiles, each a flat colour."""
    rng = np.random.default_rng(0)
    for subset, per_class in counts.items():
        for cls, n in per_class.items():
            folder = root / subset / cls
            folder.mkdir(parents=True, exist_ok=True)
            for _ in range(n):
                name = "".join(rng.choice(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ"), 8))
                tile = np.full((size, size, 3), rng.integers(0, 256, 3), np.uint8)
                Image.fromarray(tile).save(folder / f"{cls}-{name}.tif", format="TIFF")
    return root


def pcam_patch(split: str, i: int) -> np.ndarray:
    """The 96x96x3 patch written at row ``i`` of ``split`` (a value pattern unique per row)."""
    seed = {"train": 0, "valid": 1, "test": 2}[split] * 100 + i
    return np.random.default_rng(seed).integers(0, 256, (96, 96, 3), dtype=np.uint8)


def write_pcam(root: Path, labels: dict = PCAM_LABELS, meta: bool = True) -> Path:
    """``camelyonpatch_level_2_split_<split>_{x,y}.h5`` (keys x: (N,96,96,3) uint8, y: (N,1,1,1))
    and ``_meta.csv`` (unnamed index, coord_y, coord_x, tumor_patch, center_tumor_patch, wsi)."""
    root.mkdir(parents=True, exist_ok=True)
    for split, ys in labels.items():
        stem = root / f"camelyonpatch_level_2_split_{split}"
        with h5py.File(f"{stem}_x.h5", "w") as f:
            f.create_dataset("x", data=np.stack([pcam_patch(split, i) for i in range(len(ys))]))
        with h5py.File(f"{stem}_y.h5", "w") as f:
            f.create_dataset("y", data=np.asarray(ys, np.uint8).reshape(-1, 1, 1, 1))
        if meta:
            lines = [",coord_y,coord_x,tumor_patch,center_tumor_patch,wsi"]
            lines += [f"{i},{10 * i},{20 * i},{bool(y)},{bool(y)},camelyon16_{split}_tumor_{i % 2:03d}"
                      for i, y in enumerate(ys)]
            Path(f"{stem}_meta.csv").write_text("\n".join(lines) + "\n")
    return root
