"""Shared pieces of the chest X-ray adapters: the harmonised finding map, views, label policies.

The 12 harmonised findings are CANDOR's (candor.md, "Experiments": "Their labels are mapped to
a common set of 12 findings"); the source label -> finding table is ``../chest_findings.csv``,
one row per (dataset, source label, finding) with the reason for every decision (catalog 1.1.1).
The matched group of a chest radiograph is one site and one view (candor.md, "Notation"), so
``acq_group = f"{site}_{view}"`` with the views normalised to ``PA``, ``AP`` and ``LATERAL``.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

# One error family and one set of file helpers for every adapter (data/files.py).
from ..files import DatasetError as ChestDataError
from ..files import LabelGap, first_existing, read_table, report_label_gap  # noqa: F401  (used by the chest modules)
from ..manifest import BOX_COLUMNS, CHEST_FINDINGS

FINDINGS_FILE = Path(__file__).resolve().parent.parent / "chest_findings.csv"
UNCERTAIN_POLICIES = {"nan": np.nan, "positive": 1.0, "negative": 0.0}

#: Raw view codes of the chest datasets -> canonical view (catalog 1.1: frontal = AP/PA,
#: lateral = LATERAL/LL; PadChest's supine ``AP_horizontal`` is an AP film, its ``L`` a lateral).
VIEW_SYNONYMS = {
    "PA": "PA", "POSTEROANTERIOR": "PA",
    "AP": "AP", "ANTEROPOSTERIOR": "AP", "AP_HORIZONTAL": "AP",
    "LATERAL": "LATERAL", "LL": "LATERAL", "RL": "LATERAL", "L": "LATERAL",
    "UNK": "UNKNOWN", "": "UNKNOWN",
}


@lru_cache(maxsize=None)
def finding_sources(dataset: str) -> dict[str, tuple[str, ...]]:
    """Harmonised finding -> the dataset's source labels mapped to it (chest_findings.csv)."""
    table = pd.read_csv(FINDINGS_FILE, dtype=str, keep_default_na=False)
    unknown = sorted(set(table["finding"]) - set(CHEST_FINDINGS))
    if unknown:
        raise ChestDataError(f"{FINDINGS_FILE}: column 'finding' has {unknown}, not one of the 12 "
                             "harmonised findings; fix the mapping file")
    rows = table[table["dataset"] == dataset]
    return {f: tuple(rows.loc[rows["finding"] == f, "source_label"]) for f in CHEST_FINDINGS
            if (rows["finding"] == f).any()}


def check_label_columns(table: pd.DataFrame, path: Path | str, dataset: str) -> None:
    """Report (:func:`..files.report_label_gap`) the source columns of ``dataset``'s findings that
    label file ``path`` (read into ``table``) lacks: those findings would get no labels, or fewer,
    from it. For the files that carry one 1/0/-1/blank column per source label."""
    sources = finding_sources(dataset)
    missing = {f: [c for c in cols if c not in table.columns] for f, cols in sources.items()}
    missing = {f: cols for f, cols in missing.items() if cols}
    if missing:
        report_label_gap(LabelGap(
            dataset=dataset, path=str(path), columns=tuple(dict.fromkeys(c for cols in missing.values() for c in cols)),
            findings=tuple(missing), empty=tuple(f for f, cols in missing.items() if len(cols) == len(sources[f]))))


def box_sources(dataset: str, finding: str) -> tuple[str, ...]:
    """The source labels whose boxes give ``finding`` its box (option ``box_finding``)."""
    sources = finding_sources(dataset)
    if finding not in sources:
        raise ChestDataError(f"dataset '{dataset}': option 'box_finding' {finding!r} is not mapped in this "
                             f"dataset; use one of {', '.join(sources)}")
    return sources[finding]


def uncertain_value(uncertain: str) -> float:
    """The value a CheXpert-labeler ``-1.0`` (uncertain) becomes: NaN, 1 or 0."""
    if uncertain not in UNCERTAIN_POLICIES:
        raise ChestDataError(f"option 'uncertain': {uncertain!r} is not one of "
                             f"{', '.join(UNCERTAIN_POLICIES)}; set dataset.options.uncertain")
    return UNCERTAIN_POLICIES[uncertain]


def normalise_views(raw: pd.Series) -> pd.Series:
    """Canonical view per row: PA, AP, LATERAL, UNKNOWN (blank), else the raw code upper-cased."""
    text = _text(raw).str.upper().str.replace(r"\s+", "_", regex=True)
    return text.map(VIEW_SYNONYMS).fillna(text)


#: a release's sex codes -> the manifest's ``sex`` (anything else, e.g. CheXpert's ``Unknown``, is blank)
SEX_CODES = {"m": "male", "male": "male", "f": "female", "female": "female"}
#: ages at or above this many years are blank (errors: RSNA's headers hold 148 to 155)
MAX_AGE = 130
#: DICOM Patient's Age (VR AS, PS3.5 section 6.2: ``nnnD``, ``nnnW``, ``nnnM``, ``nnnY``) unit -> years
AGE_UNITS = {"D": 1 / 365.25, "W": 7 / 365.25, "M": 1 / 12, "Y": 1.0}


def _text(values: pd.Series) -> pd.Series:
    """``values`` as stripped text, missing ones as ``""``."""
    values = pd.Series(values)
    return values.astype(object).where(values.notna(), "").astype(str).str.strip()


def sex_of(values: pd.Series) -> pd.Series:
    """The manifest's ``sex`` from a release's codes: ``male`` / ``female`` (M, F, Male, Female, any
    case), blank for anything else (DICOM's ``O`` = other, CheXpert's ``Unknown``, empty)."""
    return _text(values).str.lower().map(SEX_CODES)


def years_of(values: pd.Series) -> pd.Series:
    """A number of years per row, blank where it is not a number or outside [0, :data:`MAX_AGE`)."""
    years = pd.to_numeric(pd.Series(values), errors="coerce")
    return years.where((years >= 0) & (years < MAX_AGE))


def dicom_age(values: pd.Series, zero_is_blank: bool = True) -> pd.Series:
    """Years from DICOM Patient's Age strings (VR AS: ``058Y`` -> 58, ``006M`` -> 0.5, ``010W``,
    ``003D``, days as 1/365.25 year); a bare number (RSNA writes ``51``) is years. Blank where the
    value is empty or not of that form, and, with ``zero_is_blank``, where it is zero in any unit
    (``000Y``, ``000D``): in an adult release a zero can only stand for an unknown or removed age; a
    paediatric one (newborns are imaged on their first day) passes ``False``."""
    parts = _text(values).str.upper().str.extract(r"^(\d+(?:\.\d+)?)\s*([DWMY]?)$")
    number = pd.to_numeric(parts[0], errors="coerce")
    years = years_of(number * parts[1].replace("", "Y").map(AGE_UNITS).astype(float))
    return years.mask(years == 0) if zero_is_blank else years


def birth_year_age(birth_year: pd.Series, study_date: pd.Series) -> pd.Series:
    """Age in whole years from a birth year (PadChest's ``PatientBirth``, ``1930.0``) and a ``YYYYMMDD``
    study date: study year - birth year, the age reached in the study's calendar year (the birthday is
    not released, so the true age is that or one less). Blank where either is missing or malformed."""
    return years_of(year_of(study_date) - pd.to_numeric(pd.Series(birth_year), errors="coerce"))


def year_of(dates: pd.Series) -> pd.Series:
    """The year (a float) of each ``YYYYMMDD`` date (DICOM's DA: PadChest's ``StudyDate_DICOM``,
    MIMIC's shifted ``StudyDate``; text or a number), blank where missing or malformed."""
    date = _text(dates).str.replace(r"\.0$", "", regex=True)
    return pd.to_datetime(date.where(date.str.fullmatch(r"\d{8}")), format="%Y%m%d",
                          errors="coerce").dt.year.astype(float)


def text_of(values: pd.Series) -> pd.Series:
    """Stripped text per row (a scanner's ``Manufacturer``), blank where missing or empty."""
    text = _text(values)
    return text.where(text != "")


def demographics(table: pd.DataFrame, sex: str, age: str) -> dict[str, pd.Series]:
    """The manifest's ``sex`` (``male`` / ``female``, blank otherwise) and ``age`` (years, a number; blank
    where the release has none or a non-number) from the release's ``sex`` and ``age`` columns, where it
    has them (the confounder scan reads them: docs/methods/confounders.md, "Where it runs")."""
    out = {}
    if sex in table.columns:
        out["sex"] = sex_of(table[sex])
    if age in table.columns:
        out["age"] = years_of(table[age])
    return out


def findings_from_columns(table: pd.DataFrame, dataset: str, uncertain: str = "nan",
                          no_finding: str | None = None) -> pd.DataFrame:
    """The 12 finding columns from 1/0/-1/blank label columns (CheXpert labeler, VinDr 0/1).

    With ``no_finding`` (the CheXpert labeler's ``No Finding`` column) a blank label of a row
    whose ``no_finding`` is 1 is negative: the labeler sets it only when nothing is positive or
    uncertain (torchxrayvision does the same). Then ``-1`` follows the ``uncertain`` policy and
    the other blanks stay NaN; a finding fed by several source columns is their maximum over the
    labelled ones. Findings without a source column are all NaN.
    """
    minus_one = uncertain_value(uncertain)
    healthy = (table[no_finding] == 1).to_numpy()[:, None] if no_finding else False
    out = pd.DataFrame(index=table.index)
    sources = finding_sources(dataset)
    for finding in CHEST_FINDINGS:
        cols = [c for c in sources.get(finding, ()) if c in table.columns]
        if not cols:
            out[finding] = np.nan
            continue
        values = table[cols].apply(pd.to_numeric, errors="coerce")
        values = values.mask(values.isna().to_numpy() & healthy, 0.0).replace(-1.0, minus_one)
        out[finding] = values.max(axis=1, skipna=True)
    return out


def findings_from_terms(terms: pd.Series, dataset: str, absent: float = 0.0,
                        vocabulary: set[str] | None = None) -> pd.DataFrame:
    """The 12 finding columns from per-row sets of source terms (list-type labels).

    A row whose set is missing (None/NaN) is unlabelled (all NaN). Otherwise a finding is 1 when one of
    its source terms is in the set and ``absent`` (0 = negative; NaN where absence says nothing)
    when none is. Matching is case-insensitive. A finding none of whose terms occurs in
    ``vocabulary`` (the terms the file can contain) is NaN throughout: its absence is no evidence.
    """
    sources = {f: {s.lower() for s in src} for f, src in finding_sources(dataset).items()}
    vocab = None if vocabulary is None else {v.lower() for v in vocabulary}
    codes, sets = pd.factorize(terms.map(
        lambda t: frozenset(x.lower() for x in t) if isinstance(t, (set, frozenset)) else None))
    out = pd.DataFrame(index=terms.index)
    for finding in CHEST_FINDINGS:
        src = sources.get(finding, set())
        if not src or (vocab is not None and not src & vocab):
            out[finding] = np.nan
            continue
        per_set = np.array([1.0 if t & src else absent for t in sets] + [np.nan])
        out[finding] = per_set[codes]  # code -1 (unlabelled) picks the trailing NaN
    return out


def enclosing_boxes(boxes: pd.DataFrame) -> pd.DataFrame:
    """One box per ``sample_id``: the box enclosing all its boxes, normalised to 0-1.

    ``boxes`` has sample_id, x0, y0, x1, y1 (pixels) and width, height (image size in pixels);
    rows with a missing size give NaN coordinates. Returns box_x0..box_y1 and n_boxes per id.
    """
    if boxes.empty:
        return pd.DataFrame(columns=[*BOX_COLUMNS, "n_boxes"], index=pd.Index([], name="sample_id"))
    norm = pd.DataFrame({
        "sample_id": boxes["sample_id"],
        "box_x0": boxes["x0"] / boxes["width"], "box_y0": boxes["y0"] / boxes["height"],
        "box_x1": boxes["x1"] / boxes["width"], "box_y1": boxes["y1"] / boxes["height"],
    })
    grouped = norm.groupby("sample_id", sort=False)
    out = pd.concat([grouped[["box_x0", "box_y0"]].min(), grouped[["box_x1", "box_y1"]].max()], axis=1)
    out = out.clip(0.0, 1.0)
    out["n_boxes"] = grouped.size()
    return out[[*BOX_COLUMNS, "n_boxes"]]


def dicom_headers(paths: dict[str, Path], tags: Iterable[str]) -> pd.DataFrame:
    """DICOM header values (no pixel data) per key for the files that exist; NaN elsewhere."""
    import pydicom
    from pydicom.errors import InvalidDicomError

    tags = list(tags)
    rows = {}
    for key, path in paths.items():
        if not path.is_file():
            continue
        try:
            ds = pydicom.dcmread(path, stop_before_pixels=True, specific_tags=tags)
        except (InvalidDicomError, OSError) as err:
            raise ChestDataError(f"{path}: not a readable DICOM file ({err}); re-download it") from None
        rows[key] = {t: getattr(ds, t, None) for t in tags}
    return pd.DataFrame.from_dict(rows, orient="index", columns=tags)


def assemble(base: pd.DataFrame, findings: pd.DataFrame, site: str, views: Iterable[str] | None = None,
             boxes: pd.DataFrame | None = None) -> pd.DataFrame:
    """Canonical manifest: ``base`` (sample_id, path, patient_id, view, split, ...) + findings.

    Sets ``site`` and ``acq_group = site_view``, joins ``boxes`` (indexed by sample_id, from
    :func:`enclosing_boxes`) and keeps only the canonical ``views`` when given.
    """
    out = base.reset_index(drop=True)
    out.insert(3, "site", site)
    out.insert(5, "acq_group", site + "_" + out["view"].astype(str))
    out = pd.concat([out, findings.reset_index(drop=True)], axis=1)
    if boxes is not None:
        out = out.join(boxes, on="sample_id")
    if views is not None:
        out = out[out["view"].isin(list(views))].reset_index(drop=True)
    return out
