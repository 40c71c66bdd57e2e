"""Dataset adapter registry: registry name -> function(root, **options) -> manifest."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import pandas as pd

from ..core.registry import Registry
from . import manifest as mf
from .cards import card_field
from .files import DatasetError, DatasetFileMissing, UnknownOption, check_label_gaps, collect_label_gaps
from .images import locator_file


class _CardField:
    """An adapter field whose one home is the dataset card (``card.<field>`` of
    ``configs/dataset/<name>.yaml``, :mod:`.cards`): read when first asked for. A value passed to
    ``Adapter(...)`` is used instead; that is for datasets registered without a shipped card (no
    shipped adapter passes one: ``tests/cli/test_config_sources.py``)."""

    def __set_name__(self, owner, name: str) -> None:
        self.field, self.slot = name, f"_{name}"

    def __get__(self, adapter, owner=None):
        if adapter is None:  # the dataclass default: None = the card's
            return None
        given = adapter.__dict__.get(self.slot)
        if given is not None:
            return given

        return card_field(adapter.name, self.field)

    def __set__(self, adapter, value) -> None:  # Adapter.__init__ (frozen: only there)
        adapter.__dict__[self.slot] = value


@dataclass(frozen=True)
class Adapter:
    """One dataset family member as its official distribution lays it out.

    ``build(root, **options)`` reads the label/metadata files under ``root`` and returns the
    canonical manifest; ``findings`` are its binary finding columns; ``generate(root, **options)``
    (synthetic datasets only) writes the dataset's files first. ``access`` says where a user
    gets the data (and any credential or agreement it needs), ``licence`` and ``citation`` what
    its dataset card states: all three are read from that card (``configs/dataset/<name>.yaml``),
    "" where the dataset has none.
    """

    name: str
    build: Callable[..., pd.DataFrame]
    findings: tuple[str, ...] = ()
    description: str = ""
    generate: Callable[..., Path] | None = None
    access: str = _CardField()
    licence: str = _CardField()
    citation: str = _CardField()


ADAPTERS: Registry[Adapter] = Registry("dataset")
names, get = ADAPTERS.names, ADAPTERS.get


def register(adapter: Adapter) -> Adapter:
    return ADAPTERS.register(adapter.name, adapter)


def check_options(name: str, options: dict) -> None:
    """``dataset.options`` dataset ``name``'s adapter does not take: one line naming the first one,
    the closest option it takes and the others (:func:`_check_options`); called by the pipeline's
    plan before any data is read, and by :func:`build_manifest`. An adapter whose ``build`` takes
    any keyword (the generated datasets: options it checks against the generator's record) is
    checked against its ``generate``."""
    adapter = get(name)
    build = adapter.build
    if adapter.generate is not None and _takes_any(build):
        build = adapter.generate
    _check_options(name, build, options)


def _takes_any(fn: Callable) -> bool:
    try:
        return any(p.kind is p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True


def _check_options(name: str, build: Callable, options: dict) -> None:
    """``dataset.options`` the adapter's ``build`` does not take fail with one line naming the
    first one, the closest option it takes and the others (instead of Python's "unexpected keyword
    argument", or a key added with ``+`` that nothing reads)."""
    import difflib

    try:
        params = list(inspect.signature(build).parameters.values())[1:]  # after root
    except (TypeError, ValueError):  # no signature to read (a builtin): the call reports it
        return
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    accepted = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [k for k in options if k not in accepted]
    if unknown:
        takes = f"it takes {', '.join(accepted)}" if accepted else "it takes no options"
        close = difflib.get_close_matches(str(unknown[0]), accepted, n=1)
        mean = f"did you mean dataset.options.{close[0]}? " if close else ""
        raise UnknownOption(f"dataset '{name}': no option dataset.options.{unknown[0]}; {mean}{takes}; "
                            "remove it or fix its name")


def build_manifest(name: str, root: str | Path, verify_images: bool = True,
                   findings: Iterable[str] | None = None, **options) -> pd.DataFrame:
    """Build and validate the canonical manifest of dataset ``name`` stored under ``root``.

    With ``verify_images`` every ``path`` must exist under ``root``; the error names the first
    missing file and how many are missing. ``findings`` are the findings the caller will score
    (``stage.findings``): a label file lacking a column one of them is read from is an error
    naming the file and the column; a column feeding only other findings is a warning line
    (:func:`.files.check_label_gaps`).
    """

    adapter = get(name)
    root = Path(root)
    if not root.is_dir():
        raise DatasetFileMissing(f"dataset '{name}': root '{root}' does not exist; "
                                 f"set dataset.root to the folder holding the dataset")
    _check_options(name, adapter.build, options)
    with collect_label_gaps() as gaps:
        built = adapter.build(root, **options)
    check_label_gaps(gaps, findings)
    df = mf.validate(built, source=f"{name}@{root}", findings=adapter.findings)
    if df.empty:
        raise DatasetError(f"dataset '{name}': the manifest has 0 rows (nothing under '{root}' matched); check "
                           "dataset.root and dataset.options")
    if verify_images and "path" in df.columns:

        files = pd.Series(pd.unique(df["path"].map(locator_file)))
        found = set(files[files.map(lambda p: (root / p).is_file())])
        located = df["path"].map(locator_file)
        exists = located.isin(found)
        folders = ~exists & located.map(lambda p: (root / p).is_dir())
        if folders.any():
            row = int(folders.to_numpy().nonzero()[0][0])
            raise DatasetError(f"dataset '{name}': {int(folders.sum())} of {len(df)} paths are folders, not image "
                               f"files, first '{df['path'].iloc[row]}' (row {row}); name each image file under "
                               f"'{root}'")
        if not exists.all():
            row = int((~exists).to_numpy().nonzero()[0][0])
            given = str(df["path"].iloc[row])
            slashes = " (written with '\\': write paths with '/')" if "\\" in given else ""
            raise DatasetFileMissing(
                f"dataset '{name}': {int((~exists).sum())} of {len(df)} images missing under '{root}', first "
                f"'{given}' (row {row}){slashes}; fix dataset.root, or set dataset.verify_images=false (Python: "
                "verify_images=False) to run without them: the run then stops at the first missing image unless "
                "extract.on_bad_image=skip, which leaves them out and lists them in skipped.csv")
    return df
