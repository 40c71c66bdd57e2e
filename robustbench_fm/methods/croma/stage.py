"""CRoMa stage: RI, MaRI and the Cross-confounder Robustness Margin of one encoder's features
(croma.md §2.3–2.5 and §2.7; conventions in croma_conventions.md A.1–A.8), exact and equal to the
reference package ``croma`` 1.0.1 on the same features.

Pair types of an anchor i and a candidate j (A.2): SO = same label, other confounder value
(biological match); OS = other label, same confounder value (confounder impostor). Candidates
sharing the anchor's ``exclude_col`` group (slide) and the anchor itself are never neighbours (A.3).

* **k**: ``k=None`` picks k* = argmax over ``k_grid`` of the leave-one-group-out majority-vote kNN
  balanced accuracy on the label (smallest code wins a vote tie, the first k in grid order wins a
  score tie; paired: the mean over subsets, smallest k on ties; A.5); an int fixes k (the
  median-k protocol of :mod:`robustbench_fm.methods.croma.panel`).
* **RI** = Σ n_SO / Σ (n_SO + n_OS) over the units' k nearest cross-group neighbours (A.4);
  **MaRI** the same with weights exp(−d/τ), τ = median typed-slot cosine distance at k (0.2 if
  none; A.6); **support** = share of units with a typed neighbour in their top-k.
* **CRoMa_i** = (d_OS − d_SO)/(d_OS + d_SO), d = mean cosine distance to the m nearest cross-group
  SO / OS candidates over the whole scope (A.7); ``croma`` = median (paired: median of subset
  medians); ``f0`` = share ≤ 0; ``q_alpha`` = numpy linear percentile α; ``ltm`` = mean of the
  values ≤ q_alpha.
* **Ties**: candidates at exactly the same cosine distance are taken in sample_id order, and
  identical feature rows are one vector, so they tie exactly (:mod:`robustbench_fm.methods.croma.knn`,
  "Identical rows are one vector" and "Tie rule"): at a given k, RI, MaRI, τ, support and CRoMa never
  depend on the manifest's row order. The kNN accuracies follow croma's vote-tie convention
  (smallest first-appearance code, A.5), so they, and k* through them, may change with the row
  order where votes tie (even k, three or more classes), by design. The reference breaks distance
  ties arbitrarily (sklearn's argpartition), so on tied (quantised, duplicated) features it may
  differ from us.
* **bio_knn_bacc** / **conf_knn_bacc**: kNN balanced accuracy of the label / the confounder at
  the operating k (A.5, F.13).
* ``design="paired_2x2"``: one manifest row per (sample, subset) occurrence; a subset that is not
  a complete 2×2 (label × confounder) stops the stage with one line naming every such subset, as
  croma 1.0.1's ``validate_subset_manifest`` does (``on_incomplete="skip"``: they are skipped
  with a warning and the complete ones scored); every neighbourhood stays inside its subset;
  RI/MaRI/support/F(0)/Q/LTM pool the occurrences (A.8).
* **Rounding floor**: a unit whose m nearest SO and OS candidates are all
  identical rows has d_SO + d_OS = 0 exactly; its CRoMa_i is NaN (0/0), and only when every unit
  is so does the stage stop (croma 1.0.1 raises "zero margin denominator" for any such unit). A
  unit of distinct rows whose denominator is within the features' rounding
  (:func:`zero_margin_tolerance`) is scored; the summary counts these units in ``n_floor`` (present
  when non-zero) and a warning names float64 as the fix.
* **F(0)** = share of units with CRoMa_i ≤ 0 (the reference's closed boundary); the paper's
  Eq. 12 writes F(0) = P[CRoMa_m(i) < 0]. The two differ only by units at exactly 0.

A unit with fewer than m SO or m OS candidates stops the stage with one line naming the short
label × confounder cells (as the reference does), unless ``on_short="skip"``: those units get
NaN CRoMa and the summary records ``n_short`` and ``short_cells``.

``summary`` (one row): ``ri, mari, tau, k, support, croma, f0, q_alpha, ltm, bio_knn_bacc,
conf_knn_bacc, n, selected_k_confounder, ri_median, ri_q_alpha, ri_ltm, mari_median, mari_q_alpha,
mari_ltm, ss_undefined_frac, oo_undefined_frac, mixed_undefined_frac, croma_auc, croma_min,
croma_delta, m_sweep, m_range, n_undefined_m1, ri_std, mari_std, croma_std, reason`` (+ ``n_subsets``
paired; + ``n_floor`` when units are at the rounding floor; + ``n_short, short_cells`` with
``on_short="skip"``; ``finding`` first when the app loop passes one). The further fields are those
croma's benchmark reports (its ``scripts/bench/benchmark.py``): ``selected_k_confounder`` = the k the
confounder's kNN balanced accuracy peaks at over the grid; the RI / MaRI median, Q and LTM of the
defined per-unit values at croma's fixed α = 0.10 (:data:`RI_TAIL_ALPHA`, whatever ``alpha``, which
sets CRoMa's ``q_alpha`` / ``ltm`` only; A.4); the undefined units by cause as fractions of all units
(A.4: more SS than OO neighbours, more OO than SS, or mixed / none); CRoMa over m = 1..``m_sweep``:
``croma_auc`` (trapezoid area / width), ``croma_min``, ``croma_delta`` = value(m_sweep) − value(1)
(croma.md A.3), ``m_range`` the range swept ("1..20", or "1..12 of 1..20 asked (...)" where a unit
has fewer SO or OS candidates than ``m_sweep``: :func:`sweep_range`, with a warning), and
``n_undefined_m1`` the units whose CRoMa_i is undefined at m = 1 (zero margin denominator: duplicate
rows; the sweep's value there is the median of the others, where croma 1.0.1 refuses;
:func:`check_sweep`); the spreads over subsets (``np.std``; 0.0 under ``all``, one scope, as croma
writes them). ``reason`` is "" or why CRoMa was not
computed (a collapsed embedding: every margin denominator 0; RI and MaRI are still reported, as
croma 1.0.1 still scores them). ``per_sample`` (manifest order): ``sample_id, croma, d_so, d_os, ri,
mari, undefined``, the counts ``n_so, n_typed`` and MaRI's weights ``so_weight, typed_weight`` whose
pooled ratios are RI and MaRI, and ``cluster`` (the ``exclude_col`` group: the slide paired comparisons
between encoders resample) (+ ``subset`` paired); ``ri``/``mari`` are NaN where the unit has no typed neighbour
in its top-k, and ``undefined`` then names the cause (``ss_dominated``, ``oo_dominated``, ``mixed``).

``neighbours`` (:data:`NEIGHBOUR_COLUMNS`, saved as ``neighbours.parquet``; docs/neighbourhoods.md): every
anchor's k nearest cross-group neighbours at the operating k, read off the scope pass's lists that RI and
MaRI count (:func:`neighbour_table`), with each one's label, centre (``confounder_col``), pair type and
cosine distance.

**MaRI arithmetic** (croma 1.0.1's, A.6): weights exp(−d/τ) in float64 summed per unit in slot
order; where a unit's (or the pooled) total falls below float64's smallest normal number the ratio
is taken from extended-precision log weights −d/τ, so a tiny or subnormal τ gives the
winner-take-all limit (1 where the nearest typed neighbour is SO, 0 where OS), never NaN.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from ...core.devices import resolve_device
from ...core.neighbors import l2_normalize
from ...core.results import Results
from ...core.stats import cluster_halves
from .. import missing_column
from .influence import median_influence, search_widths, shares_products
from .knn import ScopeNeighbours, scope_neighbours, tie_keys
from .params import DEFAULT_K_GRID, DESIGNS, ON_INCOMPLETE, ON_SHORT, RI_TAIL_ALPHA, CromaParams  # noqa: F401
from .params import grid as _grid
from .scores import (
    UNDEFINED,
    count_share,
    croma_values,
    distribution,
    evidence,
    knn_balanced_accuracy,
    pooled_share,
    resolve_tau,
    slot_types,
    so_share,
    spread,
    sweep_summary,
    tail,
    undefined_causes,
)

PARAMS = CromaParams
#: ``Results.neighbours`` (:func:`neighbour_table`): one row per (anchor, rank) of the operating k's lists
NEIGHBOUR_COLUMNS = ["finding", "subset", "anchor_id", "label", "centre", "rank", "neighbour_id", "neighbour_label",
                     "neighbour_centre", "type", "distance"]
#: the pair types of :func:`~robustbench_fm.methods.croma.scores.slot_types` (A.2), as ``type`` writes them
PAIR_TYPES = ("SO", "OS", "SS", "OO")


@dataclass
class Scope:
    """One neighbourhood scope: manifest row positions and per-row codes in scope order."""

    name: str
    rows: np.ndarray
    labels: np.ndarray
    confs: np.ndarray
    groups: np.ndarray
    label_names: np.ndarray
    conf_names: np.ndarray
    nb: ScopeNeighbours | None = None

    @property
    def size(self) -> int:
        return len(self.rows)


@dataclass
class Prepared:
    """The neighbour pass of every scope, enough to score any k ≤ ``k_max`` and any m ≤ ``m_max``.

    ``k_grid``: the grid values below the largest scope size (k* and the confounder's k* are
    chosen over them); ``k_max``: the longest list prepared (the grid's largest, or a fixed k
    beyond it); ``m_max``: the end of the m sweep (:func:`sweep_end`), ``m_sweep`` the end asked."""

    scopes: list[Scope]
    sample_ids: np.ndarray
    design: str
    k_grid: tuple[int, ...]
    m_max: int
    columns: dict = field(default_factory=dict)
    dtype: type = np.float32
    dim: int = 1
    k_max: int = 0
    clusters: np.ndarray | None = None  # each manifest row's exclude_col group (slide): the bootstrap cluster
    m_sweep: int = 0  # the m sweep's end asked (``m_sweep``); 0: m_max
    fewest: int | None = None  # the fewest cross-group SO or OS candidates of any unit (:func:`fewest_candidates`)

    def __post_init__(self):
        self.k_max = self.k_max or max(self.k_grid)


def check_params(**params) -> CromaParams:
    """Refuse unknown, mistyped or inconsistent options before any heavy work (one line each;
    :class:`~robustbench_fm.methods.croma.params.CromaParams`)."""
    return PARAMS.parse(params)


def _strings(manifest: pd.DataFrame, col: str, param: str) -> np.ndarray:
    """Column values as stripped strings; a missing column or an empty value is refused."""
    if col not in manifest.columns:
        raise missing_column("croma", col, param, manifest.columns)
    values = manifest[col]
    text = values.map(lambda v: "" if pd.isna(v) else str(v).strip()).to_numpy(dtype=object)
    empty = np.flatnonzero(text == "")
    if empty.size:
        raise ValueError(f"croma: column '{col}' ({param}) is empty at row {int(empty[0])} "
                         f"({empty.size} rows); fill it or drop those rows")
    return text


def _scope(name: str, rows: np.ndarray, labels: np.ndarray, confs: np.ndarray, groups: np.ndarray) -> Scope:
    """Codes in order of first appearance inside the scope (``pd.factorize``; conventions A.1)."""
    lab, lab_names = pd.factorize(labels[rows])
    con, con_names = pd.factorize(confs[rows])
    grp, _ = pd.factorize(groups[rows])
    return Scope(name, rows, lab.astype(np.int64), con.astype(np.int64), grp.astype(np.int64),
                 np.asarray(lab_names), np.asarray(con_names))


def build_scopes(manifest: pd.DataFrame, label_col: str, confounder_col: str, exclude_col: str,
                 design: str, subset_col: str, on_incomplete: str = "error") -> list[Scope]:
    """One scope of all rows, or the complete 2×2 subsets in sorted subset order (A.8); an
    incomplete subset is refused (``on_incomplete="error"``, croma 1.0.1) or skipped with a warning."""
    labels = _strings(manifest, label_col, "finding")  # the label column is the finding (stage.findings)
    confs = _strings(manifest, confounder_col, "confounder_col")
    groups = _strings(manifest, exclude_col, "exclude_col")
    if design == "all":
        return [_scope("all", np.arange(len(manifest)), labels, confs, groups)]
    subsets = _strings(manifest, subset_col, "subset_col")
    scopes, incomplete = [], []
    for name in sorted(set(subsets)):
        rows = np.flatnonzero(subsets == name)
        cells = set(zip(labels[rows], confs[rows]))
        if len({c[0] for c in cells}) == 2 and len({c[1] for c in cells}) == 2 and len(cells) == 4:
            scopes.append(_scope(name, rows, labels, confs, groups))
        else:
            incomplete.append(name)
    if incomplete and on_incomplete == "error":
        shown = ", ".join(map(repr, incomplete[:10])) + (f" and {len(incomplete) - 10} more" if len(incomplete) > 10
                                                         else "")
        raise ValueError(f"croma: {len(incomplete)} of {len(incomplete) + len(scopes)} subsets in column "
                         f"'{subset_col}' are not a complete 2x2 ({label_col} x {confounder_col}: 2 values each, "
                         f"every cell filled): {shown}; fix the manifest, or pass on_incomplete='skip' to score "
                         "the complete ones")
    if not scopes:
        raise ValueError(f"croma: no complete 2x2 ({label_col} x {confounder_col}) subset in column "
                         f"'{subset_col}'; each subset needs 2 labels x 2 confounder values, every cell filled")
    if incomplete:
        warnings.warn(f"croma: {len(incomplete)} incomplete 2x2 subsets skipped (first: {incomplete[0]!r})",
                      RuntimeWarning, stacklevel=3)
    return scopes


def typed_pool_sizes(scope: Scope) -> tuple[np.ndarray, np.ndarray]:
    """Number of cross-group SO and OS candidates of every unit in the scope."""
    lab, con, grp = scope.labels, scope.confs, scope.groups

    def count(*keys):
        key = np.zeros(len(lab), dtype=np.int64)
        for k in keys:
            key = key * (int(k.max()) + 1) + k
        _, inv, cnt = np.unique(key, return_inverse=True, return_counts=True)
        return cnt[inv]

    n_lc, n_glc = count(lab, con), count(grp, lab, con)
    so = (count(lab) - n_lc) - (count(grp, lab) - n_glc)
    os_ = (count(con) - n_lc) - (count(grp, con) - n_glc)
    return so, os_


def _short_units(scopes: list[Scope], m: int, label_col: str, confounder_col: str) -> tuple[int, str]:
    """How many units lack m SO or m OS candidates, and the label × confounder cells they sit in."""
    cells: dict[tuple[str, str], list[int]] = {}
    total = 0
    for s in scopes:
        so, os_ = typed_pool_sizes(s)
        short_so, short_os = so < m, os_ < m
        total += int((short_so | short_os).sum())
        for i in np.flatnonzero(short_so | short_os):
            tally = cells.setdefault((s.label_names[s.labels[i]], s.conf_names[s.confs[i]]), [0, 0])
            tally[0] += int(short_so[i])
            tally[1] += int(short_os[i])
    text = "; ".join(f"{label_col}={lab!r} x {confounder_col}={con!r}: {n_so} short of SO, {n_os} short of OS"
                     for (lab, con), (n_so, n_os) in sorted(cells.items()))
    return total, text


def _operating_grid(scopes: list[Scope], k_grid: tuple[int, ...], k: int | None) -> tuple[tuple[int, ...], int]:
    """(the grid restricted to k < scope size (A.5), the longest list to prepare: the grid's
    largest k or the fixed k). With a fixed k the grid is still prepared, so the confounder's k*
    (``selected_k_confounder``) is chosen over it as croma's benchmark does under median-k."""
    largest = max(s.size for s in scopes)
    usable = tuple(v for v in k_grid if v < largest)
    wanted = usable if k is None else (int(k),)
    if not wanted or wanted[0] >= largest:
        shown = list(k_grid) if k is None else [int(k)]
        raise ValueError(f"croma: no k in {shown} is below the largest scope size {largest}; "
                         "pass smaller k values")
    return usable or wanted, max(usable + wanted)


def fewest_candidates(scopes: list[Scope]) -> int:
    """The fewest cross-group SO or OS candidates any unit of ``scopes`` has."""
    return min(int(min(so.min(), os_.min())) for so, os_ in map(typed_pool_sizes, scopes))


def sweep_end(scopes: list[Scope], m: int, m_sweep: int) -> int:
    """The last m of the CRoMa m sweep: ``m_sweep`` (croma's benchmark: 20), lowered to the
    fewest SO or OS candidates any unit has, never below the headline ``m``."""
    return max(int(m), min(int(m_sweep), fewest_candidates(scopes)))


def sweep_range(prep: Prepared) -> str:
    """The m sweep's range as the summary's ``m_range`` says it: ``"1..20"``, or, where it ends
    elsewhere than ``m_sweep`` asked (croma's benchmark sweeps 1..20 and refuses a cohort with a
    unit short of 20 SO or OS candidates), ``"1..12 of 1..20 asked (a unit has only 12 cross-group
    SO or OS candidates)"``."""
    asked = prep.m_sweep or prep.m_max
    if prep.m_max == asked:
        return f"1..{prep.m_max}"
    why = (f"a unit has only {prep.fewest} cross-group SO or OS candidates" if prep.m_max < asked
           else f"raised to the headline m={prep.m_max}")
    return f"1..{prep.m_max} of 1..{asked} asked ({why})"


def prepare(features, manifest: pd.DataFrame, label_col: str = "bio_label", confounder_col: str = "site",
            exclude_col: str = "slide_id", m: int = 5, k_grid=DEFAULT_K_GRID, k: int | None = None,
            design: str = "all", subset_col: str = "subset", on_short: str = "error", device="auto",
            block_size: int = 4096, on_incomplete: str = "error", m_sweep: int = CromaParams.m_sweep,
            bank_lists: bool = False) -> Prepared:
    """Scopes and their single neighbour pass (cross-group top-k_max + typed top-m_max, m_max =
    :func:`sweep_end`). ``bank_lists``: the pass also keeps the typed lists the slides' influence
    (:func:`_bank_shares`) searches first, with their rows, where their similarities are the very
    products the influence would compute: float32 features on the CPU, every tile edge of both passes
    at least 64 (:func:`~robustbench_fm.methods.croma.influence.shares_products`), no identical rows (the
    pass sets a copy's similarity to 1); the influence then needs no second pass over the scope."""
    check_params(m=m, k_grid=k_grid, k=k, design=design, on_short=on_short, block_size=block_size,
                 on_incomplete=on_incomplete, m_sweep=m_sweep)
    x = l2_normalize(features.cpu().numpy() if isinstance(features, torch.Tensor) else features, "croma: features",
                     dtype=None)
    if len(x) != len(manifest):
        raise ValueError(f"croma: features have {len(x)} rows but the manifest has {len(manifest)}; "
                         "align them row for row")
    scopes = build_scopes(manifest, label_col, confounder_col, exclude_col, design, subset_col, on_incomplete)
    if on_short == "error":
        n_short, cells = _short_units(scopes, int(m), label_col, confounder_col)
        if n_short:
            raise ValueError(f"croma: {n_short} of {sum(s.size for s in scopes)} units have fewer than "
                             f"m={m} cross-group SO or OS candidates ({cells}); lower m, or pass "
                             "on_short='skip' to score the others")
    grid, k_max = _operating_grid(scopes, _grid(k_grid), k)
    m_max = sweep_end(scopes, int(m), int(m_sweep))
    feats = torch.as_tensor(x).to(resolve_device(device))
    sample_ids = manifest["sample_id"].astype(str).to_numpy()
    bank_lists = bank_lists and x.dtype == np.float32 and feats.device.type == "cpu"
    for s in scopes:
        rows = torch.as_tensor(s.rows, device=feats.device)
        s.nb = scope_neighbours(feats[rows], s.labels, s.confs, s.groups, k_max, m_max, block_size,
                                tie_key=tie_keys(sample_ids[s.rows]),
                                typed_width=search_widths(s.size, int(m), s.groups)[0] + 1
                                if bank_lists and shares_products(s.size, block_size) else 0)
    columns = dict(label_col=label_col, confounder_col=confounder_col, exclude_col=exclude_col)
    return Prepared(scopes, manifest["sample_id"].astype(str).to_numpy(), design, grid, m_max, columns,
                    x.dtype.type, int(x.shape[1]), k_max,
                    _strings(manifest, exclude_col, "exclude_col"), int(m_sweep), fewest_candidates(scopes))


def zero_margin_tolerance(dtype, dim: int) -> float:
    """The rounding floor of a margin denominator d_SO + d_OS: cosine distances of unit rows
    computed in ``dtype`` carry an error of about eps·sqrt(D) (a dot product of D terms), so at or
    below 4·eps·sqrt(D) (float32, D = 1,536: 1.9e-5; float64: 3.5e-14) a unit's CRoMa_i is
    dominated by rounding. Such units are scored and counted (``n_floor``, :func:`margin_floor`)."""
    return float(4 * np.finfo(dtype).eps * np.sqrt(max(int(dim), 1)))


def margin_floor(d_so: np.ndarray, d_os: np.ndarray, dtype, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(units whose margin denominator is exactly 0, units at the rounding floor) of one scope.

    A denominator is exactly 0 only when the unit's m nearest SO and m nearest OS candidates are
    copies of it (identical rows are at distance exactly 0, :mod:`~robustbench_fm.methods.croma.knn`):
    its CRoMa_i is 0/0 and is left NaN (croma 1.0.1 refuses the whole call, "zero margin
    denominator"). A positive denominator at or below :func:`zero_margin_tolerance` is computed
    (the rows are distinct) but carries rounding error."""
    total = d_so + d_os
    finite = np.isfinite(total)
    return finite & (total == 0), finite & (total <= zero_margin_tolerance(dtype, dim))


def _margins(prep: Prepared, s: Scope, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """d_SO, d_OS, CRoMa_i (NaN where the denominator is exactly 0) and the floor mask of a scope."""
    d_so, d_os, c = croma_values(s.nb.so_dist, s.nb.os_dist, m)
    zero, floor = margin_floor(d_so, d_os, prep.dtype, prep.dim)
    c[zero] = np.nan
    return d_so, d_os, c, floor


def zero_margins(prep: Prepared, m: int) -> tuple[int, int]:
    """(units whose margin denominator at ``m`` is exactly 0, units at the rounding floor; the
    first among the second) over all scopes (:func:`margin_floor`)."""
    zero = floor = 0
    for s in prep.scopes:
        d_so, d_os, _ = croma_values(s.nb.so_dist, s.nb.os_dist, m)
        z, f = margin_floor(d_so, d_os, prep.dtype, prep.dim)
        zero, floor = zero + int(z.sum()), floor + int(f.sum())
    return zero, floor


def check_margins(prep: Prepared, m: int) -> tuple[int, str]:
    """(units at the rounding floor (:func:`margin_floor`) over all scopes, why CRoMa is not
    computed or ""). When no unit can be scored (every margin denominator is 0: a collapsed
    embedding) CRoMa is refused with that reason, as croma 1.0.1 refuses its CRoMa call while its
    RI and MaRI calls still score; units at the floor are warned about (naming float64)."""
    n = sum(s.size for s in prep.scopes)
    zero, floor = zero_margins(prep, m)
    name, tol = np.dtype(prep.dtype).name, zero_margin_tolerance(prep.dtype, prep.dim)
    if zero and zero == n:
        reason = (f"CRoMa not computed (RI and MaRI are): {zero}/{n} units have a zero margin denominator "
                  "(d_OS + d_SO = 0: their m nearest SO and OS candidates are identical rows, a collapsed "
                  "embedding); check the features")
        warnings.warn(f"croma: {reason}", RuntimeWarning, stacklevel=3)
        return floor, reason
    if floor:
        warnings.warn(f"croma: {floor}/{n} units have d_OS + d_SO <= {tol:.2g}, the {name} rounding floor "
                      f"(n_floor in the summary; {zero} of them exactly 0, identical rows, left NaN): their "
                      "CRoMa_i carry rounding error; pass float64 features to compute them exactly",
                      RuntimeWarning, stacklevel=3)
    return floor, ""


def check_sweep(prep: Prepared, refused: str = "") -> int:
    """Units whose CRoMa_i is undefined at m = 1 (``n_undefined_m1``: a zero margin denominator,
    their nearest SO and nearest OS candidates are copies of them), warned about with the last m
    where such units remain, as the m sweep's ``croma_auc`` / ``croma_min`` / ``croma_delta`` take
    the median of the other units there, where croma 1.0.1 refuses the whole sweep ("zero margin
    denominator"); and a warning where the sweep ends elsewhere than ``m_sweep`` asked
    (:func:`sweep_range`). A zero denominator at some m implies one at every smaller m (the m
    nearest distances are a prefix), so m = 1 holds the most."""
    n = sum(s.size for s in prep.scopes)
    zero = zero_margins(prep, 1)[0]
    if zero and not refused:
        last = max(m for m in range(1, prep.m_max + 1) if zero_margins(prep, m)[0])
        upto = f" (and some up to m = {last})" if last > 1 else ""
        warnings.warn(f"croma: {zero}/{n} units have a zero margin denominator at m = 1{upto}: "
                      "d_OS + d_SO = 0, their nearest SO and OS candidates are copies of them (duplicate rows); "
                      "the m sweep's croma_auc / croma_min / croma_delta take the median of the other units there, "
                      "where croma 1.0.1 refuses (n_undefined_m1 in the summary); drop the duplicates to score every "
                      "unit", RuntimeWarning, stacklevel=3)
    if prep.m_sweep and prep.m_max < prep.m_sweep:
        warnings.warn(f"croma: the m sweep ends at m = {prep.m_max}, not m_sweep = {prep.m_sweep}: a unit has only "
                      f"{prep.fewest} cross-group SO or OS candidates; "
                      f"croma_auc / croma_min / croma_delta are over m = 1..{prep.m_max} (m_range in the summary), "
                      "not comparable with a full sweep", RuntimeWarning, stacklevel=3)
    return zero


def _mean_over_scopes(prep: Prepared, codes_of, ks) -> dict[int, float]:
    """kNN balanced accuracy per k, averaged over the scopes where k < scope size (A.5)."""
    per_scope = [knn_balanced_accuracy(codes_of(s), s.nb, [k for k in ks if k < s.size]) for s in prep.scopes]
    out = {}
    for k in ks:
        values = [sc[k] for sc in per_scope if k in sc]
        if values:
            out[k] = float(np.mean(values))
    return out


def _best_k(prep: Prepared, scores: dict[int, float]) -> int:
    """The first maximum in grid order (all), in ascending k order (paired) (conventions A.5)."""
    order = list(prep.k_grid) if prep.design == "all" else sorted(scores)
    return max((k for k in order if k in scores), key=lambda k: (scores[k], -order.index(k)))


def select_k(prep: Prepared) -> tuple[int, dict[int, float]]:
    """k* and the label kNN balanced accuracy over the grid: first maximum in grid order (all),
    in ascending k order (paired: mean over subsets) (conventions A.5)."""
    scores = _mean_over_scopes(prep, lambda s: s.labels, prep.k_grid)
    if not scores:
        raise ValueError("croma: no unit has any cross-group neighbour; every row shares one "
                         "exclude_col group, so k cannot be selected")
    return _best_k(prep, scores), scores


def select_k_confounder(prep: Prepared) -> int | None:
    """The k the confounder's kNN balanced accuracy peaks at over the grid, by the rule of
    :func:`select_k` (croma's benchmark, ``selected_k_confounder``); None where no unit votes."""
    scores = confounder_curve(prep)
    return _best_k(prep, scores) if scores else None


def confounder_curve(prep: Prepared) -> dict[int, float]:
    """Confounder kNN balanced accuracy at every prepared k (Table 14 reports its maximum)."""
    return _mean_over_scopes(prep, lambda s: s.confs, prep.k_grid)


def croma_by_m(prep: Prepared, ms, alpha: float = 0.10) -> pd.DataFrame:
    """CRoMa (median / median of subset medians), F(0), Q_α, LTM_α at each m ≤ m_max from the
    one typed search (conventions A.7; the m sweep of croma.md A.3)."""
    rows = []
    for m in ms:
        if not 1 <= m <= prep.m_max:
            raise ValueError(f"croma: m={m} is outside 1..{prep.m_max} prepared; prepare with m={m}")
        values, medians = [], []
        for s in prep.scopes:
            _, _, c, _ = _margins(prep, s, m)
            values.append(c)
            finite = c[np.isfinite(c)]
            medians.append(float(np.median(finite)) if finite.size else np.nan)
        medians = np.array(medians)
        f0, q, ltm = tail(np.concatenate(values), alpha)
        ok = medians[np.isfinite(medians)]
        rows.append(dict(m=int(m), croma=float(np.median(ok)) if ok.size else np.nan,
                         croma_std=float(ok.std()) if ok.size > 1 else 0.0, f0=f0, q_alpha=q, ltm=ltm))
    return pd.DataFrame(rows)


def score(prep: Prepared, k: int, m: int = 5, alpha: float = 0.10, tau: float | None = None,
          on_short: str = "error") -> tuple[dict, pd.DataFrame, str]:
    """Summary row, per-sample table and how τ was set ("auto" | "fallback" | "pinned") at
    operating ``k`` (see module doc)."""
    if k > prep.k_max:
        raise ValueError(f"croma: k={k} exceeds the prepared neighbour lists (k <= {prep.k_max})")
    if not 1 <= m <= prep.m_max:
        raise ValueError(f"croma: m={m} is outside 1..{prep.m_max} prepared; prepare with m={m}")
    slots = [slot_types(s.labels, s.confs, s.nb, k) for s in prep.scopes]
    typed = np.concatenate([d[so | os_] for so, os_, _, _, d in slots])
    tau_used, tau_source = resolve_tau(typed) if tau is None else (float(tau), "pinned")
    if tau is not None and typed.size:
        median = float(np.median(typed))
        if not median / 4 <= tau <= median * 4:
            warnings.warn(f"croma: pinned tau={tau} is off the typed-distance scale (median {median:.3g}, "
                          f"principled range [{median / 4:.3g}, {median * 4:.3g}])", RuntimeWarning, stacklevel=3)
    so_all, os_all = (np.concatenate(part) for part in zip(*[(so, os_) for so, os_, _, _, _ in slots]))
    _, ri_pooled = count_share(so_all, os_all)
    mari_ev = [evidence(so, os_, d, tau_used) for so, os_, _, _, d in slots]
    mari_pooled = pooled_share(mari_ev)
    bio = _mean_over_scopes(prep, lambda s: s.labels, [k])
    conf = _mean_over_scopes(prep, lambda s: s.confs, [k])
    if k not in bio:
        raise ValueError(f"croma: k={k} is not below any scope size or no unit has a cross-group neighbour")

    n_floor, refused = check_margins(prep, m)
    n_undefined_m1 = check_sweep(prep, refused)
    ms = list(range(1, prep.m_max + 1))
    by_m = croma_by_m(prep, ms, alpha).set_index("m")
    curves = by_m.loc[m]
    parts = []
    for s, (so, os_, ss, oo, _), ev in zip(prep.scopes, slots, mari_ev):
        d_so, d_os, c, _ = _margins(prep, s, m)
        part = pd.DataFrame({"sample_id": prep.sample_ids[s.rows], "croma": c, "d_so": d_so, "d_os": d_os,
                             "ri": count_share(so, os_)[0], "mari": so_share(ev),
                             "undefined": np.asarray(UNDEFINED, dtype=object)[undefined_causes(so, os_, ss, oo)],
                             "n_so": so.sum(axis=1), "n_typed": so.sum(axis=1) + os_.sum(axis=1),
                             "so_weight": ev.so, "typed_weight": ev.so + ev.os,
                             "cluster": prep.clusters[s.rows] if prep.clusters is not None else
                             prep.sample_ids[s.rows], "_row": s.rows})
        if prep.design == "paired_2x2":
            part.insert(1, "subset", s.name)
        parts.append(part)
    per_sample = pd.concat(parts, ignore_index=True).sort_values("_row", kind="stable")
    per_sample = per_sample.drop(columns="_row").reset_index(drop=True)
    causes = per_sample["undefined"].value_counts()
    # croma 1.0.1 takes the RI / MaRI tails at its fixed 0.10 whatever the CRoMa alpha (conventions A.4)
    ri_dist, mari_dist = (distribution(per_sample[c].to_numpy(), RI_TAIL_ALPHA) for c in ("ri", "mari"))
    auc, low, delta = sweep_summary(ms, by_m["croma"].to_numpy())

    row = dict(ri=ri_pooled, mari=mari_pooled, tau=tau_used, k=int(k),
               support=float((so_all | os_all).any(axis=1).mean()), croma=curves["croma"],
               f0=curves["f0"], q_alpha=curves["q_alpha"], ltm=curves["ltm"], bio_knn_bacc=bio[k],
               conf_knn_bacc=conf.get(k, np.nan), n=int(len(per_sample)))
    k_conf = select_k_confounder(prep)
    row.update(selected_k_confounder=np.nan if k_conf is None else int(k_conf),
               ri_median=ri_dist[0], ri_q_alpha=ri_dist[1], ri_ltm=ri_dist[2],
               mari_median=mari_dist[0], mari_q_alpha=mari_dist[1], mari_ltm=mari_dist[2],
               **{f"{cause.split('_')[0]}_undefined_frac": causes.get(cause, 0) / len(per_sample)
                  for cause in UNDEFINED[1:]},
               croma_auc=auc, croma_min=low, croma_delta=delta, m_sweep=int(prep.m_max), m_range=sweep_range(prep),
               n_undefined_m1=n_undefined_m1)
    # the spreads over subsets; one scope under design="all": 0.0, as croma 1.0.1 writes them
    ri_pairs = [count_share(so, os_)[1] for so, os_, _, _, _ in slots]
    row.update(ri_std=spread(ri_pairs), mari_std=spread([pooled_share([ev]) for ev in mari_ev]),
               croma_std=curves["croma_std"])
    if prep.design == "paired_2x2":
        row.update(n_subsets=len(prep.scopes))
    if n_floor:
        row.update(n_floor=n_floor)
    if on_short == "skip":
        n_short, cells = _short_units(prep.scopes, m, prep.columns["label_col"], prep.columns["confounder_col"])
        row.update(n_short=n_short, short_cells=cells)
    if refused:
        for key in ("croma", "f0", "q_alpha", "ltm", "croma_auc", "croma_min", "croma_delta", "croma_std"):
            if key in row:
                row[key] = np.nan
    row["reason"] = refused
    return row, per_sample, tau_source


def neighbour_table(prep: Prepared, k: int, finding: str | None = None) -> pd.DataFrame:
    """Each anchor's k nearest cross-group neighbours as RI and MaRI counted them (the scope pass's
    lists, :func:`~robustbench_fm.methods.croma.scores.slot_types`; the slots a unit has, at most k):
    rank 1..k by ascending cosine distance (ties in sample-id order, :mod:`.knn`), the neighbour's id,
    label, centre (``confounder_col``) and pair type (SO, OS, SS, OO; A.2), the anchor's label and centre;
    ``subset`` names the 2×2 subset under ``paired_2x2`` (empty under ``all``); anchors in manifest order."""
    ids, types = pd.array(prep.sample_ids.astype(str)), pd.array(list(PAIR_TYPES))  # texts taken, not converted
    parts = []
    for s in prep.scopes:
        so, os_, ss, oo, dist = slot_types(s.labels, s.confs, s.nb, k)
        anchor, slot = np.nonzero(so | os_ | ss | oo)  # the live slots, anchor by anchor in rank order
        at = s.nb.idx[:, :k][anchor, slot]
        kind = np.select([so[anchor, slot], os_[anchor, slot], ss[anchor, slot]], [0, 1, 2], 3)
        label_names, conf_names = pd.array(s.label_names.astype(str)), pd.array(s.conf_names.astype(str))
        parts.append((s.rows[anchor], pd.DataFrame({
            "finding": pd.array(["" if finding is None else str(finding)]).take(np.zeros(len(anchor), np.int64)),
            "subset": pd.array([s.name if prep.design == "paired_2x2" else ""]).take(np.zeros(len(anchor), np.int64)),
            "anchor_id": ids.take(s.rows[anchor]), "label": label_names.take(s.labels[anchor]),
            "centre": conf_names.take(s.confs[anchor]), "rank": (slot + 1).astype(np.int16),
            "neighbour_id": ids.take(s.rows[at]), "neighbour_label": label_names.take(s.labels[at]),
            "neighbour_centre": conf_names.take(s.confs[at]), "type": types.take(kind),
            "distance": dist[anchor, slot].astype(np.float64)}, columns=NEIGHBOUR_COLUMNS)))
    rows = np.concatenate([r for r, _ in parts])
    out = pd.concat([frame for _, frame in parts], ignore_index=True)
    if len(parts) > 1 or (np.diff(rows) < 0).any():  # anchors in manifest order (their slots stay in rank order)
        out = out.take(np.argsort(rows, kind="stable"))
    return out.reset_index(drop=True)


def _bank_shares(prep: Prepared, features, per_sample: pd.DataFrame, m: int) -> pd.DataFrame:
    """``croma_bank_0`` / ``croma_bank_1``: each unit's share of its slide's influence as a candidate on
    the median CRoMa of the anchors of each half of the slides (:mod:`~robustbench_fm.methods.croma.influence`;
    the paired comparisons' ``bank``), in ``per_sample``'s order."""
    x = l2_normalize(features.cpu().numpy() if isinstance(features, torch.Tensor) else features, "croma: features",
                     dtype=None)
    ids = prep.clusters if prep.clusters is not None else prep.sample_ids
    codes = pd.factorize(ids, sort=True)[0]
    halves = cluster_halves(ids)
    shares = np.zeros((len(x), 2))
    for s in prep.scopes:
        found = median_influence(x[s.rows], s.labels, s.confs, s.groups, codes[s.rows], halves[s.rows], m,
                                 typed=s.nb.typed)
        n = np.bincount(codes[s.rows], minlength=found.shape[1])
        shares[s.rows] = (found[:, codes[s.rows]] / np.maximum(n[codes[s.rows]], 1)).T
    at = np.sort(np.concatenate([s.rows for s in prep.scopes]))  # per_sample's rows: the scopes' by manifest row
    return pd.DataFrame({"croma_bank_0": shares[at, 0], "croma_bank_1": shares[at, 1]}, index=per_sample.index)


def run(features, manifest: pd.DataFrame, finding: str | None = None, params: CromaParams | None = None,
        **kw) -> Results:
    """RI, MaRI and CRoMa of ``features`` (N, D; float32 or float64) aligned with ``manifest``;
    ``params``: :class:`~robustbench_fm.methods.croma.params.CromaParams`.

    ``finding`` is how the app loop names the label: when given it replaces ``label_col`` and is
    recorded as the summary's first column. ``device``: ``auto`` | ``cpu`` | ``cuda``;
    ``block_size``: edge of the similarity tiles (memory ≈ block_size² × 4–8 bytes per tile).
    """
    p = PARAMS.parse(params, **kw)
    confounder_col, exclude_col, m, alpha, k_grid, k = p.confounder_col, p.exclude_col, p.m, p.alpha, p.k_grid, p.k
    tau, design, subset_col, on_short, device, block_size = p.tau, p.design, p.subset_col, p.on_short, p.device, \
        p.block_size
    on_incomplete, m_sweep = p.on_incomplete, p.m_sweep
    label_col = p.label_col if finding is None else finding
    prep = prepare(features, manifest, label_col=label_col, confounder_col=confounder_col,
                   exclude_col=exclude_col, m=m, k_grid=k_grid, k=k, design=design, subset_col=subset_col,
                   on_short=on_short, device=device, block_size=block_size, on_incomplete=on_incomplete,
                   m_sweep=m_sweep, bank_lists=True)
    k_source, bacc_by_k = "fixed", {}
    if k is None:
        (k, bacc_by_k), k_source = select_k(prep), "selected"
    row, per_sample, tau_source = score(prep, int(k), m=m, alpha=alpha, tau=tau, on_short=on_short)
    per_sample = per_sample.join(_bank_shares(prep, features, per_sample, m))
    if finding is not None:
        row = {"finding": finding, **row}
    params = dict(label_col=label_col, confounder_col=confounder_col, exclude_col=exclude_col, m=m,
                  alpha=alpha, k_grid=list(_grid(k_grid)), k=int(k), k_source=k_source,
                  bio_knn_bacc_by_k={str(kk): v for kk, v in bacc_by_k.items()}, tau=tau,
                  design=design, subset_col=subset_col, on_short=on_short, on_incomplete=on_incomplete,
                  m_sweep=m_sweep, finding=finding,
                  device=str(device), block_size=block_size, tau_source=tau_source)
    return Results(summary=pd.DataFrame([row]), per_sample=per_sample, params=params,
                   neighbours=neighbour_table(prep, int(k), finding))
