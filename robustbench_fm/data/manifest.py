"""The canonical manifest: one row per image, tile, slice or slide (docs/architecture.md, "Contracts").

Every dataset adapter returns this table and every stage reads it. Validation fails loudly with
one line naming the source file, the column, the first bad row and what to do about it.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.errors import UserError
from .files import read_csv

#: The 12 harmonised chest findings of CANDOR (candor.md, "Scope"), lower_snake_case.
CHEST_FINDINGS = (
    "pneumothorax", "pneumonia", "consolidation", "edema", "lung_lesion", "pleural_effusion",
    "fracture", "cardiomegaly", "lung_opacity", "enlarged_cardiomediastinum", "atelectasis",
    "pleural_other",
)

#: Canonical string columns; any of them may be absent except ``sample_id``.
STRING_COLUMNS = ("sample_id", "path", "patient_id", "slide_id", "site", "view", "acq_group",
                  "split", "bio_label", "subset")
NON_EMPTY_COLUMNS = ("sample_id", "path", "patient_id", "acq_group")
BOX_COLUMNS = ("box_x0", "box_y0", "box_x1", "box_y1")
#: Columns that locate the image content; the feature cache keys on these alone.
LOCATOR_COLUMNS = ("sample_id", "path")
SPLITS = ("train", "val", "test")
#: where a row came from, for messages only (``"<csv> row <i>"``, set by ``dataset=csv``): the
#: messages about an unreadable image name it rather than the row's position in whatever subset
#: of the manifest is being read (extraction reads only the images no cache holds)
SOURCE_COLUMN = "source_row"


class ManifestError(UserError, ValueError):
    """A manifest violates the canonical schema; the message is one line."""


def _fail(source: str, column: str, row, problem: str, fix: str) -> None:
    where = f"row {row}" if row is not None else "header"
    raise ManifestError(f"{source}: column '{column}', {where}: {problem}; {fix}")


def _first_bad(mask: pd.Series):
    return mask.index[np.flatnonzero(mask.to_numpy())[0]]


def validate(df: pd.DataFrame, source: str = "<manifest>", findings: tuple[str, ...] | list[str] = (),
             required: tuple[str, ...] = ("sample_id",), unique: tuple[str, ...] | None = None,
             labels: tuple[str, ...] | list[str] = ()) -> pd.DataFrame:
    """Check ``df`` against the canonical schema and return it with canonical dtypes.

    ``findings`` names binary finding columns that must hold only 0, 1 or NaN; ``labels`` names
    categorical label columns (CRoMa's ``bio_label``: any strings or codes, NaN unlabelled), which
    must exist and are kept as strings. ``unique`` names
    the column set that identifies a row; by default ``("sample_id", "subset")`` when the
    manifest has a ``subset`` column (paired designs list an image once per subset), else
    ``("sample_id",)``.
    """
    if unique is None:
        unique = ("sample_id", "subset") if isinstance(df, pd.DataFrame) and "subset" in df.columns \
            else ("sample_id",)
    if not isinstance(df, pd.DataFrame):
        raise ManifestError(f"{source}: expected a pandas DataFrame, got {type(df).__name__}; "
                            "pass the manifest table itself")
    for col in required:
        if col not in df.columns:
            _fail(source, col, None, "missing",
                  f"add a '{col}' column (present: {', '.join(map(str, df.columns[:12]))})")
    out = df.reset_index(drop=True).copy()
    for col in STRING_COLUMNS:
        if col not in out.columns:
            continue
        missing = out[col].isna()
        if col in NON_EMPTY_COLUMNS and missing.any():
            _fail(source, col, _first_bad(missing), "empty value", f"fill every '{col}'")
        out[col] = out[col].astype(object).where(missing, out[col].astype(str))
    for col in labels:
        if col not in out.columns:
            _fail(source, col, None, "label column missing",
                  f"add '{col}' (the categorical label of each row) or name another column with stage.findings=[...]")
        if col not in STRING_COLUMNS:
            missing = out[col].isna()
            out[col] = out[col].astype(object).where(missing, out[col].astype(str))
    dup = out.duplicated(list(unique), keep="first")
    if dup.any():
        i = _first_bad(dup)
        key = ", ".join(f"{c}={out.at[i, c]!r}" for c in unique)
        _fail(source, "/".join(unique), i, f"duplicate key ({key})",
              "make each row's key unique (one row per image)")
    if "path" in out.columns:
        paths = out["path"].astype(str)
        absolute = paths.str.startswith(("/", "\\")) | paths.str.match(r"^[A-Za-z]:")
        if absolute.any():
            _fail(source, "path", _first_bad(absolute), f"'{out.at[_first_bad(absolute), 'path']}' is an absolute "
                  "path", "store each path relative to the dataset root (dataset.root), e.g. 'images/a.png' for "
                  "<dataset.root>/images/a.png")
        climbs = paths.str.contains(r"(?:^|[/\\])\.\.(?:[/\\]|$)")
        if climbs.any():
            _fail(source, "path", _first_bad(climbs), f"'{out.at[_first_bad(climbs), 'path']}' climbs out of the "
                  "dataset root with '..'", "store each path relative to the dataset root (dataset.root) and below "
                  "it; point dataset.root at a folder holding every image")
    if "split" in out.columns:
        bad = ~out["split"].isin(SPLITS) & out["split"].notna()
        if bad.any():
            _fail(source, "split", _first_bad(bad), f"unknown split {out.at[_first_bad(bad), 'split']!r}",
                  f"use one of {', '.join(SPLITS)}")
    for col in list(findings) + [c for c in BOX_COLUMNS if c in out.columns]:
        if col not in out.columns:
            _fail(source, col, None, "finding column missing",
                  f"add '{col}' (1 positive, 0 negative, NaN unlabelled) or choose another finding")
        values = pd.to_numeric(out[col], errors="coerce")
        nonnum = values.isna() & out[col].notna()
        if nonnum.any():
            _fail(source, col, _first_bad(nonnum), f"non-numeric value {out.at[_first_bad(nonnum), col]!r}",
                  "use numbers (NaN for unlabelled)")
        out[col] = values.astype(float)
        if col in BOX_COLUMNS:
            bad = (values < 0) | (values > 1)
            fix = "normalise box coordinates to 0-1"
        else:
            bad = values.notna() & ~values.isin([0.0, 1.0])
            fix = "use 1 positive, 0 negative, NaN unlabelled"
        if bad.any():
            _fail(source, col, _first_bad(bad), f"value {float(values[_first_bad(bad)])!r} out of range", fix)
    return out


def content_hash(df: pd.DataFrame, columns: tuple[str, ...] | None = None) -> str:
    """SHA-256 (hex, 16 chars) of the manifest's content in row order.

    With ``columns`` only those (present) columns are hashed; the feature cache hashes
    :data:`LOCATOR_COLUMNS` so that relabelling a dataset does not invalidate its features.
    """
    cols = [c for c in (columns or tuple(df.columns)) if c in df.columns]
    h = hashlib.sha256()
    h.update("\x1f".join(cols).encode())
    for col in cols:
        h.update(b"\x1e")
        h.update("\x1f".join(map(str, df[col].tolist())).encode())
    return h.hexdigest()[:16]


def header(path: str | Path) -> list[str]:
    """The column names of a manifest file (CSV or parquet), without reading its rows."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    return [str(c) for c in read_csv(path, nrows=0).columns]


def read(path: str | Path, findings: tuple[str, ...] | list[str] = (),
         labels: tuple[str, ...] | list[str] = ()) -> pd.DataFrame:
    """Read a manifest from CSV (any encoding :func:`.files.read_csv` reads) or parquet and validate
    it (:func:`validate`: ``findings`` 0/1, ``labels`` categorical), naming ``path`` in every error."""
    path = Path(path)
    if not path.exists():
        raise ManifestError(f"{path}: file not found; pass an existing manifest (CSV or parquet)")
    if path.suffix == ".parquet":
        df = pd.read_parquet(path)
    else:
        df = read_csv(path, dtype={c: str for c in (*STRING_COLUMNS, *labels)})
    return validate(df, source=str(path), findings=findings, labels=labels)
