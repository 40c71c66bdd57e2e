"""Paired 2×2 designs built from a manifest (croma.md A.11 "TCGA: the paired 2x2 configuration";
croma_conventions.md A.8): every pair of biological labels crossed with every pair of confounder
values is one quartet (subset) when all four label × confounder cells hold rows, and each row
appears once per quartet it belongs to (one occurrence per (row, quartet), ready for the croma
stage's ``design="paired_2x2"``).

How the quartets are formed (the reading of the paper's "balanced 2×2 quartets, each two biological
classes × two centres"): label pairs over the sorted labels, confounder pairs over the sorted
confounder values, a quartet kept only if its four cells are non-empty (at least ``min_per_cell``
rows each), named ``"<label a>+<label b>__<centre c>_<centre d>"`` (non-alphanumerics as ``_``).
This is the rule of croma's ``scripts/prep/prepare_paired_manifest.py``.

PathoROB's own TCGA-2x2 quartets are a stored file (``tcga_2x2.csv``, read by the
``pathorob_tcga2x2`` adapter), not derivable from the TCGA-4x4 metadata: that file holds 4 cancer
types and 8 centres (4 in-domain, 4 unseen), which give at most 36 (in-domain rows) or 52 (all
rows) complete quartets, whereas the paper's 94 quartets span 21 cancer types and 26 centres with
300 tiles per cell (112,800 occurrences).
"""
from __future__ import annotations

import re
from itertools import combinations

import pandas as pd


def _token(value) -> str:
    return re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9]+", "_", str(value).strip())).strip("_") or "value"


def quartet_name(labels: tuple, confounders: tuple) -> str:
    """``"<label a>+<label b>__<confounder c>_<confounder d>"``."""
    return f"{'+'.join(map(_token, labels))}__{'_'.join(map(_token, confounders))}"


def paired_quartets(manifest: pd.DataFrame, label_col: str = "bio_label", confounder_col: str = "site",
                    subset_col: str = "subset", min_per_cell: int = 1) -> pd.DataFrame:
    """One row per (manifest row, complete quartet) occurrence with the quartet in ``subset_col``
    (module doc), quartets in (label pair, confounder pair) order, rows in manifest order inside each."""
    for col in (label_col, confounder_col):
        if col not in manifest.columns:
            raise ValueError(f"paired quartets: manifest has no column '{col}'; pass label_col= / confounder_col=")
    if min_per_cell < 1:
        raise ValueError(f"paired quartets: min_per_cell={min_per_cell} must be at least 1")
    labels = manifest[label_col].astype(str)
    confs = manifest[confounder_col].astype(str)
    counts = pd.crosstab(labels, confs)
    parts = []
    for pair in combinations(sorted(labels.unique()), 2):
        for cpair in combinations(sorted(confs.unique()), 2):
            if (counts.loc[list(pair), list(cpair)].to_numpy() >= min_per_cell).all():
                keep = labels.isin(pair) & confs.isin(cpair)
                parts.append(manifest[keep].assign(**{subset_col: quartet_name(pair, cpair)}))
    if not parts:
        raise ValueError(f"paired quartets: no 2 {label_col} x 2 {confounder_col} quartet has every cell filled "
                         f"(at least {min_per_cell} rows)")
    return pd.concat(parts, ignore_index=True)
