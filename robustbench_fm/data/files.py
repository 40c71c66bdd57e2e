"""Reading a dataset's label files with one-line errors that name the file, the field and the fix."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..errors import UserError


class DatasetError(UserError, ValueError):
    """A dataset's label or metadata files (or an adapter option) are wrong; one line."""


class DatasetFileMissing(DatasetError, FileNotFoundError):
    """A file the dataset's official layout holds is not there."""


def require(path: Path, dataset: str, fix: str) -> Path:
    """``path`` if it exists, else FileNotFoundError naming the dataset, the file and ``fix``."""
    if not path.exists():
        raise DatasetFileMissing(f"dataset '{dataset}': '{path}' not found; {fix}")
    return path


def first_existing(root: Path, candidates, dataset: str, what: str) -> Path:
    """The first of ``root / c`` that exists (distributions unpack under slightly different names)."""
    for rel in candidates:
        if (root / rel).exists():
            return root / rel
    raise DatasetFileMissing(f"dataset '{dataset}': no {what} under '{root}' (looked for "
                            f"{', '.join(candidates)}); set dataset.root to the folder holding it")


def read_table(path: Path, dataset: str, columns, **read_csv) -> pd.DataFrame:
    """A CSV with stripped column names, every column of ``columns`` present, empty columns dropped.

    ``read_csv`` goes to :func:`pandas.read_csv`.
    """
    require(path, dataset, "set dataset.root to the folder of the official download")
    table = pd.read_csv(path, **read_csv)
    table.columns = [str(c).strip() for c in table.columns]
    table = table.loc[:, ~(table.columns.str.startswith("Unnamed:") & table.isna().all().to_numpy())]
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise DatasetError(f"dataset '{dataset}': {path}: column '{missing[0]}' missing (columns: "
                         f"{', '.join(table.columns[:12])}); use the official, unmodified file")
    return table
