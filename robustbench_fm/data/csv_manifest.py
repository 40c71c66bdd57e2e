"""``dataset=csv``: your own images and a CSV of labels.

``dataset.manifest=<labels.csv> dataset.root=<images folder>`` (root defaults to the CSV's folder).
The CSV (any common encoding: :func:`.files.read_csv`) has one row per image:

* ``path`` (required): the image file, relative to ``dataset.root``;
* ``sample_id`` (default: ``path``), ``patient_id`` (default: ``sample_id``: every image its own
  bootstrap cluster), ``acq_group`` (default: ``all``: one matched group), and any other canonical
  column (``split``, ``bio_label``, boxes: ``data_manifests/README.md``);
* one column per finding, 1 positive, 0 negative, empty unlabelled, and ``-1`` uncertain as in
  CheXpert's labels (Irvin et al. 2019: 1 positive, 0 negative, -1 uncertain, blank not mentioned).
  The findings are ``dataset.findings=[a,b]``, else every other column whose values are all 1, 0,
  -1 or empty, except a demographic column (:data:`DEMOGRAPHIC_COLUMNS`: ``sex``, ``male`` ...,
  which are 0/1 too but describe the patient; name one in ``dataset.findings`` to score it):
  :func:`classify_columns`. Every run logs one line naming the findings taken and each other
  column skipped, with why (:func:`findings_line`).

``-1`` follows ``dataset.uncertain`` (:data:`UNCERTAIN_POLICIES`; the CheXpert paper's U-Zeros,
U-Ones and U-Ignore): ``zero`` negative, ``one`` positive, ``drop`` unlabelled (the row is left out
of that finding). There is no default: a finding holding ``-1`` without it is refused in one line
naming the column and the key (``zero`` is also what a +1/-1 coding of positive/negative needs).
A blank (CheXpert: "not mentioned") follows ``dataset.blank`` (:data:`BLANK_POLICIES`):
``unlabelled`` (default: no evidence either way; the row is left out of that finding, as blanks
always were here and as torchxrayvision reads CheXpert) or ``negative`` (the reading of CheXpert's
own training code, which counts an unmentioned finding as absent).

A CSV without ``path`` or without a column a requested finding names is refused in one line naming
the file, the column and the fix (with a hint when the file is ``;``- or tab-separated, or a path is
written with ``\\``); so is a path that is, or lies under, a symbolic link pointing out of
``dataset.root`` (:func:`refuse_links_out`: the docs promise that manifest paths cannot leave the
root). The rest of the checks are the manifest contract's (:func:`.manifest.validate`). Each row
keeps where it came from in :data:`~.manifest.SOURCE_COLUMN` (``"<csv> row <i>"``, rows counted
from 0 after the header), which the messages about an unreadable image name.
"""
from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

from . import manifest as mf
from .files import DatasetFileMissing, read_csv
from .images import locator_file
from .registry import Adapter, register

log = logging.getLogger("robustbench_fm.data")

REQUIRED = ("path",)
DEFAULT_GROUP = "all"
#: the value CheXpert's labeler writes for an uncertain finding
UNCERTAIN = -1.0
#: ``dataset.uncertain``: what ``-1`` becomes (module docstring; CheXpert's U-Zeros, U-Ones, U-Ignore)
UNCERTAIN_POLICIES = {"zero": 0.0, "one": 1.0, "drop": math.nan}
#: ``dataset.blank``: what an empty finding cell becomes (module docstring)
BLANK_POLICIES = {"unlabelled": math.nan, "negative": 0.0}
DEFAULT_BLANK = "unlabelled"
#: column names (lower case, ``-``/space as ``_``) auto-detection does not take as findings
DEMOGRAPHIC_COLUMNS = frozenset({"sex", "gender", "male", "female", "is_male", "is_female", "sex_male",
                                 "sex_female", "gender_male", "gender_female"})
#: how many skipped columns the findings line names before "and N more"
_SHOWN = 8


def _read(path: Path) -> pd.DataFrame:
    try:
        return read_csv(path, dtype={c: str for c in mf.STRING_COLUMNS})
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:  # a file pandas cannot split into columns
        raise mf.ManifestError(f"{path}: not a readable CSV ({' '.join(str(exc).split())}); save it as a "
                               "comma-separated file with a header line") from None


def _label_values(series: pd.Series) -> bool:
    """Whether a column holds only 1, 0, -1 or empty, and at least one of them."""
    values = pd.to_numeric(series, errors="coerce")
    return bool(values.notna().any()) and not (values.isna() & series.notna()).any() \
        and bool(values.dropna().isin([0.0, 1.0, UNCERTAIN]).all())


def _skip_reason(series: pd.Series) -> str:
    """Why a column that is not a finding was skipped: the first value that kept it out."""
    values = pd.to_numeric(series, errors="coerce")
    bad = series[(values.isna() & series.notna()) | (values.notna() & ~values.isin([0.0, 1.0, UNCERTAIN]))]
    return f"value '{bad.iloc[0]}'" if len(bad) else "no value"


def _demographic(name: str) -> bool:
    return str(name).strip().lower().replace("-", "_").replace(" ", "_") in DEMOGRAPHIC_COLUMNS


def classify_columns(table: pd.DataFrame) -> tuple[list[str], dict[str, str]]:
    """(the finding columns auto-detection takes, {each other non-canonical column: why it was
    skipped}) of a CSV's ``table`` (module docstring)."""
    canonical = {*mf.STRING_COLUMNS, *mf.BOX_COLUMNS, mf.SOURCE_COLUMN}
    taken, skipped = [], {}
    for col in (str(c) for c in table.columns if c not in canonical):
        if not _label_values(table[col]):
            skipped[col] = _skip_reason(table[col])
        elif _demographic(col):
            skipped[col] = "a demographic column; name it in dataset.findings to score it"
        else:
            taken.append(col)
    return taken, skipped


def finding_columns(path: str | Path | None) -> list[str]:
    """The CSV's finding columns (:func:`classify_columns`; [] when ``path`` is unset, not a file
    or not a readable CSV: :func:`build_csv` then says what to fix). Never raises (the config's
    ``${csv_findings:...}`` resolver calls it)."""
    if path is None or not Path(str(path)).is_file():
        return []
    try:
        return classify_columns(_read(Path(str(path))))[0]
    except mf.ManifestError:  # build_csv says it in one line
        return []


def separator_hint(table: pd.DataFrame) -> str:
    """``"; ..."`` saying the CSV is separated by ``;`` or a tab when its one column's header holds
    one (pandas then reads each line as a single field), else ``""``."""
    if len(table.columns) != 1:
        return ""
    head = str(table.columns[0])
    for sep, name in ((";", "';'"), ("\t", "tabs")):
        if sep in head:
            return (f"; the file seems to be separated by {name}, not commas (its one column is '{head[:60]}'): "
                    "save it as comma-separated CSV")
    return ""


def findings_line(path, taken: list[str], skipped: dict[str, str], auto: bool, uncertain: str | None,
                  blank: str, n_uncertain: dict[str, int]) -> str:
    """The line every run logs: the findings taken (how) and the columns skipped (why)."""
    how = "auto-detected: columns of 1, 0, -1 or empty" if auto else "dataset.findings"
    shown = [f"'{c}' ({why})" for c, why in list(skipped.items())[:_SHOWN]]
    if len(skipped) > _SHOWN:
        shown.append(f"and {len(skipped) - _SHOWN} more")
    uncertain_part = "" if not n_uncertain else (
        "; -1 (uncertain) " + ", ".join(f"{n} in '{c}'" for c, n in n_uncertain.items())
        + f" read as dataset.uncertain={uncertain}")
    return (f"{path}: findings {', '.join(repr(c) for c in taken) or 'none'} ({how}); skipped: "
            f"{', '.join(shown) or 'none'}{uncertain_part}; blank = {blank} (dataset.blank)")


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
    if hint := separator_hint(table):  # the real cause: one column holding every field
        return f"{path}: no finding column{hint}"
    if table.empty:
        return f"{path}: the CSV has 0 rows (only its header); add one row per image"
    canonical = {*mf.STRING_COLUMNS, *mf.BOX_COLUMNS}
    _, skipped = classify_columns(table)
    reasons = [f"column '{col}' was skipped ({why}; a finding column holds 1, 0 or empty)" if why.startswith(
        ("value", "no value")) else f"column '{col}' was skipped ({why})" for col, why in skipped.items()]
    if not reasons:
        present = ", ".join(c for c in table.columns if c in canonical)
        return f"{path}: no column besides {present}; add one 0/1 column per finding"
    return (f"{path}: no finding column: {'; '.join(reasons[:5])}; recode one as 0/1 (1 positive, 0 negative), "
            "or name the finding columns with dataset.findings=[...]")


def _policy(value, policies: dict, key: str, default: str | None = None) -> str | None:
    if value is None:
        return default
    if str(value) not in policies:
        raise mf.ManifestError(f"{key}={value!r}: use one of {', '.join(policies)} (docs/datasets.md, 'Your own "
                               "CSV')")
    return str(value)


def recode_findings(table: pd.DataFrame, findings: list[str], source, uncertain: str | None,
                    blank: str = DEFAULT_BLANK) -> tuple[pd.DataFrame, dict[str, int]]:
    """``table`` with each finding column's ``-1`` read by ``uncertain`` and its blanks by
    ``blank`` (module docstring), and {finding: number of -1 read}; a finding holding -1 without
    ``uncertain`` is refused in one line naming the column and ``dataset.uncertain``. A column
    holding other values is left to :func:`.manifest.validate` to refuse."""
    out, counts = table.copy(), {}
    for col in findings:
        if not _label_values(out[col]) and out[col].notna().any():
            continue  # 2, 'yes': validate names the value
        values = pd.to_numeric(out[col], errors="coerce")
        minus = values == UNCERTAIN
        if minus.any():
            if uncertain is None:
                row, n = int(np.flatnonzero(minus.to_numpy())[0]), int(minus.sum())
                raise mf.ManifestError(
                    f"{source}: column '{col}' holds -1 (uncertain, as in CheXpert's labels) in {n} "
                    f"row{'s' if n > 1 else ''}, first row {row}; set dataset.uncertain=zero (read as negative; "
                    "also what a +1/-1 coding needs), one (positive) or drop (unlabelled), or leave the column out "
                    "with dataset.findings=[...]")
            counts[col] = int(minus.sum())
            values = values.mask(minus, UNCERTAIN_POLICIES[uncertain])
        out[col] = values.mask(out[col].isna(), BLANK_POLICIES[blank])
    return out, counts


def _refuse_backslashes(csv: Path, root: Path, paths: pd.Series) -> None:
    """A path written with ``\\`` (Windows) that is no file while its ``/`` form is: one line."""
    for row, given in enumerate(paths.astype(str)):
        fixed = given.replace("\\", "/")
        if fixed != given and not (root / given).exists() and (root / fixed).exists():
            raise mf.ManifestError(f"{csv}: column 'path', row {row}: '{given}' is written with '\\' (Windows); "
                                   f"write the paths with '/': '{fixed}'")


def refuse_links_out(csv, root: Path, paths: pd.Series) -> None:
    """Every ``path`` whose file, or a folder above it, is a symbolic link that resolves outside
    ``root`` is refused in one line naming the CSV row, the path and where it points (the docs'
    promise that manifest paths cannot leave the root; a link within the root is fine). One
    ``lstat`` per distinct file and folder (a ``realpath`` only for a link); a missing file is
    left to the image check. For validated paths (relative, no ``..``)."""
    shown, root = root, os.path.normpath(os.fspath(root))
    real_root = os.path.realpath(root)
    inside = real_root.rstrip(os.sep) + os.sep
    real = {root: real_root}

    def resolved(p: str) -> str:
        got = real.get(p)
        if got is None:
            parent = os.path.dirname(p)
            got = real[p] = os.path.realpath(p) if os.path.islink(p) or parent == p else \
                os.path.join(resolved(parent), os.path.basename(p))
        return got

    for row, given in enumerate(paths.astype(str)):
        target = resolved(os.path.normpath(os.path.join(root, locator_file(given))))
        if target != real_root and not target.startswith(inside):
            raise mf.ManifestError(f"{csv}: column 'path', row {row}: '{given}' is a symbolic link (or lies under "
                                   f"one) pointing to '{target}', outside dataset.root '{shown}'; copy the file into "
                                   "dataset.root, or set dataset.root to a folder that holds it")


def build_csv(root: Path, manifest: str | Path | None = None, finding_columns: list[str] | None = None,
              uncertain: str | None = None, blank: str | None = DEFAULT_BLANK) -> pd.DataFrame:
    """The canonical manifest of a user's CSV (the module docstring): ``path`` required, the
    other canonical columns defaulted, every requested finding column present and binary once
    ``-1`` is read by ``uncertain`` and blanks by ``blank``; logs the line of :func:`findings_line`."""
    if manifest is None:
        raise DatasetFileMissing("dataset=csv needs dataset.manifest=<labels.csv> (one row per image: path and "
                                 "one 0/1 column per finding)")
    path = Path(str(manifest))
    if not path.is_file():
        raise DatasetFileMissing(f"{path}: file not found; set dataset.manifest=<labels.csv>")
    uncertain = _policy(uncertain, UNCERTAIN_POLICIES, "dataset.uncertain")
    blank = _policy(blank, BLANK_POLICIES, "dataset.blank", DEFAULT_BLANK)
    table = _read(path)
    columns = [str(c) for c in table.columns]
    for col in REQUIRED:
        if col not in columns:
            raise mf.ManifestError(f"{path}: column '{col}' missing; add a '{col}' column with each image's file "
                                   f"relative to dataset.root (columns: {', '.join(columns[:12])})"
                                   f"{separator_hint(table)}")
    for finding in finding_columns or ():
        if str(finding) not in columns:
            raise mf.ManifestError(f"{path}: column '{finding}' missing for finding '{finding}'; add it (1 positive, "
                                   f"0 negative, empty unlabelled) or set dataset.findings=[...] to columns of the "
                                   f"CSV ({', '.join(c for c in columns if c not in mf.STRING_COLUMNS)[:200]})")
    if table.empty:
        raise mf.ManifestError(f"{path}: the CSV has 0 rows (only its header); add one row per image (path and "
                               "one 0/1 column per finding)")
    _refuse_absolute(path, Path(root), table["path"])
    _refuse_backslashes(path, Path(root), table["path"])
    findings = [str(f) for f in finding_columns or ()]
    auto, skipped = classify_columns(table)
    if findings != auto:  # named by dataset.findings
        skipped = {c: "not in dataset.findings" for c in columns
                   if c not in findings and c not in {*mf.STRING_COLUMNS, *mf.BOX_COLUMNS, mf.SOURCE_COLUMN}}
    out, n_uncertain = recode_findings(table, findings, path, uncertain, blank)
    log.info(findings_line(path, findings, skipped, findings == auto, uncertain, blank, n_uncertain))
    if "sample_id" not in out.columns:
        out["sample_id"] = out["path"]
    if "patient_id" not in out.columns:
        out["patient_id"] = out["sample_id"]
    if "acq_group" not in out.columns:
        out["acq_group"] = DEFAULT_GROUP
    if mf.SOURCE_COLUMN not in out.columns:
        out[mf.SOURCE_COLUMN] = [f"{path} row {i}" for i in range(len(out))]
    front = ["sample_id", "path", "patient_id", "acq_group"]
    out = out[front + [c for c in out.columns if c not in front]]
    out = mf.validate(out, source=str(path), findings=findings)
    refuse_links_out(path, Path(root), out["path"])
    return out


register(Adapter("csv", build_csv, description="your own images and a CSV of labels (dataset.manifest=<csv> "
                 "dataset.root=<images>)"))
