"""CANDOR: chance-calibrated neighbourhood discordance (candor.md, "The CANDOR Framework",
"Implementation", "Reporting", "Baselines", "Ablation Studies").

For one task (a binary finding, or one class against the other classes of its family; see
:mod:`robustbench_fm.methods.candor.tasks`) and each matched group s (``group_col``):

* queries: the positives inside a seeded random sample of at most ``max_group_sample`` images of
  s, drawn from all its images before any label is read (an image unlabelled for the finding takes
  a place in the sample; "a random sample of at most 4,000 images of each matched group");
* banks R+_s and R−_s: n = min(bank_size, #positives, #negatives) images drawn once (seed) from
  all positives / negatives of s; a query that is in R+_s is removed from it (it then meets n−1
  positives, chance level ≤ 1/2 + k/n, candor.md "The Discordance Rate and Its Chance Level");
* c±(x) = mean cosine similarity of the k nearest in R±_s; DM(x) = c−(x) − c+(x) (Eq. 1);
  bitwise-identical feature vectors are one vector (:func:`~robustbench_fm.core.neighbors.distinct_rows`):
  similarities are taken between distinct vectors, so copies get bitwise-equal c±, DM and margins;
  x is discordant iff DM(x) > 0 (ties are concordant);
* D_s = share of discordant queries; D_all with all positives / all negatives of s as candidates,
  the query excluded ("Unequal Candidate Sets": above 1/2 even on label-independent features);
* margin AUROC: every labelled image of s scored by c+ − c− against the banks, each image
  excluded from the bank holding it ("Baselines"). Its chance level is not 1/2 where banks are
  small: an image in its own bank meets n − 1 of its class and n of the other, so it scores low
  (a positive) or high (a negative). ``margin_chance_low`` (:func:`margin_chance_low`) bounds it:
  for label-free features 1/2 − k/n+ − k/n− ≤ chance ≤ 1/2 with every image in the banks' groups
  scored (n± the scored positives and negatives); simulated 0.42 at 12 vs 12 (k = 5, d = 32);
* ± and 95% interval of D, D_all and the margin AUROC: ``n_boot`` resamples of patients
  (``cluster_col``) with the banks fixed ("Reporting"; taken by
  :mod:`~robustbench_fm.methods.candor.bootstrap`). A row resamples the patients of its own
  queries (the margin AUROC: of the images it scores), never every patient of the manifest; a pooled
  row resamples those of all its groups (and tasks) jointly. The margin AUROC is re-ranked in every
  resample and its interval is the percentile interval of those resamples (``auroc_bootstrap="exact"``,
  the default: a pass over every scored image with a cumulative sum), or, as a fast approximation,
  resampled through its placement-value expansion (``"linear"``, the clustered DeLong variance; one
  pass over the patients).

Groups are pooled weighted by their number of queries (D and D_all as ratios of sums, the margin
AUROC as the query-weighted mean of group AUROCs). A group that cannot be scored (fewer than
k + 1 images in a bank) gets a row with its ``reason`` and is left out of the pool. Chest findings
scored together add a ``__chest__`` row (severity-weighted D and D_all, mean AUROC); a one-vs-rest
task adds a ``target="__mean__"`` row (unweighted mean over its classes).

Controls (candor.md "Chest Encoders ...", "Ablation Studies"): ``shuffle_labels`` (labels permuted
within each matched group), ``queries="negative"`` (roles of the two classes exchanged; n_pos then
counts the query class), ``equal_size`` (a query removed from R+ also removes one random negative
from R−, so its chance level is exactly 1/2), ``exclude_patient`` (the query's patient is left out
of every candidate set: banks, D_all's sets and the margin's banks), ``unmatched`` (the same
queries, but banks and D_all's sets drawn from the labelled images of all groups pooled; the margin
scores each group's images against those banks), ``isolated`` (positives with none of the other
findings, negatives with none of them all) and ``box_verified`` (positives restricted to those
with an expert box). The shortlist fast path serves the default and the label controls; the
neighbour controls use exact searches against each candidate set.

Several findings (``finding`` as a list) are scored together: the similarities of a matched
group's labelled images are computed once and shared by every task's banks and queries. Each
matched group takes the path that computes fewer similarities for its shape (:func:`group_path`):
that shared pass (many findings over a group of moderate size), or one exact search per question
(one finding over a large group, where the pass would cost its n² similarities for a few thousand
bank members). Both give the same c±, DM and margins.

``summary`` columns: finding, acq_group (``"__pooled__"`` for the pool), target, n_queries, n_pos,
n_neg, bank_size, k, d, d_sd, d_ci_low, d_ci_high, d_all, d_all_sd, d_all_ci_low, d_all_ci_high,
margin_auroc, margin_auroc_sd, margin_auroc_ci_low, margin_auroc_ci_high, margin_chance_low, reason.
``per_sample`` columns: sample_id, finding, target, acq_group, c_pos, c_neg, dm, discordant,
c_pos_all, c_neg_all, dm_all, discordant_all. ``neighbours`` (:data:`NEIGHBOUR_COLUMNS`, saved as
``neighbours.parquet``; docs/neighbourhoods.md): every query's k nearest positives and negatives in the
banks and among all candidates, and those of at most :data:`NEIGHBOUR_NEGATIVES` negatives per group
and task, as the scoring found them (the searches return the neighbours they averaged:
:class:`~robustbench_fm.core.neighbors.Neighbours`), never searched again.
"""
from __future__ import annotations

import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import roc_auc_score

from ...core.devices import resolve_device, torch_threads
from ...core.errors import InvalidSetting
from ...core.neighbors import Neighbours, distinct_rows, l2_normalize, topk_similarity
from ...core.results import Results
from ...core.stats import LinearizedAUROC, ResampledAUROC, cluster_halves
from .. import missing_column
from . import tasks as ct
from .bootstrap import METRICS, auroc_weights, group_aurocs, row_intervals
from .influence import Searches, bank_influence, influence_reach, item_shares
from .params import AUROC_BOOTSTRAPS, QUERY_ROLES, CandorParams  # noqa: F401  (QUERY_ROLES: importable here)
from .shortlist import MATRIX_BYTES, Shortlist

PARAMS = CandorParams
#: the parameters a result records (``Results.params``, after ``finding``)
RECORDED_PARAMS = ("k", "bank_size", "max_group_sample", "seed", "group_col", "cluster_col", "n_boot", "task",
                   "queries", "shuffle_labels", "equal_size", "exclude_patient", "unmatched", "isolated",
                   "box_verified", "auroc_bootstrap")

POOLED = "__pooled__"
#: Matched group of every query under ``unmatched=True`` for the pooled banks' draw.
UNMATCHED = "__unmatched__"
PER_SAMPLE_COLUMNS = ["sample_id", "finding", "target", "acq_group", "c_pos", "c_neg", "dm", "discordant",
                      "c_pos_all", "c_neg_all", "dm_all", "discordant_all"]
#: ``Results.items``: one row per image a group row scores (queries and the margin's images; see :func:`_items`)
ITEM_COLUMNS = ["sample_id", "finding", "target", "acq_group", "cluster", "query", "discordant", "discordant_all",
                "margin", "label", "discordant_bank_0", "discordant_bank_1", "discordant_all_bank_0",
                "discordant_all_bank_1"]
#: ``Results.neighbours`` (saved as ``neighbours.parquet``; :func:`_neighbour_rows`): one row per (query,
#: candidate set, side, rank), the neighbours every c± of the stage averaged
NEIGHBOUR_COLUMNS = ["finding", "target", "acq_group", "query_id", "query_label", "candidates", "side", "rank",
                     "neighbour_id", "similarity", "dm", "discordant"]
NEIGHBOUR_DTYPES = ["str", "str", "str", "str", np.int8, "str", "str", np.int16, "str", np.float64, np.float64, bool]
#: negatives of each matched group (and task) whose neighbours ``neighbours.parquet`` keeps besides every
#: query's: a seeded random draw of at most this many of the negatives the margin scores
NEIGHBOUR_NEGATIVES = 200
#: margin-AUROC intervals: the bootstrap of its placement-value expansion, or re-ranked resamples
AUROC_ESTIMATORS = {"linear": LinearizedAUROC, "exact": ResampledAUROC}
if tuple(AUROC_ESTIMATORS) != AUROC_BOOTSTRAPS:  # one list of names: CandorParams checks against it
    raise ImportError("candor: AUROC_ESTIMATORS and params.AUROC_BOOTSTRAPS disagree")


def group_rng(seed: int, group: str) -> np.random.Generator:
    """One generator per matched group, so a group's draws do not depend on the other groups."""
    return np.random.default_rng([seed, zlib.crc32(str(group).encode())])


def draw_sample(images: np.ndarray, max_group_sample: int, rng: np.random.Generator) -> np.ndarray:
    """The matched group's random sample of at most ``max_group_sample`` of its ``images`` (every
    image of the group, labelled for the task or not), sorted (candor.md "Implementation": "The
    queries are the positives in a random sample of at most 4,000 images of each matched group")."""
    images = np.sort(np.asarray(images, np.int64))
    return images if len(images) <= max_group_sample else np.sort(
        rng.choice(images, size=max_group_sample, replace=False))


def draw_banks(pos: np.ndarray, neg: np.ndarray, bank_size: int,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The equal-size banks R+ and R−: n = min(bank_size, #pos, #neg) of each, sorted."""
    n = min(bank_size, len(pos), len(neg))
    return np.sort(rng.choice(pos, size=n, replace=False)), np.sort(rng.choice(neg, size=n, replace=False))


def draw_group(images: np.ndarray, pos: np.ndarray, neg: np.ndarray, bank_size: int, max_group_sample: int,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Queries and the equal-size banks R+, R− of one task in one matched group.

    The sample of at most ``max_group_sample`` images is drawn from ``images``, all images of the
    group, before any label is looked at (:func:`draw_sample`); the queries are the task's positives
    ``pos`` inside it, so an image unlabelled for the finding takes a place in the sample but is
    never a query. With the group's generator (:func:`group_rng`) the sample is the same for every
    task of the group ("The sets are drawn once, with seed 42"); the banks are then drawn from all
    positives and negatives of the group (:func:`draw_banks`)."""
    sample = draw_sample(images, max_group_sample, rng)
    bank_pos, bank_neg = draw_banks(pos, neg, bank_size, rng)
    return sample[np.isin(sample, pos)], bank_pos, bank_neg


def equal_size_drops(queries: np.ndarray, bank_pos: np.ndarray, bank_neg: np.ndarray,
                     rng: np.random.Generator) -> np.ndarray:
    """For each query inside R+, one random member of R− removed with it ("Removing one random
    negative would restore equal sizes"); −1 for the other queries."""
    inside = np.isin(queries, bank_pos)
    drops = np.full(len(queries), -1, dtype=np.int64)
    if inside.any():
        drops[inside] = rng.choice(bank_neg, size=int(inside.sum()), replace=True)
    return drops


def masked_mean_topk(feats: torch.Tensor, queries, cands, k: int, clusters: np.ndarray | None = None,
                     drops: np.ndarray | None = None, block_size: int = 4096, backend: str = "torch",
                     vectors: np.ndarray | None = None, neighbours: bool = False, searches: Searches | None = None,
                     wider: int = 0):
    """c(x) over the candidates minus the query itself, minus the query's cluster (``clusters``
    given: its patient's images) and minus ``drops[i]`` (≥ 0) for query i; NaN when fewer than
    k candidates remain.

    Exact: the k + e nearest candidates are searched, e the most candidates one query can lose,
    and the k nearest survivors are kept (every candidate outside that list is no nearer).
    ``neighbours``: (c(x), the :class:`~robustbench_fm.core.neighbors.Neighbours` kept; rows −1
    where fewer than k remain). ``searches``: the task's kept searches
    (:class:`~robustbench_fm.methods.candor.influence.Searches`), this one taken ``wider`` wide for its influence.
    """
    queries, cands = np.asarray(queries, np.int64), np.asarray(cands, np.int64)
    extra = 0 if drops is None else 1
    if clusters is not None and len(queries):
        extra += int(np.bincount(clusters[cands], minlength=int(clusters.max()) + 1)[clusters[queries]].max())
    reach = min(k + extra, len(cands) - int(np.isin(queries, cands).any()))
    if reach < k or not len(queries):
        means = np.full(len(queries), np.nan)
        return (means, Neighbours.empty(len(queries), k, np.float32)) if neighbours else means
    if searches is not None:
        values, at = searches.topk(feats, queries, cands, reach, block_size, backend, vectors, wider)
    else:
        values, at = topk_similarity(feats, queries, cands, reach, block_size, backend=backend, vectors=vectors)
    raw = values.cpu().numpy()
    values, rows = raw.astype(np.float64), cands[at.cpu().numpy()]
    gone = np.zeros(values.shape, bool)
    if clusters is not None:
        gone |= clusters[rows] == clusters[queries][:, None]
    if drops is not None:
        gone |= rows == drops[:, None]
    kept = -np.sort(-np.where(gone, -np.inf, values), axis=1)[:, :k]
    means = np.where(np.isfinite(kept).all(axis=1), kept.mean(axis=1), np.nan)
    if not neighbours:
        return means
    # the survivors in list order (the search's order, descending): the same k values kept holds
    order = np.argsort(gone, axis=1, kind="stable")[:, :k]
    taken = Neighbours(np.take_along_axis(rows, order, 1), np.take_along_axis(raw, order, 1))
    short = ~np.isfinite(means)
    taken.rows[short], taken.sims[short] = -1, np.nan
    return means, taken


@dataclass
class _Setting:
    """What every group's scoring needs besides its own images."""

    feats: torch.Tensor
    k: int
    clusters: np.ndarray
    exclude_patient: bool
    exact: bool
    block_size: int
    backend: str
    vectors: np.ndarray | None = None  # each row's vector id (core.neighbors.distinct_rows): copies tie exactly


def group_path(path: str, n_labelled: int, jobs) -> str:
    """How a matched group's neighbour questions are answered: ``"shortlist"`` (one pass over its
    ``n_labelled`` labelled images, :class:`~robustbench_fm.methods.candor.shortlist.Shortlist`, shared by all
    its tasks) or ``"exact"`` (one exact search per question). ``path`` other than ``"auto"`` is
    taken as given; ``"auto"`` takes the one that computes fewer similarities: the pass computes
    n_labelled² of them, the exact searches Σ |queries| × |candidates| over the questions
    (:func:`_questions`) of the group's scored tasks (``jobs``). Many findings over a group favour
    the pass (the 12 chest findings at 2–30% prevalence over 8,000 images: 4.6× fewer similarities),
    one finding over a large group the exact searches (50,000 images: 5× fewer). Both answer with
    the same c±: the k largest similarities of each query among the candidates."""
    if path != "auto":
        return path
    exact = sum(n_queries * n_cands for n_queries, n_cands in _questions(jobs))
    return "exact" if exact < n_labelled ** 2 else "shortlist"


def _questions(jobs) -> list[tuple[int, int]]:
    """(queries, candidates) of every neighbour question :func:`_score_group` asks about the scored
    tasks of a group (``jobs``: (task, pos, neg, cand_pos, cand_neg, row, queries, bank_pos, bank_neg)):
    the scored images against each bank, and the queries against all positives / negatives where
    those differ from the banks (D_all)."""
    out = []
    for _, pos, neg, cand_pos, cand_neg, _, queries, bank_pos, bank_neg in jobs:
        out += [(len(pos) + len(neg), len(bank_pos)), (len(pos) + len(neg), len(bank_neg))]
        out += [(len(queries), len(cands)) for bank, cands in ((bank_pos, cand_pos), (bank_neg, cand_neg))
                if not np.array_equal(bank, cands)]
    return out


def shortlist_size(size: int, k: int, n_labelled: int, jobs) -> int:
    """Entries per image of a group's shared shortlist: as many as its widest first scan needs
    (:meth:`~robustbench_fm.methods.candor.shortlist.Shortlist.scan_width`) among the questions it serves,
    at most ``size`` (``shortlist``); a question whose scan is wider is read off the group's
    similarity matrix, and so is a row whose scan finds fewer than k candidates."""
    widths = [Shortlist.scan_width(k, n_labelled, n) for _, n in _questions(jobs)]
    return max([k] + [w for w in widths if w <= size]) if size >= k else size


def _neighbour_means(s: _Setting, shortlist, queries, cands, drops=None,
                     searches=None) -> tuple[np.ndarray, Neighbours]:
    """c(x) of ``queries`` on ``cands`` and the neighbours each averaged: the shared shortlist, or an
    exact search when the group takes the exact path (``shortlist`` None) or a control changes the
    candidate set per query. ``searches``: the task's kept searches, this one taken as wide as the
    influence will ask (:class:`~robustbench_fm.methods.candor.influence.Searches`)."""
    if s.exact or shortlist is None or drops is not None:
        wider = 0 if searches is None else influence_reach(queries, cands, s.k, s.clusters)
        return masked_mean_topk(s.feats, queries, cands, s.k, s.clusters if s.exclude_patient else None,
                                drops, s.block_size, s.backend, s.vectors, neighbours=True, searches=searches,
                                wider=wider)
    return shortlist.mean_topk(queries, cands, s.k, neighbours=True)


def _score_group(s: _Setting, shortlist, pos, neg, queries, bank_pos, bank_neg, cand_pos, cand_neg, drops,
                 searches=None):
    """c± of the queries on the banks and on all candidates, and the margin scores c+ − c− of the
    group's labelled images (the queries' c± on the banks are read off the margin's terms), with the
    neighbours every c± averaged (``found``: ``"bank"``, the banks' neighbours of every labelled image
    in ``everyone`` order; ``"all"``, D_all's of the queries; each a (positive, negative) pair).
    ``searches``: D_all's exact searches kept for the task's influence (default exact path)."""
    everyone = np.concatenate([pos, neg])
    m_pos, n_pos = _neighbour_means(s, shortlist, everyone, bank_pos)
    m_neg, n_neg = _neighbour_means(s, shortlist, everyone, bank_neg)
    at = np.searchsorted(pos, queries)  # queries are positives, pos is sorted
    c_pos, c_neg = m_pos[at], m_neg[at]
    q_pos, q_neg = n_pos.take(at), n_neg.take(at)
    if drops is not None and (drops >= 0).any():
        inside = drops >= 0
        c_neg[inside], dropped = _neighbour_means(s, shortlist, queries[inside], bank_neg, drops[inside])
        q_neg.put(inside, dropped)
    # a full bank is the set of all candidates: then D_all's scores are D's
    if np.array_equal(bank_pos, cand_pos):
        c_pos_all, a_pos = m_pos[at], n_pos.take(at)
    else:
        c_pos_all, a_pos = _neighbour_means(s, shortlist, queries, cand_pos, searches=searches)
    if np.array_equal(bank_neg, cand_neg):
        c_neg_all, a_neg = m_neg[at], n_neg.take(at)
    else:
        c_neg_all, a_neg = _neighbour_means(s, shortlist, queries, cand_neg, searches=searches)
    labels = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    found = {"bank": (n_pos, n_neg), "queries": (q_pos, q_neg), "all": (a_pos, a_neg)}
    return c_pos, c_neg, c_pos_all, c_neg_all, everyone, m_pos - m_neg, labels, found


def check_params(**params) -> CandorParams:
    """Refuse unknown, mistyped or inconsistent parameters before any heavy work (one line each;
    :class:`~robustbench_fm.methods.candor.params.CandorParams`)."""
    return PARAMS.parse(params)


def _findings(finding: str | list[str]) -> list[str]:
    """The findings as a list; none is refused in one line (before any image is read, through
    :func:`check_manifest`)."""
    findings = [finding] if isinstance(finding, str) else list(finding)
    if not findings:
        raise InvalidSetting("candor: no finding to score (stage.findings is empty; a dataset=pool lists none of its "
                             "own); name them, e.g. stage.findings=[pneumothorax]")
    return findings


def check_manifest(manifest: pd.DataFrame, finding: str | list[str], params: CandorParams | None = None,
                   **kw) -> None:
    """Refuse, before any image is embedded, a ``k`` that no matched group of any binary finding
    can satisfy (every row would be blank): a task is scored in a group holding at least k+1
    positives and k+1 negatives (over all groups with ``unmatched``). The controls that drop
    labels (isolated, box_verified) only lower these counts, so this never refuses a run that
    could score; columns and class-name findings are left to :func:`run`."""
    p = PARAMS.parse(params, **kw)
    k, group_col, task, unmatched = p.k, p.group_col, p.task, p.unmatched
    findings = _findings(finding)
    if group_col not in manifest.columns or any(f not in manifest.columns for f in findings):
        return
    best = None  # (min(positives, negatives), positives, negatives, finding, group)
    for f in findings:
        if ct.task_kind(manifest, f, task) != "binary":
            return
        labels = pd.to_numeric(manifest[f], errors="coerce")
        groups = pd.Series(UNMATCHED if unmatched else manifest[group_col].astype(str).to_numpy(), index=manifest.index)
        counts = pd.DataFrame({"pos": labels.eq(1), "neg": labels.eq(0)}).groupby(groups).sum()
        for group, (pos, neg) in counts.iterrows():
            if best is None or min(pos, neg) > best[0]:
                best = (min(pos, neg), int(pos), int(neg), f, group)
    if best is None or best[0] >= k + 1:
        return
    _, pos, neg, f, group = best
    where = "over all groups (unmatched)" if unmatched else f"{group_col} '{group}'"
    fix = f"at most stage.params.k={best[0] - 1}" if best[0] >= 2 else "more labelled images"
    raise InvalidSetting(f"candor: stage.params.k={k} needs k+1={k + 1} positives and k+1 negatives in a matched "
                         f"group, but the best one has {pos} positives and {neg} negatives (finding '{f}', {where}); "
                         f"every row would be blank: use {fix}")


def run(features: np.ndarray, manifest: pd.DataFrame, finding: str | list[str],
        params: CandorParams | None = None, **kw) -> Results:
    """Discordance of the positives of ``finding`` (one column or a list) per matched group and
    pooled (see module doc); ``params``: :class:`~robustbench_fm.methods.candor.params.CandorParams`
    (their defaults are the paper's).

    ``task="family_one_vs_rest"`` reads ``finding`` as a class column (e.g. ``bio_label``) and
    scores every class against the other classes of its ``group_col`` group; ``task="auto"`` does
    so for a column of names and reads a numeric column as a binary finding. Without a neighbour
    control, all tasks of a matched group are scored from one
    :class:`~robustbench_fm.methods.candor.shortlist.Shortlist` of its labelled images (at most ``shortlist``
    nearest per image, :func:`shortlist_size`; exact whatever its size), or, where that computes
    more similarities than the exact searches, by exact searches (:func:`group_path`;
    ``neighbour_path`` forces one); ``block_size`` bounds the similarity rows held at once,
    ``backend="faiss"`` sends the exact searches to faiss.
    """
    p = PARAMS.parse(params, **kw)
    k, bank_size, max_group_sample, seed, n_boot = p.k, p.bank_size, p.max_group_sample, p.seed, p.n_boot
    group_col, cluster_col, task, queries, unmatched = p.group_col, p.cluster_col, p.task, p.queries, p.unmatched
    findings = _findings(finding)
    for col, param in (*((f, "finding") for f in findings), (group_col, "group_col"), (cluster_col, "cluster_col")):
        if col not in manifest.columns:
            raise missing_column("candor", col, param, manifest.columns)
    groups = manifest[group_col].astype(str).to_numpy()
    tasks = _prepared_tasks(manifest, findings, task, group_col, groups, seed, queries, p.shuffle_labels,
                            p.isolated, p.box_verified)
    if any(t.kind != "binary" for t in tasks):
        replace(p, task="family_one_vs_rest").check()
    clusters = pd.factorize(manifest[cluster_col].astype(str), sort=True)[0]
    unit = l2_normalize(features)
    setting = _Setting(torch.as_tensor(unit, device=resolve_device(p.device)), k, clusters,
                       p.exclude_patient, p.exclude_patient or unmatched, p.block_size, p.backend,
                       distinct_rows(unit)[1])
    pools = {i: _pooled_sets(t.labels, bank_size, seed) for i, t in enumerate(tasks)} \
        if unmatched else {}
    sample_ids = manifest["sample_id"].to_numpy()
    id_array = pd.array(sample_ids)  # the neighbours' ids taken from it (pandas' own string array: no conversion)
    cluster_ids = manifest[cluster_col].astype(str).to_numpy()
    halves = cluster_halves(cluster_ids)  # the two halves of the queries' patients (influence.py)
    rows, parts, per_sample, items = {i: [] for i in range(len(tasks))}, [], [], []
    auroc_boot = AUROC_ESTIMATORS[p.auroc_bootstrap]
    labelled_any = np.any([~np.isnan(t.labels) for t in tasks], axis=0)
    spare = _Workspaces()  # finished groups' similarity matrices, their memory reused by the next (Shortlist)

    def score(group: str) -> tuple[list, list, list, list]:
        """One matched group: its rows (task, row), parts, per-sample and item tables."""
        in_group = groups == group
        images = np.flatnonzero(in_group)  # the query sample is drawn from all of them (draw_group)
        labelled = np.flatnonzero(in_group & labelled_any)
        group_rows, group_parts, group_per_sample, group_items, group_neighbours = [], [], [], [], []
        jobs = []  # (task, pos, neg, cand_pos, cand_neg, row, queries, bank_pos, bank_neg) of the scored tasks
        for i, t in enumerate(tasks):
            pos = np.flatnonzero(in_group & (t.labels == 1))
            neg = np.flatnonzero(in_group & (t.labels == 0))
            if t.kind != "binary" and len(pos) + len(neg) == 0:
                continue
            cand_pos, cand_neg = pools[i][:2] if unmatched else (pos, neg)  # banks are drawn from these
            row = _row(t, group, k, n_pos=len(pos), n_neg=len(neg),
                       bank_size=min(bank_size, len(cand_pos), len(cand_neg)))
            group_rows.append((i, row))
            if min(len(cand_pos), len(cand_neg)) < k + 1:
                row["reason"] = (f"fewer than k+1={k + 1} positives or negatives "
                                 f"({len(cand_pos)} positives, {len(cand_neg)} negatives)")
                continue
            q, bank_pos, bank_neg = draw_group(images, pos, neg, bank_size, max_group_sample, group_rng(seed, group))
            if unmatched:
                bank_pos, bank_neg = pools[i][2:]
            if len(q) == 0:
                row["reason"] = "no positive in the sampled images"
                continue
            jobs.append((i, pos, neg, cand_pos, cand_neg, row, q, bank_pos, bank_neg))
        shared = not setting.exact and bool(jobs) and group_path(p.neighbour_path, len(labelled), jobs) == "shortlist"
        group_shortlist = Shortlist(setting.feats, labelled, shortlist_size(p.shortlist, k, len(labelled), jobs),
                                    p.block_size, p.backend, setting.vectors, spare.take(len(labelled) ** 2)) \
            if shared else None
        for i, pos, neg, cand_pos, cand_neg, row, q, bank_pos, bank_neg in jobs:
            t = tasks[i]
            drops = equal_size_drops(q, bank_pos, bank_neg, ct.task_rng(seed, group, t.target, "equal_size")) \
                if p.equal_size else None
            # the default exact path: D_all's searches kept, as wide as the influence asks, for it to read
            searches = Searches() if group_shortlist is None and not p.exclude_patient and drops is None else None
            c_pos, c_neg, c_pos_all, c_neg_all, everyone, margin, y, found = _score_group(
                setting, group_shortlist, pos, neg, q, bank_pos, bank_neg, cand_pos, cand_neg, drops, searches)
            ok = np.isfinite(c_pos) & np.isfinite(c_neg) & np.isfinite(c_pos_all) & np.isfinite(c_neg_all)
            q, c_pos, c_neg, c_pos_all, c_neg_all = q[ok], c_pos[ok], c_neg[ok], c_pos_all[ok], c_neg_all[ok]
            scored = np.isfinite(margin)
            if len(q) == 0:
                row["reason"] = "no query keeps k candidates in both banks"
                continue
            disc, disc_all = (c_neg - c_pos) > 0, (c_neg_all - c_pos_all) > 0
            auroc = float(roc_auc_score(y[scored], margin[scored])) if len(np.unique(y[scored])) == 2 else np.nan
            row.update(n_queries=len(q), d=float(disc.mean()), d_all=float(disc_all.mean()), margin_auroc=auroc)
            if np.isfinite(auroc) and not p.exclude_patient:  # the patient's other images are not exchangeable
                mp, mn = everyone[scored & (y == 1)], everyone[scored & (y == 0)]
                row["margin_chance_low"] = margin_chance_low(k, len(bank_pos), int(np.isin(mp, bank_pos).sum()),
                                                             len(mp), int(np.isin(mn, bank_neg).sum()), len(mn))
            group_per_sample.append(pd.DataFrame({
                "sample_id": sample_ids[q], "finding": t.finding, "target": t.target, "acq_group": group,
                "c_pos": c_pos, "c_neg": c_neg, "dm": c_neg - c_pos, "discordant": disc,
                "c_pos_all": c_pos_all, "c_neg_all": c_neg_all, "dm_all": c_neg_all - c_pos_all,
                "discordant_all": disc_all}))
            near = None if setting.exact else group_shortlist
            memo = {}  # D's and D_all's influence share a candidate set's search (a bank holding all its class)
            infl = bank_influence(setting.feats, q, bank_pos, bank_neg, k, clusters, halves, p.exclude_patient,
                                  None if drops is None else drops[ok], p.block_size, p.backend, setting.vectors,
                                  near, memo, searches)
            infl_all = infl if np.array_equal(bank_pos, cand_pos) and np.array_equal(bank_neg, cand_neg) and \
                drops is None else bank_influence(setting.feats, q, cand_pos, cand_neg, k, clusters, halves,
                                                  p.exclude_patient, None, p.block_size, p.backend, setting.vectors,
                                                  near, memo, searches)
            group_items.append(_items(t, group, sample_ids, cluster_ids, q, disc, disc_all, everyone[scored],
                                      margin[scored], y[scored], clusters, infl, infl_all))
            group_neighbours.append((i, _neighbour_rows(t, group, id_array, q, ok, c_neg - c_pos,
                                                        c_neg_all - c_pos_all, everyone, y, scored, margin, found,
                                                        ct.task_rng(seed, group, t.target, "neighbours"))))
            group_parts.append(dict(task=i, row=row, queries=q, disc=np.c_[disc, disc_all],
                                    images=everyone[scored], margin=margin[scored], labels=y[scored]))
        if group_shortlist is not None:
            spare.give(group_shortlist.matrix)
            del group_shortlist
        if n_boot:  # the group rows' AUROC resamples, here beside the other groups' scoring (bootstrap.py)
            group_aurocs(group_parts, clusters, n_boot, seed, auroc_boot)
        return group_rows, group_parts, group_per_sample, group_items, group_neighbours

    largest = max((int((labelled_any & (groups == g)).sum()) for g in pd.unique(groups)), default=0)
    matrix_bytes = min(largest ** 2 * setting.feats.element_size(), MATRIX_BYTES)  # a group's held matrix at most
    neighbours = []
    for group_rows, group_parts, group_per_sample, group_items, group_neighbours in _map_groups(
            score, sorted(pd.unique(groups)), setting.feats.device, matrix_bytes):
        for i, row in group_rows:
            rows[i].append(row)
        parts += group_parts
        per_sample += group_per_sample
        items += group_items
        neighbours += group_neighbours
    spare.clear()  # the matrices' memory freed before the bootstrap
    summary = _summary(tasks, rows, parts, clusters, k, n_boot, seed, auroc_boot, cluster_col)
    per = pd.concat(per_sample, ignore_index=True) if per_sample else pd.DataFrame(columns=PER_SAMPLE_COLUMNS)
    if len(tasks) > 1 and len(per):
        order = {(t.finding, t.target): i for i, t in enumerate(tasks)}
        # each frame is one task's queries in one group: its rows' rank read once per frame, not per row
        rank = np.concatenate([np.full(len(f), order[(f["finding"].iat[0], f["target"].iat[0])]) for f in per_sample
                               if len(f)])
        per = per.iloc[np.argsort(rank, kind="stable")].reset_index(drop=True)
    # in per_sample's order: by task, then group (each frame is one task's in one group)
    neighbours = [frame for _, frame in sorted(neighbours, key=lambda part: part[0])]
    nbrs = pd.concat(neighbours, ignore_index=True) if neighbours else _neighbour_frame()
    items = pd.concat(items, ignore_index=True) if items else pd.DataFrame(columns=ITEM_COLUMNS)
    return Results(summary=summary, per_sample=per, items=items, neighbours=nbrs,
                   params={"finding": finding, **{n: getattr(p, n) for n in RECORDED_PARAMS}})


def _items(t: ct.Task, group: str, sample_ids, cluster_ids, queries, disc, disc_all, scored, margin,
           labels, codes, influence, influence_all) -> pd.DataFrame:
    """One group's items for paired comparisons between encoders (``Results.items``, the
    ``Pairing`` of ``methods/candor/__init__.py``): every image the margin AUROC scores (its score
    c+ − c− and label) and every query (its D and D_all indicators), with its patient. Queries and
    banks are the same images for every encoder (candor.md "Implementation": "the same for every
    encoder, so that every comparison across encoders is paired"). ``discordant_bank`` /
    ``discordant_all_bank`` ``_0`` / ``_1``: the item's share of its patient's influence as a bank member
    on the D / D_all of the queries of each half of the patients
    (:mod:`~robustbench_fm.methods.candor.influence`; ``codes`` the patients' codes, ``influence`` (2,
    n_codes))."""
    ids = np.union1d(queries, scored)
    at_q, at_s = np.searchsorted(ids, queries), np.searchsorted(ids, scored)
    query, d, d_all = np.zeros(len(ids), bool), np.full(len(ids), np.nan), np.full(len(ids), np.nan)
    score, label = np.full(len(ids), np.nan), np.full(len(ids), np.nan)
    query[at_q], d[at_q], d_all[at_q] = True, disc, disc_all
    score[at_s], label[at_s] = margin, labels
    return pd.DataFrame({"sample_id": sample_ids[ids], "finding": t.finding, "target": t.target,
                         "acq_group": group, "cluster": cluster_ids[ids], "query": query, "discordant": d,
                         "discordant_all": d_all, "margin": score, "label": label,
                         **{f"discordant_bank_{h}": item_shares(influence[h], codes[ids]) for h in (0, 1)},
                         **{f"discordant_all_bank_{h}": item_shares(influence_all[h], codes[ids]) for h in (0, 1)}})


def _neighbour_frame(columns: dict | None = None) -> pd.DataFrame:
    """``Results.neighbours`` with :data:`NEIGHBOUR_COLUMNS` (empty without ``columns``)."""
    if columns is None:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in zip(NEIGHBOUR_COLUMNS, NEIGHBOUR_DTYPES)})
    return pd.DataFrame(columns, columns=NEIGHBOUR_COLUMNS)


def _neighbour_rows(t: ct.Task, group: str, sample_ids, queries, ok, dm, dm_all, everyone, labels, scored, margin,
                    found: dict, rng: np.random.Generator) -> pd.DataFrame:
    """One group's neighbours of one task (``Results.neighbours``): the k nearest of each side that
    the stage averaged, as :func:`_score_group` found them (``found``), never searched again.

    * every query (the positives scored, ``ok``): its neighbours in the banks (c+, c− of DM;
      ``candidates="bank"``) and among all positives / negatives (D_all; ``"all"``), with ``dm`` and
      ``discordant`` of that set as per_sample holds them (``dm``, ``discordant`` / ``dm_all``,
      ``discordant_all``);
    * at most :data:`NEIGHBOUR_NEGATIVES` negatives of the group whose margin is scored, drawn with
      the (group, task) generator ``rng``: their neighbours in the banks (the terms of their margin),
      ``dm`` = c− − c+ (minus the margin), ``discordant`` where their nearest positives are the nearer
      (dm < 0)."""
    q_pos, q_neg = (side.take(ok) for side in found["queries"])
    a_pos, a_neg = (side.take(ok) for side in found["all"])
    negatives = np.flatnonzero(scored & (labels == 0))  # positions in everyone
    if len(negatives) > NEIGHBOUR_NEGATIVES:
        negatives = np.sort(rng.choice(negatives, NEIGHBOUR_NEGATIVES, replace=False))
    n_pos, n_neg = (side.take(negatives) for side in found["bank"])
    blocks = [(queries, 1, "bank", q_pos, q_neg, dm), (queries, 1, "all", a_pos, a_neg, dm_all),
              (everyone[negatives], 0, "bank", n_pos, n_neg, -margin[negatives])]
    names = pd.array([t.finding, t.target, group, "bank", "all", "pos", "neg"])  # the text columns' values
    columns = {c: [] for c in ("query", "query_label", "candidates", "side", "rank", "neighbour", "similarity",
                               "dm", "discordant")}
    for rows, label, candidates, pos_side, neg_side, dm in blocks:
        n, k = pos_side.rows.shape
        for side, found_side in ((5, pos_side), (6, neg_side)):
            columns["query"].append(np.repeat(rows, k))
            columns["query_label"].append(np.full(n * k, label, np.int8))
            columns["candidates"].append(np.full(n * k, 3 if candidates == "bank" else 4))
            columns["side"].append(np.full(n * k, side))
            columns["rank"].append(np.tile(np.arange(1, k + 1, dtype=np.int16), n))
            columns["neighbour"].append(found_side.rows.ravel())  # every row found k
            columns["similarity"].append(found_side.sims.ravel().astype(np.float64))
            columns["dm"].append(np.repeat(dm, k))
            columns["discordant"].append(np.repeat(dm > 0 if label == 1 else dm < 0, k))
    out = {c: np.concatenate(v) for c, v in columns.items()}
    n = len(out["rank"])
    return _neighbour_frame({
        "finding": names.take(np.zeros(n, np.int64)), "target": names.take(np.ones(n, np.int64)),
        "acq_group": names.take(np.full(n, 2)), "query_id": sample_ids.take(out["query"]),
        "query_label": out["query_label"], "candidates": names.take(out["candidates"]),
        "side": names.take(out["side"]), "rank": out["rank"], "neighbour_id": sample_ids.take(out["neighbour"]),
        "similarity": out["similarity"], "dm": out["dm"], "discordant": out["discordant"]})


def _prepared_tasks(manifest, findings, task, group_col, groups, seed, queries, shuffle_labels, isolated,
                    box_verified) -> list[ct.Task]:
    """The tasks with the label controls applied (restrictions, then shuffling, then roles)."""
    tasks = ct.build_tasks(manifest, findings, task, group_col)
    others = ct.isolation_columns(manifest, findings)
    for t in tasks:
        if isolated:
            t.labels = ct.isolate(t.labels, manifest, t.finding, others)
        if box_verified:
            t.labels = ct.box_verified(t.labels, manifest)
        if shuffle_labels:
            t.labels = ct.shuffle_within_groups(t.labels, groups, seed, t.target)
        if queries == "negative":
            t.labels = 1.0 - t.labels
    return tasks


def _pooled_sets(labels, bank_size, seed):
    """``unmatched``: all positives, all negatives and the two banks drawn from them."""
    pos, neg = np.flatnonzero(labels == 1), np.flatnonzero(labels == 0)
    if min(len(pos), len(neg)) == 0:
        return pos, neg, pos[:0], neg[:0]
    bank_pos, bank_neg = draw_banks(pos, neg, bank_size, group_rng(seed, UNMATCHED))
    return pos, neg, bank_pos, bank_neg


def margin_chance_low(k: int, n_bank: int, own_pos: int, n_pos: int, own_neg: int, n_neg: int) -> float:
    """The lowest chance level of the margin AUROC for label-free features (the bound stated beside
    it, as candor.md "The Discordance Rate and Its Chance Level" states D's ≤ 1/2 + k/n): the
    group's banks hold ``n_bank`` images each; ``own_pos`` of the ``n_pos`` scored positives are in
    R+ and ``own_neg`` of the ``n_neg`` scored negatives in R−.

    Derivation (features i.i.d., continuous; a positive p in R+ and a negative q in R−, S± = R± less
    p / q, n − 1 each): t(x) = c(x; S+) − c(x; S−) scores p and q against the same sets that hold
    neither, so t(p), t(q) are exchangeable and P(t(p) > t(q)) = 1/2. The stage scores
    s(p) = c(p; S+) − c(p; S− ∪ {q}) ≤ t(p) and s(q) = c(q; S+ ∪ {p}) − c(q; S−) ≥ t(q): adding a
    candidate never lowers a top-k mean, and it changes it only if it enters the top k of the n,
    probability k/n by exchangeability. Hence 1/2 − 2k/n ≤ P(s(p) > s(q)) ≤ 1/2; a pair with only p
    (only q) in its bank loses at most k/n, a pair with neither nothing. Averaged over the pairs:
    1/2 − (k/n)(own_pos/n_pos + own_neg/n_neg) ≤ chance ≤ 1/2, i.e. 1/2 − k/n+ − k/n− when the banks
    hold all their images' class (clipped at 0). The bound is distribution-free; the realised chance
    depends on the geometry (simulated with Gaussian features, d = 32, k = 5: 0.42 at 12 vs 12,
    0.49 at 45 vs 255, against bounds 0 and 0.37)."""
    if min(n_bank, n_pos, n_neg) <= 0:
        return float("nan")
    return float(max(0.0, 0.5 - k / n_bank * (own_pos / n_pos + own_neg / n_neg)))


def _row(t: ct.Task, group: str, k: int, **values) -> dict:
    row = dict(finding=t.finding, acq_group=group, target=t.target, n_queries=0, n_pos=0, n_neg=0,
               bank_size=pd.NA, k=k)
    row.update({f"{m}{s}": np.nan for m in METRICS for s in ("", "_sd", "_ci_low", "_ci_high")})
    row["margin_chance_low"] = np.nan
    row["reason"] = row["note"] = ""
    row.update(values)
    return row


def _summary(tasks, rows, parts, clusters, k, n_boot, seed, auroc_boot, cluster_col="patient_id") -> pd.DataFrame:
    """Group rows, one pooled row per task, the pools across tasks, and their bootstrap
    (:func:`~robustbench_fm.methods.candor.bootstrap.row_intervals`)."""
    pooled = {i: _pooled_row(t, k, [p for p in parts if p["task"] == i]) for i, t in enumerate(tasks)}
    combos = _combined_rows(tasks, pooled, k)
    row_intervals(tasks, parts, pooled, combos, clusters, n_boot, seed, auroc_boot, cluster_col)
    out = []
    for f in dict.fromkeys(t.finding for t in tasks):
        for i, t in enumerate(tasks):
            if t.finding == f:
                out += [*rows[i], pooled[i]]
        out += [row for row, _, _ in combos if row["finding"] == f]
    out += [row for row, _, _ in combos if row["finding"] not in {t.finding for t in tasks}]
    summary = pd.DataFrame(out)
    summary["bank_size"] = summary["bank_size"].astype("Int64")
    return summary


def _pooled_row(t: ct.Task, k: int, parts: list[dict]) -> dict:
    """Groups pooled by number of queries: D and D_all over all queries, the margin AUROC as the
    query-weighted mean of the groups'."""
    row = _row(t, POOLED, k)
    if not parts:
        row["reason"] = "no matched group could be scored"
        return row
    disc = np.concatenate([p["disc"] for p in parts])
    weights = auroc_weights(parts)
    row.update(n_queries=sum(len(p["queries"]) for p in parts), n_pos=sum(p["row"]["n_pos"] for p in parts),
               n_neg=sum(p["row"]["n_neg"] for p in parts), d=float(disc[:, 0].mean()),
               d_all=float(disc[:, 1].mean()),
               margin_auroc=float(np.nan_to_num([p["row"]["margin_auroc"] for p in parts]) @ weights / weights.sum())
               if weights.sum() else np.nan,
               margin_chance_low=_weighted([p["row"]["margin_chance_low"] for p in parts], weights))
    return row


def _weighted(values, weights: np.ndarray) -> float:
    """The ``weights``-weighted mean of ``values`` over the rows weighted above 0 (NaN if one is NaN)."""
    values, kept = np.asarray(values, float), weights > 0
    return float(values[kept] @ weights[kept] / weights[kept].sum()) if kept.any() else np.nan


def _combined_rows(tasks, pooled, k) -> list[tuple[dict, list[int], np.ndarray]]:
    """Pools across tasks as (row, task indices, weights for D and D_all): the severity-weighted
    chest pool of the scored chest findings, and each one-vs-rest finding's unweighted mean over
    its scored classes (candor.md "Reporting", "Scope"). The margin AUROC is the plain mean."""
    combos = ct.task_pools(tasks, [bool(np.isfinite(pooled[i]["d"])) for i in range(len(tasks))])
    out = []
    for t, members, weights in combos:
        row = _row(t, POOLED, k)
        if not members:
            row["reason"] = "no task could be scored"
        else:
            values = {m: np.array([pooled[i][m] for i in members]) for m in METRICS}
            row.update(n_queries=sum(pooled[i]["n_queries"] for i in members),
                       n_pos=sum(pooled[i]["n_pos"] for i in members),
                       n_neg=sum(pooled[i]["n_neg"] for i in members),
                       d=float(weights @ values["d"] / weights.sum()),
                       d_all=float(weights @ values["d_all"] / weights.sum()),
                       margin_auroc=float(values["margin_auroc"].mean()),
                       margin_chance_low=float(np.mean([pooled[i]["margin_chance_low"] for i in members])))
        out.append((row, members, weights))
    return out


class _Workspaces:
    """Finished groups' similarity matrices, handed to the next groups' shortlists so that their
    memory is reused (:func:`~robustbench_fm.core.neighbors.symmetric_matrix`'s ``workspace``);
    thread-safe, for groups scored side by side."""

    def __init__(self):
        self._spare: list[torch.Tensor] = []
        self._lock = threading.Lock()

    def take(self, numel: int) -> torch.Tensor | None:
        """A spare matrix of at least ``numel`` entries, or None (the smaller ones freed first)."""
        with self._lock:
            while self._spare:
                matrix = self._spare.pop()
                if matrix.numel() >= numel:
                    return matrix
            return None

    def give(self, matrix: torch.Tensor | None) -> None:
        if matrix is not None:
            with self._lock:
                self._spare.append(matrix)

    def clear(self) -> None:
        with self._lock:
            self._spare.clear()


#: similarity matrices that groups scored side by side may hold at once (:func:`_map_groups`): 8 groups of
#: 8,000 images, 2 of the largest held matrix (:data:`~robustbench_fm.methods.candor.shortlist.MATRIX_BYTES`)
SIDE_BY_SIDE_BYTES = 2 << 30


def _map_groups(score, groups: list[str], device: torch.device, matrix_bytes: int = 0):
    """``score`` of every group, in ``groups`` order. On the CPU with several torch threads the groups
    are scored side by side, one per thread and each with one torch thread (the group's shortlist,
    scoring and resamples are its own: the same ops, the same values), as many at a time as there are
    threads and as :data:`SIDE_BY_SIDE_BYTES` holds of ``matrix_bytes`` (a group's similarity matrix);
    the remaining few, and every group elsewhere, one after another with all the threads."""
    workers = min(torch.get_num_threads(), max(1, SIDE_BY_SIDE_BYTES // max(matrix_bytes, 1)))
    side_by_side = len(groups) - len(groups) % workers if device.type == "cpu" and workers > 1 else 0
    if side_by_side:
        with torch_threads(1):
            pool = ThreadPoolExecutor(workers, thread_name_prefix="candor_group")
            try:
                yield from pool.map(score, groups[:side_by_side])
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
    yield from map(score, groups[side_by_side:])  # fewer groups than threads: each with all the threads
