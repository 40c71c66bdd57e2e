"""The parameters of the stages built on trained heads, one typed structure each (the one home of
every default): ``linear_head`` / ``mlp_head`` (candor.md "Implementation"; candor_v1.md
"Implementation"), ``logme`` (candor.md "Baselines"), ``error_detection`` (candor.md "Baselines",
"Discordance and Head Errors") and ``candor_heads`` (candor.md "Discordance and Head Errors",
Table 4). A parameter shared with another stage is declared once, in that stage's class, and
:func:`~robustbench_fm.methods.params.shared` from there (default, metadata and docstring).

Imports nothing heavy; :meth:`check` imports what it checks against when it runs."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..candor.params import CandorParams
from ..params import DEVICE, SEED, StageParams, shared


@dataclass(frozen=True)
class HeadParams(StageParams):
    """Linear head per binary finding (candor.md "Implementation"): Adam, 30 epochs, lr 0.001,
    weight decay 1e-4, batch 256, ≤ 25,000 training / ≤ 20,000 test rows drawn by a stable hash of
    sample_id (the same rows for every encoder), operating point at 0.800 validation sensitivity,
    1,000 patient-clustered bootstrap resamples for the AUROC interval."""

    STAGE = "linear_head"

    head: str = "linear"
    """linear | mlp (a 256-unit hidden layer; candor_v1.md "Implementation")."""
    max_train: int = 25_000
    """Training rows, at most, drawn by a stable hash of sample_id (the same for every encoder)."""
    max_test: int = 20_000
    """Test rows, at most, drawn by the same stable hash."""
    epochs: int = 30
    """Adam epochs (candor.md "Implementation")."""
    lr: float = 1e-3
    """Adam's learning rate."""
    weight_decay: float = 1e-4
    """Adam's weight decay."""
    batch_size: int = 256
    """Rows per training batch."""
    hidden: int = 256
    """Width of the MLP head's hidden layer (unused by the linear head)."""
    sensitivity: float = 0.8
    """The operating point: the largest threshold with at least this validation sensitivity."""
    seed: int = field(default=42, metadata=SEED)
    """Seed of the head's initialisation and batches, the carve-outs and the bootstrap
    (``${seed}`` on the command line)."""
    cluster_col: str = "patient_id"
    """The column the bootstrap resamples by and the carve-outs hash (patients)."""
    n_boot: int = 1000
    """Patient-clustered bootstrap resamples of the test AUROC (candor.md "Reporting"); 0: none."""
    val_fraction: float = 0.1
    """Validation carve-out (stable hash of the patient) for datasets without a val / test split."""
    test_fraction: float = 0.2
    """Test carve-out (stable hash of the patient) for datasets without a test split."""
    device: Any = field(default="auto", metadata=DEVICE)
    """auto | cpu | cuda (``${device}`` on the command line)."""

    def check(self) -> None:
        """Refuse inconsistent options before any heavy work (one line each)."""
        from .train import HEADS  # lazy: imports torch

        if self.head not in HEADS:
            raise ValueError(f"heads: head='{self.head}' is not one of {', '.join(HEADS)}; set stage.params.head")
        for name in ("max_train", "max_test", "epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"heads: {name}={getattr(self, name)} must be at least 1")
        if not 0 < self.sensitivity <= 1:
            raise ValueError(f"heads: sensitivity={self.sensitivity} must be in (0, 1]")
        if self.n_boot < 0:
            raise ValueError(f"heads: n_boot={self.n_boot} must be 0 or more")
        if self.val_fraction <= 0 or self.test_fraction <= 0 or self.val_fraction + self.test_fraction >= 1:
            raise ValueError(f"heads: val_fraction={self.val_fraction} and test_fraction={self.test_fraction} "
                             "must be positive with a sum below 1")

    def head_params(self) -> HeadParams:
        """The heads' parameters of a stage that shares them (its own values, checked as the heads')."""
        return HeadParams(**{n: getattr(self, n) for n in HeadParams.names()})


@dataclass(frozen=True)
class MlpHeadParams(HeadParams):
    """256-unit one-hidden-layer head per binary finding (candor_v1.md "Implementation"; candor.md
    "Implementation"): the linear head's training, rows, operating point and bootstrap."""

    STAGE = "mlp_head"

    head: str = "mlp"
    """mlp: one hidden layer of ``hidden`` = 256 units (candor_v1.md "Implementation")."""


@dataclass(frozen=True)
class LogmeParams(StageParams):
    """LogME (You et al. 2021) of the frozen features per finding (candor.md "Baselines"), on the
    heads' stable-hash training draw (≤ 25,000 rows, the same for every encoder)."""

    STAGE = "logme"

    max_train: int = shared(HeadParams, "max_train")
    seed: int = shared(HeadParams, "seed")
    cluster_col: str = shared(HeadParams, "cluster_col")
    val_fraction: float = shared(HeadParams, "val_fraction")
    test_fraction: float = shared(HeadParams, "test_fraction")

    def check(self) -> None:
        """Refuse inconsistent options before any heavy work."""
        if self.max_train < 2:
            raise ValueError(f"logme: max_train={self.max_train} must be at least 2")


@dataclass(frozen=True)
class ErrorDetectionParams(StageParams):
    """Failure detection of a head's errors (candor.md "Baselines", "Discordance and Head Errors"):
    confidence (MSP, max logit, energy), 5-member deep ensemble, Mahalanobis, k-NN distance (Sun et
    al. 2022, k = 50), neighbourhood impurity r (k = 5, matched group) and the DM proxy; paired
    clustered-bootstrap differences against MSP with BH-FDR. The head's own parameters are the
    heads' (:class:`HeadParams`), CANDOR's k, banks and matched group are CANDOR's."""

    STAGE = "error_detection"

    head: str = shared(HeadParams, "head")
    n_members: int = 5
    """Heads of the deep ensemble (the head itself and n_members − 1 more, seeds seed+1, …)."""
    knn_k: int = 50
    """The k-th nearest training feature whose distance scores a row (Sun et al. 2022: k = 50)."""
    k: int = shared(CandorParams, "k")
    """Neighbours of the impurity r and of the DM proxy's c± (CANDOR's k = 5)."""
    bank_size: int = shared(CandorParams, "bank_size")
    """Images per DM-proxy bank, at most, drawn from the group's training rows as CANDOR draws its banks."""
    group_col: str = shared(CandorParams, "group_col")
    stratify_col: str | None = None
    """A column whose every value is a further stratum beside ``__all__`` (e.g. site); null: none
    (with ``train_on``: ``site_col``, the test sites)."""
    train_on: str | None = None
    """Train on one site, test on every site (candor.md "Discordance and Head Errors": "we train
    each head on MIMIC-CXR and take the candidate set of r from the MIMIC-CXR training split in
    the view of the query"): the value of ``site_col`` (e.g. mimic_cxr in dataset=chest_pool)
    whose training rows train the head, the ensemble, Mahalanobis and k-NN, whose validation rows
    fix the operating point, and whose training rows in the query's ``view_col`` are r's
    candidate set and the DM proxy's banks; the test rows are each site's drawn test rows
    (≤ ``max_test`` per site), one stratum per site. null: train and test on the whole manifest."""
    site_col: str = "dataset"
    """The column naming each row's site (a pooled manifest's ``dataset``; used with ``train_on``)."""
    view_col: str = "view"
    """The column matching a test row with the training site's rows of r's candidate set and the
    DM proxy's banks when ``train_on`` is set (the query's view)."""
    max_train: int = shared(HeadParams, "max_train")
    max_test: int = shared(HeadParams, "max_test")
    epochs: int = shared(HeadParams, "epochs")
    lr: float = shared(HeadParams, "lr")
    weight_decay: float = shared(HeadParams, "weight_decay")
    batch_size: int = shared(HeadParams, "batch_size")
    hidden: int = shared(HeadParams, "hidden")
    sensitivity: float = shared(HeadParams, "sensitivity")
    seed: int = shared(HeadParams, "seed")
    cluster_col: str = shared(HeadParams, "cluster_col")
    n_boot: int = shared(HeadParams, "n_boot")
    val_fraction: float = shared(HeadParams, "val_fraction")
    test_fraction: float = shared(HeadParams, "test_fraction")
    device: Any = shared(HeadParams, "device")

    head_params = HeadParams.head_params

    def check(self) -> None:
        """The heads' checks plus the detectors' own (one line each)."""
        self.head_params().check()
        for name in ("n_members", "knn_k", "k"):
            if getattr(self, name) < 1:
                raise ValueError(f"error_detection: {name}={getattr(self, name)} must be at least 1")


@dataclass(frozen=True)
class CandorHeadsParams(StageParams):
    """CANDOR discordance joined with the head's predictions per sample (candor.md "Discordance and
    Head Errors", Table 4): CANDOR's defaults (k = 5, banks ≤ 4,000, seed 42) and the heads'."""

    STAGE = "candor_heads"

    head: str = shared(HeadParams, "head")
    k: int = shared(CandorParams, "k")
    bank_size: int = shared(CandorParams, "bank_size")
    max_group_sample: int = shared(CandorParams, "max_group_sample")
    group_col: str = shared(CandorParams, "group_col")
    max_train: int = shared(HeadParams, "max_train")
    max_test: int = shared(HeadParams, "max_test")
    epochs: int = shared(HeadParams, "epochs")
    lr: float = shared(HeadParams, "lr")
    weight_decay: float = shared(HeadParams, "weight_decay")
    batch_size: int = shared(HeadParams, "batch_size")
    hidden: int = shared(HeadParams, "hidden")
    sensitivity: float = shared(HeadParams, "sensitivity")
    seed: int = shared(HeadParams, "seed")
    cluster_col: str = shared(HeadParams, "cluster_col")
    n_boot: int = shared(HeadParams, "n_boot")
    val_fraction: float = shared(HeadParams, "val_fraction")
    test_fraction: float = shared(HeadParams, "test_fraction")
    device: Any = shared(HeadParams, "device")

    head_params = HeadParams.head_params

    def candor_params(self) -> CandorParams:
        """CANDOR's parameters of this run (its own values; CANDOR's defaults for the controls)."""
        return CandorParams(**{n: getattr(self, n) for n in CandorParams.names() if n in self.names()})

    def check(self) -> None:
        """CANDOR's and the heads' checks (one line each)."""
        self.candor_params().check()
        self.head_params().check()
