"""Dermatology datasets of CANDOR's skin task: "Malignant lesions, with benign lesions as
negatives" (candor.md Table 1; layouts: catalog 1.5). ``malignant`` is 1 for a malignant lesion,
0 for a benign one and NaN for anything else (non-neoplastic, pre-malignant, unknown). The matched
group ``acq_group`` is the source dataset; ``bio_label`` the diagnosis.
"""
from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pandas as pd

from .files import DatasetError, read_table
from .registry import Adapter, register

log = logging.getLogger("robustbench_fm.data")

#: Fitzpatrick17k ``three_partition_label`` -> malignant; ``non-neoplastic`` is neither.
FITZPATRICK_MALIGNANT = {"malignant": 1.0, "benign": 0.0, "non-neoplastic": np.nan}
#: Fitzpatrick17k ``qc`` value whose label the authors' review found wrong: unlabelled here.
FITZPATRICK_WRONG_LABEL = "3 Wrongly labelled"


def build_fitzpatrick17k(root: Path, image_dir: str = "images") -> pd.DataFrame:
    """``fitzpatrick17k.csv`` + images ``<image_dir>/<md5hash>.jpg`` (downloaded from the ``url``
    column, or the authors' zip). A row whose ``qc`` says "3 Wrongly labelled" is unlabelled.
    Duplicated ``md5hash`` rows (same image listed twice) keep the first, with a log line."""
    csv = root / "fitzpatrick17k.csv"
    table = read_table(csv, "fitzpatrick17k", ("md5hash", "label", "three_partition_label", "fitzpatrick_scale"),
                       dtype={"md5hash": str})
    dup = table["md5hash"].duplicated()
    if dup.any():
        log.warning("fitzpatrick17k: %s lists %d md5hash values twice; keeping the first row of each",
                    csv, int(dup.sum()))
        table = table[~dup].reset_index(drop=True)
    part = table["three_partition_label"].astype(str).str.strip().str.lower()
    unknown = ~part.isin(list(FITZPATRICK_MALIGNANT))
    if unknown.any():
        raise DatasetError(f"dataset 'fitzpatrick17k': {csv}: column 'three_partition_label', row "
                           f"{int(np.flatnonzero(unknown)[0])}: {table['three_partition_label'][unknown].iloc[0]!r} "
                           f"is not one of {', '.join(FITZPATRICK_MALIGNANT)}; use the official file")
    malignant = part.map(FITZPATRICK_MALIGNANT)
    if "qc" in table.columns:
        malignant = malignant.where(table["qc"].astype(str).str.strip() != FITZPATRICK_WRONG_LABEL)
    urls = table["url"] if "url" in table.columns else pd.Series(np.nan, index=table.index)
    ids = "fitz_" + table["md5hash"]
    return pd.DataFrame({
        "sample_id": ids,
        "path": f"{image_dir.strip('/')}/" + table["md5hash"] + ".jpg",
        "patient_id": ids,
        "site": urls.map(lambda u: (urlparse(u).netloc if isinstance(u, str) else "") or "unknown"),
        "acq_group": "fitzpatrick17k",
        "bio_label": table["label"].astype(str).str.strip(),
        "fitzpatrick_scale": pd.to_numeric(table["fitzpatrick_scale"], errors="coerce"),
        "malignant": malignant,
    })


#: ISIC 2019 ground-truth classes -> malignant. Actinic keratosis (pre-malignant) and UNK are
#: neither malignant nor benign, so unlabelled.
ISIC_MALIGNANT = {"MEL": 1.0, "BCC": 1.0, "SCC": 1.0, "NV": 0.0, "BKL": 0.0, "DF": 0.0, "VASC": 0.0,
                  "AK": np.nan, "UNK": np.nan}
ISIC_INPUT = "ISIC_2019_Training_Input"


def build_isic2019(root: Path) -> pd.DataFrame:
    """``ISIC_2019_Training_GroundTruth.csv`` (one-hot ``MEL..UNK``) + optional
    ``ISIC_2019_Training_Metadata.csv`` (``lesion_id`` groups images of one lesion: the
    ``patient_id`` when present) + images ``ISIC_2019_Training_Input/<image>.jpg``."""
    gt_csv = root / "ISIC_2019_Training_GroundTruth.csv"
    classes = tuple(ISIC_MALIGNANT)
    gt = read_table(gt_csv, "isic2019", ("image",) + classes, dtype={"image": str})
    onehot = gt[list(classes)].apply(pd.to_numeric, errors="coerce").fillna(0.0).to_numpy()
    bad = onehot.sum(axis=1) != 1
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DatasetError(f"dataset 'isic2019': {gt_csv}: row {i} ({gt['image'][i]}) has {onehot[i].sum():g} "
                           "classes set; each image needs exactly one 1.0 among MEL..UNK")
    diagnosis = pd.Series(np.asarray(classes)[onehot.argmax(axis=1)])
    ids = "isic_" + gt["image"]
    patient = ids.copy()
    meta_csv = root / "ISIC_2019_Training_Metadata.csv"
    if meta_csv.is_file():
        meta = read_table(meta_csv, "isic2019", ("image", "lesion_id"), dtype={"image": str, "lesion_id": str})
        lesion = gt["image"].map(meta.set_index("image")["lesion_id"])
        patient = ("isic_" + lesion).where(lesion.notna(), patient)
    return pd.DataFrame({
        "sample_id": ids,
        "path": f"{ISIC_INPUT}/" + gt["image"] + ".jpg",
        "patient_id": patient,
        "acq_group": "isic2019",
        "bio_label": diagnosis,
        "malignant": diagnosis.map(ISIC_MALIGNANT),
    })


_BOOL = {"true": 1.0, "false": 0.0, "1": 1.0, "0": 0.0}


def build_ddi(root: Path) -> pd.DataFrame:
    """DDI ``ddi_metadata.csv`` (``DDI_ID, DDI_file, skin_tone, malignant, disease``) + the PNGs
    beside it; ``malignant`` is ``True``/``False``."""
    csv = root / "ddi_metadata.csv"
    table = read_table(csv, "ddi", ("DDI_ID", "DDI_file", "skin_tone", "malignant", "disease"),
                       dtype={"DDI_ID": str, "DDI_file": str})
    raw = table["malignant"].astype(str).str.strip().str.lower()
    if not raw.isin(list(_BOOL)).all():
        i = int(np.flatnonzero(~raw.isin(list(_BOOL)))[0])
        raise DatasetError(f"dataset 'ddi': {csv}: column 'malignant', row {i}: {table['malignant'][i]!r} "
                           "is not True/False; use the official file")
    ids = "ddi_" + table["DDI_ID"].str.strip()
    return pd.DataFrame({
        "sample_id": ids,
        "path": table["DDI_file"].str.strip(),
        "patient_id": ids,
        "acq_group": "ddi",
        "bio_label": table["disease"].astype(str).str.strip(),
        "skin_tone": pd.to_numeric(table["skin_tone"], errors="coerce"),
        "malignant": raw.map(_BOOL),
    })


FITZPATRICK17K = register(Adapter(
    name="fitzpatrick17k",
    build=build_fitzpatrick17k,
    findings=("malignant",),
    description="Fitzpatrick17k: 16,577 clinical skin photographs, 114 conditions, Fitzpatrick skin type 1-6.",
))

ISIC2019 = register(Adapter(
    name="isic2019",
    build=build_isic2019,
    findings=("malignant",),
    description="ISIC 2019: 25,331 dermoscopic images in 8 diagnoses (MEL, NV, BCC, AK, BKL, DF, VASC, SCC).",
))

DDI = register(Adapter(
    name="ddi",
    build=build_ddi,
    findings=("malignant",),
    description="DDI (Diverse Dermatology Images): 656 clinical images, biopsy-proven, skin tones FST I-VI.",
))
