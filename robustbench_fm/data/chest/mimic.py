"""MIMIC-CXR-JPG and MS-CXR (its phrase-grounding boxes) on their PhysioNet layouts.

MIMIC-CXR-JPG 2.0.0/2.1.0 (catalog 1.1, "MIMIC-CXR-JPG")::

    <root>/mimic-cxr-2.0.0-metadata.csv.gz   dicom_id, subject_id, study_id, ViewPosition, Rows, Columns, ...
    <root>/mimic-cxr-2.0.0-split.csv.gz      dicom_id, study_id, subject_id, split (train/validate/test)
    <root>/mimic-cxr-2.0.0-chexpert.csv.gz   subject_id, study_id + 14 labels 1.0/0.0/-1.0/blank, per study
    <root>/files/p10/p10000032/s50414267/<dicom_id>.jpg

One row per image of the metadata file (with its ``study_id`` as an extra column); each image
takes its study's labels (studies without a labeler row stay unlabelled). ``No Finding == 1`` makes the blank
findings negative, as the CheXpert labeler only sets it when nothing is positive or uncertain (torchxrayvision does
the same).

MIMIC-CXR-JPG releases no sex or age, so by default the manifest has no ``sex`` / ``age`` columns.
The option ``patients`` (a path, absolute or under ``root``) names MIMIC-IV's ``hosp/patients.csv.gz``
(a separate PhysioNet project; columns ``subject_id, gender, anchor_age, anchor_year``), which gives
``sex`` (``gender`` M / F) and ``age`` = ``anchor_age`` + (the year of the metadata's ``StudyDate``
- ``anchor_year``): MIMIC shifts a patient's dates by one offset, the same in MIMIC-IV and MIMIC-CXR, so
the two years are on one time line (MIMIC-IV docs, ``patients``: anchor_age is the age in anchor_year).
MIMIC-IV writes ``anchor_age`` 91 for everyone over 89, so those ages are at least the value given.
Subjects the file lacks are blank. The confounder scan reads them (docs/methods/confounders.md).

MS-CXR (catalog 1.1, "MS-CXR") ships annotations only: ``MS_CXR_Local_Alignment_v1.1.0.csv``
(dicom_id, category_name, label_text, path, x, y, w, h, image_width, image_height, split), one row
per box, ``path`` relative to the MIMIC-CXR-JPG root. Its ``root`` is therefore the MIMIC-CXR-JPG
root; the CSV is found there (or under ``ms-cxr/``) unless ``annotations`` names it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..manifest import CHEST_FINDINGS
from ..registry import Adapter, register
from .common import (
    ChestDataError,
    assemble,
    box_sources,
    check_label_columns,
    enclosing_boxes,
    finding_sources,
    findings_from_columns,
    findings_from_terms,
    first_existing,
    normalise_views,
    read_table,
    sex_of,
    year_of,
    years_of,
)

SPLIT_NAMES = {"train": "train", "validate": "val", "val": "val", "test": "test"}
#: the columns read from MIMIC-IV's hosp/patients.csv.gz (option ``patients``)
PATIENT_COLUMNS = ["subject_id", "gender", "anchor_age", "anchor_year"]


def _mimic_file(root: Path, stem: str) -> Path:
    return first_existing(root, [f"{stem}.csv.gz", f"{stem}.csv"], "mimic_cxr", f"'{stem}.csv.gz'")


def _mimic_metadata(root: Path, extra: tuple[str, ...] = ()) -> pd.DataFrame:
    return read_table(_mimic_file(root, "mimic-cxr-2.0.0-metadata"), "mimic_cxr",
                      ["dicom_id", "subject_id", "study_id", "ViewPosition", *extra],
                      dtype={"dicom_id": str, "ViewPosition": str})


def _demographics(root: Path, patients: str, meta: pd.DataFrame) -> dict[str, pd.Series]:
    """``sex`` and ``age`` at the study per image from MIMIC-IV's patients table (option ``patients``)."""
    path = Path(patients) if Path(patients).is_absolute() else root / patients
    if not path.is_file():
        raise ChestDataError(f"dataset 'mimic_cxr': option 'patients' '{path}' is not a file; point it at "
                             "MIMIC-IV's hosp/patients.csv.gz (subject_id, gender, anchor_age, anchor_year)")
    table = read_table(path, "mimic_cxr", PATIENT_COLUMNS,
                       usecols=lambda c: str(c).strip() in PATIENT_COLUMNS)
    twice = table["subject_id"][table["subject_id"].duplicated()]
    if len(twice):
        raise ChestDataError(f"dataset 'mimic_cxr': {path}: subject_id {twice.iloc[0]} has several rows; "
                             "use MIMIC-IV's hosp/patients file unmodified")
    row = meta[["subject_id"]].merge(table, on="subject_id", how="left")
    study_year = year_of(meta["StudyDate"])
    return {"sex": sex_of(row["gender"]),
            "age": years_of(pd.to_numeric(row["anchor_age"], errors="coerce")
                            + study_year - pd.to_numeric(row["anchor_year"], errors="coerce"))}


def build_mimic_cxr(root: Path, uncertain: str = "nan", labeler: str = "chexpert", patients: str | None = None,
                    views: list[str] | None = None) -> pd.DataFrame:
    """MIMIC-CXR-JPG manifest; ``labeler`` picks the chexpert or negbio label file; ``patients``
    (MIMIC-IV's patients table) adds ``sex`` and ``age``."""
    if labeler not in ("chexpert", "negbio"):
        raise ChestDataError(f"dataset 'mimic_cxr': option 'labeler' {labeler!r} is not chexpert or negbio")
    meta = _mimic_metadata(root, () if patients is None else ("StudyDate",))
    split_file = _mimic_file(root, "mimic-cxr-2.0.0-split")
    split = read_table(split_file, "mimic_cxr", ["dicom_id", "split"], dtype={"dicom_id": str})
    label_file = _mimic_file(root, f"mimic-cxr-2.0.0-{labeler}")
    labels = read_table(label_file, "mimic_cxr", ["subject_id", "study_id", "No Finding"])
    check_label_columns(labels, label_file, "mimic_cxr")
    if labels.duplicated(["subject_id", "study_id"]).any():
        raise ChestDataError(f"dataset 'mimic_cxr': the {labeler} file has several rows for one study; "
                             "use the official file unmodified")
    table = meta.merge(labels, on=["subject_id", "study_id"], how="left", validate="many_to_one")
    split_of = split.drop_duplicates("dicom_id").set_index("dicom_id")["split"].map(SPLIT_NAMES)
    findings = findings_from_columns(table, "mimic_cxr", uncertain, no_finding="No Finding")
    sid = table["subject_id"].astype(str)
    base = pd.DataFrame({
        "sample_id": table["dicom_id"],
        "path": ("files/p" + sid.str[:2] + "/p" + sid + "/s" + table["study_id"].astype(str)
                 + "/" + table["dicom_id"] + ".jpg"),
        "patient_id": sid,
        "view": normalise_views(table["ViewPosition"]),
        "split": table["dicom_id"].map(split_of),
        "study_id": table["study_id"].astype(str),
    })
    if patients is not None:
        for col, values in _demographics(root, patients, table).items():
            base[col] = values.to_numpy()
    return assemble(base, findings, "mimic_cxr", views)


def _ms_cxr_annotations(root: Path, annotations: str | None) -> Path:
    if annotations is not None:
        path = Path(annotations)
        path = path if path.is_absolute() else root / path
        if not path.is_file():
            raise ChestDataError(f"dataset 'ms_cxr': option 'annotations' '{path}' is not a file; "
                                 "point it at MS_CXR_Local_Alignment_v1.1.0.csv")
        return path
    found = sorted([*root.glob("MS_CXR_Local_Alignment_v*.csv"), *root.glob("ms-cxr/**/MS_CXR_Local_Alignment_v*.csv")])
    if not found:
        raise ChestDataError(f"dataset 'ms_cxr': no MS_CXR_Local_Alignment_v*.csv under '{root}' or "
                             f"'{root}/ms-cxr/'; set dataset.root to the MIMIC-CXR-JPG root and put the "
                             "MS-CXR files there, or pass options.annotations")
    return found[-1]


def build_ms_cxr(root: Path, annotations: str | None = None, box_finding: str = "pneumothorax",
                 views: list[str] | None = None) -> pd.DataFrame:
    """MS-CXR manifest: one row per annotated image, boxes of ``box_finding`` in box_* columns.

    An image is positive for every category it has a box of; the other findings are NaN (MS-CXR
    annotates positives only). The view comes from the MIMIC metadata when it is under ``root``.
    """
    path = _ms_cxr_annotations(root, annotations)
    ann = read_table(path, "ms_cxr", ["dicom_id", "category_name", "path", "x", "y", "w", "h",
                            "image_width", "image_height", "split"], dtype={"dicom_id": str})
    images = ann.drop_duplicates("dicom_id").reset_index(drop=True)
    terms = ann.groupby("dicom_id")["category_name"].agg(lambda s: frozenset(s.str.strip()))
    findings = findings_from_terms(images["dicom_id"].map(terms), "ms_cxr", absent=np.nan)
    subject = ("/" + images["path"].astype(str)).str.extract(r"/p\d\d/p(\d+)/s\d+/", expand=False)
    if subject.isna().any():
        bad = images.loc[subject.isna(), "path"].iloc[0]
        raise ChestDataError(f"{path}: column 'path' value {bad!r} is not files/pXX/pSUBJECT/sSTUDY/ID.jpg; "
                             "use the official MS-CXR file")
    try:
        view_of = _mimic_metadata(root).set_index("dicom_id")["ViewPosition"]
        view = normalise_views(images["dicom_id"].map(view_of))
    except ChestDataError:
        view = pd.Series("UNKNOWN", index=images.index)
    base = pd.DataFrame({
        "sample_id": images["dicom_id"], "path": images["path"].str.lstrip("/"),
        "patient_id": subject, "view": view, "split": images["split"].map(SPLIT_NAMES),
    })
    boxed = ann[ann["category_name"].str.strip().str.lower().isin(
        [s.lower() for s in box_sources("ms_cxr", box_finding)])]
    boxes = enclosing_boxes(pd.DataFrame({
        "sample_id": boxed["dicom_id"], "x0": boxed["x"], "y0": boxed["y"],
        "x1": boxed["x"] + boxed["w"], "y1": boxed["y"] + boxed["h"],
        "width": boxed["image_width"], "height": boxed["image_height"]}))
    return assemble(base, findings, "mimic_cxr", views, boxes)


register(Adapter(
    name="mimic_cxr", build=build_mimic_cxr, findings=CHEST_FINDINGS,
    description="MIMIC-CXR-JPG: 377,110 chest radiographs (BIDMC, Boston) with CheXpert-labeler labels per study.",
))
register(Adapter(
    name="ms_cxr", build=build_ms_cxr, findings=tuple(finding_sources("ms_cxr")),
    description="MS-CXR: 1,162 radiologist boxes with phrases on MIMIC-CXR images (8 findings); boxes of one finding "
                "per row.",
))
