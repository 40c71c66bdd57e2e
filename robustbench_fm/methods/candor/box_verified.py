"""CANDOR ablation (1): box-verified positives (candor.md "Ablation Studies" (1); candor_v1.md
"Ablation Studies" (3)).

candor.md: "On the 233 pneumothorax positives with MS-CXR boxes, every encoder has D at or below
0.500. RAD-DINO has D=0.167 on them and 0.184 on all its pneumothorax positives." candor_v1.md:
"On MS-CXR, whose boxes come from the reference pool itself, every encoder stays at or below
chance [...]. On the RSNA arm the queries come from outside the pool, so the context match falls
back across a domain shift and the level inflates for general-purpose encoders."

Our reading (the text is silent on the sets): the queries of an arm are the positives of its
finding that carry an expert box in that pool member (MS-CXR: pneumothorax; RSNA: pneumonia);
the candidate sets are the reference site's (MIMIC-CXR) R+ and R− of the matched group with the
query's view, drawn exactly as the main analysis draws them (:func:`.stage.draw_group`, same
seed and group generator, so they are the main analysis's banks). "All its positives" is the
reference's own query sample against the same sets (the main analysis's D of that site). A query
is never its own neighbour: an MS-CXR query is a MIMIC-CXR image, so the candidate with the same
image file (``path``) is excluded, as the main analysis removes a query from R+.

Run it on a pool (:mod:`robustbench_fm.data.pool`) holding the reference and the arms:
``experiment=candor_ablation_box_verified``. ``summary``: one row per (finding, arm, matched group)
and per (finding, arm) pooled over groups (``acq_group="__pooled__"``): n_queries, bank_size, d
and its patient-clustered bootstrap (d_sd, d_ci_low, d_ci_high). ``arm`` is the query member
(``"<reference>"`` for all its positives); ``per_sample``: sample_id, finding, arm, acq_group,
c_pos, c_neg, dm, discordant.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ...core.devices import resolve_device
from ...core.errors import InvalidSetting
from ...core.neighbors import l2_normalize
from ...core.results import Results
from ...core.stats import cluster_bootstrap_ratio, summarize_bootstrap
from ...data.manifest import BOX_COLUMNS
from .. import missing_column
from .params import BoxVerifiedParams
from .stage import POOLED, draw_group, group_rng, masked_mean_topk

PARAMS = BoxVerifiedParams
PER_SAMPLE_COLUMNS = ["sample_id", "finding", "arm", "acq_group", "c_pos", "c_neg", "dm", "discordant"]


def check_params(**params) -> BoxVerifiedParams:
    return PARAMS.parse(params)


def boxed(manifest: pd.DataFrame) -> np.ndarray:
    """Rows with an expert box (all of box_x0..box_y1 present)."""
    if any(c not in manifest.columns for c in BOX_COLUMNS):
        return np.zeros(len(manifest), bool)
    return manifest[list(BOX_COLUMNS)].notna().all(axis=1).to_numpy()


def run(features: np.ndarray, manifest: pd.DataFrame, finding: str | list[str],
        params: BoxVerifiedParams | None = None, **kw) -> Results:
    """D of each arm's boxed positives and of the reference's own positives against the
    reference's candidate sets (module doc); ``params``: :class:`BoxVerifiedParams`."""
    p = PARAMS.parse(params, **kw)
    findings = [finding] if isinstance(finding, str) else list(finding)
    for col, param in (("dataset", "reference"), (p.match_col, "match_col"), ("acq_group", "reference"),
                       (p.cluster_col, "cluster_col"), *((f, "finding") for f in findings)):
        if col not in manifest.columns:
            if col == "dataset":
                raise InvalidSetting("candor_box_verified: the manifest has no 'dataset' column; run it on a pool "
                                 "of the reference and the arms (dataset=pool, e.g. experiment="
                                 "candor_ablation_box_verified)")
            raise missing_column("candor_box_verified", col, param, manifest.columns)
    member = manifest["dataset"].astype(str).to_numpy()
    if p.reference not in set(member):
        raise InvalidSetting(f"candor_box_verified: stage.params.reference={p.reference} is not a member of the pool "
                         f"(members: {', '.join(sorted(set(member)))}); add it to dataset.options.members")
    feats = torch.as_tensor(l2_normalize(features), device=resolve_device(p.device))
    # one "cluster" per image file: a query never meets its own image among the candidates
    image = pd.factorize(manifest["path"].astype(str) if "path" in manifest.columns
                         else manifest["sample_id"].astype(str))[0]
    patients = manifest[p.cluster_col].astype(str).to_numpy()
    match = manifest[p.match_col].astype(str).to_numpy()
    groups = manifest["acq_group"].astype(str).to_numpy()
    has_box = boxed(manifest)
    sample_ids = manifest["sample_id"].to_numpy()
    rows, per_sample = [], []
    rng = np.random.default_rng(p.seed)
    for f in findings:
        labels = pd.to_numeric(manifest[f], errors="coerce").to_numpy(float)
        arms = [p.reference] + [a["dataset"] for a in p.arms if a["finding"] == f]
        parts = {arm: [] for arm in arms}
        for group in sorted(set(groups[member == p.reference])):
            in_group = (groups == group) & (member == p.reference)
            view = match[in_group][0]
            pos, neg = np.flatnonzero(in_group & (labels == 1)), np.flatnonzero(in_group & (labels == 0))
            n_bank = min(p.bank_size, len(pos), len(neg))
            if n_bank < p.k + 1:
                for arm in arms:
                    rows.append(_row(f, arm, group, p.k, reason=f"fewer than k+1={p.k + 1} positives or negatives "
                                     f"in the reference group ({len(pos)} positives, {len(neg)} negatives)"))
                continue
            own, bank_pos, bank_neg = draw_group(np.flatnonzero(in_group), pos, neg, p.bank_size, p.max_group_sample,
                                                 group_rng(p.seed, group))
            for arm in arms:
                queries = own if arm == p.reference else np.flatnonzero(
                    (member == arm) & (match == view) & (labels == 1) & has_box)
                row = _row(f, arm, group, p.k, bank_size=n_bank)
                rows.append(row)
                if not len(queries):
                    row["reason"] = "no boxed positive in this view" if arm != p.reference else "no positive sampled"
                    continue
                c_pos = masked_mean_topk(feats, queries, bank_pos, p.k, image, block_size=p.block_size)
                c_neg = masked_mean_topk(feats, queries, bank_neg, p.k, image, block_size=p.block_size)
                ok = np.isfinite(c_pos) & np.isfinite(c_neg)
                queries, c_pos, c_neg = queries[ok], c_pos[ok], c_neg[ok]
                disc = (c_neg - c_pos) > 0  # a tie is concordant (candor.md "Chance Level")
                row.update(n_queries=len(queries), d=float(disc.mean()) if len(queries) else np.nan)
                _fill(row, disc, patients[queries], p.n_boot, rng)
                parts[arm].append((queries, disc))
                per_sample.append(pd.DataFrame({
                    "sample_id": sample_ids[queries], "finding": f, "arm": arm, "acq_group": group, "c_pos": c_pos,
                    "c_neg": c_neg, "dm": c_neg - c_pos, "discordant": disc}))
        for arm in arms:
            pooled = _row(f, arm, POOLED, p.k)
            if parts[arm]:
                queries = np.concatenate([q for q, _ in parts[arm]])
                disc = np.concatenate([d for _, d in parts[arm]])
                pooled.update(n_queries=len(queries), d=float(disc.mean()))
                _fill(pooled, disc, patients[queries], p.n_boot, rng)
            else:
                pooled["reason"] = "no query in any matched group of the reference"
            rows.append(pooled)
    per = pd.concat(per_sample, ignore_index=True) if per_sample else pd.DataFrame(columns=PER_SAMPLE_COLUMNS)
    summary = pd.DataFrame(rows)
    summary["bank_size"] = summary["bank_size"].astype("Int64")
    return Results(summary=summary, per_sample=per,
                   params={"finding": finding, **{n: getattr(p, n) for n in PARAMS.names() if n != "block_size"}})


def _row(finding: str, arm: str, group: str, k: int, **values) -> dict:
    row = dict(finding=finding, arm=arm, acq_group=group, n_queries=0, bank_size=pd.NA, k=k, d=np.nan,
               d_sd=np.nan, d_ci_low=np.nan, d_ci_high=np.nan, reason="")
    row.update(values)
    return row


def _fill(row: dict, disc: np.ndarray, patients: np.ndarray, n_boot: int, rng: np.random.Generator) -> None:
    """± and 95% interval of D from patient-clustered resamples with the sets fixed ("Reporting")."""
    if n_boot and len(disc):
        ci = summarize_bootstrap(cluster_bootstrap_ratio(disc.astype(float), np.ones(len(disc)), patients,
                                                         n_boot, rng))
        row.update(d_sd=ci["sd"], d_ci_low=ci["ci_low"], d_ci_high=ci["ci_high"])
