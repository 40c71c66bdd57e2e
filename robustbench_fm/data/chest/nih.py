"""NIH ChestX-ray14 on its NIH Box layout (catalog 1.1, "NIH ChestX-ray14")::

    <root>/Data_Entry_2017_v2020.csv   Image Index, Finding Labels, Follow-up #, Patient ID, Patient Age,
                                       Patient Gender, View Position, OriginalImage[Width, Height], ...
    <root>/images/00000001_000.png     (images_001..012.tar.gz unpacked; the Kaggle mirror's
                                        images_001/images/ folders are found too)
    <root>/train_val_list.txt, test_list.txt   the official patient-disjoint split (optional)

The header's bracketed names hold commas (``OriginalImage[Width,Height]``) and so name 2 columns
each; columns are read by name, never by position. ``Finding Labels`` is ``|``-separated; an
absent label is negative (``No Finding`` = all negative). Used only for CANDOR's Figure 1.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..registry import Adapter, register
from .common import (
    assemble,
    demographics,
    finding_sources,
    findings_from_terms,
    first_existing,
    normalise_views,
    read_table,
)


def _image_dirs(root: Path, names: pd.Series) -> pd.Series:
    """Folder (relative to root) of each image: images/ or the Kaggle images_NNN/images/."""
    kaggle = sorted(root.glob("images_*/images"))
    if (root / "images").is_dir() or not kaggle:
        return pd.Series("images", index=names.index)
    where = {p.name: d.relative_to(root).as_posix() for d in kaggle for p in d.iterdir()}
    return names.map(where).fillna("images")


def _split(root: Path, names: pd.Series) -> pd.Series:
    split = pd.Series(pd.NA, index=names.index, dtype=object)
    for file, value in (("train_val_list.txt", "train"), ("test_list.txt", "test")):
        if (root / file).is_file():
            listed = set((root / file).read_text().split())
            split[names.isin(listed)] = value
    return split


def build_nih_cxr14(root: Path, views: list[str] | None = None) -> pd.DataFrame:
    """NIH ChestX-ray14 manifest from Data_Entry_2017(_v2020).csv."""
    csv = first_existing(root, ["Data_Entry_2017_v2020.csv", "Data_Entry_2017_v2020.csv.gz", "Data_Entry_2017.csv"],
                    "nih_cxr14", "'Data_Entry_2017_v2020.csv'")
    table = read_table(csv, "nih_cxr14", ["Image Index", "Finding Labels", "Patient ID", "View Position"],
                       dtype={"Image Index": str, "Finding Labels": str})
    terms = table["Finding Labels"].map(lambda s: frozenset(t.strip() for t in str(s).split("|")))
    names = table["Image Index"].str.strip()
    base = pd.DataFrame({
        "sample_id": names.str.rsplit(".", n=1).str[0],
        "path": _image_dirs(root, names) + "/" + names,
        "patient_id": table["Patient ID"].astype(str),
        "view": normalise_views(table["View Position"]),
        "split": _split(root, names),
        **demographics(table, "Patient Gender", "Patient Age"),
    })
    return assemble(base, findings_from_terms(terms, "nih_cxr14"), "nih_cxr14", views)


register(Adapter(
    name="nih_cxr14", build=build_nih_cxr14, findings=tuple(finding_sources("nih_cxr14")),
    description="NIH ChestX-ray14: 112,120 frontal radiographs of 30,805 patients, 14 text-mined labels "
                "(CANDOR uses it only for Figure 1).",
))
