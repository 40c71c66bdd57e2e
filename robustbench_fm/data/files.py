"""Reading a dataset's label files with one-line errors that name the file, the field and the fix.

A label file that lacks a column some finding is read from (e.g. ``Pneumothorax`` deleted from
CheXpert's ``train.csv``) would leave that finding without labels, which a stage would report as
"0 positives". The adapters report such gaps (:func:`report_label_gap`); :func:`check_label_gaps`
refuses a run whose ``stage.findings`` include an affected finding (one line naming the file, the
missing column(s) and the fix) and logs one warning line per file for the other findings.

A label file the user writes (``dataset=csv``, a manifest file) is decoded by :func:`read_csv`
whatever its encoding: a byte-order mark says it (UTF-8, UTF-16, UTF-32); else UTF-16
without a mark where its zero bytes say so, else UTF-8, else Windows-1252 (cp1252, what Excel writes on
Western Windows), else Latin-1 (which decodes any bytes); a fallback from UTF-8 is one warning line
naming the encoding used and how to convert the file (:data:`TEXT_ENCODINGS`).
"""
from __future__ import annotations

import bz2
import codecs
import contextlib
import contextvars
import gzip
import io
import logging
import lzma
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import pandas as pd

from ..core.errors import UserError

log = logging.getLogger("robustbench_fm.data")


class DatasetError(UserError, ValueError):
    """A dataset's label or metadata files (or an adapter option) are wrong; one line."""


class DatasetFileMissing(DatasetError, FileNotFoundError):
    """A file the dataset's official layout holds is not there."""


class UnknownOption(DatasetError, TypeError):
    """``dataset.options`` names an option the adapter does not take (a ``TypeError``, as an
    unexpected keyword argument would be)."""


#: byte-order marks and the encoding each says (UTF-32 first: its little-endian mark begins with UTF-16's)
BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
#: the encodings tried, in order, for a file without a byte-order mark (module docstring; UTF-16 only
#: where its zero bytes say so, and then first)
TEXT_ENCODINGS = ("utf-8", "cp1252", "latin-1")
_OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
_WARNED: set[tuple] = set()


def _zero_bytes_say(data: bytes) -> str | None:
    """UTF-16 without a byte-order mark: ASCII text has a zero byte beside every character (the odd
    bytes: little-endian; the even ones: big-endian). None when the sample is not like that."""
    sample = data[:4096]
    if len(sample) < 4 or b"\x00" not in sample:
        return None
    odd, even = sample[1::2].count(0), sample[0::2].count(0)
    half = len(sample) // 4
    return "utf-16-le" if odd >= half and even * 8 < odd else "utf-16-be" if even >= half and odd * 8 < even else None


def decode_text(data: bytes) -> tuple[str, str, bool]:
    """(text, encoding, whether it was said by a byte-order mark) of a text file's ``data``
    (module docstring); Latin-1 decodes anything, so this never fails."""
    for bom, encoding in BOMS:
        if data.startswith(bom):
            return data.decode(encoding), encoding, True
    utf16 = _zero_bytes_say(data)  # before UTF-8: ASCII in UTF-16 is valid UTF-8 (with zero bytes)
    for encoding in ((utf16,) if utf16 else ()) + TEXT_ENCODINGS:
        if encoding.startswith("utf-16") and encoding != utf16:
            continue
        try:
            return data.decode(encoding), encoding, False
        except UnicodeDecodeError:
            continue
    raise AssertionError("latin-1 decodes every byte")  # pragma: no cover


def read_csv(path: str | Path, **read_csv) -> pd.DataFrame:
    """:func:`pandas.read_csv` of a label file in any of the encodings of the module docstring
    (``.gz``/``.bz2``/``.xz`` decompressed first); a file that is not UTF-8 is read, and one warning
    line per file and process names the encoding used and how to convert it to UTF-8."""
    path = Path(path)
    if path.suffix.lower() in (".zip", ".zst", ".tar"):  # archives: pandas opens them (as UTF-8)
        return pd.read_csv(path, **read_csv)
    opener = _OPENERS.get(path.suffix.lower())
    with (opener(path, "rb") if opener else open(path, "rb")) as f:
        data = f.read()
    text, encoding, marked = decode_text(data)
    if encoding != "utf-8" and not marked:
        stamp = (str(path), encoding)
        if stamp not in _WARNED:
            _WARNED.add(stamp)
            guess = "" if encoding.startswith("utf-16") else " (a guess: 8-bit text in another code page reads wrong)"
            log.warning("%s: not UTF-8; read as %s%s; save it as UTF-8 to silence this (iconv -f %s -t UTF-8 %s > "
                        "utf8.csv)", path, encoding, guess, encoding.upper(), path.name)
    return pd.read_csv(io.StringIO(text), **read_csv)


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


@dataclass(frozen=True)
class LabelGap:
    """Columns a dataset's findings are read from that label file ``path`` does not have."""

    dataset: str
    path: str
    columns: tuple[str, ...]  # the missing source columns
    findings: tuple[str, ...]  # the findings they feed
    empty: tuple[str, ...]  # those of ``findings`` left with no source column at all (no labels)

    def _effect(self, findings: Iterable[str], asked: bool = False) -> str:
        parts = []
        for kind, group in (("no labels", [f for f in findings if f in self.empty]),
                            ("incomplete labels", [f for f in findings if f not in self.empty])):
            if group:
                one = len(group) == 1
                parts.append(f"{'finding' if one else 'findings'} {', '.join(map(repr, group))}"
                             f"{' (in stage.findings)' if asked else ''} {'gets' if one else 'get'} {kind} from it")
        return " and ".join(parts)

    def _columns(self) -> str:
        return f"{'column' if len(self.columns) == 1 else 'columns'} {', '.join(map(repr, self.columns))}"

    def warning(self) -> str:
        return (f"dataset '{self.dataset}': {self.path} has no {self._columns()}, so {self._effect(self.findings)}; "
                "use the official, unmodified file to score "
                f"{'it' if len(self.findings) == 1 else 'them'}")

    def error(self, asked: list[str]) -> str:
        return (f"dataset '{self.dataset}': {self.path} has no {self._columns()}, so {self._effect(asked, True)}; "
                f"use the official, unmodified file or drop {', '.join(asked)} from stage.findings")


_GAPS: contextvars.ContextVar[list[LabelGap] | None] = contextvars.ContextVar("label_gaps", default=None)


def report_label_gap(gap: LabelGap) -> None:
    """Hand ``gap`` to the enclosing :func:`collect_label_gaps`, else log its warning line."""
    gaps = _GAPS.get()
    if gaps is None:
        log.warning(gap.warning())
    else:
        gaps.append(gap)


@contextlib.contextmanager
def collect_label_gaps() -> Iterator[list[LabelGap]]:
    """Collect the gaps the adapters report while the block runs (for :func:`check_label_gaps`)."""
    gaps: list[LabelGap] = []
    token = _GAPS.set(gaps)
    try:
        yield gaps
    finally:
        _GAPS.reset(token)


def check_label_gaps(gaps: Iterable[LabelGap], findings: Iterable[str] | None = None) -> None:
    """Raise :class:`DatasetError` for the first gap feeding one of ``findings`` (the findings the
    run scores); log one warning line for each other gap."""
    asked = [str(f) for f in findings or ()]
    gaps = list(gaps)
    for gap in gaps:
        hit = [f for f in asked if f in gap.findings]
        if hit:
            raise DatasetError(gap.error(hit))
    for gap in gaps:
        log.warning(gap.warning())
