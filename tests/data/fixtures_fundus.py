"""Miniature Harvard-FairVision, APTOS 2019, Messidor-2 and IDRiD in their official layouts (catalog 1.4)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

#: FairVision glaucoma cohort: (file id, use, glaucoma) with the downloaded folder names.
FAIRVISION_GLAUCOMA = (("00001", "training", "yes"), ("00002", "training", "no"), ("00003", "training", "yes"),
                       ("06001", "validation", "no"), ("07001", "test", "yes"), ("07002", "test", "no"))
FAIRVISION_DR = (("00011", "training", "moderate.npdr"), ("00012", "training", "mild.npdr"),
                 ("06011", "validation", "pdr"), ("07011", "test", "not.in.icd.table"))
APTOS_GRADES = {"000c1434d8d7": 2, "001639a390f0": 4, "0024cdab0c1e": 1, "002c21358ce6": 0, "005b95c28852": 0,
                "0083ee8054ee": 3}
#: Messidor-2 label rows: (image_id in the CSV, file name on disk, grade or None, gradable).
MESSIDOR_ROWS = (("20051020_43808_0100_PP.png", "20051020_43808_0100_PP.png", 0, 1),
                 ("20051020_43832_0100_PP.png", "20051020_43832_0100_PP.png", 2, 1),
                 ("IM002385.jpg", "IM002385.JPG", 3, 1),
                 ("IM004176.JPG", "IM004176.JPG", 1, 1),
                 ("20060522_45012_0100_PP.tif", "20060522_45012_0100_PP.tif", None, 0))
IDRID_GRADES = {"train": {"IDRiD_001": (3, 2), "IDRiD_002": (0, 0), "IDRiD_003": (2, 1)},
                "test": {"IDRiD_001": (4, 2), "IDRiD_002": (1, 0)}}
#: IDRiD segmentation images -> lesion -> (row0, col0, row1, col1) of its rectangle; absent = no mask file.
IDRID_LESIONS = {"train": {"IDRiD_01": {"MA": (2, 3, 4, 5), "EX": (10, 1, 12, 2)}, "IDRiD_02": {"HE": (0, 0, 1, 1)}},
                 "test": {"IDRiD_55": {}}}
IDRID_SHAPE = (16, 20)  # rows, columns of the segmentation images and masks
_LESION_FOLDERS = {"MA": "1. Microaneurysms", "HE": "2. Haemorrhages", "EX": "3. Hard Exudates",
                   "SE": "4. Soft Exudates", "OD": "5. Optic Disc"}
_SPLIT_FOLDERS = {"train": "a. Training Set", "test": "b. Testing Set"}


def _image(path: Path, value: int, size=(8, 6), **save) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size[1], size[0], 3), value, np.uint8)).save(path, **save)


def write_fairvision(root: Path, dr: bool = True) -> Path:
    """``FairVision/{Glaucoma,DR}/{Training,Validation,Test}/data_<id>.npz`` (slo_fundus, glaucoma or
    dr_subtype, demographics) + ``slo_<id>.jpg`` + ``data_summary_<disease>.csv`` at the top."""
    folders = {"training": "Training", "validation": "Validation", "test": "Test"}
    cohorts = [("Glaucoma", FAIRVISION_GLAUCOMA)] + ([("DR", FAIRVISION_DR)] if dr else [])
    for disease, rows in cohorts:
        lines = ["filename,age,gender,race,ethnicity,language,maritalstatus,md," + disease.lower() + ",use"]
        for k, (fid, use, label) in enumerate(rows):
            folder = root / disease / folders[use]
            folder.mkdir(parents=True, exist_ok=True)
            slo = np.full((20, 20), 30 + k, np.uint8)
            extra = {"glaucoma": np.int64(label == "yes")} if disease == "Glaucoma" else {"dr_subtype": np.array(label)}
            np.savez(folder / f"data_{fid}.npz", slo_fundus=slo, oct_bscans=np.zeros((2, 4, 4), np.uint8),
                     race=np.int64(k % 3), male=np.int64(k % 2), **extra)
            _image(folder / f"slo_{fid}.jpg", 30 + k)
            csv_label = label if disease == "Glaucoma" else ("vision threatening dr" if label == "pdr" else "normal")
            lines.append(f"data_{fid}.npz,{60 + k},{'Male' if k % 2 else 'Female'},"
                         f"{['Asian', 'Black', 'White'][k % 3]},"
                         f"Non-Hispanic,English,Married,-1.5,{csv_label},{use}")
        (root / f"data_summary_{disease.lower()}.csv").write_text("\n".join(lines) + "\n")
    return root


def write_aptos(root: Path) -> Path:
    """``train.csv`` (id_code,diagnosis), ``train_images/<id>.png``, ``test.csv``, ``test_images/``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.csv").write_text("id_code,diagnosis\n" + "".join(f"{k},{g}\n" for k, g in APTOS_GRADES.items()))
    for i, k in enumerate(APTOS_GRADES):
        _image(root / "train_images" / f"{k}.png", 20 * i)
    (root / "test.csv").write_text("id_code\n0005cfc8afb6\n")
    _image(root / "test_images" / "0005cfc8afb6.png", 7)
    return root


def write_messidor2(root: Path) -> Path:
    """``IMAGES/`` (mixed .png/.JPG/.tif) + Kaggle google-brain ``messidor_data.csv``."""
    lines = ["image_id,adjudicated_dr_grade,adjudicated_dme,adjudicated_gradable"]
    for i, (name, on_disk, grade, gradable) in enumerate(MESSIDOR_ROWS):
        fmt = {"png": "PNG", "jpg": "JPEG", "tif": "TIFF"}[on_disk.rsplit(".", 1)[1].lower()]
        _image(root / "IMAGES" / on_disk, 40 * i, format=fmt)
        lines.append(f"{name},{'' if grade is None else grade},{'' if grade is None else int(grade >= 3)},{gradable}")
    (root / "messidor_data.csv").write_text("\n".join(lines) + "\n")
    return root


def write_idrid(root: Path) -> Path:
    """``B. Disease Grading`` (images + the two grading CSVs with their trailing empty columns) and
    ``A. Segmentation`` (images + red-on-black lesion TIFF masks, some lesions without a mask)."""
    grading = root / "B. Disease Grading"
    for split, grades in IDRID_GRADES.items():
        for i, name in enumerate(grades):
            _image(grading / "1. Original Images" / _SPLIT_FOLDERS[split] / f"{name}.jpg", 50 + i)
        csv = ("a. IDRiD_Disease Grading_Training Labels.csv" if split == "train"
               else "b. IDRiD_Disease Grading_Testing Labels.csv")
        body = "".join(f"{n},{g},{e},,\n" for n, (g, e) in grades.items())
        (grading / "2. Groundtruths").mkdir(parents=True, exist_ok=True)
        (grading / "2. Groundtruths" / csv).write_text("Image name,Retinopathy grade,Risk of macular edema ,,\n" + body)
    seg = root / "A. Segmentation"
    rows, cols = IDRID_SHAPE
    for split, per_image in IDRID_LESIONS.items():
        for name, lesions in per_image.items():
            _image(seg / "1. Original Images" / _SPLIT_FOLDERS[split] / f"{name}.jpg", 90, size=(cols, rows))
            for code, (r0, c0, r1, c1) in lesions.items():
                mask = np.zeros((rows, cols, 3), np.uint8)
                mask[r0:r1, c0:c1, 0] = 255
                path = seg / "2. All Segmentation Groundtruths" / _SPLIT_FOLDERS[split] / _LESION_FOLDERS[code]
                path.mkdir(parents=True, exist_ok=True)
                Image.fromarray(mask).save(path / f"{name}_{code}.tif", format="TIFF")
    return root
