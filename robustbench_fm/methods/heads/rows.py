"""Which rows a head trains, validates and is tested on (candor.md "Implementation").

The training and test rows are "drawn once from a stable hash and are the same for every
encoder": every row gets u = SHA-256(seed, sample_id) read as a number in [0, 1), and the draw
keeps the ``max_train`` training-split rows (``max_test`` test-split rows) of smallest u, ties by
sample_id. The draw therefore depends on the sample_ids only, never on the row order, the
encoder or the finding. Validation is the whole validation split.

Splits come from the manifest's ``split`` column. A split the manifest lacks (no column, no
``val`` or no ``test`` rows) is carved out of the training rows by the same kind of hash of the
patient (``cluster_col``; sample_id when absent), so no patient straddles two splits: the test
carve-out takes the patients with u < ``test_fraction``, the validation carve-out the next
``val_fraction``. A manifest without any training row is carved entirely. A pooled manifest (a
``dataset`` column) is carved per member site.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pandas as pd


def stable_uniform(keys, seed: int = 42) -> np.ndarray:
    """u ∈ [0, 1) per key: the first 8 bytes of SHA-256("<seed>\\x1f<key>") over 2^64.
    Identical on every machine, Python version and run."""
    out = np.empty(len(keys), dtype=np.float64)
    for i, key in enumerate(map(str, keys)):
        digest = hashlib.sha256(f"{seed}\x1f{key}".encode()).digest()
        out[i] = int.from_bytes(digest[:8], "big") / 2.0 ** 64
    return out


def _carve(split: np.ndarray, u: np.ndarray, val_fraction: float, test_fraction: float) -> np.ndarray:
    if not (split == "train").any():  # nothing to train on: carve every row
        split = np.full(len(split), "train", dtype=object)
    train = split == "train"
    if not (split == "test").any():
        split = np.where(train & (u < test_fraction), "test", split)
    if not (split == "val").any():
        split = np.where(train & (u >= test_fraction) & (u < test_fraction + val_fraction), "val", split)
    return split


def head_splits(manifest: pd.DataFrame, seed: int = 42, cluster_col: str = "patient_id",
                val_fraction: float = 0.1, test_fraction: float = 0.2) -> np.ndarray:
    """'train' / 'val' / 'test' (or None: row without a split) per manifest row (module doc).

    A pooled manifest (a ``dataset`` column: :mod:`robustbench_fm.data.pool`) is carved member by
    member: a site without its own test (validation) split gets one by the patient hash, while
    the other sites keep theirs, so every site has a test split (candor.md "Discordance and Head
    Errors": "the test split of the 5 chest sites")."""
    n = len(manifest)
    split = (manifest["split"].astype(object).where(manifest["split"].notna(), None).to_numpy()
             if "split" in manifest.columns else np.full(n, None, dtype=object))
    clusters = manifest[cluster_col if cluster_col in manifest.columns else "sample_id"].astype(str)
    u = pd.Series(stable_uniform(clusters.unique(), seed), index=clusters.unique())[clusters].to_numpy()
    if "dataset" not in manifest.columns:
        return _carve(split, u, val_fraction, test_fraction)
    members = manifest["dataset"].astype(str).to_numpy()
    out = split.copy()
    for member in pd.unique(members):
        at = members == member
        out[at] = _carve(split[at], u[at], val_fraction, test_fraction)
    return out


@dataclass(frozen=True)
class HeadRows:
    """Manifest row positions (ascending) of the drawn training rows, the validation rows, the
    drawn test rows and the whole test split; ``split`` per manifest row."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    test_all: np.ndarray
    split: np.ndarray


def draw_first(rows: np.ndarray, sample_ids: np.ndarray, limit: int, seed: int) -> np.ndarray:
    """The ``limit`` rows of smallest stable hash of their sample_id (ties by sample_id), ascending."""
    if len(rows) <= limit:
        return np.sort(rows)
    ids = sample_ids[rows].astype(str)
    order = np.lexsort((ids, stable_uniform(ids, seed)))
    return np.sort(rows[order[:limit]])


def draw_rows(manifest: pd.DataFrame, max_train: int = 25_000, max_test: int = 20_000, seed: int = 42,
              cluster_col: str = "patient_id", val_fraction: float = 0.1,
              test_fraction: float = 0.2) -> HeadRows:
    """The rows every head of this manifest uses, whatever the encoder or finding (module doc)."""
    split = head_splits(manifest, seed, cluster_col, val_fraction, test_fraction)
    ids = manifest["sample_id"].astype(str).to_numpy()
    test_all = np.flatnonzero(split == "test")
    return HeadRows(train=draw_first(np.flatnonzero(split == "train"), ids, max_train, seed),
                    val=np.flatnonzero(split == "val"),
                    test=draw_first(test_all, ids, max_test, seed), test_all=test_all, split=split)
