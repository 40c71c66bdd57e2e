"""Reading a dataset's label files with one-line errors that name the file, the field and the fix.

A label file that lacks a column some finding is read from (e.g. ``Pneumothorax`` deleted from
CheXpert's ``train.csv``) would leave that finding without labels, which a stage would report as
"0 positives". The adapters report such gaps (:func:`report_label_gap`); :func:`check_label_gaps`
refuses a run whose ``stage.findings`` include an affected finding (one line naming the file, the
missing column(s) and the fix) and logs one warning line per file for the other findings.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
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
