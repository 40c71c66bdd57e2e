"""The confounder scan (issue 55 items 3-4): how strongly an encoder's k-nearest-neighbour graph is
organised by each manifest column (site, scanner, view, sex, age bins, ... and the findings beside them).

**The graph.** Every image's k most similar images (cosine similarity of L2-normalised features, exact:
one symmetric pass of :mod:`robustbench_fm.core.neighbors`, each tile on or above the diagonal computed
once and serving its rows and, transposed, its columns), the image itself and, with ``exclude_patient``
(default), every image of its own patient left out before the top-k (:class:`~robustbench_fm.core.
neighbors.SameGroupMask`, as CRoMa leaves out the anchor's slide, croma_conventions.md A.3). The graph is
computed once per encoder and read for every column (:func:`neighbour_graph`).

**The score of a column.** Query i (an image with a value v_i of the column; binned for a numeric column
with more than ``max_values`` values) has share s_i = #{neighbours j with v_j = v_i} / k. Under random
neighbours, k images drawn from the same candidates the graph drew from (every image but i and, with
``exclude_patient``, but i's patient p), the expected share is exactly

    c_i = (n_{v_i} − n_{p, v_i}) / (N − n_p)

with N the images, n_v the images of value v, n_p those of patient p and n_{p, v} those of p with value v
(i included in both; without ``exclude_patient`` n_p = n_{p,v} = 1). Images without a value are
candidates (a neighbour without a value shares nothing) but not queries. When every patient has one
image and every image a value, the mean of c_i over the queries is the closed form
Σ_v n_v (n_v − 1) / (N (N − 1)) (:func:`closed_form_chance`; tested). The column's ``observed`` is the
mean s_i, its ``chance`` the mean c_i and its ``score``

    score = (observed − chance) / (1 − chance) = Σ_i (s_i − c_i) / Σ_i (1 − c_i)

0 at chance, 1 when every neighbour shares the query's value (negative when neighbours avoid it). Its 95%
interval is the percentile interval of ``n_boot`` patient-clustered bootstrap resamples of that ratio
(:mod:`robustbench_fm.core.stats`; none from fewer than :data:`~robustbench_fm.core.stats.MIN_CLUSTERS`
patients, the row's ``note`` says so), each patient resampled in both roles: as queries, and as the other
queries' neighbours (:func:`neighbour_role`: its images taken out of the graph, the next nearest take their
places; kept per half of the queries' patients, ``core.stats.paired_bootstrap``'s ``bank``, docs/comparisons.md
"Both roles of a patient"). On columns of random values (300 images of 150 patients, k = 10, random 16-d
features, 200 draws; uniform over 3 values per image, per patient, and skewed 0.7 / 0.2 / 0.1) the 95%
interval covers 0 in 0.95, 0.97 and 1.00 of draws (the mean score 0.000, sd 0.018, in each; with the graph
held fixed it covered 0.83, 0.79 and 0.94).

**Where it reduces to RI.** For a label column L and a confounder column C (a two-centre, two-label
pathology cohort, patients = slides), a neighbour of the same label and another centre is CRoMa's SO
pair and one of another label and the same centre its OS pair (croma_conventions.md A.2), so with
s_L, s_C and s_LC the observed shares of L, C and the joint column L × C,

    RI = Σ n_SO / Σ (n_SO + n_OS) = (s_L − s_LC) / (s_L + s_C − 2 s_LC)

CRoMa's pooled RI at k (croma.md §2.4; conventions A.4) and PathoROB's robustness index (the same
pooled ratio of SO to SO + OS counts over the k nearest other-slide neighbours). :func:`robustness_index`
computes it from a scan; the tests check it against croma 1.0.1 and the croma stage.

**Per-item table** (``per_sample``): one row per (column, query): ``finding`` (the column), ``sample_id``,
``cluster`` (its patient), ``value``, ``share`` (s_i), ``chance`` (c_i), ``excess`` = s_i − c_i and
``headroom`` = 1 − c_i (and ``excess_bank_0`` / ``_1``, the query's share of its patient's neighbour role), so
the score is the ``ratio`` Σ excess / Σ headroom that
:mod:`robustbench_fm.report.comparisons` recomputes from it (declared not compared: a query's share
depends on the other images through the graph, as RI's counts do).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ...core.devices import resolve_device
from ...core.errors import InvalidSetting
from ...core.neighbors import RunningTopK, SameGroupMask, Transposer, l2_normalize, means_without_each, symmetric_tiles
from ...core.results import Results
from ...core.stats import cluster_halves, few_clusters, paired_bootstrap, summarize_bootstrap
from ...data.manifest import BOX_COLUMNS, SOURCE_COLUMN
from .. import missing_column
from .params import ConfounderParams

PARAMS = ConfounderParams

#: columns that name an image, a file or a patient, never scanned by default (nor any ``*_id`` column)
ID_COLUMNS = ("sample_id", "patient_id", "slide_id", "path", "study_id", "image_id", "series_id", "id",
              SOURCE_COLUMN)  # the CSV row a manifest row came from (dataset=csv)
#: the summary's columns, in order
SUMMARY_COLUMNS = ["finding", "column", "kind", "binning", "n_values", "k", "n", "n_clusters", "observed", "chance",
                   "score", "score_sd", "score_ci_low", "score_ci_high", "note", "reason"]
#: the per-item table's columns, in order
ITEM_COLUMNS = ["finding", "sample_id", "cluster", "value", "share", "chance", "excess", "headroom", "excess_bank_0",
                "excess_bank_1"]


def is_id(column: str) -> bool:
    """A column that names an image, file or patient (:data:`ID_COLUMNS`, or ending in ``_id``)."""
    return column in ID_COLUMNS or column.endswith("_id")


def encode(series: pd.Series, max_values: int, bins: int) -> tuple[np.ndarray, list[str], str, str]:
    """(codes with −1 for a missing value, the values' labels, how it was binned, why it cannot be
    scanned) of one column: its distinct values as they are when there are 2 to ``max_values``; a numeric
    column with more, ``bins`` quantile bins (``pd.qcut``, fewer where quantiles tie: stated); a text
    column with more, or one with fewer than 2 values, not scanned (the reason)."""
    present = series.dropna()
    present = present[present.astype(str).str.strip() != ""]
    distinct = present.nunique()
    none = np.full(len(series), -1, np.int64)
    if distinct < 2:
        what = "no value" if distinct == 0 else f"one value ('{present.iloc[0]}')"
        return none, [], "", f"{what}: nothing to compare"
    keep = series.index.isin(present.index)
    if distinct <= max_values:
        values = series.where(keep)
        if values.dtype == object:  # mixed types do not sort: their text does
            values = values.map(lambda v: v if pd.isna(v) else str(v))
        codes, labels = pd.factorize(values, sort=True)
        return codes.astype(np.int64), [str(v) for v in labels], "", ""
    numeric = pd.to_numeric(present, errors="coerce")
    if numeric.isna().any():
        return none, [], "", (f"{distinct} distinct values, not all numbers (more than max_values={max_values}): an "
                              "identifier or free text; raise stage.params.max_values to scan it as categories")
    binned, edges = pd.qcut(pd.to_numeric(series.where(keep), errors="coerce"), bins, duplicates="drop",
                            retbins=True)
    if len(edges) < 3:
        return none, [], "", f"{distinct} values but one quantile bin: nothing to compare"
    labels = [f"[{lo:.4g}, {hi:.4g}]" if i == 0 else f"({lo:.4g}, {hi:.4g}]"
              for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:]))]
    binning = (f"{len(labels)} quantile bins of {distinct} values, edges {', '.join(f'{e:.4g}' for e in edges)}"
               + (f" (fewer than bins={bins}: quantiles tie)" if len(labels) < bins else ""))
    return binned.cat.codes.to_numpy().astype(np.int64), labels, binning, ""


def closed_form_chance(counts) -> float:
    """Σ_v n_v (n_v − 1) / (N (N − 1)): the chance that a random other image shares a random image's
    value, with ``counts`` the images of each value (N their sum): the scan's chance when every image
    has a value and every patient one image (module doc)."""
    n = np.asarray(counts, np.float64)
    total = n.sum()
    return float((n * (n - 1)).sum() / (total * (total - 1)))


def chance_levels(codes: np.ndarray, patients: np.ndarray | None) -> np.ndarray:
    """c_i = (n_{v_i} − n_{p_i, v_i}) / (N − n_{p_i}) for every image with a value (NaN without): the
    expected share of neighbours sharing its value when they are drawn at random from the images of other
    patients (``patients`` integer codes; None: only the image itself is left out, n_p = n_{p,v} = 1)."""
    codes = np.asarray(codes, np.int64)
    n = len(codes)
    has = codes >= 0
    out = np.full(n, np.nan)
    if not has.any():
        return out
    per_value = np.bincount(codes[has], minlength=int(codes.max()) + 1).astype(np.float64)
    if patients is None:
        same_patient = same_patient_value = np.ones(n)
    else:
        patients = np.asarray(patients, np.int64)
        same_patient = np.bincount(patients)[patients].astype(np.float64)
        joint = patients * (int(codes.max()) + 1) + np.maximum(codes, 0)
        _, inverse, counts = np.unique(joint[has], return_inverse=True, return_counts=True)
        same_patient_value = np.ones(n)
        same_patient_value[has] = counts[inverse]
    with np.errstate(invalid="ignore", divide="ignore"):
        out[has] = (per_value[codes[has]] - same_patient_value[has]) / (n - same_patient[has])
    return out


def shares(codes: np.ndarray, neighbours: np.ndarray) -> np.ndarray:
    """s_i: the share of each image's neighbours (rows of ``neighbours``) that share its value (NaN for
    an image without one; a neighbour without a value shares nothing)."""
    codes = np.asarray(codes, np.int64)
    same = codes[neighbours] == codes[:, None]
    return np.where(codes >= 0, same.mean(axis=1), np.nan)


def robustness_index(share_label: float, share_confounder: float, share_joint: float) -> float:
    """CRoMa's pooled RI at k (croma.md §2.4; croma_conventions.md A.4) and PathoROB's robustness index,
    Σ n_SO / Σ (n_SO + n_OS), from a scan of the label column, the confounder column and their joint
    column (label × confounder) on the same graph (patients = the slides CRoMa leaves out):
    (s_L − s_LC) / (s_L + s_C − 2 s_LC), the ``observed`` shares (module doc); 0.5 without a typed
    neighbour, as croma 1.0.1 returns."""
    so, os_ = share_label - share_joint, share_confounder - share_joint
    return float(so / (so + os_)) if so + os_ > 0 else 0.5


def patient_codes(manifest: pd.DataFrame, cluster_col: str) -> tuple[np.ndarray, np.ndarray]:
    """(each image's patient code, the patient ids): ``cluster_col``, or each image its own patient
    (its ``sample_id``) where the manifest has no such column."""
    ids = manifest[cluster_col] if cluster_col in manifest.columns else manifest["sample_id"]
    codes, uniques = pd.factorize(ids.astype(str), sort=True)
    return codes.astype(np.int64), np.asarray(uniques)


def check_k(manifest: pd.DataFrame, k: int, cluster_col: str, exclude_patient: bool) -> None:
    """Refuse a k larger than some image's candidates (the other images, of other patients with
    ``exclude_patient``), naming that patient and the fix."""
    n = len(manifest)
    if exclude_patient and cluster_col in manifest.columns:
        sizes = manifest[cluster_col].astype(str).value_counts()
        patient, biggest = sizes.index[0], int(sizes.iloc[0])
        if n - biggest < k:
            raise InvalidSetting(f"confounders: k={k} but the images of {cluster_col} '{patient}' have only "
                                 f"{n - biggest} images of other patients to be their neighbours; lower stage.params.k "
                                 "or set stage.params.exclude_patient=false")
    elif n - 1 < k:
        raise InvalidSetting(f"confounders: k={k} but the manifest has {n} images ({n - 1} neighbours each); lower "
                             "stage.params.k")


def neighbour_graph(features, patients: np.ndarray | None, k: int, device="auto", block_size: int = 4096,
                    width: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(indices [N, k], cosine similarities [N, k], most similar first) of every row's k nearest other
    rows, exact: the rows are L2-normalised (:func:`~robustbench_fm.core.neighbors.l2_normalize`; float64
    stays float64), ordered by patient, and one symmetric pass of ``block_size`` tiles
    (:func:`~robustbench_fm.core.neighbors.symmetric_tiles`) feeds running top-k lists
    (:class:`~robustbench_fm.core.neighbors.RunningTopK`) after the row itself and, where ``patients``
    (integer codes) is given, every row of its patient is masked
    (:class:`~robustbench_fm.core.neighbors.SameGroupMask`). Ties between equal similarities go as
    ``torch.topk`` breaks them (reproducible run to run). ``width`` > k: that many nearest are kept (the
    neighbours a patient's removal brings in, :func:`run`'s bank role), −inf similarity past a row's
    candidates; the first k are the graph."""
    x = l2_normalize(features.cpu().numpy() if isinstance(features, torch.Tensor) else features,
                     "confounders: features", dtype=None)
    n = len(x)
    order = np.argsort(patients, kind="stable") if patients is not None else np.arange(n)
    feats = torch.as_tensor(x[order]).to(resolve_device(device))
    mask = SameGroupMask(np.asarray(patients)[order]) if patients is not None else None
    best = RunningTopK(n, max(k, width), feats, filled=True)
    transposed = Transposer()  # the rows b0:b1 of a tile, read contiguously by their top-k
    for a0, a1, b0, b1, sims in symmetric_tiles(feats, block_size):
        if mask is not None:
            mask.apply(sims, a0, a1, b0, b1)  # the row's patient, the row itself included
        elif a0 == b0:
            sims.fill_diagonal_(float("-inf"))
        best.update(a0, sims, b0)
        if a0 != b0:
            best.update(b0, transposed(sims), a0)
    values, idx = best.result()
    values, idx = values.double().cpu().numpy(), idx.cpu().numpy()
    if not np.isfinite(values[:, :k]).all():
        raise InvalidSetting(f"confounders: k={k} exceeds the neighbours some image has; lower stage.params.k")
    out_idx, out_sim = np.empty_like(idx), np.empty_like(values)
    out_idx[order], out_sim[order] = order[idx], values
    return out_idx, out_sim


def scan_columns(manifest: pd.DataFrame, findings: list[str], p: ConfounderParams) -> list[tuple[str, str]]:
    """(column, kind) to scan: ``p.columns`` (each must exist) or every default column (:func:`is_id`,
    boxes and ``cluster_col`` left out; module doc), then the findings not among them; kind ``finding``
    for a finding, else ``metadata``."""
    for col in p.columns:
        if col not in manifest.columns:
            raise missing_column("confounders", col, "columns", manifest.columns)
    for col in findings:
        if col not in manifest.columns:
            raise missing_column("confounders", col, "finding", manifest.columns)
    chosen = list(p.columns) or [str(c) for c in manifest.columns
                                 if not is_id(str(c)) and c not in BOX_COLUMNS and c != p.cluster_col]
    # (a default column of a single value is left out by run, recorded in params' columns_constant)
    chosen = list(dict.fromkeys([*chosen, *findings]))
    return [(c, "finding" if c in findings else "metadata") for c in chosen]


def metadata_columns(manifest: pd.DataFrame, findings) -> list[str]:
    """The default columns besides ``findings`` a scan with default parameters would score: those
    :func:`scan_columns` chooses that hold two or more distinct values (what a run's ``report.scan: auto``
    asks before it scans)."""
    findings = [str(f) for f in findings or ()]
    return [c for c, kind in scan_columns(manifest, findings, PARAMS()) if kind == "metadata"
            and manifest[c].dropna().nunique() >= 2]


def check_manifest(manifest: pd.DataFrame, findings, params: ConfounderParams | None = None, **kw) -> None:
    """Before any image is embedded: the named columns and findings exist and k leaves every image
    enough candidates (one line each)."""
    p = PARAMS.parse(params, **kw)
    scan_columns(manifest, [str(f) for f in findings or ()], p)
    check_k(manifest, p.k, p.cluster_col, p.exclude_patient)


def _findings(finding) -> list[str]:
    if finding is None:
        return []
    return [str(finding)] if isinstance(finding, str) else [str(f) for f in finding]


def run(features, manifest: pd.DataFrame, finding=None, params: ConfounderParams | None = None,
        **kw) -> Results:
    """Scan every chosen column of ``manifest`` (module doc) on the kNN graph of ``features`` (rows
    aligned with it). ``finding``: the finding columns (a name or a list; the command line passes the
    dataset's findings), scanned beside ``columns``. Returns one summary row per column
    (:data:`SUMMARY_COLUMNS`: ``finding`` and ``column`` both name it; a column that cannot be scanned has a
    ``reason``) and the per-item table (:data:`ITEM_COLUMNS`)."""
    p = PARAMS.parse(params, **kw)
    findings = _findings(finding)
    manifest = manifest.reset_index(drop=True)
    columns = scan_columns(manifest, findings, p)
    check_k(manifest, p.k, p.cluster_col, p.exclude_patient)
    patients, patient_ids = patient_codes(manifest, p.cluster_col)
    excluded = patients if p.exclude_patient else None
    width = p.k + int(np.bincount(patients).max())  # enough for any one patient's images to leave a row's k
    wide, sims = neighbour_graph(features, excluded, p.k, p.device, p.block_size, width)
    neighbours, alive = wide[:, :p.k], np.isfinite(sims)
    halves = cluster_halves(patient_ids[patients])
    rows, items, scored, constant = [], [], [], []
    for col, kind in columns:
        codes, labels, binning, reason = encode(manifest[col], p.max_values, p.bins)
        if reason and not labels and col not in p.columns and kind != "finding" \
                and manifest[col].dropna().nunique() < 2:
            constant.append(col)  # a default column of one value (e.g. csv's acq_group 'all'): nothing to say
            continue
        row = dict(finding=col, column=col, kind=kind, binning=binning, n_values=len(labels), k=p.k, n=0,
                   n_clusters=0, observed=np.nan, chance=np.nan, score=np.nan, score_sd=np.nan,
                   score_ci_low=np.nan, score_ci_high=np.nan, note="", reason=reason)
        rows.append(row)
        if reason:
            continue
        query = np.flatnonzero(codes >= 0)
        share = shares(codes, neighbours)[query]
        chance = chance_levels(codes, excluded)[query]
        present = np.unique(codes[query])
        row.update(n_values=len(present), n=len(query), n_clusters=len(np.unique(patients[query])),
                   observed=float(share.mean()), chance=float(chance.mean()),
                   score=float((share - chance).sum() / (1 - chance).sum()))
        bank = neighbour_role(codes, wide, alive, patients, halves, query, p.k)
        items.append(pd.DataFrame({"finding": col, "sample_id": manifest["sample_id"].to_numpy()[query],
                                   "cluster": patient_ids[patients[query]], "value": np.asarray(labels)[codes[query]],
                                   "share": share, "chance": chance, "excess": share - chance,
                                   "headroom": 1.0 - chance, "excess_bank_0": bank[0], "excess_bank_1": bank[1]}))
        scored.append((row, patient_ids[patients[query]], share - chance, 1.0 - chance, bank))
    _intervals(scored, p)
    summary = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    per_sample = pd.concat(items, ignore_index=True) if items else pd.DataFrame(columns=ITEM_COLUMNS)
    return Results(summary=summary, per_sample=per_sample[ITEM_COLUMNS],
                   params={**p.to_dict(), "findings": findings, "columns_scanned": [r["column"] for r in rows],
                           "columns_constant": constant})


def neighbour_role(codes: np.ndarray, wide: np.ndarray, alive: np.ndarray, patients: np.ndarray,
                   halves: np.ndarray, query: np.ndarray, k: int) -> np.ndarray:
    """Each query's share of its patient's role as the other queries' neighbour on their summed excess
    (docs/comparisons.md "Both roles of a patient"): for every query i and every other patient p among
    its k nearest, its share s_i once p's images have left the graph (the next nearest take their
    places: :func:`~robustbench_fm.core.neighbors.means_without_each` over the ``wide`` graph), and
    Δ_p = Σ_i (s_i − s_i^(−p)) per half of the queries' patients (``halves``), shared out over p's
    queries: (2, len(query)). The chance levels' dependence on the other patients is left out (a
    smooth function of the value counts, O(1/N) per patient)."""
    same = (codes[wide[query]] == codes[query][:, None]).astype(np.float64)
    own = patients[query]
    _, at, who, without = means_without_each(same, patients[wide[query]], alive[query], k, own)
    share = same[:, :k].mean(axis=1)
    shift = np.where(np.isfinite(without), share[at] - without, 0.0)
    n_clusters = int(patients.max()) + 1
    half = halves[query][at]
    per = np.stack([np.bincount(who, weights=np.where(half == h, shift, 0.0), minlength=n_clusters) for h in (0, 1)])
    n_items = np.bincount(own, minlength=n_clusters)
    return per[:, own] / n_items[own]


def _intervals(scored: list[tuple], p: ConfounderParams) -> None:
    """Each scored row's patient-clustered bootstrap interval of Σ excess / Σ headroom (in place), the
    patients resampled in both roles: as queries and as the other queries' neighbours
    (:func:`robustbench_fm.core.stats.paired_bootstrap` ``bank``, from :func:`neighbour_role`); seeded
    by ``seed`` (the same resamples for every encoder of the same items); fewer than MIN_CLUSTERS
    patients: a note."""
    for row, clusters, excess, headroom, bank in scored:
        note = few_clusters(row["n_clusters"], p.cluster_col)
        if note:
            row["note"] = note
        elif p.n_boot:
            _, reps = paired_bootstrap("ratio", excess[None], clusters, p.n_boot, p.seed, other=headroom[None],
                                       bank=(bank[0][None], bank[1][None]))
            ci = summarize_bootstrap(reps[:, 0])
            row.update(score_sd=ci["sd"], score_ci_low=ci["ci_low"], score_ci_high=ci["ci_high"])
