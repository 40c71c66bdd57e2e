"""CRoMa's stage parameters, one typed structure each (the one home of every default): the CRoMa
stage (croma.md §2.3-2.7; croma_conventions.md A) and PathoROB's shortcut probe (croma.md §2.7,
Table 11; croma_conventions.md B). The command line's ``stage=croma`` / ``stage=shortcut`` configs
are generated from these classes, and the table builders read them.

Imports nothing heavy; :meth:`check` imports what it checks against when it runs."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..params import DEVICE, PYTHON_ONLY, StageParams

#: PathoROB's sparse grid [1,3,5,7,9] + range(11, 100, 10) used for the paper (conventions A.5).
DEFAULT_K_GRID = (1, 3, 5, 7, 9, 11, 21, 31, 41, 51, 61, 71, 81, 91)
DESIGNS = ("all", "paired_2x2")
#: natural-image controls (croma.md Table 2: DINOv2-B): reported separately, left out of the
#: 20-encoder Pareto planes, the mean ranks (Figure 5) and the Spearman tables
CONTROLS = ("dinov2_b",)
#: the collect step's operating-k policies (``report.croma_k``; an int fixes k)
K_POLICIES = ("median", "published")
#: The paper's operating k of each tile benchmark (croma.md: "k=11" on Camelyon, §3.1 and Table 12;
#: "k=71 and 61" on TCGA-4x4 and Tolkach-ESCA, §3.4 and Tables 4/5; "k=61" on TCGA-2x2, Table 13).
#: They are the lower median of the k* of croma's 26-model roster (its results/PROVENANCE.json),
#: five of which the paper does not report, so a median over the paper's 21 encoders may differ.
PUBLISHED_K = {"pathorob_camelyon": 11, "pathorob_tcga4x4": 71, "pathorob_tolkach": 61, "pathorob_tcga2x2": 61}
#: the slide benchmarks' published per-encoder k* (Table 14, column k⋆) live in its section
PUBLISHED_KSTAR_SECTION = {"pcabiop-binary": "(a) Cancer detection", "pcabiop-isup": "(b) ISUP grading"}
#: The tail level of the RI / MaRI distributions (``ri_q_alpha``, ``ri_ltm``, ``mari_q_alpha``, ``mari_ltm``):
#: croma 1.0.1 fixes it at 0.10 in its RI and MaRI results (``compute_tail_metrics(..., alpha=0.10)``;
#: conventions A.4) whatever the CRoMa ``alpha``, and its benchmark reports those fields so.
RI_TAIL_ALPHA = 0.10
ON_SHORT = ("error", "skip")
ON_INCOMPLETE = ("error", "skip")


@dataclass(frozen=True)
class CromaParams(StageParams):
    """CRoMa stage (croma.md §2.3-2.7; croma_conventions.md A): RI and MaRI at the kNN-selected k
    (sparse PathoROB grid), CRoMa with m = 5 and its F(0) / Q_10 / LTM_10 tail, label and
    confounder kNN balanced accuracy. The app passes each entry of ``stage.findings`` (default
    ``[bio_label]``, the column holding the biological label) as ``finding=<label column>``. For the
    paper's median-k protocol across a panel use :mod:`robustbench_fm.methods.croma.panel` (or
    ``k=<int>``)."""

    STAGE = "croma"

    confounder_col: str = "site"
    """The confounder column (the medical centre; conventions A.1)."""
    exclude_col: str = "slide_id"
    """The group whose members are never each other's neighbours (conventions A.3)."""
    m: int = 5
    """Nearest cross-group SO and OS candidates averaged per unit in CRoMa_i (§2.5; paper: m = 5)."""
    alpha: float = 0.10
    """Tail level of CRoMa's Q_alpha and LTM_alpha (q_alpha, ltm; §2.6; paper: alpha = 0.10; croma's
    benchmark --croma-alpha). The RI / MaRI tails (ri_q_alpha, ri_ltm, mari_q_alpha, mari_ltm) stay at
    croma 1.0.1's fixed 0.10 (RI_TAIL_ALPHA) whatever this alpha."""
    m_sweep: int = 20
    """CRoMa is also scored at m = 1..m_sweep (fewer where some unit has fewer SO or OS candidates,
    never below m: the summary's m_range then says so, and a warning) for croma_auc, croma_min and
    croma_delta (croma.md A.3; croma's benchmark: --croma-m-max 20)."""
    k_grid: tuple[int, ...] = DEFAULT_K_GRID
    """The k searched for k*: PathoROB's sparse grid [1,3,5,7,9] + range(11, 100, 10) (conventions A.5)."""
    k: int | None = None
    """null = select k* over k_grid; an int fixes k (the panel's median-k protocol)."""
    tau: float | None = None
    """MaRI's distance scale; null = the median typed-neighbour distance at k (fallback 0.2; A.6)."""
    design: str = "all"
    """all | paired_2x2 (one row per (sample_id, subset) occurrence; conventions A.8)."""
    subset_col: str = "subset"
    """The column naming each row's 2×2 subset (``design=paired_2x2``)."""
    on_short: str = "error"
    """error | skip units without m SO and m OS candidates."""
    on_incomplete: str = "error"
    """error | skip (``design=paired_2x2``) subsets that are not a complete 2×2 (2 labels × 2
    confounder values, every cell filled): croma 1.0.1 refuses such a manifest, naming them."""
    device: Any = field(default="auto", metadata=DEVICE)
    """auto | cpu | cuda (``${device}`` on the command line)."""
    block_size: int = 4096
    """Similarity tile edge; memory ~ block_size² × 4 bytes (+ the neighbour lists)."""
    label_col: str = field(default="bio_label", metadata=PYTHON_ONLY)
    """The label column when no ``finding`` names it (Python API only; the app passes the finding)."""

    def check(self) -> None:
        """Refuse inconsistent options before any heavy work (one line each)."""
        m, alpha, k, tau = self.m, self.alpha, self.k, self.tau
        if isinstance(m, bool) or int(m) != m or m < 1:
            raise ValueError(f"croma: m={m!r} must be a positive integer (paper: m=5)")
        if isinstance(self.m_sweep, bool) or int(self.m_sweep) != self.m_sweep or self.m_sweep < 1:
            raise ValueError(f"croma: m_sweep={self.m_sweep!r} must be a positive integer (croma's benchmark: 20)")
        if not 0 < alpha < 1:
            raise ValueError(f"croma: alpha={alpha!r} must lie in (0, 1) (paper: alpha=0.10)")
        grid(self.k_grid)
        if k is not None and (isinstance(k, bool) or int(k) != k or k < 1):
            raise ValueError(f"croma: k={k!r} must be a positive integer or None (select k over k_grid)")
        if tau is not None and not tau > 0:
            raise ValueError(f"croma: tau={tau!r} must be positive, or None for the median typed distance")
        if self.design not in DESIGNS:
            raise ValueError(f"croma: design={self.design!r} is unknown; use one of {', '.join(DESIGNS)}")
        if self.on_short not in ON_SHORT:
            raise ValueError(f"croma: on_short={self.on_short!r} is unknown; use one of {', '.join(ON_SHORT)}")
        if self.on_incomplete not in ON_INCOMPLETE:
            raise ValueError(f"croma: on_incomplete={self.on_incomplete!r} is unknown; use one of "
                             f"{', '.join(ON_INCOMPLETE)}")
        if self.block_size < 1:
            raise ValueError(f"croma: block_size={self.block_size} must be at least 1")


def grid(k_grid) -> tuple[int, ...]:
    """De-duplicated grid in the given order (conventions A.5)."""
    out = []
    for k in k_grid:
        if int(k) != k or k < 1:
            raise ValueError(f"croma: k_grid value {k!r} is not a positive integer; use e.g. k_grid=[5, 11, 21]")
        if int(k) not in out:
            out.append(int(k))
    if not out:
        raise ValueError("croma: k_grid is empty; pass at least one k, e.g. k_grid=[5, 11, 21]")
    return tuple(out)


@dataclass(frozen=True)
class ShortcutParams(StageParams):
    """Shortcut protocol (croma.md §2.7, Table 11; croma_conventions.md B): PathoROB's
    confounder-biased logistic probe over the benchmark's training schedule, 20 replicates seeded
    from 1000, ID (fixed balanced tail) and OOD (unseen centres) tests, reduced to APD and nIPD. Use
    it with a dataset in its APD view (``dataset.options.view=apd``); ``stage.findings`` (default
    ``[bio_label]``) names the column holding the biological class the probe predicts. Tolkach's
    per-replicate train/test case splits are derived from the rows, as PathoROB's."""

    STAGE = "shortcut"

    benchmark: str = field(default="camelyon",
                           metadata={"config": "${oc.select:dataset.shortcut_benchmark,camelyon}"})
    """camelyon | tcga (TCGA-4x4) | tolkach_esca; on the command line the dataset's
    ``shortcut_benchmark`` (camelyon when it has none)."""
    site_col: str = "site"
    """The centre column (the confounder the probe is biased towards)."""
    slide_col: str = "slide_id"
    """The slide (case) column; Tolkach-ESCA's case splits are drawn over it."""
    iterations: int = 20
    """Replicates of the probe sweep (conventions B, "Replicates": 20)."""
    seed: int = 1000
    """Seed of the replicates' seeds, ``random.Random(seed).sample`` (PathoROB: 1000); not ``${seed}``."""
    rows_per_slide: int | None = None
    """Rows (tiles) per slide block; null = the benchmark's own (300 / 30 / 100)."""

    def check(self) -> None:
        """Refuse inconsistent options before any heavy work (one line each)."""

        from . import shortcut_metrics as sm  # lazy: imports scipy.stats (~1 s), and the registry reads this module

        sm.benchmark(self.benchmark)
        sm.replicate_seeds(0, self.iterations)
        if self.rows_per_slide is not None and self.rows_per_slide < 1:
            raise ValueError(f"shortcut: rows_per_slide={self.rows_per_slide} must be at least 1")
