"""A fixed sample of a manifest with at most N positives and N negatives per matched group and
finding (candor.md ablation (5) "Input Resolution and Pooling": "We test them on a fixed sample of
MIMIC-CXR and CheXpert, with up to 500 positives and 500 negatives per matched group and finding").

Reading of the sentence: each (matched group, finding) task gets its own draw of at most N of its
positives and at most N of its negatives, and the task sees only those (other rows of the group
are unlabelled for that finding: their label becomes NaN, so they are neither queries nor
candidates); the images of the job are the union of the draws, embedded once. A plain union
would give a finding more than N positives wherever they were drawn for another finding.

"Fixed": the draw is a stable hash, the first N rows of each task by SHA-256 of
``"<seed>|<finding>|<sample_id>"``, so it depends neither on the manifest's row order nor on the
encoder or the resolution, and the paper's seed 42 ("The sets are drawn once, with seed 42")
is the default. The sample for N is nested in the sample for any larger N.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from ..core.errors import InvalidSetting


def _rank(seed: int, finding: str, ids: pd.Series) -> np.ndarray:
    return np.array([int.from_bytes(hashlib.sha256(f"{seed}|{finding}|{s}".encode()).digest()[:8], "big")
                     for s in ids.astype(str)], dtype=np.uint64)


def fixed_sample(manifest: pd.DataFrame, findings: list[str], per_class: int, seed: int = 42,
                 group_col: str = "acq_group", key: str = "fixed_sample") -> pd.DataFrame:
    """The rows drawn for any (group, finding) task, in manifest order, with each finding's label
    kept only on the rows drawn for it (module docstring). ``key`` names the setting in errors."""
    per_class = int(per_class)
    if per_class < 1:
        raise InvalidSetting(f"{key}={per_class}: draw at least 1 positive and 1 negative per group and finding")
    if group_col not in manifest.columns:
        raise InvalidSetting(f"{key}: the manifest has no '{group_col}' column (the matched group); "
                             f"set {key}=null or build the manifest with its groups")
    out = manifest.reset_index(drop=True).copy()
    keep = np.zeros(len(out), dtype=bool)
    for finding in findings:
        if finding not in out.columns:
            raise InvalidSetting(f"{key}: finding '{finding}' is not a column of the manifest; fix stage.findings")
        labels = pd.to_numeric(out[finding], errors="coerce")
        if (labels.notna() & ~labels.isin([0, 1])).any() or (out[finding].notna() & labels.isna()).any():
            raise InvalidSetting(f"{key}: column '{finding}' is not 0/1/NaN; a fixed sample of positives and "
                                 f"negatives needs binary findings (set {key}=null for class columns)")
        drawn = np.zeros(len(out), dtype=bool)
        rank = _rank(seed, finding, out["sample_id"])
        for _, rows in out.groupby(group_col, sort=False).groups.items():
            rows = np.asarray(rows)
            for value in (1, 0):
                hit = rows[labels.to_numpy()[rows] == value]
                drawn[hit[np.argsort(rank[hit], kind="stable")[:per_class]]] = True
        out.loc[~drawn, finding] = np.nan
        keep |= drawn
    return out[keep].reset_index(drop=True)
