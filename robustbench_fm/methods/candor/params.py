"""CANDOR's stage parameters, one typed structure each (the one home of every default): the
discordance stage (candor.md "Implementation", "Reporting", "Ablation Studies") and erasure
retention ("Occlusion Retention"; candor_v1.md Eq. 4). The command line's ``stage=candor`` /
``stage=retention`` configs are generated from these classes, and the ablation tables read them.

Imports nothing heavy: the registry, the command line's config and the table builders read it
without the stage modules; :meth:`check` imports what it checks against when it runs."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ... import data
from ..params import DEVICE, PYTHON_ONLY, SEED, StageParams, shared
from .tasks import TASKS

#: the query role a task's discordance is measured for (``queries``; ablation 7 exchanges them)
QUERY_ROLES = ("positive", "negative")
#: margin-AUROC intervals: the bootstrap of its placement-value expansion, or re-ranked resamples (the default)
#: (the estimators: :data:`robustbench_fm.methods.candor.stage.AUROC_ESTIMATORS`)
AUROC_BOOTSTRAPS = ("linear", "exact")
#: how a matched group's neighbour questions are answered (``neighbour_path``; the choice:
#: :func:`robustbench_fm.methods.candor.stage.group_path`)
NEIGHBOUR_PATHS = ("auto", "shortlist", "exact")


@dataclass(frozen=True)
class CandorParams(StageParams):
    """CANDOR (candor.md "Implementation", "Reporting", "Ablation Studies"): k = 5, banks ≤ 4,000,
    queries from ≤ 4,000 images per matched group, seed 42, 1,000 patient-clustered bootstrap
    resamples. The controls (``queries`` … ``box_verified``) are off in the paper's main analysis;
    each one is an ablation or a check."""

    STAGE = "candor"

    k: int = 5
    """Neighbours averaged into c±(x) (candor.md "Implementation": k = 5)."""
    bank_size: int = 4000
    """Images per bank R+_s and R−_s, at most (candor.md "Implementation": banks ≤ 4,000)."""
    max_group_sample: int = 4000
    """Images sampled per matched group, labelled for the finding or not; the queries are the positives
    in the sample ("Implementation": "a random sample of at most 4,000 images of each matched group")."""
    seed: int = field(default=42, metadata=SEED)
    """Seed of the query sample, the banks and the bootstrap (``${seed}`` on the command line)."""
    group_col: str = "acq_group"
    """The manifest column of the matched group (site × view) banks and queries are drawn within."""
    cluster_col: str = "patient_id"
    """The column the bootstrap resamples by (patients; candor.md "Reporting")."""
    n_boot: int = 1000
    """Patient-clustered bootstrap resamples of D, D_all and the margin AUROC ("Reporting"); 0: none."""
    device: Any = field(default="auto", metadata=DEVICE)
    """Where similarities are computed: auto | cpu | cuda (``${device}`` on the command line)."""
    task: str = "auto"
    """auto | binary (each finding a 0/1 column) | family_one_vs_rest (finding = a class column such
    as bio_label; each class against the other classes of its acq_group; birds and aircraft); auto:
    binary for a 0/1 column, family_one_vs_rest for a column of class names."""
    auroc_bootstrap: str = "exact"
    """Margin-AUROC intervals: the percentile interval of the re-ranked patient resamples (exact; "Reporting":
    "the 95% interval of the same resamples"), or their placement-value approximation (linear, faster)."""
    queries: str = "positive"
    """positive | negative: the roles of the two sets exchanged (ablation 7)."""
    shuffle_labels: bool = False
    """Labels permuted within each matched group (control; D ≈ 0.5 expected)."""
    equal_size: bool = False
    """A query removed from R+ also removes one random negative from R− (chance exactly 1/2)."""
    exclude_patient: bool = False
    """The query's patient left out of every candidate set (ablation)."""
    unmatched: bool = False
    """Banks pooled across sites and views (ablation 2)."""
    isolated: bool = False
    """Positives with none of the other findings (ablation 6)."""
    box_verified: bool = False
    """Positives with an expert box only (ablation 1)."""
    block_size: int = field(default=4096, metadata=PYTHON_ONLY)
    """Similarity rows held at once (memory ~ block_size × images × 4 bytes); Python API only."""
    shortlist: int = field(default=256, metadata=PYTHON_ONLY)
    """Nearest labelled images kept per image in a matched group's shared shortlist (exact whatever
    its size); Python API only."""
    backend: str = field(default="torch", metadata=PYTHON_ONLY)
    """torch | faiss: where the exact neighbour searches run; Python API only."""
    neighbour_path: str = field(default="auto", metadata=PYTHON_ONLY)
    """auto | shortlist | exact: a matched group's questions answered from one shared pass over its
    labelled images (shortlist) or by an exact search per question; auto takes the one computing
    fewer similarities for the group's shape (findings, prevalences, bank and group sizes). Both give
    the same c±; Python API only."""

    def check(self) -> None:
        """Refuse inconsistent options before any heavy work (one line each)."""
        if self.k < 1:
            raise ValueError(f"candor: k={self.k} must be at least 1")
        if self.bank_size < self.k + 1:
            raise ValueError(f"candor: bank_size={self.bank_size} must exceed k={self.k} (a query in R+ meets "
                             f"bank_size-1 positives); raise bank_size or lower k")
        if self.max_group_sample < 1:
            raise ValueError(f"candor: max_group_sample={self.max_group_sample} must be at least 1")
        if self.n_boot < 0:
            raise ValueError(f"candor: n_boot={self.n_boot} must be 0 or more")
        if self.task not in TASKS:
            raise ValueError(f"candor: task={self.task!r} is not one of {', '.join(TASKS)}")
        if self.auroc_bootstrap not in AUROC_BOOTSTRAPS:
            raise ValueError(f"candor: auroc_bootstrap={self.auroc_bootstrap!r} is not one of "
                             f"{', '.join(AUROC_BOOTSTRAPS)}")
        if self.neighbour_path not in NEIGHBOUR_PATHS:
            raise ValueError(f"candor: neighbour_path={self.neighbour_path!r} is not one of "
                             f"{', '.join(NEIGHBOUR_PATHS)}")
        if self.queries not in QUERY_ROLES:
            raise ValueError(f"candor: queries={self.queries!r} is not one of {', '.join(QUERY_ROLES)}")
        if self.task == "family_one_vs_rest" and (self.unmatched or self.isolated or self.box_verified):
            raise ValueError("candor: unmatched, isolated and box_verified apply to binary findings only "
                             "(a one-vs-rest class is defined within its matched group)")


@dataclass(frozen=True)
class RetentionParams(StageParams):
    """Erasure (occlusion) retention (candor.md "Occlusion Retention", "Occlusion Retention and
    Discordance"; candor_v1.md Eq. 4): cos(g(x), g(x with the expert box filled)) over the boxed
    positives, its standardised form (ρ − c)/(1 − c) with c the mean cosine of random pairs of the
    boxed images, and the mirrored control box.

    On the command line its findings are the paper's chest retention (boxed pneumothorax and
    pneumonia positives; a "pooled" row pools them), not ``${dataset.findings}``: most datasets'
    findings have no boxes. Chest, e.g.
    ``dataset=rsna_pneumonia stage=retention 'stage.params.sources=[{dataset: ms_cxr, root:
    /data/mimic-cxr-jpg/2.1.0}, {dataset: rsna_pneumonia}]'``; fundus (IDRiD lesion masks -> each
    lesion type's bounding box): ``dataset=idrid dataset.options.part=segmentation stage=retention
    'stage.findings=[microaneurysms,haemorrhages,hard_exudates,soft_exudates]'``."""

    STAGE = "retention"

    n_pairs: int = 10000
    """Random pairs of boxed images for c (all pairs when there are fewer)."""
    seed: int = field(default=42, metadata=SEED)
    """Pair draws, control positions, bootstrap (``${seed}`` on the command line)."""
    n_boot: int = 1000
    """Patient-clustered bootstrap resamples (candor.md "Reporting")."""
    fill: str = "image_mean"
    """image_mean: the per-channel mean of the whole image; box_mean: of the box itself."""
    cluster_col: str = "patient_id"
    """The column the bootstrap clusters by (the original's sample_id when absent)."""
    sources: list = field(default_factory=list, metadata={"config": "${oc.select:retention_sources,[]}"})
    """[] = the job's dataset; else [{dataset, root, options}] (root may be omitted for the job's
    dataset); on the command line the top-level ``retention_sources`` when an experiment sets it."""

    def check(self) -> None:
        """Refuse bad parameters (one line each), before anything is read or embedded."""
        from ...features import occlusion as occ  # lazy: imports torch

        if int(self.n_pairs) < 1:
            raise ValueError(f"stage retention: n_pairs must be >= 1, got {self.n_pairs}")
        if int(self.n_boot) < 0:
            raise ValueError(f"stage retention: n_boot must be >= 0, got {self.n_boot}")
        occ.check_fill(self.fill)
        for i, src in enumerate(self.sources or ()):
            if not isinstance(src, dict) or "dataset" not in src:
                raise ValueError(f"stage retention: sources[{i}] is {src!r}; write {{dataset: <name>, root: <folder>, "
                                 "options: {...}}}")
            unknown = set(src) - {"dataset", "root", "options"}
            if unknown:
                raise ValueError(f"stage retention: sources[{i}] has unknown keys {sorted(unknown)}; "
                                 "use dataset, root, options")
            data.get(src["dataset"])


#: candor_box_verified's arms (candor_v1.md "Ablation Studies" (3)): the pool member whose boxed
#: positives of ``finding`` are the queries (MS-CXR's pneumothorax boxes, RSNA's pneumonia boxes)
BOX_ARMS = ({"dataset": "ms_cxr", "finding": "pneumothorax"}, {"dataset": "rsna_pneumonia", "finding": "pneumonia"})


@dataclass(frozen=True)
class BoxVerifiedParams(StageParams):
    """Ablation (1), box-verified positives (candor.md "Ablation Studies" (1); candor_v1.md
    "Ablation Studies" (3)): the queries are the positives that carry an expert box (MS-CXR's
    pneumothorax boxes on MIMIC-CXR images, RSNA's pneumonia boxes), the candidate sets R± are the
    reference site's (MIMIC-CXR) matched group of the query's view, drawn as in the main analysis.
    The reference's own positives against the same sets give "all its pneumothorax positives"."""

    STAGE = "candor_box_verified"

    k: int = shared(CandorParams, "k")
    bank_size: int = shared(CandorParams, "bank_size")
    max_group_sample: int = shared(CandorParams, "max_group_sample")
    seed: int = shared(CandorParams, "seed")
    n_boot: int = shared(CandorParams, "n_boot")
    cluster_col: str = shared(CandorParams, "cluster_col")
    device: Any = shared(CandorParams, "device")
    reference: str = "mimic_cxr"
    """The pool member (``dataset`` column) whose matched groups supply R+ and R− (v1: "the
    reference pool"; MS-CXR's images are MIMIC-CXR's, RSNA's come "from outside the pool")."""
    arms: list = field(default_factory=lambda: [dict(a) for a in BOX_ARMS])
    """[{dataset, finding}]: the pool member whose boxed positives of ``finding`` are queries."""
    match_col: str = "view"
    """The column a query shares with its reference matched group (chest: the view)."""
    block_size: int = field(default=4096, metadata=PYTHON_ONLY)
    """Similarity rows held at once; Python API only."""

    def check(self) -> None:
        """Refuse inconsistent options (one line each)."""
        CandorParams(k=self.k, bank_size=self.bank_size, max_group_sample=self.max_group_sample,
                     n_boot=self.n_boot).check()
        for i, arm in enumerate(self.arms or ()):
            if not isinstance(arm, dict) or set(arm) != {"dataset", "finding"}:
                raise ValueError(f"candor_box_verified: stage.params.arms[{i}] is {arm!r}; write "
                                 "{dataset: <pool member>, finding: <finding>}")
            if arm["dataset"] == self.reference:
                raise ValueError(f"candor_box_verified: stage.params.arms[{i}] names the reference "
                                 f"{self.reference}; an arm's queries come from another pool member")


@dataclass(frozen=True)
class LipschitzParams(StageParams):
    """candor_v1.md's synthetic sweep of class overlap (Proposition 1, Corollary 1; "Irreducible
    per encoder but recoverable across the panel"): the data are synthetic unit vectors, no image
    is read. The heads train as candor_v1.md "Implementation" trains its heads."""

    STAGE = "candor_lipschitz"

    separations: list = field(default_factory=lambda: [2.0, 1.5, 1.2, 1.0, 0.8, 0.6, 0.5, 0.4, 0.35, 0.3])
    """Distance of the two class means before normalisation, one level each (more overlap as it
    falls); the paper does not give its grid: ours ends where the linear head's error reaches the
    paper's 26.1% (0.262 at 0.3 with the defaults)."""
    dim: int = 16
    """Dimension of the synthetic features (points on S^{dim-1})."""
    n_train: int = 25000
    """Training points per level, balanced (candor_v1.md "Implementation": at most 25,000 train rows)."""
    n_test: int = 1000
    """Test points per level; the pairs and the errors are measured on them."""
    pairs_per_level: int = 500
    """Test pairs (a positive and its nearest negative) per level: 10 x 500 = the paper's 5,000."""
    hidden: int = 256
    """Hidden units of the shallow network (candor_v1.md "Implementation": a 256-unit hidden layer)."""
    epochs: int = 30
    """Adam epochs of both heads (candor_v1.md "Implementation": 30 epochs)."""
    lr: float = 0.001
    """Adam's learning rate (candor_v1.md "Implementation": 0.001)."""
    weight_decay: float = 0.0001
    """Adam's weight decay (candor_v1.md "Implementation": 10^-4)."""
    batch_size: int = 256
    """Batch size (candor_v1.md "Implementation": 256)."""
    k: int = shared(CandorParams, "k")
    seed: int = shared(CandorParams, "seed")

    def check(self) -> None:
        """Refuse values the sweep cannot use (one line each)."""
        if not self.separations or any(float(s) <= 0 for s in self.separations):
            raise ValueError(f"candor_lipschitz: stage.params.separations={list(self.separations)} must be a "
                             "non-empty list of positive numbers")
        for name in ("dim", "n_train", "n_test", "pairs_per_level", "epochs", "batch_size", "k"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"candor_lipschitz: stage.params.{name}={getattr(self, name)} must be at least 1")
        if self.n_test < 2 * (self.k + 1):
            raise ValueError(f"candor_lipschitz: stage.params.n_test={self.n_test} must exceed "
                             f"2(k+1)={2 * (self.k + 1)}")
