"""Histopathology tile datasets of CANDOR's tumour task (candor.md Table 1; catalog 1.2).

Both have no patient id per tile, so ``patient_id`` is the slide where the distribution names one
(PatchCamelyon's meta CSV) and the tile itself otherwise; the matched group ``acq_group`` is the
source dataset (candor.md "Matched group"). Finding ``tumour``: 1 tumour tile, 0 any other tile.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from .files import DatasetError, DatasetFileMissing, require
from .registry import Adapter, register

#: NCT-CRC-HE tissue classes (folder names) and the tumour class (tumour epithelium).
NCT_CLASSES = ("ADI", "BACK", "DEB", "LYM", "MUC", "MUS", "NORM", "STR", "TUM")
NCT_TUMOUR = "TUM"
#: Subset folder -> split: 100K (Macenko-normalised or not) is the training set, 7K the test set.
NCT_SUBSETS = {"NCT-CRC-HE-100K": "train", "NCT-CRC-HE-100K-NONORM": "train", "CRC-VAL-HE-7K": "test"}
NCT_DEFAULT_SUBSETS = ("NCT-CRC-HE-100K", "CRC-VAL-HE-7K")


def build_nct_crc(root: Path, subsets: list[str] | tuple[str, ...] | None = None) -> pd.DataFrame:
    """Tiles ``<root>/<subset>/<CLASS>/<CLASS>-<ID>.tif`` -> manifest; ``bio_label`` = class.

    ``subsets`` (folder names of :data:`NCT_SUBSETS`) defaults to those of
    :data:`NCT_DEFAULT_SUBSETS` present under ``root``; listed subsets must all exist.
    """
    if subsets is None:
        subsets = [s for s in NCT_DEFAULT_SUBSETS if (root / s).is_dir()]
        if not subsets:
            raise DatasetFileMissing(f"dataset 'nct_crc': neither {' nor '.join(NCT_DEFAULT_SUBSETS)} under "
                                     f"'{root}'; unzip the Zenodo archives there or set dataset.root")
    rows = []
    for subset in subsets:
        if subset not in NCT_SUBSETS:
            raise DatasetError(f"dataset 'nct_crc': unknown subset '{subset}'; use {', '.join(NCT_SUBSETS)}")
        folder = require(root / subset, "nct_crc", "unzip the archive of that subset under dataset.root")
        unknown = sorted(d.name for d in os.scandir(folder) if d.is_dir() and d.name not in NCT_CLASSES)
        if unknown:
            raise DatasetError(f"dataset 'nct_crc': '{folder / unknown[0]}' is not one of the 9 classes "
                               f"{', '.join(NCT_CLASSES)}; remove it or point dataset.root at the unzipped archive")
        for cls in NCT_CLASSES:
            if not (folder / cls).is_dir():
                continue
            for name in sorted(e.name for e in os.scandir(folder / cls) if e.name.lower().endswith(".tif")):
                rows.append((subset, cls, name))
    if not rows:
        raise DatasetFileMissing(f"dataset 'nct_crc': no <CLASS>/*.tif tiles in {', '.join(subsets)} under '{root}'")
    table = pd.DataFrame(rows, columns=["subset", "cls", "name"])
    ids = table["subset"] + "/" + table["name"].str.rsplit(".", n=1).str[0]
    return pd.DataFrame({
        "sample_id": ids,
        "path": table["subset"] + "/" + table["cls"] + "/" + table["name"],
        "patient_id": ids,
        "site": table["subset"],
        "acq_group": "nct_crc",
        "split": table["subset"].map(NCT_SUBSETS),
        "bio_label": table["cls"],
        "tumour": (table["cls"] == NCT_TUMOUR).astype(float),
    })


PCAM_SPLITS = {"train": "train", "valid": "val", "test": "test"}


def _pcam_file(split: str, kind: str) -> str:
    return f"camelyonpatch_level_2_split_{split}_{kind}"


def build_pcam(root: Path, splits: list[str] | tuple[str, ...] = tuple(PCAM_SPLITS)) -> pd.DataFrame:
    """PatchCamelyon ``camelyonpatch_level_2_split_<split>_{x,y}.h5`` -> one row per patch.

    Labels come from ``_y.h5`` (key ``y``, shape (N, 1, 1, 1)), read once; images stay in
    ``_x.h5`` and are read lazily by :func:`robustbench_fm.data.images.read_image` through the
    locator ``path = '<split>_x.h5#<row>'``. The optional ``_meta.csv`` gives the slide (``wsi``).
    """
    import h5py

    frames = []
    for split in splits:
        if split not in PCAM_SPLITS:
            raise DatasetError(f"dataset 'pcam': unknown split '{split}'; use {', '.join(PCAM_SPLITS)}")
        stem = _pcam_file(split, "y")
        y_path = root / f"{stem}.h5"
        if not y_path.is_file() and (root / f"{stem}.h5.gz").is_file():
            raise DatasetFileMissing(f"dataset 'pcam': '{y_path}' is still gzipped; run gunzip on the .h5.gz files")
        require(y_path, "pcam", "download the PCam .h5 files (basveeling/pcam) into dataset.root and gunzip them")
        with h5py.File(y_path, "r") as f:
            if "y" not in f:
                raise DatasetError(f"dataset 'pcam': {y_path}: no dataset 'y' (has {', '.join(f.keys())}); "
                                   "use the official _y.h5 file")
            labels = np.asarray(f["y"]).reshape(-1).astype(float)
        n = len(labels)
        ids = pd.Series([f"{split}_{i:06d}" for i in range(n)])
        frame = pd.DataFrame({
            "sample_id": ids,
            "path": [f"{_pcam_file(split, 'x')}.h5#{i}" for i in range(n)],
            "patient_id": ids,
            "acq_group": "pcam",
            "split": PCAM_SPLITS[split],
            "tumour": labels,
        })
        meta = root / f"{_pcam_file(split, 'meta')}.csv"
        if meta.is_file():
            wsi = pd.read_csv(meta)["wsi"].astype(str)
            if len(wsi) != n:
                raise DatasetError(f"dataset 'pcam': {meta}: {len(wsi)} rows but {y_path} has {n}; "
                                   "use the meta CSV of the same split")
            frame["slide_id"] = frame["patient_id"] = wsi.to_numpy()
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


NCT_CRC = register(Adapter(
    name="nct_crc",
    build=build_nct_crc,
    findings=("tumour",),
    description="NCT-CRC-HE-100K / CRC-VAL-HE-7K: 224 px H&E colorectal tiles in 9 tissue classes; tumour = TUM.",
))

PCAM = register(Adapter(
    name="pcam",
    build=build_pcam,
    findings=("tumour",),
    description="PatchCamelyon: 96 px lymph-node patches (HDF5) from Camelyon16; tumour in the central 32 px.",
))
