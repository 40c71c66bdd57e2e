"""VinDr-Mammo, CANDOR's mammography task: "Mass or suspicious calcification" (candor.md Table 1;
layout: catalog 1.6).

One row per DICOM image ``images/<study_id>/<image_id>.dicom``. ``mass_or_calcification`` is 1
when any finding of the image in ``finding_annotations.csv`` lists ``Mass`` or ``Suspicious
Calcification`` among its ``finding_categories`` (a Python-list string), else 0. Its box is the
normalised union of those findings' boxes (pixel ``xmin..ymax`` divided by the image's
``width``/``height``). There is no patient id: ``patient_id`` is the study (one exam of one
woman). The matched group is the source dataset; ``view`` is CC/MLO.
"""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pandas as pd

from .files import DatasetError, read_table
from .registry import Adapter, register

POSITIVE_CATEGORIES = ("Mass", "Suspicious Calcification")
VINDR_SPLITS = {"training": "train", "test": "test"}
_BREAST = ("study_id", "series_id", "image_id", "laterality", "view_position", "height", "width",
           "breast_birads", "breast_density", "split")
_FINDING = ("image_id", "finding_categories", "xmin", "ymin", "xmax", "ymax")


def _categories(cell: str, csv: Path, row: int) -> list[str]:
    try:
        value = ast.literal_eval(str(cell))
    except (ValueError, SyntaxError):
        raise DatasetError(f"dataset 'vindr_mammo': {csv}: column 'finding_categories', row {row}: {cell!r} "
                           "is not a list like ['Mass']; use the official file")
    return [str(v).strip() for v in (value if isinstance(value, (list, tuple)) else [value])]


def build_vindr_mammo(root: Path) -> pd.DataFrame:
    """``breast-level_annotations.csv`` (one row per image) + ``finding_annotations.csv`` -> manifest."""
    breast_csv, finding_csv = root / "breast-level_annotations.csv", root / "finding_annotations.csv"
    breast = read_table(breast_csv, "vindr_mammo", _BREAST, dtype={c: str for c in _BREAST[:3]})
    findings = read_table(finding_csv, "vindr_mammo", _FINDING, dtype={"image_id": str})
    bad = ~breast["split"].isin(list(VINDR_SPLITS))
    if bad.any():
        raise DatasetError(f"dataset 'vindr_mammo': {breast_csv}: column 'split', row {int(np.flatnonzero(bad)[0])}: "
                           f"{breast['split'][bad].iloc[0]!r} is not training/test; use the official file")
    positive = np.array([any(c in POSITIVE_CATEGORIES for c in _categories(cell, finding_csv, i))
                         for i, cell in enumerate(findings["finding_categories"])], dtype=bool)
    boxes = findings[positive].groupby("image_id").agg(xmin=("xmin", "min"), ymin=("ymin", "min"),
                                                       xmax=("xmax", "max"), ymax=("ymax", "max"))
    box = breast[["image_id"]].join(boxes, on="image_id")
    width = pd.to_numeric(breast["width"], errors="coerce")
    height = pd.to_numeric(breast["height"], errors="coerce")
    return pd.DataFrame({
        "sample_id": "vindr_mammo_" + breast["image_id"],
        "path": "images/" + breast["study_id"] + "/" + breast["image_id"] + ".dicom",
        "patient_id": "vindr_mammo_" + breast["study_id"],
        "view": breast["view_position"].str.strip(),
        "laterality": breast["laterality"].str.strip(),
        "acq_group": "vindr_mammo",
        "split": breast["split"].map(VINDR_SPLITS),
        "breast_birads": breast["breast_birads"],
        "breast_density": breast["breast_density"],
        "mass_or_calcification": breast["image_id"].isin(set(boxes.index)).astype(float),
        "box_x0": (box["xmin"] / width).clip(0, 1),
        "box_y0": (box["ymin"] / height).clip(0, 1),
        "box_x1": (box["xmax"] / width).clip(0, 1),
        "box_y1": (box["ymax"] / height).clip(0, 1),
    })


VINDR_MAMMO = register(Adapter(
    name="vindr_mammo",
    build=build_vindr_mammo,
    findings=("mass_or_calcification",),
    description="VinDr-Mammo: 20,000 full-field digital mammograms (5,000 exams, Vietnam), DICOM; "
                "mass or suspicious calcification.",
))
