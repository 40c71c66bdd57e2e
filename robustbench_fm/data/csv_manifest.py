"""``dataset=csv``: your own images and a CSV of labels.

``dataset.manifest=<labels.csv> dataset.root=<images folder>`` (root defaults to the CSV's folder).
The CSV has one row per image:

* ``path`` (required): the image file, relative to ``dataset.root``;
* ``sample_id`` (default: ``path``), ``patient_id`` (default: ``sample_id``: every image its own
  bootstrap cluster), ``acq_group`` (default: ``all``: one matched group), and any other canonical
  column (``split``, ``bio_label``, boxes: ``data_manifests/README.md``);
* one column per finding, 1 positive, 0 negative, empty unlabelled. The findings are
  ``dataset.findings=[a,b]``, else every other column whose values are all 0, 1 or empty
  (:func:`finding_columns`).

A CSV without ``path`` or without a column a requested finding names is refused in one line naming
the file, the column and the fix (:func:`build_csv`); the rest of the checks are the manifest
contract's (:func:`.manifest.validate`).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import manifest as mf
from .files import DatasetFileMissing
from .registry import Adapter, register

REQUIRED = ("path",)
DEFAULT_GROUP = "all"


def _read(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, dtype={c: str for c in mf.STRING_COLUMNS})


def _binary(series: pd.Series) -> bool:
    values = pd.to_numeric(series, errors="coerce")
    return bool(values.notna().any()) and not (values.isna() & series.notna()).any() \
        and bool(values.dropna().isin([0.0, 1.0]).all())


def finding_columns(path: str | Path | None) -> list[str]:
    """The CSV's finding columns: every non-canonical column whose values are all 0, 1 or empty
    ([] when ``path`` is unset or not a file: :func:`build_csv` then says what to fix)."""
    if path is None or not Path(str(path)).is_file():
        return []
    table = _read(Path(str(path)))
    canonical = {*mf.STRING_COLUMNS, *mf.BOX_COLUMNS}
    return [str(c) for c in table.columns if c not in canonical and _binary(table[c])]


def _refuse_absolute(csv: Path, root: Path, paths: pd.Series) -> None:
    """An absolute ``path``: one line with its form relative to ``dataset.root`` when it lies
    inside the root, else saying to point the root at a folder holding every image."""
    absolute = paths.astype(str).map(lambda p: Path(p).is_absolute())
    if not absolute.any():
        return
    row = int(absolute.to_numpy().nonzero()[0][0])
    given = Path(str(paths.iloc[row]))
    try:
        relative = given.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        relative = None
    fix = (f"write it relative to dataset.root '{root}': '{relative}'" if relative is not None else
           f"it is outside dataset.root '{root}': set dataset.root to a folder holding every image and write each "
           "path relative to it")
    raise mf.ManifestError(f"{csv}: column 'path', row {row}: '{given}' is an absolute path; {fix}")


def no_findings_reason(path: str | Path) -> str:
    """Why the CSV at ``path`` has no finding column (:func:`finding_columns` found none): its row
    count when it has none, else each other column with the first value that kept it out."""
    table = _read(Path(str(path)))
    if table.empty:
        return f"{path}: the CSV has 0 rows (only its header); add one row per image"
    canonical = {*mf.STRING_COLUMNS, *mf.BOX_COLUMNS}
    reasons = []
    for col in (c for c in table.columns if c not in canonical):
        values = pd.to_numeric(table[col], errors="coerce")
        bad = table[col][(values.isna() & table[col].notna()) | (values.notna() & ~values.isin([0.0, 1.0]))]
        shown = f"value '{bad.iloc[0]}'" if len(bad) else "no value"
        reasons.append(f"column '{col}' was skipped ({shown}; a finding column holds 1, 0 or empty)")
    if not reasons:
        present = ", ".join(c for c in table.columns if c in canonical)
        return f"{path}: no column besides {present}; add one 0/1 column per finding"
    return (f"{path}: no finding column: {'; '.join(reasons[:5])}; recode one as 0/1 (1 positive, 0 negative), "
            "or name the finding columns with dataset.findings=[...]")


def build_csv(root: Path, manifest: str | Path | None = None, finding_columns: list[str] | None = None
              ) -> pd.DataFrame:
    """The canonical manifest of a user's CSV (the module docstring): ``path`` required, the
    other canonical columns defaulted, every requested finding column present and binary."""
    if manifest is None:
        raise DatasetFileMissing("dataset=csv needs dataset.manifest=<labels.csv> (one row per image: path and "
                                 "one 0/1 column per finding)")
    path = Path(str(manifest))
    if not path.is_file():
        raise DatasetFileMissing(f"{path}: file not found; set dataset.manifest=<labels.csv>")
    table = _read(path)
    columns = [str(c) for c in table.columns]
    for col in REQUIRED:
        if col not in columns:
            raise mf.ManifestError(f"{path}: column '{col}' missing; add a '{col}' column with each image's file "
                                   f"relative to dataset.root (columns: {', '.join(columns[:12])})")
    for finding in finding_columns or ():
        if str(finding) not in columns:
            raise mf.ManifestError(f"{path}: column '{finding}' missing for finding '{finding}'; add it (1 positive, "
                                   f"0 negative, empty unlabelled) or set dataset.findings=[...] to columns of the "
                                   f"CSV ({', '.join(c for c in columns if c not in mf.STRING_COLUMNS)[:200]})")
    if table.empty:
        raise mf.ManifestError(f"{path}: the CSV has 0 rows (only its header); add one row per image (path and "
                               "one 0/1 column per finding)")
    _refuse_absolute(path, Path(root), table["path"])
    out = table.copy()
    if "sample_id" not in out.columns:
        out["sample_id"] = out["path"]
    if "patient_id" not in out.columns:
        out["patient_id"] = out["sample_id"]
    if "acq_group" not in out.columns:
        out["acq_group"] = DEFAULT_GROUP
    front = ["sample_id", "path", "patient_id", "acq_group"]
    out = out[front + [c for c in out.columns if c not in front]]
    return mf.validate(out, source=str(path), findings=[str(f) for f in finding_columns or ()])


register(Adapter("csv", build_csv, description="your own images and a CSV of labels (dataset.manifest=<csv> "
                 "dataset.root=<images>)"))
