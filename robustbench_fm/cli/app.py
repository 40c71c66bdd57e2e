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

#: what the default experiment (``experiment: demo`` in configs/config.yaml) chooses: a command line
#: that replaces one of these without naming ``experiment=`` runs something else than that experiment
EXPERIMENT_CHOICES = ("dataset", "stage", "features_file", "manifest_file")


def replaces_default_experiment(overrides) -> bool:
    """Whether the command line's ``overrides`` keep the default experiment in the defaults list
    (no ``experiment=``) but replace its data or its stage (:data:`EXPERIMENT_CHOICES`): e.g.
    ``dataset=csv ...`` is no demo, so neither its report's title nor its notes are the demo's."""
    keys = {str(o).split("=")[0].lstrip("+~") for o in overrides}
    return "experiment" not in keys and bool(keys & set(EXPERIMENT_CHOICES))


def hydra_mode() -> tuple[bool, str | None]:
    """``(multirun, experiment)`` of the Hydra job running now: (False, None) outside one; the
    experiment is None where the command line replaced the default experiment's data or stage
    (:func:`replaces_default_experiment`)."""
    if not HydraConfig.initialized():
        return False, None
    hc = HydraConfig.get()
    experiment = hc.runtime.choices.get("experiment")
    if replaces_default_experiment(hc.overrides.task):
        experiment = None
    return hc.mode == RunMode.MULTIRUN, experiment


def run(cfg: DictConfig, out_dir: Path, cli_overrides: list[str] | None = None) -> pd.DataFrame:
    """Run the job under ``out_dir`` (as :func:`robustbench_fm.pipeline.job.run`: locked, with
    ``status.json``) and return the combined summary."""
    with recorded(out_dir) as record:
        return _run(plan(cfg, cli_overrides, multirun=hydra_mode()[0]), out_dir, record.claim)


def _run(job: Plan, out_dir: Path, claim=None) -> pd.DataFrame:
    """The planned job, told what only the Hydra job knows (:func:`hydra_mode`: one job of a
    multirun, the experiment), then claimed (``claim``: the folder holds no other run,
    :meth:`robustbench_fm.pipeline.job.recorded`) and run."""
    multirun, experiment = hydra_mode()
    if HydraConfig.initialized() and replaces_default_experiment(HydraConfig.get().overrides.task):
        job = job.without_experiment_notes()  # the default experiment's notes are about its data
    job = dataclasses.replace(job, multirun=job.multirun or multirun, experiment=job.experiment or experiment)
    if claim is not None:
        job = claim(job)
    return run_planned(job, out_dir)

