"""The papers' published numbers, shipped as package data (``paper/published/``; its README
says how every cell was transcribed and lists the ambiguous readings).

* Table files ``<paper>[_<version>]_table<N>[_<topic>].csv``: columns ``paper, version, table,
  section, row, column, value, unit, note``, one row per printed numeric cell; ``value`` is a
  plain decimal string that keeps the printed precision, percentages already divided by 100.
* Text files ``<paper>_text_numbers.csv``: ``paper, version, where, quantity, value, unit, quote``.

:func:`tables` / :func:`text_numbers` read them with ``value`` parsed to a float and the printed
precision kept in ``decimals`` (digits after the point of the value string; the half-unit
tolerance of :mod:`robustbench_fm.report.compare` is ``0.5 * 10**-decimals``). :func:`validate` checks the schema,
the unit vocabulary and that every value lies in its unit's range. :func:`parse_table_name`
maps a :class:`~robustbench_fm.core.tables.PaperTable` name (``croma_table3``, ``candor_v1_table4``,
``spar_table1_word``) to its published table; CANDOR without a version means v4, the current
arXiv version.
"""
from __future__ import annotations

import csv
import math
import re
from functools import lru_cache
from importlib import resources

import pandas as pd

TABLE_COLUMNS = ["paper", "version", "table", "section", "row", "column", "value", "unit", "note"]
TEXT_COLUMNS = ["paper", "version", "where", "quantity", "value", "unit", "quote"]
#: the current version of a paper with several (CANDOR: arXiv v4; v1 is kept for its tables 2-4)
DEFAULT_VERSION = {"candor": "v4", "croma": "", "spar": ""}

#: closed value range of every unit of the README's vocabulary (None = unbounded on that side)
UNIT_RANGES: dict[str, tuple[float | None, float | None]] = {
    "fraction": (-1.0, 1.0),  # Jaccard excess ΔJ may be negative; rates and AUROCs are in [0, 1]
    "fraction_from_percent": (-1.0, 1.0),
    "cosine": (-1.0, 1.0), "cosine_from_percent": (-1.0, 1.0),
    "margin": (-1.0, 1.0), "difference": (-1.0, 1.0), "rho": (-1.0, 1.0),
    "count": (0.0, None), "px": (0.0, None), "rank": (1.0, None), "ratio": (0.0, None),
    "million": (0.0, None), "billion": (0.0, None), "thousand": (0.0, None),
    "p_value": (0.0, 1.0), "rate": (0.0, None), "year": (1900.0, 2100.0), "weight": (0.0, None),
    "HU": (-1024.0, 4000.0), "scalar": (None, None), "slope": (None, None),
    "cosine_distance": (0.0, 2.0), "unclear": (None, None),
}
#: a plain decimal as the README prescribes (no exponent, no thousands separator, no "+")
_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")
_NAME = re.compile(r"^(candor|croma|spar)_(?:(v\d+)_)?table(\d+)(?:_.*)?$")


def _files(kind: str) -> list:
    folder = resources.files(__package__) / "published"
    pattern = re.compile(r"^[a-z]+_text_numbers\.csv$" if kind == "text" else r"^[a-z]+_(v\d+_)?table\d+.*\.csv$")
    return sorted((f for f in folder.iterdir() if pattern.match(f.name)), key=lambda f: f.name)


def decimals(value: str) -> int:
    """Digits after the decimal point of a printed value string (``"0.20"`` -> 2, ``"86"`` -> 0)."""
    return len(value.split(".", 1)[1]) if "." in value else 0


def _read(file, columns: list[str]) -> pd.DataFrame:
    df = pd.read_csv(file, dtype=str, keep_default_na=False)
    if list(df.columns) != columns:
        raise ValueError(f"published file {file.name}: columns {list(df.columns)} differ from {columns}; "
                         "restore the file from the package")
    bad = df.loc[(df["value"] != "") & ~df["value"].str.match(_NUMBER), "value"]
    if len(bad):
        raise ValueError(f"published file {file.name}: value '{bad.iloc[0]}' is not a plain decimal; "
                         "restore the file from the package")
    df["decimals"] = df["value"].map(decimals)
    df["value"] = pd.to_numeric(df["value"].where(df["value"] != ""), errors="raise").astype(float)
    df["file"] = file.name
    return df


@lru_cache(maxsize=1)
def _tables() -> pd.DataFrame:
    return pd.concat([_read(f, TABLE_COLUMNS) for f in _files("table")], ignore_index=True)


@lru_cache(maxsize=1)
def _text() -> pd.DataFrame:
    return pd.concat([_read(f, TEXT_COLUMNS) for f in _files("text")], ignore_index=True)


def tables() -> pd.DataFrame:
    """Every published table cell (a copy): the CSV columns, ``value`` as float (NaN for the
    n/d and n/a cells), ``decimals`` (printed precision) and ``file``."""
    return _tables().copy()


def text_numbers() -> pd.DataFrame:
    """Every number stated only in the papers' text (a copy), ``value`` as float."""
    return _text().copy()


def table(paper: str, number: int, version: str | None = None) -> pd.DataFrame:
    """The cells of one published table (``version`` None = the paper's current one)."""
    version = DEFAULT_VERSION.get(paper, "") if version is None else version
    df = _tables()
    out = df[(df["paper"] == paper) & (df["version"] == version) & (df["table"] == f"Table {number}")]
    if out.empty:
        known = sorted(set(df["paper"] + " " + df["version"] + " " + df["table"]))
        raise KeyError(f"no published table {paper} {version} Table {number}; known: {', '.join(known)}")
    return out.reset_index(drop=True)


def parse_table_name(name: str) -> tuple[str, str, int] | None:
    """``(paper, version, number)`` of a paper-table name ``<paper>[_v<k>]_table<N>[_<anything>]``,
    or None for a table that is no published table (e.g. ``croma_pareto``)."""
    m = _NAME.match(name)
    if m is None:
        return None
    paper, version, number = m.group(1), m.group(2), int(m.group(3))
    return paper, version or DEFAULT_VERSION[paper], number


def columns(paper: str, number: int, version: str | None = None) -> list[str]:
    """The published table's value columns in printed order."""
    return list(dict.fromkeys(table(paper, number, version)["column"]))


def validate() -> list[str]:
    """Problems of the shipped files (empty when sound): unknown units, non-numeric or
    out-of-range values, duplicated (table, section, row, column) keys, files whose name and
    ``paper``/``version``/``table`` columns disagree."""
    problems = []
    for kind, frame in (("table", _tables()), ("text", _text())):
        for _, r in frame.iterrows():
            where = f"{r['file']}: {r.get('row', r.get('quantity'))!s} / {r.get('column', '')!s}"
            if (r["unit"] == "" and kind == "table" and math.isnan(r["value"])
                    and re.match(r"printed n/[ad] ", r["note"])):
                continue
            if r["unit"] not in UNIT_RANGES:
                problems.append(f"{where}: unknown unit '{r['unit']}'")
                continue
            if math.isnan(r["value"]):
                problems.append(f"{where}: empty value")
                continue
            lo, hi = UNIT_RANGES[r["unit"]]
            if (lo is not None and r["value"] < lo) or (hi is not None and r["value"] > hi):
                problems.append(f"{where}: {r['value']} outside [{lo}, {hi}] for unit {r['unit']}")
    cells = _tables()
    dup = cells.duplicated(["paper", "version", "table", "section", "row", "column"], keep=False)
    problems += [f"{r.file}: duplicated cell {r.section}/{r.row}/{r.column}" for r in cells[dup].itertuples()]
    for file, rows in cells.groupby("file"):
        parsed = parse_table_name(file.removesuffix(".csv"))
        keys = set(zip(rows["paper"], rows["version"], rows["table"]))
        if parsed is None or keys != {(parsed[0], parsed[1], f"Table {parsed[2]}")}:
            problems.append(f"{file}: name does not match its paper/version/table columns {sorted(keys)}")
    return problems


def wide(paper: str, number: int, version: str | None = None) -> pd.DataFrame:
    """A published table in its printed layout: ``section``, ``row``, then the value columns in
    printed order (NaN where the paper prints no number); rows in printed order."""
    cells = table(paper, number, version)
    keys = list(dict.fromkeys(zip(cells["section"], cells["row"])))
    out = cells.set_index(["section", "row", "column"])["value"].unstack("column")
    out = out.reindex(index=pd.MultiIndex.from_tuples(keys, names=["section", "row"]),
                      columns=columns(paper, number, version))
    out.columns.name = None
    return out.reset_index()


@lru_cache(maxsize=1)
def aliases() -> dict[str, dict[str, str]]:
    """``{paper: {registry name: paper's model name}}`` from ``published/aliases.csv``."""
    out: dict[str, dict[str, str]] = {}
    with (resources.files(__package__) / "published" / "aliases.csv").open() as f:
        for row in csv.DictReader(f):
            out.setdefault(row["paper"], {})[row["encoder"]] = row["label"]
    return out
