"""A pool of datasets as one manifest: one job that spans several sites.

Some of the papers' analyses run on several datasets at once: CANDOR trains its chest heads "on
one sample per domain" (the five chest sites pooled) and scores every combination rule on one
test sample (candor.md, "Discordance and Head Errors", Table 4); its failure-detection study
trains on MIMIC-CXR and tests on the five chest sites; its unmatched-set ablation pools the
candidate sets across sites and views. A ``pool`` dataset is that union: each member is built by
its own adapter on its own folder (``build_manifest``, validated as usual) and the manifests are
stacked.

So that one root serves every member, each member's ``path`` is rewritten relative to the pool's
root (a manifest's paths never leave its root, so every member must lie under the pool's root:
``dataset.root`` is a common parent, ``paths.data_dir`` by default). ``sample_id`` and
``patient_id`` get the member's name as a prefix (``mimic_cxr/<id>``): two sites may reuse an id,
and a patient never spans sites. ``site`` is kept where the member's adapter sets it (every chest
adapter does), else it is the member's name; ``acq_group`` (site x view for chest) is kept, so
CANDOR's matched groups stay per site and view. A ``dataset`` column names the member of each row.

The pool's feature-cache entries are its own (the cache keys on the locators, which carry the
prefixes), so a pooled run embeds its images once more than the per-site runs.
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from ..core.errors import UserError
from . import manifest as mf
from .files import DatasetFileMissing
from .registry import Adapter, get, register

#: Columns whose values are made unique across members by the member's name as a prefix.
PREFIXED = ("sample_id", "patient_id", "slide_id")


class PoolError(UserError, ValueError):
    """A pool's ``members`` option is malformed; the message is one line."""


def _member(entry, i: int) -> tuple[str, Path | None, dict]:
    if isinstance(entry, str):
        entry = {"dataset": entry}
    if not isinstance(entry, dict) or not entry.get("dataset"):
        raise PoolError(f"dataset pool: members[{i}] is {entry!r}; give each member as "
                        "{dataset: <name>, root: <folder>, options: {...}}")
    unknown = set(entry) - {"dataset", "root", "options"}
    if unknown:
        raise PoolError(f"dataset pool: members[{i}] ({entry['dataset']}) has unknown key(s) {sorted(unknown)}; "
                        "a member takes dataset, root and options")
    root = entry.get("root")
    return str(entry["dataset"]), (Path(root) if root is not None else None), dict(entry.get("options") or {})


def build(root: str | Path, members: list | None = None) -> pd.DataFrame:
    """The stacked manifest of ``members`` (see the module docstring), paths relative to ``root``.

    A member's ``root`` may be relative to the pool's ``root``; without one the member is read
    from ``root/<dataset>``. Each member's manifest is validated under its own name; the images
    are checked once, on the pooled paths, by ``build_manifest``."""
    if not members:
        raise PoolError("dataset pool: no members; set dataset.options.members to a list of "
                        "{dataset: <name>, root: <folder>} (configs/dataset/chest_pool.yaml is an example)")
    root = Path(root)
    parts, seen = [], set()
    for i, entry in enumerate(members):
        name, member_root, options = _member(entry, i)
        if name in seen:
            raise PoolError(f"dataset pool: member {name} is listed twice; list each dataset once")
        if name == "pool":
            raise PoolError("dataset pool: a pool cannot contain a pool; list the datasets themselves")
        seen.add(name)
        member_root = member_root if member_root is not None else Path(name)
        if not member_root.is_absolute():
            member_root = root / member_root
        adapter = get(name)
        if not member_root.is_dir():
            raise DatasetFileMissing(f"dataset pool: member {name}'s root '{member_root}' does not exist; "
                                     f"set its root in dataset.options.members")
        df = mf.validate(adapter.build(member_root, **options), source=f"{name}@{member_root}",
                         findings=adapter.findings).copy()
        for col in PREFIXED:
            if col in df.columns:
                df[col] = name + "/" + df[col].astype(str)
        prefix = Path(os.path.relpath(member_root, root))
        if prefix.parts[:1] == ("..",):
            raise PoolError(f"dataset pool: member {name}'s root '{member_root}' is not under the pool's root "
                            f"'{root}'; set dataset.root to a folder holding every member")
        if "path" in df.columns:
            df["path"] = [(prefix / p).as_posix() for p in df["path"]]
        if "site" not in df.columns:
            df["site"] = name
        df.insert(1, "dataset", name)
        parts.append(df)
    pooled = pd.concat(parts, ignore_index=True, sort=False)
    return mf.validate(pooled, source=f"pool@{root}")


register(Adapter(
    name="pool", build=build,
    description="several datasets as one manifest (options.members); ids prefixed by the member's name"))
