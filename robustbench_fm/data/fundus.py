"""Fundus datasets of CANDOR's glaucoma and referable-retinopathy tasks (candor.md Table 1;
layouts and label encodings: catalog 1.4).

Findings: ``glaucoma`` (Harvard-FairVision) and ``referable_dr`` = DR grade >= 2 on the 0-4
international scale (APTOS, Messidor-2, IDRiD; FairVision's DR cohort through its ``dr_subtype``).
``bio_label`` is the DR grade where one is given. The matched group ``acq_group`` is the source
dataset. IDRiD's segmentation part carries the expert lesion masks used by occlusion retention
(candor.md "Occlusion Retention and Discordance").
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from .files import DatasetError, DatasetFileMissing, first_existing, read_table, require
from .images import read_mask
from .registry import Adapter, register

#: Grade >= 2 (moderate NPDR or worse) is referable (candor.md Table 1).
REFERABLE_GRADE = 2
#: FairVision ``use`` values and the split folder names (renamed per its README, or as downloaded).
FAIRVISION_SPLITS = {"training": ("train", ("train", "Training")),
                     "validation": ("val", ("val", "Validation")),
                     "test": ("test", ("test", "Test"))}
#: FairVision DR cohort ``dr_subtype`` -> referable (grade >= 2); ``not.in.icd.table`` is unlabelled.
FAIRVISION_DR_REFERABLE = {"no.dr.diagnosis": 0.0, "mild.npdr": 0.0, "moderate.npdr": 1.0,
                           "severe.npdr": 1.0, "pdr": 1.0, "not.in.icd.table": np.nan}
_YES_NO = {"yes": 1.0, "no": 0.0, "1": 1.0, "0": 0.0, "true": 1.0, "false": 0.0, "1.0": 1.0, "0.0": 0.0}


def referable(grade: pd.Series) -> pd.Series:
    """1.0 where the 0-4 grade is >= 2, 0.0 below, NaN where the grade is missing."""
    grade = pd.to_numeric(grade, errors="coerce")
    return (grade >= REFERABLE_GRADE).astype(float).where(grade.notna())


def _grade_label(grade: pd.Series) -> pd.Series:
    grade = pd.to_numeric(grade, errors="coerce")
    return grade.map(lambda g: f"grade_{int(g)}", na_action="ignore")


def _fairvision_split_folder(disease_dir: Path, use: str) -> str:
    names = FAIRVISION_SPLITS[use][1]
    return next((n for n in names if (disease_dir / n).is_dir()), names[0])


def build_fairvision(root: Path, diseases: list[str] | tuple[str, ...] = ("Glaucoma",)) -> pd.DataFrame:
    """Harvard-FairVision ``<Disease>/<split>/data_<id>.npz`` + ``data_summary_<disease>.csv``.

    The image is the SLO fundus stored in each NPZ (locator ``data_<id>.npz#slo_fundus``), the
    copy the official loader reads. Glaucoma labels come from the summary CSV (``glaucoma``
    yes/no); the DR cohort's referable label needs each NPZ's ``dr_subtype`` (mapping
    :data:`FAIRVISION_DR_REFERABLE`), so ``diseases=[Glaucoma, DR]`` reads those NPZ files.
    """
    frames = []
    for disease in diseases:
        if disease not in ("Glaucoma", "DR"):
            raise DatasetError(f"dataset 'fairvision': disease '{disease}' has no CANDOR task; use Glaucoma or DR")
        key = disease.lower()
        csv = first_existing(root, (f"data_summary_{key}.csv", f"{disease}/data_summary_{key}.csv",
                                    f"{disease}/ReadMe/data_summary_{key}.csv"), "fairvision",
                             f"data_summary_{key}.csv")
        table = read_table(csv, "fairvision", ("filename", "use") + (("glaucoma",) if key == "glaucoma" else ()))
        use = table["use"].astype(str).str.strip().str.lower()
        bad = ~use.isin(list(FAIRVISION_SPLITS))
        if bad.any():
            raise DatasetError(f"dataset 'fairvision': {csv}: column 'use', row {int(np.flatnonzero(bad)[0])}: "
                               f"{table['use'][bad].iloc[0]!r} is not training/validation/test; use the official file")
        files = table["filename"].astype(str).str.strip()
        files = files.where(files.str.endswith(".npz"), files + ".npz")
        folders = use.map(lambda u: _fairvision_split_folder(root / disease, u))
        stems = key + "_" + files.str.rsplit(".", n=1).str[0]
        frame = pd.DataFrame({
            "sample_id": stems,
            "path": disease + "/" + folders + "/" + files + "#slo_fundus",
            "patient_id": stems,
            "acq_group": "fairvision",
            "split": use.map(lambda u: FAIRVISION_SPLITS[u][0]),
            "glaucoma": np.nan,
            "referable_dr": np.nan,
        })
        for col in ("race", "gender", "age"):
            if col in table.columns:
                frame[col] = table[col].to_numpy()
        if key == "glaucoma":
            raw = table["glaucoma"].astype(str).str.strip().str.lower()
            if not raw.isin(list(_YES_NO)).all():
                i = int(np.flatnonzero(~raw.isin(list(_YES_NO)))[0])
                raise DatasetError(f"dataset 'fairvision': {csv}: column 'glaucoma', row {i}: "
                                   f"{table['glaucoma'].iloc[i]!r} is not yes/no or 1/0; use the official file")
            frame["glaucoma"] = raw.map(_YES_NO).to_numpy()
        else:
            frame["referable_dr"] = [_fairvision_dr(root / p.split("#")[0]) for p in frame["path"]]
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def _fairvision_dr(npz: Path) -> float:
    require(npz, "fairvision", "the DR labels are inside the NPZ files; download the DR cohort")
    with np.load(npz, allow_pickle=False) as archive:
        subtype = str(np.asarray(archive["dr_subtype"]).reshape(-1)[0]).strip()
    if subtype not in FAIRVISION_DR_REFERABLE:
        raise DatasetError(f"dataset 'fairvision': {npz}: dr_subtype {subtype!r} is not one of "
                           f"{', '.join(FAIRVISION_DR_REFERABLE)}; use the official file")
    return FAIRVISION_DR_REFERABLE[subtype]


def build_aptos(root: Path) -> pd.DataFrame:
    """APTOS 2019 ``train.csv`` (``id_code, diagnosis`` 0-4) + ``train_images/<id_code>.png``.
    The test set's labels were never released, so only the training images are used."""
    table = read_table(root / "train.csv", "aptos", ("id_code", "diagnosis"), dtype={"id_code": str})
    ids = "aptos_" + table["id_code"]
    return pd.DataFrame({
        "sample_id": ids,
        "path": "train_images/" + table["id_code"] + ".png",
        "patient_id": ids,
        "acq_group": "aptos",
        "split": "train",
        "bio_label": _grade_label(table["diagnosis"]),
        "referable_dr": referable(table["diagnosis"]),
    })


#: Header variants of ``messidor_data.csv``: Kaggle google-brain, and its widespread re-upload.
MESSIDOR_ID_COLUMNS = ("image_id", "id_code")
MESSIDOR_GRADE_COLUMNS = ("adjudicated_dr_grade", "diagnosis")


def build_messidor2(root: Path) -> pd.DataFrame:
    """Messidor-2 images ``IMAGES/`` (ADCIS) + Krause et al.'s adjudicated grades ``messidor_data.csv``.

    File names are matched to ``IMAGES/`` case-insensitively (the CSV and the archive disagree on
    ``.jpg``/``.JPG``). Ungradable images (``adjudicated_gradable`` 0, blank grade) are unlabelled.
    """
    csv = root / "messidor_data.csv"
    table = read_table(csv, "messidor2", ())
    id_col = next((c for c in MESSIDOR_ID_COLUMNS if c in table.columns), None)
    grade_col = next((c for c in MESSIDOR_GRADE_COLUMNS if c in table.columns), None)
    if id_col is None or grade_col is None:
        raise DatasetError(f"dataset 'messidor2': {csv}: needs an image column ({' or '.join(MESSIDOR_ID_COLUMNS)}) "
                           f"and a grade column ({' or '.join(MESSIDOR_GRADE_COLUMNS)}); use the Kaggle "
                           "google-brain/messidor2-dr-grades file")
    names = table[id_col].astype(str).str.strip()
    images = root / "IMAGES"
    on_disk = {e.name.lower(): e.name for e in os.scandir(images)} if images.is_dir() else {}
    names_on_disk = names.map(lambda n: on_disk.get(n.lower(), n))
    grade = pd.to_numeric(table[grade_col], errors="coerce")
    if "adjudicated_gradable" in table.columns:
        grade = grade.where(pd.to_numeric(table["adjudicated_gradable"], errors="coerce") != 0)
    ids = "messidor2_" + names.str.rsplit(".", n=1).str[0]
    out = pd.DataFrame({
        "sample_id": ids,
        "path": "IMAGES/" + names_on_disk,
        "patient_id": ids,
        "acq_group": "messidor2",
        "bio_label": _grade_label(grade),
        "referable_dr": referable(grade),
    })
    if "adjudicated_dme" in table.columns:
        out["dme"] = pd.to_numeric(table["adjudicated_dme"], errors="coerce").to_numpy()
    return out


IDRID_SPLITS = {"a. Training Set": "train", "b. Testing Set": "test"}
IDRID_GRADING = "B. Disease Grading"
IDRID_GRADING_CSV = {"train": "a. IDRiD_Disease Grading_Training Labels.csv",
                     "test": "b. IDRiD_Disease Grading_Testing Labels.csv"}
IDRID_SEGMENTATION = "A. Segmentation"
#: Lesion finding -> (mask folder, file suffix) of A. Segmentation (catalog 1.4).
IDRID_LESIONS = {"microaneurysms": ("1. Microaneurysms", "MA"), "haemorrhages": ("2. Haemorrhages", "HE"),
                 "hard_exudates": ("3. Hard Exudates", "EX"), "soft_exudates": ("4. Soft Exudates", "SE")}


def build_idrid(root: Path, part: str = "grading", lesion_boxes: bool = True) -> pd.DataFrame:
    """IDRiD, ``part='grading'`` (516 graded images, referable DR) or ``'segmentation'`` (81 images
    with lesion masks). ``root`` holds ``A. Segmentation/`` and ``B. Disease Grading/``.

    Segmentation rows carry ``mask_<lesion>`` (the mask TIFF relative to ``root``, NaN where the
    lesion has no mask: an absent file is an empty mask), ``<lesion>`` = 1/0 and, with
    ``lesion_boxes``, the normalised box around all lesion pixels of the four types
    (``box_x0..box_y1``; masks binarised with ``> 0``), for occlusion retention.
    """
    if part == "grading":
        return _idrid_grading(root)
    if part == "segmentation":
        return _idrid_segmentation(root, lesion_boxes)
    raise DatasetError(f"dataset 'idrid': part '{part}' unknown; use grading or segmentation")


def _idrid_grading(root: Path) -> pd.DataFrame:
    frames = []
    for folder, split in IDRID_SPLITS.items():
        csv = root / IDRID_GRADING / "2. Groundtruths" / IDRID_GRADING_CSV[split]
        table = read_table(csv, "idrid", ("Image name", "Retinopathy grade"), dtype={"Image name": str})
        names = table["Image name"].str.strip()
        ids = f"idrid_{split}_" + names
        frames.append(pd.DataFrame({
            "sample_id": ids,
            "path": f"{IDRID_GRADING}/1. Original Images/{folder}/" + names + ".jpg",
            "patient_id": ids,
            "acq_group": "idrid",
            "split": split,
            "bio_label": _grade_label(table["Retinopathy grade"]),
            "referable_dr": referable(table["Retinopathy grade"]),
        }))
    return pd.concat(frames, ignore_index=True)


def _idrid_segmentation(root: Path, lesion_boxes: bool) -> pd.DataFrame:
    rows = []
    for folder, split in IDRID_SPLITS.items():
        images = require(root / IDRID_SEGMENTATION / "1. Original Images" / folder, "idrid",
                         "unzip 'A. Segmentation' of IDRiD under dataset.root")
        masks = root / IDRID_SEGMENTATION / "2. All Segmentation Groundtruths" / folder
        for name in sorted(e.name for e in os.scandir(images) if e.name.lower().endswith(".jpg")):
            stem = name.rsplit(".", 1)[0]
            row = {"sample_id": f"idrid_seg_{split}_{stem}",
                   "path": f"{IDRID_SEGMENTATION}/1. Original Images/{folder}/{name}",
                   "patient_id": f"idrid_seg_{split}_{stem}", "acq_group": "idrid", "split": split,
                   "referable_dr": np.nan}
            for lesion, (sub, suffix) in IDRID_LESIONS.items():
                mask = masks / sub / f"{stem}_{suffix}.tif"
                row[f"mask_{lesion}"] = mask.relative_to(root).as_posix() if mask.is_file() else np.nan
                row[lesion] = float(mask.is_file())
            rows.append(row)
    if not rows:
        raise DatasetFileMissing(f"dataset 'idrid': no images in '{root / IDRID_SEGMENTATION}/1. Original Images'; "
                                 "set dataset.root to the unzipped IDRiD folder")
    table = pd.DataFrame(rows)
    if lesion_boxes:
        boxes = [_union_box(root, row) for row in table.to_dict("records")]
        table[["box_x0", "box_y0", "box_x1", "box_y1"]] = pd.DataFrame(boxes, index=table.index)
    return table


def _union_box(root: Path, row: dict) -> tuple[float, float, float, float]:
    """Normalised (x0, y0, x1, y1) around every lesion pixel of the row's masks; NaN if none."""
    union = None
    for lesion in IDRID_LESIONS:
        rel = row[f"mask_{lesion}"]
        if isinstance(rel, str):
            mask = read_mask(root / rel)
            union = mask if union is None else union | mask
    if union is None or not union.any():
        return (np.nan,) * 4
    ys, xs = np.nonzero(union)
    h, w = union.shape
    return xs.min() / w, ys.min() / h, (xs.max() + 1) / w, (ys.max() + 1) / h


FAIRVISION = register(Adapter(
    name="fairvision",
    build=build_fairvision,
    findings=("glaucoma", "referable_dr"),
    description="Harvard-FairVision30k: SLO fundus (200 px, in each NPZ) of 10,000 subjects per disease; "
                "glaucoma yes/no.",
))

APTOS = register(Adapter(
    name="aptos",
    build=build_aptos,
    findings=("referable_dr",),
    description="APTOS 2019 Blindness Detection: 3,662 graded fundus photographs (Aravind, India); DR grade >= 2.",
))

MESSIDOR2 = register(Adapter(
    name="messidor2",
    build=build_messidor2,
    findings=("referable_dr",),
    description="Messidor-2: 1,748 fundus photographs (874 exams, France) with Krause et al.'s adjudicated DR grades.",
))

IDRID = register(Adapter(
    name="idrid",
    build=build_idrid,
    findings=("referable_dr",),
    description="IDRiD: 516 graded fundus photographs (India) and 81 with pixel-level lesion masks (MA, HE, EX, SE).",
))
