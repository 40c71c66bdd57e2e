"""What a stage that drives the encoder itself (``run_job``) receives: the job's data, its
parameters and the services it may use, and nothing of the command line's config."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..features.embed import Embedder
from .params import StageParams
from .run import score_and_save


@dataclass
class JobContext:
    """One job of a ``run_job`` stage.

    ``params``: the stage's parameters, the typed object the plan built
    (:class:`~robustbench_fm.methods.params.StageParams`; ``PARAMS.parse(job.params)`` returns it
    as it is), a mapping for a stage without a parameter class; ``embedder``: the run's extraction service (the
    user's encoder options applied); ``dataset_options`` / ``verify_images``: how the job's own
    manifest was built (for a stage that builds more manifests alike); ``overrides``: parameter ->
    the command-line key that sets it where that is not ``stage.params.<name>`` (error messages
    name the override that fixes them); ``sweep_first``: False only in a multirun job that is not
    the first of its sweep's encoder fan-out, so rows that do not depend on the swept encoder (a
    planted calibration backbone's) are computed once per sweep, not once per job."""

    stage: str
    dataset: str | None
    root: Path | None
    encoders: list[str]
    findings: list[str]
    params: StageParams | dict
    manifest: pd.DataFrame
    out_dir: Path
    embedder: Embedder
    seed: int = 42
    dataset_options: dict = field(default_factory=dict)
    verify_images: bool = True
    overrides: dict[str, str] = field(default_factory=dict)
    sweep_first: bool = True

    def override_of(self, param: str) -> str:
        """The command-line key that sets stage parameter ``param``."""
        return self.overrides.get(param, f"stage.params.{param}")

    def save(self, features, manifest: pd.DataFrame, encoder: str) -> list[pd.DataFrame]:
        """Score ``features`` of ``manifest`` for every finding and save them under the job's
        ``results/<encoder>/<dataset>/<stage>/<finding>/``."""
        return score_and_save(self.stage, features, manifest, self.findings, self.params, self.out_dir, encoder,
                              self.dataset)
