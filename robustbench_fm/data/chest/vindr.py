"""VinDr-CXR and VinDr-PCXR (PhysioNet, DICOM) (catalog 1.1, "VinDr-CXR", "VinDr-PCXR").

PhysioNet layout (VinDr-PCXR's folder names follow VinDr-CXR's; they are looked up in
``annotations/`` and in ``root`` itself)::

    <root>/annotations/image_labels_{train,test}.csv   image_id, rad_id (train: 3 readers per image), 0/1 columns
    <root>/annotations/annotations_{train,test}.csv    image_id, rad_id, class_name, x_min, y_min, x_max, y_max
    <root>/{train,test}/<image_id>.dicom

VinDr-CXR also reads the Kaggle competition layout (``train.csv`` = boxes with class_name per
reader, ``train/<image_id>.dicom``; 14 local classes, so pneumonia, edema and fracture are NaN).
The readers of an image are combined by ``readers="any"`` (positive if one reader marks it, as
torchxrayvision does) or ``"majority"`` (more than half). No patient id is released: one image
is one patient. All films are PA. Boxes of ``box_finding`` (pixels) are merged into their enclosing
box over readers and normalised by the DICOM ``Rows``/``Columns``; NaN when the DICOM is absent.

Metadata for the confounder scan (docs/methods/confounders.md, "Where it runs") from the DICOM
headers of the files present (one pass over the headers, no pixel data; blank for a file that is
absent or lacks the tag): ``sex`` (``PatientSex`` M / F; ``O`` and blank are blank), ``age``
(``PatientAge``, DICOM AS ``058Y`` / ``006M`` / ``010W`` / ``003D`` in years; a zero age such as
``000Y`` is blank in VinDr-CXR, whose patients are adults, and kept in VinDr-PCXR, whose newborns can
be 0 days old) and ``manufacturer`` (``Manufacturer`` stripped).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..registry import Adapter, register
from .common import (
    ChestDataError,
    assemble,
    box_sources,
    check_label_columns,
    dicom_age,
    dicom_headers,
    enclosing_boxes,
    finding_sources,
    findings_from_columns,
    read_table,
    sex_of,
    text_of,
)

READER_COLUMNS = ("rad_id", "rad_ID", "Rad_ID")
BOX_COLUMNS_PX = ["image_id", "class_name", "x_min", "y_min", "x_max", "y_max"]
#: the header tags read from every DICOM present (image size for the boxes, metadata)
HEADER_TAGS = ["Rows", "Columns", "PatientSex", "PatientAge", "Manufacturer"]


def _combine(votes: pd.DataFrame, readers: str) -> pd.DataFrame:
    """Per image: ``any`` = max over its readers' 0/1 votes, ``majority`` = mean > 1/2."""
    grouped = votes.groupby("image_id", sort=False)
    if readers == "any":
        return grouped.max()
    if readers == "majority":
        return (grouped.mean() > 0.5).astype(float).where(grouped.count() > 0)
    raise ChestDataError(f"option 'readers': {readers!r} is not any or majority; set dataset.options.readers")


def _label_file(root: Path, name: str) -> Path | None:
    for folder in ("annotations", "."):
        if (root / folder / name).is_file():
            return root / folder / name
    return None


def _physionet_split(root: Path, dataset: str, split: str, readers: str) -> pd.DataFrame | None:
    """Per-image 0/1 source columns of one split from image_labels_<split>.csv (None if absent)."""
    path = _label_file(root, f"image_labels_{split}.csv")
    if path is None:
        return None
    table = read_table(path, dataset, ["image_id"], dtype={"image_id": str})
    check_label_columns(table, path, dataset)
    reader = next((c for c in READER_COLUMNS if c in table.columns), None)
    votes = table.drop(columns=[reader] if reader else [])
    votes = votes.set_index("image_id").apply(pd.to_numeric, errors="coerce").reset_index()
    out = _combine(votes, readers).reset_index()
    out.insert(1, "split", split)
    return out


def _kaggle(root: Path, readers: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-image source columns from the Kaggle train.csv (one row per reader x box)."""
    raw = read_table(root / "train.csv", "vindr_cxr", [*BOX_COLUMNS_PX, "rad_id"], dtype={"image_id": str})
    votes = pd.crosstab([raw["image_id"], raw["rad_id"]], raw["class_name"].str.strip()).clip(upper=1)
    labels = _combine(votes.reset_index().drop(columns="rad_id"), readers).reset_index()
    labels.insert(1, "split", "train")
    return labels, raw


def _boxes(dataset: str, ann: pd.DataFrame, base: pd.DataFrame, findings: pd.DataFrame,
           finding: str, head: pd.DataFrame) -> pd.DataFrame:
    """Enclosing box of ``finding`` per positive image, normalised by its DICOM Rows/Columns (``head``)."""
    names = {s.lower() for s in box_sources(dataset, finding)}
    boxed = ann[ann["class_name"].str.strip().str.lower().isin(names)].dropna(subset=BOX_COLUMNS_PX[2:])
    positives = base.loc[(findings[finding] == 1).to_numpy(), ["sample_id", "path"]]
    boxed = boxed[boxed["image_id"].isin(positives["sample_id"])]
    size = head.reindex(boxed["image_id"])
    return enclosing_boxes(pd.DataFrame({
        "sample_id": boxed["image_id"].to_numpy(),
        "x0": boxed["x_min"].to_numpy(), "y0": boxed["y_min"].to_numpy(),
        "x1": boxed["x_max"].to_numpy(), "y1": boxed["y_max"].to_numpy(),
        "width": pd.to_numeric(size["Columns"], errors="coerce").to_numpy(),
        "height": pd.to_numeric(size["Rows"], errors="coerce").to_numpy()}))


def _build(root: Path, dataset: str, readers: str, box_finding: str | None, extension: str,
           views: list[str] | None) -> pd.DataFrame:
    parts = [p for s in ("train", "test") if (p := _physionet_split(root, dataset, s, readers)) is not None]
    if parts:
        labels = pd.concat(parts, ignore_index=True)
        ann = pd.concat([read_table(p, dataset, BOX_COLUMNS_PX, dtype={"image_id": str})
                         for s in ("train", "test") if (p := _label_file(root, f"annotations_{s}.csv"))]
                        or [pd.DataFrame(columns=BOX_COLUMNS_PX)], ignore_index=True)
        findings = findings_from_columns(labels, dataset)
    elif dataset == "vindr_cxr" and (root / "train.csv").is_file():
        labels, ann = _kaggle(root, readers)
        findings = findings_from_columns(labels, dataset)  # classes absent from the file stay NaN
    else:
        raise ChestDataError(f"dataset '{dataset}': no annotations/image_labels_train.csv (PhysioNet) "
                             f"{'or train.csv (Kaggle) ' if dataset == 'vindr_cxr' else ''}under '{root}'; "
                             "point dataset.root at the folder of the official download")
    if labels["image_id"].duplicated().any():
        raise ChestDataError(f"dataset '{dataset}': image "
                             f"{labels['image_id'][labels['image_id'].duplicated()].iloc[0]} "
                             "is in both the train and test label files; use the official files")
    base = pd.DataFrame({
        "sample_id": labels["image_id"],
        "path": labels["split"] + "/" + labels["image_id"] + extension,
        "patient_id": labels["image_id"],
        "view": "PA",
        "split": labels["split"],
    })
    head = dicom_headers({i: root / path for i, path in zip(base["sample_id"], base["path"])}, HEADER_TAGS)
    meta = head.reindex(base["sample_id"])
    base["sex"] = sex_of(meta["PatientSex"]).to_numpy()
    base["age"] = dicom_age(meta["PatientAge"], zero_is_blank=dataset == "vindr_cxr").to_numpy()
    base["manufacturer"] = text_of(meta["Manufacturer"]).to_numpy()
    boxes = None if box_finding is None else _boxes(dataset, ann, base, findings, box_finding, head)
    return assemble(base, findings, dataset, views, boxes)


def build_vindr_cxr(root: Path, readers: str = "any", box_finding: str | None = "pneumothorax",
                    views: list[str] | None = None) -> pd.DataFrame:
    """VinDr-CXR manifest (PhysioNet 28 labels, or the Kaggle 14 classes)."""
    return _build(root, "vindr_cxr", readers, box_finding, ".dicom", views)


def build_vindr_pcxr(root: Path, readers: str = "any", extension: str = ".dicom",
                     views: list[str] | None = None) -> pd.DataFrame:
    """VinDr-PCXR manifest from its image-level diagnosis labels (no boxes mapped)."""
    return _build(root, "vindr_pcxr", readers, None, extension, views)


register(Adapter(
    name="vindr_cxr", build=build_vindr_cxr, findings=tuple(finding_sources("vindr_cxr")),
    description="VinDr-CXR: 18,000 PA radiographs (DICOM) from 2 Hanoi hospitals, 28 labels per reader, boxes.",
))
register(Adapter(
    name="vindr_pcxr", build=build_vindr_pcxr, findings=tuple(finding_sources("vindr_pcxr")),
    description="VinDr-PCXR (PediCXR): 9,125 paediatric PA radiographs (DICOM) with 15 diagnoses.",
))
