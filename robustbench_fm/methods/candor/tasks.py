"""CANDOR tasks: which images are the positives and negatives of each scored task, the label
controls of the ablations, and the pooling of tasks into one rate (candor.md "Scope",
"Reporting", "Chest Encoders and the Choice of Candidate Sets", "Ablation Studies").

* ``task="auto"`` (default): a numeric finding column is binary, a column of names is one-vs-rest.
* ``task="binary"``: each finding column (1 positive, 0 negative, NaN unlabelled) is one task.
* ``task="family_one_vs_rest"``: the finding column holds class names (``bio_label``); every class
  whose matched group (family, manufacturer) holds at least one other class is one task, with the
  other classes of its group as negatives ("Birds and aircraft are tested one class at a time ...
  the 167 of 200 species and the 87 of 100 variants"). The task's rate is the unweighted mean over
  its classes.
* Chest findings scored together are pooled by a mean weighted for clinical severity
  (:data:`SEVERITY_WEIGHTS`); the margin AUROC by the plain mean ("Reporting").

Label controls act on the label vector of one task: :func:`isolate` (ablation 6),
:func:`box_verified` (ablation 1), :func:`shuffle_within_groups` (the shuffled-label control) and
``1 − y`` for negative queries (ablation 7).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ...core.errors import InvalidSetting
from ...data.manifest import BOX_COLUMNS, CHEST_FINDINGS

TASKS = ("auto", "binary", "family_one_vs_rest")
#: Row name of the severity-weighted pool of chest findings.
CHEST_POOL = "__chest__"
#: ``target`` of the unweighted mean over the classes of a one-vs-rest task.
CLASS_MEAN = "__mean__"
#: candor.md "Reporting": 3 for the urgent findings, 2 for the intermediate, 1 for the others.
SEVERITY_WEIGHTS = {
    "pneumothorax": 3, "pneumonia": 3, "consolidation": 3, "edema": 3, "lung_lesion": 3,
    "pleural_effusion": 2, "fracture": 2, "cardiomegaly": 2, "lung_opacity": 2,
    "enlarged_cardiomediastinum": 2,
    "atelectasis": 1, "pleural_other": 1,
}


@dataclass
class Task:
    """One binary question: ``finding`` (the manifest column), ``target`` (the positive class;
    the finding itself for binary tasks), ``labels`` (1, 0 or NaN per manifest row) and ``kind``
    (binary or family_one_vs_rest)."""

    finding: str
    target: str
    labels: np.ndarray
    kind: str = "binary"


def task_rng(seed: int, *keys: str) -> np.random.Generator:
    """A generator for one (group, task, purpose), independent of every other draw."""
    return np.random.default_rng([seed, *(zlib.crc32(str(key).encode()) for key in keys)])


def eligible_classes(classes, families) -> list[str]:
    """Sorted classes whose family holds at least one other class (candor.md "Scope")."""
    table = pd.DataFrame({"cls": classes, "fam": families}).dropna().drop_duplicates()
    if table.duplicated("cls").any():
        first = table.loc[table.duplicated("cls"), "cls"].iloc[0]
        raise InvalidSetting(f"candor: class {first!r} lies in several matched groups; a one-vs-rest class "
                         "must belong to one family (check the class and group columns)")
    per_family = table.groupby("fam")["cls"].transform("size")
    return sorted(table.loc[per_family >= 2, "cls"].astype(str))


def one_vs_rest_tasks(manifest: pd.DataFrame, finding: str, group_col: str) -> list[Task]:
    """One task per eligible class of column ``finding``: 1 for the class, 0 for the other
    classes of its group, NaN elsewhere."""
    classes = manifest[finding].astype(object).where(manifest[finding].notna()).to_numpy()
    groups = manifest[group_col].astype(str).to_numpy()
    labelled = pd.notna(classes)
    tasks = []
    for cls in eligible_classes(classes, np.where(labelled, groups, None)):
        is_cls = labelled & (classes.astype(str) == cls)
        family = groups[np.flatnonzero(is_cls)[0]]
        labels = np.where(is_cls, 1.0, np.where(labelled & (groups == family), 0.0, np.nan))
        tasks.append(Task(finding, cls, labels, "family_one_vs_rest"))
    return tasks


def task_kind(manifest: pd.DataFrame, finding: str, task: str) -> str:
    """binary or family_one_vs_rest for ``finding`` (``task="auto"``: by the column's dtype)."""
    if task != "auto":
        return task
    return "binary" if pd.api.types.is_numeric_dtype(manifest[finding]) else "family_one_vs_rest"


def build_tasks(manifest: pd.DataFrame, findings: list[str], task: str, group_col: str) -> list[Task]:
    """The tasks of ``findings`` (see module doc), in the order of ``findings``."""
    tasks = []
    for f in findings:
        if task_kind(manifest, f, task) == "binary":
            labels = pd.to_numeric(manifest[f], errors="coerce").to_numpy(dtype=float)
            bad = ~np.isnan(labels) & ~np.isin(labels, (0, 1)) | manifest[f].notna().to_numpy() & np.isnan(labels)
            if bad.any():
                raise InvalidSetting(f"candor: column '{f}' holds {manifest[f].iloc[np.flatnonzero(bad)[0]]}; a binary "
                                 "finding takes 1, 0 or NaN (a column of class names takes task=family_one_vs_rest)")
            tasks.append(Task(f, f, labels))
            continue
        classes = one_vs_rest_tasks(manifest, f, group_col)
        if not classes:
            raise InvalidSetting(f"candor: no class of '{f}' shares its '{group_col}' with another class; "
                             "task=family_one_vs_rest needs groups holding at least 2 classes")
        tasks += classes
    return tasks


def isolate(labels: np.ndarray, manifest: pd.DataFrame, finding: str, others: list[str]) -> np.ndarray:
    """Ablation 6: images positive for any other finding become unlabelled, so positives have
    none of the other findings and negatives none of them all (NaN counts as not positive)."""
    other = [c for c in others if c != finding and c in manifest.columns]
    if not other:
        return labels
    elsewhere = (manifest[other].to_numpy(dtype=float) == 1).any(axis=1)
    return np.where(elsewhere, np.nan, labels)


def isolation_columns(manifest: pd.DataFrame, findings: list[str]) -> list[str]:
    """The findings an isolated positive must lack: the 12 chest findings present, and those scored."""
    return sorted({c for c in CHEST_FINDINGS if c in manifest.columns} | set(findings))


def box_verified(labels: np.ndarray, manifest: pd.DataFrame) -> np.ndarray:
    """Ablation 1: positives without an expert box (any of box_x0..box_y1 NaN) become unlabelled."""
    missing = [c for c in BOX_COLUMNS if c not in manifest.columns]
    if missing:
        raise InvalidSetting(f"candor: box_verified needs the manifest box columns; '{missing[0]}' is missing "
                         "(use a dataset with boxes, e.g. ms_cxr, or set box_verified=false)")
    has_box = manifest[list(BOX_COLUMNS)].notna().all(axis=1).to_numpy()
    return np.where((labels == 1) & ~has_box, np.nan, labels)


def shuffle_within_groups(labels: np.ndarray, groups: np.ndarray, seed: int, target: str) -> np.ndarray:
    """Shuffled-label control: the labels of each matched group's labelled images permuted
    (seeded per group and task); every group keeps its numbers of positives and negatives."""
    out = labels.copy()
    for group in np.unique(groups):
        rows = np.flatnonzero((groups == group) & ~np.isnan(labels))
        out[rows] = task_rng(seed, group, target, "shuffle").permutation(labels[rows])
    return out


def task_pools(tasks: list[Task], scored: list[bool]) -> list[tuple[Task, list[int], np.ndarray]]:
    """Pools across tasks as (row identity, indices of the scored member tasks, weights of D and
    D_all): the chest findings scored together (at least 2 requested) pooled with
    :data:`SEVERITY_WEIGHTS` ("Reporting"), and each one-vs-rest finding's classes with equal
    weights ("Scope": "D is the unweighted mean over those classes"). Tasks that could not be
    scored (``scored`` False) are left out."""
    pools = []
    for f in dict.fromkeys(t.finding for t in tasks if t.kind != "binary"):
        members = [i for i, t in enumerate(tasks) if t.finding == f and scored[i]]
        pools.append((Task(f, CLASS_MEAN, np.empty(0)), members, np.ones(len(members))))
    chest = [i for i, t in enumerate(tasks) if t.kind == "binary" and t.finding in SEVERITY_WEIGHTS]
    if len(chest) >= 2:
        members = [i for i in chest if scored[i]]
        pools.append((Task(CHEST_POOL, CHEST_POOL, np.empty(0)), members,
                      np.array([SEVERITY_WEIGHTS[tasks[i].finding] for i in members], float)))
    return pools
