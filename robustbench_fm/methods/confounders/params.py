"""The confounder scan's parameters (the one home of every default; issue 55 items 3-4). The
command line's ``stage=confounders`` config is generated from this class.

The papers fix none of these: CRoMa's RI reads the k nearest cross-slide neighbours at a k chosen per
benchmark (croma_conventions.md A.4-A.5), PathoROB's robustness index likewise; the defaults below are
ours and each docstring says why.

Imports nothing heavy."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..params import DEVICE, PYTHON_ONLY, SEED, StageParams


@dataclass(frozen=True)
class ConfounderParams(StageParams):
    """The confounder scan: for each chosen manifest column, the share of each image's k nearest
    neighbours (cosine, exact, other patients only) that share its value, against that share's exact
    chance level, as a balanced score with a patient-clustered 95% interval."""

    STAGE = "confounders"

    columns: list = field(default_factory=list)
    """The manifest columns to scan; [] = every column with 2 to max_values distinct values that is not
    the path, an id (sample_id, patient_id, slide_id, ``*_id``), a box coordinate or cluster_col, plus
    the numeric columns with more values (binned); a default column of one value is left out (params.json:
    columns_constant), any other that cannot be scanned is a row with its reason. The findings are scanned
    beside them."""
    k: int = 10
    """Neighbours per image (our choice: CANDOR reads 5, CRoMa's benchmarks 11 to 71; 10 keeps each
    image's share a fraction of tenths while the neighbourhood stays local)."""
    max_values: int = 50
    """A column with more distinct values is scanned only if numeric, binned into ``bins`` quantile bins
    (a text column with more values is an identifier or free text and is left out, with the reason)."""
    bins: int = 5
    """Quantile bins of a numeric column with more than max_values values (quintiles; fewer where values
    tie across a quantile, stated in the row's ``binning``)."""
    cluster_col: str = "patient_id"
    """The patient column: the bootstrap resamples it, and (exclude_patient) no image's neighbour is an
    image of its own patient; absent from the manifest, each image is its own patient."""
    exclude_patient: bool = True
    """Neighbours of the query's own patient are left out, and the chance level is taken over the same
    candidates: a patient's other images share every patient-level value (sex, age, site) and would
    raise every column's score alike."""
    n_boot: int = 1000
    """Patient-clustered bootstrap resamples of each score's 95% interval (candor.md "Reporting": 1,000);
    0: none."""
    seed: int = field(default=42, metadata=SEED)
    """Seed of the bootstrap (``${seed}`` on the command line)."""
    device: Any = field(default="auto", metadata=DEVICE)
    """Where similarities are computed: auto | cpu | cuda (``${device}`` on the command line)."""
    block_size: int = field(default=4096, metadata=PYTHON_ONLY)
    """Similarity tile edge of the neighbour pass (memory ~ block_size² × 4 bytes); Python API only."""

    def check(self) -> None:
        """Refuse values the scan cannot use (one line each)."""
        if self.k < 1:
            raise ValueError(f"confounders: stage.params.k={self.k} must be at least 1")
        if self.max_values < 2:
            raise ValueError(f"confounders: stage.params.max_values={self.max_values} must be at least 2 (a column "
                             "needs two values to be scanned)")
        if self.bins < 2:
            raise ValueError(f"confounders: stage.params.bins={self.bins} must be at least 2")
        if self.n_boot < 0:
            raise ValueError(f"confounders: stage.params.n_boot={self.n_boot} must be 0 or more")
        if self.block_size < 1:
            raise ValueError(f"confounders: block_size={self.block_size} must be at least 1")
        for i, col in enumerate(self.columns):
            if not isinstance(col, str) or not col:
                raise ValueError(f"confounders: stage.params.columns[{i}]={col!r} must be a column name")
