"""RSNA Pneumonia Detection Challenge (Kaggle 2018), stage 2 (catalog 1.1, "RSNA Pneumonia")::

    <root>/stage_2_train_labels.csv      patientId, x, y, width, height, Target (one row per box)
    <root>/stage_2_train_images/<patientId>.dcm    1024 x 1024 DICOM, one image per patientId

``Target == 1`` (class "Lung Opacity", opacities suspicious for pneumonia) is ``pneumonia``; the
boxes of an image are merged into their enclosing box, normalised by the DICOM ``Rows``/``Columns``
(1024 when the header cannot be read). The view is the DICOM ``ViewPosition`` (PA/AP), read from
the headers of the files present, or from ``headers`` = a table with ``PatientID`` and
``ViewPosition`` columns (e.g. torchxrayvision's kaggle_stage_2_train_images_dicom_headers.csv.gz),
so the manifest builds from label files alone; without either the view is UNKNOWN.

The same headers give ``sex`` (DICOM ``PatientSex`` M / F) and ``age`` (``PatientAge``, years: the
files write ``51``; ages of 130 and more, which the release has, are blank) for the confounder scan
(docs/methods/confounders.md, "Where it runs"): always from the DICOM files (blank for a file that
is absent), and from a ``headers`` table that has those columns.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..registry import Adapter, register
from .common import (
    ChestDataError,
    assemble,
    dicom_age,
    dicom_headers,
    enclosing_boxes,
    finding_sources,
    findings_from_columns,
    first_existing,
    normalise_views,
    read_table,
    sex_of,
)

IMAGE_DIR = "stage_2_train_images"
NATIVE_SIZE = 1024.0
DEMOGRAPHICS = ["PatientSex", "PatientAge"]  # read where the headers have them


def _headers(root: Path, ids: pd.Series, headers: str | None) -> pd.DataFrame:
    if headers is not None:
        path = Path(headers) if Path(headers).is_absolute() else root / headers
        if not path.is_file():
            raise ChestDataError(f"dataset 'rsna_pneumonia': option 'headers' '{path}' is not a file; "
                                 "point it at a table with PatientID and ViewPosition columns")
        table = read_table(path, "rsna_pneumonia", ["PatientID", "ViewPosition"],
                           dtype={"PatientID": str, "ViewPosition": str})
        table = table.drop_duplicates("PatientID").set_index("PatientID")
        for col in ("Rows", "Columns"):
            if col not in table.columns:
                table[col] = np.nan
        return table.reindex(ids)[["ViewPosition", "Rows", "Columns",
                                   *[c for c in DEMOGRAPHICS if c in table.columns]]]
    files = {i: root / IMAGE_DIR / f"{i}.dcm" for i in ids}
    return dicom_headers(files, ["ViewPosition", "Rows", "Columns", *DEMOGRAPHICS]).reindex(ids)


def build_rsna_pneumonia(root: Path, headers: str | None = None, box_finding: str = "pneumonia",
                         views: list[str] | None = None) -> pd.DataFrame:
    """RSNA Pneumonia manifest: one row per image, pneumonia boxes merged into one."""
    if box_finding != "pneumonia":
        raise ChestDataError(f"dataset 'rsna_pneumonia': option 'box_finding' {box_finding!r}; "
                             "RSNA has pneumonia boxes only")
    csv = first_existing(root, ["stage_2_train_labels.csv", "stage_2_train_labels.csv.zip"],
                    "rsna_pneumonia", "'stage_2_train_labels.csv'")
    raw = read_table(csv, "rsna_pneumonia", ["patientId", "x", "y", "width", "height", "Target"],
                     dtype={"patientId": str})
    images = raw.groupby("patientId", sort=False).agg(Target=("Target", "max")).reset_index()
    head = _headers(root, images["patientId"], headers)
    base = pd.DataFrame({
        "sample_id": images["patientId"],
        "path": IMAGE_DIR + "/" + images["patientId"] + ".dcm",
        "patient_id": images["patientId"],
        "view": normalise_views(head["ViewPosition"].reset_index(drop=True)),
        "split": "train",
    })
    if "PatientSex" in head.columns:
        base["sex"] = sex_of(head["PatientSex"]).to_numpy()
    if "PatientAge" in head.columns:
        base["age"] = dicom_age(head["PatientAge"]).to_numpy()
    boxed = raw[raw["Target"] == 1].dropna(subset=["x", "y", "width", "height"])
    size = head.reindex(boxed["patientId"])
    boxes = enclosing_boxes(pd.DataFrame({
        "sample_id": boxed["patientId"].to_numpy(),
        "x0": boxed["x"].to_numpy(), "y0": boxed["y"].to_numpy(),
        "x1": (boxed["x"] + boxed["width"]).to_numpy(), "y1": (boxed["y"] + boxed["height"]).to_numpy(),
        "width": pd.to_numeric(size["Columns"], errors="coerce").fillna(NATIVE_SIZE).to_numpy(),
        "height": pd.to_numeric(size["Rows"], errors="coerce").fillna(NATIVE_SIZE).to_numpy()}))
    return assemble(base, findings_from_columns(images, "rsna_pneumonia"), "rsna_pneumonia", views, boxes)


register(Adapter(
    name="rsna_pneumonia", build=build_rsna_pneumonia, findings=tuple(finding_sources("rsna_pneumonia")),
    description="RSNA Pneumonia Detection: 26,684 NIH radiographs (DICOM) with radiologist pneumonia boxes.",
))
