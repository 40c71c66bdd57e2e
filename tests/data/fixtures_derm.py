"""Miniature Fitzpatrick17k, ISIC 2019 and DDI in their official layouts (catalog 1.5)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

#: (md5hash, fitzpatrick_scale, label, three_partition_label, qc, url)
FITZPATRICK_ROWS = (
    ("5e82a45bc5d78bd24ae8202d194423f8", 3, "melanoma", "malignant", "1 Diagnostic",
     "https://www.dermaamin.com/site/images/clinical-pic/m/melanoma/melanoma1.jpg"),
    ("fa2911a9b13b6f8af79cb700937cc14f", 1, "basal cell carcinoma", "malignant", "",
     "http://atlasdermatologico.com.br/img?imageId=4265"),
    ("d2a0d7a3f2b1e8c5a7b6c4d3e2f1a0b9", 5, "seborrheic keratosis", "benign", "2 Characteristic",
     "http://atlasdermatologico.com.br/img?imageId=100"),
    ("0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e", -1, "psoriasis", "non-neoplastic", "",
     "https://www.dermaamin.com/site/images/clinical-pic/p/psoriasis/psoriasis3.jpg"),
    ("9f8e7d6c5b4a39281706f5e4d3c2b1a0", 4, "melanoma", "malignant", "3 Wrongly labelled", ""),
)
ISIC_ROWS = (("ISIC_0000000", "NV", "BCN_0000001"), ("ISIC_0000001", "MEL", "HAM_0000118"),
             ("ISIC_0000002", "MEL", "HAM_0000118"), ("ISIC_0000003", "AK", ""),
             ("ISIC_0000004_downsampled", "BCC", "BCN_0000002"), ("ISIC_0000005", "SCC", ""),
             ("ISIC_0000006", "DF", "HAM_0000500"))
ISIC_CLASSES = ("MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC", "UNK")
#: (DDI_ID, DDI_file, skin_tone, malignant, disease)
DDI_ROWS = ((1, "000001.png", 56, "True", "melanoma-in-situ"), (2, "000002.png", 12, "False", "seborrheic-keratosis"),
            (3, "000003.png", 34, "False", "verruca-vulgaris"),
            (4, "000004.png", 56, "True", "squamous-cell-carcinoma"))


def _image(path: Path, value: int, fmt: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((6, 8, 3), value, np.uint8)).save(path, format=fmt)


def write_fitzpatrick17k(root: Path, image_dir: str = "images", duplicate: bool = False) -> Path:
    """``fitzpatrick17k.csv`` (official columns) + ``<image_dir>/<md5hash>.jpg``."""
    root.mkdir(parents=True, exist_ok=True)
    lines = ["md5hash,fitzpatrick_scale,fitzpatrick_centaur,label,nine_partition_label,three_partition_label,"
             "qc,url,url_alphanum"]
    rows = FITZPATRICK_ROWS + ((FITZPATRICK_ROWS[0],) if duplicate else ())
    for i, (md5, scale, label, part, qc, url) in enumerate(rows):
        lines.append(f"{md5},{scale},{scale},{label},malignant melanoma,{part},{qc},{url},"
                     f"{''.join(c for c in url if c.isalnum())}")
        _image(root / image_dir / f"{md5}.jpg", 30 * i, "JPEG")
    (root / "fitzpatrick17k.csv").write_text("\n".join(lines) + "\n")
    return root


def write_isic2019(root: Path, metadata: bool = True) -> Path:
    """``ISIC_2019_Training_GroundTruth.csv`` (one-hot floats), ``..._Metadata.csv`` and
    ``ISIC_2019_Training_Input/<image>.jpg``."""
    root.mkdir(parents=True, exist_ok=True)
    gt = ["image," + ",".join(ISIC_CLASSES)]
    meta = ["image,age_approx,anatom_site_general,lesion_id,sex"]
    for i, (image, cls, lesion) in enumerate(ISIC_ROWS):
        gt.append(image + "," + ",".join("1.0" if c == cls else "0.0" for c in ISIC_CLASSES))
        meta.append(f"{image},{40 + 5 * i},anterior torso,{lesion},{'male' if i % 2 else 'female'}")
        _image(root / "ISIC_2019_Training_Input" / f"{image}.jpg", 20 * i, "JPEG")
    (root / "ISIC_2019_Training_GroundTruth.csv").write_text("\n".join(gt) + "\n")
    if metadata:
        (root / "ISIC_2019_Training_Metadata.csv").write_text("\n".join(meta) + "\n")
    return root


def write_ddi(root: Path) -> Path:
    """``ddi_metadata.csv`` with its leading unnamed pandas index column + the PNGs beside it."""
    root.mkdir(parents=True, exist_ok=True)
    lines = [",DDI_ID,DDI_file,skin_tone,malignant,disease"]
    for i, (ddi_id, name, tone, malignant, disease) in enumerate(DDI_ROWS):
        lines.append(f"{i},{ddi_id},{name},{tone},{malignant},{disease}")
        _image(root / name, 50 * i, "PNG")
    (root / "ddi_metadata.csv").write_text("\n".join(lines) + "\n")
    return root
