"""CheXpert (Stanford) on its official layout (catalog 1.1, "CheXpert")::

    <root>/train.csv   Path, Sex, Age, Frontal/Lateral, AP/PA, No Finding, <13 observations>
    <root>/valid.csv   same columns (radiologist consensus, 0/1)
    <root>/train/patient00001/study1/view1_frontal.jpg

``root`` is ``CheXpert-v1.0-small`` or ``CheXpert-v1.0``; ``Path`` starts with that folder name,
which is stripped. Labels are 1.0/0.0/-1.0/blank; ``-1`` follows the ``uncertain`` policy and
``No Finding == 1`` makes the blank findings negative (as in mimic.py). The view is ``LATERAL``
for ``Frontal/Lateral == Lateral``, else the ``AP/PA`` code (17 frontal rows carry LL/RL there
and count as LATERAL, the common synonym table). ``valid.csv`` is read when present.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..manifest import CHEST_FINDINGS
from ..registry import Adapter, register
from .common import (
    ChestDataError,
    assemble,
    check_label_columns,
    demographics,
    finding_sources,
    findings_from_columns,
    first_existing,
    normalise_views,
    read_table,
)

#: ``[CheXpert-v1.0-small/]train/patient00001/study1/view1_frontal.jpg`` -> its parts.
PATH_PATTERN = r"(?P<path>(?:train|valid|test)/(?P<patient>patient\d+)/(?P<study>study\d+)/(?P<image>[^/]+?)\.\w+)$"
COLUMNS = ["Path", "Frontal/Lateral", "AP/PA", "No Finding"]


def _rows(csv: Path, split: str, uncertain: str) -> pd.DataFrame:
    table = read_table(csv, "chexpert", COLUMNS, dtype={"Path": str, "AP/PA": str, "Frontal/Lateral": str})
    check_label_columns(table, csv, "chexpert")
    parts = table["Path"].str.extract(PATH_PATTERN)
    if parts.isna().any(axis=None):
        bad = table.loc[parts.isna().any(axis=1), "Path"].iloc[0]
        raise ChestDataError(f"{csv}: column 'Path' value {bad!r} is not <split>/patientN/studyN/viewN.jpg; "
                             "use the official file unmodified")
    lateral = table["Frontal/Lateral"].str.strip().str.lower() == "lateral"
    findings = findings_from_columns(table, "chexpert", uncertain, no_finding="No Finding")
    base = pd.DataFrame({
        "sample_id": parts["patient"] + "_" + parts["study"] + "_" + parts["image"],
        "path": parts["path"],
        "patient_id": parts["patient"],
        "view": normalise_views(table["AP/PA"].where(~lateral, "LATERAL")),
        "split": split,
        **demographics(table, "Sex", "Age"),
    })
    return pd.concat([base, findings], axis=1)


def build_chexpert(root: Path, uncertain: str = "nan", views: list[str] | None = None) -> pd.DataFrame:
    """CheXpert manifest from train.csv (+ valid.csv when present)."""
    parts = [_rows(first_existing(root, ["train.csv"], "chexpert", "'train.csv'"), "train", uncertain)]
    if (root / "valid.csv").is_file():
        parts.append(_rows(root / "valid.csv", "val", uncertain))
    table = pd.concat(parts, ignore_index=True)
    return assemble(table.drop(columns=list(CHEST_FINDINGS)), table[list(CHEST_FINDINGS)], "chexpert", views)


register(Adapter(
    name="chexpert", build=build_chexpert, findings=tuple(finding_sources("chexpert")),
    description="CheXpert: 224,316 chest radiographs of 65,240 patients (Stanford) with CheXpert-labeler labels.",
))
