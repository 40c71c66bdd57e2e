"""CANDOR (candor.md, arXiv v4) paper tables from a finished sweep.

* :func:`candor_table2`: Table 2, the chest encoders on MIMIC-CXR + CheXpert: Params (M), head
  AUROC, margin AUROC, D, D_all, retention (``experiment=chest_candor``);
* :func:`candor_chest_queries`: the positive queries of that analysis beside the paper's 22,133;
* :func:`candor_table3`: Table 3, D of every encoder on the 7 tasks outside chest radiography and
  the task-level rows (positive queries, ΔJ, Sig. (%), r, Conf.) (``experiment=candor_domains``);
  ΔJ and Sig. from one overlap test per encoder pair and class (:func:`table3_overlaps`);
* :func:`candor_calibration`: Figure 2a's numbers, D and D_all of the planted references against
  the prevalence and the number of positives (``experiment=candor_calibration``);
* :func:`candor_ablation`: one ablation of "Ablation Studies", whichever setting the sweep varied
  (``experiment=candor_ablation_<x>``): D per encoder and setting, and per setting the median D
  over the (encoder, finding) combinations, the largest change of an encoder's D and the Spearman
  correlation of the encoder ranking with the paper's default setting;
* :func:`candor_associations`: the chest rank and slope tests of the text, BH-corrected;
* :func:`candor_chest_overlap`: the chest encoder pairs' discordant-set overlaps ("655 of the 660
  chest pairs" above chance, 606 after FDR; candor_v1.md Table 3's chest ΔJ and Sig.).

Rates follow candor.md "Reporting": a chest rate is pooled over sites (here: datasets, and within
a dataset its matched groups) by the number of queries, then over the 12 findings by the
severity-weighted mean; a chest AUROC is the mean over the findings. A one-vs-rest task (CUB,
FGVC Aircraft: ``finding`` the class column, e.g. ``bio_label``) has one row per class in
``target`` (binary tasks: target = finding); a class is pooled over sites like a finding, and the
task's D is the unweighted mean over its classes (the stage's ``target="__mean__"`` row). Rows
pooled across tasks by the stage (``__chest__``, ``__mean__``) are recomputed here, never read
(pooling over sites has to come first). Columns of other stages
(``linear_head`` ``auroc``, ``retention`` ``retention``, ``logme`` ``logme``, ``error_detection``
``auroc`` of methods ``impurity`` and ``msp``) are read by name; a stage that did not run leaves NaN cells.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ... import encoders
from ...core.tables import PaperTable, SweepResults
from ...data.manifest import CHEST_FINDINGS
from ...paper.published import aliases, text_numbers
from .params import CandorParams
from .ranks import MIN_TEST_N, association_family, spearman
from .sets import overlap_summary, pairwise_overlaps
from .tasks import SEVERITY_WEIGHTS

TABLES = ["candor_table2", "candor_chest_queries", "candor_table3", "candor_calibration", "candor_ablation",
          "candor_associations", "candor_chest_overlap"]

POOLED = "__pooled__"  # stages/candor.py: the row pooling a task's matched groups
#: stages/candor.py rows pooled across tasks (candor_tasks.CHEST_POOL, CLASS_MEAN) start with this
POOL_PREFIX = "__"
ALL_STRATA = "__all__"  # stages/error_detection.py: the stratum of all test rows
#: the Objective column of Table 2 (the paper's labels; encoders outside the paper: what they are)
OBJECTIVE_LABELS = {"ssl": "SSL", "image-text": "I-T", "supervised": "Sup.", "none": "random init",
                    "synthetic": "synthetic (calibration)"}
#: chest datasets as the paper names them (Table 2's caption names the datasets a sweep ran)
DATASET_NAMES = {"mimic_cxr": "MIMIC-CXR", "chexpert": "CheXpert", "padchest": "PadChest", "vindr_cxr": "VinDr-CXR",
                 "vindr_pcxr": "VinDr-PCXR", "openi": "Open-I", "nih_cxr14": "NIH ChestX-ray14",
                 "rsna_pneumonia": "RSNA", "ms_cxr": "MS-CXR"}
CHEST_SPECIALISTS = ("rad_dino", "densenet121_xrv", "biomedclip")
#: Table 3 columns: the (dataset, finding) sources of each task; finding None = every class of a
#: natural-image dataset (D is then the unweighted mean over the classes, candor.md "Scope").
TASKS = {
    "Tumor": [("nct_crc", "tumour"), ("pcam", "tumour")],
    "Aircraft": [("fgvc_aircraft", None)],
    "Birds": [("cub", None)],
    "Retinopathy": [("fairvision", "referable_dr"), ("aptos", "referable_dr"), ("messidor2", "referable_dr"),
                    ("idrid", "referable_dr")],
    "Skin": [("fitzpatrick17k", "malignant"), ("isic2019", "malignant"), ("ddi", "malignant")],
    "Glaucoma": [("fairvision", "glaucoma")],
    "Mammogram": [("vindr_mammo", "mass_or_calcification")],
}
#: Table 3 shows a domain specialist only on its own tasks (chest specialists not at all);
#: general-purpose and untrained encoders on every task.
SPECIALIST_TASKS = {
    **{e: ("Tumor",) for e in ("phikon_v2", "uni", "uni2_h", "virchow", "virchow2", "prov_gigapath", "conch")},
    "retfound": ("Retinopathy", "Glaucoma"), "flair": ("Retinopathy", "Glaucoma"),
    "monet": ("Skin",), "dermlip": ("Skin",), **{e: () for e in CHEST_SPECIALISTS}}
#: error_detection ``method`` of Table 3's last two rows: AUROC of r (neighbourhood impurity) and of
#: confidence (maximum softmax probability) for detecting the head's errors
ERROR_DETECTION_METHODS = {"r": "impurity", "Conf.": "msp"}
#: settings an ablation may sweep (config path) and the paper's value of each (candor.md
#: "Implementation", "Ablation Studies"): the stage's from its parameters (:class:`CandorParams`);
#: ``ablation.image_size`` selects the stored copies.
ABLATION_SETTINGS = {
    **{f"stage.params.{n}": getattr(CandorParams, n) for n in ("k", "bank_size", "seed", "exclude_patient",
                                                               "unmatched")},
    "encoder.embedding": "cls", "ablation.image_size": 224,
    **{f"stage.params.{n}": getattr(CandorParams, n) for n in ("isolated", "box_verified", "queries")}}


def paper_names() -> dict[str, str]:
    """Registry name -> CANDOR's printed encoder name, in the paper's order (published/aliases.csv)."""

    return aliases().get("candor", {})


def paper_name(encoder: str) -> str:
    return paper_names().get(encoder, encoder)


def _spec(encoder: str):

    try:
        return encoders.get(encoder)
    except KeyError:
        return None


def _stage_rows(results: SweepResults, stage: str, columns: list[str]) -> pd.DataFrame:
    """Summary rows of ``stage`` (its pooled rows where it has matched groups); empty with
    ``columns`` when the stage did not run."""
    rows = results.summaries(stage)
    if rows.empty:
        return pd.DataFrame(columns=["job", "encoder", "dataset", "finding", *columns])
    if "acq_group" in rows.columns:
        rows = rows[rows["acq_group"].astype(str) == POOLED]
    for col in columns:
        if col not in rows.columns:
            rows[col] = np.nan
    return rows.reset_index(drop=True)


def _weighted(values: pd.Series, weights: pd.Series) -> float:
    keep = values.notna() & weights.notna() & (weights > 0)
    return float(np.average(values[keep], weights=weights[keep])) if keep.any() else np.nan


def pool_sites(rows: pd.DataFrame, by: list[str], metrics: list[str], weight: str = "n_queries") -> pd.DataFrame:
    """Pool rows over datasets (sites) per ``by`` + finding (+ ``target``, the one-vs-rest class,
    where the rows have it): each metric weighted by ``weight`` (ratio of sums for rates); counts
    (``n_queries``, ``n_pos``) summed."""
    keys = [*by, "finding", *(["target"] if "target" in rows.columns and "target" not in by else [])]
    out = []
    for key, part in rows.groupby(keys, sort=True, dropna=False):
        w = part[weight].astype(float) if weight in part.columns and part[weight].notna().any() \
            else pd.Series(1.0, index=part.index)
        rec = dict(zip(keys, key))
        rec.update({m: _weighted(part[m].astype(float), w) for m in metrics})
        for count in ("n_queries", "n_pos"):
            if count in part.columns:
                rec[count] = float(part[count].sum())
        out.append(rec)
    return pd.DataFrame(out, columns=[*keys, *metrics, "n_queries", "n_pos"])


def chest_rate(per_finding: pd.DataFrame, by: list[str], rates: list[str], aurocs: list[str]) -> pd.DataFrame:
    """Over the 12 chest findings: ``rates`` by the severity-weighted mean, ``aurocs`` by the plain
    mean (candor.md "Reporting"); findings outside the 12 are left out."""
    chest = per_finding[per_finding["finding"].isin(CHEST_FINDINGS)]
    weights = chest["finding"].map(SEVERITY_WEIGHTS).astype(float)
    out = []
    for key, part in chest.groupby(by, sort=True, dropna=False):
        rec = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        rec.update({r: _weighted(part[r].astype(float), weights[part.index]) for r in rates})
        rec.update({a: float(part[a].astype(float).mean()) for a in aurocs})
        out.append(rec)
    return pd.DataFrame(out, columns=[*by, *rates, *aurocs])


def with_target(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows with ``finding`` (the stage's finding column, e.g. ``bio_label``) and ``target`` (the
    task's positive class: the one-vs-rest class, or the finding itself for a binary task and for
    rows without a target, e.g. other stages' or older results), both as strings."""
    if rows.empty and "finding" not in rows.columns:
        return rows.assign(target=pd.Series(dtype=str))
    finding = rows["finding"].astype(str)
    if "target" not in rows.columns:
        return rows.assign(finding=finding, target=finding)
    target = rows["target"].astype("string")
    return rows.assign(finding=finding,
                       target=target.where(target.notna() & (target != ""), finding).astype(str))


def is_pool(rows: pd.DataFrame) -> pd.Series:
    """Rows the stage pooled across tasks: the severity-weighted chest row (finding ``__chest__``)
    and a one-vs-rest finding's unweighted mean over classes (target ``__mean__``)."""
    out = rows["finding"].astype(str).str.startswith(POOL_PREFIX)
    if "target" in rows.columns:
        out |= rows["target"].astype(str).str.startswith(POOL_PREFIX)
    return out


def _candor_rows(results: SweepResults) -> pd.DataFrame:
    """CANDOR's pooled-over-groups rows of single tasks (one per finding or one-vs-rest class and
    dataset), with ``target``; the stage's pools across tasks are left out."""
    rows = with_target(_stage_rows(results, "candor", ["n_queries", "n_pos", "n_neg", "d", "d_ci_low", "d_ci_high",
                                                       "d_all", "margin_auroc"]))
    return rows[~is_pool(rows)].reset_index(drop=True)


def _chest_panel(results: SweepResults) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per (encoder, finding) and per encoder: D, D_all, margin AUROC, head AUROC, retention,
    LogME, pooled over the chest datasets of the sweep."""
    cand = pool_sites(_candor_rows(results), ["encoder"], ["d", "d_all", "margin_auroc"])
    head = pool_sites(_stage_rows(results, "linear_head", ["auroc", "n"]), ["encoder"], ["auroc"], weight="n")
    logme = pool_sites(_stage_rows(results, "logme", ["logme", "n"]), ["encoder"], ["logme"], weight="n")
    combos = cand.merge(head[["encoder", "finding", "auroc"]].rename(columns={"auroc": "head_auroc"}),
                        on=["encoder", "finding"], how="left")
    combos = combos.merge(logme[["encoder", "finding", "logme"]], on=["encoder", "finding"], how="left")
    encoders = chest_rate(combos, ["encoder"], ["d", "d_all"], ["margin_auroc", "head_auroc"])
    retention = chest_retention(results).set_index("encoder")
    for col in ("retention", "retention_std"):  # raw and standardised (rho - c) / (1 - c)
        encoders[col] = encoders["encoder"].map(retention[col])
    logme_mean = combos.groupby("encoder")["logme"].mean()
    encoders["logme"] = encoders["encoder"].map(logme_mean)
    return combos, encoders


#: retention's row of all its findings' boxed positives (methods/candor/retention.py POOLED)
RETENTION_POOL = "pooled"
#: 1 − c at or below this leaves the standardised retention undefined (retention.MIN_SPREAD)
RETENTION_MIN_SPREAD = 1e-6


def chest_retention(results: SweepResults) -> pd.DataFrame:
    """Per encoder: ``retention``, ``c`` and ``retention_std`` = (retention − c)/(1 − c) with one c per
    encoder and domain (candor.md "Occlusion Retention and Discordance": "Chest retention is the
    mean over the boxed pneumothorax and pneumonia positives", standardised with "c ... the mean
    cosine similarity of random pairs of the boxed images").

    A job's retention is its row over all its findings' boxed positives (``pooled``; a job of one
    finding: that row); never a mix of its findings' rows. The jobs of an encoder (the sweep runs
    the same sources once per dataset) are averaged by their number of positives, ``c`` alike, and
    the standardised retention is computed from those two means; rows without ``c`` (older results)
    keep their own ``retention_std``."""
    rows = _stage_rows(results, "retention", ["retention", "retention_std", "c", "n"])
    out = []
    for (encoder, _), part in rows.groupby(["encoder", "job"], sort=True):
        pool = part[part["finding"].astype(str) == RETENTION_POOL]
        out.append((pool if len(pool) else part).assign(encoder=encoder))
    if not out:
        return pd.DataFrame(columns=["encoder", "retention", "c", "retention_std"])
    rows = pd.concat(out, ignore_index=True)
    records = []
    for encoder, part in rows.groupby("encoder", sort=True):
        n = part["n"].astype(float).fillna(1.0)
        retention, c = _weighted(part["retention"].astype(float), n), _weighted(part["c"].astype(float), n)
        if np.isfinite(c):
            std = (retention - c) / (1 - c) if 1 - c > RETENTION_MIN_SPREAD else np.nan
        else:
            std = _weighted(part["retention_std"].astype(float), n)
        records.append(dict(encoder=encoder, retention=retention, c=c, retention_std=std))
    return pd.DataFrame(records)


def _section(encoder: str) -> int:
    """Table 2's blocks: chest specialists, general-purpose, untrained; synthetic references last."""
    spec = _spec(encoder)
    if encoder in CHEST_SPECIALISTS:
        return 0
    return {"none": 2, "synthetic": 3}.get(spec.objective, 1) if spec is not None else 1


def _dataset_list(datasets) -> str:
    """``MIMIC-CXR and CheXpert``, ``CheXpert``, ``A, B and C`` (paper names where known)."""
    names = [DATASET_NAMES.get(d, d) for d in datasets]
    return " and ".join(names) if len(names) <= 2 else ", ".join(names[:-1]) + " and " + names[-1]


def candor_table2(results: SweepResults) -> list[PaperTable]:
    """Table 2: chest encoders on MIMIC-CXR and CheXpert (specialists, general-purpose, untrained;
    within each block by D as printed). Bold/underline: highest AUROCs, lowest D and retention.
    The caption names the chest datasets the sweep's CANDOR rows come from."""
    _, enc = _chest_panel(results)
    if enc.empty:
        return []
    datasets = _chest_datasets(_candor_rows(results))
    enc["section"] = enc["encoder"].map(_section)
    enc = enc.sort_values(["section", "d", "encoder"], kind="stable")
    specs = {e: _spec(e) for e in enc["encoder"]}
    frame = pd.DataFrame({
        "Encoder": enc["encoder"].map(paper_name).to_numpy(),
        "Objective": [OBJECTIVE_LABELS.get(s.objective, s.objective) if s else "" for s in specs.values()],
        "Params (M)": [float(round(s.params_m)) if s else np.nan for s in specs.values()],
        "AUROC Head": enc["head_auroc"].to_numpy(float), "AUROC Margin": enc["margin_auroc"].to_numpy(float),
        "D": enc["d"].to_numpy(float), "D_all": enc["d_all"].to_numpy(float),
        "Retention": enc["retention"].to_numpy(float)})
    return [PaperTable("candor_table2", frame, caption=f"Chest encoders on {_dataset_list(datasets)} "
                       "(D_all with unequal candidate sets; D and D_all severity-weighted over the 12 findings)",
                       best={"AUROC Head": "max", "AUROC Margin": "max", "D": "min", "Retention": "min"})]


def _chest_datasets(rows: pd.DataFrame) -> list[str]:
    """The chest datasets of CANDOR's rows, in the paper's order."""
    return sorted(set(rows.loc[rows["finding"].isin(CHEST_FINDINGS), "dataset"].astype(str)),
                  key=lambda d: (list(DATASET_NAMES).index(d) if d in DATASET_NAMES else len(DATASET_NAMES), d))


#: candor_text_numbers.csv: the positive queries of the main chest analysis (candor.md "Scope": 22,133)
MAIN_CHEST_QUERIES = "positive queries in the main chest analysis"


def candor_chest_queries(results: SweepResults) -> list[PaperTable]:
    """The positive queries of the chest analysis per finding (summed over the sweep's sites) and
    over all findings, beside the paper's count (candor.md "Scope": "This analysis has 22,133
    positive queries", MIMIC-CXR and CheXpert; a query is a positive in the random sample of at most
    4,000 images of its matched group, "Implementation"). The queries are the same for every encoder
    (one draw per matched group); an encoder that lost a query (fewer than k candidates) does not
    set the count, so each count is the largest over the encoders."""
    rows = _candor_rows(results)
    datasets = _chest_datasets(rows)
    chest = rows[rows["finding"].isin(CHEST_FINDINGS) & (rows["target"] == rows["finding"])]
    if chest.empty:
        return []
    per = (chest.groupby(["finding", "encoder"])["n_queries"].sum().groupby("finding").max()
           .reindex([f for f in CHEST_FINDINGS if f in set(chest["finding"])]))
    texts = text_numbers()
    paper = texts.loc[(texts["paper"] == "candor") & (texts["version"] == "v4")
                      & texts["quantity"].str.startswith(MAIN_CHEST_QUERIES), "value"]
    frame = pd.DataFrame({"Finding": [*per.index, "All findings"],
                          "Positive queries": [*per.to_numpy(float), float(per.sum())],
                          "Paper": [*[np.nan] * len(per), float(paper.iloc[0]) if len(paper) else np.nan]})
    return [PaperTable("candor_chest_queries", frame, decimals=0, na_rep="—",
                       caption=f"Positive queries of the chest analysis on {_dataset_list(datasets)} (the positives "
                               "in a random sample of at most 4,000 images of each matched group), beside the "
                               "paper's count for MIMIC-CXR and CheXpert")]


def _task_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Label every row with its Table 3 task (or drop it); ``target`` keeps the class it scores
    (the finding for a binary task). Pools across tasks are dropped."""
    if rows.empty:
        return rows.assign(task=pd.Series(dtype=str), target=pd.Series(dtype=str))
    rows = with_target(rows)
    rows = rows[~is_pool(rows)]
    out = []
    for task, sources in TASKS.items():
        for dataset, finding in sources:
            part = rows[rows["dataset"] == dataset]
            if finding is not None:
                part = part[(part["finding"] == finding) & (part["target"] == finding)]
            out.append(part.assign(task=task))
    return pd.concat(out, ignore_index=True)


def _shown(encoder: str, task: str) -> bool:
    return task in SPECIALIST_TASKS.get(encoder, tuple(TASKS))


#: Table 3's overlap tests (ΔJ, Sig.): one hypergeometric test per encoder pair and class, BH over
#: every test of the task (the paper's), or one per pair with the classes pooled (an option)
OVERLAP_FAMILIES = ("per_class", "pooled")


def table3_overlaps(results: SweepResults, overlap: str = "per_class") -> tuple[dict, dict]:
    """ΔJ and Sig. of Table 3 per task, from the sweep's CANDOR per-sample rows.

    ``per_class`` (default): one hypergeometric overlap test per encoder pair *and class*, on the
    queries of that class over the task's sites, and BH over all the tests of the task. candor.md
    "Discordance Across Domains": "Sig. is the share of encoder pairs with a significant overlap of
    discordant sets after FDR correction"; "Birds and aircraft are tested one class at a time"
    ("Scope"), and the printed 24.3% and 13.5% are not multiples of 1/28 (28 pairs) but fit the 28 ×
    167 = 4,676 bird and 28 × 87 = 2,436 aircraft tests. Our reading: for a one-vs-rest task the unit
    of a test is the (pair, class), the family is every test of the task, Sig. the share of its tests
    significant and ΔJ their mean; a binary task has one class, so one test per pair pooled over its
    sites (268 pairs in dermatology, fundus, histopathology and mammography, as the text counts).
    Pooling the classes would make a pair overlap above chance whenever the encoders merely agree
    on which classes are hard. ``pooled``: one test per pair on the queries of all classes, a query
    being (dataset, class, sample)."""
    if overlap not in OVERLAP_FAMILIES:
        raise ValueError(f"candor_table3: overlap={overlap!r} is not one of {', '.join(OVERLAP_FAMILIES)}")
    per_sample = results.per_sample("candor")
    if per_sample.empty:
        return {}, {}
    ps = _task_rows(per_sample)
    ps = ps[[_shown(e, t) for e, t in zip(ps["encoder"], ps["task"])]]
    if overlap == "per_class":
        pairs = pairwise_overlaps(ps, task_cols=("task", "finding", "target"), id_cols=("dataset", "sample_id"),
                                  family_cols=("task",))
    else:  # a one-vs-rest query is scored once, for its own class
        pairs = pairwise_overlaps(ps, task_cols=("task", "finding"), id_cols=("dataset", "target", "sample_id"),
                                  family_cols=("task",))
    if pairs.empty:
        return {}, {}
    summary = overlap_summary(pairs, by=("task",)).set_index("task")
    return summary["delta_j"].to_dict(), summary["sig"].to_dict()


def candor_table3(results: SweepResults, overlap: str = "per_class") -> list[PaperTable]:
    """Table 3: D of every encoder on the tasks outside chest radiography (bold: lowest per task)
    and the task-level rows (``candor_table3_task_level``); ``overlap`` chooses the family of the
    ΔJ and Sig. rows (:func:`table3_overlaps`: per class, the paper's, or pooled)."""
    rows = _task_rows(_candor_rows(results))
    if rows.empty:
        return []
    rows = rows[[_shown(e, t) for e, t in zip(rows["encoder"], rows["task"])]]
    # per class (finding, target: pooled over the task's datasets by queries), then the unweighted
    # mean over the classes (a binary task has one; a one-vs-rest task: the stage's __mean__ row)
    per_class = pool_sites(rows, ["task", "encoder"], ["d"])
    d = per_class.groupby(["encoder", "task"])["d"].mean().unstack("task")
    names = paper_names()
    order = [e for e in names if e in d.index] + sorted(set(d.index) - set(names))
    d = d.reindex(index=order, columns=list(TASKS))
    encoder_frame = d.rename(index=paper_name).rename_axis("Encoder").reset_index()
    encoder_frame.columns.name = None

    queries = rows.groupby(["task", "encoder"])["n_queries"].sum().groupby("task").max()
    delta_j, sig = table3_overlaps(results, overlap)
    errors = _task_rows(_stage_rows(results, "error_detection", ["method", "stratum", "auroc"]))
    errors = errors[errors["stratum"].fillna(ALL_STRATA).astype(str) == ALL_STRATA]
    task_rows = {"Positive queries": queries.to_dict(), "ΔJ": delta_j, "Sig. (%)": sig}
    for label, method in ERROR_DETECTION_METHODS.items():  # mean over encoders and the task's datasets
        task_rows[label] = errors[errors["method"] == method].groupby("task")["auroc"].mean().to_dict()
    tasks = pd.DataFrame([{"Task-level": label, **{t: values.get(t, np.nan) for t in TASKS}}
                          for label, values in task_rows.items()])
    return [PaperTable("candor_table3", encoder_frame, caption="D of every encoder on the tasks outside "
                       "chest radiography (bold: lowest D)", best={t: "min" for t in TASKS}),
            PaperTable("candor_table3_task_level", tasks, caption="Task-level results: positive queries, "
                       "ΔJ (mean Jaccard overlap of discordant sets in excess of chance), Sig. (share of "
                       "encoder pairs significant after FDR, as a fraction; birds and aircraft: one test per "
                       f"pair and class, {overlap.replace('_', ' ')}), AUROCs of r and confidence")]


def candor_calibration(results: SweepResults) -> list[PaperTable]:
    """Figure 2a: D (95% interval) and D_all of every encoder against the prevalence and the
    number of positives of each finding (pooled over matched groups)."""
    rows = _candor_rows(results)
    if rows.empty:
        return []
    pos, neg = rows["n_pos"].astype(float), rows["n_neg"].astype(float)
    frame = pd.DataFrame({
        "Encoder": rows["encoder"].map(paper_name), "Dataset": rows["dataset"], "Finding": rows["target"],
        "Positives": pos.astype("Int64"), "Prevalence": pos / (pos + neg),
        "Queries": rows["n_queries"].astype(float).astype("Int64"), "D": rows["d"].astype(float),
        "D 95% low": rows["d_ci_low"].astype(float), "D 95% high": rows["d_ci_high"].astype(float),
        "D_all": rows["d_all"].astype(float)})
    frame = frame.sort_values(["Encoder", "Dataset", "Finding", "Prevalence"], ignore_index=True)
    return [PaperTable("candor_calibration", frame, caption="Planted references: D (chance level 0.500 with "
                       "equal candidate sets) and D_all (above 0.500, rising as the prevalence falls)")]


def varied_setting(results: SweepResults, jobs) -> tuple[str | None, dict]:
    """The one :data:`ABLATION_SETTINGS` path whose value differs between the sweep's jobs, and
    each job's value of it (unset paths take the paper's value)."""
    from omegaconf import OmegaConf

    configs = {job: results.job_config(job) for job in jobs}
    varied = []
    for path, default in ABLATION_SETTINGS.items():
        values = {job: None if cfg is None else OmegaConf.select(cfg, path, default=None)
                  for job, cfg in configs.items()}
        values = {job: default if v is None else v for job, v in values.items()}
        if len({str(v) for v in values.values()}) > 1:
            varied.append((path, values))
    if len(varied) > 1:
        raise ValueError(f"candor_ablation: the sweep varies {[p for p, _ in varied]}; an ablation sweep "
                         "varies exactly one of them (one experiment=candor_ablation_<x> per setting)")
    return varied[0] if varied else (None, {})


def candor_ablation(results: SweepResults) -> list[PaperTable]:
    """One ablation (candor.md "Ablation Studies"): ``candor_ablation_<setting>`` holds the chest
    D of every encoder per value of the swept setting; ``..._summary`` per value the median D over
    the (encoder, finding) combinations, the largest |ΔD| of an encoder against the paper's value
    and the Spearman correlation of the encoder ranking with the ranking at the paper's value."""
    rows = _candor_rows(results)
    if rows.empty:
        return []
    path, values = varied_setting(results, sorted(rows["job"].unique()))
    if path is None:
        return []
    name = path.rsplit(".", 1)[-1]
    rows["setting"] = rows["job"].map(lambda j: str(values[j]))
    combos = pool_sites(rows, ["setting", "encoder"], ["d"])
    enc = chest_rate(combos, ["setting", "encoder"], ["d"], [])
    if enc.empty:  # not chest findings: the mean over the findings of each one's mean over its classes
        enc = (combos.groupby(["setting", "encoder", "finding"])["d"].mean()
               .groupby(["setting", "encoder"]).mean().reset_index())
    default = str(ABLATION_SETTINGS[path])
    settings = sorted(enc["setting"].unique(), key=_natural)
    wide = enc.pivot(index="encoder", columns="setting", values="d").reindex(columns=settings)
    per_encoder = pd.DataFrame({"Encoder": wide.index.map(paper_name),
                                **{f"{name}={s}": wide[s].to_numpy(float) for s in settings}})
    summary = []
    for s in settings:
        rec = {name: s, "Median D (combinations)": float(combos.loc[combos["setting"] == s, "d"].median())}
        if default in wide.columns:
            diff = (wide[s] - wide[default]).abs()
            rec["Max abs ΔD (encoders)"] = float(diff.max()) if diff.notna().any() else np.nan
            rec["Spearman with default"] = spearman(wide[s], wide[default])[0]
        summary.append(rec)
    caption = f"Ablation of {path} (paper value {default}): chest D per encoder"
    return [PaperTable(f"candor_ablation_{name}", per_encoder, caption=caption),
            PaperTable(f"candor_ablation_{name}_summary", pd.DataFrame(summary),
                       caption=f"Ablation of {path}: median D over combinations, largest change of an "
                               f"encoder's D and rank agreement with the paper's value {default}")]


def _natural(value: str):
    """Numbers in numeric order, then text."""
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def candor_associations(results: SweepResults) -> list[PaperTable]:
    """The chest association tests of candor.md (Spearman of encoder rankings, D_all/D vs number of
    positives, slopes on release year and finding size), BH-corrected as one family."""
    combos, enc = _chest_panel(results)
    if enc.empty:
        return []
    specs = {e: _spec(e) for e in enc["encoder"]}
    enc["release_year"] = [s.release_year if s and s.release_year else np.nan for s in specs.values()]
    enc["objective"] = [s.objective if s else "" for s in specs.values()]
    combos = combos[combos["finding"].isin(CHEST_FINDINGS)]
    tests = association_family(enc, combos)
    frame = tests.rename(columns={"quantity": "Quantity", "kind": "Test", "statistic": "Statistic", "p": "p",
                                  "n": "n", "p_bh": "p (BH)", "significant": "Significant", "note": "Note"})
    # a test refused for too few encoders has no p-value: "—", and no verdict either
    frame["Significant"] = frame["Significant"].astype(object).where(frame["p"].notna(), None)
    frame = frame[["Quantity", "Test", "Statistic", "p", "n", "p (BH)", "Significant", "Note"]]
    return [PaperTable("candor_associations", frame, caption="Chest association tests (Spearman ρ or slope; "
                       f"p-values BH-corrected as one family at FDR 0.05; no p-value below n = {MIN_TEST_N})",
                       na_rep="—")]


def candor_chest_overlap(results: SweepResults) -> list[PaperTable]:
    """Overlap of the chest encoder pairs' discordant sets per finding and over all findings:
    pairs, mean ΔJ, share above chance (p < 0.05) and share significant after BH-FDR over the
    whole chest family (every pair of every finding, candor.md "Discordance Across Domains")."""
    per_sample = results.per_sample("candor")
    if per_sample.empty:
        return []
    per_sample = with_target(per_sample)
    chest = per_sample[per_sample["finding"].isin(CHEST_FINDINGS) & (per_sample["target"] == per_sample["finding"])]
    pairs = pairwise_overlaps(chest.assign(family="chest"), task_cols=("finding",),
                              id_cols=("dataset", "sample_id"), family_cols=("family",))
    if pairs.empty:
        return []
    rows = pd.concat([overlap_summary(pairs, by=("finding",)),
                      overlap_summary(pairs.assign(finding="All findings"), by=("finding",))], ignore_index=True)
    frame = pd.DataFrame({"Finding": rows["finding"], "Pairs": rows["n_pairs"].astype("Int64"),
                          "ΔJ": rows["delta_j"], "Above chance": rows["above_chance"], "Sig.": rows["sig"]})
    return [PaperTable("candor_chest_overlap", frame, caption="Chest encoder pairs: mean Jaccard overlap of "
                       "discordant sets in excess of chance, share of pairs above chance (p < 0.05) and "
                       "significant after BH-FDR 0.05 over all chest pairs")]
