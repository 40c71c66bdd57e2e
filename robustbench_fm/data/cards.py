"""Dataset cards: what a complete copy of each dataset should contain.

Each ``configs/dataset/<name>.yaml`` holds a ``card`` with the access and licence notes, the
citation and the ``expected`` counts (``images``, ``patients``, ``positives`` per finding) from the
papers or the official sources named in ``source``. :func:`check` compares a built manifest with
them and returns one warning line per mismatch; a count of ``null`` is not checked.

The card is the one home of a dataset's access, licence and citation: the registry's
:class:`~.registry.Adapter` reads them from it (:func:`card_field`), and ``list datasets`` shows them.
"""
from __future__ import annotations

import functools
import importlib.resources
from pathlib import Path

import pandas as pd

from ..core.errors import InvalidSetting, MissingInput, UnknownName


def config_dir() -> Path:
    """The shipped ``configs/`` folder: the source tree's in a checkout (an editable install, or the
    package imported from the repository root), else the package data of an installed wheel,
    ``robustbench_fm/_configs`` (``setup.py`` maps the package ``robustbench_fm._configs`` to
    ``configs/`` without moving it), located with :mod:`importlib.resources`."""
    package = Path(__file__).resolve().parents[1]  # robustbench_fm/
    source = package.parent / "configs"
    if (package.parent / "pyproject.toml").is_file() and (source / "config.yaml").is_file():
        return source
    shipped = Path(str(importlib.resources.files("robustbench_fm") / "_configs"))
    if not (shipped / "config.yaml").is_file():
        raise MissingInput(f"robustbench_fm's configs are missing (looked in '{source}' and '{shipped}'); "
                           "reinstall the package: pip install robustbench_fm")
    return shipped


CONFIG_DIR = config_dir()
#: the card's text fields that the registry adapters show (``Adapter.access`` etc., ``list datasets``)
CARD_FIELDS = ("access", "licence", "citation")


def load_card(name: str) -> dict:
    """The ``card`` mapping of ``configs/dataset/<name>.yaml`` (interpolations left unresolved)."""
    from omegaconf import OmegaConf

    path = CONFIG_DIR / "dataset" / f"{name}.yaml"
    if not path.is_file():
        raise MissingInput(f"dataset card '{path}' not found; add configs/dataset/{name}.yaml "
                           "or check the dataset name")
    card = OmegaConf.load(path).get("card")
    if card is None:
        raise InvalidSetting(f"{path}: no 'card' section; add card: {{access, licence, citation, expected, source}}")
    return OmegaConf.to_container(card, resolve=False)


@functools.lru_cache(maxsize=None)
def _card_text(name: str) -> dict:
    try:
        card = load_card(name)
    except (FileNotFoundError, ValueError):  # a dataset without a shipped card (planted, spar_phantom_totalsegmentator)
        return {}
    return {k: card.get(k) for k in CARD_FIELDS}


def card_field(name: str, field: str) -> str:
    """``card.<field>`` (one of :data:`CARD_FIELDS`) of dataset ``name``, "" without a card: the one
    home of the registry adapters' ``access``, ``licence`` and ``citation`` (read once per dataset)."""
    if field not in CARD_FIELDS:
        raise UnknownName(f"'{field}' is not a card text field; one of {', '.join(CARD_FIELDS)}")
    return _card_text(name).get(field) or ""


def _mismatch(source: str, what: str, found: int, expected: int, card_source: str) -> str:
    return (f"{source}: {what} is {found:,} but the dataset card expects {expected:,} ({card_source}); "
            "check that the download is complete and the options select the whole dataset")


def check(manifest: pd.DataFrame, card: dict, source: str) -> list[str]:
    """One warning line per count of ``card['expected']`` that ``manifest`` does not match.

    Images are rows; patients are distinct ``patient_id``; positives are rows equal to 1 in each
    finding column named under ``positives`` (a missing column is a mismatch too).
    """
    expected = card.get("expected") or {}
    card_source = card.get("source") or "no source given"
    warnings = []
    if expected.get("images") is not None and len(manifest) != expected["images"]:
        warnings.append(_mismatch(source, "the number of images", len(manifest), expected["images"], card_source))
    if expected.get("patients") is not None:
        found = int(manifest["patient_id"].nunique()) if "patient_id" in manifest.columns else 0
        if found != expected["patients"]:
            warnings.append(_mismatch(source, "the number of patients", found, expected["patients"], card_source))
    for finding, count in (expected.get("positives") or {}).items():
        if count is None:
            continue
        if finding not in manifest.columns:
            warnings.append(f"{source}: finding column '{finding}' missing, the dataset card expects "
                            f"{count:,} positives ({card_source}); check the dataset name and options")
            continue
        found = int((pd.to_numeric(manifest[finding], errors="coerce") == 1).sum())
        if found != count:
            warnings.append(_mismatch(source, f"the number of '{finding}' positives", found, count, card_source))
    return warnings
