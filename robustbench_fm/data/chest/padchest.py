"""PadChest (BIMCV, Hospital San Juan, Alicante) on its official layout (catalog 1.1, "PadChest")::

    <root>/PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv(.gz)   36 columns, first unnamed
    <root>/<ImageDir>/<ImageID>     the unzipped parts 0..50, 54 (``layout="nested"``)
    <root>/<ImageID>                a flattened copy (``layout="flat"``)

``Labels`` is a Python list in a cell (``['pleural effusion', 'cardiomegaly']``), parsed with
``ast.literal_eval`` and stripped; presence is positive, absence negative, and rows whose cell is
empty are unlabelled (NaN). The view is ``Projection`` (``AP_horizontal`` = supine AP -> AP,
``L`` -> LATERAL; COSTAL, EXCLUDE keep their codes, UNK -> UNKNOWN). No official split.

Metadata for the confounder scan (docs/methods/confounders.md, "Where it runs"), each where the
file has its column (an older copy without one builds without that manifest column): ``sex`` from
``PatientSex_DICOM`` (M / F; ``O`` and blank are blank), ``age`` = the study's year
(``StudyDate_DICOM``, YYYYMMDD) - ``PatientBirth`` (a year: the true age or one less), and
``manufacturer`` = ``Manufacturer_DICOM`` stripped (catalog 1.1, "PadChest").
"""
from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd

from ..registry import Adapter, register
from .common import (
    ChestDataError,
    assemble,
    birth_year_age,
    finding_sources,
    findings_from_terms,
    first_existing,
    normalise_views,
    read_table,
    sex_of,
    text_of,
)

CSV_STEM = "PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv"
COLUMNS = ["ImageID", "ImageDir", "PatientID", "Projection", "Labels"]
#: the metadata columns read where the file has them
METADATA = ["PatientSex_DICOM", "PatientBirth", "StudyDate_DICOM", "Manufacturer_DICOM"]


def _parse_labels(cell, csv: Path, row: int) -> frozenset | None:
    if not isinstance(cell, str) or cell.strip() in ("", "nan"):
        return None
    try:
        items = ast.literal_eval(cell)
    except (ValueError, SyntaxError):
        raise ChestDataError(f"{csv}: column 'Labels', row {row}: {cell[:40]!r} is not a Python list; "
                             "use the official file unmodified") from None
    return frozenset(t.strip() for t in items if t.strip())


def _layout(root: Path, table: pd.DataFrame, layout: str) -> str:
    if layout not in ("auto", "nested", "flat"):
        raise ChestDataError(f"dataset 'padchest': option 'layout' {layout!r} is not auto, nested or flat")
    if layout != "auto":
        return layout
    if any((root / str(d)).is_dir() for d in table["ImageDir"].unique()):
        return "nested"
    return "flat" if (root / table["ImageID"].iloc[0]).is_file() else "nested"


def build_padchest(root: Path, layout: str = "auto", views: list[str] | None = None) -> pd.DataFrame:
    """PadChest manifest; ``layout`` says whether images sit in their ImageDir folders."""
    csv = first_existing(root, [f"{CSV_STEM}.gz", CSV_STEM], "padchest", f"'{CSV_STEM}'")
    table = read_table(csv, "padchest", COLUMNS,
                       dtype={"ImageID": str, "PatientID": str, "Projection": str, "Labels": str,
                              "PatientSex_DICOM": str, "StudyDate_DICOM": str, "Manufacturer_DICOM": str},
                       usecols=lambda c: str(c).strip() in COLUMNS + METADATA)
    parsed = {c: _parse_labels(c, csv, i) for i, c in table["Labels"].drop_duplicates().items()}
    terms = table["Labels"].map(parsed)
    nested = _layout(root, table, layout) == "nested"
    path = table["ImageDir"].astype(str) + "/" + table["ImageID"] if nested else table["ImageID"]
    base = pd.DataFrame({
        "sample_id": table["ImageID"].str.rsplit(".", n=1).str[0],
        "path": path,
        "patient_id": table["PatientID"],
        "view": normalise_views(table["Projection"]),
        "split": pd.NA,
    })
    if "PatientSex_DICOM" in table.columns:
        base["sex"] = sex_of(table["PatientSex_DICOM"])
    if {"PatientBirth", "StudyDate_DICOM"} <= set(table.columns):
        base["age"] = birth_year_age(table["PatientBirth"], table["StudyDate_DICOM"])
    if "Manufacturer_DICOM" in table.columns:
        base["manufacturer"] = text_of(table["Manufacturer_DICOM"])
    return assemble(base, findings_from_terms(terms, "padchest"), "padchest", views)


register(Adapter(
    name="padchest", build=build_padchest, findings=tuple(finding_sources("padchest")),
    description="PadChest: 160,861 radiographs of 67,625 patients (Alicante, 2009-2017), 174 findings "
                "from Spanish reports (27% by physicians).",
))
