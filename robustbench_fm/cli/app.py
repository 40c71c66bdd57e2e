"""The command line's face of one job: the pipeline itself is :mod:`robustbench_fm.pipeline.plan`
(config -> Plan) and :mod:`robustbench_fm.pipeline.job` (manifest, extraction, stage, results,
report); here :func:`run` adds what only a Hydra job knows, whether it is one job of a multirun and
under which experiment. Everything else is imported from where it lives."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from ..pipeline.job import recorded, run_planned
from ..pipeline.plan import Plan, plan


def hydra_mode() -> tuple[bool, str | None]:
    """``(multirun, experiment)`` of the Hydra job running now: (False, None) outside one."""
    if not HydraConfig.initialized():
        return False, None
    hc = HydraConfig.get()
    return hc.mode == RunMode.MULTIRUN, hc.runtime.choices.get("experiment")


def run(cfg: DictConfig, out_dir: Path, cli_overrides: list[str] | None = None) -> pd.DataFrame:
    """Run the job under ``out_dir`` (as :func:`robustbench_fm.pipeline.job.run`: locked, with
    ``status.json``) and return the combined summary."""
    with recorded(out_dir):
        job = plan(cfg, cli_overrides)
        return _run(job, out_dir)


def _run(job: Plan, out_dir: Path) -> pd.DataFrame:
    """The planned job, told what only the Hydra job knows (:func:`hydra_mode`: one job of a
    multirun, the experiment)."""
    multirun, experiment = hydra_mode()
    job = dataclasses.replace(job, multirun=job.multirun or multirun, experiment=job.experiment or experiment)
    return run_planned(job, out_dir)
